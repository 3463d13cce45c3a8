# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What the KV events tell a router about each tier: lmcache/tiers.py, with batches shaped as vLLM 0.32.0 and LMCache 0.5.6's
connector publish them (vLLM's own blocks as medium GPU, LMCache's chunks as medium CPU, one event per chunk)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import time

import msgspec
import pytest
import zmq

from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.events import KVDecoder
from ansible_collections.inference_cache.substrate.plugins.module_utils.lmcache import tiers
from ansible_collections.inference_cache.substrate.tests.unit.plugins.net_utils import free_port
from ansible_collections.inference_cache.substrate.tests.unit.plugins.sentences import assert_one_sentence

TOPIC = b"kv@127.0.0.1:8100@tiny"
PROMPT = list(range(1, 301))   # 300 tokens: 9 full blocks of 32, 4 full chunks of 64


def stored(hashes, tokens, medium, block_size, parent=None):
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
            "block_size": block_size, "lora_id": None, "medium": medium, "lora_name": None}


def gpu_blocks(tokens, first_hash=1000):
    full = len(tokens) // 32 * 32
    return stored(list(range(first_hash, first_hash + full // 32)), tokens[:full], "GPU", 32)


def cpu_chunks(tokens, first_hash=5000):
    events, parent = [], None
    for index in range(len(tokens) // 64):
        events.append(stored([first_hash + index], tokens[index * 64:(index + 1) * 64], "CPU", 64, parent))
        parent = first_hash + index
    return events


def frames(seq, events):
    return [TOPIC, seq.to_bytes(8, "big"), msgspec.msgpack.encode([time.time(), events, 0])]


class Feed:
    """A TierWatch fed decoded batches by hand (no socket)."""

    def __init__(self):
        self.decoder = KVDecoder("vllm", include_token_ids=True)
        self.watch = tiers.TierWatch("tcp://127.0.0.1:1", consumer=_NoConsumer())
        self.seq = 0

    def batch(self, *events):
        self.watch.on_batch(self.decoder.decode_frames(frames(self.seq, list(events))), None, True, None)
        self.seq += 1


class _NoConsumer:
    clock = staticmethod(time.monotonic)

    def drain_all(self):
        return False

    def close(self):
        pass


def test_lmcache_chunks_announced_as_cpu_events_predict_the_restored_hit():
    feed = Feed()
    feed.batch(gpu_blocks(PROMPT), *cpu_chunks(PROMPT))   # the cold request: the engine's blocks and LMCache's chunks
    feed.watch.mark("restored")
    feed.batch({"type": "AllBlocksCleared"}, gpu_blocks(PROMPT, 2000))   # the reset, published with the next step
    result = feed.watch.tiers(PROMPT, 32)
    assert result == {"device_tokens": 0, "host_tokens": 256, "predicted_tokens": 256, "after_clear": True}
    media = feed.watch.media()
    assert media["CPU"] == {"stored_events": 4, "stored_blocks": 4, "stored_tokens": 256, "removed_blocks": 0, "block_sizes": [64]}
    assert media["GPU"]["stored_blocks"] == 18 and media["GPU"]["block_sizes"] == [32]
    assert feed.watch.stored_chunks() == 4


def test_without_cpu_events_the_lmcache_tier_is_invisible():
    feed = Feed()
    feed.batch(gpu_blocks(PROMPT))
    feed.watch.mark("restored")
    feed.batch({"type": "AllBlocksCleared"}, gpu_blocks(PROMPT, 2000))
    assert feed.watch.tiers(PROMPT, 32) == {"device_tokens": 0, "host_tokens": 0, "predicted_tokens": 0, "after_clear": True}
    assert "CPU" not in feed.watch.media()


def test_before_the_reset_the_engine_tier_predicts_the_hit_itself():
    """No AllBlocksCleared (a flood, not a reset): what the index holds where the check marked, evictions included."""
    feed = Feed()
    feed.batch(gpu_blocks(PROMPT), *cpu_chunks(PROMPT))
    assert feed.watch.tiers(PROMPT, 32)["device_tokens"] == 288   # 9 blocks, below the 299 tokens vLLM may reuse
    feed.batch({"type": "BlockRemoved", "block_hashes": [1000], "medium": "GPU"})   # the flood evicted the first block
    feed.watch.mark("restored")
    result = feed.watch.tiers(PROMPT, 32)
    assert result["device_tokens"] == 0 and result["host_tokens"] == 256 and result["after_clear"] is False


def test_cpu_events_after_the_restored_request_came_too_late():
    feed = Feed()
    feed.batch(gpu_blocks(PROMPT))
    feed.watch.mark("restored")
    feed.batch({"type": "AllBlocksCleared"})
    feed.batch(*cpu_chunks(PROMPT))
    assert feed.watch.tiers(PROMPT, 32)["predicted_tokens"] == 0


def test_a_host_tier_removal_would_count():
    feed = Feed()
    feed.batch(*cpu_chunks(PROMPT))
    feed.batch({"type": "BlockRemoved", "block_hashes": [5001], "medium": "CPU"})
    assert feed.watch.media()["CPU"]["removed_blocks"] == 1
    assert feed.watch.tiers(PROMPT, 32)["host_tokens"] == 64   # the chain breaks at the second chunk


def test_an_engine_that_never_connects_is_named():
    watch = tiers.TierWatch("tcp://127.0.0.1:%d" % free_port(), bind=True, connect_timeout=0.3)
    with pytest.raises(tiers.EventsNotConnected) as info:
        watch.start()
    message = assert_one_sentence(info.value.msg)
    assert "never arrived within 0.3 s: no publisher connected" in message


def _publish_until(pub, watch, seq, events, predicate):
    for offset in range(20):   # until the subscription has reached the publisher
        pub.send_multipart(frames(seq + offset, events if offset == 0 else []))
        if watch.wait_for(predicate, 0.1):
            return seq + offset + 1
    raise AssertionError("the batches never arrived")


@pytest.fixture
def watched():
    """A started watch bound on TCP with a publisher connected to it, as vLLM connects: (watch, publisher, next seq)."""
    endpoint = "tcp://127.0.0.1:%d" % free_port()
    watch = tiers.TierWatch(endpoint, bind=True, topic=TOPIC.decode(), connect_timeout=5)
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    try:
        pub.connect(endpoint)
        watch.start()
        yield watch, pub, _publish_until(pub, watch, 0, [], lambda: len(watch.batches) > 0)
    finally:
        watch.close()
        pub.close(0)
        ctx.term()


def test_the_watch_on_a_real_socket_sees_what_a_connecting_publisher_sends(watched):
    watch, pub, seq = watched
    _publish_until(pub, watch, seq, cpu_chunks(PROMPT), lambda: watch.stored_chunks() >= 4)
    assert watch.stored_chunks() == 4


def test_a_watch_takes_over_another_watchs_open_subscription_without_subscribing_again(watched):
    """prefix_cache_check hands its windows' subscription to the tier's watch: what was queued on it is dropped, what comes
    after is the watch's, start() opens no second socket (the same endpoint could not be bound twice), close() closes it."""
    first, pub, seq = watched
    pub.send_multipart(frames(seq, cpu_chunks(PROMPT)))   # queued on the socket, not read by the first watch
    time.sleep(0.2)
    watch = tiers.TierWatch(first.source.endpoint, bind=True, topic=TOPIC.decode(), connect_timeout=0.3).take_over(first.consumer)
    watch.start()
    assert watch.source.sock is not None and watch.batches == [] and watch.stored_chunks() == 0
    _publish_until(pub, watch, seq + 1, [gpu_blocks(PROMPT)], lambda: watch.media().get("GPU", {}).get("stored_blocks", 0) == 9)
    # The queued batch (LMCache's chunks) reached neither watch; the first one got nothing after the hand-over.
    assert "CPU" not in watch.media() and first.batches and "CPU" not in first.media() and "GPU" not in first.media()
    watch.close()
    assert watch.source.sock is None


def test_settle_waits_for_a_batch_after_the_mark_then_a_quiet_moment(watched):
    watch, pub, seq = watched
    watch.mark("restored")
    started = time.monotonic()
    watch.settle("restored", 0.05, 0.3)   # nothing after the mark: the whole 0.3 s
    assert time.monotonic() - started >= 0.29
    pub.send_multipart(frames(seq, [gpu_blocks(PROMPT)]))
    started = time.monotonic()
    watch.settle("restored", 0.05, 5.0)   # the batch, then 0.05 s of quiet: far less than 5 s
    assert len(watch.batches) == watch.marks["restored"] + 1 and time.monotonic() - started < 2.0
