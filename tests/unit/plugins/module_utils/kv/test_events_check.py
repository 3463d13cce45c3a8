# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The check runner against the in-process synthetic publisher over inproc:// sockets (fast, no ports)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json
import re
import threading
import time

import msgspec
import pytest
import zmq

from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.args import KV_STREAM_ARG_SPEC
from ansible_collections.inference_cache.substrate.plugins.module_utils.common.errors import CheckError
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.events_check import (
    CHECK_ARG_SPEC,
    WINDOW_OPTIONS,
    KVEventsCheck,
    RequestWindows,
    send_trigger,
)
from ansible_collections.inference_cache.substrate.plugins.module_utils.http.args import HTTP_ARG_SPEC
from ansible_collections.inference_cache.substrate.plugins.module_utils.http.openai import OpenAIHTTPError
from ansible_collections.inference_cache.substrate.tests.unit.plugins.http_server import tls_scripted_server
from ansible_collections.inference_cache.substrate.tests.unit.plugins.net_utils import free_port
from ansible_collections.inference_cache.substrate.tests.unit.plugins.sentences import assert_one_sentence
from ansible_collections.inference_cache.substrate.tests.unit.plugins.waiting import GatedClock
from ansible_collections.inference_cache.substrate.tests.harness import kv_synthetic as synth


def params(**kw):
    # A generous timeout: a check that gets what it expects stops as soon as the stream settles, whatever the timeout.
    out = dict((k, v.get("default")) for k, v in list(KV_STREAM_ARG_SPEC.items()) + list(CHECK_ARG_SPEC.items()))
    out.update({"timeout": 60.0, "settle": 0.2})
    out.update(kw)
    return out


def run(zctx, ready=None, **kw):
    """The check's run. ``ready(check)``: a check that ends at its timeout ends there only once ``ready`` holds (what the
    publisher sent arrived, a peer connected), so the sentence it ends with does not depend on the machine's speed."""
    clock = {}
    if ready is not None:
        gated = GatedClock(0.9 * kw["timeout"])
        clock["clock"] = gated
    check = KVEventsCheck(params(**kw), ctx=zctx, **clock)
    if ready is not None:
        gated.ready = lambda: ready(check)
    return check.run()


# One sentence: one line with no Python error text (the shared helper), ending with its only full stop.
SENTENCE_BREAK = re.compile(r"[.!?]\s+[A-Z]")


def one_sentence(msg):
    assert_one_sentence(msg)
    assert msg.endswith(".") and not SENTENCE_BREAK.search(msg), "not one sentence: %r" % msg


def fail(zctx, ready=None, **kw):
    with pytest.raises(CheckError) as info:
        run(zctx, ready=ready, **kw)
    one_sentence(info.value.msg)
    assert info.value.facts["changed"] is False
    return info.value


@pytest.mark.parametrize("wire_format", ["vllm-map", "vllm-array", "sglang"])
def test_connect_mode_counts(zctx, inproc, publisher, wire_format):
    with publisher(inproc[0], bind=True, wire_format=wire_format, topic="kv@pod@m"):
        facts = run(zctx, endpoint=inproc[0], topic="kv@", expect={"BlockStored": 6, "BlockRemoved": 2})
    assert facts["counts"]["BlockStored"] == 6 and facts["batches"] == 6
    assert facts["seq"] == {"kv@pod@m#0": {"first": 0, "last": 5, "batches": 6}}
    assert facts["stored_blocks"] == 12 and facts["stored_tokens"] == 192 and facts["block_size"] == 16
    assert facts["wire_format"]["hashes"] == "int"
    assert facts["wire_format"]["events"] == ("map" if wire_format == "vllm-map" else "array")
    assert facts["topics"] == {"kv@pod@m": 6} and facts["gaps"]["found"] == 0
    assert facts["peer_connected"] == [True]
    json.dumps(facts)


def test_bind_mode_publisher_connects(zctx, inproc, publisher):
    pub = publisher(inproc[0], bind=False, hash_kind="bytes")
    check = KVEventsCheck(params(endpoint=inproc[0], socket_mode="bind", expect={"BlockStored": 6}), ctx=zctx)
    with pub:
        facts = check.run()
    assert facts["counts"]["BlockStored"] == 6 and facts["wire_format"]["hashes"] == "bytes"


@pytest.mark.parametrize("replay_topic", [True, False], ids=["reply-with-topic", "reply-without-topic"])
def test_gap_repaired_through_replay(zctx, inproc, publisher, replay_topic):
    with publisher(inproc[0], replay_endpoint=inproc[1], replay_topic=replay_topic, count=8, drop_at={3, 4}):
        facts = run(zctx, endpoint=inproc[0], replay_endpoint=inproc[1], expect={"BlockStored": 8})
    assert facts["gaps"]["found"] == 1 and facts["gaps"]["repaired"] == 1 and facts["gaps"]["unrepaired"] == 0
    assert facts["batches"] == 8 and facts["counts"]["BlockStored"] == 8


