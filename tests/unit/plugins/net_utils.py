# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Small network helpers shared by the tests that open real sockets on 127.0.0.1."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import socket


# The ports handed out so far: the kernel may give a port just closed again, so two calls in one test (an engine's HTTP
# port and its publisher's) could get the same one and the second bind fail with "address in use".
_GIVEN = set()


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on right now, and none given before by this process."""
    while True:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port
