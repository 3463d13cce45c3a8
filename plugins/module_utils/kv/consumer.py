# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""The one KV-event stream consumer (pure Python, no Ansible): every KV-event socket of a check is opened here.

``KVConsumer`` subscribes to ``Source``s, one SUB socket each, bound or connected (``kv/sockets.py``; data-parallel
rank N is one more source on vLLM's offset port) and monitored for a connected peer. It filters topics by prefix,
decodes batches (``KVDecoder``), counts what it cannot use in each source's ``Tally`` (messages under other topics,
malformed ones) and hands every decoded batch, live or replayed, to ``on_batch(batch, payload, live, source)``.

With a ``SequenceTracker`` it also tracks sequence numbers per (topic, rank), drops duplicates, notes when the
oldest unrepaired gap appeared (``gap_since``) and, on ``catch_up``, repairs gaps and tails through the replay
endpoint, coalesced into one request per stream: a replay ROUTER answers a request with everything from the asked
sequence number on, so one request per gap would make a busy engine resend its buffer hundreds of times. The tail
of a burst (batches dropped at the publisher's high-water mark after the last one that arrived) shows no gap; the
same request takes everything after the last sequence number seen. Without a tracker (kv_index_check, which keeps
its own order) the caller asks for replays itself (``replay``).

It owns the sentences for a socket that cannot be set up and for a stream whose peer never connected.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import errno
import time

from ..common.errors import CheckError
from .events import MalformedMessage
from .report import Tally
from .sockets import HAS_ZMQ, MAX_FRAME, ZMQ_IMPORT_ERROR, drain_monitor, offset_endpoint, open_socket, replay as replay_request, zmq

__all__ = ["HAS_ZMQ", "ZMQ_IMPORT_ERROR", "MAX_FRAME", "KVConsumer", "Source", "SocketSetupError", "describe_zmq_error", "unconnected",
           "open_checked", "offset_endpoint", "rank_sources"]

TAIL_IDLE = 2.0  # seconds a replay endpoint may stay silent before a replay request is given up
REPAIR_ROUNDS = 3  # replay requests per stream and catch-up while each brings back more of what is missing
# What ``choose(topic, seq)`` answers for each replayed batch (``KVConsumer.replay``).
TAKE, SKIP, LAST, STOP = "take", "skip", "last", "stop"


class SocketSetupError(CheckError):
    """A KV-event socket cannot be opened, bound or connected: one sentence naming which side should bind."""


def describe_zmq_error(exc, endpoint, bind):
    """One sentence for a socket that could not be opened, bound or connected, naming which side should bind."""
    if exc.errno == errno.EMFILE:
        return "Cannot open a ZMQ socket for %s: %s." % (endpoint, exc.strerror or exc)
    if bind and exc.errno == errno.EADDRINUSE:
        return ("Cannot bind %s: the address is already in use; if the engine binds this endpoint (vLLM binds endpoints with '*', "
                "e.g. tcp://*:5557) set socket_mode=connect, otherwise stop whatever else holds the port." % endpoint)
    if bind and exc.errno == errno.EADDRNOTAVAIL:
        return ("Cannot bind %s: the address does not belong to this host; bind a local address (or tcp://*:PORT), "
                "or, if the engine binds it, set socket_mode=connect." % endpoint)
    return "Cannot %s %s: %s." % ("bind" if bind else "connect to", endpoint, exc.strerror or exc)


def unconnected(bind):
    """Why nothing came from a stream whose peer never connected, and what to do (a clause for the caller's sentence)."""
    if bind:
        return ("no publisher connected; the engine must connect to this address (vLLM connects when its endpoint has no '*'), "
                "or, if the engine binds (tcp://*:PORT), set socket_mode=connect")
    return ("the connection never completed, so nothing is bound there; the engine must bind (vLLM binds only endpoints with "
            "'*', e.g. tcp://*:5557), or, if it connects, set socket_mode=bind")


def open_checked(ctx, kind, endpoint, bind, monitor=False, max_frame=MAX_FRAME):
    """``sockets.open_socket``, a failure as one sentence (``SocketSetupError``); also for the synthetic publisher."""
    if not bind and "*" in endpoint:
        raise SocketSetupError("Cannot connect to %s: an endpoint with '*' can only be bound; with socket_mode=connect give the "
                               "engine's address (e.g. tcp://127.0.0.1:5557), or set socket_mode=bind." % endpoint)
    try:
        return open_socket(ctx, kind, endpoint, bind, monitor=monitor, max_frame=max_frame)
    except zmq.ZMQError as exc:
        raise SocketSetupError(describe_zmq_error(exc, endpoint, bind))


class Source:
    """One subscribed endpoint: where, which side binds, the topic prefix, its replay endpoint, and what it heard.

    ``rank`` is the data-parallel rank of the socket (a batch that names none is counted under it); ``tally``
    counts its other topics and malformed messages (several sources may share one); ``activity`` counts every
    message it received; ``stopped`` is set once the consumer stopped reading it.
    """

    def __init__(self, endpoint, bind=False, topic="", replay_endpoint=None, rank=0, tally=None, name=None):
        self.endpoint = endpoint
        self.bind = bind
        self.topic = topic or ""
        self.replay_endpoint = replay_endpoint or None
        self.rank = rank
        self.tally = Tally() if tally is None else tally
        self.name = name
        self.sock = None
        self.mon = None
        self.connected = False
        self.activity = 0
        self.stopped = False


def rank_sources(endpoint, bind, topic="", replay_endpoint=None, ranks=1, tally=None):
    """One source per data-parallel rank: rank N on the port of ``endpoint`` (and of the replay endpoint) plus N."""
    return [Source(offset_endpoint(endpoint, rank), bind, topic, offset_endpoint(replay_endpoint, rank) if replay_endpoint else None,
                   rank=rank, tally=tally) for rank in range(ranks)]


class KVConsumer:
    """Subscribe to sources, decode what arrives and hand each batch to ``on_batch(batch, payload, live, source)``."""

    def __init__(self, decoder, on_batch, tracker=None, clock=time.monotonic, ctx=None, max_frame=MAX_FRAME):
        self.decoder = decoder
        self.on_batch = on_batch
        self.tracker = tracker
        self.clock = clock
        self.ctx = ctx
        self.own_ctx = ctx is None
        self.max_frame = max_frame
        self.sources = []
        self.stream_source = {}  # stream key -> the source it arrived on (whose replay endpoint repairs it)
        self.gap_since = None  # when the oldest gap not yet asked for appeared
        self._poller = None

    # -- sockets ----------------------------------------------------------------------------
    def context(self):
        if self.ctx is None:
            self.ctx = zmq.Context()
        return self.ctx

    def open(self, source):
        """Open, monitor and bind or connect the source's SUB socket; raises ``SocketSetupError`` with one sentence."""
        source.sock, source.mon = open_checked(self.context(), zmq.SUB, source.endpoint, source.bind, monitor=True,
                                               max_frame=self.max_frame)
        self.sources.append(source)
        self._poller = None
        return source

    def stop(self, source):
        """Stop reading one source: its sockets are closed, whatever it publishes from now on is lost."""
        self._close(source)
        source.stopped = True

    def close(self):
        """Close every socket (and the context this consumer created)."""
        for source in self.sources:
            self._close(source)
        if self.own_ctx and self.ctx is not None:
            self.ctx.term()
            self.ctx = None

    def _close(self, source):
        if source.sock is not None:
            try:
                source.sock.disable_monitor()
            except Exception:  # pylint: disable=broad-except
                pass
            source.sock.close(0)
        if source.mon is not None:
            source.mon.close(0)
        source.sock = source.mon = None
        self._poller = None

    def listening(self):
        return [s for s in self.sources if s.sock is not None]

    # -- live messages ----------------------------------------------------------------------
    def poll(self, timeout):
        """Wait up to ``timeout`` seconds for the open sources; note connected peers; return the sources with messages."""
        if self._poller is None:
            self._poller = zmq.Poller()
            for source in self.listening():
                self._poller.register(source.sock, zmq.POLLIN)
                self._poller.register(source.mon, zmq.POLLIN)
        events = dict(self._poller.poll(max(int(timeout * 1000), 1)))
        ready = []
        for source in self.listening():
            if source.mon in events and drain_monitor(source.mon):
                source.connected = True
            if source.sock in events:
                ready.append(source)
        return ready

    def drain(self, source, limit=1000):
        """Receive what is queued on one source (at most ``limit`` messages); True if anything arrived."""
        got = False
        for _i in range(limit):
            if source.sock is None:
                break
            try:
                frames = source.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            got = True
            self.receive(source, frames)
        return got

    def drain_all(self, limit=1000):
        """``drain`` every open source; True if anything arrived on any."""
        got = [self.drain(source, limit) for source in self.listening()]
        return any(got)

    def receive(self, source, frames):
        """One live message: topic filter, decoding, sequence bookkeeping, then ``on_batch``."""
        source.activity += 1
        source.connected = True
        tally = source.tally
        topic = frames[0].decode("utf-8", "replace") if frames else ""
        if not topic.startswith(source.topic):
            tally.add_other_topic(topic)
            return
        try:
            batch = self.decoder.decode_frames(frames)
        except MalformedMessage as exc:
            tally.add_malformed(str(exc))
            return
        if not tally.accepts_topic(batch.topic):
            tally.add_malformed("a message arrived under more than %d distinct topics" % tally.max_topics)
            return
        gap = None
        if self.tracker is not None:
            rank = source.rank if batch.rank is None else batch.rank
            state, gap = self.tracker.observe(batch.topic, rank, batch.seq)
            if state == "duplicate":
                return
            if state == "overflow":
                tally.add_malformed("a message arrived on more than %d distinct streams" % self.tracker.max_streams)
                return
            self.stream_source.setdefault(self.tracker.key(batch.topic, rank), source)
        self.on_batch(batch, frames[-1], True, source)
        if gap is not None and self.gap_since is None:
            self.gap_since = self.clock()

    # -- replay -----------------------------------------------------------------------------
    def replay(self, source, start, deadline, choose, topic=None):
        """One request to the source's replay endpoint for the batches from ``start`` on.

        Batches under another topic than the source's are counted as such. ``choose(topic, seq)`` says what to do with
        each other one: TAKE (decode it under ``topic``, or the source's, and hand it to ``on_batch`` as not live), SKIP,
        LAST (take it, then ask for nothing more) or STOP. A reply that is no replay answer is counted malformed and
        ends the request. Returns None, or the sentence saying why the replay endpoint could not be asked.
        """
        endpoint = source.replay_endpoint
        try:
            for reply_topic, seq, payload in replay_request(self.context(), endpoint, start, deadline, idle=TAIL_IDLE, clock=self.clock):
                if reply_topic is not None and not reply_topic.startswith(source.topic):
                    source.tally.add_other_topic(reply_topic)
                    continue
                what = choose(reply_topic, seq)
                if what == STOP:
                    break
                if what == SKIP:
                    continue
                try:
                    batch = self.decoder.decode_payload(payload, topic or source.topic, seq)
                except MalformedMessage as exc:
                    source.tally.add_malformed("replayed batch %d: %s" % (seq, exc))
                else:
                    self.on_batch(batch, payload, False, source)
                if what == LAST:
                    break
        except zmq.ZMQError as exc:  # the DEALER cannot connect
            return describe_zmq_error(exc, endpoint, False)
        except MalformedMessage as exc:
            source.tally.add_malformed("replay from %s: %s" % (endpoint, exc))
        return None

    def catch_up(self, deadline, tail=True):
        """Repair every open gap, and with ``tail`` fetch what follows the last batch seen, one request per stream.

        One request from the oldest missing batch covers all the gaps of a stream and its tail. Whatever the endpoint
        dropped on the way (its own high-water mark) is asked for again, from the oldest batch still missing, while
        that makes progress.
        """
        self.gap_since = None
        if self.tracker is None:
            return
        deadline = max(deadline, self.clock() + 0.1)
        for key in list(self.tracker.streams):
            source = self.stream_source.get(key)
            if source is None or not source.replay_endpoint:
                continue
            gaps = [g for g in self.tracker.gaps if g["stream"] == key and not g["repaired"] and not g.get("tail")]
            wanted = set()
            for gap in gaps:
                wanted.update(range(gap["start"], gap["end"] + 1))
            if not wanted and not tail:
                continue
            tail_seen = set() if tail else None
            error = None
            for _round in range(REPAIR_ROUNDS):
                before = len(wanted)
                start = min(wanted) if wanted else self.tracker.tail_start(key)
                stream = self.tracker.streams[key]
                error = self.replay(source, start, deadline, _chooser(stream, wanted, tail_seen), topic=stream["topic"])
                if error or not wanted or len(wanted) == before or self.clock() >= deadline:
                    break
            for gap in gaps:
                gap["still_missing"] = sum(1 for seq in range(gap["start"], gap["end"] + 1) if seq in wanted)
                gap["repaired"] = not gap["still_missing"]
                if error and not gap["repaired"]:
                    gap["error"] = error
            if tail:
                self.tracker.record_tail(key, tail_seen)


def _chooser(stream, wanted, tail_seen):
    """What one replay request of ``stream`` takes: the ``wanted`` batches, and the tail when ``tail_seen`` is a set."""
    topic, last = stream["topic"], stream["last"]

    def choose(reply_topic, seq):
        if reply_topic is not None and reply_topic != topic:
            return SKIP
        if seq in wanted:
            wanted.discard(seq)
        elif tail_seen is not None and seq > last and seq not in tail_seen:
            tail_seen.add(seq)
        else:
            return SKIP
        return LAST if tail_seen is None and not wanted else TAKE  # every gap filled and the tail not asked for: done
    return choose