def test_gap_without_replay_fails(zctx, inproc, publisher):
    with publisher(inproc[0], count=6, drop_at={2}):
        exc = fail(zctx, endpoint=inproc[0], expect={"BlockStored": 5})
    assert "1 sequence gap left 1 batch missing (first in stream #0, seq 2-2); set replay_endpoint" in exc.msg
    assert exc.facts["gaps"]["unrepaired"] == 1


def test_gap_replay_cannot_repair_fails(zctx, inproc, publisher):
    with publisher(inproc[0], replay_endpoint=inproc[1], count=6, skip_at={3}):
        exc = fail(zctx, endpoint=inproc[0], replay_endpoint=inproc[1], expect={"BlockStored": 6})
    assert "replay from %s could not supply them" % inproc[1] in exc.msg


def test_restart_detected_not_fatal(zctx, inproc, publisher):
    with publisher(inproc[0], count=8, restart_at={4}):
        facts = run(zctx, endpoint=inproc[0], expect={"BlockStored": 8})
    assert len(facts["restarts"]) == 1 and facts["restarts"][0]["to"] == 0


def test_unknown_event_types_not_fatal(zctx, inproc, publisher):
    with publisher(inproc[0], count=4, unknown_at={1}):
        facts = run(zctx, endpoint=inproc[0], expect={"BlockStored": 4})
    assert facts["unknown_event_types"] == {"FutureEvent": 1}


def test_topic_mismatch_names_topic(zctx, inproc, publisher):
    with publisher(inproc[0], topic="kv-events", count=3):
        exc = fail(zctx, endpoint=inproc[0], topic="kv@", timeout=1.0, ready=lambda check: check.stats.other_topics)
    assert "but messages arrived under topic 'kv-events'; set topic to match" in exc.msg


def test_malformed_frames_fail(zctx, inproc, publisher):
    with publisher(inproc[0], count=4, malformed_at={1}):
        exc = fail(zctx, endpoint=inproc[0], expect={"BlockStored": 3})
    assert "1 message or event of 4 messages received were malformed; first: the payload is not valid msgpack" in exc.msg


def test_unmet_expectations_fail(zctx, inproc, publisher):
    with publisher(inproc[0], count=3):
        exc = fail(zctx, endpoint=inproc[0], expect={"BlockStored": 1, "AllBlocksCleared": 2}, timeout=1.0,
                   ready=lambda check: check.stats.batches == 3)
    assert exc.msg.startswith("Expectations not met within 1.0s (3 batches received): AllBlocksCleared 0/2.")


def test_removed_after_stored(zctx, inproc, publisher):
    with publisher(inproc[0], count=5):
        facts = run(zctx, endpoint=inproc[0], expect_removed_after_stored=True, expect={})
    assert facts["removed_after_stored"] >= 1
    # A fresh endpoint: the first publisher's inproc name is released by libzmq's reaper thread, maybe not yet.
    with publisher(inproc[0] + "-again", count=2):
        exc = fail(zctx, endpoint=inproc[0] + "-again", expect_removed_after_stored=True, expect={}, timeout=1.0,
                   ready=lambda check: check.stats.batches == 2)
    assert "no BlockRemoved for a block stored during the check" in exc.msg


NO_BLOCK_SIZE = msgspec.msgpack.encode(
    [1.5, [{"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": list(range(16)), "medium": "GPU"}], 0])


def test_batches_held_against_the_routers_decoder(zctx, inproc, publisher):
    with publisher(inproc[0], count=4):
        facts = run(zctx, endpoint=inproc[0], expect={"BlockStored": 4})
    assert facts["router_decoder"] == {"router_version": "v0.9.0", "decoder": "llm-d-kv-cache v0.9.0 vLLM adapter",
                                       "checked_batches": facts["batches"], "refused_batches": 0, "first_problem": None}
    assert facts["batches"] >= 4


