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


def test_defaults_and_success(probe, monkeypatch):
    warned = []
    monkeypatch.setattr(module.AnsibleModule, "warn", lambda self, text: warned.append(text))
    failed, result = run({"model": "tiny", "api_key": "secret"})
    # what the module adds to the probe's answer: changed, the normalised url, the warnings moved out, no failures
    assert not failed and result["changed"] is False and "failures" not in result
    assert result["url"] == "http://127.0.0.1:8000"
    assert "warnings" not in result and warned == ["an estimate"]
    assert probe["metrics_url"] == "http://127.0.0.1:8000/metrics"
    assert probe["prefix_tokens"] == 256 and probe["block_size"] is None and probe["engine"] == "auto"
    client = probe["client"]
    assert (client.api_key, client.timeout, client.validate_certs, client.use_proxy, client.max_body_bytes) == ("secret", 60, True, True, 16777216)


def test_tls_and_proxy_options_reach_the_client(probe):
    run({"url": "https://h", "validate_certs": False, "ca_path": "/ca.pem", "client_cert": "/c.pem", "client_key": "/k.pem",
         "use_proxy": False, "max_body_bytes": 4096, "timeout": 2.5})
    client = probe["client"]
    assert (client.base_url, client.validate_certs, client.ca_path, client.client_cert, client.client_key) == (
        "https://h", False, "/ca.pem", "/c.pem", "/k.pem")
    assert (client.use_proxy, client.max_body_bytes, client.timeout) == (False, 4096, 2.5)


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
    ({"block_size": 0}, "block_size must be between 1 and 4096, got 0."),
    ({"engine": "tgi"}, "value of engine must be one of"),
    ({"timeout": 0}, "timeout must be above 0 and at most 3600, got 0."),
    ({"timeout": -3}, "timeout must be above 0 and at most 3600, got -3."),
    ({"prefix_tokens": -5}, "prefix_tokens must be between 1 and 131072, got -5."),
    ({"max_tokens": 0}, "max_tokens must be between 1 and 4096, got 0."),
    ({"min_hit_tokens": -1}, "min_hit_tokens must be at least 0, got -1."),
    ({"max_body_bytes": 10}, "max_body_bytes must be between 1024 and 1073741824, got 10."),
    ({"client_key": "/k.pem"}, "missing parameter(s) required by 'client_key': client_cert"),
])
def test_bad_arguments(probe, args, message):
    failed, result = run(args)
    assert failed and message in result["msg"]
    assert "client" not in probe, "the probe must not start with a bad option"


def test_real_probe_against_a_closed_port():
    """No fake: the module against a port where nothing listens fails with one sentence."""
    port = free_port()
    failed, result = run({"url": "http://127.0.0.1:%d" % port, "model": "m", "timeout": 2})
    assert failed
    assert result["msg"].startswith("Cannot reach http://127.0.0.1:%d/metrics" % port)
    assert result["msg"].endswith(".")


def test_check_mode_runs_the_same(probe):
    """Check mode is not skipped: the probe runs and its failures are judged the same way."""
    failed, result = run({"_ansible_check_mode": True, "min_hit_tokens": 512})
    assert "client" in probe
    assert failed and result["failures"] == ["The warm request hit 256 cached tokens, fewer than min_hit_tokens=512."]
