# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A scripted HTTP server on 127.0.0.1 for the tests of the OpenAI client and the prefix_cache_check module.

``ScriptedServer.routes`` maps a path to ``(status, content_type, body)``, where ``body`` is bytes, or a list of
byte chunks sent with chunked transfer encoding (a stream), or a callable ``body(request_json)`` returning either.
Every request is recorded in ``requests`` as ``(method, path, headers, json_body)``.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json
import os
import threading

try:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
except ImportError:  # pragma: no cover - Python 2
    BaseHTTPRequestHandler = ThreadingHTTPServer = object


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # pylint: disable=arguments-differ
        pass

    def _answer(self):
        server = self.server.scripted
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw
        path = self.path.split("?")[0]
        server.requests.append((self.command, path, dict(self.headers), body))
        status, ctype, payload = server.routes.get(path, (404, "text/plain", b"no route"))
        if callable(payload):
            payload = payload(body)
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        if isinstance(payload, list):
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for piece in payload:
                if piece:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        self.wfile.flush()

    do_GET = _answer
    do_POST = _answer


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        """A client that hangs up early (a size limit, a TLS refusal) is part of the tests, not an error to print."""


class ScriptedServer:
    """Start with ``start()``; ``url`` is its base URL; ``stop()`` shuts it down."""

    def __init__(self):
        self.routes = {}
        self.requests = []
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.scripted = self
        self.url = "http://127.0.0.1:%d" % self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05})
        self._thread.daemon = True

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._httpd.shutdown()
        self._httpd.server_close()


def sse(*chunks):
    """A completion stream: each chunk as ``data: <json>`` (bytes pass through), then ``data: [DONE]``."""
    lines = []
    for chunk in chunks:
        data = chunk if isinstance(chunk, bytes) else json.dumps(chunk).encode("utf-8")
        lines.append(b"data: " + data + b"\n\n")
    lines.append(b"data: [DONE]\n\n")
    return lines


def tls_server_context(folder):
    """A TLS server context with a self-signed certificate for 127.0.0.1, made with openssl in ``folder``.

    Returns ``(context, cert_path)``; the certificate is its own authority (``ca_path``).
    """
    import ssl  # pylint: disable=import-outside-toplevel
    import subprocess  # pylint: disable=import-outside-toplevel
    cert, key = os.path.join(str(folder), "cert.pem"), os.path.join(str(folder), "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert],
                   check=True, capture_output=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context, cert


def tls_scripted_server(folder):
    """A ScriptedServer behind TLS (``tls_server_context``). Returns ``(server, cert_path)``; the server is not started."""
    srv = ScriptedServer()
    context, cert = tls_server_context(folder)
    # pylint: disable=protected-access
    srv._httpd.socket = context.wrap_socket(srv._httpd.socket, server_side=True)
    srv.url = srv.url.replace("http://", "https://")
    return srv, cert
