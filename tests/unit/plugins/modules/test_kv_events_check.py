# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""kv_events_check through AnsibleModule (set_module_args / AnsibleExitJson pattern), TCP on 127.0.0.1."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json
import math
import re
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.inference_cache.substrate.plugins.modules import kv_events_check
from ansible_collections.inference_cache.substrate.tests.unit.plugins.modules.utils import run_module as run
from ansible_collections.inference_cache.substrate.tests.unit.plugins.net_utils import free_port
from ansible_collections.inference_cache.substrate.tests.unit.plugins.sentences import assert_one_sentence
from ansible_collections.inference_cache.substrate.tests.unit.plugins.waiting import GatedClock


def run_module(args, check_mode=False):
    return run(kv_events_check, args, check_mode=check_mode)


@pytest.mark.parametrize("check_mode", [False, True])
def test_success_connect_mode(publisher, check_mode):
    ep = "tcp://127.0.0.1:%d" % free_port()
    with publisher(ep, bind=True, topic="kv-events", count=4):
        ok, res = run_module({"endpoint": ep, "topic": "kv", "timeout": 60, "settle": 0.2, "expect": {"BlockStored": 4}}, check_mode)
    assert ok, res
    assert res["changed"] is False
    assert res["counts"]["BlockStored"] == 4 and res["engine"] == "vllm"
    assert res["wire_format"] == {"batch": "array", "events": "map", "hashes": "int"}
    for key in ("counts", "batches", "seq", "gaps", "restarts", "topics", "ranks", "block_size", "stored_blocks", "stored_tokens",
                "removed_blocks", "wire_format", "engine", "sample", "malformed", "unknown_event_types", "elapsed", "trigger"):
        assert key in res


def test_success_bind_mode_with_replay(publisher):
    ep, rep = "tcp://127.0.0.1:%d" % free_port(), "tcp://127.0.0.1:%d" % free_port()
    with publisher(ep, bind=False, replay_endpoint=rep, count=6, drop_at={2}):
        ok, res = run_module({"endpoint": ep, "socket_mode": "bind", "replay_endpoint": rep, "timeout": 60, "settle": 0.2,
                              "expect": {"BlockStored": 6}})
    assert ok, res
    assert res["gaps"]["repaired"] == 1


# (name, module arguments, publisher arguments, the sentence, what must have arrived before the check's timeout may end it)
FAILURES = [
    ("nothing-bound", {"timeout": 0.3}, None, "the connection never completed, so nothing is bound there", None),
    ("nobody-connects", {"timeout": 0.3, "socket_mode": "bind"}, None, "no publisher connected", None),
    ("topic-mismatch", {"timeout": 1.0, "topic": "kv@"}, {"topic": "kv-events"}, "but messages arrived under topic 'kv-events'",
     lambda check: sum(check.stats.other_topics.values()) == 3),
    ("unmet", {"timeout": 1.0, "expect": {"AllBlocksCleared": 1}}, {}, "Expectations not met within 1.0s (3 batches received)",
     lambda check: check.stats.batches == 3),
    ("gap", {"timeout": 2.0}, {"drop_at": {1}}, "1 sequence gap left 1 batch missing", lambda check: check.stats.batches == 2),
    ("malformed", {"timeout": 2.0}, {"malformed_at": {0}}, "were malformed; first: the payload is not valid msgpack",
     lambda check: check.stats.malformed == 1 and check.stats.batches == 2),
    ("bad-expect", {"expect": {"Nope": 1}}, None, "expect names an unknown event type 'Nope'", None),
    ("wildcard-connect", {"endpoint": "tcp://*:1"}, None, "an endpoint with '*' can only be bound", None),
]


def gate_the_timeout(monkeypatch, timeout, ready):
    """The module's check, its timeout gated on ``ready(check)`` (``waiting.GatedClock``): the sentence a check ends with at its
    timeout counts what arrived, so the timeout may end it only once what the publisher sent is there."""
    base = kv_events_check.KVEventsCheck

    def gated(params, **kwargs):
        clock = GatedClock(0.9 * timeout)
        check = base(params, clock=clock, **kwargs)
        clock.ready = lambda: ready(check)
        return check
    monkeypatch.setattr(kv_events_check, "KVEventsCheck", gated)


