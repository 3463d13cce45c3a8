# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""Ask a running llm-d EPP where it routes a request, the way Envoy asks it (pure Python, no Ansible).

The EPP's only request path is Envoy's external processing protocol (``envoy.service.ext_proc.v3``, gRPC; the
bindings are PyPI's ``xds-protos`` with ``grpcio``). ``ask_pick`` opens one ``Process`` stream, sends the request
headers and then the whole body (end of stream), and reads the EPP's answer to the headers: the endpoints it picked
in the ``x-gateway-destination-endpoint`` header (primary first, comma-separated fallbacks) and in the ``envoy.lb``
dynamic metadata (llm-d/llm-d-router@v0.9.0:pkg/epp/handlers/request.go generateRequestHeaderResponse,
pkg/epp/metadata/consts.go). The stream is then closed: the request never reaches an engine. The EPP handles it as
it would any request up to the pick (its scheduler runs, and plugins that record picks at routing time, the
approximate producer and speculative indexing, record this one).

A gateway may narrow the candidates to a subset of the pool's endpoints (``subset``): Envoy passes it in the request's
metadata context, namespace ``envoy.lb.subset_hint``, key ``x-gateway-destination-endpoint-subset``, a list of
``ip:port`` (kubernetes-sigs/gateway-api-inference-extension@v1.4.0:pkg/epp/metadata/consts.go,
pkg/epp/requestcontrol/locator.go; the llm-d EPP inherits it), with every message of the stream as Envoy sends it. The
EPP then picks among those only.

TLS goes through Python's ``ssl`` (the options of the collection's HTTP client: ``validate_certs``, ``ca_path``,
``client_cert``, ``client_key``, ``server_name``) on a loopback relay that gRPC reaches in plain HTTP/2: the EPP's
default certificate is self-signed with no name at all (llm-d-router@v0.9.0:internal/tls/tls.go), which gRPC's own
TLS cannot be told to accept.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import socket
import ssl
import threading
import traceback
import uuid

try:
    import grpc
    from envoy.config.core.v3 import base_pb2
    from google.protobuf import struct_pb2
    from envoy.service.ext_proc.v3 import external_processor_pb2 as extproc_pb
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as extproc_grpc
    HAS_EXTPROC = True
    EXTPROC_IMPORT_ERROR = None
except ImportError:  # pragma: no cover - exercised through the module's missing_required_lib path
    grpc = base_pb2 = extproc_pb = extproc_grpc = struct_pb2 = None
    HAS_EXTPROC = False
    EXTPROC_IMPORT_ERROR = traceback.format_exc()

from ..common.errors import CheckError
from ..common.duplex import duplex

DESTINATION_HEADER = "x-gateway-destination-endpoint"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
DEFAULT_PORT = 9002


def _split(value):
    return [part.strip() for part in (value or "").split(",") if part.strip()]


class _TLSRelay:
    """Loopback TCP listener that relays each connection to ``host:port`` over TLS (ALPN h2)."""

    def __init__(self, host, port, context, server_name, timeout):
        self.host, self.port, self.context, self.server_name, self.timeout = host, port, context, server_name, timeout
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.address = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.error = None
        self.closed = False
        self.sockets = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while not self.closed:
            try:
                local, _addr = self.listener.accept()
            except OSError:
                return
            try:
                raw = socket.create_connection((self.host, self.port), timeout=self.timeout)
                remote = self.context.wrap_socket(raw, server_hostname=self.server_name)
                remote.settimeout(None)
            except (OSError, ssl.SSLError, ssl.CertificateError) as exc:
                # The first failure says what is wrong; a reconnect by gRPC after it can fail otherwise (a CI run under
                # load once got WRONG_VERSION_NUMBER after a hostname mismatch), which would name the wrong cause.
                if self.error is None:
                    self.error = exc
                local.close()
                continue
            self.sockets.append(local)
            # One thread for both directions, and the only one to touch the TLS socket: OpenSSL's connection must never be
            # used by two threads at once.
            threading.Thread(target=duplex, args=(local, remote), daemon=True).start()

    def close(self):
        """Stop accepting and end every connection: their plain sides are shut down, so each join ends in its own thread."""
        self.closed = True
        for sock in [self.listener] + self.sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.listener.close()


