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

``KVIndexCheck(params).run()`` returns the facts or raises ``CheckFailed(msg, facts)``. Token ids stay in this
process: they are used for keys and lookups and then dropped; facts carry counts only.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import re
import time

from ..http.args import HTTP_ARG_SPEC, client_options, http_problem
from .events import KVDecoder, MalformedMessage
from .index import KVBlockIndex, predicted_cached_tokens
from .index_approx import ApproxPrefixPredictor, block_hashes, effective_block_size
from .workload import WORKLOAD_SPEC, build as build_workload
from .sockets import SocketSetupError, drain_monitor, open_socket, replay, zmq
from ..http.openai import OpenAIClient, OpenAIHTTPError, cached_tokens, model_ids

# Each engine's HTTP connection takes the collection's HTTP options (auth, TLS, proxy, body limit: _http_args).
ENGINE_SPEC = dict(HTTP_ARG_SPEC, **{
    "name": {"type": "str"},
    "url": {"type": "str", "required": True},
    "endpoint": {"type": "str", "required": True},
    "socket_mode": {"type": "str", "default": "connect", "choices": ["connect", "bind"]},
    "topic": {"type": "str"},
    "replay_endpoint": {"type": "str"},
    "withhold_after": {"type": "int"},
})
EXPECT_SPEC = {
    "min_requests": {"type": "int", "default": 50},
    "min_evictions_per_engine": {"type": "int", "default": 0},
}
ARG_SPEC = {
    "engines": {"type": "list", "elements": "dict", "required": True, "options": ENGINE_SPEC},
    "model": {"type": "str"},
    "workload": {"type": "dict", "default": {}, "options": WORKLOAD_SPEC},
    "expect": {"type": "dict", "default": {}, "options": EXPECT_SPEC},
    "max_tokens": {"type": "int", "default": 1, "no_log": False},
    "settle": {"type": "float", "default": 0.3},
    "event_wait": {"type": "float", "default": 5.0},
    "timeout": {"type": "float", "default": 600.0},
    "request_timeout": {"type": "float", "default": 60.0},
}
CACHE_CONFIG_RE = re.compile(r'^vllm:cache_config_info\{([^}]*)\}', re.M)
LABEL_RE = re.compile(r'(\w+)="([^"]*)"')
MAX_MISMATCHES = 10
PAD = " a"


class CheckFailed(Exception):
    def __init__(self, msg, facts=None):
        super(CheckFailed, self).__init__(msg)
        self.msg = msg
        self.facts = facts or {}


def topic_pod(topic):
    """The pod id of a ``kv@<pod>@<model>`` topic (the whole topic when it has another shape)."""
    parts = (topic or "").split("@")
    return parts[1] if len(parts) == 3 else topic


def cache_config(metrics_text):
    """``block_size`` and ``num_gpu_blocks`` from vLLM's ``vllm:cache_config_info`` labels (None when absent).

    The router reads the same labels (llm-d/llm-d-router@v0.9.0:
    pkg/epp/framework/plugins/datalayer/extractor/metrics/extractor.go).
    """
    match = CACHE_CONFIG_RE.search(metrics_text or "")
    labels = dict(LABEL_RE.findall(match.group(1))) if match else {}

    def number(name):
        value = labels.get(name, "")
        try:
            return int(float(value))
        except ValueError:
            return None
    return {"block_size": number("block_size"), "num_gpu_blocks": number("num_gpu_blocks")}


