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
against the option table ``OPTIONS`` first. The event streams are ``kv/consumer.py``'s (one source per engine);
this check keeps its own order on top: a sequence number that goes back is a restart and clears what the index
knew of that engine, a gap is repaired through the engine's replay endpoint before the next batch is applied, and
at the start every engine's buffered history is replayed from seq 0. Token ids stay in this process: they are
used for keys and lookups and then dropped; facts carry counts only.

Sequence numbers are kept per engine and data-parallel rank (each rank's publisher counts from 0 on its own). A
live sequence number at or below the last one seen live on that rank is a restart (ZMQ never delivers a live message
twice); so is one at or below the last replayed one whose payload differs from the replayed batch of that number
(the live backlog of a replay is byte-identical to it). A number that jumps forward is a gap. An engine that
restarted in place is named in ``restarted_engines``, with the one sentence ``restart_warning``: the llm-d EPP
v0.9.0's KV-block index keeps such an engine's old blocks.

After each request the check waits for a condition, not a quiet period: the engine's events show the prompt's full
blocks held (bounded by ``event_wait``; then a replay of what follows the last applied batch, where the engine has a
replay endpoint). The quiet period (``settle``) before each prediction is kept for events nobody asked for.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import contextlib
import hashlib
import re
import time

from ..common.errors import CheckError
from ..common.options import validate
from ..common.wiring import topic_pod
from ..http.args import client_options, http_problem
from .args import ENGINE_ARG_SPEC
from .consumer import MAX_FRAME, STOP, SKIP, TAKE, KVConsumer, SocketSetupError, Source, unconnected
from .events import KVDecoder
from .index import KVBlockIndex, predicted_cached_tokens
from .index_approx import ApproxPrefixPredictor, block_hashes, effective_block_size
from .workload import WORKLOAD_OPTION, build as build_workload
from ..http.openai import OpenAIClient, OpenAIHTTPError, cached_tokens, model_ids


def _engines_problem(engines, name):
    """At least one engine, and the HTTP options of each usable (http_problem's sentences, before the types)."""
    if not engines:
        return "%s must list at least one engine (url, endpoint, topic)." % name
    for pos, engine in enumerate(engines):
        problem = http_problem(engine, "%s[%d]" % (name, pos)) if isinstance(engine, dict) else None
        if problem:
            return problem
    return None


# An engine of this check: the shared engine options (kv/args.py, documented by the _engines doc fragment; its
# KV_INDEX variant documents this table) and a fault injection.
ENGINE_SPEC = dict(ENGINE_ARG_SPEC, withhold_after={"type": "int", "range": (0, None)})
EXPECT_SPEC = {
    "min_requests": {"type": "int", "default": 50},
    "min_evictions_per_engine": {"type": "int", "default": 0},
}
# The check's one option table (argument spec and validation).
OPTIONS = {
    "engines": {"type": "list", "elements": "dict", "required": True, "options": ENGINE_SPEC, "check": _engines_problem},
    "model": {"type": "str"},
    "workload": WORKLOAD_OPTION,
    "expect": {"type": "dict", "default": {}, "options": EXPECT_SPEC},
    "max_tokens": {"type": "int", "default": 1, "no_log": False, "range": (1, None)},
    "settle": {"type": "float", "default": 0.3},
    "event_wait": {"type": "float", "default": 5.0},
    "timeout": {"type": "float", "default": 600.0, "range": (0, None, "open-low")},
    "request_timeout": {"type": "float", "default": 60.0, "range": (0, None, "open-low")},
}
DRAIN_LIMIT = 10000  # messages read from one engine at a time
CACHE_CONFIG_RE = re.compile(r'^vllm:cache_config_info\{([^}]*)\}', re.M)
LABEL_RE = re.compile(r'(\w+)="([^"]*)"')
MAX_MISMATCHES = 10
PAD = " a"
# What llm-d-kv-cache v0.9.0 (the KV-block index of the llm-d EPP v0.9.0) does with a restarted engine, read at the tag
# (github.com/llm-d/llm-d-kv-cache@v0.9.0): pkg/kvevents/zmq_subscriber.go runSubscriber reads each message's sequence
# number only to log it and pass it on in RawMessage.Sequence, which nothing reads; pkg/kvevents/pool.go
# processEventBatch clears a pod (index.Clear) only on AllBlocksCleared, which vLLM 0.32.0 publishes only from
# BlockPool.reset_prefix_cache (vllm/v1/core/block_pool.py), never at start. The EPP keys scores by the endpoint's
# address (llm-d-router@v0.9.0: .../dataproducer/preciseprefixcache/producer.go produceFromBlockKeys), so a pod with
# a new address starts with nothing credited.
RESTART_WARNING = ("%s restarted in place during the check (%s); llm-d-kv-cache v0.9.0 keeps a restarted engine's old blocks until "
                   "the pod is replaced, so a precise llm-d EPP may route to blocks %s: replace the pod (delete it so its Deployment "
                   "creates a new one with a new address) rather than restart its container.")


def restart_warning(names):
    """The one sentence for engines seen restarting in place (None when there are none)."""
    names = sorted(names)
    if not names:
        return None
    if len(names) == 1:
        return RESTART_WARNING % ("Engine %s" % names[0], "its KV-event sequence started again", "that engine no longer holds")
    return RESTART_WARNING % ("Engines %s and %s" % (", ".join(names[:-1]), names[-1]), "their KV-event sequences started again",
                              "those engines no longer hold")


def _digest(payload):
    return hashlib.blake2b(bytes(payload), digest_size=8).digest()


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
    """One engine: its HTTP client, its event stream (a consumer ``Source``) and its sequence bookkeeping."""

    def __init__(self, spec, client):
        self.spec = spec
        self.name = spec["name"]
        self.client = client
        self.source = Source(spec["endpoint"], spec.get("socket_mode") == "bind", spec["topic"], spec.get("replay_endpoint"),
                             name=self.name)
        self.ranks = {}   # data-parallel rank -> its sequence bookkeeping (``rank``)
        self.batches = 0
        self.gaps = 0
        self.gaps_unrepaired = 0
        self.restarts = 0
        self.restart_log = []   # {"rank", "from", "to"}: the last live sequence number before each restart and the first after
        self.requests = 0
        self.block_size = None
        self.num_gpu_blocks = None
        self.event_waits_timed_out = 0

    def rank(self, rank):
        """One rank's sequence state: last seq seen live and its payload digest, last applied, replayed digests not yet live."""
        state = self.ranks.get(rank)
        if state is None:
            state = self.ranks[rank] = {"live": -1, "live_digest": None, "applied": -1, "replayed": {}}
        return state

    @property
    def topic(self):
        return self.source.topic

    @property
    def tally(self):
        return self.source.tally

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
            "restart_seqs": list(self.restart_log),
            "gaps": self.gaps,
            "gaps_unrepaired": self.gaps_unrepaired,
            "other_topics": dict(self.tally.other_topics),
            "malformed": self.tally.malformed,
            "block_size": self.block_size,
            "num_gpu_blocks": self.num_gpu_blocks,
            "subscription_stopped": self.source.stopped,
            "event_waits_timed_out": self.event_waits_timed_out,
        }


