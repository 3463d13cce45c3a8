#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Prefix-cache routing policies on real vLLM engines: precise, approximate, load-only, random.

This measures the routing claim on real engines with the collection's own index standing in for the router:
the llm-d EPP cannot be built here (the Go module proxy refuses github.com/llm-d/*), so each request is
routed by this script to ONE of the engines by one of four policies:

* precise: the engine with the most predicted cached tokens in the KV-block index built from the engines' KV
  events (``kv/index_check.KVIndexCheck``: copies counted, what ``kv_index_check`` proves exact);
* approximate: the engine with the most matched blocks in ``kv/index_approx.ApproxPrefixPredictor``, the
  model of llm-d's approx-prefix-cache-producer (routing history only, character blocks, an LRU of
  ``num_gpu_blocks`` entries per engine), fed with its own routing decisions;
* load-only: the engine with the fewest requests sent so far (requests are sequential: round robin);
* random: a seeded random engine.

Ties are broken the same way in every policy: fewest requests sent so far in this configuration, then name.

The workload is multi-tenant: tenants (prompt families) with a long shared prefix each, picked with a Zipf
skew, each request a new question or a follow-up that extends the tenant's conversation; together the
prefixes hold more blocks than an engine's KV cache. Every configuration gets its own prompt families: the same
prompts (same tenants, sequence, follow-ups, token counts) behind a per-configuration tag of equal token length
in the first block ("run 1 <nonce>:", "run 2 <nonce>:", ...). Block hashes chain, so no block of one
configuration matches another's and what an earlier configuration left in the caches cannot help a later one
(it is evicted like any cold block); the engines are not restarted between configurations (a start takes 45 to
150 s per engine on the 2-core machine here). The script checks that the token counts agree.

Per configuration: the prefix-cache hit rate from the engines' own counters (deltas of
``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total`` on /metrics, in tokens), the cached
tokens per request (``usage.prompt_tokens_details.cached_tokens``), how often the chosen engine held the
longest cached prefix (refereed by the exact index, copies counted, read just before the request; the index's
prediction for the chosen engine is checked against what it then reports), time to first token measured by
streaming (p50/p90; requests ask for ``max_tokens`` tokens, 1 by default, so the whole request takes about
as long), requests failed. Configurations run one after the other, so load from other processes on the
machine affects their latencies unevenly.

``make bench-routing`` starts two engines through ``playbooks/kv_index.yml`` on ports 8400/8401 (events
5800/5802, replay 5801/5803), runs this with ``--require`` and stops them. Without engines (``make bench``) it
prints that it skipped and exits 0.

  .venv/bin/python benchmarks/bench_routing.py [--engine NAME=PORT,EVENTS_PORT,REPLAY_PORT ...] [--requests 80]
      [--tenants 16] [--policies precise,approximate,load-only,random] [--seed 0] [--json] [--require]
"""

from __future__ import absolute_import, division, print_function

import argparse
import json
import os
import random
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
from _loader import module_utils  # noqa: E402  pylint: disable=wrong-import-position

check = module_utils("kv.index_check")
approx_mod = module_utils("kv.index_approx")
kv_index = module_utils("kv.index")
workload_mod = module_utils("kv.workload")
http = module_utils("http.openai")
wiring = module_utils("common.wiring")
errors = module_utils("common.errors")

POLICIES = ("precise", "approximate", "load-only", "random")
DEFAULT_ENGINES = ("bench-a=8400,5800,5801", "bench-b=8401,5802,5803")
COUNTER_RE = re.compile(r"^(vllm:prefix_cache_(?:hits|queries)_total)(?:\{[^}]*\})?\s+(\S+)\s*$", re.M)


def words(rng, count):
    return " ".join("".join(rng.choice(workload_mod.SYLLABLES) for _i in range(rng.randint(1, 3))) for _j in range(count))


class Request:
    __slots__ = ("index", "tenant", "kind", "prompt")

    def __init__(self, index, tenant, kind, prompt):
        self.index = index
        self.tenant = tenant
        self.kind = kind
        self.prompt = prompt


def build_workload(tag, requests, tenants, prefix_words, seed, zipf=1.0, follow_up=0.3, max_turns=4):
    """The requests of one configuration, from ``seed``; every prompt starts with ``tag``.

    Configurations get the same prompts after a tag of the same token length ("run 1 <nonce>:", "run 2 <nonce>:"):
    the tag is in every prompt's first block, and block hashes chain, so no block of one configuration matches
    another's, while token counts, tenants, follow-ups and lengths are the same.
    """
    rng = random.Random(seed)
    prefixes = ["%s tenant %d: %s" % (tag, t, words(rng, prefix_words)) for t in range(tenants)]
    weights = [1.0 / (t + 1) ** zipf for t in range(tenants)]
    conversations = {}
    out = []
    for idx in range(requests):
        tenant = rng.choices(range(tenants), weights)[0]
        turns, convo = conversations.get(tenant, (0, ""))
        follow = 0 < turns < max_turns and rng.random() < follow_up
        question = "\nQ%d: %s?" % (idx, words(rng, rng.randint(4, 14)))
        turns, convo = (turns + 1, convo + question) if follow else (1, question)
        conversations[tenant] = (turns, convo)
        out.append(Request(idx + 1, tenant, "follow-up" if follow else "new", prefixes[tenant] + convo))
    return out


def percentile(values, pct):
    """Linear interpolation between closest ranks (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * pct / 100.0
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def prefix_counters(metrics_text):
    """Sum over label sets of vLLM's prefix-cache hit and query counters (tokens)."""
    out = {"vllm:prefix_cache_hits_total": 0.0, "vllm:prefix_cache_queries_total": 0.0}
    found = set()
    for name, value in COUNTER_RE.findall(metrics_text or ""):
        out[name] += float(value)
        found.add(name)
    return out if len(found) == 2 else None


class RoutingBench(check.KVIndexCheck):
    """KVIndexCheck's subscriptions, index and tokenizer; each request goes to ONE engine chosen by a policy."""

    def __init__(self, params, policies, workloads, seed=0):
        super(RoutingBench, self).__init__(params)
        self.policies = policies
        self.workloads = workloads
        self.seed = seed
        self.rows = []
        self.state = None
        self.token_counts = {}
        # KVIndexCheck's own, set again for pylint (it does not see the base class through tools/_loader.py)
        self.start = self.deadline = None
        self.engines, self.by_name = [], {}

    def run(self):
        """KVIndexCheck.run's steps, with the configurations in place of its workload; returns one row per configuration."""
        self.prepare()
        for engine in self.engines:   # the topic the engine publishes under: kv@<host>:<port>@<served model name>
            prefix, pod, model = wiring.split_topic(engine.topic)
            if not model:
                host, port = pod.rsplit(":", 1)
                engine.source.topic = wiring.kv_topic(host, port, self.model, prefix)
        with self.listening():
            self.settle()
            for policy in self.policies:
                self.rows.append(self.run_policy(policy, self.workloads[policy]))
        return self.rows

    def counters(self):
        out = {}
        for engine in self.engines:
            try:
                out[engine.name] = prefix_counters(engine.client.get_text("/metrics"))
            except http.OpenAIHTTPError:
                out[engine.name] = None
        return out

    def removed(self):
        return dict((e.name, self.index.engines[e.name].removed_blocks if e.name in self.index.engines else 0) for e in self.engines)

    def run_policy(self, policy, requests):
        names = sorted(e.name for e in self.engines)
        self.state = {
            "policy": policy,
            "sent": dict((n, 0) for n in names),
            "rng": random.Random(self.seed),
            "approx": approx_mod.ApproxPrefixPredictor(approx_mod.effective_block_size(self.block_size)),
            "records": [],
            "failed": 0,
            "failures": [],
            "keys": set(),
        }
        for engine in self.engines:
            self.state["approx"].set_capacity(engine.name, engine.num_gpu_blocks)
        self.settle()
        before, removed_before, start = self.counters(), self.removed(), self.clock()
        for request in requests:
            self.run_step(request)
        self.settle()
        after, removed_after, elapsed = self.counters(), self.removed(), self.clock() - start
        return self.row(policy, before, after, removed_before, removed_after, elapsed)

    def choose(self, policy, precise, approx_blocks):
        """ONE engine by policy; ties: fewest requests sent so far in this configuration, then name."""
        sent = self.state["sent"]
        names = sorted(sent)
        if policy == "random":
            return self.state["rng"].choice(names)
        if policy == "precise":
            scores = precise
        elif policy == "approximate":
            scores = approx_blocks
        else:
            scores = {}
        return min(names, key=lambda n: (-scores.get(n, 0), sent[n], n))

    def run_step(self, step):
        policy = self.state["policy"]
        self.drain()   # the previous step settled: nothing should be pending, but apply anything that is
        tokens = self.tokenize(self.engines[0], step.prompt)   # one model, one tokenizer on every engine
        keys = self.index.prompt_keys(tokens)
        self.state["keys"].update(keys)
        self.token_counts.setdefault(policy, []).append(len(tokens))
        precise = dict((e.name, kv_index.predicted_cached_tokens(self.index.lookup(e.name, keys), len(tokens), self.block_size))
                       for e in self.engines)
        approx = self.state["approx"]
        hashes = approx_mod.block_hashes(step.prompt, approx.block_size, self.model) if policy == "approximate" else None
        approx_blocks = approx.match(hashes) if hashes is not None else {}
        name = self.choose(policy, precise, approx_blocks)
        engine = self.by_name[name]
        self.state["sent"][name] += 1
        engine.requests += 1
        if hashes is not None:
            approx.routed(name, hashes)   # the producer records the decision before the response (PreRequest)
        since = engine.source.activity
        body = {"model": self.model, "prompt": step.prompt, "max_tokens": int(self.params.get("max_tokens") or 1),
                "temperature": 0}
        try:
            answer = engine.client.stream_completion(body)
            usage = answer.get("usage") or {}
            reported = http.cached_tokens(usage)
            if reported is None or usage.get("prompt_tokens") != len(tokens):
                raise http.OpenAIHTTPError("no cached_tokens, or prompt_tokens %r for %d tokenized" % (
                    usage.get("prompt_tokens"), len(tokens)))
        except http.OpenAIHTTPError as exc:
            self.state["failed"] += 1
            if len(self.state["failures"]) < 3:
                self.state["failures"].append("request %d to %s: %s" % (step.index, name, exc))
            self.settle()
            return
        best = max(precise.values())
        self.state["records"].append({
            "engine": name, "kind": step.kind, "prompt_tokens": len(tokens), "cached": reported,
            "predicted": precise[name], "best": best, "held_longest": precise[name] == best,
            "ttft": answer["ttft"], "latency": answer["latency"], "index": step.index, "tenant": step.tenant,
        })
        expect_store = (len(tokens) // self.block_size) * self.block_size > reported
        self.settle(wait_for=engine if expect_store else None, since=since)

    def row(self, policy, before, after, removed_before, removed_after, elapsed):
        recs = self.state["records"]
        hits = queries = 0.0
        counters_ok = True
        for name in before:
            if before[name] is None or after.get(name) is None:
                counters_ok = False
                continue
            hits += after[name]["vllm:prefix_cache_hits_total"] - before[name]["vllm:prefix_cache_hits_total"]
            queries += after[name]["vllm:prefix_cache_queries_total"] - before[name]["vllm:prefix_cache_queries_total"]
        some_cached = [r for r in recs if r["best"] > 0]

        def ms(values, pct):
            return round(1000.0 * percentile(values, pct), 1) if values else None

        ttfts = [r["ttft"] for r in recs]
        latencies = [r["latency"] for r in recs]
        return {
            "policy": policy,
            "requests": len(recs) + self.state["failed"],
            "failed": self.state["failed"],
            "failures": list(self.state["failures"]),
            "hit_rate": round(hits / queries, 4) if queries and counters_ok else None,
            "counter_hits": int(hits),
            "counter_queries": int(queries),
            "reported_cached_tokens": sum(r["cached"] for r in recs),
            "prompt_tokens": sum(r["prompt_tokens"] for r in recs),
            "cached_per_request": round(sum(r["cached"] for r in recs) / float(len(recs)), 1) if recs else None,
            "prompt_tokens_per_request": round(sum(r["prompt_tokens"] for r in recs) / float(len(recs)), 1) if recs else None,
            "held_longest": sum(1 for r in recs if r["held_longest"]),
            "steps_with_a_cached_prefix": len(some_cached),
            "held_longest_of_those": sum(1 for r in some_cached if r["held_longest"]),
            "index_exact": sum(1 for r in recs if r["cached"] == r["predicted"]),
            "ttft_ms_p50": ms(ttfts, 50), "ttft_ms_p90": ms(ttfts, 90),
            "latency_ms_p50": ms(latencies, 50), "latency_ms_p90": ms(latencies, 90),
            "requests_per_engine": dict(self.state["sent"]),
            "evicted_blocks_per_engine": dict((n, removed_after[n] - removed_before[n]) for n in removed_after),
            "distinct_blocks": len(self.state["keys"]),
            "follow_ups": sum(1 for r in recs if r["kind"] == "follow-up"),
            "elapsed_s": round(elapsed, 1),
            "records": recs,
        }


def parse_engine(text):
    match = re.match(r"^([\w.-]+)=(\d+),(\d+),(\d+)$", text)
    if not match:
        raise argparse.ArgumentTypeError("--engine wants NAME=PORT,EVENTS_PORT,REPLAY_PORT, got %r" % text)
    name, port, events, replay = match.groups()
    return {"name": name, "url": "http://127.0.0.1:%s" % port, "endpoint": "tcp://127.0.0.1:%s" % events,
            "socket_mode": "bind", "replay_endpoint": "tcp://127.0.0.1:%s" % replay, "topic": wiring.kv_topic("127.0.0.1", port, "")}


def reachable(spec):
    try:
        http.OpenAIClient(spec["url"], timeout=5).get_json("/v1/models")
    except http.OpenAIHTTPError as exc:
        return str(exc)
    return None


def fmt(value, pattern="%s"):
    return "-" if value is None else pattern % value


def table(rows):
    lines = [
        "| Policy | Hit rate (engine counters) | Cached tokens / request | Chose the longest cached prefix | "
        "TTFT p50 / p90 (ms) | Failed | Requests per engine | Evicted blocks |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append("| %s | %s (%d/%d tokens) | %s of %s | %d/%d (%d/%d with a cached prefix somewhere) | %s / %s | %d/%d | %s | %s |" % (
            r["policy"], fmt(None if r["hit_rate"] is None else 100.0 * r["hit_rate"], "%.1f%%"), r["counter_hits"],
            r["counter_queries"], fmt(r["cached_per_request"]), fmt(r["prompt_tokens_per_request"]), r["held_longest"],
            r["requests"] - r["failed"], r["held_longest_of_those"], r["steps_with_a_cached_prefix"], fmt(r["ttft_ms_p50"]),
            fmt(r["ttft_ms_p90"]), r["failed"], r["requests"],
            " ".join("%s %d" % kv for kv in sorted(r["requests_per_engine"].items())),
            " ".join("%s %d" % kv for kv in sorted(r["evicted_blocks_per_engine"].items()))))
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", action="append", type=parse_engine, help="NAME=PORT,EVENTS_PORT,REPLAY_PORT (repeat; "
                        "default: %s)" % " ".join(DEFAULT_ENGINES))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--requests", type=int, default=80, help="requests per configuration")
    parser.add_argument("--tenants", type=int, default=16, help="prompt families per configuration")
    parser.add_argument("--prefix-words", type=int, default=48, help="words of each tenant's shared prefix")
    parser.add_argument("--zipf", type=float, default=1.0, help="skew of the tenants' popularity")
    parser.add_argument("--follow-up", type=float, default=0.3, help="chance that a request extends the tenant's conversation")
    parser.add_argument("--max-tokens", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0, help="the workload's tenants, sequence and text")
    parser.add_argument("--nonce", type=int, help="in every prompt's first block, so that a run finds nothing cached by an "
                        "earlier one (default: random; printed)")
    parser.add_argument("--settle", type=float, default=0.3, help="seconds without KV events before the index counts as current")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--records", metavar="PATH", help="write every request (policy, engine, tokens, cached, predicted, "
                        "TTFT) to PATH as JSON lines")
    parser.add_argument("--json", action="store_true", help="one JSON object per configuration instead of a table")
    parser.add_argument("--require", action="store_true", help="fail (instead of skipping) when an engine is unreachable")
    args = parser.parse_args()
    engines = args.engine or [parse_engine(e) for e in DEFAULT_ENGINES]
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or len(engines) < 2:
        parser.error("policies are %s; at least two engines" % ", ".join(POLICIES))
    for spec in engines:
        problem = reachable(spec)
        if problem:
            print("bench_routing: %s: engine %s is not reachable (%s); `make bench-routing` starts two" % (
                "failed" if args.require else "skipped", spec["name"], problem))
            return 1 if args.require else 0
    nonce = args.nonce if args.nonce is not None else random.SystemRandom().randrange(10000, 100000)
    workloads = dict((p, build_workload("run %d %d:" % (POLICIES.index(p) + 1, nonce), args.requests, args.tenants,
                                        args.prefix_words, args.seed, args.zipf, args.follow_up)) for p in policies)
    params = {"engines": engines, "workload": {}, "expect": {}, "max_tokens": args.max_tokens, "settle": args.settle,
              "event_wait": 5.0, "timeout": args.timeout, "request_timeout": 120.0}
    bench = RoutingBench(params, policies, workloads, seed=args.seed)
    started = time.time()
    try:
        rows = bench.run()
    except errors.CheckError as exc:
        print("bench_routing: %s" % exc.msg)
        return 1
    if args.records:
        with open(args.records, "w", encoding="utf-8") as out:
            for row in rows:
                for rec in row["records"]:
                    out.write(json.dumps(dict(rec, policy=row["policy"]), sort_keys=True) + "\n")
    for row in rows:
        del row["records"]
    if args.json:
        for row in rows:
            print(json.dumps(row, sort_keys=True))
        return 0
    print("Routing over %d real vLLM engines (%s; %s blocks of %d tokens each), model %s; %d requests per configuration, "
          "%d tenants, sequential, max_tokens %d, seed %d, nonce %d, %s" % (
              len(engines), ", ".join(e.name for e in bench.engines),
              "/".join(str(e.num_gpu_blocks) for e in bench.engines), bench.block_size, bench.model, args.requests,
              args.tenants, args.max_tokens, args.seed, nonce, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started))))
    print("Router: this script, with the collection's KV-event index (precise) and its model of llm-d's "
          "approx-prefix-cache-producer (approximate) standing in for the llm-d EPP; ties: fewest requests so far, then name.")
    for line in table(rows):
        print(line)
    for r in rows:
        print("%s: %d distinct full blocks in its prompts, %d follow-ups, index exact on the chosen engine %d/%d, "
              "latency p50/p90 %s/%s ms, %.1f s%s" % (
                  r["policy"], r["distinct_blocks"], r["follow_ups"], r["index_exact"], r["requests"] - r["failed"],
                  fmt(r["latency_ms_p50"]), fmt(r["latency_ms_p90"]), r["elapsed_s"],
                  ("; failures: " + "; ".join(r["failures"])) if r["failures"] else ""))
    for r in rows:
        if r["index_exact"] < r["requests"] - r["failed"]:
            print("WARNING: %s: the index predicted the chosen engine's cached tokens on only %d of %d requests: the referee "
                  "(and the precise policy) missed KV events; see the engines' topics and event ports" % (
                      r["policy"], r["index_exact"], r["requests"] - r["failed"]))
    print("Hit rate: vllm:prefix_cache_hits_total / queries_total deltas summed over the engines (tokens). Chose the longest "
          "cached prefix: the chosen engine's cached tokens, per the exact index just before the request, were the most of "
          "any engine. TTFT: streamed, to the first token; with max_tokens 1 the request ends right after it. Each "
          "configuration sends the same prompts behind its own tag in the first block (token counts %s), so none finds "
          "another's blocks; the engines were not restarted between configurations." % (
              "identical" if len(set(tuple(c) for c in bench.token_counts.values())) == 1 else "NOT identical"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