class Engine:
    """One engine: its HTTP client, its event socket and its sequence bookkeeping."""

    def __init__(self, spec, client):
        self.spec = spec
        self.name = spec["name"]
        self.topic = spec["topic"]
        self.client = client
        self.sock = None
        self.mon = None
        self.connected = False
        self.withheld = False
        self.last_applied = -1
        self.last_live = -1
        self.batches = 0
        self.other_topics = {}
        self.malformed = 0
        self.malformed_reason = None
        self.gaps = 0
        self.gaps_unrepaired = 0
        self.restarts = 0
        self.requests = 0
        self.block_size = None
        self.num_gpu_blocks = None
        self.activity = 0
        self.event_waits_timed_out = 0

    def facts(self, index, uncounted):
        blocks = index.engines.get(self.name)
        return {
            "url": self.spec["url"],
            "topic": self.topic,
            "requests": self.requests,
            "batches": self.batches,
            "blocks_stored": blocks.stored_blocks if blocks else 0,
            "blocks_stored_again": blocks.stored_again if blocks else 0,
            "blocks_removed": blocks.removed_blocks if blocks else 0,
            "removed_unknown": blocks.removed_unknown if blocks else 0,
            "stores_skipped": blocks.stores_skipped if blocks else 0,
            "clears": blocks.clears if blocks else 0,
            "held_blocks": index.size(self.name),
            "held_blocks_uncounted": uncounted.size(self.name),
            "restarts": self.restarts,
            "gaps": self.gaps,
            "gaps_unrepaired": self.gaps_unrepaired,
            "other_topics": dict(self.other_topics),
            "malformed": self.malformed,
            "block_size": self.block_size,
            "num_gpu_blocks": self.num_gpu_blocks,
            "subscription_stopped": self.withheld,
            "event_waits_timed_out": self.event_waits_timed_out,
        }


