// Copyright (c) inference_cache.substrate contributors
// GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
// SPDX-License-Identifier: GPL-3.0-or-later

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/signal"
	"sort"
	"sync"
	"syscall"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/llm-d/llm-d-kv-cache/pkg/kvcache"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvcache/kvblock"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvcache/metrics"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvevents"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvevents/engineadapter"
)

// counters is what the probe observed on kv-cache's own path.
type counters struct {
	mu             sync.Mutex
	received       int64            // messages the subscriber handed to the pool (AddTask -> ShardingKey)
	parsed         int64            // messages the adapter decoded
	parseFailures  int64            // messages the adapter refused
	lastParseError string           // the last refusal, verbatim
	events         map[string]int64 // decoded events by type
	storedBlocks   int64            // engine blocks in the BlockStored events
	removedBlocks  int64            // engine blocks in the BlockRemoved events
	pods           map[string]int64 // messages by pod identity (from the topic)
	models         map[string]int64 // messages by model name (from the topic)
	indexAdds      int64            // Index.Add calls the pool made
	indexAddErrors int64
	indexKeys      int64 // request keys the pool added
	indexEvicts    int64
	indexClears    int64
}

// countingAdapter wraps the kv-cache engine adapter: every call goes to it unchanged.
type countingAdapter struct {
	next kvevents.EngineAdapter
	c    *counters
}

func (a *countingAdapter) ShardingKey(msg *kvevents.RawMessage) string {
	a.c.mu.Lock()
	a.c.received++ // Pool.AddTask calls ShardingKey once per message the subscriber hands over
	a.c.mu.Unlock()
	return a.next.ShardingKey(msg)
}

//nolint:gocritic // the interface's signature
func (a *countingAdapter) ParseMessage(msg *kvevents.RawMessage) (string, string, kvevents.EventBatch, error) {
	podID, model, batch, err := a.next.ParseMessage(msg)
	a.c.mu.Lock()
	defer a.c.mu.Unlock()
	if err != nil {
		a.c.parseFailures++
		a.c.lastParseError = err.Error()
		return podID, model, batch, err
	}
	a.c.parsed++
	a.c.pods[podID]++
	a.c.models[model]++
	for _, ev := range batch.Events {
		a.c.events[string(ev.Type())]++
		switch e := ev.(type) {
		case *kvevents.BlockStoredEvent:
			a.c.storedBlocks += int64(len(e.BlockHashes))
		case *kvevents.BlockRemovedEvent:
			a.c.removedBlocks += int64(len(e.BlockHashes))
		}
	}
	return podID, model, batch, nil
}

// countingIndex wraps the kv-cache index the pool writes to: every call goes to it unchanged.
type countingIndex struct {
	kvblock.Index
	c *counters
}

func (i *countingIndex) Add(ctx context.Context, engineKeys, requestKeys []kvblock.BlockHash, entries []kvblock.PodEntry) error {
	err := i.Index.Add(ctx, engineKeys, requestKeys, entries)
	i.c.mu.Lock()
	defer i.c.mu.Unlock()
	i.c.indexAdds++
	if err != nil {
		i.c.indexAddErrors++
	} else {
		i.c.indexKeys += int64(len(requestKeys))
	}
	return err
}

func (i *countingIndex) Evict(ctx context.Context, key kvblock.BlockHash, keyType kvblock.KeyType, entries []kvblock.PodEntry) error {
	i.c.mu.Lock()
	i.c.indexEvicts++
	i.c.mu.Unlock()
	return i.Index.Evict(ctx, key, keyType, entries)
}

func (i *countingIndex) Clear(ctx context.Context, podIdentifier string) error {
	i.c.mu.Lock()
	i.c.indexClears++
	i.c.mu.Unlock()
	return i.Index.Clear(ctx, podIdentifier)
}

type request struct {
	Lookup   []uint32 `json:"lookup"`
	Model    string   `json:"model"`
	Pods     []string `json:"pods"`
	HashSeed *string  `json:"hash_seed"`
	Stats    bool     `json:"stats"`
}

type probe struct {
	cfg       config
	index     kvblock.Index // the index as the pool sees it (metrics wrapper inside the counting one)
	tokens    kvblock.TokenProcessor
	scorer    kvcache.KVBlockScorer
	c         *counters
	outMu     sync.Mutex
	out       *json.Encoder
	lookupsMu sync.Mutex
}

