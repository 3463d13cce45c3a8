# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""kv/live_index.py: the live KV-block index of several engines' streams: restarts, the replay's backlog, gaps repaired or not,
data-parallel ranks, events it cannot key, the per-start bookkeeping and the deadline (frames fed to its consumer, and
synthetic publishers over real ZMQ on 127.0.0.1)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import threading
import time

import pytest
import zmq

from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.engines import Engine
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.index_check import KVIndexCheck
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.live_index import LiveIndex, OutOfTime, restart_warning
from ansible_collections.inference_cache.substrate.tests.unit.plugins.net_utils import free_port
from ansible_collections.inference_cache.substrate.tests.unit.plugins.sentences import assert_one_sentence
from ansible_collections.inference_cache.substrate.tests.harness import kv_synthetic as synth


def _frames(seq, events, topic=b"kv@a:1@tiny"):
    import msgspec  # pylint: disable=import-outside-toplevel
    return [topic, seq.to_bytes(8, "big"), msgspec.msgpack.encode([time.time(), events, 0])]


def _stored(hashes, parent, tokens):
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens, "block_size": 4,
            "lora_id": None, "medium": "GPU", "lora_name": None}


def _stream():
    live = LiveIndex(4, "tiny")
    return live, live.add("a", "tcp://127.0.0.1:1", topic="kv@a:1@tiny")


def receive(live, stream, frames):
    """One live message from the engine's socket, as the consumer drains it."""
    live.consumer.receive(stream.source, frames)


def facts_of(live):
    """What kv_index_check reports of the index's streams (its facts around this LiveIndex)."""
    check = KVIndexCheck({"engines": []})
    check.live = live
    for stream in live.streams:
        engine = Engine({"name": stream.name, "url": "http://127.0.0.1:1"}, None)
        engine.stream = stream
        check.engines.append(engine)
    return check.facts()


def test_restart_and_all_blocks_cleared_clear_the_engine():
    live, stream = _stream()
    receive(live, stream, _frames(0, [_stored([1, 2], None, list(range(8)))]))
    second = _frames(1, [_stored([3], 2, list(range(8, 12)))])
    receive(live, stream, second)
    assert live.index.size("a") == 3 and stream.restarts == 0
    receive(live, stream, second)     # the very same message again: ignored
    assert live.index.size("a") == 3 and stream.restarts == 0
    receive(live, stream, _frames(0, [_stored([5], None, list(range(20, 24)))]))   # seq went back: a restart
    assert stream.restarts == 1 and live.index.size("a") == 1 and live.uncounted.size("a") == 1
    receive(live, stream, _frames(1, [{"type": "AllBlocksCleared"}]))
    assert live.index.size("a") == 0 and live.index.engines["a"].clears == 2
    assert stream.source.activity == 5
    assert stream.restart_log == [{"rank": 0, "from": 1, "to": 0}]


def test_another_batch_under_the_last_number_is_a_restart_that_got_there_again():
    """ZMQ never hands a subscriber one live message twice: the same number with other content is a new run's batch."""
    live, stream = _stream()
    receive(live, stream, _frames(0, [_stored([1, 2], None, list(range(8)))]))
    receive(live, stream, _frames(0, [_stored([7], None, list(range(30, 34)))]))   # started again, and got to 0 again
    assert stream.restarts == 1 and live.index.size("a") == 1 and stream.batches == 2


RESTART_SENTENCE = ("Engine a restarted in place during the check (its KV-event sequence started again); llm-d-kv-cache v0.9.0 keeps a "
                    "restarted engine's old blocks until the pod is replaced, so a precise llm-d EPP may route to blocks that engine no "
                    "longer holds: replace the pod (delete it so its Deployment creates a new one with a new address) rather than "
                    "restart its container.")


def test_the_restart_sentence():
    assert restart_warning([]) is None
    assert assert_one_sentence(restart_warning(["a"])) == RESTART_SENTENCE
    assert restart_warning(["c", "a", "b"]).startswith("Engines a, b and c restarted in place during the check")
    assert "(their KV-event sequences started again)" in restart_warning(["a", "b"])
    assert "route to blocks those engines no longer hold: replace the pod" in restart_warning(["a", "b"])


# -- synthetic streams over real ZMQ: restarts, gaps and data-parallel ranks ----------------
TOPIC = "kv@a:1@tiny"


def _payload(hashes, tokens, parent=None, rank=0):
    """A vLLM batch of one BlockStored (block size 4) of our choosing, as the synthetic publisher sends it."""
    return synth.encode_batch([{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
                                "block_size": 4, "lora_id": None, "medium": "GPU", "lora_name": None}], rank=rank)


