# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""The ZMQ transport of the KV-event streams (pure Python, no Ansible): the one file that opens their sockets.

``open_socket`` creates a monitored SUB (or any other) socket with bounded queues and frame size, then binds or
connects it; ``replay(ctx, endpoint, start_seq, deadline)`` asks a vLLM / SGLang replay ROUTER for the batches
from ``start_seq`` on and yields ``(topic, seq, payload)``. Both raise ``zmq.ZMQError`` as it comes: the consumer
(``kv/consumer.py``, the only user within module_utils) turns it into one sentence. The synthetic publisher used
by the tests and ``tools/kv_events_publish.py`` lives in ``tests/harness/kv_synthetic.py``, outside the module payload.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import time
import traceback

try:
    import zmq
    from zmq.utils.monitor import recv_monitor_message
    HAS_ZMQ = True
    ZMQ_IMPORT_ERROR = None
except ImportError:  # pragma: no cover - exercised by the module's missing_required_lib path
    zmq = None
    recv_monitor_message = None
    HAS_ZMQ = False
    ZMQ_IMPORT_ERROR = traceback.format_exc()

from .events import MAX_PAYLOAD, parse_replay_reply, seq_to_bytes

PEER_EVENTS = ("EVENT_CONNECTED", "EVENT_ACCEPTED", "EVENT_HANDSHAKE_SUCCEEDED")
# Largest inbound frame accepted (ZMQ_MAXMSGSIZE): a bigger one makes libzmq drop the connection instead of
# allocating it; the decoder refuses payloads above MAX_PAYLOAD anyway.
MAX_FRAME = MAX_PAYLOAD + 65536


def offset_endpoint(endpoint, rank):
    """vLLM ``offset_endpoint_port``: tcp port + rank (a port of 0 is left for the OS), ipc/inproc suffix ``_dp<rank>``."""
    if not rank:
        return endpoint
    if endpoint.startswith(("ipc://", "inproc://")):
        return "%s_dp%d" % (endpoint, rank)
    head, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError("cannot offset the port of endpoint %r for data-parallel rank %d" % (endpoint, rank))
    if int(port) == 0:  # vllm@v0.32.0:vllm/distributed/kv_events.py offset_endpoint_port
        return endpoint
    return "%s:%d" % (head, int(port) + rank)


def peer_event_mask():
    mask = 0
    for name in PEER_EVENTS:
        mask |= getattr(zmq, name, 0)
    return mask


def open_socket(ctx, kind, endpoint, bind, monitor=False, hwm=100000, max_frame=MAX_FRAME):
    """Create, optionally monitor, then bind or connect a socket. Returns (socket, monitor or None).

    Inbound frames larger than ``max_frame`` bytes make libzmq drop that connection (``ZMQ_MAXMSGSIZE``). Raises
    ``zmq.ZMQError`` (nothing left open) when the socket cannot be created, bound or connected.
    """
    sock = ctx.socket(kind)  # EMFILE here: too many sockets or open files
    sock.setsockopt(zmq.LINGER, 0)
    if max_frame and kind in (zmq.SUB, zmq.DEALER):
        sock.setsockopt(zmq.MAXMSGSIZE, max_frame)
    if kind == zmq.SUB:
        sock.setsockopt(zmq.RCVHWM, hwm)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
    elif kind == zmq.DEALER:  # room for a whole replay answer: the engine's ROUTER drops what does not fit
        sock.setsockopt(zmq.RCVHWM, hwm)
    elif kind in (zmq.PUB, zmq.XPUB):
        sock.setsockopt(zmq.SNDHWM, hwm)
    mon = None
    try:
        if monitor:
            mon = sock.get_monitor_socket(peer_event_mask())
        if bind:
            sock.bind(endpoint)
        else:
            sock.connect(endpoint)
    except zmq.ZMQError:
        if mon is not None:
            sock.disable_monitor()
            mon.close(0)
        sock.close(0)
        raise
    return sock, mon


def drain_monitor(mon):
    """Return True if the monitor reported a connected peer (non-blocking)."""
    seen = False
    while True:
        try:
            msg = recv_monitor_message(mon, zmq.NOBLOCK)
        except zmq.Again:
            return seen
        if msg.get("event") & peer_event_mask():
            seen = True


def replay(ctx, endpoint, start_seq, deadline, idle=2.0, clock=time.monotonic):
    """Ask a ROUTER replay endpoint for batches from ``start_seq``.

    Yields ``(topic or None, seq, payload)``; stops at the end marker, after ``idle`` quiet seconds or at
    ``deadline``. Raises ``zmq.ZMQError`` if the DEALER cannot connect (bad endpoint) and ``MalformedMessage`` for
    a reply that is no replay answer.
    """
    sock, _mon = open_socket(ctx, zmq.DEALER, endpoint, bind=False)
    try:
        sock.send_multipart([b"", seq_to_bytes(start_seq)])
        last = clock()
        while True:
            now = clock()
            wait = min(deadline - now, idle - (now - last))
            if wait <= 0:
                return
            if not sock.poll(int(wait * 1000) + 1, zmq.POLLIN):
                continue
            frames = sock.recv_multipart()
            last = clock()
            topic, seq, payload, is_end = parse_replay_reply(frames)
            if is_end:
                return
            yield topic, seq, payload
    finally:
        sock.close(0)
