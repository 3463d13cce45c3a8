# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A fake vLLM engine for the kv_index_check tests: HTTP on 127.0.0.1 and KV events over real ZMQ.

It caches like vLLM's prefix cache as far as the check can see it: chained block hashes over full blocks, hits
limited to ``prompt tokens - 1``, a fixed number of blocks, least recently used blocks evicted first (a request's
blocks are freed tail first), and a second cached copy of a block when a cached last block is recomputed. Each
request publishes one batch: the BlockRemoved of what it evicted, then one BlockStored of the blocks it computed.
Tokens are the prompt's whitespace-separated words (one token each) after a BOS token.

Its batches go out from a publisher thread of their own, as vLLM's do, through an XPUB socket, which sees
subscriptions: before its first batch it waits (at most ``SUBSCRIBER_WAIT`` seconds) until a subscription arrived, so
a test never depends on how fast a subscription crosses the machine (a PUB drops what it sends before then).
``restart()`` (or ``restart_after``) starts it again in place as vLLM does: the cache empty, the sequence numbers from
0 again, nothing published about it.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import collections
import hashlib
import json
import queue
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, HTTPServer

import msgspec
import zmq

BOS = 1
SUBSCRIBER_WAIT = 60.0   # seconds: generous, a bound only


def tokenize(prompt):
    return [BOS] + [zlib.crc32(word.encode("utf-8")) % 997 + 2 for word in prompt.split()]


def engine_hash(parent, tokens):
    digest = hashlib.sha256(("%s|%s" % (parent, ",".join(map(str, tokens)))).encode()).digest()
    return int.from_bytes(digest[:8], "big")


class FakeEngine:
    """One fake engine; ``with FakeEngine(...) as engine:`` serves until the block ends."""

    def __init__(self, port, endpoint, topic, block_size=4, num_blocks=24, model="tiny", report_cached=True, bind=True, host="127.0.0.1",
                 restart_after=None):
        self.port = port
        self.host = host
        self.url = "http://%s:%d" % (host, port)
        self.endpoint = endpoint
        self.topic = topic.encode()
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.model = model
        self.report_cached = report_cached
        self.bind = bind
        self.ctx = zmq.Context()
        self.pub = None
        self.seq = 0
        self.free = collections.OrderedDict()   # block id -> hash, least recently used first (all blocks are free between requests)
        self.cached = {}                        # hash -> set of block ids
        self.next_id = 0
        self.removed = 0
        self.copies = 0
        self.server = None
        self.thread = None
        self.subscribed = False
        self.outbox = queue.Queue()
        self.closing = threading.Event()
        self.publisher = None
        self.requests = 0
        self.restart_after = restart_after
        self.restarts = 0

    # -- cache ----------------------------------------------------------------------------
    def restart(self):
        """Start again in place (same address): an empty cache, sequence numbers from 0, and no AllBlocksCleared."""
        self.free.clear()
        self.cached.clear()
        self.seq = 0
        self.restarts += 1

    def publish(self, events):
        """Hand one batch to the publisher thread (as vLLM's engine hands it to its publisher thread): it is sent after the
        answer may have gone, never before a subscription arrived."""
        self.outbox.put([self.topic, self.seq.to_bytes(8, "big"), msgspec.msgpack.encode([time.time(), events, 0])])
        self.seq += 1

    def _publisher(self):
        """The publisher thread, the only user of the XPUB socket: waits (bounded) for a subscription, then sends in order."""
        deadline = time.monotonic() + SUBSCRIBER_WAIT
        while True:
            frames = self.outbox.get()
            if frames is None:
                return
            while not self.subscribed and not self.closing.is_set() and time.monotonic() < deadline:
                if self.pub.poll(100, zmq.POLLIN) and self.pub.recv()[:1] == b"\x01":
                    self.subscribed = True
            self.pub.send_multipart(frames)

    def complete(self, tokens):
        if self.restart_after is not None and self.requests == self.restart_after:
            self.restart()
        self.requests += 1
        size = self.block_size
        full = len(tokens) // size
        hashes, parent = [], None
        for idx in range(full):
            parent = engine_hash(parent, tokens[idx * size:(idx + 1) * size])
            hashes.append(parent)
        limit = (len(tokens) - 1) // size
        hit = 0
        used = []
        while hit < min(full, limit) and self.cached.get(hashes[hit]):
            block = next(iter(b for b in self.cached[hashes[hit]] if b in self.free), None)
            if block is None:
                break
            self.free.pop(block)
            used.append((block, hashes[hit]))
            hit += 1
        events = []
        new = []
        for idx in range(hit, full):
            if len(self.free) + len(used) + len(new) >= self.num_blocks and self.free:
                old, old_hash = self.free.popitem(last=False)
                self.cached[old_hash].discard(old)
                if not self.cached[old_hash]:
                    del self.cached[old_hash]
                events.append({"type": "BlockRemoved", "block_hashes": [old_hash], "medium": "GPU"})
                self.removed += 1
            block = self.next_id
            self.next_id += 1
            if hashes[idx] in self.cached:
                self.copies += 1
            self.cached.setdefault(hashes[idx], set()).add(block)
            new.append((block, hashes[idx]))
        if new:
            events.append({"type": "BlockStored", "block_hashes": [h for _b, h in new],
                           "parent_block_hash": hashes[hit - 1] if hit else None,
                           "token_ids": tokens[hit * size:full * size], "block_size": size, "lora_id": None,
                           "medium": "GPU", "lora_name": None})
        for block, value in reversed(used + new):   # freed tail first: the tail is evicted first
            self.free[block] = value
        if events:
            self.publish(events)
        return hit * size

    # -- HTTP -----------------------------------------------------------------------------
    def handler(self):
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # pylint: disable=arguments-differ
                pass

            def reply(self, status, body, ctype="application/json"):
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # pylint: disable=invalid-name
                if self.path == "/v1/models":
                    return self.reply(200, {"data": [{"id": engine.model}]})
                if self.path == "/metrics":
                    text = ('vllm:cache_config_info{block_size="%d",engine="0",num_gpu_blocks="%d"} 1.0\n'
                            % (engine.block_size, engine.num_blocks))
                    return self.reply(200, text.encode(), "text/plain")
                return self.reply(404, {"error": "not found"})

            def do_POST(self):  # pylint: disable=invalid-name
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                tokens = tokenize(body.get("prompt", ""))
                if self.path == "/tokenize":
                    return self.reply(200, {"count": len(tokens), "tokens": tokens})
                if self.path == "/v1/completions":
                    cached = engine.complete(tokens)
                    usage = {"prompt_tokens": len(tokens), "completion_tokens": 1, "total_tokens": len(tokens) + 1}
                    if engine.report_cached:
                        usage["prompt_tokens_details"] = {"cached_tokens": cached}
                    return self.reply(200, {"choices": [{"text": "x"}], "usage": usage})
                return self.reply(404, {"error": "not found"})
        return Handler

    def __enter__(self):
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        if self.bind:
            self.pub.bind(self.endpoint)
        else:
            self.pub.connect(self.endpoint)
        self.publisher = threading.Thread(target=self._publisher)
        self.publisher.daemon = True
        self.publisher.start()
        self.server = HTTPServer((self.host, self.port), self.handler())
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05})
        self.thread.daemon = True
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
        self.closing.set()
        self.outbox.put(None)
        self.publisher.join(SUBSCRIBER_WAIT + 5)
        self.pub.close(0)
        self.ctx.term()
        return False
