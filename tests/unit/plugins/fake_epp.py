# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A stand-in for the llm-d EPP's ext_proc service: answers a request's headers and body with a configured pick.

It answers the way llm-d-router@v0.9.0:pkg/epp/handlers/request.go does: after the body's end of stream, a
HeadersResponse whose header mutation sets x-gateway-destination-endpoint and whose dynamic metadata carries the
same under envoy.lb. ``answer`` may also be "immediate" (an ImmediateResponse 503), "nothing" (no endpoint named) or
"hang" (no answer). ``pick`` may be a function of the request body (bytes) returning "ip:port[,ip:port...]".
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import time
from concurrent import futures

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from envoy.type.v3 import http_status_pb2
from google.protobuf import json_format, struct_pb2


class FakeEPP(pb_grpc.ExternalProcessorServicer):
    def __init__(self, pick="10.0.0.2:8000,10.0.0.1:8000", answer="pick", tls=None):
        self.pick = pick
        self.answer = answer
        self.seen = []
        self.metadata = []   # each request's metadata context (filter metadata, as plain dicts)
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        pb_grpc.add_ExternalProcessorServicer_to_server(self, self.server)
        if tls:
            creds = grpc.ssl_server_credentials([(tls[1], tls[0])])
            self.port = self.server.add_secure_port("127.0.0.1:0", creds)
        else:
            self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = "127.0.0.1:%d" % self.port

    def __enter__(self):
        self.server.start()
        return self

    def __exit__(self, *exc):
        self.server.stop(0)

    def Process(self, request_iterator, context):  # noqa: N802  pylint: disable=invalid-name
        headers = {}
        for req in request_iterator:
            kind = req.WhichOneof("request")
            if kind == "request_headers":
                headers = dict((h.key, h.raw_value.decode()) for h in req.request_headers.headers.headers)
                self.metadata.append(dict((k, json_format.MessageToDict(v)) for k, v in req.metadata_context.filter_metadata.items()))
            elif kind == "request_body" and req.request_body.end_of_stream:
                self.metadata.append(dict((k, json_format.MessageToDict(v)) for k, v in req.metadata_context.filter_metadata.items()))
                self.seen.append((headers, req.request_body.body))
                if self.answer == "hang":
                    time.sleep(30)
                    return
                if self.answer == "immediate":
                    yield pb.ProcessingResponse(immediate_response=pb.ImmediateResponse(
                        status=http_status_pb2.HttpStatus(code=503), body=b"no endpoints available"))
                    return
                pick = self.pick(req.request_body.body) if callable(self.pick) else self.pick
                options = [] if self.answer == "nothing" else [base_pb2.HeaderValueOption(
                    header=base_pb2.HeaderValue(key="x-gateway-destination-endpoint", raw_value=pick.encode()))]
                meta = struct_pb2.Struct()
                if self.answer != "nothing":
                    meta.update({"envoy.lb": {"x-gateway-destination-endpoint": pick}})
                yield pb.ProcessingResponse(
                    request_headers=pb.HeadersResponse(response=pb.CommonResponse(header_mutation=pb.HeaderMutation(set_headers=options))),
                    dynamic_metadata=meta)
                yield pb.ProcessingResponse(request_body=pb.BodyResponse(response=pb.CommonResponse()))


def self_signed(names=None):
    """(certificate PEM, key PEM) of a self-signed server certificate; with no names, like the EPP's own."""
    import datetime  # pylint: disable=import-outside-toplevel
    from cryptography import x509  # pylint: disable=import-outside-toplevel
    from cryptography.hazmat.primitives import hashes, serialization  # pylint: disable=import-outside-toplevel
    from cryptography.hazmat.primitives.asymmetric import ec  # pylint: disable=import-outside-toplevel
    from cryptography.x509.oid import NameOID  # pylint: disable=import-outside-toplevel
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, u"Inference Ext")])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True))
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
    cert = builder.sign(key, hashes.SHA256())
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
