# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The one KV-event consumer: its sentences, its per-message rules, replay choices and coalesced repair; and the
timing rules of kv_events_check's loop, one at a time."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import errno
import re
import threading
import time

import msgspec
import pytest
import zmq

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.errors import CheckError
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import consumer as kvc
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import events_check as chk
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import index_check as idx
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.events import KVDecoder
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.report import KVStats
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.stream import SequenceTracker
from ansible_collections.inference_cache.substrate.tests.unit.plugins import waiting
from ansible_collections.inference_cache.substrate.tests.unit.plugins.sentences import assert_one_sentence
from ansible_collections.inference_cache.substrate.tests.harness import kv_synthetic as synth


def frames(seq, topic=b"kv@a:1@m", rank=0):
    events = [{"type": "BlockStored", "block_hashes": [seq], "parent_block_hash": None, "token_ids": [1, 2], "block_size": 2,
               "lora_id": None, "medium": "GPU", "lora_name": None}]
    return [topic, seq.to_bytes(8, "big"), msgspec.msgpack.encode([time.time(), events, rank])]


class Recorder:
    """An ``on_batch`` hook that keeps what it was handed."""

    def __init__(self):
        self.calls = []

    def __call__(self, batch, payload, live, source):
        self.calls.append((batch.topic, batch.seq, live, source.name, bytes(payload)[:1]))


def consumer(tracker=True, **kwargs):
    hook = Recorder()
    return kvc.KVConsumer(KVDecoder(), hook, tracker=SequenceTracker() if tracker else None, **kwargs), hook


# -- sentences ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("code, bind, expected", [
    (errno.EADDRINUSE, True, "Cannot bind tcp://h:1: the address is already in use; if the engine binds this endpoint"),
    (errno.EADDRNOTAVAIL, True, "Cannot bind tcp://h:1: the address does not belong to this host; bind a local address"),
    (errno.EMFILE, False, "Cannot open a ZMQ socket for tcp://h:1: "),
    (errno.EADDRINUSE, False, "Cannot connect to tcp://h:1: "),
    (errno.EINVAL, True, "Cannot bind tcp://h:1: "),
])
def test_setup_sentences(code, bind, expected):
    msg = kvc.describe_zmq_error(zmq.ZMQError(code), "tcp://h:1", bind)
    assert msg.startswith(expected) and msg.endswith(".") and not re.search(r"[.!?]\s+[A-Z]", assert_one_sentence(msg))


def test_unconnected_clauses_name_which_side_binds():
    assert kvc.unconnected(True).startswith("no publisher connected; the engine must connect to this address")
    assert kvc.unconnected(True).endswith("set socket_mode=connect")
    assert kvc.unconnected(False).startswith("the connection never completed, so nothing is bound there")
    assert kvc.unconnected(False).endswith("set socket_mode=bind")


def test_open_refuses_to_connect_to_a_wildcard_and_is_a_check_error(zctx):
    with pytest.raises(kvc.SocketSetupError) as info:
        kvc.open_checked(zctx, zmq.SUB, "tcp://*:5557", bind=False)
    assert isinstance(info.value, CheckError)
    assert info.value.msg.startswith("Cannot connect to tcp://*:5557: an endpoint with '*' can only be bound")


def test_open_a_bad_endpoint_is_one_sentence_and_leaves_nothing_listening(zctx):
    cons, _hook = consumer(ctx=zctx)
    with pytest.raises(kvc.SocketSetupError) as info:
        cons.open(kvc.Source("tcp://127.0.0.1", bind=False))
    assert info.value.msg.startswith("Cannot connect to tcp://127.0.0.1: ")
    assert cons.sources == [] and cons.listening() == []


# -- one live message ----------------------------------------------------------------------------------------------
def test_receive_filters_decodes_tracks_and_hands_on():
    cons, hook = consumer()
    stats = KVStats()
    src = kvc.Source("inproc://x", topic="kv@", rank=3, tally=stats, name="s")
    cons.receive(src, frames(0))
    cons.receive(src, frames(0))                    # a duplicate: not handed on
    cons.receive(src, frames(1, topic=b"other"))   # another topic: counted
    cons.receive(src, [b"kv@a:1@m", b"\x00", b"x"])  # malformed: counted
    assert cons.gap_since is None
    cons.receive(src, frames(3))                    # seq 1 and 2 missing: a gap, its time noted
    assert hook.calls == [("kv@a:1@m", 0, True, "s", b"\x93"), ("kv@a:1@m", 3, True, "s", b"\x93")]
    assert stats.other_topics == {"other": 1} and stats.malformed == 1 and src.activity == 5 and src.connected
    assert cons.gap_since is not None and cons.stream_source == {"kv@a:1@m#0": src}  # the batch names rank 0
    assert cons.tracker.gaps[0]["start"] == 1 and cons.tracker.gaps[0]["end"] == 2


def test_receive_without_a_tracker_hands_on_every_batch():
    cons, hook = consumer(tracker=False)
    src = kvc.Source("inproc://x", name="s")
    for seq in (5, 5, 2):
        cons.receive(src, frames(seq))
    assert [c[1] for c in hook.calls] == [5, 5, 2] and cons.gap_since is None


