# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The fleet study's routing policies: stand-ins that score as the real routers score at their pins, and an oracle.

Read at the tags (``GIE`` = sigs.k8s.io/gateway-api-inference-extension@v1.4.0, ``LLMD`` = llm-d/llm-d-router@v0.9.0,
``KVC`` = github.com/llm-d/llm-d-kv-cache@v0.9.0, the index LLMD builds in):

* ``queue_scores``: the queue-scorer, (most - this) / (most - fewest) of each endpoint's waiting requests
  (``vllm:num_requests_waiting``), 1 for every endpoint when all wait alike (GIE pkg/epp/framework/plugins/scheduling/
  scorer/queue.go; LLMD .../scheduling/scorer/queuedepth/queue.go, the same arithmetic);
* ``kv_utilization_scores``: the kv-cache-utilization-scorer, 1 - ``vllm:kv_cache_usage_perc`` (GIE .../scorer/
  kvcache_utilization.go; LLMD .../scorer/kvcacheutilization/kvcache_utilization.go);
* ``weighted``: the profile's sum of weight x score, each score clamped to [0, 1] (GIE pkg/epp/scheduling/
  scheduler_profile.go runScorerPlugins, enforceScoreRange; LLMD the same file);
* ``max_score_pick``: the max-score-picker: the candidates shuffled, then stable-sorted by score, the first taken: a random
  one among the best (GIE .../picker/max_score_picker.go, common.go shuffleScoredEndpoints; LLMD .../picker/maxscore/
  picker.go); ``random_pick``: the random-picker, shuffled, the first (GIE .../picker/random_picker.go);
* ``GIEPrefix``: GIE's approximate prefix-cache-scorer (GIE .../scorer/prefix/plugin.go, indexer.go): the prompt's bytes
  in blocks of ``blockSizeTokens`` x 4 characters (``averageCharactersPerToken``), the partial last block dropped, at most
  ``maxPrefixBlocksToMatch`` blocks, each block's hash chained from the previous one and the first from the model; the
  score of an endpoint the leading blocks it is believed to hold over the prompt's blocks; after each pick the prompt's
  blocks are added to the picked endpoint's LRU, whose size is ``lruCapacityPerServer`` or, with ``autoTune`` (on by
  default), the endpoint's ``num_gpu_blocks`` (its block size then the engine's too). The LRU and the match are the
  collection's model of that indexer (``kv/index_approx.ApproxPrefixPredictor``: the same walk, the same per-endpoint LRU);
* ``PrecisePrefix``: llm-d's precise-prefix-cache-producer with the prefix-cache-scorer (LLMD .../requestcontrol/
  dataproducer/preciseprefixcache/producer.go produceFromBlockKeys, .../scorer/prefix/plugin.go): the prompt's block keys
  looked up in the KV-block index built from the engines' events, the score the leading blocks an endpoint holds over
  the prompt's full blocks (KVC pkg/kvcache/kvblock_scorer.go LongestPrefixScorer, GPU tier weight 1); the index is the
  collection's (``kv/index.KVBlockIndex`` without counted copies, llm-d's semantics).

