# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""epp/route_check.RouteCheck: the EPP's pick held against the KV-block index of two fake engines' real KV events.

The EPP is a function here (what it picks is the test's choice) and, once, the stand-in ext_proc server, so the
judgement is tested both ways: a pick of the engine holding the prefix passes, any other pick fails in one sentence.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import contextlib
import json
from urllib.request import Request, urlopen

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.errors import CheckError
from ansible_collections.inference_cache.substrate.plugins.module_utils.epp import route_check as rc
from ansible_collections.inference_cache.substrate.tests.unit.plugins.fake_epp import FakeEPP
from ansible_collections.inference_cache.substrate.tests.unit.plugins.kv_index_fake import FakeEngine
from ansible_collections.inference_cache.substrate.tests.unit.plugins.net_utils import free_port
from ansible_collections.inference_cache.substrate.tests.unit.plugins.sentences import assert_one_sentence

PREFIX = " ".join("word%d" % i for i in range(40))


@contextlib.contextmanager
def two_engines():
    with contextlib.ExitStack() as stack:
        engines = []
        for _i in range(2):
            port = free_port()
            engines.append(stack.enter_context(FakeEngine(port, "tcp://127.0.0.1:%d" % free_port(), "kv@127.0.0.1:%d@tiny" % port)))
        yield engines


def warm(engine, prompt):
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 1}).encode()
    with urlopen(Request(engine.url + "/v1/completions", body, {"Content-Type": "application/json"}), timeout=10) as resp:
        return json.loads(resp.read())


def params(engines, prompts, epp="127.0.0.1:9002", **overrides):
    out = {"epp": {"address": epp}, "requests": [{"prompt": p} for p in prompts], "settle": 0.1, "timeout": 60.0,
           "engines": [{"name": "engine-%d" % i, "url": e.url, "endpoint": e.endpoint, "socket_mode": "connect", "topic": e.topic.decode()}
                       for i, e in enumerate(engines)]}
    out.update(overrides)
    return out


def picking(address):
    def ask(target, body, **kwargs):  # pylint: disable=unused-argument
        return {"picked": address(json.loads(body)) if callable(address) else address, "endpoints": [], "metadata_endpoints": []}
    return ask


def address_of(engine):
    return "127.0.0.1:%d" % engine.port


def run_warmed(check, engine, prompt):
    """``check.run()`` with ``prompt`` sent to ``engine`` once the check listens (the fake engines keep no replay buffer)."""
    return check.run(warm=lambda: warm(engine, prompt))


def test_a_pick_of_the_engine_holding_the_prefix_passes():
    with two_engines() as engines:
        facts = run_warmed(rc.RouteCheck(params(engines, [PREFIX + " second question", "something else entirely"]),
                                         ask=picking(address_of(engines[0]))), engines[0], PREFIX + " first question")
    assert facts["requests"] == 2 and facts["holds_longest"] == 2
    assert facts["warm_requests"] == 1 and facts["warm_holds_longest"] == 1
    first = facts["picks"][0]
    assert first["engine"] == "engine-0" and first["longest"] == ["engine-0"] and first["longest_tokens"] >= 36
    assert first["predicted"]["engine-1"] == 0
    assert facts["picks"][1]["longest"] == ["engine-0", "engine-1"]   # nothing cached anywhere: every pick holds 0
    assert "second question" not in json.dumps(facts) and "word1" not in json.dumps(facts)


def test_a_pick_of_another_engine_fails_in_one_sentence():
    with two_engines() as engines:
        with pytest.raises(CheckError) as info:
            run_warmed(rc.RouteCheck(params(engines, [PREFIX + " second question"]), ask=picking(address_of(engines[1]))),
                       engines[0], PREFIX + " first question")
    msg = info.value.msg
    assert_one_sentence(msg)
    assert msg.startswith("The EPP picked engine-1 (%s) for request 0, which holds 0 cached tokens" % address_of(engines[1]))
    assert "while engine-0 held" in msg
    assert info.value.facts["holds_longest"] == 0 and info.value.facts["picks"][0]["engine"] == "engine-1"


def test_without_the_expectation_the_miss_is_reported_not_failed():
    with two_engines() as engines:
        facts = run_warmed(rc.RouteCheck(params(engines, [PREFIX + " again"], expect_longest_prefix=False),
                                         ask=picking(address_of(engines[0]))), engines[1], PREFIX + " first question")
    assert facts["holds_longest"] == 0 and facts["picks"][0]["longest"] == ["engine-1"]


def test_a_pick_outside_the_engines_names_their_addresses():
    with two_engines() as engines:
        with pytest.raises(CheckError) as info:
            rc.RouteCheck(params(engines, ["hello there"]), ask=picking("10.9.9.9:8000")).run()
    assert "picked 10.9.9.9:8000 for request 0, which is none of the engines given (%s" % ", ".join(
        sorted(address_of(e) for e in engines)) in info.value.msg


def test_through_the_ext_proc_protocol():
    with two_engines() as engines:
        with FakeEPP(pick=lambda body: address_of(engines[1]) if b"word3" in body else address_of(engines[0])) as epp:
            facts = run_warmed(rc.RouteCheck(params(engines, [PREFIX + " next", "cold prompt"], epp=epp.address)), engines[1],
                               PREFIX + " first question")
        headers, body = epp.seen[0]
    assert facts["holds_longest"] == 2 and facts["picks"][0]["engine"] == "engine-1"
    assert json.loads(body)["model"] == "tiny" and headers[":path"] == "/v1/completions"


@pytest.mark.parametrize("change, expected", [
    ({"epp": {"address": "http://127.0.0.1:9002"}}, "epp.address: the EPP's ext_proc address is host:port, not a URL"),
    ({"requests": []}, "requests must list at least one entry."),
    ({"requests": [{"name": "x"}]}, "requests[0].prompt is required."),
    ({"epp": {"address": "127.0.0.1:9002", "tls": "yes"}}, "epp.tls must be true or false, got 'yes'."),
    ({"timeout": 0}, "timeout must be above 0, got 0."),
])
def test_bad_options_are_one_sentence(change, expected):
    with two_engines() as engines:
        with pytest.raises(CheckError) as info:
            rc.RouteCheck(dict(params(engines, ["x"]), **change), ask=picking("nowhere")).run()
    assert expected in info.value.msg
    assert_one_sentence(info.value.msg)


def test_two_engines_with_one_address_are_refused():
    with two_engines() as engines:
        p = params(engines, ["x"])
        p["engines"][1]["address"] = address_of(engines[0])
        with pytest.raises(CheckError) as info:
            rc.RouteCheck(p, ask=picking("nowhere")).run()
    assert "have the same address" in info.value.msg