@pytest.mark.parametrize("args,pub,msg,ready", [f[1:] for f in FAILURES], ids=[f[0] for f in FAILURES])
def test_failures(publisher, monkeypatch, args, pub, msg, ready):
    ep = "tcp://127.0.0.1:%d" % free_port()
    args = dict({"endpoint": ep, "settle": 0.2}, **args)
    if ready is not None:
        gate_the_timeout(monkeypatch, args["timeout"], ready)
    if pub is None:
        ok, res = run_module(args)
    else:
        with publisher(ep, bind=True, count=3, **pub):
            ok, res = run_module(args)
    assert not ok
    assert msg in res["msg"]
    assert res["changed"] is False and "counts" in res
    assert "Traceback" not in res["msg"]


def test_bind_in_use(publisher):
    ep = "tcp://127.0.0.1:%d" % free_port()
    with publisher(ep, bind=True, count=0, wait_subscriber=0):
        ok, res = run_module({"endpoint": ep, "socket_mode": "bind", "timeout": 0.5})
    assert not ok and "the address is already in use" in res["msg"]


def test_trigger_api_key_is_no_log():
    spec = kv_events_check.OPTIONS["trigger"]["options"]
    assert spec["api_key"]["no_log"] is True


@pytest.mark.parametrize("missing,lib", [("HAS_ZMQ", "pyzmq"), ("HAS_MSGSPEC", "msgspec")])
def test_missing_library(monkeypatch, missing, lib):
    monkeypatch.setattr(kv_events_check, missing, False)
    ok, res = run_module({"endpoint": "tcp://127.0.0.1:1"})
    assert not ok and "Failed to import the required Python library (%s)" % lib in res["msg"]


class _FakeOpenAI(BaseHTTPRequestHandler):
    requests = []

    def do_POST(self):  # noqa: N802  pylint: disable=invalid-name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _FakeOpenAI.requests.append((self.path, body, self.headers.get("Authorization")))
        self._reply({"usage": {"prompt_tokens": 40, "prompt_tokens_details": {"cached_tokens": 16}}})

    def do_GET(self):  # noqa: N802  pylint: disable=invalid-name
        self._reply({"data": [{"id": "tiny"}]})

    def _reply(self, obj):
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):  # pylint: disable=arguments-differ
        pass


@pytest.fixture
def fake_openai():
    server = HTTPServer(("127.0.0.1", 0), _FakeOpenAI)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _FakeOpenAI.requests = []
    yield "http://127.0.0.1:%d" % server.server_address[1]
    server.shutdown()
    server.server_close()


def test_trigger_through_open_url(publisher, fake_openai):
    ep = "tcp://127.0.0.1:%d" % free_port()
    with publisher(ep, bind=True, count=2):
        ok, res = run_module({"endpoint": ep, "timeout": 60, "settle": 0.2,
                              "trigger": {"url": fake_openai, "api_key": "sekrit", "prompt": "hello " * 40, "delay": 0.1}})
    assert ok, res
    assert res["trigger"] == {"sent": True, "url": fake_openai + "/v1/completions", "status": 200, "model": "tiny",
                              "prompt_tokens": 40, "cached_tokens": 16}
    assert _FakeOpenAI.requests[0][0] == "/v1/completions" and _FakeOpenAI.requests[0][2] == "Bearer sekrit"
    assert "hello" not in json.dumps(res)  # the prompt is never returned


def test_trigger_http_error_message(publisher):
    ep = "tcp://127.0.0.1:%d" % free_port()
    with publisher(ep, bind=True, count=2):
        ok, res = run_module({"endpoint": ep, "timeout": 60, "trigger": {"url": "http://127.0.0.1:%d" % free_port(), "model": "m"}})
    assert not ok and res["msg"].startswith("The trigger request failed: Cannot reach http://127.0.0.1:")
    assert res["trigger"]["sent"] is True and res["peer_connected"] == [True] and "counts" in res


# -- wrong types and shapes: one sentence naming the option, never a traceback ---------------------------------
def _text(**kwargs):
    """Printable text: ansible-core echoes a rejected choice as it is, control characters included."""
    return st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), **kwargs) if "alphabet" not in kwargs else st.text(**kwargs)