The configurations (``CONFIGS``): ``random``; ``load`` (the blog's load-scheduling: queue and kv-cache-utilization at weight
1 each); ``approximate`` (the blog's approximate setup, equal weights, its LRU and match limit scaled as the blog sized
them: ``workload.BLOG``); ``gie-default`` (the collection's default for router_impl gie: queue 2, kv-cache-utilization 2,
prefix 3 with autoTune, what roles/router renders); ``approximate-blog-lru`` (the blog's LRU and match limit with the
collection's weights: which of the two separates the blog's approximate setup from the others); ``precise`` (llm-d
v0.9.0's documented precise configuration, LLMD deploy/config/epp-precise-prefix-cache-config.yaml: prefix 2,
kv-cache-utilization 1, queue 1); and ``oracle``, a heuristic that knows each engine's true cache and queue and the
simulator's latency model and picks the engine with the lowest estimated time to first token: a heuristic, not a bound.
"""

from __future__ import absolute_import, division, print_function

import hashlib

from . import module_utils

approx_mod = module_utils("kv.index_approx")

CHARS_PER_TOKEN = 4            # GIE prefix/plugin.go averageCharactersPerToken
DEFAULT_MAX_PREFIX_BLOCKS = 256
DEFAULT_LRU_CAPACITY = 31250

# name: scorer weights (queue, kv: kv-cache-utilization, prefix), the prefix kind, and where the numbers come from
CONFIGS = {
    "random": {"picker": "random", "router": "GIE v1.4.0 random-picker", "source": "GIE .../picker/random_picker.go"},
    "load": {"weights": {"queue": 1.0, "kv": 1.0}, "router": "GIE v1.4.0 scorers",
             "source": "the blog's load-scheduling (llm-d-kv-cache-manager benchmarking/73-capacity/README.md)"},
    "approximate": {"weights": {"queue": 1.0, "kv": 1.0, "prefix": 1.0}, "prefix": "gie", "blog_lru": True,
                    "router": "GIE v1.4.0 scorers", "source": "the blog's approximate setup (estimated-scheduling)"},
    "gie-default": {"weights": {"queue": 2.0, "kv": 2.0, "prefix": 3.0}, "prefix": "gie", "router": "GIE v1.4.0 scorers",
                    "source": "roles/router defaults for router_impl gie (GIE pkg/epp/config/loader/defaults.go)"},
    "approximate-blog-lru": {"weights": {"queue": 2.0, "kv": 2.0, "prefix": 3.0}, "prefix": "gie", "blog_lru": True,
                             "router": "GIE v1.4.0 scorers",
                             "source": "the blog's LRU and match limit at the collection's weights: which of the two the blog's "
                                       "approximate setup loses by"},
    "precise": {"weights": {"prefix": 2.0, "kv": 1.0, "queue": 1.0}, "prefix": "precise", "router": "llm-d v0.9.0 scorers",
                "source": "llm-d-router@v0.9.0 deploy/config/epp-precise-prefix-cache-config.yaml"},
    "oracle": {"picker": "oracle", "router": "heuristic", "source": "the true caches and queues, the simulator's latency model"},
}
POLICIES = tuple(CONFIGS)


def clamp(score):
    return 0.0 if score < 0 else 1.0 if score > 1 else float(score)


def queue_scores(waiting):
    """GIE's queue-scorer over ``{endpoint: waiting requests}``."""
    most, fewest = max(waiting.values()), min(waiting.values())
    if most == fewest:
        return dict((name, 1.0) for name in waiting)
    return dict((name, (most - value) / float(most - fewest)) for name, value in waiting.items())


def kv_utilization_scores(usage):
    """GIE's kv-cache-utilization-scorer over ``{endpoint: KV-cache usage, a fraction}``."""
    return dict((name, 1.0 - value) for name, value in usage.items())


def weighted(parts, weights):
    """``{endpoint: sum of weight x clamped score}`` over ``parts`` (``{scorer: {endpoint: score}}``), in ``weights``' order."""
    names = list(next(iter(parts.values())))
    total = dict((name, 0.0) for name in names)
    for scorer, weight in weights.items():
        for name in names:
            total[name] += clamp(parts[scorer][name]) * weight
    return total


def max_score_pick(scores, rng):
    """The max-score-picker: shuffle, stable sort by score (highest first), take the first."""
    names = sorted(scores)
    rng.shuffle(names)
    best = max(scores.values())
    for name in names:
        if scores[name] == best:
            return name
    return names[0]


def random_pick(names, rng):
    """The random-picker: shuffle, take the first."""
    names = sorted(names)
    rng.shuffle(names)
    return names[0]


def gie_block_hashes(prompt, model, block_size_tokens, max_blocks):
    """GIE's hashPrompt for a completions request: chained hashes of the prompt's full blocks of ``block_size_tokens`` x 4
    bytes, at most ``max_blocks``; empty when the prompt is shorter than one block. The hash function is this module's
    (BLAKE2b, 8 bytes): only identity matters, as in ``kv/index_approx``."""
    data = prompt.encode("utf-8")
    size = int(block_size_tokens) * CHARS_PER_TOKEN
    if len(data) < size:
        return []
    data = data[:int(max_blocks) * size]
    prev = hashlib.blake2b(model.encode("utf-8"), digest_size=8).digest()
    out = []
    for start in range(0, len(data) - size + 1, size):
        prev = hashlib.blake2b(data[start:start + size] + prev, digest_size=8).digest()
        out.append(int.from_bytes(prev, "little"))
    return out