def test_streams_and_topics_beyond_the_bounds_are_malformed():
    cons, hook = consumer()
    cons.tracker.max_streams = 1
    stats = KVStats(max_topics=5)
    src = kvc.Source("inproc://x", tally=stats)
    cons.receive(src, frames(0, topic=b"a"))
    cons.receive(src, frames(0, topic=b"b"))
    assert len(hook.calls) == 1 and stats.malformed_reason == "a message arrived on more than 1 distinct streams"


# -- replay ---------------------------------------------------------------------------------------------------------
class CountingPublisher(synth.SyntheticPublisher):
    """The synthetic publisher, counting the replay requests it answered."""

    requests = 0

    def serve_replay(self, timeout=0.0):
        served = super(CountingPublisher, self).serve_replay(timeout)
        self.requests += served
        return served


def answered(pub, expected):
    """The replay requests the publisher answered, once it counted ``expected`` (it counts after sending the answer, so just
    after the consumer read it). Every request of these tests comes from a call that has returned, so no later one can
    still arrive: the count is final once it got there."""
    waiting.until(lambda: pub.requests >= expected, what="the publisher's count of %d replay requests" % expected)
    return pub.requests


@pytest.fixture
def replay_server(zctx, inproc, monkeypatch):
    """A replay endpoint holding batches 0..8 of topic kv@a:1@m (none of them sent live), served from a thread.

    A replay ends at the endpoint's end marker; the idle limit after which the consumer gives a silent endpoint up becomes a
    generous bound, so a thread slow to answer on a loaded machine is waited for."""
    monkeypatch.setattr(kvc, "TAIL_IDLE", waiting.BOUND)
    pub = CountingPublisher(inproc[0], replay_endpoint=inproc[1], topic="kv@a:1@m", ctx=zctx)
    for _seq in range(9):
        pub.publish(drop=True)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            pub.serve_replay(0.02)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield pub, inproc[1]
    stop.set()
    thread.join(5)
    pub.close()


def test_replay_choices(zctx, replay_server):
    pub, endpoint = replay_server
    cons, hook = consumer(ctx=zctx)
    src = kvc.Source("inproc://x", topic="kv@", replay_endpoint=endpoint, name="s")
    answers = {0: kvc.SKIP, 1: kvc.TAKE, 2: kvc.LAST, 3: kvc.TAKE}
    assert cons.replay(src, 0, time.monotonic() + waiting.BOUND, lambda topic, seq: answers[seq]) is None
    assert [(c[1], c[2]) for c in hook.calls] == [(1, False), (2, False)]   # LAST takes 2, then asks for nothing more
    del hook.calls[:]
    assert cons.replay(src, 3, time.monotonic() + waiting.BOUND, lambda topic, seq: kvc.STOP if seq == 5 else kvc.TAKE) is None
    assert [c[1] for c in hook.calls] == [3, 4] and answered(pub, 2) == 2
    other = kvc.Source("inproc://x", topic="kv@b", replay_endpoint=endpoint)
    assert cons.replay(other, 0, time.monotonic() + waiting.BOUND, lambda topic, seq: kvc.TAKE) is None
    assert other.tally.other_topics == {"kv@a:1@m": 9} and [c[1] for c in hook.calls] == [3, 4]


def test_replay_from_an_endpoint_that_cannot_be_asked_is_a_sentence(zctx):
    cons, _hook = consumer(ctx=zctx)
    src = kvc.Source("inproc://x", replay_endpoint="tcp://127.0.0.1")
    error = cons.replay(src, 0, time.monotonic() + 1, lambda topic, seq: kvc.TAKE)
    assert error.startswith("Cannot connect to tcp://127.0.0.1: ") and error.endswith(".")


def test_gaps_of_a_stream_repaired_in_one_request_then_its_tail(zctx, replay_server):
    """Two gaps: one replay request (from the oldest missing batch) brings both back; the tail takes one more."""
    pub, endpoint = replay_server
    cons, hook = consumer(ctx=zctx)
    src = kvc.Source("inproc://x", topic="kv@", replay_endpoint=endpoint, name="s")
    for seq in (0, 1, 3, 4, 6):
        cons.receive(src, frames(seq))
    assert [g["start"] for g in cons.tracker.gaps] == [2, 5] and cons.gap_since is not None
    cons.catch_up(time.monotonic() + waiting.BOUND, tail=False)
    assert answered(pub, 1) == 1 and cons.gap_since is None
    assert [(c[1], c[2]) for c in hook.calls if not c[2]] == [(2, False), (5, False)]
    assert all(g["repaired"] and g["still_missing"] == 0 for g in cons.tracker.gaps)
    cons.catch_up(time.monotonic() + waiting.BOUND, tail=True)
    assert answered(pub, 2) == 2 and [c[1] for c in hook.calls if not c[2]] == [2, 5, 7, 8]
    assert cons.tracker.facts()["gaps"]["tail"] == {"found": 1, "batches": 2}
    cons.receive(src, frames(8))   # the live copy of a replayed batch, late: a duplicate
    assert len(hook.calls) == 9


