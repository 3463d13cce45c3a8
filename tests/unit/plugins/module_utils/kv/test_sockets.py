# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""kv/sockets.py: the KV-event sockets (bind or connect, monitored, bounded frames), vLLM's data-parallel ports, replay."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import threading
import time

import msgspec
import pytest
import zmq

from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import sockets as S
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.events import END_SEQ_BYTES
from ansible_collections.inference_cache.substrate.tests.unit.plugins.net_utils import free_port


@pytest.mark.parametrize("endpoint, rank, expected", [
    ("tcp://*:5557", 0, "tcp://*:5557"), ("tcp://*:5557", 2, "tcp://*:5559"), ("tcp://127.0.0.1:0", 1, "tcp://127.0.0.1:0"),
    ("ipc:///tmp/kv", 1, "ipc:///tmp/kv_dp1"), ("inproc://kv", 3, "inproc://kv_dp3"),
])
def test_offset_endpoint_is_vllms(endpoint, rank, expected):
    assert S.offset_endpoint(endpoint, rank) == expected


def test_an_endpoint_without_a_port_cannot_be_offset():
    with pytest.raises(ValueError, match="cannot offset the port of endpoint"):
        S.offset_endpoint("tcp://host", 1)


def test_a_monitored_sub_sees_its_peer_and_bounds_its_frames(zctx):
    endpoint = "tcp://127.0.0.1:%d" % free_port()
    sub, mon = S.open_socket(zctx, zmq.SUB, endpoint, bind=True, monitor=True, max_frame=2048)
    pub, _none = S.open_socket(zctx, zmq.PUB, endpoint, bind=False)
    try:
        assert sub.getsockopt(zmq.MAXMSGSIZE) == 2048 and _none is None
        until = time.monotonic() + 30
        while not S.drain_monitor(mon):
            assert time.monotonic() < until, "the monitor never saw the peer"
            time.sleep(0.02)
    finally:
        pub.close(0)
        sub.disable_monitor()
        mon.close(0)
        sub.close(0)


def test_a_failed_bind_leaves_nothing_open(zctx, inproc):
    first, _mon = S.open_socket(zctx, zmq.SUB, inproc[0], bind=True)
    try:
        with pytest.raises(zmq.ZMQError):
            S.open_socket(zctx, zmq.SUB, inproc[0], bind=True, monitor=True)
    finally:
        first.close(0)


def test_replay_yields_each_batch_until_the_end_marker(zctx, inproc):
    router = zctx.socket(zmq.ROUTER)
    router.bind(inproc[1])
    payload = msgspec.msgpack.encode([1.0, [], 0])

    def serve():
        identity, _empty, start = router.recv_multipart()
        first = int.from_bytes(start, "big")
        for seq in range(first, first + 2):
            router.send_multipart([identity, b"", b"kv@a:1@m", seq.to_bytes(8, "big"), payload])
        router.send_multipart([identity, b"", b"", END_SEQ_BYTES, b""])
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        got = list(S.replay(zctx, inproc[1], 5, time.monotonic() + 30))
    finally:
        thread.join(10)
        router.close(0)
    assert [(topic, seq) for topic, seq, _payload in got] == [("kv@a:1@m", 5), ("kv@a:1@m", 6)]