class GIEPrefix:
    """GIE v1.4.0's approximate prefix-cache-scorer: its hashing, its LRU per endpoint, its score."""

    def __init__(self, engines, model, block_size_tokens=None, max_blocks=DEFAULT_MAX_PREFIX_BLOCKS,
                 lru_capacity=DEFAULT_LRU_CAPACITY, auto_tune=True):
        """``engines``: ``{name: (block_size, num_gpu_blocks)}`` as the endpoints' metrics give them (autoTune reads the
        first endpoint's block size and each picked endpoint's block count)."""
        first = engines[sorted(engines)[0]]
        self.block_size = first[0] if auto_tune and first[0] else (block_size_tokens or 16)
        self.max_blocks = int(max_blocks)
        self.model = model
        self.predictor = approx_mod.ApproxPrefixPredictor(self.block_size, capacity=int(lru_capacity))
        if auto_tune:
            for name, (_size, blocks) in engines.items():
                self.predictor.set_capacity(name, blocks)

    def hashes(self, prompt):
        return gie_block_hashes(prompt, self.model, self.block_size, self.max_blocks)

    def scores(self, hashes, names):
        total = len(hashes)
        matched = self.predictor.match(hashes) if total else {}
        return dict((name, matched.get(name, 0) / float(total) if total else 0.0) for name in names)

    def picked(self, name, hashes):
        self.predictor.routed(name, hashes)


class PrecisePrefix:
    """llm-d's precise prefix score over a KV-block index fed by the engines' events (``kv/index.KVBlockIndex``)."""

    def __init__(self, index):
        self.index = index

    def scores(self, tokens, names):
        keys = self.index.prompt_keys(tokens)
        total = len(keys)
        return dict((name, self.index.lookup(name, keys) / float(total) if total else 0.0) for name in names)


class View:
    """What a router knows of the fleet at a pick: per endpoint its waiting requests and KV-cache usage (what the EPPs scrape
    from /metrics), and, for the oracle only, its running requests, the work queued on it and its true cached blocks of
    the prompt."""

    def __init__(self, waiting, usage, running=None, queued_work=None, cached_blocks=None):
        self.waiting = waiting
        self.usage = usage
        self.running = running or {}
        self.queued_work = queued_work or {}
        self.cached_blocks = cached_blocks or {}


class Request:
    """A request as the policies see it: its prompt text (the approximate scorer hashes bytes) and token ids (the precise
    one looks up block keys)."""

    def __init__(self, prompt, tokens, model):
        self.prompt = prompt
        self.tokens = tokens
        self.model = model
        self.gie_hashes = None


class Latency:
    """The simulator's latency model (llm-d-inference-sim@v0.10.2:pkg/llm-d-inference-sim/latencies.go, per-token calculator):
    TTFT = (overhead + uncached prompt tokens x per token) x the load factor 1 + (time_factor - 1)(running - 1)/(max_num_seqs - 1),
    ``running`` the requests running when the prefill starts; then each further output token an inter-token latency times the
    load factor. A request holds its slot (and its blocks) until its last token."""

    def __init__(self, overhead_s, per_token_s, max_num_seqs, time_factor, itl_s=0.0, output_tokens=1):
        self.overhead_s, self.per_token_s = float(overhead_s), float(per_token_s)
        self.max_num_seqs, self.time_factor = int(max_num_seqs), float(time_factor)
        self.itl_s, self.output_tokens = float(itl_s), max(1, int(output_tokens))

    def factor(self, running):
        if self.max_num_seqs <= 1:
            return 1.0
        return 1.0 + (self.time_factor - 1.0) * (max(1, running) - 1) / float(self.max_num_seqs - 1)

    def prefill(self, uncached_tokens):
        """Seconds to the first token at no load."""
        return self.overhead_s + max(0, uncached_tokens) * self.per_token_s

    def work(self, uncached_tokens):
        """Seconds a request holds its slot at no load: its prefill and its further tokens."""
        return self.prefill(uncached_tokens) + (self.output_tokens - 1) * self.itl_s

    def drain_rate(self):
        """Seconds of no-load work a full engine completes per second."""
        return self.max_num_seqs / self.factor(self.max_num_seqs)


