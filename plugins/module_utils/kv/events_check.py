# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""The KV-event stream check behind ``inference_cache.substrate.kv_events_check`` (pure Python, no Ansible).

``KVEventsCheck(params).run()`` returns the facts dict or raises ``CheckError(msg, facts)``. All waiting is bounded
by one deadline on a monotonic clock. Every option is checked against the option table ``OPTIONS`` (types, ranges,
endpoint shapes) before any socket opens, so the module and the CLIs answer bad input with one sentence.

The stream itself (sockets, topic filter, decoding, sequence numbers, gap and tail repair through the replay
endpoint) is ``kv/consumer.py``'s; this check counts what it hands over, sends the trigger and judges. When to
listen, repair gaps, fetch the tails, send the trigger and stop is the table ``TURN`` (and ``AFTER_LISTEN``): gaps
are repaired once the oldest unrepaired one is ``quiet`` seconds old, tails fetched when the stream went quiet with
the expectations unmet, and both once more before reporting.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import time

from ..common.errors import CheckError
from ..common.options import validate
from ..common.wiring import ROUTER_VERSION
from . import router_decoder
from . import wire
from ..http.args import HTTP_ARG_SPEC, client_options, http_problem
from .args import KV_STREAM_ARG_SPEC, URL_SHAPE
from .consumer import MAX_FRAME, TAIL_IDLE, KVConsumer, SocketSetupError, offset_endpoint, rank_sources, unconnected
from .events import EVENT_TYPES, KVDecoder
from .report import KVStats, batch_json_lines
from .stream import SequenceTracker
from ..http.openai import OpenAIClient, OpenAIHTTPError, cached_tokens, model_ids


DEFAULT_EXPECT = {"BlockStored": 1}
DEFAULT_PROMPT = " ".join([
    "The prefix cache of an inference engine keeps the key and value tensors of prompt tokens it has already seen,",
    "so a second request that starts with the same text skips most of the prefill work.",
    "This request exists only to make the engine store a few full blocks and publish the matching KV cache events;",
    "its answer is ignored, and the text is never returned, logged or captured by the check.",
])
MAX_EXPECT = 1000000000
# The trigger facts before a trigger is sent (each check, and each window of one: next_window).
UNSENT_TRIGGER = {"sent": False, "url": None, "status": None, "prompt_tokens": None, "cached_tokens": None, "model": None}
# Batches held against the router's decoder (the first ones of the check; each costs one more msgpack decode).
ROUTER_CHECK_BATCHES = 1000
# Where events are set aside at the trigger (bind mode, windows), the trigger also waits until the stream was quiet for
# its delay: a connecting engine's backlog (up to its send high-water mark, thousands of batches after busy traffic)
# arrives over more than the delay, and what came after the trigger would count as the request's. At most this long
# more: an engine publishing for other clients all along is never quiet.
BACKLOG_WAIT = 2.0


def _expect_problem(expect, name):
    for event, value in expect.items():
        if event not in EVENT_TYPES:
            return "%s names an unknown event type %r; use %s." % (name, event, ", ".join(EVENT_TYPES))
        number = int(value) if isinstance(value, str) and value.strip().isdigit() else value
        if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number <= MAX_EXPECT:
            return "%s.%s must be a non-negative integer (at most %d), got %r." % (name, event, MAX_EXPECT, value)
    return None


def _headers_problem(headers, name):
    if not all(isinstance(k, str) and isinstance(v, (str, int, float)) and not isinstance(v, bool) for k, v in headers.items()):
        return "%s must be a mapping of header names to strings." % name
    return None


