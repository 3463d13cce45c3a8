# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""A live KV-block index: several engines' KV-event streams kept as the index a precise router keeps (pure Python).

``LiveIndex`` is the component ``kv_index_check``, ``epp_route_check`` and the benchmarks share: they hold one and call it,
none of them subclasses it. It subscribes to every engine's stream (``kv/consumer.py``: one ``Source`` per engine), keeps
the KV-block index with copies counted (``index``, the index ``kv_index_check`` proves exact) and beside it the same
index with llm-d's uncounted eviction (``uncounted``), and keeps its own order on top of the consumer:

* at the start every engine's buffered history is replayed from seq 0 (``catch_up``), so the index starts with what the
  engine holds;
* a live sequence number that jumps forward is a gap, repaired through the engine's replay endpoint before the next batch
  is applied (``gaps_seen`` counts them, ``gaps_unrepaired`` those still open);
* a live sequence number at or below the last one seen live on that rank is a restart (ZMQ never delivers a live message
  twice); so is one at or below the last replayed one whose payload differs from the replayed batch of that number (the
  live backlog of a replay is byte-identical to it). A restart clears what the index knew of that engine and starts a new
  record in ``EngineStream.starts`` (per engine start: batches applied, last sequence number applied).

Sequence numbers are kept per engine and data-parallel rank (each rank's publisher counts from 0 on its own).

``settle()`` applies events until every stream was quiet for ``settle`` seconds; with ``wait_for`` it first waits for a
condition (an engine's events show a prompt's blocks held), bounded by ``event_wait``, then asks the engine's replay buffer
once for what follows the last applied batch. Every wait ends at ``deadline``: ``OutOfTime``, a ``CheckError`` the caller
turns into its own sentence. Other failures are ``CheckError`` sentences without facts: a check adds its facts.

Token ids stay in this process: they are used for keys and lookups and then dropped.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import contextlib
import hashlib
import time

from ..common.errors import CheckError
from .consumer import MAX_FRAME, SKIP, STOP, TAKE, KVConsumer, SocketSetupError, Source, unconnected
from .events import KVDecoder
from .index import KVBlockIndex, predicted_cached_tokens

DRAIN_LIMIT = 10000  # messages read from one engine at a time
MAX_RESTARTS_LOGGED = 10
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


class OutOfTime(CheckError):
    """The deadline passed while the index waited for events (the caller says whose timeout it was)."""


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


class EngineStream:
    """One engine's KV-event stream as the index hears it: its consumer ``Source`` and its sequence bookkeeping."""

    def __init__(self, name, endpoint, bind=False, topic="", replay_endpoint=None, clock=time.monotonic):
        self.name = name
        self.source = Source(endpoint, bind, topic, replay_endpoint, name=name)
        self.ranks = {}   # data-parallel rank -> its sequence bookkeeping (``rank``)
        self.batches = 0
        self.gaps = 0             # batches applied after a jump the replay did not fill
        self.gaps_seen = 0        # live batches ahead of the last one applied (before any repair)
        self.gaps_unrepaired = 0
        self.restarts = 0
        self.restart_log = []     # {"rank", "from", "to"}: the last live sequence number before each restart and the first after
        self.event_waits_timed_out = 0
        # One record per engine start: batches applied and the last sequence number applied in it, when it was noticed.
        self.starts = [{"applied": 0, "last_seq": -1, "noticed_at": None}]
        self._clock = clock

    def rank(self, rank):
        """One rank's sequence state: last seq seen live and its payload digest, last applied, replayed digests not yet live."""
        state = self.ranks.get(rank)
        if state is None:
            state = self.ranks[rank] = {"live": -1, "live_digest": None, "applied": -1, "replayed": {}}
        return state

    @property
    def topic(self):
        return self.source.topic

    @topic.setter
    def topic(self, value):
        self.source.topic = value or ""

    @property
    def tally(self):
        return self.source.tally

    @property
    def stopped(self):
        return self.source.stopped

    @property
    def activity(self):
        return self.source.activity

    def last_applied(self):
        """The last sequence number applied on the source's own rank (-1: none yet)."""
        return self.rank(self.source.rank)["applied"]

    def lost(self):
        """Batches lost over every start: the last sequence number applied + 1, less the batches applied, per start."""
        return sum(max(s["last_seq"] + 1 - s["applied"], 0) for s in self.starts)

    def explain(self, withheld_after=None):
        """A clause on why this engine's events may be missing (empty when nothing is known)."""
        tally = self.tally
        if self.stopped:
            return "; the subscription to its events was stopped after %s requests" % withheld_after
        if tally.other_topics and not self.batches:
            return "; no KV events arrived under its topic prefix %r, but messages arrived under %s" % (
                self.topic, ", ".join(repr(t) for t in sorted(tally.other_topics)))
        if not self.batches:
            return "; no KV event arrived from it"
        if self.gaps_unrepaired:
            return "; a gap in its event stream could not be repaired (%d in all)" % self.gaps_unrepaired
        if tally.malformed:
            return "; %d of its messages were malformed (%s)" % (tally.malformed, tally.malformed_reason)
        if self.restarts:
            return "; it restarted in place during the check (its KV-event sequence started again %d times)" % self.restarts
        return ""

    def facts(self, index, uncounted):
        """What the index heard from this engine, counts only."""
        blocks = index.engines.get(self.name) if index is not None else None
        return {
            "topic": self.topic,
            "batches": self.batches,
            "blocks_stored": blocks.stored_blocks if blocks else 0,
            "blocks_stored_again": blocks.stored_again if blocks else 0,
            "blocks_removed": blocks.removed_blocks if blocks else 0,
            "removed_unknown": blocks.removed_unknown if blocks else 0,
            "stores_skipped": blocks.stores_skipped if blocks else 0,
            "clears": blocks.clears if blocks else 0,
            "held_blocks": index.size(self.name) if index is not None else 0,
            "held_blocks_uncounted": uncounted.size(self.name) if uncounted is not None else 0,
            "restarts": self.restarts,
            "restart_seqs": list(self.restart_log),
            "gaps": self.gaps,
            "gaps_unrepaired": self.gaps_unrepaired,
            "other_topics": dict(self.tally.other_topics),
            "malformed": self.tally.malformed,
            "subscription_stopped": self.stopped,
            "event_waits_timed_out": self.event_waits_timed_out,
        }


class LiveIndex:
    """The KV-block index of several engines, kept live from their KV-event streams.

    ``settle``: seconds of quiet that make the index current; ``event_wait``: how long ``settle(wait_for=...)`` waits for
    an engine's events before asking its replay buffer; ``deadline``: a ``clock()`` value after which every wait raises
    ``OutOfTime`` (None: no deadline). ``block_size`` and ``model`` may be set after construction (``configure``), once the
    engines told them; events are applied only after that.
    """

    def __init__(self, block_size=None, model="", settle=0.3, event_wait=5.0, deadline=None, clock=time.monotonic, ctx=None,
                 max_frame=MAX_FRAME):
        self.clock = clock
        self.settle_quiet = settle
        self.event_wait = event_wait
        self.deadline = deadline
        self.consumer = KVConsumer(KVDecoder("vllm", include_token_ids=True), self.on_batch, clock=clock, ctx=ctx, max_frame=max_frame)
        self.streams = []
        self.by_name = {}
        self.index = None
        self.uncounted = None
        if block_size is not None:
            self.configure(block_size, model)

    # -- set-up -----------------------------------------------------------------------------
    def configure(self, block_size, model):
        """The engines' block size and model: the index keys blocks with them (a second call starts the index afresh)."""
        self.index = KVBlockIndex(block_size, model, count_copies=True)
        self.uncounted = KVBlockIndex(block_size, model, count_copies=False)

    @property
    def block_size(self):
        return self.index.block_size if self.index is not None else None

    def add(self, name, endpoint, bind=False, topic="", replay_endpoint=None):
        """One engine's stream (opened by ``open``); returns its ``EngineStream``."""
        if name in self.by_name:
            raise CheckError("Two engines are named %r; give each a distinct name (or topic)." % name)
        stream = EngineStream(name, endpoint, bind, topic, replay_endpoint, clock=self.clock)
        self.streams.append(stream)
        self.by_name[name] = stream
        return stream

    def open(self):
        """Open every stream's socket; a socket that cannot be set up is one sentence naming the engine."""
        for stream in self.streams:
            try:
                self.consumer.open(stream.source)
            except SocketSetupError as exc:
                raise CheckError("Engine %s: %s" % (stream.name, exc.msg))

    def wait_connected(self, seconds):
        """Until every stream's peer connected (at most ``seconds``); one sentence for the first that did not."""
        until = self.clock() + seconds
        if self.deadline is not None:
            until = min(until, self.deadline)
        while self.clock() < until and not all(s.source.connected for s in self.streams):
            self.consumer.poll(0.05)
            self.drain()
        missing = [s for s in self.streams if not s.source.connected]
        if missing:
            stream = missing[0]
            raise CheckError("Engine %s (%s): %s." % (stream.name, stream.source.endpoint, unconnected(stream.source.bind)))

    def catch_up(self):
        """Replay every engine's buffered history from seq 0, so the index starts with what the engine holds."""
        for stream in self.streams:
            if stream.source.replay_endpoint:
                self.replay_into(stream, stream.source.rank, 0, None)

    def close(self):
        self.consumer.close()

    @contextlib.contextmanager
    def listening(self, connect_wait=None):
        """The streams open, connected (within ``connect_wait`` seconds: twice ``event_wait``, at least 2), settled and
        caught up from the replay buffers; closed after."""
        try:
            self.open()
            self.wait_connected(connect_wait if connect_wait is not None else max(2 * (self.event_wait or 5.0), 2.0))
            self.settle()
            self.catch_up()
            yield self
        finally:
            self.close()

    # -- reading ----------------------------------------------------------------------------
    def drain(self):
        """Apply what is queued on every stream; True if anything arrived."""
        return self.consumer.drain_all(DRAIN_LIMIT)

    def pump(self, seconds):
        """Apply events for ``seconds`` (while requests run elsewhere)."""
        end = self.clock() + seconds
        while self.clock() < end:
            self.consumer.poll(0.05)
            self.drain()

    def heard_from_any(self, since, seconds):
        """Until some stream received a message after ``since`` (``{name: activity}`` then), at most ``seconds``."""
        until = self.clock() + max(seconds, 0.0)
        if self.deadline is not None:
            until = min(until, self.deadline)
        while self.clock() < until and not any(s.activity > since[s.name] for s in self.streams):
            self.consumer.poll(0.05)
            self.drain()

    def settle(self, wait_for=None, since=0, until=None):
        """Apply events until every stream was quiet for ``settle`` seconds, once ``wait_for`` (a stream) sent something
        (activity above ``since``).

        With ``until`` (a function), what ``wait_for`` sent must also make ``until()`` true: the condition a request's events
        meet, such as the prompt's blocks held; a message from it that the index cannot use (another topic, malformed, a store
        with an unknown parent) ends that wait, since what it lacks will not come. The wait is bounded by ``event_wait``; then,
        where the engine has a replay endpoint, what follows its last applied batch is asked for once (a batch lost on the way
        is still in the engine's replay buffer) before the wait is given up and counted (``event_waits_timed_out``).
        """
        quiet = max(self.settle_quiet, 0.0)
        event_wait = self.clock() + max(self.event_wait, 0.0)
        last = self.clock()
        asked_tail = False
        if wait_for is not None:
            batches, unusable = wait_for.batches, self.unusable(wait_for)
        while True:
            now = self.clock()
            if self.deadline is not None and now >= self.deadline:
                raise OutOfTime("The KV-event streams did not settle before the deadline.")
            waiting = wait_for is not None and not wait_for.stopped and (
                (wait_for.activity <= since and wait_for.batches == batches)
                or (until is not None and not until() and self.unusable(wait_for) == unusable))
            if waiting and now >= event_wait:
                if not asked_tail and wait_for.source.replay_endpoint:
                    asked_tail = True
                    self.fetch_tail(wait_for)
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

    def fetch_tail(self, stream):
        """Everything the engine's replay buffer holds after the last batch applied (a dropped tail shows no gap)."""
        if stream.source.replay_endpoint:
            self.replay_into(stream, stream.source.rank, stream.last_applied() + 1, None)

    def unusable(self, stream):
        """How many of the engine's messages the index could not use: other topics, malformed, stores with an unknown parent."""
        blocks = self.index.engines.get(stream.name) if self.index is not None else None
        return stream.tally.malformed + sum(stream.tally.other_topics.values()) + (blocks.stores_skipped if blocks else 0)

    def withhold(self, stream):
        """Stop reading an engine's events (fault injection: a router that stopped hearing it)."""
        self.consumer.stop(stream.source)

    # -- what the index says ----------------------------------------------------------------
    def prompt_keys(self, tokens):
        return self.index.prompt_keys(tokens)

    def held(self, name, keys):
        """Blocks of ``keys`` (a prompt's, in order) the engine holds from the first on (copies counted)."""
        return self.index.lookup(name, keys)

    def predicted(self, name, tokens, keys=None, uncounted=False):
        """The cached tokens the engine would report for a prompt of ``tokens`` (vLLM's arithmetic: full blocks, and never
        the last token); ``uncounted``: by the index with llm-d's eviction."""
        keys = self.index.prompt_keys(tokens) if keys is None else keys
        index = self.uncounted if uncounted else self.index
        return predicted_cached_tokens(index.lookup(name, keys), len(tokens), self.index.block_size)

    def restarted_engines(self):
        """Names of the engines whose KV-event sequence started again, sorted."""
        return sorted(s.name for s in self.streams if s.restarts)

    def removed_blocks(self):
        """BlockRemoved blocks per engine so far."""
        return dict((s.name, self.index.engines[s.name].removed_blocks if self.index is not None and s.name in self.index.engines
                     else 0) for s in self.streams)

    # -- events -----------------------------------------------------------------------------
    def replay_into(self, stream, rank, start, end):
        """Apply what the engine's replay endpoint (rank ``rank``'s) holds from ``start`` to ``end`` (None: all), skipping what
        was applied."""
        state = stream.rank(rank)
        deadline = self.deadline if self.deadline is not None else self.clock() + 60.0

        def choose(topic, seq):  # pylint: disable=unused-argument
            if end is not None and seq > end:
                return STOP
            return SKIP if seq <= state["applied"] else TAKE
        error = self.consumer.replay(stream.source, start, deadline, choose)
        if error:
            stream.tally.add_malformed("replay: %s" % error)

    def apply(self, stream, batch, state):
        if batch.seq > state["applied"] + 1 and state["applied"] >= 0:
            stream.gaps += 1
        state["applied"] = batch.seq
        stream.batches += 1
        current = stream.starts[-1]
        current["applied"] += 1
        current["last_seq"] = max(current["last_seq"], batch.seq)
        if self.index is None:
            stream.tally.add_malformed("batch %d: arrived before the engines' block size was known" % batch.seq)
            return
        for event in batch.events:
            try:
                self.index.apply(stream.name, event)
                self.uncounted.apply(stream.name, event)
            except ValueError as exc:   # an event the index cannot key (no token ids, no block size)
                stream.tally.add_malformed("batch %d: %s" % (batch.seq, exc))

    def restarted(self, stream, rank, state, seq):
        """The engine started again (its rank's sequence went back): what the index knew of it is gone."""
        stream.restarts += 1
        if len(stream.restart_log) < MAX_RESTARTS_LOGGED:
            stream.restart_log.append({"rank": rank, "from": max(state["live"], state["applied"]), "to": seq})
        stream.starts.append({"applied": 0, "last_seq": -1, "noticed_at": self.clock()})
        if self.index is not None:
            self.index.cleared(stream.name)
            self.uncounted.cleared(stream.name)
        state.update(live=-1, live_digest=None, applied=-1, replayed={})

    def on_batch(self, batch, payload, live, source):
        """A batch from the consumer: a replayed one is applied; a live one in order, after a restart or a gap repair."""
        stream = self.by_name[source.name]
        rank = source.rank if batch.rank is None else batch.rank
        state = stream.rank(rank)
        seq = batch.seq
        if not live:
            if seq > state["live"]:   # its live copy may still be queued: a live batch under this number with other bytes is a restart's
                state["replayed"][seq] = _digest(payload)
            self.apply(stream, batch, state)
            return
        digest = _digest(payload)
        if seq <= state["live"]:
            if seq == state["live"] and digest == state["live_digest"]:
                return   # the very same message again (not from one ZMQ connection, but never counted twice)
            self.restarted(stream, rank, state, seq)
        elif seq <= state["applied"] and state["replayed"].get(seq, digest) != digest:
            self.restarted(stream, rank, state, seq)   # not the batch replayed under this number: a new run's
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
            stream.gaps_seen += 1
            if source.replay_endpoint and rank == source.rank:
                self.replay_into(stream, rank, state["applied"] + 1, seq - 1)
            if seq > state["applied"] + 1:
                stream.gaps_unrepaired += 1
        self.apply(stream, batch, state)
