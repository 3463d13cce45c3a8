# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The OpenAI client through ansible.module_utils.urls, against a scripted HTTP(S) server on 127.0.0.1.

Wrong answers (shapes, sizes, non-JSON), wrong options (timeouts, URLs, headers) and transport failures must all
come back as ``OpenAIHTTPError`` with one sentence on one line; TLS and proxy options must reach the transport.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json
import os
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.inference_cache.substrate.plugins.module_utils.http import openai as http
from ansible_collections.inference_cache.substrate.tests.unit.plugins.http_server import ScriptedServer, sse, tls_scripted_server
from ansible_collections.inference_cache.substrate.tests.unit.plugins.net_utils import free_port

USAGE = {"prompt_tokens": 40, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 32}}


@pytest.fixture(scope="module")
def server():
    srv = ScriptedServer().start()
    yield srv
    srv.stop()


@pytest.fixture(autouse=True)
def no_proxy_env(monkeypatch):
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)


def one_sentence(text):
    """The shape every failure must have: one line, no traceback, no Python object or exception-class noise."""
    assert "\n" not in text and text.strip() == text and text
    for noise in ("Traceback", "object has no attribute", "Error(", "Exception", "errno", "<class"):
        assert noise not in text, text
    return True


def test_uses_ansible_urls():
    assert http.HAS_ANSIBLE_URLS and http.Request is not None


def test_stream_completion_times_first_token_and_reads_usage(server):
    server.routes["/v1/completions"] = (200, "text/event-stream", sse(
        {"choices": [{"text": ""}]}, {"choices": [{"text": "he"}]}, {"choices": [{"delta": {"content": "y"}}]},
        {"choices": [], "usage": USAGE}))
    ticks = iter([0.0, 0.05, 0.2])  # start, the first chunk with a text (even empty), end
    client = http.OpenAIClient(server.url + "/", api_key="k", clock=lambda: next(ticks))
    answer = client.stream_completion({"model": "m", "prompt": "p"})
    method, path, headers, body = server.requests[-1]
    assert (method, path) == ("POST", "/v1/completions")
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True} and body["prompt"] == "p"
    assert headers["Authorization"] == "Bearer k" and headers["Accept"] == "text/event-stream"
    assert answer["ttft"] == 0.05 and answer["latency"] == 0.2
    assert answer["text"] == "hey" and answer["chunks"] == 4
    assert http.cached_tokens(answer["usage"]) == 32


def test_get_and_post(server):
    server.routes["/metrics"] = (200, "text/plain", b"up 1\n")
    server.routes["/tokenize"] = (200, "application/json", lambda body: json.dumps({"count": len(body["prompt"])}).encode())
    client = http.OpenAIClient(server.url)
    assert client.get_text("/metrics") == "up 1\n" and client.last_status == 200
    assert client.post_json("/tokenize", {"prompt": "abc"}) == {"count": 3}


def test_stream_without_chunks_fails(server):
    server.routes["/v1/completions"] = (200, "text/event-stream", [b"data: [DONE]\n\n"])
    with pytest.raises(http.OpenAIHTTPError, match="streamed no completion chunk"):
        http.OpenAIClient(server.url).stream_completion({"model": "m", "prompt": "p"})


def test_http_error_carries_status_and_detail(server):
    server.routes["/tokenize"] = (404, "text/plain", b"nope\nnot here")
    client = http.OpenAIClient(server.url)
    with pytest.raises(http.OpenAIHTTPError) as info:
        client.post_json("/tokenize", {})
    assert info.value.status == 404 and client.last_status == 404
    assert str(info.value) == "%s/tokenize answered HTTP 404: nope not here" % server.url


def test_closed_port_is_one_sentence():
    port = free_port()
    with pytest.raises(http.OpenAIHTTPError) as info:
        http.OpenAIClient("http://127.0.0.1:%d" % port, timeout=2).get_text("/metrics")
    assert str(info.value) == "Cannot reach http://127.0.0.1:%d/metrics: Connection refused" % port
    assert one_sentence(str(info.value))


