#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Prefix-cache routing policies on real vLLM engines: the collection's stand-in router, and real EPPs beside it.

This measures the routing claim on real engines. Each request is routed to ONE of the engines, by the
collection's stand-in router (its own index in the llm-d EPP's place) under one of five policies:

* precise: the engine with the most predicted cached tokens in the KV-block index built from the engines' KV
  events (``kv/index_check.KVIndexCheck``: copies counted, what ``kv_index_check`` proves exact);
* precise-speculative: precise, plus, for ``SPECULATIVE_TTL`` seconds after each pick, the picked engine counted
  as holding the prompt's blocks (the EPP's ``speculativeIndexing``: a request routed before its same-prefix
  predecessor's KV events arrive follows it);
* approximate: the engine with the most matched blocks in ``kv/index_approx.ApproxPrefixPredictor``, the
  model of llm-d's approx-prefix-cache-producer (routing history only, character blocks, an LRU of
  ``num_gpu_blocks`` entries per engine), fed with its own routing decisions;
* load-only: the engine with the fewest requests sent so far (round robin);
* random: a seeded random engine.

Ties are broken the same way in every stand-in policy: fewest requests sent so far in this configuration, then name.

Real EPPs (``--epp``, repeatable; ``make bench-routing EPP="..."``), each with its own configurations, one policy
``epp:NAME`` per configuration (names distinct over both EPPs; ``make bench-routing`` renders them all with the router
role, ``benchmarks/epp_configs.yml``):

* the llm-d EPP (``--epp PATH``, ``--epp llm-d``, or ``SUBSTRATE_EPP_BINARY``), configurations ``--epp-config
  NAME=PATH`` (the role's precise, precise-speculative, approximate and approximate-equal (all scorer weights 1)): a
  fresh EPP per configuration, with file discovery over the engines (``tools/_epp_local.py``). Each engine connects
  to its KV-event endpoint; a relay binds it and republishes at ``tcp://<engine address>:<--kv-port>``, the one port
  the EPP's precise producer dials per endpoint (``podDiscoveryConfig.socketPort``), which this script subscribes to
  as well; every engine runs with ``--enable-scale-out`` (the token producer reads ``/v1/completions/render``, 403
  without it).
* the Gateway API Inference Extension's EPP (``--epp gie``: the build of ``make gie-epp``, built when missing; or
  ``--epp gie=PATH``), configurations ``--gie-config NAME=PATH`` (the role's ``router_impl: gie`` render: gie, at
  its weights queue 2, KV-cache utilization 2, prefix 3; gie-equal, all at 1): approximate prefix-cache scoring from
  its own routing history (character blocks of 4 characters per token, the engines' block size and cache size read
  from their metrics), no KV events. It discovers its endpoints through the Kubernetes API only, so this script
  starts a kwok cluster (``benchmarks/kwok_cluster.yml``: roles/kwok_cluster, a name and ports of its own) holding
  one simulated pod per engine whose IP is the engine's address (kwok_cluster's pod-IP stage) and an InferencePool
  over them (``tools/_epp_local.GIEPool``, the CRDs generated from GIE's API types); a fresh EPP per configuration
  reconciles that pool as in a cluster (its metrics count the ready pods before the first request). An
  InferencePool has one target port, so the engines listen on one port, each on its own 127.x address. The
  cluster, the pool and every EPP are stopped at the end, also on failure.

Without ``--epp`` (and without ``SUBSTRATE_EPP_BINARY``): llm-d's EPP where it can be had (the cache, ``go
install``), else the GIE EPP (``tools/_epp_local.resolve_epp``). An EPP named by a word (``llm-d``, ``gie``, or
none) that cannot be had is left out with one sentence and the rest runs; a binary given by path that is not
executable fails the run. Every EPP is asked for its pick over ext_proc exactly as Envoy asks
(``epp/extproc.ask_pick``: headers and body, the pick read from ``x-gateway-destination-endpoint``), and the
request is then sent to the picked engine. Each EPP runs in a network namespace whose only interface is loopback
(it listens on every interface and has no bind flag); ``--epp-listen-all`` runs it unconfined.

Workloads are named (``--workload``, ``WORKLOADS``; ``all`` runs every one) and parameterised: tenants (prompt
families) with a long shared prefix each, picked with a Zipf skew, each request a new question or a follow-up that
extends the tenant's conversation; a share of one-shot cold prompts; bursts of same-tenant requests sent
together; concurrent workers; a working set stated as a multiple of the engines' KV caches together (the prefix
length is fitted to it with the engines' tokenizer); a reset of every engine's prefix cache part way (vLLM's
``/reset_prefix_cache``, a development endpoint: the engines run with ``VLLM_SERVER_DEV_MODE=1``, on loopback);
two routers sharing the engines, requests alternating between them (two EPP processes; two stand-in approximate
histories, while the precise stand-ins read the same events). ``--repeats N`` runs each workload with N seeds,
and the report gives mean and spread (min to max) over them. Every configuration gets its own prompt families: the
same prompts (same tenants, sequence, follow-ups, token counts for one seed) behind a per-configuration tag of equal
token length in the first block ("r12345:"). Block hashes chain, so no block of one
configuration matches another's and what an earlier configuration left in the caches cannot help a later one
(it is evicted like any cold block); the engines are not restarted between configurations (a start takes 45 to
150 s per engine on the 2-core machine here). The script checks that the token counts agree.

Per configuration: the prefix-cache hit rate from the engines' own counters (deltas of
``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total`` on /metrics, in tokens), the cached
tokens per request (``usage.prompt_tokens_details.cached_tokens``), how often the chosen engine held the
longest cached prefix (refereed by the exact index, copies counted, read just before the request; the index's
prediction for the chosen engine is checked against what it then reports, in sequential workloads), time to first token measured by
streaming (p50/p90; requests ask for ``max_tokens`` tokens, 1 by default, so the whole request takes about
as long), requests failed; for a real EPP, the mean share of each prompt its own prefix index matched on the
engine it picked (``inference_extension_prefix_indexer_hit_ratio``, which the GIE EPP exports). Configurations run
one after the other, so load from other processes on the
machine affects their latencies unevenly.

With more than one workload or seed (or ``--report DIR``) the study is written to a folder
(``benchmarks/_study_report.py``): every run as JSON lines, the summary, ``report.md`` with a table per workload,
and plots of hit rate and TTFT per policy per workload with their spread (SVG).

