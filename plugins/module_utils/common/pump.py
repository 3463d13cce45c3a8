# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""Bytes from one socket to another until either side ends (pure Python, no Ansible).

Used by the relays that join two connections: ``epp/extproc.py``'s TLS relay, ``tools/_epp_local.py``'s bridge
between two loopbacks and the tests' TLS proxy. ``ssl.SSLError`` is an ``OSError``, so TLS sockets need nothing more.
When ``src`` ends or fails, both sockets are shut down, so the pump of the other direction ends too.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import socket


def pump(src, dst):
    """Copy ``src`` to ``dst`` until ``src`` ends or fails; then shut both down."""
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    for sock in (src, dst):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
