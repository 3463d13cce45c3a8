# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""Bytes both ways between two sockets, in one thread, until either side ends; then both are closed (pure Python, no Ansible).

Used by the relays that join two connections: ``epp/extproc.py``'s TLS relay, ``service/confine.py``'s bridge
between two loopbacks and the tests' TLS proxy. One thread does both directions because a TLS socket must never be read
in one thread while another writes it: OpenSSL's connection object is not thread-safe, and a relay with a thread per
direction corrupted records under load (``SSLV3_ALERT_BAD_RECORD_MAC``; the gRPC client then saw "Socket closed").
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import selectors
import socket
import ssl

CHUNK = 65536
LIMIT = 1 << 20   # bytes held for one side before reading from the other pauses

_AGAIN = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


def _watch(selector, watched, sock, events):
    if events == watched.get(sock, 0):
        return
    if not events:
        selector.unregister(sock)
        del watched[sock]
    elif sock in watched:
        selector.modify(sock, events)
    else:
        selector.register(sock, events)
    if events:
        watched[sock] = events


def duplex(one, two):
    """Copy ``one`` to ``two`` and ``two`` to ``one`` until either ends or fails, then deliver what was read and shut down
    and close both (the thread that ran the join is the last to touch them)."""
    peer = {one: two, two: one}
    queued = {one: bytearray(), two: bytearray()}   # read from the peer, to be written to this socket
    ended = False
    selector = selectors.DefaultSelector()
    watched = {}   # socket -> the events the selector waits for on it
    try:
        for sock in peer:
            sock.setblocking(False)
        while True:
            readers = [] if ended else [sock for sock in peer if len(queued[peer[sock]]) < LIMIT]
            writers = [sock for sock in peer if queued[sock]]
            if not readers and not writers:
                break
            # Bytes a TLS object has decrypted already wait in it, not in the socket: select would not see them.
            ready = [sock for sock in readers if getattr(sock, "pending", None) and sock.pending()]
            if ready:
                readable, writable = ready, []
            else:
                for sock in peer:
                    _watch(selector, watched, sock, (selectors.EVENT_READ if sock in readers else 0) |
                           (selectors.EVENT_WRITE if sock in writers else 0))
                chosen = selector.select()
                readable = [key.fileobj for key, mask in chosen if mask & selectors.EVENT_READ]
                writable = [key.fileobj for key, mask in chosen if mask & selectors.EVENT_WRITE]
            for sock in writable:
                try:
                    sent = sock.send(queued[sock])
                except _AGAIN:
                    continue
                del queued[sock][:sent]
            for sock in readable:
                try:
                    data = sock.recv(CHUNK)
                except _AGAIN:
                    continue
                except OSError:
                    data = b""
                if not data:
                    ended = True   # deliver what the other side is owed, then stop
                    break
                queued[peer[sock]] += data
    except OSError:
        pass
    finally:
        selector.close()
        for sock in peer:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