``make bench-routing`` starts two engines through ``playbooks/kv_index.yml`` on 127.0.0.1:8400 and 127.0.0.2:8400
(events 5800/5802, replay 5801/5803), runs this with ``--require`` and stops them; ``make study-routing`` runs every
workload with three seeds into ``out/bench-routing/study``. Without engines (``make bench``) it prints that it
skipped and exits 0.

  .venv/bin/python benchmarks/bench_routing.py [--engine NAME=[HOST:]PORT,EVENTS_PORT,REPLAY_PORT ...] [--requests 80]
      [--workload bench|NAME,...|all] [--repeats 1] [--report DIR] [--policies precise,...] [--seed 0] [--json] [--require]
      [--tenants N] [--prefix-words N] [--zipf X] [--follow-up X]
      [--epp BINARY|llm-d|gie|gie=BINARY ... --epp-config NAME=PATH ... --gie-config NAME=PATH ... [--kv-port 5810]
       [--epp-listen-all]]
"""

from __future__ import absolute_import, division, print_function

import argparse
import collections
import concurrent.futures
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
from _loader import module_utils  # noqa: E402  pylint: disable=wrong-import-position

check = module_utils("kv.index_check")
approx_mod = module_utils("kv.index_approx")
kv_index = module_utils("kv.index")
workload_mod = module_utils("kv.workload")
http = module_utils("http.openai")
wiring = module_utils("common.wiring")
errors = module_utils("common.errors")
extproc = route_check = None   # epp.extproc and epp.route_check (grpcio, xds-protos), imported when an EPP is given
import _epp_local  # noqa: E402  pylint: disable=wrong-import-position
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _study_report as study_report  # noqa: E402  pylint: disable=wrong-import-position

POLICIES = ("precise", "precise-speculative", "approximate", "load-only", "random")
SPECULATIVE_TTL = 2.0   # seconds: the router role's router_speculative_ttl default (2s)
# One port on two addresses: an InferencePool (the GIE EPP) has one target port for all its pods.
DEFAULT_ENGINES = ("bench-a=8400,5800,5801", "bench-b=127.0.0.2:8400,5802,5803")
COUNTER_RE = re.compile(r"^(vllm:prefix_cache_(?:hits|queries)_total)(?:\{[^}]*\})?\s+(\S+)\s*$", re.M)


def words(rng, count):
    return " ".join("".join(rng.choice(workload_mod.SYLLABLES) for _i in range(rng.randint(1, 3))) for _j in range(count))


# Named workloads (--workload NAME, or "all"): what each sets over DEFAULTS. working_set: the prefixes' words are
# fitted so that the distinct full blocks of the prompts are that multiple of the engines' KV caches together.
DEFAULTS = {"tenants": 16, "prefix_words": 48, "zipf": 1.0, "follow_up": 0.3, "max_turns": 4, "cold": 0.0, "burst": 1,
            "workers": 1, "routers": 1, "reset_at": None, "restart_at": None, "working_set": None}
WORKLOADS = {
    "bench": {},
    "pressure": {"tenants": 12, "working_set": 1.9},
    "hot-cold": {"tenants": 2, "cold": 0.5},
    "bursts": {"burst": 4},
    "pressure-concurrent": {"tenants": 12, "working_set": 1.9, "workers": 4},
    "reset": {"tenants": 12, "working_set": 1.9, "reset_at": 0.5},
    "restart": {"tenants": 12, "working_set": 1.9, "restart_at": 0.5},
    "two-routers": {"tenants": 12, "working_set": 1.9, "routers": 2},
}
WORKLOAD_NOTES = {
    "bench": "16 tenants (Zipf 1.0), 48-word prefixes, 30% follow-ups, one request at a time",
    "pressure": "12 tenants (Zipf 1.0), prefixes fitted to a working set of 1.9x both KV caches, one at a time",
    "hot-cold": "2 hot tenants, half of the requests one-shot cold prompts of their own, one at a time",
    "bursts": "bursts of 4 concurrent requests of one tenant (new questions on its prefix), a burst at a time",
    "pressure-concurrent": "the pressure sequence from 4 concurrent workers",
    "reset": "the pressure sequence; every engine's prefix cache reset half way (vLLM sends AllBlocksCleared)",
    "restart": "the pressure sequence; the last engine stopped and started again half way (its cache starts empty)",
    "two-routers": "the pressure sequence, requests alternating between two routers sharing the engines",
}


def sequential(spec):
    """Whether a workload sends one request at a time (no concurrent workers, no bursts)."""
    return int(spec["workers"]) <= 1 and int(spec["burst"]) <= 1


def workload_spec(name, **overrides):
    spec = dict(DEFAULTS, **WORKLOADS[name]) if name in WORKLOADS else dict(DEFAULTS)
    spec.update(dict((k, v) for k, v in overrides.items() if v is not None))
    return spec


class Request:
    __slots__ = ("index", "tenant", "kind", "prompt", "group")

    def __init__(self, index, tenant, kind, prompt, group=None):
        self.index = index
        self.tenant = tenant
        self.kind = kind
        self.prompt = prompt
        self.group = group


def build_workload(tag, requests, spec, seed):
    """The requests of one configuration, from ``seed``; every prompt starts with ``tag``.

    Configurations get the same prompts after a tag of the same token length ("r12345:"): the tag is in every
    prompt's first block, and block hashes chain, so no block of one configuration matches another's, while token
    counts, tenants, follow-ups and lengths are the same for one seed.
    """
    rng = random.Random(seed)
    tenants = int(spec["tenants"])
    prefixes = ["%s tenant %d: %s" % (tag, t, words(rng, int(spec["prefix_words"]))) for t in range(tenants)]
    weights = [1.0 / (t + 1) ** float(spec["zipf"]) for t in range(tenants)]
    conversations = {}
    out = []
    group = 0
    while len(out) < requests:
        group += 1
        if spec["cold"] and rng.random() < float(spec["cold"]):
            prompt = "%s cold %d: %s\nQ: %s?" % (tag, group, words(rng, int(spec["prefix_words"])), words(rng, rng.randint(4, 14)))
            out.append(Request(len(out) + 1, "cold-%d" % group, "cold", prompt, group))
            continue
        tenant = rng.choices(range(tenants), weights)[0]
        for _i in range(max(1, int(spec["burst"]))):
            if len(out) >= requests:
                break
            idx = len(out)
            turns, convo = conversations.get(tenant, (0, ""))
            follow = spec["burst"] <= 1 and 0 < turns < int(spec["max_turns"]) and rng.random() < float(spec["follow_up"])
            question = "\nQ%d: %s?" % (idx, words(rng, rng.randint(4, 14)))
            turns, convo = (turns + 1, convo + question) if follow else (1, question)
            conversations[tenant] = (turns, convo)
            out.append(Request(idx + 1, tenant, "follow-up" if follow else "new", prefixes[tenant] + convo, group))
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
    """KVIndexCheck's subscriptions, index and tokenizer; each request goes to ONE engine chosen by a policy.

    ``configs``: ``[(label, policy, workload spec, requests)]``, run in order; ``run()`` returns one row each.
    """

    def __init__(self, params, configs, seed=0, epp=None, restart_command=None):
        super(RoutingBench, self).__init__(params)
        self.restart_command = restart_command
        self.configs = configs
        self.seed = seed
        self.epp = epp   # Lanes (the real EPPs) or None
        self.rows = []
        self.state = None
        self.token_counts = {}
        self.pool = None
        # KVIndexCheck's own, set again for pylint (it does not see the base class through tools/_loader.py)
        self.start = self.deadline = None
        self.engines, self.by_name = [], {}

    @property
    def policies(self):
        return [policy for _label, policy, _spec, _requests in self.configs]

    def run(self):
        """KVIndexCheck.run's steps, with the configurations in place of its workload; returns one row per configuration."""
        self.prepare()
        for engine in self.engines:   # the topic the engine publishes under: kv@<host>:<port>@<served model name>
            prefix, pod, model = wiring.split_topic(engine.topic)
            if not model:
                host, port = pod.rsplit(":", 1)
                engine.source.topic = wiring.kv_topic(host, port, self.model, prefix)
        if self.epp is not None:
            self.epp.check_configs(self.block_size)
        with self.listening(), concurrent.futures.ThreadPoolExecutor(8) as pool:
            if callable(self.configs):
                self.configs = self.configs(self)   # the plan needs the engines' tokenizer and cache sizes
            self.pool = pool
            self.settle()
            for label, policy, spec, requests in self.configs:
                if policy.startswith("epp:"):
                    with self.epp.router(policy[4:], count=int(spec["routers"])) as epps:
                        row = self.run_policy(policy, requests, spec)
                        row["epp_prefix_match"] = epp_prefix_match(epps)
                else:
                    row = self.run_policy(policy, requests, spec)
                row.update(label=label, workload=spec.get("name", "custom"), seed=spec.get("seed", self.seed))
                self.rows.append(row)
                sys.stderr.write("bench_routing: %d/%d %s: hit rate %s, %.0f s\n" % (
                    len(self.rows), len(self.configs), label, fmt(None if row["hit_rate"] is None else 100.0 * row["hit_rate"], "%.1f%%"),
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
        return dict((e.name, self.index.engines[e.name].removed_blocks if e.name in self.index.engines else 0) for e in self.engines)

    def distinct_blocks(self, requests):
        """Distinct full-block keys of the prompts (the working set), by the engines' own tokenizer."""
        keys = set()
        for step in requests:
            keys.update(self.index.prompt_keys(self.tokenize(self.engines[0], step.prompt)))
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
            self.consumer.poll(0.02)
            self.drain()
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
        """Stop and start ``engine`` with the restart command; wait until it answers again and its events settle."""
        if not self.restart_command:
            raise errors.CheckError("The restart workload needs --restart-command (make bench-routing passes one).")
        command = self.restart_command.replace("{engine}", engine.name)
        self.settle()
        self.state["counted"].append((self.state["before"], self.counters()))
        try:
            run = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=900, check=False)
        except subprocess.TimeoutExpired:
            raise errors.CheckError("Restarting %s took more than 900 s: %s" % (engine.name, command))
        if run.returncode != 0:
            tail = " ".join((run.stdout + run.stderr).split()[-40:])
            raise errors.CheckError("Restarting %s failed (exit %d): ...%s" % (engine.name, run.returncode, tail))
        deadline = self.clock() + 300
        while reachable(engine.spec):
            if self.clock() > deadline:
                raise errors.CheckError("%s did not answer within 300 s of its restart." % engine.name)
            time.sleep(1)
        self.state["restarts"] = self.state.get("restarts", 0) + 1
        self.settle()
        self.state["before"] = self.counters()

    def speculative_tokens(self, router, name, keys, prompt_tokens):
        now = self.clock()
        held = self.state["speculative"][router][name]
        count = 0
        for key in keys:
            if held.get(key, 0) <= now:
                break
            count += 1
        return kv_index.predicted_cached_tokens(count, prompt_tokens, self.block_size)

    def choose(self, policy, router, scores, body):
        """ONE engine by policy; stand-in ties: fewest requests sent so far in this configuration, then name."""
        sent = self.state["sent"]
        names = sorted(sent)
        if policy.startswith("epp:"):
            address = self.epp.current[router % len(self.epp.current)].address
            picked = extproc.ask_pick(address, json.dumps(body).encode("utf-8"), timeout=30.0)["picked"]
            for engine in self.engines:
                if route_check.url_address(engine.spec["url"]) == picked:
                    return engine.name
            raise errors.CheckError("The EPP picked %s, which is none of the engines (%s)." % (
                picked, ", ".join(e.spec["url"] for e in self.engines)))
        if policy == "random":
            return self.state["rng"].choice(names)
        return min(names, key=lambda n: (-scores.get(n, 0), sent[n], n))

    def route(self, step):
        """Decide where ``step`` goes (this thread reads the events); None when the router failed (counted)."""
        policy = self.state["policy"]
        router = (step.index - 1) % self.state["routers"]
        self.drain()   # apply whatever arrived: in sequence the previous step settled, concurrently it did not
        tokens = self.tokenize(self.engines[0], step.prompt)   # one model, one tokenizer on every engine
        keys = self.index.prompt_keys(tokens)
        self.state["keys"].update(keys)
        self.token_counts.setdefault((self.state["spec"].get("name"), self.state["spec"].get("seed"), policy), []).append(len(tokens))
        precise = dict((e.name, kv_index.predicted_cached_tokens(self.index.lookup(e.name, keys), len(tokens), self.block_size))
                       for e in self.engines)
        approx = self.state["approx"][router]
        hashes = approx_mod.block_hashes(step.prompt, approx.block_size, self.model) if policy == "approximate" else None
        if policy == "approximate":
            scores = approx.match(hashes)
        elif policy == "precise-speculative":
            scores = dict((n, max(v, self.speculative_tokens(router, n, keys, len(tokens)))) for n, v in precise.items())
        elif policy == "precise":
            scores = precise
        else:
            scores = {}
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
            expiry = self.clock() + SPECULATIVE_TTL
            for key in keys:   # what the EPP's speculative indexing adds at PreRequest, until the engine's events confirm it
                self.state["speculative"][router][name][key] = expiry
        return _Routed(step, name, len(tokens), precise, body, engine.source.activity)

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
            self.settle(wait_for=self.by_name[name] if expect_store else None, since=routed.since)

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


# The real EPPs the bench knows (tools/_epp_local.IMPLS) and how the report names them.
EPP_LABELS = {"llm-d": "llm-d EPP %s" % wiring.ROUTER_VERSION, "gie": "GIE EPP %s" % _epp_local.GIE_VERSION}
EPP_WORDS = {"llm-d": "the llm-d router's EPP %s" % wiring.ROUTER_VERSION,
             "gie": "the Gateway API Inference Extension's EPP %s" % _epp_local.GIE_VERSION}
# The GIE lane's side of Kubernetes: the kwok cluster of benchmarks/kwok_cluster.yml, its namespace and InferencePool.
KWOK_PLAYBOOK = os.path.join(ROOT, "benchmarks", "kwok_cluster.yml")
GIE_NAMESPACE, GIE_POOL = "bench-routing", "bench-routing-pool"
PREFIX_MATCH_RE = re.compile(r"^(?:inference_extension|llm_d_epp)_prefix_indexer_hit_ratio_(sum|count)(?:\{[^}]*\})?\s+(\S+)\s*$", re.M)


def prefix_match(metrics_texts):
    """The mean share of each prompt an EPP's own prefix index matched on the endpoint it picked, over the EPPs' metrics
    texts: the GIE EPP's inference_extension_prefix_indexer_hit_ratio histogram, observed at each pick
    (sigs.k8s.io/gateway-api-inference-extension@v1.4.0: pkg/epp/metrics/metrics.go RecordPrefixCacheMatch, called by
    the prefix-cache-scorer's PreRequest); None where none exports it."""
    total = {"sum": 0.0, "count": 0.0}
    for text in metrics_texts:
        for kind, value in PREFIX_MATCH_RE.findall(text or ""):
            total[kind] += float(value)
    return round(total["sum"] / total["count"], 4) if total["count"] else None


def epp_prefix_match(epps):
    """``prefix_match`` of the running ``epps`` (their metrics read now)."""
    texts = []
    for epp in epps:
        try:
            texts.append(http.OpenAIClient(epp.metrics_url.rsplit("/metrics", 1)[0], timeout=5).get_text("/metrics"))
        except http.OpenAIHTTPError:
            continue
    return prefix_match(texts)


class EPPLane:
    """The real llm-d EPP for its ``epp:NAME`` policies: one KV relay per engine, a fresh EPP per configuration."""

    impl = "llm-d"

    def __init__(self, binary, configs, specs, kv_port, folder, confine=True):
        self.binary = binary
        self.configs = configs
        self.specs = specs
        self.kv_port = kv_port
        self.folder = folder
        self.confine = confine
        self.relays = []
        self.current = None

    def label(self, _name=None):
        return EPP_LABELS[self.impl]

    def describe(self):
        return "%s: %s (%s), with file discovery over the engines and a KV relay per engine" % (
            ", ".join("epp:%s" % n for n in sorted(self.configs)), EPP_WORDS[self.impl], self.binary)

    def open(self):
        """Bind the relays (each engine connects to its own endpoint); the bench then subscribes to their public side."""
        for spec in self.specs:
            public = "tcp://%s:%d" % (spec["host"], self.kv_port)
            self.relays.append(_epp_local.Relay(spec["endpoint"], public))
            spec["endpoint"], spec["socket_mode"] = public, "connect"
        return self

    def close(self):
        for relay in self.relays:
            relay.stop()
        self.relays = []

    @staticmethod
    def _precise(config):
        return [p.get("parameters") or {} for p in config.get("plugins") or [] if p.get("type") == "precise-prefix-cache-producer"]

    def check_configs(self, block_size):
        """The configs' precise producers hash blocks of the engines' size and dial the relays' port."""
        for name, config in sorted(self.configs.items()):
            for params in self._precise(config):
                size = (params.get("tokenProcessorConfig") or {}).get("blockSizeTokens")
                port = ((params.get("kvEventsConfig") or {}).get("podDiscoveryConfig") or {}).get("socketPort")
                if size != block_size:
                    raise errors.CheckError("EPP config %s hashes blocks of %s tokens but the engines' blocks hold %d: render it "
                                            "with the engines' block size." % (name, size, block_size))
                if port != self.kv_port:
                    raise errors.CheckError("EPP config %s dials KV events on port %s but the relays publish on %d: render it with "
                                            "kv_events_port %d, or pass --kv-port %s." % (name, port, self.kv_port, self.kv_port, port))

    def _new(self, name, i):
        return _epp_local.EPP(self.binary, self.configs[name], [(s["name"], s["host"], s["port"]) for s in self.specs], self.folder,
                              name="epp-%s-%d" % (re.sub(r"[^\w.-]", "-", name), i), confine=self.confine)

    def _ready(self, epp, name, before):
        """Once the EPP subscribes to every relay when it reads events."""
        if any((p.get("kvEventsConfig") or {}).get("discoverPods") for p in self._precise(self.configs[name])):
            _epp_local.wait_subscribed(self.relays, [n + 1 for n in before])

    @contextlib.contextmanager
    def router(self, name, count=1):
        """``count`` fresh EPPs with config ``name`` (an index each), each ready to route."""
        epps = []
        try:
            for i in range(count):
                before = [len(r.subscriptions) for r in self.relays]
                epp = self._new(name, i)
                epps.append(epp)
                epp.start()
                self._ready(epp, name, before)
        except _epp_local.EPPError as exc:
            for epp in epps:
                epp.stop()
            raise errors.CheckError(str(exc).replace("ask for an unconfined EPP", "pass --epp-listen-all for an unconfined EPP"))
        self.current = epps
        try:
            yield epps
        finally:
            self.current = None
            for epp in epps:
                epp.stop()


def one_port(specs):
    """The engines' common port: an InferencePool has one target port for all its pods, told apart by address."""
    ports = sorted(set(int(s["port"]) for s in specs))
    hosts = [s["host"] for s in specs]
    if len(ports) != 1 or len(set(hosts)) != len(hosts):
        raise errors.CheckError(
            "The GIE EPP reaches its engines through one InferencePool, which has one target port for all its pods, but the "
            "engines are %s: run them on one port, each on its own 127.x address (--engine NAME=127.0.0.2:PORT,...)." % ", ".join(
                "%s on %s:%s" % (s["name"], s["host"], s["port"]) for s in specs))
    return ports[0]


class KwokCluster:
    """The kwok cluster of benchmarks/kwok_cluster.yml: started by ``start()`` (its kubeconfig returned), removed by ``stop()``.

    The playbook's output goes to stderr (a first start builds kube-apiserver and the rest from the Go module proxy, with a
    progress line every 10 s); a failure becomes one sentence with the playbook's last message."""

    def __init__(self, folder, playbook=KWOK_PLAYBOOK, extra=()):
        self.folder = folder
        self.playbook = playbook
        self.extra = list(extra)
        self.info = None
        self.started = False

    def _run(self, state):
        binary = os.path.join(ROOT, ".venv", "bin", "ansible-playbook")
        info = os.path.join(self.folder, "kwok-info.json")
        cmd = [binary if os.path.exists(binary) else "ansible-playbook", self.playbook, "-e", "kwok_cluster_state=%s" % state,
               "-e", "bench_kwok_info=%s" % info] + self.extra
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
        log = os.path.join(self.folder, "kwok-%s.log" % state)
        with open(log, "w", encoding="utf-8") as out:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # pylint: disable=consider-using-with
            for line in proc.stdout:
                out.write(line)
                sys.stderr.write(line)
            proc.wait()
        if proc.returncode != 0:
            with open(log, encoding="utf-8") as handle:
                said = [line.strip() for line in handle if '"msg":' in line or line.strip().startswith("msg:")]
            raise errors.CheckError("The kwok cluster of %s did not reach state %s (%s); its output is in %s." % (
                os.path.relpath(self.playbook, ROOT), state, (said[-1].split(":", 1)[1].strip(' "') if said else "exit %d" % proc.returncode)[:300], log))
        if state == "present":
            with open(info, encoding="utf-8") as handle:
                self.info = json.load(handle)
        return self.info

    def start(self):
        self.started = True
        return self._run("present")["kubeconfig"]

    def stop(self):
        if self.started:
            self.started = False
            self._run("absent")


class GIELane(EPPLane):
    """The Gateway API Inference Extension's EPP for its ``epp:NAME`` policies: a kwok cluster, an InferencePool over one
    simulated pod per engine (each pod's IP its engine's address), a fresh EPP per configuration reconciling that pool."""

    impl = "gie"

    def __init__(self, binary, configs, specs, folder, confine=True, cluster=None):
        super(GIELane, self).__init__(binary, configs, specs, None, folder, confine=confine)
        self.cluster = cluster if cluster is not None else KwokCluster(folder)
        self.port = one_port(specs)
        self.pool = None
        self.kubeconfig = None

    def describe(self):
        return ("%s: %s (%s), discovering the engines through InferencePool %s/%s of kwok cluster %s (a simulated pod per "
                "engine, its IP the engine's address)" % (
                    ", ".join("epp:%s" % n for n in sorted(self.configs)), EPP_WORDS[self.impl], self.binary, GIE_NAMESPACE, GIE_POOL,
                    (self.cluster.info or {}).get("name", "?")))

    def open(self):
        """The kwok cluster, the InferencePool CRDs, the namespace, the pool and its pods (until they run with the engines' IPs)."""
        self.kubeconfig = self.cluster.start()
        try:
            self.pool = _epp_local.GIEPool(self.kubeconfig, GIE_NAMESPACE, GIE_POOL, [(s["name"], s["host"]) for s in self.specs], self.port)
            self.pool.apply(crds=_epp_local.gie_crds())
        except Exception as exc:  # pylint: disable=broad-except
            raise errors.CheckError("The GIE EPP's InferencePool could not be set up in the kwok cluster: %s" % (
                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__))
        return self

    def close(self):
        """The pool (its namespace), then the cluster; each tried even when the other fails."""
        problems = []
        if self.pool is not None:
            try:
                self.pool.delete()
            except Exception as exc:  # pylint: disable=broad-except
                problems.append("the pool: %s" % exc)
            self.pool = None
        try:
            self.cluster.stop()
        except errors.CheckError as exc:
            problems.append(exc.msg)
        if problems:
            raise errors.CheckError("Stopping the GIE lane failed: %s" % "; ".join(problems))

    def check_configs(self, block_size):
        """A block size in a config's prefix-cache-scorer is the engines' (the EPP falls back to it without their metrics)."""
        for name, config in sorted(self.configs.items()):
            for plugin in config.get("plugins") or []:
                size = (plugin.get("parameters") or {}).get("blockSizeTokens") if plugin.get("type") == "prefix-cache-scorer" else None
                if size is not None and int(size) != block_size:
                    raise errors.CheckError("GIE config %s hashes blocks of %s tokens but the engines' blocks hold %d: render it with "
                                            "the engines' block size." % (name, size, block_size))

    def _new(self, name, i):
        return _epp_local.EPP(self.binary, self.configs[name], [(s["name"], s["host"], s["port"]) for s in self.specs], self.folder,
                              name="epp-%s-%d" % (re.sub(r"[^\w.-]", "-", name), i), confine=self.confine, impl="gie",
                              pool=GIE_POOL, kubeconfig=self.kubeconfig, namespace=GIE_NAMESPACE)

    def _ready(self, epp, name, before):
        """Once its metrics count every engine's pod ready in the pool: it reconciled the InferencePool."""
        epp.wait_ready_pods(len(self.specs), GIE_POOL)


class Lanes:
    """Every real EPP of the run, by configuration name; ``current`` the EPPs of the configuration that runs."""

    def __init__(self, lanes):
        self.lanes = list(lanes)
        self.by_name = {}
        for lane in self.lanes:
            for name in lane.configs:
                self.by_name[name] = lane
        self.current = None

    def label(self, name):
        return self.by_name[name].label(name)

    def check_configs(self, block_size):
        for lane in self.lanes:
            lane.check_configs(block_size)

    def open(self):
        for lane in self.lanes:
            lane.open()
        return self

    def close(self):
        """Every lane, each tried; the first failure raised after all."""
        problems = []
        for lane in self.lanes:
            try:
                lane.close()
            except errors.CheckError as exc:
                problems.append(exc)
        if problems:
            raise problems[0]

    @contextlib.contextmanager
    def router(self, name, count=1):
        with self.by_name[name].router(name, count=count) as epps:
            self.current = epps
            try:
                yield epps
            finally:
                self.current = None


def parse_engine(text):
    match = re.match(r"^([\w.-]+)=(?:([\d.]+):)?(\d+),(\d+),(\d+)$", text)
    if not match:
        raise argparse.ArgumentTypeError("--engine wants NAME=[HOST:]PORT,EVENTS_PORT,REPLAY_PORT, got %r" % text)
    name, host, port, events, replay = match.groups()
    host = host or "127.0.0.1"
    return {"name": name, "url": "http://%s:%s" % (host, port), "endpoint": "tcp://127.0.0.1:%s" % events, "host": host,
            "port": int(port), "socket_mode": "bind", "replay_endpoint": "tcp://127.0.0.1:%s" % replay,
            "topic": wiring.kv_topic(host, port, "")}


def config_parser(option):
    """The argparse type of ``option`` (--epp-config, --gie-config): NAME=PATH, the file an EndpointPickerConfig mapping."""
    def parse(text):
        name, sep, path = text.partition("=")
        if not sep or not re.match(r"^[\w.-]+$", name):
            raise argparse.ArgumentTypeError("%s wants NAME=PATH, got %r" % (option, text))
        try:
            with open(path, encoding="utf-8") as handle:
                config = yaml.safe_load(handle)
        except (OSError, yaml.YAMLError) as exc:
            raise argparse.ArgumentTypeError("%s %s: cannot read %s (%s)" % (option, name, path, exc))
        if not isinstance(config, dict):
            raise argparse.ArgumentTypeError("%s %s: %s holds no EndpointPickerConfig mapping" % (option, name, path))
        return name, config
    return parse


parse_epp_config = config_parser("--epp-config")
parse_gie_config = config_parser("--gie-config")


def parse_epp(text):
    """``--epp``: ``(impl, path or None)``: a word (llm-d, gie) for that EPP from its usual place, IMPL=PATH for a binary of
    that EPP, or a path, the llm-d EPP's binary."""
    impl, sep, path = text.partition("=")
    if text in _epp_local.IMPLS:
        return text, None
    if sep and impl in _epp_local.IMPLS and path:
        return impl, path
    if not text or (sep and re.match(r"^[\w-]+$", impl)):
        raise argparse.ArgumentTypeError("--epp wants a binary's path, %s, or IMPL=PATH with IMPL %s; got %r" % (
            " or ".join(_epp_local.IMPLS), " or ".join(_epp_local.IMPLS), text))
    return "llm-d", text


def asked_epps(given, env=None):
    """``[(impl or None, path or None)]``: the EPPs asked for (``--epp`` values parsed), else ``SUBSTRATE_EPP_BINARY`` (of
    ``SUBSTRATE_EPP_IMPL``, llm-d by default), else ``[(None, None)]``: llm-d's where it can be had, else the GIE EPP."""
    env = os.environ if env is None else env
    if given:
        impls = [impl for impl, _path in given]
        twice = sorted(set(i for i in impls if impls.count(i) > 1))
        if twice:
            raise argparse.ArgumentTypeError("--epp names the %s EPP more than once; give each EPP once" % ", ".join(twice))
        return list(given)
    if env.get("SUBSTRATE_EPP_BINARY"):
        return [(env.get("SUBSTRATE_EPP_IMPL") or "llm-d", env["SUBSTRATE_EPP_BINARY"])]
    return [(None, None)]


def _resolve_any_epp():
    """The EPP resolve_epp picks when no implementation is named, as ((impl, path), why)."""
    path, impl, why = _epp_local.resolve_epp(None, None)
    return (impl, path), why


def _default_resolvers():
    return {"llm-d": lambda: _epp_local.resolve_binary(given=None),
            "gie": _epp_local.resolve_gie,
            None: _resolve_any_epp}


def resolve_epps(asked, resolvers=None):
    """``({impl: binary}, [sentence per EPP left out], failure sentence or None)``.

    A binary given by path must be executable (else the run fails with one sentence); an EPP asked for by a word, or none
    asked for (llm-d's where it can be had, else the GIE EPP), that cannot be had is left out with one sentence."""
    resolvers = resolvers or _default_resolvers()
    found, left_out = {}, []
    for impl, path in asked:
        if path is not None:
            if os.path.isfile(path) and os.access(path, os.X_OK):
                found[impl] = path
                continue
            return {}, [], "%s is no executable file; give the path of %s binary." % (path, EPP_WORDS[impl])
        if impl is None:
            (got_impl, got), why = resolvers[None]()
            if got:
                found[got_impl] = got
            else:
                left_out.append("the real EPP is left out: %s" % why)
            continue
        got, why = resolvers[impl]()
        if got:
            found[impl] = got
        else:
            left_out.append("%s is left out: %s" % (EPP_WORDS[impl], why))
    return found, left_out, None


def epp_policies(configs_by_impl):
    """``{"epp:NAME": impl}`` over every EPP's configurations; a name given to two EPPs is refused."""
    out = {}
    for impl in sorted(configs_by_impl):
        for name, _config in configs_by_impl[impl]:
            policy = "epp:%s" % name
            if policy in out and out[policy] != impl:
                raise argparse.ArgumentTypeError("configuration %s is given for both the %s and the %s EPP; give each its own name" % (
                    name, out[policy], impl))
            out[policy] = impl
    return out


def select_configs(configs_by_impl, found, policies):
    """The configurations that run: ``{impl: {name: config}}`` of the EPPs found, those whose policy ``epp:NAME`` is in
    ``policies``; an EPP with none is not there."""
    out = {}
    for impl in sorted(found):
        mine = dict((name, config) for name, config in configs_by_impl.get(impl) or [] if "epp:%s" % name in policies)
        if mine:
            out[impl] = mine
    return out


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
        "| Policy | Router | Seed | Hit rate (engine counters) | Cached tokens / request | Chose the longest cached prefix | "
        "TTFT p50 / p90 (ms) | Failed | Requests per engine | Evicted blocks |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append("| %s | %s | %s | %s (%d/%d tokens) | %s of %s | %d/%d (%d/%d with a cached prefix somewhere) | %s / %s | %d/%d | %s | %s |" % (
            r["policy"], r.get("router", "-"), r.get("seed"), fmt(None if r["hit_rate"] is None else 100.0 * r["hit_rate"], "%.1f%%"), r["counter_hits"],
            r["counter_queries"], fmt(r["cached_per_request"]), fmt(r["prompt_tokens_per_request"]), r["held_longest"],
            r["requests"] - r["failed"], r["held_longest_of_those"], r["steps_with_a_cached_prefix"], fmt(r["ttft_ms_p50"]),
            fmt(r["ttft_ms_p90"]), r["failed"], r["requests"],
            " ".join("%s %d" % kv for kv in sorted(r["requests_per_engine"].items())),
            " ".join("%s %d" % kv for kv in sorted(r["evicted_blocks_per_engine"].items()))))
    return lines