def tls_context(validate_certs=True, ca_path=None, client_cert=None, client_key=None):
    """The client TLS context of the collection's HTTP options, speaking HTTP/2 (ALPN h2), as gRPC servers require."""
    context = ssl.create_default_context(cafile=ca_path) if validate_certs else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if not validate_certs:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if client_cert:
        context.load_cert_chain(client_cert, client_key)
    context.set_alpn_protocols(["h2"])
    return context


def split_target(target):
    """``(host, port)`` of ``host:port``, ``[v6]:port`` or a bare host (port 9002, the EPP's ext_proc default)."""
    target = (target or "").strip()
    if "://" in target:
        raise ValueError("the EPP's ext_proc address is host:port, not a URL: %r" % target)
    if target.startswith("["):
        host, _sep, rest = target[1:].partition("]")
        port = rest.lstrip(":") or str(DEFAULT_PORT)
    elif target.count(":") == 1:
        host, port = target.split(":")
    else:
        host, port = target, str(DEFAULT_PORT)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("the EPP's ext_proc address must be host:port (port 1-65535), got %r" % target)
    return host, int(port)


def _requests(headers, body, subset=None):
    items = [base_pb2.HeaderValue(key=k, raw_value=v.encode("utf-8")) for k, v in headers]
    metadata = None
    if subset is not None:
        hint = struct_pb2.Struct()
        hint.update({SUBSET_KEY: list(subset)})
        metadata = base_pb2.Metadata(filter_metadata={SUBSET_NAMESPACE: hint})
    yield extproc_pb.ProcessingRequest(
        request_headers=extproc_pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=items), end_of_stream=False), metadata_context=metadata)
    # Envoy forwards the metadata context with every message; the EPP keeps the last one's (GIE v1.4.0
    # pkg/epp/handlers/server.go sets reqCtx.Request.Metadata on each message) and schedules at the end of the body.
    yield extproc_pb.ProcessingRequest(request_body=extproc_pb.HttpBody(body=body, end_of_stream=True), metadata_context=metadata)


def _answer(response):
    """What one ProcessingResponse says of the pick: (header endpoints, metadata endpoints, immediate status, body)."""
    kind = response.WhichOneof("response")
    if kind == "immediate_response":
        immediate = response.immediate_response
        return None, None, int(immediate.status.code), immediate.body.decode("utf-8", "replace")[:300]
    if kind != "request_headers":
        return None, None, None, None
    header = []
    for option in response.request_headers.response.header_mutation.set_headers:
        if option.header.key.lower() == DESTINATION_HEADER:
            header = _split(option.header.raw_value.decode("utf-8", "replace") or option.header.value)
    meta = []
    fields = response.dynamic_metadata.fields
    if LB_NAMESPACE in fields:
        inner = fields[LB_NAMESPACE].struct_value.fields
        if DESTINATION_HEADER in inner:
            meta = _split(inner[DESTINATION_HEADER].string_value)
    return header, meta, None, None


def _grpc_sentence(exc, where, timeout, tls):
    code = exc.code() if hasattr(exc, "code") else None
    detail = (exc.details() if hasattr(exc, "details") else "") or str(exc)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return ("The EPP at %s did not answer within %ss; check that it runs and that its scheduler finds endpoints (its log says "
                "why), or raise timeout." % (where, timeout))
    if code == grpc.StatusCode.UNAVAILABLE and "refused" in detail.lower():
        return ("Nothing listens at %s: the connection was refused; check the EPP's address and ext_proc port (--grpc-port, %d by "
                "default) and that the EPP runs." % (where, DEFAULT_PORT))
    if code == grpc.StatusCode.UNAVAILABLE:
        hint = ("whether it serves TLS at all (the EPP runs plain gRPC with --secure-serving=false: set tls false)" if tls else
                "whether it serves TLS (the EPP's default, --secure-serving=true: set tls true)")
        return ("Cannot reach the EPP's ext_proc service at %s: %s; check the address (the EPP listens on --grpc-port, %d by "
                "default) and %s." % (where, " ".join(detail.split())[:200], DEFAULT_PORT, hint))
    return "The EPP at %s failed the ext_proc stream: %s %s." % (where, code.name if code else "error", " ".join(detail.split())[:300])