# The trigger's connection options are the collection's HTTP options (auth, TLS, proxy, body limit: http/args.py),
# the same names as prefix_cache_check's.
TRIGGER_SPEC = dict(HTTP_ARG_SPEC, **{
    "url": {"type": "str", "required": True, "shape": URL_SHAPE},
    "model": {"type": "str"},
    "prompt": {"type": "str"},
    "max_tokens": {"type": "int", "default": 1, "no_log": False, "range": (1, 1000000)},
    "headers": {"type": "dict", "default": {}, "check": _headers_problem},
    "delay": {"type": "float", "default": 0.5, "range": (0, 3600)},
})
CHECK_ARG_SPEC = {
    "expect": {"type": "dict", "default": DEFAULT_EXPECT, "check": _expect_problem},
    "expect_removed_after_stored": {"type": "bool", "default": False},
    "settle": {"type": "float", "default": 1.0, "range": (0, 3600)},
    "trigger": {"type": "dict", "options": TRIGGER_SPEC, "check": http_problem},
    "capture_path": {"type": "path"},
    "include_token_ids": {"type": "bool", "default": False},
    "router_version": {"type": "str", "default": ROUTER_VERSION, "choices": list(router_decoder.VERSIONS) + ["none"]},
    "expect_router_decodes": {"type": "bool", "default": False},
}
# The check's one option table: the stream's options (documented by the kv_events doc fragment) and its own.
OPTIONS = dict(KV_STREAM_ARG_SPEC, **CHECK_ARG_SPEC)


def _plural(num, word):
    if num == 1:
        return "%d %s" % (num, word)
    return "%d %s" % (num, word + ("es" if word.endswith(("s", "ch", "x")) else "s"))


def send_trigger(trigger, timeout, client_class=OpenAIClient):
    """Send one completion request; returns the ``trigger`` facts. Raises CheckError on error."""
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
        raise CheckError("The trigger request failed: %s." % exc, {"trigger": facts})
    facts["status"] = client.last_status
    usage = (resp if isinstance(resp, dict) else {}).get("usage") or {}
    facts["prompt_tokens"] = usage.get("prompt_tokens")
    facts["cached_tokens"] = cached_tokens(usage)
    return facts


class LoopClock:
    """The loop's timing state (monotonic seconds): the deadline, the quiet periods, what is still to do."""

    def __init__(self, params, deadline):
        self.deadline = deadline
        self.settle = params["settle"]
        self.quiet = max(self.settle, 0.5)  # quiet this long with the expectations unmet: fetch the tails
        self.delay = params["trigger"]["delay"] if params["trigger"] else 0.0
        self.replay = bool(params["replay_endpoint"])
        self.trigger_pending = bool(params["trigger"])
        self.connected_at = None  # when every socket had its peer
        self.last_msg = None  # when the last message arrived (or the trigger was sent)
        self.tail_asked = False  # once per quiet period: a new message re-arms it

    def silent(self, now):
        """Seconds since the last message (forever before the first)."""
        return float("inf") if self.last_msg is None else now - self.last_msg

    def quiet_since(self, when, now):
        """Whether ``when`` happened and is at least ``quiet`` seconds ago."""
        return when is not None and now - when >= self.quiet


# The loop's timing, one rule a line: (condition on the check k, its LoopClock t and the time now, action).
# At the top of every turn the first rule whose condition holds acts, then the turn starts again ("stop" ends the loop).
TURN = (
    (lambda k, t, now: now >= t.deadline, "stop"),
    (lambda k, t, now: not t.trigger_pending and k.met() and t.silent(now) >= t.settle, "stop"),
    (lambda k, t, now: t.replay and t.quiet_since(k.consumer.gap_since, now), "repair_gaps"),
    (lambda k, t, now: t.replay and not t.tail_asked and not t.trigger_pending and t.quiet_since(t.last_msg, now), "fetch_tails"),
    (lambda k, t, now: True, "listen"),
)
# After each "listen" (now read again), every rule whose condition holds acts, in this order.
AFTER_LISTEN = (
    (lambda k, t, now: t.connected_at is None and all(s.connected for s in k.streams), "note_connected"),
    (lambda k, t, now: t.trigger_pending and t.connected_at is not None and now - t.connected_at >= t.delay
     and (not k.sets_backlog_aside() or t.silent(now) >= t.delay or now - t.connected_at >= t.delay + BACKLOG_WAIT), "send_trigger"),
)