CONFIG_OPTIONS = {"llm-d": "--epp-config", "gie": "--gie-config"}


def epp_lanes(args, engines, policies, resolvers=None):
    """The real EPPs' lanes for ``policies`` (a Lanes, or None), the sentences of the EPPs left out, and a failure sentence."""
    configs_by_impl = {"llm-d": args.epp_config, "gie": args.gie_config}
    by_policy = epp_policies(configs_by_impl)
    wanted = set(by_policy[p] for p in policies if p in by_policy)
    asked = asked_epps(args.epp)
    left_out = ["%s is left out: no configuration of it is given (%s NAME=PATH)" % (EPP_WORDS[impl], CONFIG_OPTIONS[impl])
                for impl, _path in asked if impl is not None and not configs_by_impl.get(impl)]
    if asked == [(None, None)] and len(wanted) == 1:
        asked = [(list(wanted)[0], None)]   # none asked for, the policies name one EPP: that one
    asked = [(impl, path) for impl, path in asked if impl is None or impl in wanted]
    if not asked:
        return None, left_out, None
    found, more, failed = resolve_epps(asked, resolvers)
    if failed:
        return None, [], failed
    configs = select_configs(configs_by_impl, found, policies)
    if not configs:
        return None, left_out + more, None
    global extproc, route_check  # pylint: disable=global-statement
    extproc, route_check = module_utils("epp.extproc"), module_utils("epp.route_check")
    folder = tempfile.mkdtemp(prefix="bench-routing-epp-")
    lanes = []
    try:
        for impl in sorted(configs):
            if impl == "gie":
                lanes.append(GIELane(found[impl], configs[impl], engines, folder, confine=not args.epp_listen_all))
            else:
                lanes.append(EPPLane(found[impl], configs[impl], engines, args.kv_port, folder, confine=not args.epp_listen_all))
    except errors.CheckError as exc:
        return None, left_out + more, exc.msg
    return Lanes(lanes), left_out + more, None