class KVIndexCheck:
    """Run the workload against the engines and compare predictions with the engines' reports."""

    def __init__(self, params, clock=time.monotonic, client_class=OpenAIClient, ctx=None):
        self.params = params
        self.clock = clock
        self.client_class = client_class
        self.ctx = ctx
        self.decoder = KVDecoder("vllm", include_token_ids=True)
        self.index = None
        self.uncounted = None
        self.approx = None
        self.engines = []
        self.by_name = {}
        self.model = params.get("model")
        self.block_size = None
        self.start = None
        self.deadline = None
        self.results = {"requests": 0, "exact": 0, "largest_error": 0, "mismatches": []}
        self.uncounted_results = {"exact": 0, "wrong": 0, "largest_error": 0}
        self.approx_results = {"predicted_hits": 0, "exact": 0, "stale_hits": 0, "stale_hits_nothing_cached": 0, "missed_hits": 0,
                               "stale_hit_steps": []}
        self.bases = {}
        self.routing = {"steps_on_every_engine": 0, "precise_agrees": 0, "approximate_agrees": 0, "uncounted_agrees": 0}
        self.kinds = {}
        self.steps_done = 0

    # -- facts ----------------------------------------------------------------------------
    def facts(self):
        res = self.results
        requests = res["requests"]
        facts = {
            "changed": False,
            "model": self.model,
            "block_size": self.block_size,
            "requests": requests,
            "exact": res["exact"],
            "exact_percent": round(100.0 * res["exact"] / requests, 2) if requests else None,
            "largest_error": res["largest_error"],
            "mismatches": list(res["mismatches"]),
            "steps": self.steps_done,
            "workload_kinds": dict(self.kinds),
            "engines": dict((e.name, e.facts(self.index, self.uncounted)) for e in self.engines) if self.index else {},
            "routing": dict(self.routing),
            "uncounted": dict(self.uncounted_results, semantics=(
                "llm-d InMemoryIndex.Evict: the first BlockRemoved of an engine hash drops its request keys "
                "(llm-d/llm-d-kv-cache@7be76e11:pkg/kvcache/kvblock/in_memory.go)")),
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
        return [
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

    def fail(self, msg):
        raise CheckFailed(msg, self.facts())

    # -- validation -----------------------------------------------------------------------
    def validate(self):
        engines = self.params.get("engines") or []
        if not engines:
            self.fail("engines must list at least one engine (url, endpoint, topic).")
        seen = set()
        specs = []
        for pos, raw in enumerate(engines):
            spec = dict(raw)
            for field in ("url", "endpoint"):
                if not spec.get(field):
                    self.fail("engines[%d] has no %s." % (pos, field))
            if not re.match(r"^https?://", spec["url"]):
                self.fail("engines[%d].url %r is not an http(s) URL." % (pos, spec["url"]))
            spec["topic"] = spec.get("topic") or ""
            spec["name"] = spec.get("name") or topic_pod(spec["topic"]) or spec["url"].split("//", 1)[1].rstrip("/")
            if spec["name"] in seen:
                self.fail("Two engines are named %r; give each a distinct name (or topic)." % spec["name"])
            seen.add(spec["name"])
            if spec.get("withhold_after") is not None and spec["withhold_after"] < 0:
                self.fail("engines[%d].withhold_after must not be negative." % pos)
            problem = http_problem(spec, "engines[%d]" % pos)
            if problem:
                self.fail(problem)
            specs.append(spec)
        for name in ("timeout", "request_timeout"):
            if float(self.params.get(name) or 0) <= 0:
                self.fail("%s must be a positive number of seconds." % name)
        if int(self.params.get("max_tokens") or 1) < 1:
            self.fail("max_tokens must be at least 1.")
        try:
            self.steps = build_workload([s["name"] for s in specs], self.params.get("workload"))
        except ValueError as exc:
            self.fail("%s%s." % (str(exc)[:1].upper(), str(exc)[1:]))
        return specs

    # -- HTTP -----------------------------------------------------------------------------
    def _client(self, spec):
        base = spec["url"].rstrip("/")
        if base.endswith("/v1"):
            base = base[:-3]
        return self.client_class(base, timeout=float(self.params.get("request_timeout") or 60.0), **client_options(spec))

    def discover(self):
        """Model, block size and KV-cache size of every engine (from /v1/models and /metrics)."""
        for engine in self.engines:
            try:
                if not self.model:
                    models = model_ids(engine.client.get_json("/v1/models"))
                    if not models:
                        self.fail("%s lists no model; set model." % engine.client.url("/v1/models"))
                    self.model = models[0]
                config = cache_config(engine.client.get_text("/metrics"))
            except OpenAIHTTPError as exc:
                self.fail("Engine %s cannot be queried: %s." % (engine.name, str(exc).rstrip(".")))
            engine.block_size = config["block_size"]
            engine.num_gpu_blocks = config["num_gpu_blocks"]
        sizes = set(e.block_size for e in self.engines if e.block_size)
        if len(sizes) > 1:
            self.fail("The engines run different block sizes (%s); this check needs one block size for all of them." % (
                ", ".join("%s %s" % (e.name, e.block_size) for e in self.engines)))
        self.block_size = sizes.pop() if sizes else None
        self.index = KVBlockIndex(self.block_size, self.model, count_copies=True)
        self.uncounted = KVBlockIndex(self.block_size, self.model, count_copies=False)
        self.approx = ApproxPrefixPredictor(effective_block_size(self.block_size))
        for engine in self.engines:
            self.approx.set_capacity(engine.name, engine.num_gpu_blocks)

    def tokenize(self, engine, prompt):
        try:
            answer = engine.client.post_json("/tokenize", {"model": self.model, "prompt": prompt})
        except OpenAIHTTPError as exc:
            self.fail("Tokenizing through engine %s failed: %s." % (engine.name, str(exc).rstrip(".")))
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list):
            self.fail("Engine %s answered /tokenize without a token list." % engine.name)
        return tokens

    def complete(self, engine, prompt):
        body = {"model": self.model, "prompt": prompt, "max_tokens": int(self.params.get("max_tokens") or 1), "temperature": 0}
        try:
            answer = engine.client.post_json("/v1/completions", body)
        except OpenAIHTTPError as exc:
            self.fail("A request to engine %s failed: %s." % (engine.name, str(exc).rstrip(".")))
        usage = (answer if isinstance(answer, dict) else {}).get("usage") or {}
        return usage.get("prompt_tokens"), cached_tokens(usage)

    # -- events ---------------------------------------------------------------------------
    def open_streams(self, ctx):
        for engine in self.engines:
            bind = engine.spec.get("socket_mode") == "bind"
            try:
                engine.sock, engine.mon = open_socket(ctx, zmq.SUB, engine.spec["endpoint"], bind, monitor=True)
            except SocketSetupError as exc:
                self.fail("Engine %s: %s" % (engine.name, exc))

    def wait_connected(self, ctx):
        deadline = min(self.deadline, self.clock() + max(2 * float(self.params.get("event_wait") or 5.0), 2.0))
        while self.clock() < deadline and not all(e.connected for e in self.engines):
            for engine in self.engines:
                if not engine.connected and engine.mon.poll(50, zmq.POLLIN) and drain_monitor(engine.mon):
                    engine.connected = True
            self.drain(ctx)
        missing = [e for e in self.engines if not e.connected]
        if missing:
            engine = missing[0]
            if engine.spec.get("socket_mode") == "bind":
                self.fail("No publisher connected to %s for engine %s; the engine must connect to this address (vLLM connects when "
                          "its endpoint has no '*'), or, if it binds (tcp://*:PORT), set socket_mode=connect." % (
                              engine.spec["endpoint"], engine.name))
            self.fail("The connection to %s for engine %s never completed; the engine must bind it (vLLM binds endpoints with '*'), "
                      "or, if it connects, set socket_mode=bind." % (engine.spec["endpoint"], engine.name))

    def catch_up(self, ctx):
        """Replay every engine's buffered history from seq 0, so the index starts with what the engine holds."""
        for engine in self.engines:
            if engine.spec.get("replay_endpoint"):
                self.replay_into(ctx, engine, 0, None)

    def replay_into(self, ctx, engine, start, end):
        try:
            for topic, seq, payload in replay(ctx, engine.spec["replay_endpoint"], start, self.deadline, clock=self.clock):
                if end is not None and seq > end:
                    break
                if topic is not None and not topic.startswith(engine.topic):
                    engine.other_topics[topic] = engine.other_topics.get(topic, 0) + 1
                    continue
                if seq <= engine.last_applied:
                    continue
                try:
                    batch = self.decoder.decode_payload(payload, engine.topic, seq)
                except MalformedMessage as exc:
                    self.malformed(engine, "replayed batch %d: %s" % (seq, exc))
                    continue
                self.apply(engine, batch)
        except (SocketSetupError, MalformedMessage) as exc:
            self.malformed(engine, "replay: %s" % exc)

    @staticmethod
    def malformed(engine, reason):
        engine.malformed += 1
        if engine.malformed_reason is None:
            engine.malformed_reason = reason

    def apply(self, engine, batch):
        if batch.seq > engine.last_applied + 1 and engine.last_applied >= 0:
            engine.gaps += 1
        engine.last_applied = batch.seq
        engine.batches += 1
        for event in batch.events:
            try:
                self.index.apply(engine.name, event)
                self.uncounted.apply(engine.name, event)
            except ValueError as exc:   # an event the index cannot key (no token ids, no block size)
                self.malformed(engine, "batch %d: %s" % (batch.seq, exc))

    def receive(self, ctx, engine, frames):
        engine.activity += 1
        topic = frames[0].decode("utf-8", "replace") if frames else ""
        if not topic.startswith(engine.topic):
            engine.other_topics[topic] = engine.other_topics.get(topic, 0) + 1
            return
        try:
            batch = self.decoder.decode_frames(frames)
        except MalformedMessage as exc:
            self.malformed(engine, str(exc))
            return
        seq = batch.seq
        if engine.last_live >= 0 and seq < engine.last_live:
            engine.restarts += 1   # the engine started again: what the index knew of it is gone
            self.index.cleared(engine.name)
            self.uncounted.cleared(engine.name)
            engine.last_applied = -1
        engine.last_live = seq
        if seq <= engine.last_applied:
            return   # already applied (backlog after a replay)
        if seq > engine.last_applied + 1:
            if engine.spec.get("replay_endpoint"):
                self.replay_into(ctx, engine, engine.last_applied + 1, seq - 1)
            if seq > engine.last_applied + 1:
                engine.gaps_unrepaired += 1
        self.apply(engine, batch)

    def drain(self, ctx):
        got = False
        for engine in self.engines:
            if engine.sock is None:
                continue
            for _i in range(10000):
                try:
                    frames = engine.sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                got = True
                self.receive(ctx, engine, frames)
        return got

    def settle(self, ctx, wait_for=None, since=0):
        """Apply events until every stream was quiet for ``settle`` seconds (and ``wait_for`` sent something)."""
        quiet = max(float(self.params.get("settle") or 0.0), 0.0)
        event_wait = self.clock() + max(float(self.params.get("event_wait") or 0.0), 0.0)
        last = self.clock()
        poller = zmq.Poller()
        for engine in self.engines:
            if engine.sock is not None:
                poller.register(engine.sock, zmq.POLLIN)
        while True:
            now = self.clock()
            if now >= self.deadline:
                self.fail("The check ran out of its %ss timeout after %d requests; raise timeout or shrink the workload." % (
                    self.params.get("timeout"), self.results["requests"]))
            waiting = wait_for is not None and wait_for.activity <= since and not wait_for.withheld
            if waiting and now >= event_wait:
                wait_for.event_waits_timed_out += 1
                waiting = False
                wait_for = None
            if not waiting and now - last >= quiet:
                return
            poller.poll(max(int(min(quiet, 0.05) * 1000), 1))
            if self.drain(ctx):
                last = self.clock()

    def withhold(self, engine):
        """Stop reading an engine's events (fault injection: a router that stopped hearing it)."""
        engine.withheld = True
        for sock in (engine.sock, engine.mon):
            if sock is not None:
                sock.close(0)
        engine.sock = engine.mon = None

    # -- the workload ---------------------------------------------------------------------
    def run(self):
        self.start = self.clock()
        specs = self.validate()
        self.deadline = self.start + float(self.params.get("timeout") or 600.0)
        self.engines = [Engine(spec, self._client(spec)) for spec in specs]
        self.by_name = dict((e.name, e) for e in self.engines)
        self.discover()
        own_ctx = self.ctx is None
        ctx = zmq.Context() if own_ctx else self.ctx
        try:
            self.open_streams(ctx)
            self.wait_connected(ctx)
            self.settle(ctx)
            self.catch_up(ctx)
            for step in self.steps:
                self.run_step(ctx, step)
            self.settle(ctx)
        finally:
            for engine in self.engines:
                for sock in (engine.sock, engine.mon):
                    if sock is not None:
                        sock.close(0)
            if own_ctx:
                ctx.term()
        self.judge()
        return self.facts()

    def run_step(self, ctx, step):
        self.kinds[step.kind] = self.kinds.get(step.kind, 0) + 1
        base = self.bases.get(step.family)
        if base is None:
            base = self.bases[step.family] = self.align(self.engines[0], step.base)
        prompt = base + step.tail
        approx_hashes = block_hashes(prompt, self.approx.block_size, self.model)
        tokens = {}
        truth = {}
        before = None
        for name in step.targets:
            engine = self.by_name[name]
            limit = engine.spec.get("withhold_after")
            if limit is not None and not engine.withheld and self.results["requests"] >= limit:
                self.withhold(engine)
            self.settle(ctx)
            # Just before the request: what each engine is predicted to hold of this prompt.
            predicted = self.predict(prompt, tokens, approx_hashes)
            if before is None:
                before = predicted   # the moment a router would pick the engine
            since = engine.activity
            prompt_tokens, reported = self.complete(engine, prompt)
            engine.requests += 1
            self.results["requests"] += 1
            if reported is None:
                self.fail("Engine %s does not report usage.prompt_tokens_details.cached_tokens; start vLLM with "
                          "--enable-prompt-tokens-details." % name)
            if prompt_tokens != len(tokens[name]):
                self.fail("Engine %s counted %s prompt tokens for %s but its /tokenize gave %d; the check cannot key the "
                          "prompt's blocks." % (name, prompt_tokens, step.family, len(tokens[name])))
            truth[name] = reported
            approx_tokens = self.approx_tokens(engine, prompt, predicted["approximate"][name], len(tokens[name]))
            self.compare(step, engine, predicted["precise"][name], predicted["uncounted"][name], approx_tokens, reported,
                         len(tokens[name]))
            self.approx.routed(name, approx_hashes)
            # The blocks this request computed are published after it: wait for them before the next prediction.
            expect_store = (len(tokens[name]) // self.block_size) * self.block_size > reported
            self.settle(ctx, wait_for=engine if expect_store else None, since=since)
        if len(step.targets) == len(self.engines) > 1:
            self.score_routing(truth, before)
        self.steps_done += 1

    def predict(self, prompt, tokens, approx_hashes):
        """Per engine: predicted cached tokens (precise, uncounted) and the approximate producer's matched blocks."""
        out = {"precise": {}, "uncounted": {}, "approximate": self.approx.match(approx_hashes)}
        for other in self.engines:
            ids = tokens.get(other.name)
            if ids is None:
                ids = tokens[other.name] = self.tokenize(other, prompt)
            keys = self.index.prompt_keys(ids)
            out["precise"][other.name] = predicted_cached_tokens(self.index.lookup(other.name, keys), len(ids), self.block_size)
            out["uncounted"][other.name] = predicted_cached_tokens(self.uncounted.lookup(other.name, keys), len(ids), self.block_size)
            out["approximate"].setdefault(other.name, 0)
        return out

    def align(self, engine, prompt):
        """Pad a prompt to a whole number of blocks as the engine tokenizes it (a pad token per missing token first)."""
        count = len(self.tokenize(engine, prompt))
        if count % self.block_size:
            prompt += PAD * (self.block_size - count % self.block_size)
            for _i in range(2 * self.block_size):
                count = len(self.tokenize(engine, prompt))
                if count % self.block_size == 0:
                    break
                prompt += PAD
        return prompt

    def approx_tokens(self, engine, prompt, blocks, prompt_tokens):
        """The approximate producer's matched character blocks as the cached tokens they stand for on the engine."""
        if not blocks:
            return 0
        raw = prompt.encode("utf-8")
        cut = blocks * self.approx.block_size * 4
        count = prompt_tokens if cut >= len(raw) else len(self.tokenize(engine, raw[:cut].decode("utf-8", "ignore")))
        return predicted_cached_tokens(count // self.block_size, prompt_tokens, self.block_size)

    def compare(self, step, engine, predicted, uncounted, approx_tokens, reported, prompt_tokens):
        res = self.results
        error = abs(predicted - reported)
        res["largest_error"] = max(res["largest_error"], error)
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
        if error == 0:
            res["exact"] += 1
            return
        res["mismatches"].append({"step": step.index, "family": step.family, "kind": step.kind, "engine": engine.name,
                                  "predicted": predicted, "reported": reported, "prompt_tokens": prompt_tokens})
        why = self.explain(engine)
        self.fail("The index predicted %d cached tokens for prompt family %s on engine %s but the engine reported %d "
                  "(request %d, step %d%s)." % (predicted, step.family, engine.name, reported, res["requests"], step.index, why))

    def explain(self, engine):
        """A clause on why an engine's events may be missing (empty when nothing is known)."""
        if engine.withheld:
            return "; the subscription to its events was stopped after %d requests" % engine.spec.get("withhold_after")
        if engine.other_topics and not engine.batches:
            return "; no KV events arrived under its topic prefix %r, but messages arrived under %s" % (
                engine.topic, ", ".join(repr(t) for t in sorted(engine.other_topics)))
        if not engine.batches:
            return "; no KV event arrived from it"
        if engine.gaps_unrepaired:
            return "; a gap in its event stream could not be repaired (%d in all)" % engine.gaps_unrepaired
        if engine.malformed:
            return "; %d of its messages were malformed (%s)" % (engine.malformed, engine.malformed_reason)
        return ""

    def score_routing(self, truth, before):
        """Does the engine a router would pick (longest predicted prefix, first on ties) really hold the most?"""
        best = max(truth.values())
        names = [e.name for e in self.engines]
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
        expect = dict((k, v["default"]) for k, v in EXPECT_SPEC.items())
        expect.update(dict((k, v) for k, v in (self.params.get("expect") or {}).items() if v is not None))
        requests = self.results["requests"]
        if requests < int(expect["min_requests"]):
            self.fail("The workload sent %d requests, fewer than expect.min_requests %d; raise workload.families or "
                      "workload.rounds." % (requests, int(expect["min_requests"])))
        want = int(expect["min_evictions_per_engine"])
        for engine in self.engines:
            blocks = self.index.engines.get(engine.name)
            removed = blocks.removed_blocks if blocks else 0
            if removed < want:
                self.fail("Engine %s evicted %d blocks (BlockRemoved) during the check, fewer than expect.min_evictions_per_engine "
                          "%d; give it a smaller KV cache or a longer workload." % (engine.name, removed, want))