def test_a_batch_the_router_drops_is_reported_and_fails_when_expected(zctx, inproc, publisher):
    """This module reads a BlockStored without block_size; the EPP v0.9.0's decoder drops the whole batch."""
    with publisher(inproc[0], count=3, payload=NO_BLOCK_SIZE):
        facts = run(zctx, endpoint=inproc[0], expect={"BlockStored": 3})
    router = facts["router_decoder"]
    assert router["refused_batches"] == router["checked_batches"] >= 3
    assert router["first_problem"] == "batch 0 on topic '': event 0 BlockStored.block_size is nil, not an integer"
    with publisher(inproc[0] + "-again", count=3, payload=NO_BLOCK_SIZE):
        exc = fail(zctx, endpoint=inproc[0] + "-again", expect={"BlockStored": 3}, expect_router_decodes=True)
    assert exc.msg.startswith("The llm-d router v0.9.0 would drop 3 of the 3 batches checked (its KV-event decoder, "
                              "llm-d-kv-cache v0.9.0 vLLM adapter, refuses them"), exc.msg
    assert exc.msg.endswith("first: batch 0 on topic '': event 0 BlockStored.block_size is nil, not an integer."), exc.msg


def test_router_version_none_holds_nothing(zctx, inproc, publisher):
    with publisher(inproc[0], count=2, payload=NO_BLOCK_SIZE):
        facts = run(zctx, endpoint=inproc[0], expect={"BlockStored": 2}, router_version="none")
    assert facts["router_decoder"]["checked_batches"] == 0 and facts["router_decoder"]["decoder"] is None


def test_connect_never_completes(zctx, inproc):
    exc = fail(zctx, endpoint=inproc[0], timeout=0.3)
    assert "the connection never completed, so nothing is bound there" in exc.msg
    assert "set socket_mode=bind" in exc.msg


def test_bind_nobody_connects(zctx, inproc):
    exc = fail(zctx, endpoint=inproc[0], socket_mode="bind", timeout=0.3)
    assert "no publisher connected; the engine must connect to this address" in exc.msg


@pytest.mark.parametrize("publisher_binds", [True, False])
def test_connected_but_silent(zctx, publisher, publisher_binds):
    endpoint = "tcp://127.0.0.1:%d" % free_port()  # inproc sockets report no connection events: use TCP here
    with publisher(endpoint, bind=publisher_binds, count=0, wait_subscriber=0):
        exc = fail(zctx, endpoint=endpoint, timeout=0.5, socket_mode="connect" if publisher_binds else "bind",
                   ready=lambda check: all(s.connected for s in check.streams))
    assert exc.facts["peer_connected"] == [True]
    assert "although a publisher connected" in exc.msg


def test_bind_address_in_use(zctx):
    holder = zctx.socket(zmq.PUB)
    port = holder.bind_to_random_port("tcp://127.0.0.1")
    try:
        exc = fail(zctx, endpoint="tcp://127.0.0.1:%d" % port, socket_mode="bind", timeout=0.3)
    finally:
        holder.close(0)
    assert "the address is already in use; if the engine binds this endpoint" in exc.msg


def test_connect_to_wildcard_refused(zctx):
    exc = fail(zctx, endpoint="tcp://*:5557", timeout=0.3)
    assert "an endpoint with '*' can only be bound" in exc.msg