def fit_prefix_words(bench, spec, requests, seed):
    """Prefix words for which the prompts' distinct full blocks are ``working_set`` times the engines' caches together."""
    target = float(spec["working_set"]) * bench.cache_blocks()
    low, high = 24, 144
    counts = [bench.distinct_blocks(build_workload("r00000:", requests, dict(spec, prefix_words=w), seed)) for w in (low, high)]
    slope = (counts[1] - counts[0]) / float(high - low)
    words_ = int(round(low + (target - counts[0]) / slope)) if slope > 0 else low
    return max(8, min(400, words_))


def draw_tag(rng, tokens_of, want=None, attempts=500):
    """``(tag, its token count)``: a tag "r12345:" whose tokens, followed by " tenant", number ``want`` (any for None).

    Every configuration's prompts start with their own tag; with tags of one token count the prompts of one workload and
    seed have the same token counts whatever the engines' tokenizer makes of the digits (drawn freely, the tags of one run here differed by a token)."""
    for _attempt in range(attempts):
        tag = "r%05d:" % rng.randrange(10000, 100000)
        count = tokens_of(tag + " tenant")
        if want is None or count == want:
            return tag, count
    raise errors.CheckError("No tag r10000: to r99999: of %s tokens came up in %d draws; the engines' tokenizer splits them "
                            "unlike any seen before." % (want, attempts))