class KVEventsCheck:
    """Subscribe, optionally trigger a request, count events, repair gaps, judge expectations.

    ``on_batch(batch, payload, live, source)`` is called with every batch counted (the subscriber CLI prints them);
    ``enough()``, when given, says when enough arrived instead of the expectations. ``send(seconds_left)``, when given,
    is the trigger: another check's own request, sent when the trigger option's would be (its ``delay`` after the
    subscription connected); it returns the trigger facts, and what it raises goes through unchanged.
    """

    def __init__(self, params, check_mode=False, clock=time.monotonic, client_class=OpenAIClient, ctx=None, on_batch=None,
                 enough=None, max_frame=MAX_FRAME, send=None):
        self.params = params
        self.send = send
        self.windowed = False  # a later window on streams already open (next_window)
        self.connected_since = None  # when every stream first had its peer (a later window sends at once)
        self.check_mode = check_mode
        self.clock = clock
        self.client_class = client_class
        self.on_batch = on_batch
        self.enough = enough
        self.stats = KVStats()
        self.seqs = SequenceTracker()
        decoder = KVDecoder(params.get("engine") or "auto", bool(params.get("include_token_ids")))
        self.consumer = KVConsumer(decoder, self.add, tracker=self.seqs, clock=clock, ctx=ctx, max_frame=max_frame)
        self.streams = []  # the sources, one per data-parallel rank, once all are open
        self.trigger = dict(UNSENT_TRIGGER)
        self.capture = []
        self.backlog_batches = 0
        self.start = None
        self.expect = dict(DEFAULT_EXPECT)
        version = params.get("router_version") or ROUTER_VERSION
        self.router = {"router_version": version, "decoder": router_decoder.DECODERS.get(version, {}).get("decoder"),
                       "checked_batches": 0, "refused_batches": 0, "first_problem": None}

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
        facts["peer_connected"] = [s.connected for s in self.streams]
        facts["router_decoder"] = dict(self.router)
        facts["changed"] = False
        return facts

    def fail(self, msg):
        raise CheckError(msg, self.facts())

    def dp_size(self):
        size = self.params.get("data_parallel_size")
        high = OPTIONS["data_parallel_size"]["range"][1]
        return size if isinstance(size, int) and not isinstance(size, bool) and 1 <= size <= high else 1

    def endpoints(self):
        return [offset_endpoint(self.params.get("endpoint"), rank) for rank in range(self.dp_size())]

    # -- validation -----------------------------------------------------------------------
    def validate(self):
        """Check every option against ``OPTIONS`` and the rules between options; keep the completed options."""
        try:
            params = validate(OPTIONS, self.params)
        except CheckError as exc:
            self.fail(exc.msg)
        self.params = params
        if params["expect_router_decodes"] and params["router_version"] == "none":
            self.fail("expect_router_decodes needs a router_version to hold the events against, not none.")
        try:
            self.endpoints()
            if params["replay_endpoint"]:
                offset_endpoint(params["replay_endpoint"], params["data_parallel_size"] - 1)
        except ValueError as exc:
            self.fail("%s." % str(exc).capitalize())
        self.expect = dict((name, int(value)) for name, value in params["expect"].items())  # "3" from a template is 3

    # -- main loop ------------------------------------------------------------------------
    def met(self):
        if self.enough is not None:
            return self.enough()
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
        try:
            self.open_streams()
            self.listen()
        finally:
            self.consumer.close()
        self.write_capture()
        self.judge()
        return self.facts()

    def open_streams(self):
        params = self.params
        sources = rank_sources(params["endpoint"], params["socket_mode"] == "bind", params["topic"], params["replay_endpoint"],
                               params["data_parallel_size"], tally=self.stats)
        for source in sources:
            try:
                self.consumer.open(source)
            except SocketSetupError as exc:
                self.fail(exc.msg)
        self.streams = sources

    def listen(self):
        """Listen (and trigger) from ``start`` until the expectations are met and the stream settled, or the timeout."""
        timeout = self.params["timeout"]
        deadline = self.start + timeout
        # With a replay endpoint, keep a little time at the end to fetch the tail of each stream.
        reserve = min(TAIL_IDLE, timeout / 10.0) if self.params["replay_endpoint"] else 0.0
        self._loop(deadline - reserve)
        self.consumer.catch_up(deadline, tail=True)

    def next_window(self):
        """Start counting anew on the open streams (``RequestWindows``): the sequence numbers seen stay, so a gap
        between two windows is still found; the trigger is to be sent again."""
        self.start = self.clock()
        self.windowed = True
        self.stats.begin_window()
        self.backlog_batches = 0
        self.trigger = dict(UNSENT_TRIGGER)
        self.router.update(checked_batches=0, refused_batches=0, first_problem=None)

    def _loop(self, deadline):
        clock = LoopClock(self.params, deadline)
        while True:
            now = self.clock()
            action = next(act for when, act in TURN if when(self, clock, now))
            if action == "stop":
                return
            getattr(self, "_" + action)(clock, now)
            if action == "listen":
                now = self.clock()
                for when, act in AFTER_LISTEN:
                    if when(self, clock, now):
                        getattr(self, "_" + act)(clock, now)

    # The actions of the timing rules.
    def _repair_gaps(self, clock, now):  # pylint: disable=unused-argument
        self.consumer.catch_up(clock.deadline, tail=False)  # the gaps, not the tail: the stream is still busy

    def _fetch_tails(self, clock, now):  # pylint: disable=unused-argument
        clock.tail_asked = True
        self.consumer.catch_up(clock.deadline, tail=True)

    def _listen(self, clock, now):
        # At most 0.1 s, and no later than the trigger or the end of the settle period is due (at once where the
        # streams are connected but not yet noted: a later window's, open all along).
        due = [when for when in (clock.deadline, now + 0.1,
                                 clock.connected_at + clock.delay if clock.trigger_pending and clock.connected_at is not None else None,
                                 clock.last_msg + clock.delay if clock.trigger_pending and clock.last_msg is not None else None,
                                 clock.last_msg + clock.settle if not clock.trigger_pending and clock.last_msg is not None else None)
               if when is not None and when > now]
        if clock.connected_at is None and all(s.connected for s in self.streams):
            due = []
        ready = self.consumer.poll(min(due) - now if due else 0.0)
        for source in self.streams:
            if source in ready and self.consumer.drain(source):
                clock.last_msg = self.clock()
                clock.tail_asked = False

    def _note_connected(self, clock, now):
        # A later window's subscription was connected in an earlier one: its delay has long passed.
        clock.connected_at = self.connected_since if self.windowed and self.connected_since is not None else now
        self.connected_since = clock.connected_at

    def sets_backlog_aside(self):
        """Whether what arrives before the trigger is a backlog set aside (bind mode, a window)."""
        return self.params["socket_mode"] == "bind" or self.windowed

    def _send_trigger(self, clock, now):
        clock.trigger_pending = False
        if self.sets_backlog_aside():
            # An engine that connects queues its events while nobody is bound and delivers that backlog
            # as soon as we bind (and a subscription kept open between windows holds what came in between):
            # count only what arrives once the trigger is on its way.
            self.backlog_batches = self.stats.begin_window()
        if self.send is not None:
            self.trigger = self.send(max(clock.deadline - now, 0.1))
            clock.last_msg = self.clock()
            return
        try:
            self.trigger = send_trigger(self.params["trigger"], max(clock.deadline - now, 0.1), self.client_class)
        except CheckError as exc:
            self.trigger = exc.facts["trigger"]
            self.fail(exc.msg)
        clock.last_msg = self.clock()

    # -- what the consumer hands over ---------------------------------------------------------
    def add(self, batch, payload=None, live=True, source=None):
        self.stats.add_batch(batch)
        self.hold_against_router(batch, payload)
        if self.params.get("capture_path"):
            self.capture.extend(batch_json_lines(batch, bool(self.params.get("include_token_ids"))))
        if self.on_batch is not None:
            self.on_batch(batch, payload, live, source)

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

    # -- verdict --------------------------------------------------------------------------
    def judge(self):
        stats = self.stats
        timeout = self.params["timeout"]
        where = ", ".join(self.endpoints())
        bind = self.params["socket_mode"] == "bind"
        if not stats.batches and not stats.malformed:
            if stats.other_topics:
                others = ", ".join(repr(t) for t in sorted(stats.other_topics))
                self.fail("No KV events under topic prefix %r arrived on %s within %ss, but messages arrived under topic %s; set topic "
                          "to match the engine's kv-events topic." % (self.params.get("topic") or "", where, timeout, others))
            if not any(s.connected for s in self.streams):
                self.fail("No KV events received %s %s within %ss: %s." % ("on" if bind else "from", where, timeout, unconnected(bind)))
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