INVALID = [
    ({"expect": {"BlockStoredX": 1}}, "expect names an unknown event type 'BlockStoredX'"),
    ({"expect": {"BlockStored": -1}}, "expect.BlockStored must be a non-negative integer (at most 1000000000), got -1."),
    ({"expect": {"BlockStored": "many"}}, "expect.BlockStored must be a non-negative integer"),
    ({"expect": {"BlockStored": 1.5}}, "expect.BlockStored must be a non-negative integer"),
    ({"expect": ["BlockStored"]}, "expect must be a mapping, got ['BlockStored']."),
    ({"data_parallel_size": 0}, "data_parallel_size must be between 1 and 64, got 0."),
    ({"data_parallel_size": 100000}, "data_parallel_size must be between 1 and 64, got 100000."),
    ({"data_parallel_size": "2"}, "data_parallel_size must be an integer, got '2'."),
    ({"timeout": 0}, "timeout must be above 0 and at most 86400, got 0."),
    ({"timeout": -3}, "timeout must be above 0 and at most 86400, got -3."),
    ({"timeout": float("nan")}, "timeout must be a number, got nan."),
    ({"timeout": float("inf")}, "timeout must be above 0 and at most 86400, got inf."),
    ({"timeout": 1e9}, "timeout must be above 0 and at most 86400, got 1000000000."),
    ({"settle": -1.0}, "settle must be between 0 and 3600, got -1."),
    ({"settle": [1]}, "settle must be a number, got [1]."),
    ({"endpoint": "localhost:5557"}, "endpoint must be a ZMQ endpoint such as tcp://HOST:PORT"),
    ({"endpoint": ["tcp://h:1"]}, "endpoint must be a string, got ['tcp://h:1']."),
    ({"endpoint": None}, "endpoint is required."),
    ({"replay_endpoint": "5558"}, "replay_endpoint must be a ZMQ endpoint"),
    ({"socket_mode": "both"}, "socket_mode must be one of connect, bind, got 'both'."),
    ({"engine": "trt"}, "engine must be one of auto, vllm, sglang, got 'trt'."),
    ({"topic": 5}, "topic must be a string, got 5."),
    ({"include_token_ids": "yes"}, "include_token_ids must be true or false"),
    ({"trigger": "http://x"}, "trigger must be a mapping, got 'http://x'."),
    ({"trigger": {"model": "m"}}, "trigger.url is required."),
    ({"trigger": {"url": "ftp://x"}}, "trigger.url must be an http:// or https:// URL"),
    ({"trigger": {"url": "http://x", "max_tokens": 0}}, "trigger.max_tokens must be between 1 and 1000000, got 0."),
    ({"trigger": {"url": "http://x", "delay": -1}}, "trigger.delay must be between 0 and 3600, got -1."),
    ({"trigger": {"url": "http://x", "headers": ["a"]}}, "trigger.headers must be a mapping, got ['a']."),
    ({"trigger": {"url": "http://x", "headers": {"X-A": ["1"]}}}, "trigger.headers must be a mapping of header names to strings."),
    ({"trigger": {"url": "http://x", "model": 3}}, "trigger.model must be a string, got 3."),
    ({"trigger": {"url": "https://x", "max_body_bytes": 10}}, "trigger.max_body_bytes must be between 1024 and 1073741824, got 10."),
    ({"trigger": {"url": "https://x", "client_key": "/k.pem"}}, "trigger.client_key needs trigger.client_cert"),
    ({"trigger": {"url": "https://x", "validate_certs": "no"}}, "trigger.validate_certs must be true or false, got 'no'."),
    ({"trigger": {"url": "https://x", "ca_path": ["a"]}}, "trigger.ca_path must be a file path."),
    ({"router_version": "v0.10.0"}, "router_version must be one of v0.9.0, none, got 'v0.10.0'."),
    ({"router_version": "none", "expect_router_decodes": True}, "expect_router_decodes needs a router_version"),
    ({"expect_router_decodes": "yes"}, "expect_router_decodes must be true or false, got 'yes'."),
    ({"data_parallel_size": 2, "endpoint": "tcp://host"}, "Cannot offset the port"),
]


@pytest.mark.parametrize("kw,msg", INVALID, ids=[str(sorted(k.items())) for k, _m in INVALID])
def test_invalid_parameters(zctx, kw, msg):
    kw.setdefault("endpoint", "inproc://nothing")
    exc = fail(zctx, **kw)
    assert msg in exc.msg
    assert exc.facts["peer_connected"] == []  # refused before any socket opened, so before any wait
    assert exc.facts["counts"] == {"BlockStored": 0, "BlockRemoved": 0, "AllBlocksCleared": 0}  # the facts of a check that heard nothing


def test_bounds_are_valid_and_the_options_completed():
    check = KVEventsCheck({"endpoint": "tcp://127.0.0.1:1", "timeout": 86400, "settle": 3600, "data_parallel_size": 64,
                           "expect": {"BlockStored": "3"}, "trigger": {"url": "http://x", "max_tokens": 1000000, "delay": 0}})
    check.validate()
    assert check.params["socket_mode"] == "connect" and check.params["engine"] == "auto" and check.params["topic"] == ""
    assert check.params["trigger"]["headers"] == {} and check.params["trigger"]["validate_certs"] is True
    assert check.expect == {"BlockStored": 3} and check.params["router_version"] == "v0.9.0"
    assert len(check.endpoints()) == 64 and check.endpoints()[-1] == "tcp://127.0.0.1:64"


def test_options_left_out_are_defaults_and_a_missing_endpoint_one_sentence():
    with pytest.raises(CheckError) as info:
        KVEventsCheck({}).run()
    assert info.value.msg == "endpoint is required." and info.value.facts["endpoints"] == [None]


def test_data_parallel_ranks(zctx, publisher):
    base = "inproc://dp-test"
    with publisher(base, rank=0, count=3), publisher(base + "_dp1", rank=1, count=3):
        facts = run(zctx, endpoint=base, data_parallel_size=2, expect={"BlockStored": 6})
    assert facts["ranks"] == [0, 1] and set(facts["seq"]) == {"#0", "#1"}
    assert facts["endpoints"] == [base, base + "_dp1"]


