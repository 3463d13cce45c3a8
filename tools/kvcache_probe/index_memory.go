// Copyright (c) inference_cache.substrate contributors
// GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
// SPDX-License-Identifier: GPL-3.0-or-later

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"

	"github.com/llm-d/llm-d-kv-cache/pkg/kvcache/kvblock"
)

// indexMemory fills llm-d-kv-cache's own in-memory KV-block index (kvblock.NewInMemoryIndex, the EPP v0.9.0's precise
// index) with keys block keys, each held by pods pod entries, in batches of 16 engine/request key pairs as BlockStored
// events add them, and prints the live heap it takes (runtime.MemStats.HeapInuse after two collections, before and
// after): what router_kv_index_max_keys costs the EPP. The index is sized to hold every key (no eviction).
func indexMemory(keys, pods, podCacheSize int) error {
	if keys <= 0 || pods <= 0 || podCacheSize <= 0 {
		return fmt.Errorf("-index-memory needs keys, pods and -pod-cache-size above 0")
	}
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var stats runtime.MemStats
		runtime.ReadMemStats(&stats)
		return stats.HeapInuse
	}
	before := heap()
	idx, err := kvblock.NewInMemoryIndex(&kvblock.InMemoryIndexConfig{Size: keys, PodCacheSize: podCacheSize})
	if err != nil {
		return err
	}
	entries := make([]kvblock.PodEntry, pods)
	for p := range entries {
		entries[p] = kvblock.PodEntry{PodIdentifier: fmt.Sprintf("10.0.%d.%d:8000", p/250, p%250+1), DeviceTier: "gpu"}
	}
	const batch = 16
	engineKeys, requestKeys := make([]kvblock.BlockHash, batch), make([]kvblock.BlockHash, batch)
	ctx := context.Background()
	for i := 0; i < keys; i += batch {
		for j := range engineKeys {
			engineKeys[j] = kvblock.BlockHash(uint64(i+j)*2654435761 + 1)
			requestKeys[j] = kvblock.BlockHash(uint64(i+j)*11400714819323198485 + 7)
		}
		for p := range entries {
			if err := idx.Add(ctx, engineKeys, requestKeys, entries[p:p+1]); err != nil {
				return err
			}
		}
	}
	used := heap() - before
	runtime.KeepAlive(idx)
	return json.NewEncoder(os.Stdout).Encode(map[string]any{
		"keys": keys, "pods_per_key": pods, "pod_cache_size": podCacheSize, "heap_bytes": used,
		"bytes_per_key": float64(used) / float64(keys)})
}