NOT_A_NUMBER = _text(alphabet="abcxyz -_", min_size=1, max_size=6).filter(lambda t: t.strip().lower() not in ("nan", "inf", "infinity"))
SHAPES = st.one_of(st.lists(st.integers(), min_size=1, max_size=3), st.dictionaries(_text(max_size=3), st.integers(), min_size=1, max_size=2))


def _bad_float(low, high):
    return st.one_of(st.floats(max_value=low, exclude_max=low == 0.0), st.floats(min_value=high, exclude_min=True),
                     st.sampled_from([float("nan"), float("inf"), float("-inf")]), NOT_A_NUMBER, SHAPES)


WRONG_VALUES = {
    "endpoint": st.one_of(_text(max_size=12).filter(lambda t: "://" not in t), st.integers(), SHAPES),
    "replay_endpoint": st.one_of(_text(min_size=1, max_size=12).filter(lambda t: "://" not in t), st.integers(), SHAPES),
    "socket_mode": _text(max_size=8).filter(lambda t: t not in ("connect", "bind")),
    "engine": _text(max_size=8).filter(lambda t: t not in ("auto", "vllm", "sglang")),
    "data_parallel_size": st.one_of(st.integers(max_value=0), st.integers(min_value=65), NOT_A_NUMBER, SHAPES,
                                    st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f != int(f))),
    "timeout": _bad_float(0.0, 86400.0),
    "settle": st.one_of(st.floats(max_value=-0.001), st.floats(min_value=3600.001), st.sampled_from([float("nan"), float("inf")]),
                        NOT_A_NUMBER, SHAPES),
    "expect": st.one_of(st.lists(st.integers(), min_size=1, max_size=3),
                        st.dictionaries(_text(min_size=1, max_size=8).filter(lambda k: k not in ("BlockStored", "BlockRemoved", "AllBlocksCleared")),
                                        st.integers(0, 3), min_size=1, max_size=2),
                        st.dictionaries(st.sampled_from(["BlockStored", "BlockRemoved"]),
                                        st.one_of(st.integers(max_value=-1), st.lists(st.integers(), max_size=2), NOT_A_NUMBER,
                                                  st.floats(allow_nan=False).filter(lambda f: not math.isfinite(f) or f != int(f))),
                                        min_size=1, max_size=2)),
    "trigger": st.one_of(SHAPES.filter(lambda v: not isinstance(v, dict)),
                         st.fixed_dictionaries({"url": _text(max_size=10).filter(lambda u: not u.lower().startswith(("http://", "https://")))}),
                         st.fixed_dictionaries({"url": st.just("http://127.0.0.1:9"), "max_tokens": st.one_of(st.integers(max_value=0), SHAPES)}),
                         st.fixed_dictionaries({"url": st.just("http://127.0.0.1:9"), "delay": _bad_float(0.0, 3600.0)}),
                         st.fixed_dictionaries({"url": st.just("http://127.0.0.1:9"), "headers": st.lists(st.integers(), min_size=1, max_size=2)}),
                         st.fixed_dictionaries({"model": _text(max_size=5)})),
    "include_token_ids": st.one_of(_text(alphabet="abcxyz", min_size=2, max_size=6).filter(lambda t: t not in ("yes", "no", "on", "off")), SHAPES),
    "expect_removed_after_stored": st.one_of(st.integers(min_value=2), SHAPES),
}


# Sentences of ansible-core's argument validation (type conversion, choices, required suboptions).
ANSIBLE_OWN = ("argument '", "value of ", "missing required arguments", "Unsupported parameters", "elements of ")


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(sorted(WRONG_VALUES)).flatmap(lambda name: st.tuples(st.just(name), WRONG_VALUES[name])))
def test_wrong_types_and_shapes_fail_with_one_sentence(case):
    name, value = case
    ok, res = run_module({"endpoint": "tcp://127.0.0.1:1", "timeout": 0.3, "settle": 0.0, name: value})
    assert not ok, res
    msg = res["msg"]
    assert_one_sentence(msg)
    if not msg.startswith(ANSIBLE_OWN):  # ansible-core's own argument messages have their own form
        assert msg.endswith(".") and not re.search(r"[.!?]\s+[A-Z]", msg), "not one sentence: %r" % msg
    assert name.split("_after")[0] in msg or name in msg, msg  # the sentence names the option
    assert res.get("peer_connected", []) == [], msg  # refused before a socket opened, so before waiting for the stream