def fake_client(answers, calls, connections=None):
    """An OpenAIClient stand-in: ``answers`` maps a path to its JSON answer or to an exception to raise."""

    class FakeClient(object):
        def __init__(self, base_url, api_key=None, timeout=None, headers=None, **connection):
            self.base_url, self.last_status = base_url, None
            calls.append(("init", base_url, api_key, dict(headers or {})))
            if connections is not None:
                connections.append(connection)

        def url(self, path):
            return self.base_url + path

        def _answer(self, path, body):
            calls.append((path, body))
            answer = answers[path]
            if isinstance(answer, Exception):
                raise answer
            self.last_status = 200
            return answer

        def get_json(self, path):
            return self._answer(path, None)

        def post_json(self, path, body):
            return self._answer(path, body)

    return FakeClient


def test_trigger_sent_after_connection(zctx, inproc, publisher):
    calls = []
    client = fake_client({"/v1/models": {"data": [{"id": "tiny"}]},
                          "/v1/completions": {"usage": {"prompt_tokens": 57, "prompt_tokens_details": {"cached_tokens": 32}}}}, calls)
    check = KVEventsCheck(params(endpoint=inproc[0], trigger={"url": "http://x:8000/", "api_key": "k", "headers": {"X-A": "1"},
                                                              "delay": 0.05}), ctx=zctx, client_class=client)
    with publisher(inproc[0], count=3):
        facts = check.run()
    assert calls[0] == ("init", "http://x:8000", "k", {"X-A": "1"})
    assert [c[0] for c in calls[1:]] == ["/v1/models", "/v1/completions"]
    assert calls[2][1]["model"] == "tiny" and calls[2][1]["max_tokens"] == 1
    assert facts["trigger"] == {"sent": True, "url": "http://x:8000/v1/completions", "status": 200, "model": "tiny",
                                "prompt_tokens": 57, "cached_tokens": 32}
    assert "prompt" not in json.dumps(facts["sample"])


def test_trigger_failure_message():
    error = OpenAIHTTPError("Cannot reach http://127.0.0.1:9/v1/completions: Connection refused")
    with pytest.raises(CheckError) as info:
        send_trigger({"url": "http://127.0.0.1:9", "model": "m"}, 1.0, fake_client({"/v1/completions": error}, []))
    assert info.value.msg == "The trigger request failed: Cannot reach http://127.0.0.1:9/v1/completions: Connection refused."


def test_trigger_without_a_listed_model():
    with pytest.raises(CheckError) as info:
        send_trigger({"url": "http://h"}, 1.0, fake_client({"/v1/models": {"data": []}}, []))
    assert info.value.msg == "The trigger request failed: http://h/v1/models lists no model; set the trigger's model."


def test_trigger_without_cached_tokens():
    facts = send_trigger({"url": "http://h/v1", "model": "m"}, 1.0, fake_client({"/v1/completions": {"usage": {"prompt_tokens": 3}}}, []))
    assert facts["cached_tokens"] is None and facts["prompt_tokens"] == 3 and facts["url"] == "http://h/v1/completions"


def test_trigger_uses_the_collections_http_options():
    """TLS, proxy and body limit: the same options, with the same defaults, as prefix_cache_check's."""
    connections = []
    send_trigger({"url": "https://h", "model": "m", "ca_path": "/ca.pem", "client_cert": "/c.pem", "validate_certs": False,
                  "use_proxy": False, "max_body_bytes": 4096}, 1.0, fake_client({"/v1/completions": {}}, [], connections))
    assert connections == [{"validate_certs": False, "ca_path": "/ca.pem", "client_cert": "/c.pem", "client_key": None,
                            "use_proxy": False, "max_body_bytes": 4096}]
    assert set(CHECK_ARG_SPEC["trigger"]["options"]) >= set(HTTP_ARG_SPEC)
    assert all(CHECK_ARG_SPEC["trigger"]["options"][name] == spec for name, spec in HTTP_ARG_SPEC.items())


@pytest.fixture(scope="module")
def tls_engine(tmp_path_factory):
    """An OpenAI-compatible stand-in behind TLS, its certificate its own authority."""
    srv, cert = tls_scripted_server(tmp_path_factory.mktemp("tls"))
    srv.routes["/v1/completions"] = (200, "application/json", json.dumps({"usage": {"prompt_tokens": 40}}).encode())
    srv.start()
    yield srv, cert
    srv.stop()