@pytest.mark.parametrize("base", ["ftp://h", "http://", "http://[::1", "h:80"])
def test_not_an_http_url(base):
    with pytest.raises(http.OpenAIHTTPError) as info:
        http.OpenAIClient(base).get_text("/x")
    assert str(info.value).endswith(": not an http(s) URL") and one_sentence(str(info.value))


@pytest.mark.parametrize("timeout", [0, -3, "soon", float("nan"), float("inf"), None, True])
def test_bad_timeouts_are_a_sentence(server, timeout):
    """Today's 'Operation now in progress' (0) and 'Timeout value out of range' (-3) become one sentence."""
    with pytest.raises(http.OpenAIHTTPError) as info:
        http.OpenAIClient(server.url, timeout=timeout).get_text("/metrics")
    assert "the timeout must be a positive number of seconds" in str(info.value)
    assert one_sentence(str(info.value))


def test_a_server_that_never_answers_times_out():
    import socket  # pylint: disable=import-outside-toplevel
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    try:
        with pytest.raises(http.OpenAIHTTPError) as info:
            http.OpenAIClient("http://127.0.0.1:%d" % listener.getsockname()[1], timeout=0.3).get_text("/metrics")
    finally:
        listener.close()
    assert str(info.value).endswith(": timed out") and one_sentence(str(info.value))


def test_header_with_a_line_break_is_refused_without_echoing_it(server):
    with pytest.raises(http.OpenAIHTTPError) as info:
        http.OpenAIClient(server.url, api_key="sec\nret").get_text("/metrics")
    assert "sec" not in str(info.value) and "header Authorization" in str(info.value)


def test_body_larger_than_the_limit(server):
    server.routes["/metrics"] = (200, "text/plain", b"x" * 5000)
    assert len(http.OpenAIClient(server.url, max_body_bytes=5000).get_text("/metrics")) == 5000
    with pytest.raises(http.OpenAIHTTPError, match=r"answered more than 4999 bytes \(max_body_bytes\)$"):
        http.OpenAIClient(server.url, max_body_bytes=4999).get_text("/metrics")


def test_stream_larger_than_the_limit(server):
    chunk = {"choices": [{"text": "x" * 100}]}
    server.routes["/v1/completions"] = (200, "text/event-stream", sse(*[chunk] * 50))
    with pytest.raises(http.OpenAIHTTPError, match=r"streamed more than 2000 bytes \(max_body_bytes\)$"):
        http.OpenAIClient(server.url, max_body_bytes=2000).stream_completion({"prompt": "p"})
    # a single endless line is cut at the limit too
    server.routes["/v1/completions"] = (200, "text/event-stream", [b"data: " + b"y" * 10000])
    with pytest.raises(http.OpenAIHTTPError, match="streamed more than 2000 bytes"):
        http.OpenAIClient(server.url, max_body_bytes=2000).stream_completion({"prompt": "p"})


@pytest.mark.parametrize("chunk, message", [
    ([1, 2], "streamed a chunk that is not a JSON object"),
    ("text", "streamed a chunk that is not a JSON object"),
    ({"choices": "abc"}, "streamed choices that are not a list"),
    ({"choices": ["abc"]}, "streamed a choice that is not a JSON object"),
    ({"choices": [{"text": 5}]}, "streamed a choice text that is not a string"),
    ({"choices": [{"delta": "x"}]}, "streamed a choice delta that is not a JSON object"),
    ({"choices": [{"delta": {"content": ["x"]}}]}, "streamed a choice text that is not a string"),
    ({"usage": [1]}, "reported a usage that is not a JSON object"),
    ({"usage": {"prompt_tokens": "many"}}, 'reported usage.prompt_tokens that is not a whole number: "many"'),
    ({"usage": {"prompt_tokens": -1}}, "reported usage.prompt_tokens that is not a whole number: -1"),
    ({"usage": {"prompt_tokens_details": [0]}}, "reported usage.prompt_tokens_details that is not a JSON object"),
    ({"usage": {"prompt_tokens_details": {"cached_tokens": "lots"}}}, 'reported cached_tokens that is not a whole number: "lots"'),
    ({"usage": {"prompt_tokens_details": {"cached_tokens": True}}}, "reported cached_tokens that is not a whole number: true"),
    ({"error": {"message": "model\nnot found", "code": 404}}, "streamed an error: model not found"),
    (b"{not json", "streamed a chunk that is not JSON"),
])
def test_stream_of_the_wrong_shape_is_one_sentence(server, chunk, message):
    server.routes["/v1/completions"] = (200, "text/event-stream", sse(chunk))
    with pytest.raises(http.OpenAIHTTPError) as info:
        http.OpenAIClient(server.url).stream_completion({"prompt": "p"})
    assert str(info.value) == "%s/v1/completions %s" % (server.url, message)
    assert one_sentence(str(info.value))