class Synthetic:
    """The live index subscribed to synthetic engines (real ZMQ on 127.0.0.1), one check engine named ``a``.

    ``bind``: the check binds and the publishers (one per data-parallel rank in ``ranks``) connect, else the one publisher
    binds. Every wait is for a condition (a subscription seen, a number of batches applied), bounded generously.
    """

    BOUND = 60.0

    def __init__(self, zctx, replay=True, bind=False, ranks=(0,)):
        self.zctx = zctx
        endpoint = "tcp://127.0.0.1:%d" % free_port()
        replay_endpoint = "tcp://127.0.0.1:%d" % free_port() if replay else None
        self.live = LiveIndex(4, "tiny", settle=0.0, event_wait=self.BOUND, deadline=time.monotonic() + 4 * self.BOUND, ctx=zctx)
        self.stream = self.live.add("a", endpoint, bind, TOPIC, replay_endpoint)
        self.pubs = []
        if bind:
            self.live.consumer.open(self.stream.source)
        for rank in ranks:
            self.pubs.append(synth.SyntheticPublisher(endpoint, bind=not bind, replay_endpoint=replay_endpoint if rank == 0 else None,
                                                      topic=TOPIC, block_size=4, rank=rank, ctx=zctx))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self):
        while not self.stop.is_set():
            self.pubs[0].serve_replay(0.02)

    def __enter__(self):
        if self.stream.source.sock is None:
            self.live.consumer.open(self.stream.source)
        for pub in self.pubs:
            self.subscribed(pub)
        self.thread.start()
        return self

    def subscribed(self, pub):
        """Wait until the publisher's XPUB saw the index's subscription. The index's socket is polled meanwhile: a bound SUB
        sends its subscription to a peer that connected only once its own thread handles the new connection."""
        until = time.monotonic() + self.BOUND
        while True:
            assert time.monotonic() < until, "no subscription reached the synthetic publisher"
            self.live.consumer.poll(0.02)
            if pub.pub.poll(20, zmq.POLLIN) and pub.pub.recv()[:1] == b"\x01":
                return

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)
        self.live.consumer.close()
        for pub in self.pubs:
            pub.close()

    def applied(self, batches):
        """Poll the stream until the index applied ``batches`` batches in all (the condition), bounded."""
        until = time.monotonic() + self.BOUND
        while self.stream.batches < batches:
            assert time.monotonic() < until, "%d of %d batches applied" % (self.stream.batches, batches)
            self.live.consumer.poll(0.05)
            self.live.drain()


def test_a_synthetic_engine_restarted_in_place_is_named_with_one_sentence(zctx):
    with Synthetic(zctx) as run:
        pub = run.pubs[0]
        for _i in range(4):
            pub.publish(removed=False)
        run.applied(4)
        assert run.stream.restarts == 0 and run.live.index.size("a") == 8
        pub.restart()   # seq 0 again, replay buffer empty, no AllBlocksCleared (as vLLM at start)
        pub.publish(payload=_payload([101, 102], list(range(500, 508))))
        pub.publish(payload=_payload([103], list(range(508, 512)), parent=102))
        run.applied(6)
    assert run.stream.restarts == 1 and run.stream.restart_log == [{"rank": 0, "from": 3, "to": 0}]
    assert run.live.index.size("a") == 3 and run.stream.gaps_unrepaired == 0   # the old run's 8 blocks forgotten
    facts = facts_of(run.live)
    assert facts["restarted_engines"] == ["a"] and facts["restart_warning"] == RESTART_SENTENCE
    assert facts["engines"]["a"]["restarts"] == 1 and facts["engines"]["a"]["restart_seqs"] == [{"rank": 0, "from": 3, "to": 0}]
    assert facts["summary"][-1].startswith("restarted in place (sequence started again): a 1;")


def test_the_live_backlog_of_a_replay_is_no_restart(zctx):
    """Live batches whose numbers were replayed already, with the replayed bytes: the replay's backlog, skipped."""
    with Synthetic(zctx) as run:
        pub = run.pubs[0]
        for _i in range(3):
            pub.publish(removed=False)   # live, queued in the check's socket while it replays
        run.live.catch_up()             # the engine's history from seq 0: batches 0..2
        assert run.stream.batches == 3
        until = time.monotonic() + run.BOUND
        while run.stream.source.activity < 3:   # the three live copies arrive: same numbers, same bytes
            assert time.monotonic() < until
            run.live.consumer.poll(0.05)
            run.live.drain()
    assert run.stream.restarts == 0 and run.stream.batches == 3 and run.live.index.size("a") == 6