def test_trigger_over_tls_trusts_ca_path_and_refuses_an_unknown_certificate(tls_engine, monkeypatch):
    srv, cert = tls_engine
    for name in ("https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert send_trigger({"url": srv.url, "model": "m", "ca_path": cert}, 5.0)["status"] == 200
    assert send_trigger({"url": srv.url, "model": "m", "validate_certs": False}, 5.0)["prompt_tokens"] == 40
    with pytest.raises(CheckError) as info:
        send_trigger({"url": srv.url, "model": "m"}, 5.0)
    assert "certificate verify failed" in info.value.msg
    one_sentence(info.value.msg)


def test_trigger_real_http_error():
    num = free_port()
    with pytest.raises(CheckError) as info:
        send_trigger({"url": "http://127.0.0.1:%d" % num, "model": "m"}, 2.0)
    assert info.value.msg.startswith("The trigger request failed: Cannot reach http://127.0.0.1:%d/v1/completions:" % num)


@pytest.mark.parametrize("check_mode", [False, True])
def test_capture_path(zctx, inproc, publisher, tmp_path, check_mode):
    path = tmp_path / "capture.jsonl"
    with publisher(inproc[0], count=3):
        KVEventsCheck(params(endpoint=inproc[0], capture_path=str(path), expect={"BlockStored": 3}), check_mode=check_mode, ctx=zctx).run()
    if check_mode:
        assert not path.exists()
        return
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) >= 3 and all("token_ids" not in x for x in lines)
    assert lines[0]["type"] == "BlockStored" and lines[0]["token_count"] == 32


def test_capture_path_with_token_ids(zctx, inproc, publisher, tmp_path):
    path = tmp_path / "capture.jsonl"
    with publisher(inproc[0], count=1):
        run(zctx, endpoint=inproc[0], capture_path=str(path), include_token_ids=True)
    assert json.loads(path.read_text().splitlines()[0])["token_ids"] == list(range(32))


def test_capture_path_unwritable(zctx, inproc, publisher, tmp_path):
    with publisher(inproc[0], count=1):
        exc = fail(zctx, endpoint=inproc[0], capture_path=str(tmp_path / "missing" / "x.jsonl"))
    assert exc.msg.startswith("Cannot write capture_path")


# -- the tail of a burst ------------------------------------------------------------------------------------------
def test_tail_of_a_burst_repaired_through_replay(zctx, inproc, publisher):
    # The last 3 of 8 batches are dropped (as at a high-water mark): no later batch reveals the gap.
    with publisher(inproc[0], replay_endpoint=inproc[1], count=8, drop_tail=3):
        facts = run(zctx, endpoint=inproc[0], replay_endpoint=inproc[1], expect={"BlockStored": 8})
    assert facts["batches"] == 8 and facts["counts"]["BlockStored"] == 8
    assert facts["seq"] == {"#0": {"first": 0, "last": 7, "batches": 5}}  # 5 arrived live
    assert facts["gaps"]["found"] == 1 and facts["gaps"]["unrepaired"] == 0
    assert facts["gaps"]["tail"] == {"found": 1, "batches": 3}
    assert facts["gaps"]["details"][0]["tail"] is True and (facts["gaps"]["details"][0]["start"], facts["gaps"]["details"][0]["end"]) == (5, 7)


def test_tail_of_a_burst_lost_without_replay(zctx, inproc, publisher):
    with publisher(inproc[0], count=8, drop_tail=3):
        exc = fail(zctx, endpoint=inproc[0], expect={"BlockStored": 8}, timeout=1.5, ready=lambda check: check.stats.batches == 5)
    assert "Expectations not met within 1.5s (5 batches received): BlockStored 5/8." in exc.msg


def test_tail_fetched_before_reporting_when_expectations_are_met(zctx, inproc, publisher):
    with publisher(inproc[0], replay_endpoint=inproc[1], count=8, drop_tail=3):
        facts = run(zctx, endpoint=inproc[0], replay_endpoint=inproc[1], expect={"BlockStored": 5}, settle=0.3)
    assert facts["batches"] == 8 and facts["gaps"]["tail"] == {"found": 1, "batches": 3}


# -- mutants that must be caught ----------------------------------------------------------------------------------
def test_default_expectation_requires_a_block_stored(zctx, inproc, publisher):
    # Batches arrive, but none stores a block: the default expect (BlockStored: 1) is not met.
    cleared = synth.encode_batch([{"type": "AllBlocksCleared"}])
    with publisher(inproc[0], count=3, payload=cleared):
        exc = fail(zctx, endpoint=inproc[0], timeout=1.0, ready=lambda check: check.stats.batches == 3)  # expect left at its default
    assert exc.msg == "Expectations not met within 1.0s (3 batches received): BlockStored 0/1."