def test_non_json_answer(server):
    server.routes["/v1/models"] = (200, "application/json", b"<html>")
    with pytest.raises(http.OpenAIHTTPError, match=r"/v1/models did not answer JSON$"):
        http.OpenAIClient(server.url).get_json("/v1/models")


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(
        ["choices", "text", "delta", "content", "usage", "prompt_tokens", "prompt_tokens_details", "cached_tokens",
         "error", "message", "x"]), inner, max_size=4),
    max_leaves=12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunks=st.lists(JSON, min_size=1, max_size=3))
def test_any_json_stream_is_an_answer_or_one_sentence(server, chunks):
    server.routes["/v1/completions"] = (200, "text/event-stream", sse(*chunks))
    try:
        answer = http.OpenAIClient(server.url, timeout=5).stream_completion({"prompt": "p"})
    except http.OpenAIHTTPError as exc:
        assert one_sentence(str(exc))
    else:
        assert isinstance(answer["text"], str)
        # an answer handed back has the OpenAI shape: callers may read it without checking again
        assert answer["usage"] is None or http.check_usage(answer["usage"]) is answer["usage"]


@settings(max_examples=100, deadline=None)
@given(usage=JSON)
def test_cached_tokens_never_raises(usage):
    value = http.cached_tokens(usage)
    assert value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)


@pytest.mark.parametrize("listing, ids", [
    ({"object": "list", "data": [{"id": "tiny"}, {"id": "other"}]}, ["tiny", "other"]),
    ({"data": []}, []),
    ({"data": [{"object": "model"}, "tiny", {"id": "b"}, {"id": ["x"]}, {"id": 3}]}, ["b"]),
    ({"data": {"id": "x"}}, []),
    ({"detail": "Not Found"}, []),
    ([{"id": "tiny"}], []),
    (None, []),
])
def test_model_ids(listing, ids):
    assert http.model_ids(listing) == ids


def test_cached_tokens_absent_or_wrong():
    assert http.cached_tokens(None) is None
    assert http.cached_tokens({"prompt_tokens": 3}) is None
    assert http.cached_tokens([1]) is None
    assert http.cached_tokens({"prompt_tokens_details": {"cached_tokens": "lots"}}) is None
    assert http.cached_tokens({"prompt_tokens_details": {"cached_tokens": 64}}) == 64


# -- the platform's options reach the transport ------------------------------------------------------------------
def test_proxy_from_the_environment_is_used_unless_use_proxy_is_false(server, monkeypatch):
    proxy = ScriptedServer().start()
    try:
        proxy.routes["http://127.0.0.1:9/metrics"] = (200, "text/plain", b"via proxy\n")
        monkeypatch.setenv("http_proxy", proxy.url)
        assert http.OpenAIClient("http://127.0.0.1:9").get_text("/metrics") == "via proxy\n"
        assert proxy.requests[-1][1] == "http://127.0.0.1:9/metrics"
        server.routes["/metrics"] = (200, "text/plain", b"direct\n")
        monkeypatch.setenv("http_proxy", "http://127.0.0.1:%d" % free_port())
        assert http.OpenAIClient(server.url, use_proxy=False).get_text("/metrics") == "direct\n"
    finally:
        proxy.stop()


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    """The scripted server behind TLS with a self-signed certificate for 127.0.0.1."""
    srv, cert = tls_scripted_server(tmp_path_factory.mktemp("tls"))
    srv.routes["/metrics"] = (200, "text/plain", b"secure 1\n")
    srv.start()
    yield srv, cert
    srv.stop()


