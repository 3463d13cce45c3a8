# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""The KV-event stream check behind ``inference_cache.substrate.kv_events_check`` (pure Python, no Ansible).

``KVEventsCheck(params).run()`` returns the facts dict or raises ``CheckFailed(msg, facts)``.
All waiting is bounded by one deadline on a monotonic clock.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import time

from ._kv_events import EVENT_TYPES, KVDecoder, KVStats, MalformedMessage, SequenceTracker, batch_json_lines, offset_endpoint
from ._kv_zmq import SocketSetupError, drain_monitor, open_socket, replay, zmq
from ._openai_http import OpenAIClient, OpenAIHTTPError, cached_tokens, model_ids

DEFAULT_EXPECT = {"BlockStored": 1}
DEFAULT_PROMPT = " ".join([
    "The prefix cache of an inference engine keeps the key and value tensors of prompt tokens it has already seen,",
    "so a second request that starts with the same text skips most of the prefill work.",
    "This request exists only to make the engine store a few full blocks and publish the matching KV cache events;",
    "its answer is ignored, and the text is never returned, logged or captured by the check.",
])
TRIGGER_SPEC = {
    "url": {"type": "str", "required": True},
    "model": {"type": "str"},
    "prompt": {"type": "str"},
    "max_tokens": {"type": "int", "default": 1, "no_log": False},
    "api_key": {"type": "str", "no_log": True},
    "headers": {"type": "dict", "default": {}},
    "delay": {"type": "float", "default": 0.5},
}
CHECK_ARG_SPEC = {
    "expect": {"type": "dict", "default": DEFAULT_EXPECT},
    "expect_removed_after_stored": {"type": "bool", "default": False},
    "settle": {"type": "float", "default": 1.0},
    "trigger": {"type": "dict", "options": TRIGGER_SPEC},
    "capture_path": {"type": "path"},
    "include_token_ids": {"type": "bool", "default": False},
}


class CheckFailed(Exception):
    def __init__(self, msg, facts=None):
        super(CheckFailed, self).__init__(msg)
        self.msg = msg
        self.facts = facts or {}


def _plural(num, word):
    if num == 1:
        return "%d %s" % (num, word)
    return "%d %s" % (num, word + ("es" if word.endswith(("s", "ch", "x")) else "s"))


def send_trigger(trigger, timeout, client_class=OpenAIClient):
    """Send one completion request; returns the ``trigger`` facts. Raises CheckFailed on error."""
    base = trigger["url"].rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    client = client_class(base, api_key=trigger.get("api_key"), timeout=timeout, headers=trigger.get("headers"))
    facts = {"sent": True, "url": client.url("/v1/completions"), "status": None, "prompt_tokens": None, "cached_tokens": None,
             "model": None}
    try:
        model = trigger.get("model")
        if not model:
            models = model_ids(client.get_json("/v1/models"))
            if not models:
                raise OpenAIHTTPError("%s lists no model; set the trigger's model" % client.url("/v1/models"))
            model = models[0]
        facts["model"] = model
        body = {"model": model, "prompt": trigger.get("prompt") or DEFAULT_PROMPT, "max_tokens": trigger.get("max_tokens") or 1}
        resp = client.post_json("/v1/completions", body)
    except OpenAIHTTPError as exc:
        facts["status"] = exc.status
        raise CheckFailed("The trigger request failed: %s." % exc, {"trigger": facts})
    facts["status"] = client.last_status
    usage = (resp if isinstance(resp, dict) else {}).get("usage") or {}
    facts["prompt_tokens"] = usage.get("prompt_tokens")
    facts["cached_tokens"] = cached_tokens(usage)
    return facts