type config struct {
	endpoint    string
	connect     bool
	topicFilter string
	podID       string
	blockSize   int
	hashSeed    string
	concurrency int
	metrics     bool
	engine      string
	verbosity   int
	// -index-memory: the index's memory per key instead of a probe (index_memory.go).
	indexKeys    int
	indexPods    int
	podCacheSize int
}

func (p *probe) emit(v any) {
	p.outMu.Lock()
	defer p.outMu.Unlock()
	_ = p.out.Encode(v)
}

func counterValue(get func(*dto.Metric) error) float64 {
	var m dto.Metric
	if err := get(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

func (p *probe) stats() map[string]any {
	p.c.mu.Lock()
	defer p.c.mu.Unlock()
	events := map[string]int64{}
	for k, v := range p.c.events {
		events[k] = v
	}
	pods := map[string]int64{}
	for k, v := range p.c.pods {
		pods[k] = v
	}
	models := map[string]int64{}
	for k, v := range p.c.models {
		models[k] = v
	}
	out := map[string]any{
		"messages_received": p.c.received, "messages_parsed": p.c.parsed,
		"parse_failures": p.c.parseFailures, "last_parse_error": p.c.lastParseError,
		"events": events, "stored_blocks": p.c.storedBlocks, "removed_blocks": p.c.removedBlocks,
		"pods": pods, "models": models,
		"index": map[string]int64{"adds": p.c.indexAdds, "add_errors": p.c.indexAddErrors, "request_keys": p.c.indexKeys,
			"evicts": p.c.indexEvicts, "clears": p.c.indexClears},
	}
	if p.cfg.metrics {
		out["metrics"] = map[string]float64{ // kv-cache's own index metrics (kvcache_index_*)
			"admissions_total":      counterValue(metrics.Admissions.Write),
			"evictions_total":       counterValue(metrics.Evictions.Write),
			"lookup_requests_total": counterValue(metrics.LookupRequests.Write),
		}
	}
	return out
}

func (p *probe) lookup(ctx context.Context, req *request) map[string]any {
	p.lookupsMu.Lock()
	defer p.lookupsMu.Unlock()
	tp := p.tokens
	seed := p.cfg.hashSeed
	if req.HashSeed != nil && *req.HashSeed != p.cfg.hashSeed {
		seed = *req.HashSeed
		var err error
		tp, err = kvblock.NewChunkedTokenDatabase(&kvblock.TokenProcessorConfig{BlockSizeTokens: p.cfg.blockSize, HashSeed: seed})
		if err != nil {
			return map[string]any{"error": err.Error()}
		}
	}
	// As kv-cache's Indexer.ScoreTokens does for the precise scorer: request keys from the tokens, Lookup, Score.
	keys, err := tp.TokensToKVBlockKeys(kvblock.EmptyBlockHash, req.Lookup, req.Model, nil)
	if err != nil {
		return map[string]any{"error": err.Error()}
	}
	result := map[string]any{"model": req.Model, "hash_seed": seed, "tokens": len(req.Lookup), "block_keys": len(keys)}
	blocks, tiers := make([][]string, len(keys)), make([][]string, len(keys))
	prefix := map[string]int{}
	scores := map[string]float64{}
	if len(keys) > 0 {
		keyToPods, err := p.index.Lookup(ctx, keys, sets.New(req.Pods...))
		if err != nil {
			return map[string]any{"error": err.Error()}
		}
		blocks, tiers, prefix = leadingBlocks(keys, keyToPods)
		if scores, err = p.scorer.Score(ctx, keys, keyToPods); err != nil {
			return map[string]any{"error": err.Error()}
		}
	}
	result["blocks"] = blocks
	result["entries"] = tiers
	result["prefix_blocks"] = prefix
	result["scores"] = scores
	return result
}

func run(ctx context.Context, cancel context.CancelFunc, cfg config) error {
	c := &counters{events: map[string]int64{}, pods: map[string]int64{}, models: map[string]int64{}}
	idx, err := kvblock.NewIndex(ctx, &kvblock.IndexConfig{InMemoryConfig: kvblock.DefaultInMemoryIndexConfig(), EnableMetrics: cfg.metrics})
	if err != nil {
		return err
	}
	index := &countingIndex{Index: idx, c: c}
	tokens, err := kvblock.NewChunkedTokenDatabase(&kvblock.TokenProcessorConfig{BlockSizeTokens: cfg.blockSize, HashSeed: cfg.hashSeed})
	if err != nil {
		return err
	}
	scorer, err := kvcache.NewKVBlockScorer(kvcache.DefaultKVBlockScorerConfig())
	if err != nil {
		return err
	}
	adapter, err := engineadapter.NewAdapter(cfg.engine)
	if err != nil {
		return err
	}
	poolCfg := kvevents.DefaultConfig()
	poolCfg.ZMQEndpoint = cfg.endpoint
	poolCfg.TopicFilter = cfg.topicFilter
	poolCfg.Concurrency = cfg.concurrency
	poolCfg.EngineType = cfg.engine
	poolCfg.DiscoverPods = false
	pool := kvevents.NewPool(poolCfg, index, tokens, &countingAdapter{next: adapter, c: c})
	pool.Start(ctx)
	subscribers := kvevents.NewSubscriberManager(pool)
	// kv-cache's own subscriber: it binds a local endpoint (remote=false) or connects to a remote one (remote=true).
	if err := subscribers.EnsureSubscriber(ctx, cfg.podID, cfg.endpoint, cfg.topicFilter, cfg.connect); err != nil {
		return err
	}
	p := &probe{cfg: cfg, index: index, tokens: tokens, scorer: scorer, c: c, out: json.NewEncoder(os.Stdout)}
	mode := "bind"
	if cfg.connect {
		mode = "connect"
	}
	p.emit(map[string]any{"ready": true, "endpoint": cfg.endpoint, "mode": mode, "topic_filter": cfg.topicFilter,
		"block_size": tokens.BlockSize(), "hash_seed": cfg.hashSeed, "engine": cfg.engine, "metrics": cfg.metrics,
		"subscriber": "kvevents.SubscriberManager.EnsureSubscriber"})

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	lines := make(chan []byte)
	go func() {
		scanner := bufio.NewScanner(os.Stdin)
		scanner.Buffer(make([]byte, 1<<20), 64<<20)
		for scanner.Scan() {
			lines <- append([]byte(nil), scanner.Bytes()...)
		}
		close(lines)
	}()
	defer func() {
		subscribers.Shutdown(ctx)
		cancel()
		pool.Shutdown(context.Background())
	}()
	for {
		select {
		case <-signals:
			return nil
		case line, ok := <-lines:
			if !ok {
				return nil
			}
			if len(line) == 0 {
				continue
			}
			p.emit(p.answer(ctx, line))
		}
	}
}

// leadingBlocks is what a lookup answers from the index's keyToPods, per block of the request's keys: the pods holding it
// and its entries (sorted), and per pod how many blocks it holds from the first one on (the longest cached prefix).
func leadingBlocks(keys []kvblock.BlockHash, keyToPods map[kvblock.BlockHash][]kvblock.PodEntry) ([][]string, [][]string, map[string]int) {
	blocks, tiers := make([][]string, len(keys)), make([][]string, len(keys))
	prefix := map[string]int{}
	active := map[string]bool{}
	for i, key := range keys {
		seen := map[string]bool{}
		blocks[i], tiers[i] = []string{}, []string{}
		for _, entry := range keyToPods[key] {
			tiers[i] = append(tiers[i], entry.String())
			if !seen[entry.PodIdentifier] {
				seen[entry.PodIdentifier] = true
				blocks[i] = append(blocks[i], entry.PodIdentifier)
			}
		}
		sort.Strings(blocks[i])
		sort.Strings(tiers[i])
		for pod := range seen {
			if i == 0 {
				active[pod] = true
			}
			if active[pod] {
				prefix[pod]++
			}
		}
		for pod := range active {
			if !seen[pod] {
				delete(active, pod)
			}
		}
	}
	return blocks, tiers, prefix
}

// answer is the probe's reply to one line of stdin.
func (p *probe) answer(ctx context.Context, line []byte) map[string]any {
	var req request
	if err := json.Unmarshal(line, &req); err != nil {
		return map[string]any{"error": "not a JSON request: " + err.Error()}
	}
	switch {
	case req.Stats:
		return p.stats()
	case req.Lookup != nil:
		return p.lookup(ctx, &req)
	default:
		return map[string]any{"error": `want {"lookup": [token ids], "model": name} or {"stats": true}`}
	}
}