class Policy:
    """One configuration of ``CONFIGS``: ``pick(request, view, names)`` then ``picked(name, request)``."""

    def __init__(self, name, rng, engines=None, model="", index=None, latency=None, block_size=16, approx=None):
        if name not in CONFIGS:
            raise ValueError("unknown policy %r: the policies are %s" % (name, ", ".join(POLICIES)))
        self.name = name
        self.config = CONFIGS[name]
        self.rng = rng
        self.block_size = block_size
        self.latency = latency
        self.prefix = None
        if self.config.get("prefix") == "gie":
            engines = engines or {}
            if self.config.get("blog_lru"):
                self.prefix = GIEPrefix(engines, model, block_size_tokens=block_size, auto_tune=False, **(approx or {}))
            else:
                self.prefix = GIEPrefix(engines, model)
        elif self.config.get("prefix") == "precise":
            self.prefix = PrecisePrefix(index)

    def scores(self, request, view, names):
        """Per endpoint, each scorer's score and the weighted total (``{"total": ..., "queue": ..., ...}``)."""
        weights = self.config["weights"]
        parts = {}
        if "queue" in weights:
            parts["queue"] = queue_scores(dict((n, view.waiting[n]) for n in names))
        if "kv" in weights:
            parts["kv"] = kv_utilization_scores(dict((n, view.usage[n]) for n in names))
        if "prefix" in weights:
            if isinstance(self.prefix, GIEPrefix):
                if request.gie_hashes is None:
                    request.gie_hashes = self.prefix.hashes(request.prompt)
                parts["prefix"] = self.prefix.scores(request.gie_hashes, names)
            else:
                parts["prefix"] = self.prefix.scores(request.tokens, names)
        parts["total"] = weighted(parts, weights)
        return parts

    def pick(self, request, view, names):
        picker = self.config.get("picker")
        if picker == "random":
            return random_pick(names, self.rng)
        if picker == "oracle":
            return self.oracle(request, view, names)
        return max_score_pick(self.scores(request, view, names)["total"], self.rng)

    def estimate(self, request, view, name):
        """The oracle's estimated time to first token on ``name``: the work queued ahead drained at a full engine's rate,
        then this prompt's uncached tokens at the load factor it would start under."""
        lat = self.latency
        running = view.running.get(name, 0)
        queued = view.queued_work.get(name, 0.0)
        uncached = len(request.tokens) - view.cached_blocks.get(name, 0) * self.block_size
        wait = queued / lat.drain_rate() if running >= lat.max_num_seqs else 0.0
        return wait + lat.prefill(uncached) * lat.factor(min(running + 1, lat.max_num_seqs))

    def oracle(self, request, view, names):
        estimates = dict((name, -self.estimate(request, view, name)) for name in names)
        return max_score_pick(estimates, self.rng)

    def picked(self, name, request):
        if isinstance(self.prefix, GIEPrefix):
            if request.gie_hashes is None:
                request.gie_hashes = self.prefix.hashes(request.prompt)
            self.prefix.picked(name, request.gie_hashes)

    def describe(self):
        return "%s (%s; %s)" % (self.name, self.config["router"], self.config["source"])


def blog_approx(spec):
    """The blog's approximate prefix-cache-scorer parameters scaled to ``spec`` (a workload spec): its LRU held 31250 blocks of
    64 characters per server, 2,000,000 characters (500,000 tokens at GIE's 4 per token) against the 307,328 KV tokens of
    each pod (1.63 times); it matched at most 256 blocks (4,096 tokens) of 7,200-token prompts. Here the same ratios to the
    engine's KV capacity and to the prompt, in blocks of the engine's block size (64 characters at 16 tokens)."""
    from . import workload   # pylint: disable=import-outside-toplevel
    blog = workload.BLOG
    block_tokens = blog["approx"]["hash_block_chars"] / float(CHARS_PER_TOKEN)
    lru_ratio = blog["approx"]["lru_capacity_per_server"] * block_tokens / float(blog["kv_tokens_per_pod"])
    match_tokens = blog["approx"]["max_prefix_blocks"] * block_tokens
    blog_prompt = blog["prefix_tokens"] + blog["question_tokens"]
    size = int(spec["block_size"])
    prompt = int(spec["prefix_tokens"]) + int(spec["question_tokens"])
    return {"lru_capacity": int(round(lru_ratio * int(spec["capacity_blocks"]))),
            "max_blocks": max(1, int(match_tokens / blog_prompt * prompt / size)),
            "lru_ratio": round(lru_ratio, 3), "match_ratio": round(match_tokens / blog_prompt, 3)}
