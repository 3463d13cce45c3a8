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
import time
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
    with urlopen(Request(engine.url + "/v1/completions", body, {"Content-Type": "application/json"}), timeout=60) as resp:
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


def poll_until(check, condition, bound=60.0):
    """Apply the check's events until ``condition()`` holds (a generous bound, never a measured time)."""
    until = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < until, "the engines' events did not arrive"
        check.live.pump(0.05)


def test_an_engine_restarted_in_place_is_named_and_explains_a_stale_pick():
    """engine-0 held the prefix, restarted in place (sequence from 0 again, no AllBlocksCleared: vLLM at start), and engine-1
    computed the prefix since. The EPP v0.9.0 still credits engine-0 with its old blocks and picks it: the check says why."""
    with two_engines() as engines:
        check = rc.RouteCheck(params(engines, [PREFIX + " second question"]), ask=picking(address_of(engines[0])))

        def warm_restart_warm():
            warm(engines[0], PREFIX + " first question")
            poll_until(check, lambda: check.live.index.size("engine-0") > 0)
            engines[0].restart()
            warm(engines[0], "a prompt of other words entirely")
            warm(engines[1], PREFIX + " first question")
            poll_until(check, lambda: check.live.by_name["engine-0"].restarts == 1 and check.live.index.size("engine-1") > 0)
        with pytest.raises(CheckError) as info:
            check.run(warm=warm_restart_warm)
    msg = assert_one_sentence(info.value.msg)
    assert msg.startswith("The EPP picked engine-0 (%s) for request 0, which holds 0 cached tokens of its prompt, while engine-1 held"
                          % address_of(engines[0]))
    assert msg.endswith("; engine-0 restarted in place during the check and llm-d-kv-cache v0.9.0, the EPP v0.9.0's index, keeps a "
                        "restarted engine's old blocks until its pod is replaced (see restart_warning).")
    facts = info.value.facts
    assert facts["restarted_engines"] == ["engine-0"] and facts["engines"]["engine-0"]["restarts"] == 1
    assert facts["engines"]["engine-1"]["restarts"] == 0
    assert assert_one_sentence(facts["restart_warning"]).startswith("Engine engine-0 restarted in place during the check (its KV-event "
                                                                    "sequence started again); llm-d-kv-cache v0.9.0 keeps")


def test_without_a_restart_the_facts_name_none():
    with two_engines() as engines:
        facts = run_warmed(rc.RouteCheck(params(engines, [PREFIX + " again"]), ask=picking(address_of(engines[0]))), engines[0],
                           PREFIX + " first question")
    assert facts["restarted_engines"] == [] and facts["restart_warning"] is None
    assert facts["engines"]["engine-0"]["restarts"] == 0 and facts["picks"][0]["longest_tokens"] > 0


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


def test_send_to_pick_warms_the_picked_engine_and_holds_the_next_picks():
    """As the Gateway does: each request goes on to the pick, so an EPP that learns from its picks is warmed by them."""
    picks = []

    def sticky(body):   # an EPP that keeps a prefix where it first sent it
        picks.append(body["prompt"])
        return "127.0.0.1:%d" % ports[0]
    with two_engines() as engines:
        ports = [e.port for e in engines]
        prompts = [PREFIX + " first question", PREFIX + " second question", PREFIX + " third question"]
        facts = rc.RouteCheck(params(engines, prompts, send_to_pick=True), ask=picking(sticky)).run()
    assert len(picks) == 3 and facts["sent"] == 3 and facts["holds_longest"] == 3
    assert facts["warm_requests"] == 2 and facts["warm_holds_longest"] == 2   # the first request warmed it
    assert [p["cached_tokens"] for p in facts["picks"]][0] == 0 and min(p["cached_tokens"] for p in facts["picks"][1:]) >= 32
    assert facts["index_exact"] == 3 and facts["sent_cached_tokens"] == sum(p["cached_tokens"] for p in facts["picks"])
    assert "sent on to the picks, the engines reported" in facts["summary"]


def test_send_to_pick_with_a_scorer_that_ignores_its_history_fails_in_one_sentence():
    with two_engines() as engines:
        ports = [e.port for e in engines]
        turn = iter([0, 1])
        prompts = [PREFIX + " first question", PREFIX + " second question"]
        with pytest.raises(CheckError) as caught:
            rc.RouteCheck(params(engines, prompts, send_to_pick=True),
                          ask=picking(lambda body: "127.0.0.1:%d" % ports[next(turn)])).run()
    assert_one_sentence(caught.value.msg)
    assert caught.value.msg.endswith("every request went to the engine the EPP picked, so even an approximate prefix-cache scorer "
                                     "learns the prefix from its own picks: check that a prefix-cache scorer weighs enough in the "
                                     "EPP's profile.")
