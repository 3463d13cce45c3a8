# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The lmcache_check module: arguments, the result and failure shapes, check mode, against a fake engine with LMCache."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import pytest
from ansible.module_utils import basic

from ansible_collections.inference_cache.substrate.plugins.modules import lmcache_check as module
from ansible_collections.inference_cache.substrate.tests.unit.plugins.modules.utils import run_module
from ansible_collections.inference_cache.substrate.tests.unit.plugins.net_utils import free_port
from ansible_collections.inference_cache.substrate.tests.unit.plugins.sentences import assert_one_sentence


def args(stack, **more):
    return dict({"url": stack.engine.url, "lmcache_url": stack.lmcache.url + "/", "prefix_tokens": 300, "settle": 0.3,
                 "chunk_size": 64}, **more)


def test_success_changes_nothing_and_returns_the_hit(stack, monkeypatch):
    warned = []
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda self, text: warned.append(text))
    exited, result = run_module(module, args(stack))
    assert exited and result["changed"] is False
    assert result["url"] == stack.engine.url and result["lmcache_url"] == stack.lmcache.url
    assert result["external_hit_tokens"] == result["expected_hit_tokens"] > 0 and result["same_text"] is True
    assert "warnings" not in result and warned == []


def test_check_mode_runs_the_same_check(stack):
    exited, result = run_module(module, args(stack), check_mode=True)
    assert exited and result["changed"] is False and result["external_hit_tokens"] == result["expected_hit_tokens"]
    assert len(stack.completions) == 2


def test_a_stopped_server_fails_with_one_sentence_and_the_facts(stack):
    stack.stop_lmcache()
    exited, result = run_module(module, args(stack))
    assert not exited and result["changed"] is False and result["failed"] is True
    assert_one_sentence(result["msg"])
    assert result["msg"].startswith("The LMCache tier is degraded: the LMCache server at %s does not answer" % stack.lmcache.url)
    assert result["connector"] == "multiprocess" and result["lmcache_url"] == stack.lmcache.url and result["degraded"] is True


def test_the_engine_is_unreachable():
    port = free_port()
    exited, result = run_module(module, {"url": "http://127.0.0.1:%d" % port, "model": "tiny", "timeout": 2})
    assert not exited
    assert assert_one_sentence(result["msg"]).startswith("The engine's metrics cannot be read: Cannot reach http://127.0.0.1:%d" % port)


def test_kv_events_that_never_arrive_are_named(stack):
    endpoint = "tcp://127.0.0.1:%d" % free_port()
    exited, result = run_module(module, args(stack, kv_events={"endpoint": endpoint, "socket_mode": "bind", "connect_timeout": 0.3}))
    assert not exited and "The engine's KV events at %s never arrived within 0.3 s" % endpoint in result["msg"]


@pytest.mark.parametrize("more, message", [
    ({"prefix_tokens": 1}, "prefix_tokens must be between 2 and 131072, got 1."),
    ({"max_tokens": 0}, "max_tokens must be between 1 and 256, got 0."),
    ({"miss": "flush"}, "value of miss must be one of"),
    ({"flood_prompts": 0}, "flood_prompts must be between 1 and 1024, got 0."),
    ({"chunk_size": 0}, "chunk_size must be between 1 and 1048576, got 0."),
    ({"logprob_tolerance": -1.0}, "logprob_tolerance must be at least 0, got -1."),
    ({"settle": 0}, "settle must be above 0 and at most 300, got 0."),
    ({"url": "127.0.0.1:8000"}, "url must be an http:// or https:// URL"),
    ({"lmcache_url": "ftp://x"}, "lmcache_url must be an http:// or https:// URL of the LMCache server's HTTP API"),
    ({"kv_events": {"endpoint": "5557"}}, "kv_events.endpoint must be a ZMQ endpoint"),
    ({"kv_events": {"endpoint": "tcp://127.0.0.1:5557", "connect_timeout": 0}}, "kv_events.connect_timeout must be above 0"),
])
def test_bad_arguments_are_refused_before_any_request(stack, more, message):
    exited, result = run_module(module, args(stack, **more))
    assert not exited and message in result["msg"], result["msg"]
    assert stack.completions == []