class KVIndexCheck:
    """Run the workload against the engines and compare predictions with the engines' reports."""

    options = OPTIONS  # the check's option table (a subclass brings its own)

    def __init__(self, params, clock=time.monotonic, client_class=OpenAIClient, ctx=None, max_frame=MAX_FRAME):
        self.params = params
        self.clock = clock
        self.client_class = client_class
        self.consumer = KVConsumer(KVDecoder("vllm", include_token_ids=True), self.on_batch, clock=clock, ctx=ctx, max_frame=max_frame)
        self.index = None
        self.uncounted = None
        self.approx = None
        self.engines = []
        self.by_name = {}
        self.model = params.get("model")
        self.block_size = None
        self.start = None
        self.deadline = None
        self.results = {"requests": 0, "exact": 0, "largest_error": 0, "mismatches": [], "restart_misses": 0, "restart_miss_steps": []}
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
            "restart_misses": res["restart_misses"],
            "restart_miss_steps": list(res["restart_miss_steps"]),
            "restarted_engines": self.restarted_engines(),
            "restart_warning": restart_warning(self.restarted_engines()),
            "steps": self.steps_done,
            "workload_kinds": dict(self.kinds),
            "engines": dict((e.name, e.facts(self.index, self.uncounted)) for e in self.engines) if self.index else {},
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

    def restarted_engines(self):
        """Names of the engines whose KV-event sequence started again during the check, sorted."""
        return sorted(e.name for e in self.engines if e.restarts)

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

    # -- validation -----------------------------------------------------------------------
    def validate(self):
        """Check the options against ``OPTIONS`` and give each engine its name; returns the engines' specs."""
        specs = self.named_engines()
        self.steps = build_workload([s["name"] for s in specs], self.params["workload"])
        return specs

    def named_engines(self):
        """Check the options against the check's table (``options``) and name each engine; returns the engines' specs."""
        try:
            self.params = validate(self.options, self.params)
        except CheckError as exc:
            self.fail(exc.msg)
        specs = []
        for raw in self.params["engines"]:
            spec = dict(raw, topic=raw["topic"] or "")
            spec["name"] = spec["name"] or topic_pod(spec["topic"]) or spec["url"].split("//", 1)[1].rstrip("/")
            if spec["name"] in [s["name"] for s in specs]:
                self.fail("Two engines are named %r; give each a distinct name (or topic)." % spec["name"])
            specs.append(spec)
        return specs

    # -- HTTP -----------------------------------------------------------------------------
    def _client(self, spec):
        base = spec["url"].rstrip("/")
        if base.endswith("/v1"):
            base = base[:-3]
        return self.client_class(base, timeout=self.params["request_timeout"], **client_options(spec))

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
        body = {"model": self.model, "prompt": prompt, "max_tokens": self.params["max_tokens"], "temperature": 0}
        try:
            answer = engine.client.post_json("/v1/completions", body)
        except OpenAIHTTPError as exc:
            self.fail("A request to engine %s failed: %s." % (engine.name, str(exc).rstrip(".")))
        usage = (answer if isinstance(answer, dict) else {}).get("usage") or {}
        return usage.get("prompt_tokens"), cached_tokens(usage)

    # -- events ---------------------------------------------------------------------------
    def open_streams(self):
        for engine in self.engines:
            try:
                self.consumer.open(engine.source)
            except SocketSetupError as exc:
                self.fail("Engine %s: %s" % (engine.name, exc.msg))

    def wait_connected(self):
        deadline = min(self.deadline, self.clock() + max(2 * (self.params["event_wait"] or 5.0), 2.0))
        while self.clock() < deadline and not all(e.source.connected for e in self.engines):
            self.consumer.poll(0.05)
            self.drain()
        missing = [e for e in self.engines if not e.source.connected]
        if missing:
            engine = missing[0]
            self.fail("Engine %s (%s): %s." % (engine.name, engine.source.endpoint, unconnected(engine.source.bind)))

    def catch_up(self):
        """Replay every engine's buffered history from seq 0, so the index starts with what the engine holds."""
        for engine in self.engines:
            if engine.source.replay_endpoint:
                self.replay_into(engine, engine.source.rank, 0, None)

    def replay_into(self, engine, rank, start, end):
        """Apply what the engine's replay endpoint (rank ``rank``'s) holds from ``start`` to ``end`` (None: all), skipping what was applied."""
        state = engine.rank(rank)

        def choose(topic, seq):  # pylint: disable=unused-argument
            if end is not None and seq > end:
                return STOP
            return SKIP if seq <= state["applied"] else TAKE
        error = self.consumer.replay(engine.source, start, self.deadline, choose)
        if error:
            self.malformed(engine, "replay: %s" % error)

    @staticmethod
    def malformed(engine, reason):
        engine.tally.add_malformed(reason)

    def apply(self, engine, batch, state):
        if batch.seq > state["applied"] + 1 and state["applied"] >= 0:
            engine.gaps += 1
        state["applied"] = batch.seq
        engine.batches += 1
        for event in batch.events:
            try:
                self.index.apply(engine.name, event)
                self.uncounted.apply(engine.name, event)
            except ValueError as exc:   # an event the index cannot key (no token ids, no block size)
                self.malformed(engine, "batch %d: %s" % (batch.seq, exc))

    def restarted(self, engine, rank, state, seq):
        """The engine started again (its rank's sequence went back): what the index knew of it is gone."""
        engine.restarts += 1
        if len(engine.restart_log) < MAX_MISMATCHES:
            engine.restart_log.append({"rank": rank, "from": max(state["live"], state["applied"]), "to": seq})
        self.index.cleared(engine.name)
        self.uncounted.cleared(engine.name)
        state.update(live=-1, live_digest=None, applied=-1, replayed={})

    def on_batch(self, batch, payload, live, source):
        """A batch from the consumer: a replayed one is applied; a live one in order, after a restart or a gap repair."""
        engine = self.by_name[source.name]
        rank = source.rank if batch.rank is None else batch.rank
        state = engine.rank(rank)
        seq = batch.seq
        if not live:
            if seq > state["live"]:   # its live copy may still be queued: a live batch under this number with other bytes is a restart's
                state["replayed"][seq] = _digest(payload)
            self.apply(engine, batch, state)
            return
        digest = _digest(payload)
        if seq <= state["live"]:
            if seq == state["live"] and digest == state["live_digest"]:
                return   # the very same message again (not from one ZMQ connection, but never counted twice)
            self.restarted(engine, rank, state, seq)
        elif seq <= state["applied"] and state["replayed"].get(seq, digest) != digest:
            self.restarted(engine, rank, state, seq)   # not the batch replayed under this number: a new run's
        state["live"], state["live_digest"] = seq, digest
        replayed = state["replayed"]
        while replayed:   # replayed in ascending order: what the live stream has passed goes from the front
            first = next(iter(replayed))
            if first > seq:
                break
            del replayed[first]
        if seq <= state["applied"]:
            return   # already applied (backlog after a replay)
        if seq > state["applied"] + 1:
            if source.replay_endpoint and rank == source.rank:
                self.replay_into(engine, rank, state["applied"] + 1, seq - 1)
            if seq > state["applied"] + 1:
                engine.gaps_unrepaired += 1
        self.apply(engine, batch, state)

    def drain(self):
        return self.consumer.drain_all(DRAIN_LIMIT)

    def settle(self, wait_for=None, since=0, until=None):
        """Apply events until every stream was quiet for ``settle`` seconds, once ``wait_for`` sent something (activity above ``since``).

        With ``until`` (a function), what ``wait_for`` sent must also make ``until()`` true: the condition a request's events
        meet, such as the prompt's blocks held; a message from it that the check cannot use (another topic, malformed, a store
        with an unknown parent) ends that wait, since what it lacks will not come. The wait is bounded by ``event_wait``; then,
        where the engine has a replay endpoint, what follows its last applied batch is asked for once (a batch lost on the way
        is still in the engine's replay buffer) before the wait is given up and counted (``event_waits_timed_out``).
        """
        quiet = max(self.params["settle"], 0.0)
        event_wait = self.clock() + max(self.params["event_wait"], 0.0)
        last = self.clock()
        asked_tail = False
        if wait_for is not None:
            batches, unusable = wait_for.batches, self.unusable(wait_for)
        while True:
            now = self.clock()
            if now >= self.deadline:
                self.fail("The check ran out of its %ss timeout after %d requests; raise timeout or shrink the workload." % (
                    self.params.get("timeout"), self.results["requests"]))
            waiting = wait_for is not None and not wait_for.source.stopped and (
                (wait_for.source.activity <= since and wait_for.batches == batches)
                or (until is not None and not until() and self.unusable(wait_for) == unusable))
            if waiting and now >= event_wait:
                if not asked_tail and wait_for.source.replay_endpoint:
                    asked_tail = True
                    self.replay_into(wait_for, wait_for.source.rank, wait_for.rank(wait_for.source.rank)["applied"] + 1, None)
                    last = self.clock()
                    continue
                wait_for.event_waits_timed_out += 1
                waiting = False
                wait_for = None
            if not waiting and now - last >= quiet:
                return
            self.consumer.poll(0.05 if waiting else min(quiet, 0.05))
            if self.drain():
                last = self.clock()

    def unusable(self, engine):
        """How many of the engine's messages the index could not use: other topics, malformed, stores with an unknown parent."""
        blocks = self.index.engines.get(engine.name) if self.index is not None else None
        return engine.tally.malformed + sum(engine.tally.other_topics.values()) + (blocks.stores_skipped if blocks else 0)

    def withhold(self, engine):
        """Stop reading an engine's events (fault injection: a router that stopped hearing it)."""
        self.consumer.stop(engine.source)

    # -- the workload ---------------------------------------------------------------------
    def prepare(self):
        """Validate the options, build the engines and learn their model, block size and KV-cache size."""
        self.start = self.clock()
        specs = self.validate()
        self.deadline = self.start + self.params["timeout"]
        self.engines = [Engine(spec, self._client(spec)) for spec in specs]
        self.by_name = dict((e.name, e) for e in self.engines)
        self.discover()

    @contextlib.contextmanager
    def listening(self):
        """The engines' event streams: open, connected, settled and caught up from the replay buffers; closed after."""
        try:
            self.open_streams()
            self.wait_connected()
            self.settle()
            self.catch_up()
            yield
        finally:
            self.consumer.close()

    def run(self):
        self.prepare()
        with self.listening():
            for step in self.steps:
                self.run_step(step)
            self.settle()
        self.judge()
        return self.facts()

    def run_step(self, step):
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
            if limit is not None and not engine.source.stopped and self.results["requests"] >= limit:
                self.withhold(engine)
            self.settle()
            # Just before the request: what each engine is predicted to hold of this prompt.
            predicted = self.predict(prompt, tokens, approx_hashes)
            if before is None:
                before = predicted   # the moment a router would pick the engine
            since, restarts = engine.source.activity, engine.restarts
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
            # The blocks this request computed are published after it: wait until the engine's events show every full block
            # of the prompt held (a condition, not a time), before judging (a restart shows in these events) and predicting.
            keys = self.index.prompt_keys(tokens[name])
            expect_store = len(keys) * self.block_size > reported
            self.settle(wait_for=engine if expect_store else None, since=since,
                        until=lambda: self.index.lookup(name, keys) >= len(keys))
            approx_tokens = self.approx_tokens(engine, prompt, predicted["approximate"][name], len(tokens[name]))
            self.compare(step, engine, predicted["precise"][name], predicted["uncounted"][name], approx_tokens, reported,
                         len(tokens[name]), restarted=engine.restarts > restarts)
            self.approx.routed(name, approx_hashes)
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
        why = self.explain(engine)
        self.fail("The index predicted %d cached tokens for prompt family %s on engine %s but the engine reported %d "
                  "(request %d, step %d%s)." % (predicted, step.family, engine.name, reported, res["requests"], step.index, why))

    def explain(self, engine):
        """A clause on why an engine's events may be missing (empty when nothing is known)."""
        tally = engine.tally
        if engine.source.stopped:
            return "; the subscription to its events was stopped after %d requests" % engine.spec.get("withhold_after")
        if tally.other_topics and not engine.batches:
            return "; no KV events arrived under its topic prefix %r, but messages arrived under %s" % (
                engine.topic, ", ".join(repr(t) for t in sorted(tally.other_topics)))
        if not engine.batches:
            return "; no KV event arrived from it"
        if engine.gaps_unrepaired:
            return "; a gap in its event stream could not be repaired (%d in all)" % engine.gaps_unrepaired
        if tally.malformed:
            return "; %d of its messages were malformed (%s)" % (tally.malformed, tally.malformed_reason)
        if engine.restarts:
            return "; it restarted in place during the check (its KV-event sequence started again %d times)" % engine.restarts
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
        expect = self.params["expect"]
        requests = self.results["requests"]
        if requests < expect["min_requests"]:
            self.fail("The workload sent %d requests, fewer than expect.min_requests %d; raise workload.families or "
                      "workload.rounds." % (requests, expect["min_requests"]))
        want = expect["min_evictions_per_engine"]
        for engine in self.engines:
            blocks = self.index.engines.get(engine.name)
            removed = blocks.removed_blocks if blocks else 0
            if removed < want:
                self.fail("Engine %s evicted %d blocks (BlockRemoved) during the check, fewer than expect.min_evictions_per_engine "
                          "%d; give it a smaller KV cache or a longer workload." % (engine.name, removed, want))
