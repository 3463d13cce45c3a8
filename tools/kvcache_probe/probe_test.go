// Copyright (c) inference_cache.substrate contributors
// GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
// SPDX-License-Identifier: GPL-3.0-or-later

package main

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/llm-d/llm-d-kv-cache/pkg/kvcache"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvcache/kvblock"
)

func TestParseMode(t *testing.T) {
	for _, tc := range []struct {
		mode    string
		connect bool
		err     string
	}{
		{"bind", false, ""},
		{"connect", true, ""},
		{"sideways", false, `-mode must be bind or connect, not "sideways"`},
	} {
		connect, err := parseMode(tc.mode)
		if connect != tc.connect || (err == nil) != (tc.err == "") || (err != nil && err.Error() != tc.err) {
			t.Errorf("parseMode(%q) = %v, %v; want %v, %q", tc.mode, connect, err, tc.connect, tc.err)
		}
	}
}

func entries(pods ...string) []kvblock.PodEntry {
	out := []kvblock.PodEntry{}
	for _, pod := range pods {
		out = append(out, kvblock.PodEntry{PodIdentifier: pod, DeviceTier: "gpu"})
	}
	return out
}

func TestLeadingBlocksCountsEachPodsPrefixFromTheFirstBlock(t *testing.T) {
	keys := []kvblock.BlockHash{1, 2, 3, 4}
	for _, tc := range []struct {
		name      string
		keyToPods map[kvblock.BlockHash][]kvblock.PodEntry
		prefix    map[string]int
		first     []string
	}{
		{"nothing held", map[kvblock.BlockHash][]kvblock.PodEntry{}, map[string]int{}, []string{}},
		{"a holds three, b one", map[kvblock.BlockHash][]kvblock.PodEntry{1: entries("b", "a"), 2: entries("a"), 3: entries("a")},
			map[string]int{"a": 3, "b": 1}, []string{"a", "b"}},
		{"a block in the middle is no prefix", map[kvblock.BlockHash][]kvblock.PodEntry{1: entries("a"), 3: entries("a", "c"), 4: entries("c")},
			map[string]int{"a": 1}, []string{"a"}},
		{"two tiers of one pod count once", map[kvblock.BlockHash][]kvblock.PodEntry{
			1: {{PodIdentifier: "a", DeviceTier: "gpu"}, {PodIdentifier: "a", DeviceTier: "cpu"}}, 2: entries("a")},
			map[string]int{"a": 2}, []string{"a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			blocks, tiers, prefix := leadingBlocks(keys, tc.keyToPods)
			if !reflect.DeepEqual(prefix, tc.prefix) {
				t.Errorf("prefix = %v, want %v", prefix, tc.prefix)
			}
			if !reflect.DeepEqual(blocks[0], tc.first) || len(blocks) != len(keys) || len(tiers) != len(keys) {
				t.Errorf("blocks = %v, want %v first", blocks, tc.first)
			}
		})
	}
}

// A lookup against kv-cache's own in-memory index and longest-prefix scorer: what the precise scorer would see.
func TestLookupAnswersWithKvCachesOwnIndexAndScorer(t *testing.T) {
	ctx := context.Background()
	c := &counters{events: map[string]int64{}, pods: map[string]int64{}, models: map[string]int64{}}
	idx, err := kvblock.NewIndex(ctx, &kvblock.IndexConfig{InMemoryConfig: kvblock.DefaultInMemoryIndexConfig()})
	if err != nil {
		t.Fatal(err)
	}
	index := &countingIndex{Index: idx, c: c}
	tokens, err := kvblock.NewChunkedTokenDatabase(&kvblock.TokenProcessorConfig{BlockSizeTokens: 4, HashSeed: "0"})
	if err != nil {
		t.Fatal(err)
	}
	scorer, err := kvcache.NewKVBlockScorer(kvcache.DefaultKVBlockScorerConfig())
	if err != nil {
		t.Fatal(err)
	}
	p := &probe{cfg: config{blockSize: 4, hashSeed: "0"}, index: index, tokens: tokens, scorer: scorer, c: c}
	ids := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}
	keys, err := tokens.TokensToKVBlockKeys(kvblock.EmptyBlockHash, ids, "tiny", nil)
	if err != nil || len(keys) != 3 {
		t.Fatalf("keys = %v, %v", keys, err)
	}
	if err := index.Add(ctx, keys[:2], keys[:2], entries("10.0.0.1:8000")); err != nil {
		t.Fatal(err)
	}
	if err := index.Add(ctx, keys[:1], keys[:1], entries("10.0.0.2:8000")); err != nil {
		t.Fatal(err)
	}
	line, _ := json.Marshal(map[string]any{"lookup": ids, "model": "tiny"})
	got := p.answer(ctx, line)
	if got["block_keys"] != 3 || got["tokens"] != len(ids) {
		t.Errorf("answer = %v", got)
	}
	if want := map[string]int{"10.0.0.1:8000": 2, "10.0.0.2:8000": 1}; !reflect.DeepEqual(got["prefix_blocks"], want) {
		t.Errorf("prefix_blocks = %v, want %v", got["prefix_blocks"], want)
	}
	scores, _ := got["scores"].(map[string]float64)
	if scores["10.0.0.1:8000"] <= scores["10.0.0.2:8000"] {
		t.Errorf("scores = %v: the longer prefix must score higher", scores)
	}
	if stats := p.answer(ctx, []byte(`{"stats": true}`)); stats["index"].(map[string]int64)["adds"] != 2 {
		t.Errorf("stats = %v: two adds counted", stats)
	}
	if bad := p.answer(ctx, []byte(`{"nothing": 1}`)); bad["error"] == nil {
		t.Errorf("an unknown request got %v, not an error", bad)
	}
	if bad := p.answer(ctx, []byte(`not json`)); bad["error"] == nil {
		t.Errorf("a line that is no JSON got %v, not an error", bad)
	}
}
