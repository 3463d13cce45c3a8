# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""common/duplex.py: both directions in one thread, nothing lost when one side ends."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import socket
import threading

from ansible_collections.inference_cache.substrate.plugins.module_utils.common import duplex as duplex_mod


def _joined():
    """Two socket pairs joined by duplex in a thread: (left end, right end, thread)."""
    left, inner_left = socket.socketpair()
    inner_right, right = socket.socketpair()
    thread = threading.Thread(target=duplex_mod.duplex, args=(inner_left, inner_right), daemon=True)
    thread.start()
    for sock in (left, right):
        sock.settimeout(20)
    return left, right, thread


def _read_all(sock):
    got = bytearray()
    for data in iter(lambda: sock.recv(65536), b""):
        got += data
    return bytes(got)


def _recv_exactly(sock, size, into):
    got = bytearray()
    while len(got) < size:
        data = sock.recv(65536)
        if not data:
            break
        got += data
    into.append(bytes(got))


def test_both_directions_at_once_arrive_intact():
    left, right, thread = _joined()
    there, back = bytes(range(256)) * 4096, bytes(reversed(range(256))) * 4096
    got_there, got_back = [], []
    workers = [threading.Thread(target=left.sendall, args=(there,)), threading.Thread(target=right.sendall, args=(back,)),
               threading.Thread(target=_recv_exactly, args=(right, len(there), got_there)),
               threading.Thread(target=_recv_exactly, args=(left, len(back), got_back))]
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(20)
        assert (got_there, got_back) == ([there], [back])
    finally:
        left.close()
        right.close()
        thread.join(20)
    assert not thread.is_alive()


def test_what_was_sent_before_an_end_is_delivered_then_the_other_side_ends_too():
    """More than the relay holds for one side (LIMIT) is written, then that side closes: all of it arrives, then EOF."""
    left, right, thread = _joined()
    sent = b"x" * (3 * duplex_mod.LIMIT + 17)
    writer = threading.Thread(target=lambda: (left.sendall(sent), left.shutdown(socket.SHUT_WR)))
    writer.start()
    try:
        assert _read_all(right) == sent
        writer.join(20)
        thread.join(20)
        assert not thread.is_alive()
        assert left.recv(1) == b"", "the side that ended is shut down too"
    finally:
        left.close()
        right.close()


def test_the_far_side_closing_ends_the_join():
    left, right, thread = _joined()
    try:
        right.close()
        assert left.recv(1) == b""
        thread.join(20)
        assert not thread.is_alive()
    finally:
        left.close()