# The options of a watch over another check's requests (``RequestWindows``): the stream's and the judging ones, and
# the delay of each request after the subscription connected; the requests and the engine (wire dialect) are the other
# check's, so no trigger, engine, capture or token ids here.
WINDOW_OPTIONS = dict(
    [(name, spec) for name, spec in KV_STREAM_ARG_SPEC.items() if name != "engine"]
    + [(name, spec) for name, spec in CHECK_ARG_SPEC.items() if name in ("expect", "settle", "router_version", "expect_router_decodes")]
    + [("delay", {"type": "float", "default": 0.05, "range": (0, 60)})])


class RequestWindows:
    """Watch the KV events of requests another check sends (prefix_cache_check's cold and warm requests).

    One subscription serves every window (no reconnection between two requests, whose events a publisher would drop
    until the new subscription reached it). ``around(name, send)`` opens it on first use, starts a window, calls
    ``send()`` once the subscription is connected (``delay`` later), listens until the expectations are met and the
    stream settled (a ``KVEventsCheck`` whose trigger is that request, judged the same way) and keeps the facts under
    ``name`` in ``windows``; it returns what ``send()`` returned, a dict with the request's ``prompt_tokens`` and
    ``cached_tokens``. A window that fails raises ``CheckError`` naming the request, with every window's facts so far
    under ``kv_events``; what ``send()`` raises goes through unchanged. ``open()`` opens the subscription ahead of the
    first window; ``close()`` (or the ``with`` block) closes it, unless ``hand_over()`` gave it to another watch.
    ``params``: ``WINDOW_OPTIONS``; ``url`` and ``model`` (a name, or a callable that returns it once known): the server
    and the model the requests go to, reported as the trigger's; ``engine``: the wire dialect (auto, vllm, sglang).
    """

    def __init__(self, params, url, model=None, engine="auto", clock=time.monotonic, ctx=None):
        params = dict(params, engine=engine)
        self.url = url.rstrip("/") + "/v1/completions"
        params["trigger"] = {"url": self.url, "delay": params.pop("delay", WINDOW_OPTIONS["delay"]["default"])}
        self.model = model
        self.check = KVEventsCheck(params, clock=clock, ctx=ctx, send=self._send)
        self.opened = False
        self.sending = None
        self.raised = False
        self.answer = None
        self.windows = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def close(self):
        if self.check.consumer is not None:
            self.check.consumer.close()

    def _send(self, seconds_left):  # pylint: disable=unused-argument
        try:
            answer = self.sending()
        except Exception:
            self.raised = True  # the request's own failure, told as the other check tells it
            raise
        self.answer = dict(answer)
        return {"sent": True, "url": self.url, "status": answer.get("status", 200), "prompt_tokens": answer.get("prompt_tokens"),
                "cached_tokens": answer.get("cached_tokens"), "model": self.model() if callable(self.model) else self.model}

    def open(self):
        """Open the subscription (once; ``around`` does it where not done yet): before the first request is prepared, so
        the engine connects meanwhile."""
        if not self.opened:
            check = self.check
            check.start = check.clock()
            check.validate()
            self.opened = True
            check.open_streams()

    def hand_over(self):
        """The open subscription's ``KVConsumer``, no longer this watch's (``close()`` leaves it open), for another watch of
        the same stream (``lmcache.tiers.TierWatch.take_over``); None where it is not open."""
        if self.check.consumer is None or not self.opened or not self.check.consumer.listening():
            return None
        consumer, self.check.consumer = self.check.consumer, None
        return consumer

    def around(self, name, send):
        check = self.check
        self.sending, self.raised, self.answer = send, False, None
        try:
            self.open()
            check.next_window()
            check.listen()
            check.judge()
            self.windows[name] = check.facts()
        except CheckError as exc:
            if self.raised:
                raise
            if exc.facts:
                self.windows[name] = exc.facts
            raise CheckError("The KV events of the %s request: %s" % (name, exc.msg), {"kv_events": dict(self.windows)})
        return self.answer