def test_a_restart_right_after_the_replayed_history_is_told_from_its_backlog(zctx):
    """A live number at or below the last replayed one with other bytes than the replayed batch: the engine started again."""
    with Synthetic(zctx) as run:
        pub = run.pubs[0]
        for _i in range(3):
            pub.publish(drop=True, removed=False)   # only in the replay buffer
        run.live.catch_up()
        assert run.stream.batches == 3 and run.live.index.size("a") == 6
        pub.restart()
        pub.publish(payload=_payload([201], list(range(900, 904))))   # seq 0 again, live
        run.applied(4)
    assert run.stream.restarts == 1 and run.live.index.size("a") == 1
    assert run.stream.restart_log == [{"rank": 0, "from": 2, "to": 0}] and facts_of(run.live)["restarted_engines"] == ["a"]


def test_a_gap_is_repaired_through_replay_and_is_no_restart(zctx):
    with Synthetic(zctx) as run:
        pub = run.pubs[0]
        pub.publish()
        pub.publish(drop=True)         # lost on the way: only in the replay buffer
        pub.publish()
        run.applied(3)
    assert run.stream.gaps == 0 and run.stream.gaps_unrepaired == 0 and run.stream.restarts == 0
    facts = facts_of(run.live)
    assert facts["restarted_engines"] == [] and facts["restart_warning"] is None and len(facts["summary"]) == 5


def test_data_parallel_ranks_on_one_stream_are_no_restart(zctx):
    """Each rank's publisher counts from 0 on its own: interleaved numbers of two ranks are neither restarts nor duplicates."""
    with Synthetic(zctx, replay=False, bind=True, ranks=(0, 1)) as run:
        for step in range(3):
            for pub in run.pubs:
                pub.publish(payload=_payload([1000 * pub.rank + step], list(range(4)), rank=pub.rank))
        run.applied(6)
    assert run.stream.restarts == 0 and run.stream.gaps == 0 and run.stream.gaps_unrepaired == 0
    assert sorted(run.stream.ranks) == [0, 1] and all(state["applied"] == 2 for state in run.stream.ranks.values())
    assert facts_of(run.live)["restarted_engines"] == []


def test_gap_without_replay_and_other_topics_are_counted():
    live, stream = _stream()
    receive(live, stream, _frames(0, [_stored([1], None, list(range(4)))]))
    receive(live, stream, _frames(3, [_stored([2], 1, list(range(4, 8)))]))
    assert stream.gaps_unrepaired == 1 and live.index.size("a") == 2
    receive(live, stream, _frames(4, [_stored([7], None, list(range(4)))], topic=b"kv@b:2@tiny"))
    assert stream.tally.other_topics == {"kv@b:2@tiny": 1} and live.index.size("a") == 2
    receive(live, stream, [b"kv@a:1@tiny", b"\x00", b"x"])
    assert stream.tally.malformed == 1
    assert stream.explain() == "; a gap in its event stream could not be repaired (1 in all)"
    facts = stream.facts(live.index, live.uncounted)
    assert facts["other_topics"] == {"kv@b:2@tiny": 1} and facts["malformed"] == 1 and facts["gaps_unrepaired"] == 1


def test_events_the_index_cannot_key_are_malformed_not_a_crash():
    live, stream = _stream()
    no_tokens = dict(_stored([1], None, None))
    del no_tokens["token_ids"]
    receive(live, stream, _frames(0, [no_tokens, _stored([2], None, list(range(4)))]))
    assert stream.tally.malformed == 1 and "without token ids" in stream.tally.malformed_reason
    assert live.index.size("a") == 1   # the good event of the same batch was applied


def test_each_engine_start_keeps_its_batches_and_last_number_and_a_live_jump_is_a_gap_seen():
    live, stream = _stream()
    for seq in (0, 1, 3):   # 2 lost on the way, and no replay endpoint to ask
        receive(live, stream, _frames(seq, [_stored([10 + seq], None, list(range(4 * seq, 4 * seq + 4)))]))
    assert stream.gaps_seen == 1 and stream.gaps_unrepaired == 1 and stream.lost() == 1
    receive(live, stream, _frames(0, [_stored([50], None, list(range(40, 44)))]))   # started again
    assert [(s["applied"], s["last_seq"]) for s in stream.starts] == [(3, 3), (1, 0)]
    assert stream.starts[0]["noticed_at"] is None and stream.starts[1]["noticed_at"] is not None
    assert live.restarted_engines() == ["a"] and live.removed_blocks() == {"a": 0}


def test_a_wait_past_the_deadline_is_out_of_time():
    clock = iter(range(100)).__next__
    live = LiveIndex(4, "tiny", settle=1.0, deadline=2, clock=lambda: float(clock()))
    with pytest.raises(OutOfTime):
        live.settle()


def test_two_streams_of_one_name_are_refused():
    live, _stream_a = _stream()
    with pytest.raises(Exception) as info:
        live.add("a", "tcp://127.0.0.1:2")
    assert assert_one_sentence(info.value.msg) == "Two engines are named 'a'; give each a distinct name (or topic)."
