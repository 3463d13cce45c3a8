# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""kv/index_check.KVIndexCheck against two fake engines (real HTTP and ZMQ on 127.0.0.1, vLLM-like caching): the workload, the
predictions held against the engines' reports, the verdict and its sentences; the index itself is kv/live_index.py's
(test_live_index.py)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import contextlib
import importlib.util
import json
import os

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.errors import CheckError
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import index_check as chk
from ansible_collections.inference_cache.substrate.tests.unit.plugins.kv_index_fake import FakeEngine
from ansible_collections.inference_cache.substrate.tests.unit.plugins.net_utils import free_port
from ansible_collections.inference_cache.substrate.tests.unit.plugins.sentences import assert_one_sentence

WORKLOAD = {"families": 4, "rounds": 8, "preamble_words": 6, "prefix_words": 18, "suffix_words": 6}


@contextlib.contextmanager
def two_engines(num_blocks=24, **kwargs):
    engines = []
    with contextlib.ExitStack() as stack:
        for _i in range(2):
            port = free_port()
            topic = "kv@127.0.0.1:%d@tiny" % port
            engines.append(stack.enter_context(FakeEngine(port, "tcp://127.0.0.1:%d" % free_port(), topic, num_blocks=num_blocks,
                                                          **kwargs)))
        yield engines


def params(engines, **overrides):
    specs = [{"name": "engine-%d" % idx, "url": e.url, "endpoint": e.endpoint, "socket_mode": "connect", "topic": e.topic.decode()}
             for idx, e in enumerate(engines)]
    out = {"engines": specs, "workload": dict(WORKLOAD), "expect": {"min_requests": 30, "min_evictions_per_engine": 1},
           "settle": 0.05, "event_wait": 60.0, "timeout": 300.0, "request_timeout": 60.0, "max_tokens": 1}
    out.update(overrides)
    return out


def run(p):
    try:
        return True, chk.KVIndexCheck(p).run()
    except CheckError as exc:
        return False, exc


def test_exact_through_evictions_and_copies():
    with two_engines() as engines:
        ok, facts = run(params(engines))
        removed = [e.removed for e in engines]
        copies = [e.copies for e in engines]
    assert ok, facts.msg
    assert facts["requests"] >= 30 and facts["exact"] == facts["requests"] and facts["largest_error"] == 0
    assert facts["exact_percent"] == 100.0 and facts["mismatches"] == []
    assert all(r > 0 for r in removed) and sum(copies) > 0
    for name, engine in facts["engines"].items():
        assert engine["blocks_removed"] > 0 and engine["removed_unknown"] == 0, name
        assert engine["stores_skipped"] == 0 and engine["gaps_unrepaired"] == 0
    # The same events without counting copies (llm-d's Evict) get some predictions wrong; the approximate producer too.
    assert facts["uncounted"]["wrong"] > 0 and facts["uncounted"]["exact"] + facts["uncounted"]["wrong"] == facts["requests"]
    assert facts["approximate"]["predicted_hits"] > 0
    assert facts["routing"]["steps_on_every_engine"] > 0
    assert facts["routing"]["precise_agrees"] == facts["routing"]["steps_on_every_engine"]
    assert len(facts["summary"]) == 5 and facts["summary"][0].startswith("precise index (copies counted): %d/%d" % (
        facts["requests"], facts["requests"]))


def test_token_ids_stay_inside_and_a_topic_prefix_is_enough():
    with two_engines() as engines:
        p = params(engines, workload=dict(WORKLOAD, rounds=2), expect={"min_requests": 1})
        p["engines"][0]["topic"] = "kv@127.0.0.1:%d@" % engines[0].port
        ok, facts = run(p)
    assert ok, facts.msg
    assert "token_ids" not in repr(facts)

    def int_lists(value):
        if isinstance(value, dict):
            return [found for item in value.values() for found in int_lists(item)]
        if isinstance(value, (list, tuple)):
            if value and all(isinstance(item, int) for item in value):
                return [value]
            return [found for item in value for found in int_lists(item)]
        return []
    assert int_lists(facts) == []
    assert facts["engines"]["engine-0"]["batches"] > 0 and facts["engines"]["engine-0"]["other_topics"] == {}


def test_wrong_topic_fails_naming_family_engine_and_counts():
    with two_engines() as engines:
        p = params(engines)
        p["engines"][1]["topic"] = "kv@127.0.0.1:1@tiny"
        ok, exc = run(p)
    assert not ok
    msg = assert_one_sentence(exc.msg)
    assert "for prompt family family-" in msg and "on engine engine-1 but the engine reported" in msg
    assert "predicted 0 cached tokens" in msg
    assert "no KV events arrived under its topic prefix 'kv@127.0.0.1:1@tiny', but messages arrived under 'kv@127.0.0.1:%d@tiny'" % (
        engines[1].port) in msg
    assert exc.facts["mismatches"][0]["predicted"] == 0 and exc.facts["mismatches"][0]["reported"] > 0
    assert list(exc.facts["engines"]["engine-1"]["other_topics"]) == ["kv@127.0.0.1:%d@tiny" % engines[1].port]
    assert exc.facts["engines"]["engine-1"]["batches"] == 0


