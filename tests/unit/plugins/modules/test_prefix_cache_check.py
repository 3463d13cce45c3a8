# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The prefix_cache_check module: arguments, exit and failure shapes (the probe is replaced by a fake)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json

import pytest


from ansible_collections.inference_cache.substrate.plugins.modules import prefix_cache_check as module
from ansible_collections.inference_cache.substrate.plugins.module_utils import _prefix_cache as pc
from ansible_collections.inference_cache.substrate.tests.unit.plugins.modules.utils import run_module
from ansible_collections.inference_cache.substrate.tests.unit.plugins.net_utils import free_port


def run(args):
    """Return (failed, result)."""
    exited, result = run_module(module, args)
    return not exited, result


RESULT = {
    "engine": "vllm", "model": "tiny", "metrics_url": "http://127.0.0.1:8000/metrics",
    "metric_names": {"hits": "vllm:prefix_cache_hits_total", "queries": "vllm:prefix_cache_queries_total"},
    "nonce": "n", "block_size": 32, "block_size_source": "option", "prefix_tokens": 260, "prefix_tokens_estimated": False,
    "expected_hit_tokens": 256, "cold": {"ttft": 0.09, "cached_tokens": 0, "hit_tokens": 0},
    "warm": {"ttft": 0.03, "cached_tokens": 256, "hit_tokens": 256}, "hit_tokens": 256, "query_tokens": 530,
    "cached_tokens": 256, "ttft_ratio": 3.0, "latency_ratio": 2.0, "warnings": ["an estimate"],
}


@pytest.fixture
def probe(monkeypatch):
    seen = {}

    class FakeProbe:
        def __init__(self, client, metrics_url, **kwargs):
            seen.update(kwargs, metrics_url=metrics_url, client=client)
            self.model = kwargs["model"]

        def run(self):
            if "raise" in seen:
                raise pc.PrefixCacheError(seen["raise"])
            return json.loads(json.dumps(seen.get("result", RESULT)))

    monkeypatch.setattr(module, "PrefixCacheProbe", FakeProbe)
    return seen


def test_defaults_and_success(probe):
    failed, result = run({"model": "tiny", "api_key": "secret"})
    assert not failed and result["changed"] is False
    assert result["hit_tokens"] == 256 and result["url"] == "http://127.0.0.1:8000"
    assert "warnings" not in result
    assert probe["metrics_url"] == "http://127.0.0.1:8000/metrics"
    assert probe["client"].api_key == "secret"
    assert probe["prefix_tokens"] == 256 and probe["block_size"] is None and probe["engine"] == "auto"


def test_metrics_url_override_and_trailing_slash(probe):
    run({"url": "http://h:9/", "metrics_url": "http://h:9100/metrics"})
    assert probe["metrics_url"] == "http://h:9100/metrics"
    assert probe["client"].base_url == "http://h:9"


def test_probe_error_is_the_message(probe):
    probe["raise"] = "The metrics endpoint http://h/metrics is missing (HTTP 404)."
    failed, result = run({"url": "http://h", "model": "m"})
    assert failed and result["msg"] == probe["raise"] and result["changed"] is False


def test_expectation_failure(probe):
    failed, result = run({"min_hit_tokens": 512})
    assert failed
    assert result["msg"] == "The warm request hit 256 cached tokens, fewer than min_hit_tokens=512."
    assert result["failures"] == [result["msg"]] and result["hit_tokens"] == 256


def test_warm_faster_expectation(probe):
    probe["result"] = dict(RESULT, warm=dict(RESULT["warm"], ttft=0.5))
    failed, result = run({"expect_warm_faster": True})
    assert failed and "was not faster" in result["msg"]


@pytest.mark.parametrize("args, message", [
    ({"prefix": "x", "prefix_tokens": 64}, "mutually exclusive"),
    ({"block_size": 0}, "block_size must be a positive number"),
    ({"engine": "tgi"}, "value of engine must be one of"),
])
def test_bad_arguments(probe, args, message):
    failed, result = run(args)
    assert failed and message in result["msg"]


def test_real_probe_against_a_closed_port():
    """No fake: the module against a port where nothing listens fails with one sentence."""
    port = free_port()
    failed, result = run({"url": "http://127.0.0.1:%d" % port, "model": "m", "timeout": 2})
    assert failed
    assert result["msg"].startswith("Cannot reach http://127.0.0.1:%d/metrics" % port)
    assert result["msg"].endswith(".")


def test_check_mode_runs_the_same(probe):
    failed, result = run({"_ansible_check_mode": True})
    assert not failed and result["hit_tokens"] == 256
