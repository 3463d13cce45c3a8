# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""``RoutingBench``: the collection's live KV-block index and engines; each request goes to ONE engine chosen by a policy.

It holds a ``kv/live_index.LiveIndex`` (the engines' streams, their replayed history, restarts: the index ``kv_index_check``
proves exact) and the engines of ``kv/engines.py`` (tokenizer, cache sizes), and subclasses nothing. An engine restarted
part way (the restart workload) is restarted through the service record its role published (``_lab.restart``).

Per configuration: the prefix-cache hit rate from the engines' own counters (deltas of
``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total`` on /metrics, in tokens), the cached tokens per
request (``usage.prompt_tokens_details.cached_tokens``), how often the chosen engine held the longest cached prefix
(refereed by the exact index, copies counted, read just before the request; the index's prediction for the chosen
engine is checked against what it then reports, in sequential workloads), time to first token measured by streaming
(p50/p90), requests failed; for a real EPP, the mean share of each prompt its own prefix index matched on the engine
it picked (``lanes.epp_prefix_match``).
"""

from __future__ import absolute_import, division, print_function

import argparse
import collections
import concurrent.futures
import random
import re
import sys
import time

import _lab
from ansible_collections.inference_cache.substrate.plugins.module_utils.common import errors, wiring
from ansible_collections.inference_cache.substrate.plugins.module_utils.http import openai as http
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import engines as kv_engines
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import index_approx as approx_mod
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import index_check
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.index import predicted_cached_tokens
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.live_index import LiveIndex

from . import policies
from .workloads import sequential

COUNTER_RE = re.compile(r"^(vllm:prefix_cache_(?:hits|queries)_total)(?:\{[^}]*\})?\s+(\S+)\s*$", re.M)


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


def reachable(spec):
    return _lab.reachable(spec["url"], "/v1/models")


def parse_engine(text):
    match = re.match(r"^([\w.-]+)=(?:([\d.]+):)?(\d+),(\d+),(\d+)$", text)
    if not match:
        raise argparse.ArgumentTypeError("--engine wants NAME=[HOST:]PORT,EVENTS_PORT,REPLAY_PORT, got %r" % text)
    name, host, port, events, replay = match.groups()
    host = host or "127.0.0.1"
    return {"name": name, "url": "http://%s:%s" % (host, port), "endpoint": "tcp://127.0.0.1:%s" % events, "host": host,
            "port": int(port), "socket_mode": "bind", "replay_endpoint": "tcp://127.0.0.1:%s" % replay,
            "topic": wiring.kv_topic(host, port, ""), "service": {}}


class RoutingBench:
    """The collection's live index and engines; each request goes to ONE engine chosen by a policy.

    ``params``: the engines (specs of ``_lab.load_engines`` or ``parse_engine``), ``settle``, ``event_wait``, ``timeout``,
    ``request_timeout``, ``max_tokens``. ``configs``: ``[(label, policy, workload spec, requests)]``, run in order (or a
    callable that returns them once the engines are known); ``run()`` returns one row each.
    """

    def __init__(self, params, configs, seed=0, epp=None):
        self.params = params
        self.configs = configs
        self.seed = seed
        self.epp = epp   # Lanes (the real EPPs) or None
        self.live = LiveIndex(settle=params["settle"], event_wait=params["event_wait"])
        self.clock = self.live.clock
        self.engines, self.by_name = [], {}
        self.model = params.get("model")
        self.block_size = None
        self.rows = []
        self.state = None
        self.token_counts = {}
        self.pool = None

    def prepare(self):
        """The engines, their streams in the live index, the model and block size they report."""
        self.live.deadline = self.clock() + self.params["timeout"]
        self.engines, self.model, self.block_size = index_check.start_engines(self.params, self.live)
        self.by_name = dict((e.name, e) for e in self.engines)

    def tokenize(self, engine, prompt):
        return kv_engines.tokenize(engine, self.model, prompt)

    def settle(self, **kwargs):
        self.live.settle(**kwargs)

    @property
    def policies(self):
        return [policy for _label, policy, _spec, _requests in self.configs]

    def run(self):
        """The configurations in turn over the live index; returns one row per configuration."""
        self.prepare()
        for engine in self.engines:   # the topic the engine publishes under: kv@<host>:<port>@<served model name>
            prefix, pod, model = wiring.split_topic(engine.stream.topic) or ("kv", "%s:%s" % (engine.spec["host"], engine.spec["port"]), "")
            if not model:
                host, port = pod.rsplit(":", 1)
                engine.stream.topic = wiring.kv_topic(host, port, self.model, prefix)
        if self.epp is not None:
            self.epp.check_configs(self.block_size)
        with self.live.listening(), concurrent.futures.ThreadPoolExecutor(8) as pool:
            if callable(self.configs):
                self.configs = self.configs(self)   # the plan needs the engines' tokenizer and cache sizes
            self.pool = pool
            self.settle()
            for label, policy, spec, requests in self.configs:
                if policy.startswith("epp:"):
                    with self.epp.router(policy[4:], count=int(spec["routers"])) as epps:
                        row = self.run_policy(policy, requests, spec)
                        row["epp_prefix_match"] = self.epp.prefix_match(epps)
                else:
                    row = self.run_policy(policy, requests, spec)
                row.update(label=label, workload=spec.get("name", "custom"), seed=spec.get("seed", self.seed))
                self.rows.append(row)
                sys.stderr.write("bench_routing: %d/%d %s: hit rate %s, %.0f s\n" % (
                    len(self.rows), len(self.configs), label, "-" if row["hit_rate"] is None else "%.1f%%" % (100.0 * row["hit_rate"]),
                    row["elapsed_s"]))
                sys.stderr.flush()
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
        return self.live.removed_blocks()

    def distinct_blocks(self, requests):
        """Distinct full-block keys of the prompts (the working set), by the engines' own tokenizer."""
        keys = set()
        for step in requests:
            keys.update(self.live.prompt_keys(self.tokenize(self.engines[0], step.prompt)))
        return len(keys)

    def cache_blocks(self):
        return sum(int(e.num_gpu_blocks or 0) for e in self.engines)

    def run_policy(self, policy, requests, spec):
        names = sorted(e.name for e in self.engines)
        routers = max(1, int(spec["routers"]))
        self.state = {
            "policy": policy,
            "spec": spec,
            "routers": routers,
            "sent": dict((n, 0) for n in names),
            "rng": random.Random(spec.get("seed", self.seed)),
            "approx": [approx_mod.ApproxPrefixPredictor(approx_mod.effective_block_size(self.block_size)) for _r in range(routers)],
            "speculative": [dict((n, {}) for n in names) for _r in range(routers)],
            "records": [],
            "failed": 0,
            "failures": [],
            "keys": set(),
            "resets": 0,
        }
        for approx in self.state["approx"]:
            for engine in self.engines:
                approx.set_capacity(engine.name, engine.num_gpu_blocks)
        self.settle()
        self.state["counted"] = []   # (before, after) counter readings: an engine restart starts its counters again
        before, removed_before, start = self.counters(), self.removed(), self.clock()
        self.state["before"] = before
        reset_at = int(len(requests) * float(spec["reset_at"])) if spec.get("reset_at") is not None else None
        restart_at = int(len(requests) * float(spec["restart_at"])) if spec.get("restart_at") is not None else None
        if not sequential(spec):   # reset and restart are sequential workloads' (WORKLOADS)
            self.run_concurrent(requests, max(int(spec["workers"]), int(spec["burst"])))
        else:
            for i, request in enumerate(requests):
                if i == reset_at:
                    self.reset_caches()
                if i == restart_at:
                    self.restart_engine(self.engines[-1])
                routed = self.route(request)
                if routed is not None:
                    self.finish(routed, *self.send(routed))
        self.settle()
        after, removed_after, elapsed = self.counters(), self.removed(), self.clock() - start
        return self.row(policy, self.state["counted"] + [(self.state["before"], after)], removed_before, removed_after, elapsed)

    def run_concurrent(self, requests, workers):
        """Up to ``workers`` requests in flight; requests of one burst (group) are routed together, a burst at a time."""
        pending = []
        queue = list(requests)
        bursts = int(self.state["spec"]["burst"]) > 1
        while queue or pending:
            while queue and len(pending) < workers and (not bursts or not pending or queue[0].group == pending[0][0].step.group):
                routed = self.route(queue.pop(0))
                if routed is not None:
                    pending.append((routed, self.pool.submit(self.send, routed)))
            self.live.consumer.poll(0.02)
            self.live.drain()
            still = []
            for routed, future in pending:
                if future.done():
                    self.finish(routed, *future.result())
                else:
                    still.append((routed, future))
            pending = still
            if bursts and not pending and queue:
                self.settle()   # the burst is done: its blocks are in the index before the next burst is routed

    def reset_caches(self):
        """POST /reset_prefix_cache on every engine (vLLM's development endpoint), then wait for its events."""
        for engine in self.engines:
            for _attempt in range(20):
                try:
                    answer = engine.client.post_json("/reset_prefix_cache", {})
                except http.OpenAIHTTPError as exc:
                    raise errors.CheckError("Cannot reset %s's prefix cache (%s); the reset workload needs the engines' development "
                                            "endpoints (VLLM_SERVER_DEV_MODE=1, which make bench-routing sets)." % (engine.name, exc))
                if not isinstance(answer, dict) or answer.get("success", True):
                    break
                time.sleep(0.2)   # blocks still held by a request: vLLM asks to retry
        self.state["resets"] += 1
        self.settle()

    def restart_engine(self, engine):
        """Stop and start ``engine`` through its role's service record; wait until it answers again and its events settle."""
        self.settle()
        self.state["counted"].append((self.state["before"], self.counters()))
        _lab.restart(engine.spec)
        self.state["restarts"] = self.state.get("restarts", 0) + 1
        self.settle()
        self.state["before"] = self.counters()

    def speculative_tokens(self, router, name, keys, prompt_tokens):
        held = self.state["speculative"][router][name]
        count = policies.speculative_blocks(held, keys, self.clock())
        return predicted_cached_tokens(count, prompt_tokens, self.block_size)

    def choose(self, policy, router, scores, body):
        """ONE engine by policy (policies.pick); a real EPP's pick is asked over ext_proc (lanes.Lanes.pick)."""
        if policy.startswith("epp:"):
            return self.epp.pick(router, body, self.engines)
        return policies.pick(policy, scores, self.state["sent"], self.state["rng"])

    def route(self, step):
        """Decide where ``step`` goes (this thread reads the events); None when the router failed (counted)."""
        policy = self.state["policy"]
        router = (step.index - 1) % self.state["routers"]
        self.live.drain()   # apply whatever arrived: in sequence the previous step settled, concurrently it did not
        tokens = self.tokenize(self.engines[0], step.prompt)   # one model, one tokenizer on every engine
        keys = self.live.prompt_keys(tokens)
        self.state["keys"].update(keys)
        self.token_counts.setdefault((self.state["spec"].get("name"), self.state["spec"].get("seed"), policy), []).append(len(tokens))
        precise = dict((e.name, self.live.predicted(e.name, tokens, keys)) for e in self.engines)
        approx = self.state["approx"][router]
        hashes = approx_mod.block_hashes(step.prompt, approx.block_size, self.model) if policy == "approximate" else None
        speculative = (dict((n, self.speculative_tokens(router, n, keys, len(tokens))) for n in precise)
                       if policy == "precise-speculative" else None)
        scores = policies.scores(policy, precise, approx.match(hashes) if hashes is not None else None, speculative)
        body = {"model": self.model, "prompt": step.prompt, "max_tokens": int(self.params.get("max_tokens") or 1),
                "temperature": 0}
        try:
            name = self.choose(policy, router, scores, body)
        except errors.CheckError as exc:
            self.state["failed"] += 1
            if len(self.state["failures"]) < 3:
                self.state["failures"].append("request %d: %s" % (step.index, exc.msg))
            return None
        engine = self.by_name[name]
        self.state["sent"][name] += 1
        engine.requests += 1
        if hashes is not None:
            approx.routed(name, hashes)   # the producer records the decision before the response (PreRequest)
        if policy == "precise-speculative":
            expiry = self.clock() + policies.SPECULATIVE_TTL
            for key in keys:   # what the EPP's speculative indexing adds at PreRequest, until the engine's events confirm it
                self.state["speculative"][router][name][key] = expiry
        return _Routed(step, name, len(tokens), precise, body, engine.stream.activity)

    def send(self, routed):
        """The request to the chosen engine (any thread): ``(answer, error)``."""
        engine = self.by_name[routed.name]
        try:
            answer = engine.client.stream_completion(routed.body)
            usage = answer.get("usage") or {}
            if http.cached_tokens(usage) is None or usage.get("prompt_tokens") != routed.tokens:
                raise http.OpenAIHTTPError("no cached_tokens, or prompt_tokens %r for %d tokenized" % (
                    usage.get("prompt_tokens"), routed.tokens))
        except http.OpenAIHTTPError as exc:
            return None, exc
        return answer, None

    def finish(self, routed, answer, error):
        step, name = routed.step, routed.name
        one_at_a_time = sequential(self.state["spec"])
        if error is not None:
            self.state["failed"] += 1
            if len(self.state["failures"]) < 3:
                self.state["failures"].append("request %d to %s: %s" % (step.index, name, error))
            if one_at_a_time:
                self.settle()
            return
        reported = http.cached_tokens(answer.get("usage") or {})
        best = max(routed.precise.values())
        self.state["records"].append({
            "engine": name, "kind": step.kind, "prompt_tokens": routed.tokens, "cached": reported,
            "predicted": routed.precise[name], "best": best, "held_longest": routed.precise[name] == best,
            "ttft": answer["ttft"], "latency": answer["latency"], "index": step.index, "tenant": step.tenant,
        })
        if one_at_a_time:
            expect_store = (routed.tokens // self.block_size) * self.block_size > reported
            self.settle(wait_for=self.by_name[name].stream if expect_store else None, since=routed.since)

    def row(self, policy, counted, removed_before, removed_after, elapsed):
        recs = self.state["records"]
        hits = queries = 0.0
        counters_ok = True
        for before, after in counted:
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
            "router": self.epp.label(policy[4:]) if policy.startswith("epp:") and self.epp is not None else "stand-in",
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
            "working_set": round(len(self.state["keys"]) / float(self.cache_blocks()), 2) if self.cache_blocks() else None,
            "follow_ups": sum(1 for r in recs if r["kind"] == "follow-up"),
            "resets": self.state["resets"],
            "restarts": self.state.get("restarts", 0),
            "sequential": sequential(self.state["spec"]),
            "elapsed_s": round(elapsed, 1),
            "records": recs,
        }


# One routed request: its step, the chosen engine, its token count, the index's predictions, the body, the engine's
# stream activity when it was sent.
_Routed = collections.namedtuple("_Routed", "step name tokens precise body since")
