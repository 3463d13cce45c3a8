# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""kv_index_check through AnsibleModule (set_module_args / AnsibleExitJson pattern) against two fake engines."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import contextlib

import pytest
from ansible.module_utils import basic

from ansible_collections.inference_cache.substrate.plugins.modules import kv_index_check
from ansible_collections.inference_cache.substrate.tests.unit.plugins.kv_index_fake import FakeEngine
from ansible_collections.inference_cache.substrate.tests.unit.plugins.modules.utils import run_module as run
from ansible_collections.inference_cache.substrate.tests.unit.plugins.net_utils import free_port
from ansible_collections.inference_cache.substrate.tests.unit.plugins.sentences import assert_one_sentence


@contextlib.contextmanager
def engines_args(**engine_kwargs):
    with contextlib.ExitStack() as stack:
        specs = []
        for idx in range(2):
            port = free_port()
            engine = stack.enter_context(FakeEngine(port, "tcp://127.0.0.1:%d" % free_port(), "kv@127.0.0.1:%d@tiny" % port, **engine_kwargs))
            specs.append({"name": "e%d" % idx, "url": engine.url, "endpoint": engine.endpoint, "topic": engine.topic.decode(),
                          "api_key": "secret-%d" % idx})
        # event_wait and timeout are bounds: the check waits for each request's events (a condition), never for a time.
        yield {"engines": specs, "settle": 0.05, "event_wait": 60.0, "timeout": 300,
               "workload": {"families": 4, "rounds": 8, "preamble_words": 6, "prefix_words": 18, "suffix_words": 6},
               "expect": {"min_requests": 30, "min_evictions_per_engine": 1}}


@pytest.mark.parametrize("check_mode", [False, True])
def test_passes_and_reports_side_by_side(check_mode):
    with engines_args(num_blocks=24) as args:
        ok, res = run(kv_index_check, args, check_mode=check_mode)
    assert ok, res.get("msg")
    assert res["changed"] is False
    assert res["exact"] == res["requests"] >= 30 and res["exact_percent"] == 100.0
    assert res["uncounted"]["wrong"] > 0
    assert set(res["engines"]) == {"e0", "e1"} and all(e["blocks_removed"] > 0 for e in res["engines"].values())
    assert "secret-0" not in repr(res)
    for key in ("largest_error", "mismatches", "routing", "approximate", "summary", "block_size", "model", "steps", "elapsed"):
        assert key in res


@pytest.fixture
def warned(monkeypatch):
    """What the module passed to AnsibleModule.warn (exit_json is patched, so the result never carries 'warnings')."""
    seen = []
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda self, message: seen.append(message))
    return seen


def test_an_engine_restarted_in_place_is_a_warning(warned):
    """e1 starts again in place after its 5th request (empty cache, sequence from 0, no AllBlocksCleared): the check stays exact
    and the module warns, in one sentence, that the llm-d EPP v0.9.0 keeps its old blocks."""
    with engines_args(num_blocks=24, restart_after=5) as args:
        ok, res = run(kv_index_check, args)
    assert ok, res.get("msg")
    assert res["restarted_engines"] == ["e0", "e1"] and res["exact"] + res["restart_misses"] == res["requests"]
    assert warned == [res["restart_warning"]]
    assert assert_one_sentence(warned[0]) == (
        "Engines e0 and e1 restarted in place during the check (their KV-event sequences started again); llm-d-kv-cache v0.9.0 keeps "
        "a restarted engine's old blocks until the pod is replaced, so a precise llm-d EPP may route to blocks those engines no longer "
        "hold: replace the pod (delete it so its Deployment creates a new one with a new address) rather than restart its container.")


def test_no_restart_no_warning(warned):
    with engines_args(num_blocks=24) as args:
        args["workload"] = dict(args["workload"], rounds=2)
        args["expect"] = {"min_requests": 1}
        ok, res = run(kv_index_check, args)
    assert ok, res.get("msg")
    assert res["restarted_engines"] == [] and res["restart_warning"] is None and res["restart_misses"] == 0 and warned == []


def test_fails_with_one_sentence_when_events_are_withheld():
    with engines_args(num_blocks=24) as args:
        args["engines"][1]["withhold_after"] = 3
        ok, res = run(kv_index_check, args)
    assert not ok
    msg = assert_one_sentence(res["msg"])
    assert "on engine e1" in msg and "the subscription to its events was stopped after 3 requests" in msg
    assert res["changed"] is False and res["mismatches"]


def test_rejects_a_bad_option():
    ok, res = run(kv_index_check, {"engines": [{"url": "http://127.0.0.1:1", "endpoint": "tcp://127.0.0.1:1", "socket_mode": "sideways"}]})
    assert not ok and "socket_mode" in res["msg"]
