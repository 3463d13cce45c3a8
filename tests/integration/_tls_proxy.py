# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A TLS-terminating TCP proxy for tests: https://127.0.0.1:<port> in front of a plain HTTP server.

``TLSProxy(target_port, folder)`` makes a self-signed certificate for 127.0.0.1 in ``folder`` (``cert``, its own
authority) and forwards every decrypted byte both ways, streams included. ``start()``, ``url``, ``stop()``.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import socket
import ssl
import threading

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.duplex import duplex
from ansible_collections.inference_cache.substrate.tests.unit.plugins.http_server import tls_server_context


class TLSProxy:
    def __init__(self, target_port, folder, target_host="127.0.0.1"):
        self.target = (target_host, target_port)
        self.context, self.cert = tls_server_context(folder)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.url = "https://127.0.0.1:%d" % self.listener.getsockname()[1]
        self.refused = 0   # handshakes that failed (a client that did not trust the certificate)
        self.refusals = []  # why each failed, as the server side saw it
        self._stop = threading.Event()

    def start(self):
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def stop(self):
        self._stop.set()
        self.listener.close()

    def _accept(self):
        while not self._stop.is_set():
            try:
                raw, _addr = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw):
        try:
            client = self.context.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            self.refused += 1
            self.refusals.append(str(exc))
            raw.close()
            return
        upstream = socket.create_connection(self.target)
        duplex(client, upstream)
