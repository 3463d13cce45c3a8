# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""epp_route_check through AnsibleModule against two fake engines and the stand-in ext_proc EPP.

The module has no warm-up of its own; where a test needs traffic while the module listens, the check's ``run`` is given
a warm-up that sends it and waits until the check's index shows it (a condition, never a time).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import contextlib
import json
import time
from urllib.request import Request, urlopen

import pytest
from ansible.module_utils import basic

from ansible_collections.inference_cache.substrate.plugins.module_utils.epp import route_check as rc
from ansible_collections.inference_cache.substrate.plugins.modules import epp_route_check
from ansible_collections.inference_cache.substrate.tests.unit.plugins.fake_epp import FakeEPP
from ansible_collections.inference_cache.substrate.tests.unit.plugins.kv_index_fake import FakeEngine
from ansible_collections.inference_cache.substrate.tests.unit.plugins.modules.utils import run_module as run
from ansible_collections.inference_cache.substrate.tests.unit.plugins.net_utils import free_port
from ansible_collections.inference_cache.substrate.tests.unit.plugins.sentences import assert_one_sentence

PREFIX = " ".join("word%d" % i for i in range(40))


@pytest.fixture
def warned(monkeypatch):
    """What the module passed to AnsibleModule.warn (exit_json is patched, so the result never carries 'warnings')."""
    seen = []
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda self, message: seen.append(message))
    return seen


@contextlib.contextmanager
def two_engines_and_epp(pick):
    with contextlib.ExitStack() as stack:
        engines = []
        for _i in range(2):
            port = free_port()
            engines.append(stack.enter_context(FakeEngine(port, "tcp://127.0.0.1:%d" % free_port(), "kv@127.0.0.1:%d@tiny" % port)))
        epp = stack.enter_context(FakeEPP(pick=pick(engines)))
        args = {"epp": {"address": epp.address}, "requests": [{"prompt": PREFIX + " second question", "name": "warm prefix"}],
                "settle": 0.1, "timeout": 60,
                "engines": [{"name": "engine-%d" % i, "url": e.url, "endpoint": e.endpoint, "topic": e.topic.decode()}
                            for i, e in enumerate(engines)]}
        yield engines, args


def address_of(engine):
    return "127.0.0.1:%d" % engine.port


def complete(engine, prompt):
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 1}).encode()
    with urlopen(Request(engine.url + "/v1/completions", body, {"Content-Type": "application/json"}), timeout=30) as resp:
        resp.read()


def poll_until(check, condition, bound=60.0):
    until = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < until, "the engines' events did not arrive"
        check.live.pump(0.05)


def with_warm_up(monkeypatch, warm_up):
    """The module's check, run with ``warm_up(check)`` once it listens."""
    class Warmed(rc.RouteCheck):
        def run(self, warm=None):
            return super(Warmed, self).run(warm=lambda: warm_up(self))
    monkeypatch.setattr(epp_route_check, "RouteCheck", Warmed)


def test_a_stale_pick_of_an_engine_restarted_in_place_fails_with_the_restart_warning(monkeypatch, warned):
    with two_engines_and_epp(lambda engines: address_of(engines[0])) as (engines, args):
        def warm_up(check):
            complete(engines[0], PREFIX + " first question")
            poll_until(check, lambda: check.live.index.size("engine-0") > 0)
            engines[0].restart()   # in place: same address, cache empty, sequence from 0, no AllBlocksCleared
            complete(engines[0], "other words entirely")
            complete(engines[1], PREFIX + " first question")
            poll_until(check, lambda: check.live.by_name["engine-0"].restarts == 1 and check.live.index.size("engine-1") > 0)
        with_warm_up(monkeypatch, warm_up)
        ok, res = run(epp_route_check, args)
    assert not ok
    assert assert_one_sentence(res["msg"]).endswith("; engine-0 restarted in place during the check and llm-d-kv-cache v0.9.0, the EPP "
                                                    "v0.9.0's index, keeps a restarted engine's old blocks until its pod is replaced "
                                                    "(see restart_warning).")
    assert res["restarted_engines"] == ["engine-0"] and res["changed"] is False
    assert warned == [res["restart_warning"]]
    assert assert_one_sentence(warned[0]).startswith("Engine engine-0 restarted in place during the check (its KV-event sequence started "
                                                     "again); llm-d-kv-cache v0.9.0 keeps a restarted engine's old blocks until the pod "
                                                     "is replaced, so a precise llm-d EPP may route to blocks that engine no longer holds")


def test_a_pick_of_the_engine_holding_the_prefix_passes_without_a_warning(monkeypatch, warned):
    with two_engines_and_epp(lambda engines: address_of(engines[1])) as (engines, args):
        def warm_up(check):
            complete(engines[1], PREFIX + " first question")
            poll_until(check, lambda: check.live.index.size("engine-1") > 0)
        with_warm_up(monkeypatch, warm_up)
        ok, res = run(epp_route_check, args)
    assert ok, res.get("msg")
    assert res["holds_longest"] == res["warm_holds_longest"] == 1 and res["picks"][0]["engine"] == "engine-1"
    assert res["restarted_engines"] == [] and res["restart_warning"] is None and warned == []


def test_rejects_a_bad_option():
    ok, res = run(epp_route_check, {"epp": {"address": "http://127.0.0.1:9002"}, "requests": [{"prompt": "x"}],
                                    "engines": [{"url": "http://127.0.0.1:1", "endpoint": "tcp://127.0.0.1:1"}]})
    assert not ok and "epp.address: the EPP's ext_proc address is host:port, not a URL" in assert_one_sentence(res["msg"])