def plan(args, names, policies, seeds):
    """A callable for RoutingBench: the configurations, built once the engines' tokenizer and cache sizes are known."""
    overrides = {"tenants": args.tenants, "prefix_words": args.prefix_words, "zipf": args.zipf, "follow_up": args.follow_up}

    def build(bench):
        configs = []
        tags = random.SystemRandom()
        want = None
        for seed in seeds:
            for name in names:
                spec = workload_spec(name, **overrides)
                if spec["working_set"] and args.prefix_words is None:
                    spec["prefix_words"] = fit_prefix_words(bench, spec, args.requests, seed)
                spec.update(name=name, seed=seed)
                for policy in policies:
                    tag, want = draw_tag(tags, lambda text: len(bench.tokenize(bench.engines[0], text)), want)
                    configs.append(("%s %s seed %d" % (name, policy, seed), policy, spec, build_workload(tag, args.requests, spec, seed)))
        return configs
    return build


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", action="append", type=parse_engine, help="NAME=[HOST:]PORT,EVENTS_PORT,REPLAY_PORT (repeat; "
                        "default: %s)" % " ".join(DEFAULT_ENGINES))
    parser.add_argument("--policies", help="comma-separated, of %s and epp:NAME for each --epp-config (default: all)" % ", ".join(POLICIES))
    parser.add_argument("--workload", default="bench", help="comma-separated names of %s, or all (default: bench)" % ", ".join(WORKLOADS))
    parser.add_argument("--repeats", type=int, default=1, help="seeds per workload, from --seed on (mean and spread over them)")
    parser.add_argument("--report", metavar="DIR", help="write the study (runs, summary, report.md, plots) into DIR; the default "
                        "with more than one workload or seed: out/bench-routing/study")
    parser.add_argument("--epp", metavar="BINARY|IMPL|IMPL=BINARY", action="append", type=parse_epp, default=[],
                        help="a real EPP (repeat, one per EPP): the llm-d EPP's binary; llm-d (SUBSTRATE_EPP_BINARY, the cache "
                        "of `go install` of the pinned version, `go install`); gie (the Gateway API Inference Extension's EPP "
                        "of `make gie-epp`, built when missing); or gie=BINARY, llm-d=BINARY. Default: SUBSTRATE_EPP_BINARY, "
                        "else llm-d's where it can be had, else the GIE EPP")
    parser.add_argument("--epp-config", metavar="NAME=PATH", action="append", type=parse_epp_config, default=[],
                        help="an EndpointPickerConfig of the llm-d EPP for policy epp:NAME (repeat); its endpoints come from "
                        "file discovery")
    parser.add_argument("--gie-config", metavar="NAME=PATH", action="append", type=parse_gie_config, default=[],
                        help="an EndpointPickerConfig of the GIE EPP for policy epp:NAME (repeat); its endpoints come from an "
                        "InferencePool in a kwok cluster (benchmarks/kwok_cluster.yml), which needs every engine on one port")
    parser.add_argument("--restart-command", metavar="CMD", help="a shell command that stops and starts the engine named by "
                        "{engine} (the restart workload; make bench-routing passes its playbook)")
    parser.add_argument("--kv-port", type=int, default=5810, help="the relays' KV-event port on each engine address (the "
                        "configs' podDiscoveryConfig.socketPort)")
    parser.add_argument("--epp-listen-all", action="store_true", help="run the EPP unconfined: its ext_proc, health and "
                        "metrics ports then listen on every interface of this machine")
    parser.add_argument("--requests", type=int, default=80, help="requests per configuration")
    parser.add_argument("--tenants", type=int, help="prompt families (default: the workload's; bench: 16)")
    parser.add_argument("--prefix-words", type=int, help="words of each tenant's shared prefix (default: the workload's; bench: 48)")
    parser.add_argument("--zipf", type=float, help="skew of the tenants' popularity (default: the workload's; 1.0)")
    parser.add_argument("--follow-up", type=float, help="chance that a request extends the tenant's conversation (default: 0.3)")
    parser.add_argument("--max-tokens", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0, help="the first workload seed (tenants, sequence and text)")
    parser.add_argument("--settle", type=float, default=0.3, help="seconds without KV events before the index counts as current")
    parser.add_argument("--timeout", type=float, default=14400.0)
    parser.add_argument("--records", metavar="PATH", help="write every request (policy, engine, tokens, cached, predicted, "
                        "TTFT) to PATH as JSON lines")
    parser.add_argument("--json", action="store_true", help="one JSON object per configuration instead of a table")
    parser.add_argument("--require", action="store_true", help="fail (instead of skipping) when an engine is unreachable")
    args = parser.parse_args()
    engines = args.engine or [parse_engine(e) for e in DEFAULT_ENGINES]
    try:
        asked_epps(args.epp)
        epp_names = list(epp_policies({"llm-d": args.epp_config, "gie": args.gie_config}))
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    policies = [p.strip() for p in args.policies.split(",") if p.strip()] if args.policies else list(POLICIES) + epp_names
    unknown = [p for p in policies if p not in POLICIES and p not in epp_names]
    if unknown:
        parser.error("unknown policies %s: the policies are %s" % (", ".join(unknown), ", ".join(list(POLICIES) + epp_names)))
    names = list(WORKLOADS) if args.workload == "all" else [w.strip() for w in args.workload.split(",") if w.strip()]
    if [w for w in names if w not in WORKLOADS] or not names:
        parser.error("unknown workload in %r: the workloads are %s, or all" % (args.workload, ", ".join(WORKLOADS)))
    if "restart" in names and not args.restart_command:
        if args.workload != "all":
            parser.error("the restart workload needs --restart-command (make bench-routing passes one)")
        print("bench_routing: the restart workload is left out: no --restart-command")
        names.remove("restart")
    if len(engines) < 2 or args.repeats < 1 or args.requests < 1:
        parser.error("at least two engines, one repeat and one request")
    for spec in engines:
        problem = reachable(spec)
        if problem:
            print("bench_routing: %s: engine %s is not reachable (%s); `make bench-routing` starts two" % (
                "failed" if args.require else "skipped", spec["name"], problem))
            return 1 if args.require else 0
    lane, left_out, failed = epp_lanes(args, engines, policies) if any(p.startswith("epp:") for p in policies) else (None, [], None)
    if failed:
        print("bench_routing: failed: %s" % failed)
        return 1
    for why in left_out:
        print("bench_routing: %s" % why)
    policies = [p for p in policies if not p.startswith("epp:") or (lane is not None and p[4:] in lane.by_name)]
    seeds = list(range(args.seed, args.seed + args.repeats))
    params = {"engines": engines, "workload": {}, "expect": {}, "max_tokens": args.max_tokens, "settle": args.settle,
              "event_wait": 5.0, "timeout": args.timeout, "request_timeout": 120.0}
    bench = RoutingBench(params, plan(args, names, policies, seeds), epp=lane, restart_command=args.restart_command)
    started = time.time()
    # SIGTERM as SIGINT: the finally below stops the EPPs, the pool and the kwok cluster.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rc = 0
    try:
        if lane is not None:
            lane.open()
        rows = bench.run()
    except (errors.CheckError, _epp_local.EPPError, OSError) as exc:
        print("bench_routing: %s" % (getattr(exc, "msg", None) or exc))
        rc = 1
    finally:
        if lane is not None:
            try:
                lane.close()
            except errors.CheckError as exc:
                print("bench_routing: %s" % exc.msg)
                rc = 1
    if rc == 0:
        report(args, bench, rows, engines, started, lane, left_out)
    return rc


