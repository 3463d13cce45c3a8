# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""The KV-event stream check behind ``inference_cache.substrate.kv_events_check`` (pure Python, no Ansible).

``KVEventsCheck(params).run()`` returns the facts dict or raises ``CheckFailed(msg, facts)``.
All waiting is bounded by one deadline on a monotonic clock. Every option is checked (types, ranges,
endpoint shapes) before any socket opens, so the module and the CLIs answer bad input with one sentence.

Nothing lost: gaps in the sequence numbers are repaired through the replay endpoint, coalesced into one
request per stream (a replay ROUTER answers a request with everything from the asked sequence number on,
so one request per gap would make a busy engine resend its buffer hundreds of times): once the oldest
unrepaired gap is ``quiet`` seconds old, when the stream goes quiet, and before reporting. The tail of a
burst (batches dropped at the publisher's high-water mark after the last one that arrived) shows no gap,
so when the stream goes quiet with the expectations unmet, and before reporting, the same request also
takes everything after the last sequence number seen on each stream.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import math
import re
import time

from ..epp import decoder as router_decoder
from . import wire as wire
from ..http.args import HTTP_ARG_SPEC, client_options, http_problem
from .args import LIMITS as STREAM_LIMITS
from .events import EVENT_TYPES, KVDecoder, MalformedMessage
from .report import KVStats, batch_json_lines
from .stream import SequenceTracker
from .sockets import SocketSetupError, drain_monitor, offset_endpoint, open_socket, replay, zmq
from ..http.openai import OpenAIClient, OpenAIHTTPError, cached_tokens, model_ids

DEFAULT_EXPECT = {"BlockStored": 1}
DEFAULT_PROMPT = " ".join([
    "The prefix cache of an inference engine keeps the key and value tensors of prompt tokens it has already seen,",
    "so a second request that starts with the same text skips most of the prefill work.",
    "This request exists only to make the engine store a few full blocks and publish the matching KV cache events;",
    "its answer is ignored, and the text is never returned, logged or captured by the check.",
])
# The trigger's connection options are the collection's HTTP options (auth, TLS, proxy, body limit: _http_args),
# the same names as prefix_cache_check's.
TRIGGER_SPEC = dict(HTTP_ARG_SPEC, **{
    "url": {"type": "str", "required": True},
    "model": {"type": "str"},
    "prompt": {"type": "str"},
    "max_tokens": {"type": "int", "default": 1, "no_log": False},
    "headers": {"type": "dict", "default": {}},
    "delay": {"type": "float", "default": 0.5},
})
# Inclusive numeric ranges (low, high, integer?) of the check's own options; STREAM_LIMITS has the stream's.
LIMITS = dict(STREAM_LIMITS, **{
    "settle": (0.0, 3600.0, False),
    "trigger.max_tokens": (1, 1000000, True),
    "trigger.delay": (0.0, 3600.0, False),
})
MAX_EXPECT = 1000000000
ENDPOINT_RE = re.compile(r"^(tcp|ipc|inproc)://\S+$")
URL_RE = re.compile(r"^https?://[^\s/]+", re.IGNORECASE)
TAIL_IDLE = 2.0  # seconds a replay endpoint may stay silent before a replay request is given up
CHECK_ARG_SPEC = {
    "expect": {"type": "dict", "default": DEFAULT_EXPECT},
    "expect_removed_after_stored": {"type": "bool", "default": False},
    "settle": {"type": "float", "default": 1.0},
    "trigger": {"type": "dict", "options": TRIGGER_SPEC},
    "capture_path": {"type": "path"},
    "include_token_ids": {"type": "bool", "default": False},
    "router_version": {"type": "str", "default": "v0.9.0", "choices": list(router_decoder.VERSIONS) + ["none"]},
    "expect_router_decodes": {"type": "bool", "default": False},
}
# Batches held against the router's decoder (the first ones of the check; each costs one more msgpack decode).
ROUTER_CHECK_BATCHES = 1000


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
    client = client_class(base, timeout=timeout, headers=trigger.get("headers"), **client_options(trigger))
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
        self.params = params
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
        self.expect = dict(DEFAULT_EXPECT) if expect is None else (dict(expect) if isinstance(expect, dict) else expect)
        self.stream_socket = {}  # stream key -> index of the socket (data-parallel rank) it arrived on
        version = params.get("router_version") or "v0.9.0"
        self.router = {"router_version": version, "decoder": router_decoder.DECODERS.get(version, {}).get("decoder"),
                       "checked_batches": 0, "refused_batches": 0, "first_problem": None}
        self.gap_since = None  # when the oldest gap not yet asked for appeared

    # -- facts ----------------------------------------------------------------------------
    def facts(self):
        facts = self.stats.facts()
        facts.update(self.seqs.facts())
        facts["trigger"] = dict(self.trigger)
        facts["backlog_batches"] = self.backlog_batches
        facts["elapsed"] = round(self.clock() - self.start, 3) if self.start is not None else 0.0
        try:
            facts["endpoints"] = self.endpoints()
        except (ValueError, TypeError, AttributeError):
            facts["endpoints"] = [self.params.get("endpoint")]
        facts["peer_connected"] = list(self.connected)
        facts["router_decoder"] = dict(self.router)
        facts["changed"] = False
        return facts

    def fail(self, msg):
        raise CheckFailed(msg, self.facts())

    def dp_size(self):
        size = self.params.get("data_parallel_size")
        return size if isinstance(size, int) and not isinstance(size, bool) and 1 <= size <= LIMITS["data_parallel_size"][1] else 1

    def endpoints(self):
        return [offset_endpoint(self.params["endpoint"], rank) for rank in range(self.dp_size())]

    # -- validation -----------------------------------------------------------------------
    def _number(self, name, value):
        """Check an option against LIMITS; returns the number. Fails with one sentence."""
        low, high, integer = LIMITS[name]
        kind = "an integer" if integer else "a number"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail("%s must be %s between %s and %s, got %r." % (name, kind, low, high, value))
        if not math.isfinite(value) or (integer and value != int(value)):
            self.fail("%s must be %s between %s and %s, got %r." % (name, kind, low, high, value))
        if name == "timeout" and value <= 0:
            self.fail("timeout must be a positive number of seconds (at most %s), got %r." % (high, value))
        if not low <= value <= high:
            self.fail("%s must be between %s and %s, got %r." % (name, low, high, value))
        return int(value) if integer else float(value)

    def _endpoint(self, name, value):
        if not isinstance(value, str) or not ENDPOINT_RE.match(value):
            self.fail("%s must be a ZMQ endpoint such as tcp://HOST:PORT, ipc:///PATH or inproc://NAME, got %r." % (name, value))

    def _choice(self, name, value, choices):
        if value not in choices:
            self.fail("%s must be one of %s, got %r." % (name, ", ".join(choices), value))

    def validate(self):
        params = self.params
        self._endpoint("endpoint", params.get("endpoint"))
        if params.get("replay_endpoint") is not None:
            self._endpoint("replay_endpoint", params["replay_endpoint"])
        self._choice("socket_mode", params.get("socket_mode") or "connect", ("connect", "bind"))
        self._choice("engine", params.get("engine") or "auto", ("auto", "vllm", "sglang"))
        if not isinstance(params.get("topic") or "", str):
            self.fail("topic must be a string, got %r." % (params["topic"],))
        for name in ("data_parallel_size", "timeout", "settle"):
            if params.get(name) is not None:
                self._number(name, params[name])
        self._choice("router_version", params.get("router_version") or "v0.9.0", router_decoder.VERSIONS + ("none",))
        if params.get("expect_router_decodes") and params.get("router_version") == "none":
            self.fail("expect_router_decodes needs a router_version to hold the events against, not none.")
        for name in ("include_token_ids", "expect_removed_after_stored", "expect_router_decodes"):
            if params.get(name) is not None and not isinstance(params[name], bool):
                self.fail("%s must be true or false, got %r." % (name, params[name]))
        if params.get("capture_path") is not None and not isinstance(params["capture_path"], str):
            self.fail("capture_path must be a path, got %r." % (params["capture_path"],))
        self._validate_expect()
        self._validate_trigger(params.get("trigger"))
        try:
            self.endpoints()
            if params.get("replay_endpoint"):
                offset_endpoint(params["replay_endpoint"], self.dp_size() - 1)
        except ValueError as exc:
            self.fail("%s." % str(exc).capitalize())

    def _validate_expect(self):
        if not isinstance(self.expect, dict):
            self.fail("expect must be a mapping of event type to minimum count, such as {BlockStored: 1}, got %r." % (self.expect,))
        for name, value in list(self.expect.items()):
            if name not in EVENT_TYPES:
                self.fail("expect names an unknown event type %r; use %s." % (name, ", ".join(EVENT_TYPES)))
            number = value
            if isinstance(value, str) and value.strip().isdigit():
                number = int(value)
            if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number <= MAX_EXPECT:
                self.fail("expect.%s must be a non-negative integer (at most %d), got %r." % (name, MAX_EXPECT, value))
            self.expect[name] = number

    def _validate_trigger(self, trigger):
        if trigger is None:
            return
        if not isinstance(trigger, dict):
            self.fail("trigger must be a mapping with at least a url, got %r." % (trigger,))
        url = trigger.get("url")
        if not isinstance(url, str) or not URL_RE.match(url):
            self.fail("trigger.url must be an http:// or https:// URL of the OpenAI-compatible server, got %r." % (url,))
        for name in ("model", "prompt"):
            if trigger.get(name) is not None and not isinstance(trigger[name], str):
                self.fail("trigger.%s must be a string." % name)
        for name in ("max_tokens", "delay"):
            if trigger.get(name) is not None:
                self._number("trigger." + name, trigger[name])
        problem = http_problem(trigger, "trigger")
        if problem:
            self.fail(problem)
        headers = trigger.get("headers") or {}
        if not isinstance(headers, dict) or not all(
                isinstance(k, str) and isinstance(v, (str, int, float)) and not isinstance(v, bool) for k, v in headers.items()):
            self.fail("trigger.headers must be a mapping of header names to strings.")

    # -- main loop ------------------------------------------------------------------------
    def met(self):
        counts = self.stats.counts
        if not self.stats.batches:
            return False
        if any(counts.get(name, 0) < num for name, num in self.expect.items()):
            return False
        if self.params.get("expect_removed_after_stored") and not self.stats.removed_after_stored:
            return False
        return True

    def run(self):
        self.start = self.clock()
        self.validate()
        timeout = float(self.params.get("timeout") or 30.0)
        deadline = self.start + timeout
        # With a replay endpoint, keep a little time at the end to fetch the tail of each stream.
        reserve = min(TAIL_IDLE, timeout / 10.0) if self.params.get("replay_endpoint") else 0.0
        own_ctx = self.ctx is None
        ctx = zmq.Context() if own_ctx else self.ctx
        socks, mons = [], []
        try:
            bind = self.params.get("socket_mode") == "bind"
            for endpoint in self.endpoints():
                try:
                    sock, mon = open_socket(ctx, zmq.SUB, endpoint, bind, monitor=True)
                except SocketSetupError as exc:
                    self.fail(str(exc))
                socks.append(sock)
                mons.append(mon)
            self.connected = [False] * len(socks)
            self._loop(ctx, socks, mons, deadline - reserve)
            self.catch_up(ctx, deadline, tail=True)
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
        trigger = self.params.get("trigger")
        trigger_pending = bool(trigger)
        delay = float((trigger or {}).get("delay") or 0.0)
        all_connected_at = None
        last_msg = None
        settle = max(float(self.params.get("settle") or 0.0), 0.0)
        quiet = max(settle, 0.5)  # quiet this long with the expectations unmet: fetch the tails
        tail_asked = False
        replay = bool(self.params.get("replay_endpoint"))
        while True:
            now = self.clock()
            if now >= deadline:
                return
            if not trigger_pending and self.met() and (last_msg is None or now - last_msg >= settle):
                return
            if replay and self.gap_since is not None and now - self.gap_since >= quiet:
                self.catch_up(ctx, deadline, tail=False)  # the gaps, not the tail: the stream is still busy
                continue
            if replay and not tail_asked and not trigger_pending and last_msg is not None and now - last_msg >= quiet:
                tail_asked = True  # once per quiet period: a new message re-arms it
                self.catch_up(ctx, deadline, tail=True)
                continue
            events = dict(poller.poll(max(int(min(deadline - now, 0.1) * 1000), 1)))
            for sock in mons:
                if sock in events and drain_monitor(sock):
                    self.connected[mon_index[id(sock)]] = True
            for sock in socks:
                if sock in events:
                    if self._drain(ctx, sock, index[id(sock)], deadline):
                        last_msg = self.clock()
                        tail_asked = False
            now = self.clock()
            if all_connected_at is None and all(self.connected):
                all_connected_at = now
            if trigger_pending and all_connected_at is not None and now - all_connected_at >= delay:
                trigger_pending = False
                if self.params.get("socket_mode") == "bind":
                    # An engine that connects queues its events while nobody is bound and delivers that backlog
                    # as soon as we bind; count only what arrives once the trigger is on its way.
                    self.backlog_batches = self.stats.begin_window()
                try:
                    self.trigger = send_trigger(trigger, max(deadline - now, 0.1), self.client_class)
                except CheckFailed as exc:
                    self.trigger = exc.facts["trigger"]
                    self.fail(exc.msg)
                last_msg = self.clock()

    def _drain(self, ctx, sock, sock_rank, deadline):  # pylint: disable=unused-argument
        got = False
        topic_prefix = self.params.get("topic") or ""
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
            if not self.stats.accepts_topic(batch.topic):
                self.stats.add_malformed("a message arrived under more than %d distinct topics" % self.stats.max_topics)
                continue
            rank = sock_rank if batch.rank is None else batch.rank
            state, gap = self.seqs.observe(batch.topic, rank, batch.seq)
            if state == "duplicate":
                continue
            if state == "overflow":
                self.stats.add_malformed("a message arrived on more than %d distinct streams" % self.seqs.max_streams)
                continue
            self.stream_socket.setdefault(self.seqs.key(batch.topic, rank), sock_rank)
            self.add(batch, frames[-1])
            if gap is not None and self.gap_since is None:
                self.gap_since = self.clock()
        return got

    def add(self, batch, payload=None):
        self.stats.add_batch(batch)
        self.hold_against_router(batch, payload)
        if self.params.get("capture_path"):
            self.capture.extend(batch_json_lines(batch, bool(self.params.get("include_token_ids"))))

    def _decode_replayed(self, payload, topic, seq):
        try:
            batch = self.decoder.decode_payload(payload, topic, seq)
        except MalformedMessage as exc:
            self.stats.add_malformed("replayed batch %d: %s" % (seq, exc))
            return
        self.add(batch, payload)

    def hold_against_router(self, batch, payload):
        """Would the router's KV-event decoder (router_version) take this batch? Counted, first problem kept."""
        router = self.router
        if payload is None or router["decoder"] is None or router["checked_batches"] >= ROUTER_CHECK_BATCHES:
            return
        try:
            found = router_decoder.problems(wire.GENERIC_DECODER.decode(payload), router["router_version"])
        except (wire.DecodeError, ValueError, TypeError, RecursionError):
            return  # not msgpack at all: the decoder above already said so
        router["checked_batches"] += 1
        if found:
            router["refused_batches"] += 1
            if router["first_problem"] is None:
                router["first_problem"] = "batch %d on topic %r: %s" % (batch.seq, batch.topic, found[0])

    def catch_up(self, ctx, deadline, tail=True):
        """Repair every open gap, and with ``tail`` fetch what follows the last batch seen, one request per stream.

        A replay endpoint answers with everything it holds from the asked sequence number on, so one request from the
        oldest missing batch covers all the gaps of a stream and its tail. Whatever the endpoint dropped on the way
        (its own high-water mark) is asked for again, from the oldest batch still missing, while that makes progress.
        """
        self.gap_since = None
        if not self.params.get("replay_endpoint"):
            return
        deadline = max(deadline, self.clock() + 0.1)
        for key in list(self.seqs.streams):
            gaps = [g for g in self.seqs.gaps if g["stream"] == key and not g["repaired"] and not g.get("tail")]
            wanted = set()
            for gap in gaps:
                wanted.update(range(gap["start"], gap["end"] + 1))
            if not wanted and not tail:
                continue
            tail_seen = set()
            error = None
            for _round in range(3):
                before = len(wanted)
                start = min(wanted) if wanted else self.seqs.tail_start(key)
                error = self._replay_stream(ctx, key, start, wanted, tail_seen if tail else None, deadline)
                if error or not wanted or len(wanted) == before or self.clock() >= deadline:
                    break
            for gap in gaps:
                gap["still_missing"] = sum(1 for seq in range(gap["start"], gap["end"] + 1) if seq in wanted)
                gap["repaired"] = not gap["still_missing"]
                if error and not gap["repaired"]:
                    gap["error"] = error
            if tail:
                self.seqs.record_tail(key, tail_seen)

    def _replay_stream(self, ctx, key, start, wanted, tail_seen, deadline):
        """One replay request for stream ``key`` from ``start``: take the ``wanted`` batches, and the tail if asked.

        Returns a one-sentence reason when the replay endpoint cannot be asked, else None.
        """
        stream = self.seqs.streams[key]
        endpoint = offset_endpoint(self.params["replay_endpoint"], self.stream_socket.get(key, 0))
        last = stream["last"]
        try:
            for topic, seq, payload in replay(ctx, endpoint, start, deadline, idle=TAIL_IDLE, clock=self.clock):
                if topic is not None and topic != stream["topic"]:
                    continue
                if seq in wanted:
                    wanted.discard(seq)
                elif tail_seen is not None and seq > last and seq not in tail_seen:
                    tail_seen.add(seq)
                else:
                    continue
                self._decode_replayed(payload, stream["topic"], seq)
                if tail_seen is None and not wanted:
                    break  # every gap filled and the tail not asked for
        except SocketSetupError as exc:
            return str(exc)
        except MalformedMessage as exc:
            self.stats.add_malformed("replay for stream %s: %s" % (key, exc))
        return None

    # -- verdict --------------------------------------------------------------------------
    def judge(self):
        stats = self.stats
        timeout = float(self.params.get("timeout") or 30.0)
        where = ", ".join(self.endpoints())
        bind = self.params.get("socket_mode") == "bind"
        if not stats.batches and not stats.malformed:
            if stats.other_topics:
                others = ", ".join(repr(t) for t in sorted(stats.other_topics))
                self.fail("No KV events under topic prefix %r arrived on %s within %ss, but messages arrived under topic %s; set topic "
                          "to match the engine's kv-events topic." % (self.params.get("topic") or "", where, timeout, others))
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
            how = ("replay from %s could not supply them%s" % (self.params["replay_endpoint"], " (%s)" % first["error"] if first.get("error") else "")
                   if self.params.get("replay_endpoint") else "set replay_endpoint to repair gaps through the engine's replay buffer")
            self.fail("%s left %s missing (first in stream %s, seq %d-%d); %s." % (
                _plural(len(unrepaired), "sequence gap"), _plural(missing, "batch"), first["stream"], first["start"], first["end"], how))
        if not self.met():
            short = ["%s %d/%d" % (n, stats.counts.get(n, 0), k) for n, k in sorted(self.expect.items()) if stats.counts.get(n, 0) < k]
            if self.params.get("expect_removed_after_stored") and not stats.removed_after_stored:
                short.append("no BlockRemoved for a block stored during the check")
            self.fail("Expectations not met within %ss (%s received): %s." % (timeout, _plural(stats.batches, "batch"), "; ".join(short)))
        router = self.router
        if self.params.get("expect_router_decodes") and router["refused_batches"]:
            self.fail("The llm-d router %s would drop %d of the %s checked (its KV-event decoder, %s, refuses them, so its "
                      "prefix index never sees those blocks); first: %s." % (
                          router["router_version"], router["refused_batches"], _plural(router["checked_batches"], "batch"),
                          router["decoder"], router["first_problem"]))

    def write_capture(self):
        path = self.params.get("capture_path")
        if not path or self.check_mode:
            return
        try:
            with open(path, "w") as handle:
                for line in self.capture:
                    handle.write(line + "\n")
        except (IOError, OSError) as exc:
            self.fail("Cannot write capture_path %s: %s." % (path, exc.strerror or exc))