def test_bind_mode_sets_the_backlog_aside(zctx, inproc, publisher):
    # A connecting engine delivers what it queued before the trigger; only what follows the trigger counts.
    hold = threading.Event()
    calls = []
    client = fake_client({"/v1/completions": {"usage": {"prompt_tokens": 40}}}, calls)

    class Trigger(client):  # the request makes the publisher send its remaining batches
        def post_json(self, path, body):
            hold.set()
            return client.post_json(self, path, body)

    # The trigger goes 0.3 s after the first batch; the clock waits at 0.25 s until the three batches before it arrived.
    clock = GatedClock(0.25)
    check = KVEventsCheck(params(endpoint=inproc[0], socket_mode="bind", expect={"BlockStored": 2},
                                 trigger={"url": "http://x", "model": "m", "delay": 0.3}), ctx=zctx, client_class=Trigger, clock=clock)
    clock.ready = lambda: check.stats.batches >= 3
    with publisher(inproc[0], bind=False, count=5, hold_at=3, hold=hold):
        facts = check.run()
    assert facts["trigger"]["sent"] is True
    assert facts["backlog_batches"] == 3
    assert facts["batches"] == 2 and facts["counts"]["BlockStored"] == 2


# -- windows around another check's requests (prefix_cache_check's kv_events) ------------------------------------------
def window_params(endpoint, **kw):
    out = dict((k, v.get("default")) for k, v in WINDOW_OPTIONS.items())
    out.update({"endpoint": endpoint, "timeout": 60.0, "settle": 0.2})
    out.update(kw)
    return out


@pytest.fixture
def windows_publisher(zctx):
    """The engine's publisher, bound on TCP (inproc sockets report no connection, and a window sends its request once
    the publisher is connected); XPUB_VERBOSE: every subscription message comes through, so the test counts them."""
    pub = synth.SyntheticPublisher("tcp://127.0.0.1:%d" % free_port(), bind=True, ctx=zctx)
    pub.pub.setsockopt(zmq.XPUB_VERBOSE, 1)
    pub.subscribed_times = 0
    yield pub
    pub.close()


def subscribed(pub, timeout=10.0):
    """Wait until a subscription reached the XPUB socket (counting each that arrives)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        while pub.pub.poll(0, zmq.POLLIN):
            if pub.pub.recv()[:1] == b"\x01":
                pub.subscribed_times += 1
        if pub.subscribed_times:
            return True
        time.sleep(0.01)
    return False


def request(pub, batches, answer):
    """A request of the other check: the engine publishes ``batches`` batches for it, then it answers."""
    def send():
        assert subscribed(pub), "the window never subscribed"
        for dummy in range(batches):
            pub.publish()
        return dict(answer)
    return send


def queued(windows, timeout=10.0):
    """Wait until a message is queued on the windows' open subscription, unread (ZMQ carries a publish through its I/O
    threads: without this wait a batch published just before a window may arrive after that window sent its request)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if windows.check.consumer.poll(0.1):
            return True
    return False


def test_windows_hold_each_requests_events_apart(zctx, windows_publisher):
    pub = windows_publisher
    model = {}
    with RequestWindows(window_params(pub.endpoint), "http://e:8000/", model=lambda: model.get("name"), ctx=zctx) as windows:
        model["name"] = "tiny"  # the other check learns its model after the windows were made
        cold = windows.around("cold", request(pub, 3, {"prompt_tokens": 40, "cached_tokens": 0, "ttft": 0.1}))
        pub.publish()  # between the two requests (another client's): counted in neither window
        assert queued(windows), "the batch published between the windows never reached the subscription"
        warm = windows.around("warm", request(pub, 1, {"prompt_tokens": 44, "cached_tokens": 32, "ttft": 0.05}))
    assert pub.subscribed_times == 1  # one subscription served both windows
    assert cold["ttft"] == 0.1 and warm["cached_tokens"] == 32  # the other check gets its own answers back
    kv = windows.windows
    assert sorted(kv) == ["cold", "warm"]
    assert kv["cold"]["batches"] == 3 and kv["warm"]["batches"] == 1
    assert kv["cold"]["counts"]["BlockStored"] > kv["warm"]["counts"]["BlockStored"] > 0
    assert kv["cold"]["trigger"] == {"sent": True, "url": "http://e:8000/v1/completions", "status": 200, "model": "tiny",
                                     "prompt_tokens": 40, "cached_tokens": 0}
    assert kv["warm"]["trigger"]["cached_tokens"] == 32


def test_a_window_without_events_names_its_request(zctx, windows_publisher):
    pub = windows_publisher
    with RequestWindows(window_params(pub.endpoint, timeout=1.0), "http://e:8000", model="tiny", ctx=zctx) as windows:
        windows.around("cold", request(pub, 2, {"prompt_tokens": 40, "cached_tokens": 0}))
        with pytest.raises(CheckError) as info:
            windows.around("warm", request(pub, 0, {"prompt_tokens": 44, "cached_tokens": 32}))
    one_sentence(info.value.msg)
    assert info.value.msg.startswith("The KV events of the warm request: No KV events received")
    assert sorted(info.value.facts["kv_events"]) == ["cold", "warm"]
    assert info.value.facts["kv_events"]["cold"]["batches"] == 2 and info.value.facts["kv_events"]["warm"]["batches"] == 0