def ask_pick(target, body, headers=None, path="/v1/completions", timeout=10.0, tls=False, validate_certs=True, ca_path=None,
             client_cert=None, client_key=None, server_name=None, subset=None):
    """Ask the EPP at ``target`` (host:port) where it routes a POST of ``body`` (bytes) to ``path``; ``subset``, a list
    of ``ip:port``, narrows the candidates as a gateway's subset hint does.

    Returns ``{"picked": "ip:port", "endpoints": [...], "metadata_endpoints": [...], "request_id": ...}``; raises
    ``CheckError`` with one sentence when the EPP cannot be asked, answers the request itself, or names no endpoint.
    """
    try:
        host, port = split_target(target)
    except ValueError as exc:
        text = str(exc)
        raise CheckError("%s%s." % (text[:1].upper(), text[1:]))
    where = "%s:%d" % (host, port)
    request_id = str(uuid.uuid4())
    sent = [(":method", "POST"), (":path", path), (":authority", host), (":scheme", "https" if tls else "http"),
            ("content-type", "application/json"), ("content-length", str(len(body))), ("x-request-id", request_id)]
    sent.extend((str(k).lower(), str(v)) for k, v in sorted((headers or {}).items()))
    relay = None
    try:
        if tls:
            try:
                context = tls_context(validate_certs, ca_path, client_cert, client_key)
            except (OSError, ssl.SSLError) as exc:
                raise CheckError("Cannot set up TLS for the EPP at %s: %s." % (where, getattr(exc, "strerror", None) or exc))
            relay = _TLSRelay(host, port, context, server_name or host, timeout)
            channel = grpc.insecure_channel(relay.address)
        else:
            channel = grpc.insecure_channel(where)
        try:
            stub = extproc_grpc.ExternalProcessorStub(channel)
            stream = stub.Process(_requests(sent, body, subset), timeout=timeout)
            header = meta = None
            try:
                for response in stream:
                    header, meta, status, text = _answer(response)
                    if status is not None:
                        raise CheckError("The EPP at %s answered the request itself with HTTP %d (%s) and picked no endpoint; its "
                                         "log says why (no endpoint ready, or the body was refused)." % (where, status, text or "no body"))
                    if header is not None:
                        break
            except grpc.RpcError as exc:
                if relay is not None and "WRONG_VERSION_NUMBER" in str(relay.error):
                    raise CheckError("The EPP at %s does not answer in TLS; set tls false (it runs plain gRPC, --secure-serving=false)."
                                     % where)
                if isinstance(getattr(relay, "error", None), OSError) and not isinstance(relay.error, ssl.SSLError):
                    raise CheckError("Cannot reach the EPP's ext_proc service at %s: %s; check the address and port (--grpc-port, %d "
                                     "by default) and that the EPP runs." % (where, relay.error.strerror or relay.error, DEFAULT_PORT))
                if relay is not None and relay.error is not None:
                    raise CheckError("Cannot open TLS to the EPP at %s: %s; set validate_certs false for the EPP's self-signed "
                                     "certificate, give ca_path, or set tls false if it serves plain gRPC." % (where, relay.error))
                raise CheckError(_grpc_sentence(exc, where, timeout, tls))
            finally:
                stream.cancel()
        finally:
            channel.close()
    finally:
        if relay is not None:
            relay.close()
    endpoints = header or meta or []
    if not endpoints:
        raise CheckError("The EPP at %s answered without naming an endpoint (no %s header nor %s metadata); is it the llm-d EPP?" % (
            where, DESTINATION_HEADER, LB_NAMESPACE))
    return {"picked": endpoints[0], "endpoints": endpoints, "metadata_endpoints": meta or [], "request_id": request_id}