def report(args, bench, rows, engines, started, lane, left_out):
    if args.records:
        with open(args.records, "w", encoding="utf-8") as out:
            for row in rows:
                for rec in row["records"]:
                    out.write(json.dumps(dict(rec, policy=row["policy"], workload=row["workload"], seed=row["seed"]), sort_keys=True) + "\n")
    for row in rows:
        del row["records"]
    if args.json:
        for row in rows:
            print(json.dumps(row, sort_keys=True))
        return
    head = ("Routing over %d real vLLM engines (%s; %s blocks of %d tokens each), model %s; %d requests per configuration, "
            "max_tokens %d, seeds %s, %s" % (
                len(engines), ", ".join(e.name for e in bench.engines), "/".join(str(e.num_gpu_blocks) for e in bench.engines),
                bench.block_size, bench.model, args.requests, args.max_tokens, ", ".join(str(s) for s in sorted(set(r["seed"] for r in rows))),
                time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started))))
    routers = ("Routers: %s: the collection's stand-in, with its KV-event index (precise; with speculative entries for %.0f s "
               "after each pick) and its model of llm-d's approx-prefix-cache-producer (approximate); ties: fewest requests so far, "
               "then name." % (", ".join(p for p in POLICIES if p in bench.policies), SPECULATIVE_TTL))
    if lane is not None:
        routers += " Real EPPs, a fresh one per configuration, %s; the referee is the same index. %s." % (
            "each confined to a loopback-only network namespace" if lane.lanes[0].confine else "unconfined (listening on every interface)",
            ". ".join(one.describe() for one in lane.lanes))
    for why in left_out:
        routers += " %s%s" % (why[:1].upper(), why[1:])
    print(head)
    print(routers)
    for name in sorted(set(r["workload"] for r in rows), key=[r["workload"] for r in rows].index):
        mine = [r for r in rows if r["workload"] == name]
        print("\n%s: %s; %d distinct full blocks, %sx the caches together" % (
            name, WORKLOAD_NOTES.get(name, "custom"), mine[0]["distinct_blocks"], fmt(mine[0]["working_set"])))
        for line in table(mine):
            print(line)
    for r in rows:
        extra = ("; failures: " + "; ".join(r["failures"])) if r["failures"] else ""
        own = ("; the EPP's own prefix index matched %.1f%% of each prompt on its pick (mean)" % (100.0 * r["epp_prefix_match"])
               if r.get("epp_prefix_match") is not None else "")
        print("%s: %d follow-ups, index exact on the chosen engine %d/%d, latency p50/p90 %s/%s ms, %.1f s%s%s" % (
            r["label"], r["follow_ups"], r["index_exact"], r["requests"] - r["failed"], fmt(r["latency_ms_p50"]),
            fmt(r["latency_ms_p90"]), r["elapsed_s"], own, extra))
        if r["sequential"] and not r["resets"] and not r["restarts"] and r["index_exact"] < r["requests"] - r["failed"]:
            print("WARNING: %s: the index predicted the chosen engine's cached tokens on only %d of %d requests: the referee "
                  "(and the precise policy) missed KV events; see the engines' topics and event ports" % (
                      r["label"], r["index_exact"], r["requests"] - r["failed"]))
    same = all(len(set(tuple(c) for k, c in bench.token_counts.items() if k[:2] == group)) == 1
               for group in set(k[:2] for k in bench.token_counts))
    print("Hit rate: vllm:prefix_cache_hits_total / queries_total deltas summed over the engines (tokens). Chose the longest "
          "cached prefix: the chosen engine's cached tokens, per the exact index just before the request was routed, were the "
          "most of any engine. TTFT: streamed, to the first token; with max_tokens 1 the request ends right after it. Each "
          "configuration sends its workload's prompts behind its own tag in the first block (token counts per workload and "
          "seed %s), so none finds another's blocks; the engines were not restarted between configurations." % (
              "identical" if same else "NOT identical"))
    folder = args.report or (os.path.join("out", "bench-routing", "study") if len(set((r["workload"], r["seed"]) for r in rows)) > 1 else None)
    if folder:
        notes = [head, routers] + ["%s: %s" % (n, WORKLOAD_NOTES[n]) for n in WORKLOAD_NOTES if n in set(r["workload"] for r in rows)]
        written = study_report.write(folder, rows, "Routing study", notes=notes)
        print("Report: %s" % ", ".join(sorted(written.values())))


if __name__ == "__main__":
    sys.exit(main())