def test_stopped_subscription_fails():
    with two_engines() as engines:
        p = params(engines)
        p["engines"][0]["withhold_after"] = 4
        ok, exc = run(p)
    assert not ok
    msg = assert_one_sentence(exc.msg)
    assert "the subscription to its events was stopped after 4 requests" in msg
    assert "on engine engine-0" in msg
    assert exc.facts["engines"]["engine-0"]["subscription_stopped"] is True
    assert exc.facts["requests"] > 4


def test_engine_without_cached_tokens():
    with two_engines(report_cached=False) as engines:
        ok, exc = run(params(engines))
    assert not ok
    assert "--enable-prompt-tokens-details" in assert_one_sentence(exc.msg)


def test_too_few_evictions():
    with two_engines(num_blocks=400) as engines:
        ok, exc = run(params(engines, workload=dict(WORKLOAD, rounds=2), expect={"min_requests": 1, "min_evictions_per_engine": 1}))
    assert not ok
    assert "evicted 0 blocks (BlockRemoved) during the check, fewer than expect.min_evictions_per_engine 1" in assert_one_sentence(exc.msg)
    assert exc.facts["exact"] == exc.facts["requests"]


def test_too_few_requests():
    with two_engines() as engines:
        ok, exc = run(params(engines, workload=dict(WORKLOAD, rounds=1), expect={"min_requests": 50}))
    assert not ok
    assert "fewer than expect.min_requests 50" in assert_one_sentence(exc.msg)


def test_bind_mode_engines_connect():
    engines = []
    with contextlib.ExitStack() as stack:
        for _i in range(2):
            port = free_port()
            engines.append(stack.enter_context(FakeEngine(port, "tcp://127.0.0.1:%d" % free_port(), "kv@127.0.0.1:%d@tiny" % port,
                                                          bind=False)))
        p = params(engines, workload=dict(WORKLOAD, rounds=2), expect={"min_requests": 1})
        for spec in p["engines"]:
            spec["socket_mode"] = "bind"
        ok, facts = run(p)
    assert ok, facts.msg
    assert facts["exact"] == facts["requests"] > 0


@pytest.mark.parametrize("change, expected", [
    ({"engines": []}, "engines must list at least one engine (url, endpoint, topic)."),
    ({"timeout": 0}, "timeout must be above 0, got 0."),
    ({"request_timeout": -1}, "request_timeout must be above 0, got -1."),
    ({"max_tokens": 0}, "max_tokens must be at least 1, got 0."),
    ({"workload": {"families": 0}}, "workload.families must be at least 1, got 0."),
    ({"workload": {"suffix_words": -1}}, "workload.suffix_words must be at least 0, got -1."),
    ({"workload": {"bogus": 1}}, "workload has unknown keys bogus; known: "),
    ({"engines": [{"url": "http://127.0.0.1:1", "endpoint": "127.0.0.1:1"}]}, "engines[0].endpoint must be a ZMQ endpoint such as"),
    ({"engines": [{"url": "http://127.0.0.1:1", "endpoint": "tcp://127.0.0.1:1", "withhold_after": -1}]},
     "engines[0].withhold_after must be at least 0, got -1."),
    ({"engines": [{"url": "http://127.0.0.1:1"}]}, "engines[0].endpoint is required."),
])
def test_bad_parameters(change, expected):
    p = params([FakeEngine(free_port(), "tcp://127.0.0.1:1", "kv@a:1@m")])
    p.update(change)
    ok, exc = run(p)
    assert not ok
    assert expected in assert_one_sentence(exc.msg)


@pytest.mark.parametrize("change, expected", [
    ({"validate_certs": "no"}, "engines[0].validate_certs must be true or false, got 'no'."),
    ({"client_key": "/k.pem"}, "engines[0].client_key needs engines[0].client_cert"),
    ({"max_body_bytes": 10}, "engines[0].max_body_bytes must be between 1024 and 1073741824, got 10."),
    ({"max_body_bytes": 2048.5}, "engines[0].max_body_bytes must be an integer, got 2048.5."),
    ({"ca_path": ["x"]}, "engines[0].ca_path must be a file path."),
    ({"api_key": 3}, "engines[0].api_key must be a string."),
])
def test_bad_http_options(change, expected):
    spec = dict({"url": "https://127.0.0.1:1", "endpoint": "tcp://127.0.0.1:1", "topic": "kv@a:1@m"}, **change)
    ok, exc = run({"engines": [spec], "timeout": 5})
    assert not ok and expected in assert_one_sentence(exc.msg)