class KVEventsCheck:
    """Subscribe, optionally trigger a request, count events, repair gaps, judge expectations."""

    def __init__(self, params, check_mode=False, clock=time.monotonic, client_class=OpenAIClient, ctx=None):
        self.p = params
        self.check_mode = check_mode
        self.clock = clock
        self.client_class = client_class
        self.ctx = ctx
        self.decoder = KVDecoder(params.get("engine") or "auto", bool(params.get("include_token_ids")))
        self.stats = KVStats()
        self.seqs = SequenceTracker()
        self.trigger = {"sent": False, "url": None, "status": None, "prompt_tokens": None, "cached_tokens": None, "model": None}
        self.capture = []
        self.backlog_batches = 0
        self.connected = []
        self.start = None
        expect = params.get("expect")
        self.expect = dict(DEFAULT_EXPECT if expect is None else expect)

    # -- facts ----------------------------------------------------------------------------
    def facts(self):
        facts = self.stats.facts()
        facts.update(self.seqs.facts())
        facts["trigger"] = dict(self.trigger)
        facts["backlog_batches"] = self.backlog_batches
        facts["elapsed"] = round(self.clock() - self.start, 3) if self.start is not None else 0.0
        try:
            facts["endpoints"] = self.endpoints()
        except ValueError:
            facts["endpoints"] = [self.p.get("endpoint")]
        facts["peer_connected"] = list(self.connected)
        facts["changed"] = False
        return facts

    def fail(self, msg):
        raise CheckFailed(msg, self.facts())

    def endpoints(self):
        size = max(int(self.p.get("data_parallel_size") or 1), 1)
        return [offset_endpoint(self.p["endpoint"], rank) for rank in range(size)]

    # -- validation -----------------------------------------------------------------------
    def validate(self):
        for name, value in self.expect.items():
            if name not in EVENT_TYPES:
                self.fail("expect names an unknown event type %r; use %s." % (name, ", ".join(EVENT_TYPES)))
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                try:
                    self.expect[name] = int(value)
                except (TypeError, ValueError):
                    self.fail("expect.%s must be a non-negative integer, got %r." % (name, value))
                if self.expect[name] < 0:
                    self.fail("expect.%s must be a non-negative integer, got %r." % (name, value))
        dp_size = self.p.get("data_parallel_size")
        if dp_size is not None and dp_size < 1:
            self.fail("data_parallel_size must be at least 1.")
        if float(self.p.get("timeout") or 0) <= 0:
            self.fail("timeout must be a positive number of seconds.")
        try:
            self.endpoints()
            if self.p.get("replay_endpoint"):
                offset_endpoint(self.p["replay_endpoint"], max(int(self.p.get("data_parallel_size") or 1), 1) - 1)
        except ValueError as exc:
            self.fail("%s." % str(exc).capitalize())

    # -- main loop ------------------------------------------------------------------------
    def met(self):
        counts = self.stats.counts
        if not self.stats.batches:
            return False
        if any(counts.get(name, 0) < num for name, num in self.expect.items()):
            return False
        if self.p.get("expect_removed_after_stored") and not self.stats.removed_after_stored:
            return False
        return True

    def run(self):
        self.start = self.clock()
        self.validate()
        timeout = float(self.p.get("timeout") or 30.0)
        deadline = self.start + timeout
        own_ctx = self.ctx is None
        ctx = zmq.Context() if own_ctx else self.ctx
        socks, mons = [], []
        try:
            bind = self.p.get("socket_mode") == "bind"
            for endpoint in self.endpoints():
                try:
                    sock, mon = open_socket(ctx, zmq.SUB, endpoint, bind, monitor=True)
                except SocketSetupError as exc:
                    self.fail(str(exc))
                socks.append(sock)
                mons.append(mon)
            self.connected = [False] * len(socks)
            self._loop(ctx, socks, mons, deadline)
        finally:
            for sock in socks:
                try:
                    sock.disable_monitor()
                except Exception:  # pylint: disable=broad-except
                    pass
                sock.close(0)
            for mon in mons:
                mon.close(0)
            if own_ctx:
                ctx.term()
        self.write_capture()
        self.judge()
        return self.facts()

    def _loop(self, ctx, socks, mons, deadline):
        poller = zmq.Poller()
        for sock in socks + mons:
            poller.register(sock, zmq.POLLIN)
        index = dict((id(s), i) for i, s in enumerate(socks))
        mon_index = dict((id(m), i) for i, m in enumerate(mons))
        trigger = self.p.get("trigger")
        trigger_pending = bool(trigger)
        delay = float((trigger or {}).get("delay") or 0.0)
        all_connected_at = None
        last_msg = None
        settle = max(float(self.p.get("settle") or 0.0), 0.0)
        while True:
            now = self.clock()
            if now >= deadline:
                return
            if not trigger_pending and self.met() and (last_msg is None or now - last_msg >= settle):
                return
            events = dict(poller.poll(max(int(min(deadline - now, 0.1) * 1000), 1)))
            for sock in mons:
                if sock in events and drain_monitor(sock):
                    self.connected[mon_index[id(sock)]] = True
            for sock in socks:
                if sock in events:
                    if self._drain(ctx, sock, index[id(sock)], deadline):
                        last_msg = self.clock()
            now = self.clock()
            if all_connected_at is None and all(self.connected):
                all_connected_at = now
            if trigger_pending and all_connected_at is not None and now - all_connected_at >= delay:
                trigger_pending = False
                if self.p.get("socket_mode") == "bind":
                    # An engine that connects queues its events while nobody is bound and delivers that backlog
                    # as soon as we bind; count only what arrives once the trigger is on its way.
                    self.backlog_batches = self.stats.begin_window()
                try:
                    self.trigger = send_trigger(trigger, max(deadline - now, 0.1), self.client_class)
                except CheckFailed as exc:
                    self.trigger = exc.facts["trigger"]
                    self.fail(exc.msg)
                last_msg = self.clock()

    def _drain(self, ctx, sock, sock_rank, deadline):
        got = False
        topic_prefix = self.p.get("topic") or ""
        for _i in range(1000):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                break
            got = True
            self.connected[sock_rank] = True
            if frames and not frames[0].decode("utf-8", "replace").startswith(topic_prefix):
                self.stats.add_other_topic(frames[0].decode("utf-8", "replace"))
                continue
            try:
                batch = self.decoder.decode_frames(frames)
            except MalformedMessage as exc:
                self.stats.add_malformed(str(exc))
                continue
            rank = sock_rank if batch.rank is None else batch.rank
            state, gap = self.seqs.observe(batch.topic, rank, batch.seq)
            if state == "duplicate":
                continue
            self.add(batch)
            if gap is not None and self.p.get("replay_endpoint"):
                self.repair(ctx, gap, sock_rank, deadline)
        return got

    def add(self, batch):
        self.stats.add_batch(batch)
        if self.p.get("capture_path"):
            self.capture.extend(batch_json_lines(batch, bool(self.p.get("include_token_ids"))))

    def repair(self, ctx, gap, sock_rank, deadline):
        endpoint = offset_endpoint(self.p["replay_endpoint"], sock_rank)
        wanted = set(range(gap["start"], gap["end"] + 1))
        try:
            for _topic, seq, payload in replay(ctx, endpoint, gap["start"], deadline, clock=self.clock):
                if seq not in wanted:
                    continue
                wanted.discard(seq)
                try:
                    batch = self.decoder.decode_payload(payload, gap["topic"], seq)
                except MalformedMessage as exc:
                    self.stats.add_malformed("replayed batch %d: %s" % (seq, exc))
                    continue
                self.add(batch)
                if not wanted:
                    break
        except SocketSetupError as exc:
            gap["error"] = str(exc)
        except MalformedMessage as exc:
            gap["error"] = str(exc)
            self.stats.add_malformed("replay: %s" % exc)
        gap["repaired"] = not wanted
        gap["still_missing"] = len(wanted)

    # -- verdict --------------------------------------------------------------------------
    def judge(self):
        stats = self.stats
        timeout = float(self.p.get("timeout") or 30.0)
        where = ", ".join(self.endpoints())
        bind = self.p.get("socket_mode") == "bind"
        if not stats.batches and not stats.malformed:
            if stats.other_topics:
                others = ", ".join(repr(t) for t in sorted(stats.other_topics))
                self.fail("No KV events under topic prefix %r arrived on %s within %ss, but messages arrived under topic %s; set topic "
                          "to match the engine's kv-events topic." % (self.p.get("topic") or "", where, timeout, others))
            if not any(self.connected):
                if bind:
                    self.fail("No KV events received on %s within %ss: no publisher connected; the engine must connect to this address "
                              "(vLLM connects when its endpoint has no '*'), or, if the engine binds (tcp://*:PORT), set "
                              "socket_mode=connect." % (where, timeout))
                self.fail("No KV events received from %s within %ss: the connection never completed, so nothing is bound there; the engine "
                          "must bind (vLLM binds only endpoints with '*', e.g. tcp://*:5557), or, if it connects, set socket_mode=bind."
                          % (where, timeout))
            self.fail("No KV events received on %s within %ss although a publisher connected; check that the engine runs with "
                      "enable_kv_cache_events and publisher zmq and that a request reached it (see the trigger option)." % (where, timeout))
        if stats.malformed:
            self.fail("%s of %s received were malformed; first: %s." % (
                _plural(stats.malformed, "message or event"), _plural(stats.batches + stats.malformed, "message"),
                stats.malformed_reason))
        unrepaired = [g for g in self.seqs.gaps if not g["repaired"]]
        if unrepaired:
            missing = sum(g.get("still_missing", g["missing"]) for g in unrepaired)
            first = unrepaired[0]
            how = ("replay from %s could not supply them%s" % (self.p["replay_endpoint"], " (%s)" % first["error"] if first.get("error") else "")
                   if self.p.get("replay_endpoint") else "set replay_endpoint to repair gaps through the engine's replay buffer")
            self.fail("%s left %s missing (first in stream %s, seq %d-%d); %s." % (
                _plural(len(unrepaired), "sequence gap"), _plural(missing, "batch"), first["stream"], first["start"], first["end"], how))
        if not self.met():
            short = ["%s %d/%d" % (n, stats.counts.get(n, 0), k) for n, k in sorted(self.expect.items()) if stats.counts.get(n, 0) < k]
            if self.p.get("expect_removed_after_stored") and not stats.removed_after_stored:
                short.append("no BlockRemoved for a block stored during the check")
            self.fail("Expectations not met within %ss (%s received): %s." % (timeout, _plural(stats.batches, "batch"), "; ".join(short)))

    def write_capture(self):
        path = self.p.get("capture_path")
        if not path or self.check_mode:
            return
        try:
            with open(path, "w") as handle:
                for line in self.capture:
                    handle.write(line + "\n")
        except (IOError, OSError) as exc:
            self.fail("Cannot write capture_path %s: %s." % (path, exc.strerror or exc))