# -- the loop's timing rules ------------------------------------------------------------------------------------------
class Check:
    """What the rules read of the check: met(), the consumer's gap_since and the streams' connection."""

    def __init__(self, met=False, gap_since=None, connected=(True,), backlog_aside=False):
        self._met = met
        self.consumer = type("C", (), {"gap_since": gap_since})()
        self.streams = [type("S", (), {"connected": c})() for c in connected]
        self.backlog_aside = backlog_aside

    def met(self):
        return self._met

    def sets_backlog_aside(self):
        return self.backlog_aside


def clock(trigger=False, replay=True, settle=1.0, **state):
    params = {"settle": settle, "replay_endpoint": "tcp://h:1" if replay else None,
              "trigger": {"delay": 0.5} if trigger else None}
    out = chk.LoopClock(params, deadline=100.0)
    for name, value in state.items():
        setattr(out, name, value)
    return out


def first(check, timing, now):
    return next(action for when, action in chk.TURN if when(check, timing, now))


@pytest.mark.parametrize("check, timing, now, action", [
    (Check(met=True), clock(), 100.0, "stop"),                                        # the deadline
    (Check(met=True), clock(last_msg=10.0), 11.0, "stop"),                            # met, quiet for settle
    (Check(met=True), clock(last_msg=10.0), 10.5, "listen"),                          # met, not settled yet
    (Check(met=True), clock(), 1.0, "stop"),                                          # met before any message
    (Check(met=True), clock(trigger=True), 1.0, "listen"),                            # the trigger still to send
    (Check(gap_since=5.0), clock(last_msg=9.0), 6.0, "repair_gaps"),                  # a gap quiet long enough
    (Check(gap_since=5.0), clock(last_msg=9.0), 5.5, "listen"),                       # a gap too young
    (Check(gap_since=5.0), clock(replay=False, last_msg=9.0), 20.0, "listen"),        # no replay endpoint
    (Check(), clock(last_msg=9.0), 10.0, "fetch_tails"),                              # quiet, expectations unmet
    (Check(), clock(last_msg=9.0, tail_asked=True), 10.0, "listen"),                  # once per quiet period
    (Check(), clock(), 10.0, "listen"),                                               # nothing heard yet: no tail
    (Check(), clock(settle=0.0, last_msg=9.0), 9.4, "listen"),                        # quiet is at least 0.5 s
    (Check(), clock(trigger=True, last_msg=9.0), 10.0, "listen"),                     # no tail before the trigger
])
def test_turn_rules(check, timing, now, action):
    assert first(check, timing, now) == action


def test_after_listen_rules_connect_then_trigger_after_the_delay():
    timing = clock(trigger=True)
    after = list(chk.AFTER_LISTEN)
    assert [a for w, a in after if w(Check(connected=(True, False)), timing, 1.0)] == []
    assert [a for w, a in after if w(Check(connected=(True, True)), timing, 1.0)] == ["note_connected"]
    timing.connected_at = 1.0
    assert [a for w, a in after if w(Check(), timing, 1.4)] == []
    assert [a for w, a in after if w(Check(), timing, 1.5)] == ["send_trigger"]
    # Where the backlog is set aside, the stream must also have been quiet for the delay, at most BACKLOG_WAIT more.
    timing.last_msg = 1.45
    assert [a for w, a in after if w(Check(backlog_aside=True), timing, 1.5)] == []
    assert [a for w, a in after if w(Check(backlog_aside=True), timing, 1.95)] == ["send_trigger"]
    timing.last_msg = 3.49
    assert [a for w, a in after if w(Check(backlog_aside=True), timing, 3.45)] == []
    assert [a for w, a in after if w(Check(backlog_aside=True), timing, 1.0 + 0.5 + chk.BACKLOG_WAIT)] == ["send_trigger"]
    timing.trigger_pending = False
    assert [a for w, a in after if w(Check(), timing, 9.0)] == []
    assert all(hasattr(chk.KVEventsCheck, "_" + action) for _w, action in chk.TURN + chk.AFTER_LISTEN if action != "stop")


def test_the_frame_bound_applies_to_the_subscriptions_of_both_checks(zctx, inproc):
    """kv_events_check's and kv_index_check's SUB sockets take the bound they were given (the engine test uses 1 KiB)."""
    check = chk.KVEventsCheck({"endpoint": inproc[0]}, ctx=zctx, max_frame=1024)
    src = check.consumer.open(kvc.Source(inproc[0], bind=True))
    try:
        assert src.sock.getsockopt(zmq.MAXMSGSIZE) == 1024 and src.mon is not None
    finally:
        check.consumer.close()
    assert src.sock is None and zctx.closed is False   # a context it was given is not its to end
    index = idx.KVIndexCheck({"engines": []}, max_frame=2048)
    assert index.live.consumer.max_frame == 2048 and index.live.consumer.tracker is None
