# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""The check behind ``inference_cache.substrate.kv_index_check`` (pure Python, no Ansible).

Subscribes to the KV-event streams of several engines at once, keeps a ``KVBlockIndex`` from them, sends a
generated workload of prompt families, and before every request records what the index predicts each engine
has cached; then compares with the ``usage.prompt_tokens_details.cached_tokens`` the engine reports. Beside it
runs the same index with llm-d's uncounted eviction and the router's approximate predictor.

``KVIndexCheck(params).run()`` returns the facts or raises ``CheckError(msg, facts)``; its options are checked
against the option table ``OPTIONS`` first. The index is a ``kv/live_index.LiveIndex`` the check holds (``live``):
the engines' streams, the replayed history, gap repair and restart detection are its; the engines' HTTP side (model,
block size, tokenizer, completions) is ``kv/engines.py``'s. Token ids stay in this process: they are used for keys and
lookups and then dropped; facts carry counts only. An engine that restarted in place is named in
``restarted_engines``, with the one sentence ``restart_warning``: the llm-d EPP v0.9.0's KV-block index keeps such an
engine's old blocks.

A caller that drives the workload itself (``benchmarks/bench_checks_load.py``) calls ``prepare()``, then ``run_step(step,
among)`` inside ``live.listening()``; it reads the check's ``results`` and the streams' bookkeeping, and subclasses nothing.

After each request the check waits for a condition, not a quiet period: the engine's events show the prompt's full
blocks held (bounded by ``event_wait``; then a replay of what follows the last applied batch, where the engine has a
replay endpoint). The quiet period (``settle``) before each prediction is kept for events nobody asked for.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import time

from ..common.errors import CheckError
from ..common.options import validate
from ..http.openai import OpenAIClient
from .args import ENGINE_ARG_SPEC
from .consumer import MAX_FRAME
from .engines import Engine, align, complete, discover, engines_problem, make_client, named, require_cached_tokens, tokenize
from .index_approx import ApproxPrefixPredictor, block_hashes, effective_block_size
from .index import predicted_cached_tokens
from .live_index import LiveIndex, OutOfTime, restart_warning
from .workload import WORKLOAD_OPTION, build as build_workload

# An engine of this check: the shared engine options (kv/args.py, documented by the _engines doc fragment; its
# KV_INDEX variant documents this table) and a fault injection.
ENGINE_SPEC = dict(ENGINE_ARG_SPEC, withhold_after={"type": "int", "range": (0, None)})
EXPECT_SPEC = {
    "min_requests": {"type": "int", "default": 50},
    "min_evictions_per_engine": {"type": "int", "default": 0},
}
# The check's one option table (argument spec and validation).
OPTIONS = {
    "engines": {"type": "list", "elements": "dict", "required": True, "options": ENGINE_SPEC, "check": engines_problem},
    "model": {"type": "str"},
    "workload": WORKLOAD_OPTION,
    "expect": {"type": "dict", "default": {}, "options": EXPECT_SPEC},
    "max_tokens": {"type": "int", "default": 1, "no_log": False, "range": (1, None)},
    "settle": {"type": "float", "default": 0.3},
    "event_wait": {"type": "float", "default": 5.0},
    "timeout": {"type": "float", "default": 600.0, "range": (0, None, "open-low")},
    "request_timeout": {"type": "float", "default": 60.0, "range": (0, None, "open-low")},
}
MAX_MISMATCHES = 10


def start_engines(params, live, client_class=OpenAIClient):
    """The engines of validated ``params`` (``named`` specs): a client each, a stream each in ``live``, the model and block
    size they report (``live`` configured with them). Returns ``(engines, model, block_size)``."""
    engines = []
    for spec in named(params["engines"]):
        engine = Engine(spec, make_client(spec, params["request_timeout"], client_class))
        engine.stream = live.add(engine.name, spec["endpoint"], spec.get("socket_mode") == "bind", spec["topic"],
                                 spec.get("replay_endpoint"))
        engines.append(engine)
    model, block_size = discover(engines, params.get("model"))
    live.configure(block_size, model)
    return engines, model, block_size