def test_the_requests_own_failure_goes_through_unchanged(zctx, windows_publisher):
    def send():
        assert subscribed(windows_publisher)
        raise CheckError("Cannot reach http://e:8000/v1/completions: connection refused.", {"model": "tiny"})

    with RequestWindows(window_params(windows_publisher.endpoint), "http://e:8000", ctx=zctx) as windows:
        with pytest.raises(CheckError) as info:
            windows.around("cold", send)
    assert info.value.msg == "Cannot reach http://e:8000/v1/completions: connection refused."
    assert info.value.facts == {"model": "tiny"} and windows.windows == {}


def test_window_options_are_checked_before_the_request(zctx):
    sent = []
    with RequestWindows(window_params("tcp://127.0.0.1:9", expect={"BlockStoredX": 1}), "http://e:8000", ctx=zctx) as windows:
        with pytest.raises(CheckError) as info:
            windows.around("cold", lambda: sent.append(1) or {})
    assert "expect names an unknown event type 'BlockStoredX'" in info.value.msg and not sent
    assert set(WINDOW_OPTIONS) == {"endpoint", "socket_mode", "topic", "data_parallel_size", "replay_endpoint", "timeout",
                                   "settle", "delay", "expect", "router_version", "expect_router_decodes"}


def test_windows_opened_ahead_then_handed_over_stay_subscribed(zctx, windows_publisher):
    """open() subscribes before the first request; hand_over() gives the open consumer away: close() leaves it open,
    and the publisher sees no second subscription for the windows."""
    pub = windows_publisher
    windows = RequestWindows(window_params(pub.endpoint), "http://e:8000", model="tiny", ctx=zctx)
    assert windows.hand_over() is None   # nothing open yet
    windows.open()
    assert subscribed(pub)   # before any request
    windows.around("cold", request(pub, 2, {"prompt_tokens": 40, "cached_tokens": 0}))
    consumer = windows.hand_over()
    windows.close()
    assert consumer is not None and consumer.listening(), "the handed-over consumer must stay open"
    assert windows.hand_over() is None and pub.subscribed_times == 1
    consumer.close()
    assert not consumer.listening()


def test_a_later_window_sends_at_once_on_a_subscription_connected_long_ago(zctx, windows_publisher):
    """The delay lets a new subscription reach the publisher: the first window waits it, a later one on the same open
    subscription does not."""
    pub = windows_publisher
    sent = {}

    def timed(name, batches, answer):
        send = request(pub, batches, answer)

        def timed_send():
            sent[name] = time.monotonic()
            return send()
        return timed_send

    with RequestWindows(window_params(pub.endpoint, delay=1.0), "http://e:8000", model="tiny", ctx=zctx) as windows:
        started = time.monotonic()
        windows.around("cold", timed("cold", 2, {"prompt_tokens": 40, "cached_tokens": 0}))
        assert sent["cold"] - started >= 1.0
        started = time.monotonic()
        windows.around("warm", timed("warm", 1, {"prompt_tokens": 44, "cached_tokens": 32}))
        assert sent["warm"] - started < 0.9   # not the delay again (1 s)


def test_a_backlog_arriving_over_longer_than_the_delay_is_set_aside(zctx, windows_publisher):
    """A connecting engine delivers what it queued (after busy traffic, thousands of batches) over more than the delay:
    the request goes once the stream was quiet for the delay, so none of that backlog counts as the request's. (The cap,
    BACKLOG_WAIT, is held in test_consumer.py with a clock of its own: a publisher thread here cannot keep a cadence
    under load.)"""
    pub = windows_publisher
    trickling = threading.Event()

    def backlog():
        assert subscribed(pub), "the window never subscribed"
        for dummy in range(60):   # 60 batches 0.02 s apart: 1.2 s, over twice the delay, never quiet for it in between
            pub.publish()
            time.sleep(0.02)
        trickling.set()

    thread = threading.Thread(target=backlog)
    # The delay alone (0.5 s after the connection) would send the request while the backlog still arrives.
    with RequestWindows(window_params(pub.endpoint, delay=0.5), "http://e:8000", model="tiny", ctx=zctx) as windows:
        windows.open()
        thread.start()

        def send():
            assert trickling.is_set(), "the request went while the backlog was still arriving"
            pub.publish()
            return {"prompt_tokens": 40, "cached_tokens": 0}
        windows.around("cold", send)
    thread.join()
    assert windows.windows["cold"]["batches"] == 1 and windows.windows["cold"]["backlog_batches"] == 60
