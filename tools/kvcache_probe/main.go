// Copyright (c) inference_cache.substrate contributors
// GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
// SPDX-License-Identifier: GPL-3.0-or-later

// Command kvcache_probe runs the KV-event path of github.com/llm-d/llm-d-kv-cache v0.9.0, the module the llm-d router
// (EPP) v0.9.0 builds in, against a real engine: kv-cache's own ZMQ subscriber (kvevents.SubscriberManager), its
// sharded event pool (kvevents.NewPool), its vLLM engine adapter (engineadapter.NewAdapter("vllm")), its in-memory
// block index (kvblock.NewIndex, metrics on), its token processor (kvblock.NewChunkedTokenDatabase) and its
// longest-prefix scorer (kvcache.NewKVBlockScorer). Nothing of kv-cache is reimplemented here: the probe only wires
// those parts together, counts what passes the adapter and the index, and answers questions on stdin.
//
// stdin, one JSON object a line:
//
//	{"lookup": [token ids...], "model": "tiny"}   the pods holding each block of the tokens, as the precise scorer sees
//	                                               them (optional "pods": [...] filter, "hash_seed": "..." to key the
//	                                               lookup with another seed than the index's)
//	{"stats": true}                               messages received, parse failures, events by type, index counters
//
// stdout: one JSON object a line per request, after a first {"ready": ...} line. Logs go to stderr. The probe exits
// 0 on stdin EOF, SIGTERM or SIGINT.
//
// main.go only reads the flags and starts the probe (probe.go); probe_test.go tests the probe.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	uberzap "go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

func parseFlags() config {
	var cfg config
	flag.StringVar(&cfg.endpoint, "endpoint", "tcp://127.0.0.1:5557", "ZMQ endpoint of the engine's KV events")
	mode := flag.String("mode", "bind", "bind: the probe binds the endpoint and the engine connects (kv-cache's local socket); "+
		"connect: the probe connects to an engine that binds (kv-cache's remote socket)")
	flag.StringVar(&cfg.topicFilter, "topic-filter", "kv@", "ZMQ subscription prefix (kv-cache's default)")
	flag.StringVar(&cfg.podID, "subscriber-id", "", "key of the subscriber in kv-cache's SubscriberManager (default: the endpoint); "+
		"the pod identity of the events comes from their topic kv@<pod>@<model>")
	flag.IntVar(&cfg.blockSize, "block-size", 32, "tokenProcessorConfig.blockSizeTokens (the engine's --block-size)")
	flag.StringVar(&cfg.hashSeed, "hash-seed", "0", "tokenProcessorConfig.hashSeed (the EPP config carries the engines' PYTHONHASHSEED)")
	flag.IntVar(&cfg.concurrency, "concurrency", 4, "workers of the kv-cache event pool")
	flag.BoolVar(&cfg.metrics, "metrics", true, "kvBlockIndexConfig.enableMetrics")
	flag.StringVar(&cfg.engine, "engine", "vllm", "kv-cache engine adapter (engineadapter.NewAdapter)")
	flag.IntVar(&cfg.verbosity, "v", 0, "log verbosity (kv-cache: 4 debug, 5 trace)")
	flag.IntVar(&cfg.indexKeys, "index-memory", 0, "instead of a KV-event probe: fill an in-memory index with this many keys, "+
		"print the heap it takes as one JSON line and exit (index_memory.go)")
	flag.IntVar(&cfg.indexPods, "pods-per-key", 1, "with -index-memory: pod entries per key")
	flag.IntVar(&cfg.podCacheSize, "pod-cache-size", 10, "with -index-memory: inMemoryConfig.podCacheSize (kv-cache's default 10)")
	flag.Parse()
	connect, err := parseMode(*mode)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	cfg.connect = connect
	if cfg.podID == "" {
		cfg.podID = cfg.endpoint
	}
	return cfg
}

func main() {
	cfg := parseFlags()
	logger := zap.New(zap.WriteTo(os.Stderr), zap.Level(uberzap.NewAtomicLevelAt(zapcore.Level(-cfg.verbosity))))
	ctrllog.SetLogger(logger)
	if cfg.indexKeys > 0 {
		if err := indexMemory(cfg.indexKeys, cfg.indexPods, cfg.podCacheSize); err != nil {
			fmt.Fprintln(os.Stderr, "kvcache_probe:", err)
			os.Exit(1)
		}
		return
	}
	ctx, cancel := context.WithCancel(ctrllog.IntoContext(context.Background(), logger))
	defer cancel()
	if err := run(ctx, cancel, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "kvcache_probe:", err)
		os.Exit(1)
	}
}

// parseMode says whether the probe connects (-mode connect: the engine binds) or binds (-mode bind: the engine connects).
func parseMode(mode string) (bool, error) {
	switch mode {
	case "bind":
		return false, nil
	case "connect":
		return true, nil
	}
	return false, fmt.Errorf("-mode must be bind or connect, not %q", mode)
}