def test_duplicate_names_and_bad_url():
    spec = {"url": "http://127.0.0.1:1", "endpoint": "tcp://127.0.0.1:1", "topic": "kv@a:1@m"}
    ok, exc = run({"engines": [spec, dict(spec)], "timeout": 5})
    assert not ok and "Two engines are named 'a:1'" in assert_one_sentence(exc.msg)
    ok, exc = run({"engines": [dict(spec, url="127.0.0.1:1")], "timeout": 5})
    assert not ok and assert_one_sentence(exc.msg) == ("engines[0].url must be an http:// or https:// URL of the OpenAI-compatible "
                                                       "server, got '127.0.0.1:1'.")


def test_unreachable_engine():
    spec = {"url": "http://127.0.0.1:%d" % free_port(), "endpoint": "tcp://127.0.0.1:1", "topic": "kv@a:1@m"}
    ok, exc = run({"engines": [spec], "timeout": 5, "request_timeout": 2})
    assert not ok
    assert assert_one_sentence(exc.msg).startswith("Engine a:1 cannot be queried: ")


def test_nobody_connects_in_bind_mode():
    port = free_port()
    with FakeEngine(port, "tcp://127.0.0.1:%d" % free_port(), "kv@x:1@tiny") as engine:
        p = params([engine], event_wait=0.2)
        p["engines"][0]["socket_mode"] = "bind"
        p["engines"][0]["endpoint"] = "tcp://127.0.0.1:%d" % free_port()
        ok, exc = run(p)
    assert not ok
    assert assert_one_sentence(exc.msg).startswith("Engine engine-0 (%s): no publisher connected; the engine must connect to this "
                                                   "address" % p["engines"][0]["endpoint"])


def test_nothing_bound_in_connect_mode():
    with FakeEngine(free_port(), "tcp://127.0.0.1:%d" % free_port(), "kv@x:1@tiny") as engine:
        p = params([engine], event_wait=0.2)
        p["engines"][0]["endpoint"] = "tcp://127.0.0.1:%d" % free_port()
        ok, exc = run(p)
    assert not ok
    assert assert_one_sentence(exc.msg).startswith("Engine engine-0 (%s): the connection never completed, so nothing is bound there; "
                                                   "the engine must bind" % p["engines"][0]["endpoint"])
    assert exc.facts["engines"]["engine-0"]["batches"] == 0


def test_a_restart_mid_workload_is_a_warning_and_the_check_stays_exact():
    """An engine restarted in place between two requests: the request that revealed it is a restart miss, the rest exact."""
    with two_engines(restart_after=9) as engines:
        ok, facts = run(params(engines))
    assert ok, facts.msg
    assert engines[0].restarts == 1 and engines[1].restarts == 1
    assert facts["restarted_engines"] == ["engine-0", "engine-1"]
    assert assert_one_sentence(facts["restart_warning"]).startswith("Engines engine-0 and engine-1 restarted in place during the check")
    assert facts["exact"] + facts["restart_misses"] == facts["requests"] and facts["mismatches"] == []
    assert facts["restart_misses"] == len(facts["restart_miss_steps"]) >= 1
    assert all(e["restarts"] == 1 for e in facts["engines"].values())


CLUSTER_VERIFY = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "..", "roles", "cluster_verify", "files", "cluster_verify.py")


@contextlib.contextmanager
def pods(http_port, kv_port):
    """Two fake engine pods on 127.0.0.2 and 127.0.0.3, same ports (as pods behind a headless Service)."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(FakeEngine(http_port, "tcp://127.0.0.%d:%d" % (n, kv_port), "kv@127.0.0.%d:%d@tiny" % (n, http_port),
                                              host="127.0.0.%d" % n)) for n in (2, 3)]


@pytest.mark.parametrize("template, ok", [("kv@$(POD_IP):%d@", True), ("kv@$(POD_IP):1@", False)])
def test_cluster_verify_runs_the_check_over_all_pods(capsys, template, ok):
    spec = importlib.util.spec_from_file_location("cluster_verify_for_kv_index", CLUSTER_VERIFY)
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    http_port, kv_port = free_port(), free_port()
    with pods(http_port, kv_port):
        code = cli.main(["--service", "engines.ns.svc", "--pods", "127.0.0.2,127.0.0.3", "--checks", "kv_index", "--http-port",
                         str(http_port), "--kv-port", str(kv_port), "--topic-template", template.replace("%d", str(http_port)),
                         "--timeout", "20"])
    report = json.loads(capsys.readouterr().out)
    result = report["pool"]["kv_index"]
    assert (code == 0) is ok and result["ok"] is ok and report["ok"] is ok
    if ok:
        assert result["exact"] == result["requests"] > 0
    else:
        assert_one_sentence(result["msg"])
        assert "no KV events arrived under its topic prefix 'kv@127.0.0." in result["msg"]
        assert report["msg"].startswith("Across the pods, kv_index: The index predicted ")