def test_tls_is_verified_against_ca_path(tls_server):
    srv, cert = tls_server
    with pytest.raises(http.OpenAIHTTPError) as info:
        http.OpenAIClient(srv.url, timeout=5).get_text("/metrics")
    assert "certificate verify failed" in str(info.value) and one_sentence(str(info.value))
    assert "_ssl.c" not in str(info.value)
    assert http.OpenAIClient(srv.url, timeout=5, ca_path=cert).get_text("/metrics") == "secure 1\n"
    assert http.OpenAIClient(srv.url, timeout=5, validate_certs=False).get_text("/metrics") == "secure 1\n"


def test_missing_client_certificate_file_is_a_sentence(tls_server):
    srv, cert = tls_server
    with pytest.raises(http.OpenAIHTTPError) as info:
        http.OpenAIClient(srv.url, timeout=5, ca_path=cert, client_cert=os.path.join(os.path.dirname(cert), "none.pem")).get_text("/metrics")
    assert str(info.value).startswith("Cannot reach %s/metrics: " % srv.url) and one_sentence(str(info.value))


def test_without_ansible_the_stdlib_transport_applies_the_same_options(tls_server, monkeypatch):
    """The cluster verifier's Job has no Ansible: the urllib fallback must verify TLS the same way."""
    srv, cert = tls_server
    monkeypatch.setattr(http, "Request", None)
    monkeypatch.setattr(http, "make_context", None)
    with pytest.raises(http.OpenAIHTTPError, match="certificate verify failed"):
        http.OpenAIClient(srv.url, timeout=5).get_text("/metrics")
    assert http.OpenAIClient(srv.url, timeout=5, ca_path=cert).get_text("/metrics") == "secure 1\n"
    assert http.OpenAIClient(srv.url, timeout=5, validate_certs=False).get_text("/metrics") == "secure 1\n"


def test_a_request_without_a_context_parameter_uses_the_stdlib_transport(tls_server, monkeypatch):
    """ansible-core 2.16's Request takes no prepared TLS context (2.17 added it): the urllib transport carries the
    client's own context, verifying as Request would, and Request is never handed an argument it refuses."""
    class OldRequest:  # pylint: disable=too-few-public-methods
        def __init__(self, headers=None, use_proxy=True, timeout=10, validate_certs=True, ca_path=None):
            raise AssertionError("Request must not be used without a context parameter")

    assert http._takes_context(OldRequest) is False  # pylint: disable=protected-access
    assert http._takes_context(http.Request) is http.REQUEST_TAKES_CONTEXT  # pylint: disable=protected-access
    srv, cert = tls_server
    monkeypatch.setattr(http, "Request", OldRequest)
    monkeypatch.setattr(http, "REQUEST_TAKES_CONTEXT", False)
    with pytest.raises(http.OpenAIHTTPError, match="certificate verify failed"):
        http.OpenAIClient(srv.url, timeout=5).get_text("/metrics")
    assert http.OpenAIClient(srv.url, timeout=5, ca_path=cert).get_text("/metrics") == "secure 1\n"


def test_threads_do_not_share_state(server):
    """One client per thread, as H6's multi-engine check may do: no module-level state is shared."""
    server.routes["/metrics"] = (200, "text/plain", b"up 1\n")
    results = []
    threads = [threading.Thread(target=lambda: results.append(http.OpenAIClient(server.url).get_text("/metrics"))) for dummy in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == ["up 1\n"] * 4


def test_tls_context_is_built_once_per_client(tls_server, monkeypatch):
    """Loading the CA bundle costs ~0.15 s: once per client, never inside each (timed) request; none for plain http."""
    srv, cert = tls_server
    built = []
    real = http.make_context
    monkeypatch.setattr(http, "make_context", lambda **kwargs: built.append(kwargs) or real(**kwargs))
    client = http.OpenAIClient(srv.url, timeout=5, ca_path=cert)
    assert [client.get_text("/metrics") for dummy in range(3)] == ["secure 1\n"] * 3
    assert built == [{"cafile": cert, "validate_certs": True, "client_cert": None, "client_key": None}]