class KVIndexCheck:
    """Run the workload against the engines and compare predictions with the engines' reports."""

    def __init__(self, params, clock=time.monotonic, client_class=OpenAIClient, ctx=None, max_frame=MAX_FRAME):
        self.params = params
        self.clock = clock
        self.client_class = client_class
        self.live = LiveIndex(clock=clock, ctx=ctx, max_frame=max_frame)
        self.approx = None
        self.engines = []
        self.by_name = {}
        self.model = params.get("model")
        self.block_size = None
        self.start = None
        self.steps = []
        self.results = {"requests": 0, "exact": 0, "largest_error": 0, "mismatches": [], "restart_misses": 0, "restart_miss_steps": []}
        self.uncounted_results = {"exact": 0, "wrong": 0, "largest_error": 0}
        self.approx_results = {"predicted_hits": 0, "exact": 0, "stale_hits": 0, "stale_hits_nothing_cached": 0, "missed_hits": 0,
                               "stale_hit_steps": []}
        self.bases = {}
        self.routing = {"steps_on_every_engine": 0, "precise_agrees": 0, "approximate_agrees": 0, "uncounted_agrees": 0}
        self.kinds = {}
        self.steps_done = 0

    # -- facts ----------------------------------------------------------------------------
    def engine_facts(self, engine):
        return dict(engine.stream.facts(self.live.index, self.live.uncounted), url=engine.spec["url"], requests=engine.requests,
                    block_size=engine.block_size, num_gpu_blocks=engine.num_gpu_blocks)

    def facts(self):
        res = self.results
        requests = res["requests"]
        restarted = self.live.restarted_engines()
        facts = {
            "changed": False,
            "model": self.model,
            "block_size": self.block_size,
            "requests": requests,
            "exact": res["exact"],
            "exact_percent": round(100.0 * res["exact"] / requests, 2) if requests else None,
            "largest_error": res["largest_error"],
            "mismatches": list(res["mismatches"]),
            "restart_misses": res["restart_misses"],
            "restart_miss_steps": list(res["restart_miss_steps"]),
            "restarted_engines": restarted,
            "restart_warning": restart_warning(restarted),
            "steps": self.steps_done,
            "workload_kinds": dict(self.kinds),
            "engines": dict((e.name, self.engine_facts(e)) for e in self.engines) if self.live.index is not None else {},
            "routing": dict(self.routing),
            "uncounted": dict(self.uncounted_results, semantics=(
                "llm-d InMemoryIndex.Evict: the first BlockRemoved of an engine hash drops its request keys "
                "(llm-d/llm-d-kv-cache@v0.9.0:pkg/kvcache/kvblock/in_memory.go)")),
            "approximate": dict(self.approx_results),
            "elapsed": round(self.clock() - self.start, 3) if self.start is not None else 0.0,
        }
        if self.approx is not None:
            facts["approximate"].update({
                "block_size_pseudo_tokens": self.approx.block_size,
                "block_size_bytes": self.approx.block_size * 4,
                "lru_capacity": dict((e.name, self.approx.capacities.get(e.name, self.approx.default_capacity)) for e in self.engines),
                "forgotten": self.approx.forgotten,
            })
        facts["summary"] = self.summary(facts)
        return facts

    @staticmethod
    def summary(facts):
        requests = facts["requests"]
        routing = facts["routing"]
        approx = facts["approximate"]
        evictions = ", ".join("%s %d" % (name, e["blocks_removed"]) for name, e in sorted(facts["engines"].items()))
        lines = [
            "precise index (copies counted): %d/%d predictions exact, largest error %d tokens" % (
                facts["exact"], requests, facts["largest_error"]),
            "llm-d uncounted eviction: %d/%d exact, %d wrong, largest error %d tokens" % (
                facts["uncounted"]["exact"], requests, facts["uncounted"]["wrong"], facts["uncounted"]["largest_error"]),
            "approximate producer: %d/%d exact, %d stale hits (predicted more than the engine held; %d where it held nothing), "
            "%d under-predicted, %d predicted hits" % (
                approx["exact"], requests, approx["stale_hits"], approx["stale_hits_nothing_cached"], approx["missed_hits"],
                approx["predicted_hits"]),
            "longest predicted prefix = most cached tokens, on %d steps sent to every engine: precise %d, uncounted %d, approximate %d" % (
                routing["steps_on_every_engine"], routing["precise_agrees"], routing["uncounted_agrees"], routing["approximate_agrees"]),
            "evicted blocks (BlockRemoved) per engine: %s" % (evictions or "none"),
        ]
        if facts["restarted_engines"]:
            lines.append("restarted in place (sequence started again): %s; %d requests right after a restart could not be predicted" % (
                ", ".join("%s %d" % (name, facts["engines"][name]["restarts"]) for name in facts["restarted_engines"]),
                facts["restart_misses"]))
        return lines

    def fail(self, msg):
        raise CheckError(msg, self.facts())

    def failure(self, exc):
        """A component's ``CheckError`` as this check's: its sentence (a timeout in the check's words) and the check's facts."""
        if isinstance(exc, OutOfTime):
            return CheckError("The check ran out of its %ss timeout after %d requests; raise timeout or shrink the workload." % (
                self.params.get("timeout"), self.results["requests"]), self.facts())
        exc.facts = exc.facts or self.facts()
        return exc

    # -- the run --------------------------------------------------------------------------
    def prepare(self):
        """Validate the options, build the workload, the engines and their streams; learn the model, block and cache sizes."""
        self.start = self.clock()
        try:
            self.params = validate(OPTIONS, self.params)
        except CheckError as exc:
            self.fail(exc.msg)
        params = self.params
        self.steps = build_workload([s["name"] for s in named(params["engines"])], params["workload"])
        self.live.settle_quiet, self.live.event_wait = params["settle"], params["event_wait"]
        self.live.deadline = self.start + params["timeout"]
        self.engines, self.model, self.block_size = start_engines(params, self.live, self.client_class)
        self.by_name = dict((e.name, e) for e in self.engines)
        self.approx = ApproxPrefixPredictor(effective_block_size(self.block_size))
        for engine in self.engines:
            self.approx.set_capacity(engine.name, engine.num_gpu_blocks)

    def run(self):
        try:
            self.prepare()
            with self.live.listening():
                for step in self.steps:
                    self.run_step(step)
                self.live.settle()
            self.judge()
        except CheckError as exc:
            raise self.failure(exc)
        return self.facts()

    def run_step(self, step, among=None):
        """One step of the workload: its requests in turn, each judged against the prediction made just before it.

        ``among``: the engines predicted for (default: all), so a caller may take one out of the rotation."""
        among = self.engines if among is None else among
        self.kinds[step.kind] = self.kinds.get(step.kind, 0) + 1
        base = self.bases.get(step.family)
        if base is None:
            base = self.bases[step.family] = align(among[0], self.model, step.base, self.block_size)
        prompt = base + step.tail
        approx_hashes = block_hashes(prompt, self.approx.block_size, self.model)
        tokens = {}
        truth = {}
        before = None
        for name in step.targets:
            engine = self.by_name[name]
            limit = engine.spec.get("withhold_after")
            if limit is not None and not engine.stream.stopped and self.results["requests"] >= limit:
                self.live.withhold(engine.stream)
            self.live.settle()
            # Just before the request: what each engine is predicted to hold of this prompt.
            predicted = self.predict(prompt, tokens, approx_hashes, among)
            if before is None:
                before = predicted   # the moment a router would pick the engine
            since, restarts = engine.stream.activity, engine.stream.restarts
            prompt_tokens, reported = complete(engine, self.model, prompt, self.params["max_tokens"])
            self.results["requests"] += 1
            require_cached_tokens(engine, reported)
            if prompt_tokens != len(tokens[name]):
                self.fail("Engine %s counted %s prompt tokens for %s but its /tokenize gave %d; the check cannot key the "
                          "prompt's blocks." % (name, prompt_tokens, step.family, len(tokens[name])))
            truth[name] = reported
            # The blocks this request computed are published after it: wait until the engine's events show every full block
            # of the prompt held (a condition, not a time), before judging (a restart shows in these events) and predicting.
            keys = self.live.prompt_keys(tokens[name])
            expect_store = len(keys) * self.block_size > reported
            self.live.settle(wait_for=engine.stream if expect_store else None, since=since,
                             until=lambda: self.live.held(name, keys) >= len(keys))
            approx_tokens = self.approx_tokens(engine, prompt, predicted["approximate"][name], len(tokens[name]))
            self.compare(step, engine, predicted["precise"][name], predicted["uncounted"][name], approx_tokens, reported,
                         len(tokens[name]), restarted=engine.stream.restarts > restarts)
            self.approx.routed(name, approx_hashes)
        if len(step.targets) == len(among) > 1:
            self.score_routing(truth, before, among)
        self.steps_done += 1

    def predict(self, prompt, tokens, approx_hashes, among):
        """Per engine: predicted cached tokens (precise, uncounted) and the approximate producer's matched blocks."""
        out = {"precise": {}, "uncounted": {}, "approximate": self.approx.match(approx_hashes)}
        for other in among:
            ids = tokens.get(other.name)
            if ids is None:
                ids = tokens[other.name] = tokenize(other, self.model, prompt)
            keys = self.live.prompt_keys(ids)
            out["precise"][other.name] = self.live.predicted(other.name, ids, keys)
            out["uncounted"][other.name] = self.live.predicted(other.name, ids, keys, uncounted=True)
            out["approximate"].setdefault(other.name, 0)
        return out

    def approx_tokens(self, engine, prompt, blocks, prompt_tokens):
        """The approximate producer's matched character blocks as the cached tokens they stand for on the engine."""
        if not blocks:
            return 0
        raw = prompt.encode("utf-8")
        cut = blocks * self.approx.block_size * 4
        count = prompt_tokens if cut >= len(raw) else len(tokenize(engine, self.model, raw[:cut].decode("utf-8", "ignore")))
        return predicted_cached_tokens(count // self.block_size, prompt_tokens, self.block_size)

    def compare(self, step, engine, predicted, uncounted, approx_tokens, reported, prompt_tokens, restarted=False):
        """Hold a prediction against the engine's report; ``restarted``: this request's own events showed the engine restarted.

        A request to an engine that restarted in place just before it, predicted above what the engine reported, is a restart
        miss, not a wrong prediction: only the request's own events revealed the restart, so no index could have known the
        cache was empty (the llm-d EPP v0.9.0's index keeps the old blocks even after those events).
        """
        res = self.results
        error = abs(predicted - reported)
        unc = self.uncounted_results
        if uncounted == reported:
            unc["exact"] += 1
        else:
            unc["wrong"] += 1
            unc["largest_error"] = max(unc["largest_error"], abs(uncounted - reported))
        apx = self.approx_results
        if approx_tokens:
            apx["predicted_hits"] += 1
        if approx_tokens > reported:
            apx["stale_hits"] += 1
            if not reported:
                apx["stale_hits_nothing_cached"] += 1
            if len(apx["stale_hit_steps"]) < MAX_MISMATCHES:
                apx["stale_hit_steps"].append({"step": step.index, "family": step.family, "engine": engine.name,
                                               "predicted": approx_tokens, "reported": reported})
        elif approx_tokens < reported:
            apx["missed_hits"] += 1
        else:
            apx["exact"] += 1
        if restarted and predicted > reported:
            res["restart_misses"] += 1
            if len(res["restart_miss_steps"]) < MAX_MISMATCHES:
                res["restart_miss_steps"].append({"step": step.index, "family": step.family, "engine": engine.name,
                                                  "predicted": predicted, "reported": reported})
            return
        res["largest_error"] = max(res["largest_error"], error)
        if error == 0:
            res["exact"] += 1
            return
        res["mismatches"].append({"step": step.index, "family": step.family, "kind": step.kind, "engine": engine.name,
                                  "predicted": predicted, "reported": reported, "prompt_tokens": prompt_tokens})
        why = engine.stream.explain(engine.spec.get("withhold_after"))
        self.fail("The index predicted %d cached tokens for prompt family %s on engine %s but the engine reported %d "
                  "(request %d, step %d%s)." % (predicted, step.family, engine.name, reported, res["requests"], step.index, why))

    def score_routing(self, truth, before, among):
        """Does the engine a router would pick (longest predicted prefix, first on ties) really hold the most?"""
        best = max(truth.values())
        names = [e.name for e in among]
        routing = self.routing
        routing["steps_on_every_engine"] += 1
        for key, kind in (("precise_agrees", "precise"), ("uncounted_agrees", "uncounted"), ("approximate_agrees", "approximate")):
            prediction = before[kind]
            top = max(prediction[n] for n in names)
            pick = [n for n in names if prediction[n] == top][0]
            if truth[pick] == best:
                routing[key] += 1

    # -- verdict --------------------------------------------------------------------------
    def judge(self):
        expect = self.params["expect"]
        requests = self.results["requests"]
        if requests < expect["min_requests"]:
            self.fail("The workload sent %d requests, fewer than expect.min_requests %d; raise workload.families or "
                      "workload.rounds." % (requests, expect["min_requests"]))
        want = expect["min_evictions_per_engine"]
        removed = self.live.removed_blocks()
        for engine in self.engines:
            if removed[engine.name] < want:
                self.fail("Engine %s evicted %d blocks (BlockRemoved) during the check, fewer than expect.min_evictions_per_engine "
                          "%d; give it a smaller KV cache or a longer workload." % (engine.name, removed[engine.name], want))
