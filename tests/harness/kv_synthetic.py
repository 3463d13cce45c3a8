# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A synthetic KV-event publisher for tests, demos and benchmarks (not part of any module's payload).

It emits real-shaped vLLM (map or array events) and SGLang frames, keeps a replay buffer behind a ROUTER socket
exactly like vLLM's ``ZmqEventPublisher`` (vllm@v0.32.0:vllm/distributed/kv_events.py), and can inject gaps,
restarts and a dropped tail (the last batches of a burst lost at the high-water mark, still in the replay buffer).

Used by the tests, ``tools/kv_events_publish.py`` and the benchmarks, which import it as
``ansible_collections.inference_cache.substrate.tests.harness.kv_synthetic`` (the tools and benchmarks through the
collection's one loader, ``plugins/module_utils/_loader.py``).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import collections
import hashlib
import time

from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import consumer as kvc
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import events as kv
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import sockets as kvz

zmq = kvz.zmq
HAS_ZMQ = kvz.HAS_ZMQ
HAS_MSGSPEC = kv.HAS_MSGSPEC
SocketSetupError = kvc.SocketSetupError
open_socket = kvc.open_checked  # kv/sockets.open_socket, a bind or connect failure as one sentence
seq_to_bytes = kv.seq_to_bytes
END_SEQ_BYTES = kv.END_SEQ_BYTES
WIRE_FORMATS = ("vllm-map", "vllm-array", "sglang")


def _hash(step, idx, kind):
    digest = hashlib.sha256(("%d/%d" % (step, idx)).encode()).digest()
    if kind == "bytes":
        return digest
    return int.from_bytes(digest[-8:], "big")  # uint64, often above the int64 range


def synthetic_events(fmt, step, block_size=16, blocks=2, hash_kind="int", removed=True, unknown=False, salted=False):
    """Real-shaped events for one engine step (wire objects ready for msgpack)."""
    hashes = [_hash(step, i, hash_kind) for i in range(blocks)]
    parent = _hash(step - 1, blocks - 1, hash_kind) if step else None
    tokens = list(range(step * blocks * block_size, (step + 1) * blocks * block_size))
    old = [_hash(step - 2, 0, hash_kind)] if removed and step >= 2 and step % 2 == 0 else None
    events = []
    if fmt == "vllm-map":
        events.append({"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
                       "block_size": block_size, "lora_id": None, "medium": "GPU", "lora_name": None,
                       "extra_keys": [None] * blocks, "group_idx": 0, "kv_cache_spec_kind": "full_attention",
                       "locality": "local", "ownership": None})
        if old:
            events.append({"type": "BlockRemoved", "block_hashes": old, "medium": "GPU", "group_idx": 0})
        if unknown:
            events.append({"type": "FutureEvent", "whatever": 1})
    elif fmt == "vllm-array":
        events.append(["BlockStored", hashes, parent, tokens, block_size, None, "GPU"])
        if old:
            events.append(["BlockRemoved", old, "GPU"])
        if unknown:
            events.append(["FutureEvent", 1])
    elif fmt == "sglang":
        stored = ["BlockStored", hashes, parent, tokens, block_size, None, "GPU"]
        if salted:
            stored.append({"cache_salt": "salt-%d" % step})
        events.append(stored)
        if old:
            events.append(["BlockRemoved", old, "GPU"])
        if unknown:
            events.append(["FutureEvent", 1])
    else:
        raise ValueError("unknown wire format %r; use one of %s" % (fmt, ", ".join(WIRE_FORMATS)))
    return events


def encode_batch(events, ts=None, rank=0, batch_format="array", rank_key="data_parallel_rank"):
    ts = time.time() if ts is None else ts
    if batch_format == "map":
        return kv.wire.encode({"ts": ts, "events": events, rank_key: rank})
    return kv.wire.encode([ts, events, rank])


class SyntheticPublisher:
    """A stand-in for vLLM's ZmqEventPublisher (PUB + replay ROUTER), for tests and demos.

    It uses an XPUB socket (SUB-compatible) so it can wait until a subscriber's subscription arrived.
    ``drop`` publishes into the replay buffer without sending (a repairable gap, like an HWM drop);
    ``skip`` advances the sequence without buffering (an unrepairable gap); ``restart`` resets seq to 0;
    ``run(drop_tail=N)`` drops the last N batches of the run (the tail of a burst: no later batch reveals the gap).
    """

    def __init__(self, endpoint, bind=True, replay_endpoint=None, topic="", wire_format="vllm-map", hash_kind="int",
                 block_size=16, rank=0, replay_topic=True, batch_format="array", buffer_steps=10000, ctx=None):
        self.ctx = ctx or zmq.Context.instance()
        self.endpoint = endpoint
        self.bind = bind
        self.topic = topic.encode() if isinstance(topic, str) else topic
        self.wire_format = wire_format
        self.hash_kind = hash_kind
        self.block_size = block_size
        self.rank = rank
        self.replay_topic = replay_topic
        self.batch_format = batch_format
        self.seq = 0
        self.step = 0
        self.sent = 0
        self.buffer = collections.deque(maxlen=buffer_steps)
        self.subscribed = False
        self.left = False   # a subscriber came and the last one went: the check that read this stream is done
        self.pub, _mon = open_socket(self.ctx, zmq.XPUB, endpoint, bind)
        self.disconnects = None if bind else self.pub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.router = None
        if replay_endpoint:
            self.router, _mon = open_socket(self.ctx, zmq.ROUTER, replay_endpoint, bind=True)

    def subscriptions(self):
        """Read what the XPUB socket reports: a subscription (the first subscriber came) or its withdrawal (the last one
        left: closed its socket, or libzmq dropped its connection); and, where this publisher connects (libzmq keeps a
        connecting socket's pipe, so no withdrawal comes), its monitor's disconnection. True while a subscriber is there."""
        while self.pub.poll(0, zmq.POLLIN):
            msg = self.pub.recv()
            if msg[:1] == b"\x01":
                self.subscribed = True
            elif msg[:1] == b"\x00" and self.subscribed:
                self.subscribed, self.left = False, True
        while self.disconnects is not None and self.disconnects.poll(0, zmq.POLLIN):
            self.disconnects.recv_multipart()
            if self.subscribed:
                self.subscribed, self.left = False, True
        return self.subscribed

    def wait_subscriber(self, timeout, clock=time.monotonic):
        """Wait for a subscription message on the XPUB socket; True if one arrived."""
        deadline = clock() + timeout
        while clock() < deadline:
            self.serve_replay(0.05)
            if self.subscriptions():
                return True
        return False

    def next_payload(self, **kwargs):
        events = synthetic_events(self.wire_format, self.step, self.block_size, hash_kind=self.hash_kind, **kwargs)
        rank_key = "attn_dp_rank" if self.wire_format == "sglang" else "data_parallel_rank"
        self.step += 1
        return encode_batch(events, rank=self.rank, batch_format=self.batch_format, rank_key=rank_key)

    def publish(self, payload=None, drop=False, skip=0, **kwargs):
        """Publish one batch; returns its seq."""
        self.seq += skip
        if payload is None:
            payload = self.next_payload(**kwargs)
        seq = self.seq
        self.seq += 1
        self.buffer.append((seq, payload))
        if not drop:
            self.pub.send_multipart([self.topic, seq_to_bytes(seq), payload])
            self.sent += 1
        return seq

    def send_raw(self, frames):
        """Send arbitrary frames (malformed-input tests)."""
        self.pub.send_multipart(frames)

    def restart(self):
        """Behave like a restarted engine: seq back to 0, replay buffer emptied."""
        self.seq = 0
        self.step = 0
        self.buffer.clear()

    def serve_replay(self, timeout=0.0):
        """Answer pending replay requests (like vLLM's publisher thread)."""
        if self.router is None:
            if timeout > 0:
                time.sleep(timeout)
            return 0
        served = 0
        while self.router.poll(int(timeout * 1000), zmq.POLLIN):
            timeout = 0
            frames = self.router.recv_multipart()
            if len(frames) != 3:
                continue  # vLLM logs "Invalid replay request" and ignores it
            ident, start = frames[0], int.from_bytes(frames[2], "big")
            for seq, payload in list(self.buffer):
                if seq >= start:
                    head = [ident, b"", self.topic] if self.replay_topic else [ident, b""]
                    self.router.send_multipart(head + [seq_to_bytes(seq), payload])
            head = [ident, b"", b""] if self.replay_topic else [ident, b""]
            self.router.send_multipart(head + [END_SEQ_BYTES, b""])
            served += 1
        return served

    def run(self, count=10, interval=0.05, drop_at=(), skip_at=(), restart_at=(), unknown_at=(), malformed_at=(),
            wait_subscriber=0.0, linger=0.0, duration=None, stop=None, clock=time.monotonic, drop_tail=0, payload=None,
            hold_at=None, hold=None, until_unsubscribed=False):
        """Publish ``count`` batches (bounded by ``duration``), serving replay between them.

        ``linger``: then keep serving replay that long, or with ``until_unsubscribed`` until the subscriber has gone (a
        check closes its socket once it is done), whichever comes first: a bound, not a delay.

        ``payload``: send these bytes as every batch instead of generated events. ``hold_at``/``hold``: before batch
        ``hold_at``, wait (at most 60 s, a bound only; serving replay) until the ``threading.Event`` ``hold`` is set.
        """
        start = clock()
        end = start + duration if duration else None
        if wait_subscriber:
            self.wait_subscriber(wait_subscriber, clock)
        for i in range(count):
            if (end and clock() >= end) or (stop is not None and stop.is_set()):
                break
            if i == hold_at and hold is not None:
                held_until = clock() + 60.0
                while not hold.is_set() and clock() < held_until and not (stop is not None and stop.is_set()):
                    self.serve_replay(0.02)
            if i in restart_at:
                self.restart()
            if i in malformed_at:
                self.send_raw([self.topic, seq_to_bytes(self.seq), b"\xc1garbage"])
                self.seq += 1
            else:
                self.publish(payload=payload, drop=i in drop_at or i >= count - drop_tail, skip=1 if i in skip_at else 0,
                             unknown=i in unknown_at)
            self.serve_replay(interval)
        until = clock() + linger
        while clock() < until and not (stop is not None and stop.is_set()) and not (end and clock() >= end):
            if until_unsubscribed:
                self.subscriptions()
                if self.left and not self.subscribed:
                    break
            self.serve_replay(0.05)
        return self.sent

    def close(self):
        if self.disconnects is not None:
            self.pub.disable_monitor()
            self.disconnects.close(0)
        for sock in (self.pub, self.router):
            if sock is not None:
                sock.close(0)
