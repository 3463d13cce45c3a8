# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The prefix_cache_check module: arguments, exit and failure shapes (the probe is replaced by a fake)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import functools
import json

import pytest
from ansible.module_utils import basic
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.inference_cache.substrate.plugins.modules import prefix_cache_check as module
from ansible_collections.inference_cache.substrate.plugins.module_utils.http import prefix_cache as pc
from ansible_collections.inference_cache.substrate.tests.unit.plugins.modules.utils import infinite_int_sentence, run_module
from ansible_collections.inference_cache.substrate.tests.unit.plugins.http_server import ScriptedServer, sse
from ansible_collections.inference_cache.substrate.tests.unit.plugins.net_utils import free_port
from ansible_collections.inference_cache.substrate.tests.unit.plugins.sentences import assert_one_sentence


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
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda self, text: warned.append(text))
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
    # ansible-core's own int check raises OverflowError here ("cannot convert Infinity to integer")
    ({"prefix_tokens": float("inf")}, infinite_int_sentence("prefix_tokens", "prefix_tokens must be a whole number, got an infinite number.")),
    ({"timeout": float("inf")}, "timeout must be above 0 and at most 3600, got inf."),
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


def test_kv_events_watch_the_probes_own_requests(probe, monkeypatch):
    """With kv_events the probe sends its cold and warm requests through the windows, and the result carries them."""
    made = {}

    class FakeWindows:
        def __init__(self, params, url, model=None, engine="auto"):
            made.update(params=params, url=url, model=model, engine=engine)
            self.windows = {}

        def around(self, name, send):
            self.windows[name] = {"counts": {"BlockStored": 3}, "trigger": send()}
            return self.windows[name]["trigger"]

        def open(self):
            made["opened"] = True

        def hand_over(self):
            return None

        def close(self):
            made["closed"] = True

    monkeypatch.setattr(module, "RequestWindows", FakeWindows)

    def run_through_windows(self):
        around = probe["around"]
        return dict(RESULT, cold=around("cold", lambda: {"cached_tokens": 0}), warm=around("warm", lambda: {"cached_tokens": 256}))

    monkeypatch.setattr(module.PrefixCacheProbe, "run", run_through_windows)
    failed, result = run({"url": "http://h:8000/", "model": "tiny", "engine": "vllm",
                          "kv_events": {"endpoint": "tcp://127.0.0.1:5557", "socket_mode": "bind", "topic": "kv@"}})
    assert not failed, result
    assert made["url"] == "http://h:8000" and made["engine"] == "vllm" and made["model"]() == "tiny"
    assert made["opened"] and made["closed"]
    assert made["params"]["endpoint"] == "tcp://127.0.0.1:5557" and made["params"]["settle"] == 1.0 and made["params"]["delay"] == 0.05
    assert result["kv_events"] == {"cold": {"counts": {"BlockStored": 3}, "trigger": {"cached_tokens": 0}},
                                   "warm": {"counts": {"BlockStored": 3}, "trigger": {"cached_tokens": 256}}}


def test_without_kv_events_no_window_and_no_such_result(probe):
    failed, result = run({"model": "tiny"})
    assert not failed and probe["around"] is None and "kv_events" not in result


@pytest.mark.parametrize("kv_events, message", [
    ({"endpoint": "localhost:5557"}, "kv_events.endpoint must be a ZMQ endpoint such as tcp://HOST:PORT"),
    ({"socket_mode": "bind"}, "endpoint"),
    ({"endpoint": "tcp://h:1", "settle": -1}, "settle must be between 0 and 3600, got -1."),
    ({"endpoint": "tcp://h:1", "delay": 61}, "delay must be between 0 and 60, got 61."),
    ({"endpoint": "tcp://h:1", "expect": {"Stored": 1}}, "expect names an unknown event type 'Stored'"),
])
def test_bad_kv_events(probe, kv_events, message):
    failed, result = run({"kv_events": kv_events})
    assert failed and message in result["msg"], result["msg"]
    assert_one_sentence(result["msg"])
    assert "client" not in probe, "the probe must not start with a bad option"


def test_check_mode_runs_the_same(probe):
    """Check mode is not skipped: the probe runs and its failures are judged the same way."""
    failed, result = run({"_ansible_check_mode": True, "min_hit_tokens": 512})
    assert "client" in probe
    assert failed and result["failures"] == ["The warm request hit 256 cached tokens, fewer than min_hit_tokens=512."]


# -- the real probe and client against a scripted server on 127.0.0.1 ---------------------------------------------
class ScriptedVLLM:
    """A vLLM in miniature over real HTTP: one token per word plus BOS, 4-token blocks, the last token always computed."""

    BLOCK = 4

    def __init__(self, server):
        self.server = server
        self.blocks = set()
        self.hits = 0
        self.queries = 0
        self.good()

    def good(self):
        self.server.routes.update({
            "/v1/models": (200, "application/json", json.dumps({"data": [{"id": "tiny"}]}).encode()),
            "/tokenize": (200, "application/json", lambda body: json.dumps({"count": len(body["prompt"].split()) + 1}).encode()),
            "/metrics": (200, "text/plain", lambda body: self.page().encode()),
            "/v1/completions": (200, "text/event-stream", self.complete),
        })

    def page(self):
        return ("# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total %d\n"
                "# TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total %d\n"
                "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"%d\"} 1\n" % (self.hits, self.queries, self.BLOCK))

    def complete(self, body):
        toks = ["<s>"] + body["prompt"].split()
        chain = [tuple(toks[:(i + 1) * self.BLOCK]) for i in range(len(toks) // self.BLOCK)]
        cached = 0
        for key in chain[:(len(toks) - 1) // self.BLOCK]:
            if key not in self.blocks:
                break
            cached += self.BLOCK
        self.blocks.update(chain)
        self.hits += cached
        self.queries += len(toks)
        usage = {"prompt_tokens": len(toks), "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": cached}}
        return sse({"choices": [{"text": "x"}]}, {"choices": [], "usage": usage})


@pytest.fixture(scope="module")
def server():
    srv = ScriptedServer().start()
    yield srv
    srv.stop()


@pytest.fixture
def vllm(server, monkeypatch):
    """The scripted engine, fresh; the probe's settle wait is 0 so a counter that never moves costs no time."""
    monkeypatch.setattr(module, "PrefixCacheProbe", functools.partial(pc.PrefixCacheProbe, settle=0.0))
    for name in ("http_proxy", "HTTP_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    return ScriptedVLLM(server)


def test_real_probe_measures_the_scripted_engine(vllm):
    failed, result = run({"url": vllm.server.url, "prefix_tokens": 16, "min_hit_tokens": 16})
    assert not failed, result["msg"]
    # 16 words + BOS + nonce = 18 shared tokens; each prompt adds 6 words and a block of its own (4 words): 28 tokens,
    # 4 full shared blocks
    assert (result["prefix_tokens"], result["warm"]["prompt_tokens"]) == (18, 28)
    assert result["hit_tokens"] == 16 and result["cached_tokens"] == 16 and result["expected_hit_tokens"] == 16
    assert result["cold"]["hit_tokens"] == 0 and result["query_tokens"] == 56
    assert result["block_size"] == 4 and result["block_size_source"] == "metrics"


SHAPES = [
    ("/v1/completions", sse([{"text": "x"}]), "streamed a chunk that is not a JSON object"),
    ("/v1/completions", sse({"choices": ["x"]}), "streamed a choice that is not a JSON object"),
    ("/v1/completions", sse({"choices": [], "usage": [1]}), "reported a usage that is not a JSON object"),
    ("/v1/completions", sse({"choices": [{"text": "x"}], "usage": {"prompt_tokens_details": {"cached_tokens": "lots"}}}),
     'reported cached_tokens that is not a whole number: "lots"'),
    ("/v1/completions", sse({"choices": [{"text": "x"}], "usage": {"prompt_tokens": 3.5}}), "reported usage.prompt_tokens that is not a whole number: 3.5"),
    ("/v1/completions", [b"data: {oops\n\n"], "streamed a chunk that is not JSON"),
    ("/v1/completions", [b"data: [DONE]\n\n"], "streamed no completion chunk"),
    ("/v1/completions", sse(*[{"choices": [{"text": "x" * 1000}]}] * 2000), "streamed more than 1048576 bytes (max_body_bytes)"),
    ("/metrics", b"x" * (1024 * 1024 + 1), "answered more than 1048576 bytes (max_body_bytes)"),
    ("/metrics", b"vllm:prefix_cache_hits_total{ 1\n", "The metrics page is not in the Prometheus text format"),
    ("/metrics", b"vllm:prefix_cache_hits_total NaN\nvllm:prefix_cache_queries_total 1\n", "is not a finite number on the metrics page."),
    ("/v1/models", b"[]", "The server lists no model at /v1/models; set the model option."),
    ("/v1/models", b"<html>", "/v1/models did not answer JSON"),
    ("/v1/models", json.dumps({"data": [{"id": ["tiny"]}]}).encode(), "The server lists no model at /v1/models"),
]


@pytest.mark.parametrize("path, body, message", SHAPES)
def test_answers_of_the_wrong_shape_are_one_sentence(vllm, path, body, message):
    ctype = "text/event-stream" if path == "/v1/completions" else "application/json"
    vllm.server.routes[path] = (200, ctype, body)
    failed, result = run({"url": vllm.server.url, "prefix_tokens": 16, "max_body_bytes": 1024 * 1024})
    assert failed and message in result["msg"]
    assert_one_sentence(result["msg"])


@pytest.mark.parametrize("timeout", [0, -3])
def test_zero_and_negative_timeouts_are_one_sentence(vllm, timeout):
    before = len(vllm.server.requests)  # the server is shared: only this test's requests count
    failed, result = run({"url": vllm.server.url, "timeout": timeout})
    assert failed and result["msg"] == "timeout must be above 0 and at most 3600, got %d." % timeout
    assert vllm.server.requests[before:] == [], "refused before any request"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10 ** 20) | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(
        ["data", "id", "count", "tokens", "choices", "text", "delta", "content", "usage", "prompt_tokens",
         "prompt_tokens_details", "cached_tokens", "error", "message"]), inner, max_size=4),
    max_leaves=10)
GOOD_CHUNK = {"choices": [{"text": "x", "delta": {"content": "x"}}],
              "usage": {"prompt_tokens": 9, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 0}}}
# Where a wrong value can sit in a stream chunk: the chunk, its choices, one choice, its text and delta, the usage, ...
CHUNK_PATHS = [(), ("choices",), ("choices", 0), ("choices", 0, "text"), ("choices", 0, "delta"), ("choices", 0, "delta", "content"),
               ("usage",), ("usage", "prompt_tokens"), ("usage", "prompt_tokens_details"), ("usage", "prompt_tokens_details", "cached_tokens")]


def _replace(value, path, new):
    if not path:
        return new
    value = json.loads(json.dumps(value))
    inner = value
    for key in path[:-1]:
        inner = inner[key]
    inner[path[-1]] = new
    return value


MUTATED_CHUNK = st.builds(_replace, st.just(GOOD_CHUNK), st.sampled_from(CHUNK_PATHS), JSON)
BODIES = st.one_of(JSON.map(lambda value: json.dumps(value).encode()), st.binary(max_size=40),
                   st.lists(st.one_of(JSON, MUTATED_CHUNK, MUTATED_CHUNK), min_size=1, max_size=3).map(lambda chunks: b"".join(sse(*chunks))))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(answers=st.fixed_dictionaries({}, optional={path: BODIES for path in ("/v1/models", "/tokenize", "/metrics", "/v1/completions")}),
       status=st.sampled_from([200, 200, 200, 404, 500]))
def test_generated_server_answers_never_raise(vllm, answers, status):
    """Whatever the server answers, the module reports a measurement or fails with one sentence."""
    vllm.good()
    for path, body in answers.items():
        vllm.server.routes[path] = (status, "application/json", body)
    failed, result = run({"url": vllm.server.url, "prefix_tokens": 8, "min_hit_tokens": 0, "timeout": 5})
    if failed:
        assert_one_sentence(result["msg"])
    else:
        assert isinstance(result["hit_tokens"], int) and result["changed"] is False


# Texts without control characters: ansible-core's own choices message echoes the value as it is (a '\r' would break
# the line there, not in this collection's messages).
OPTION_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-10 ** 6, 10 ** 6), st.floats(),
                          st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), max_size=8),
                          st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(options=st.fixed_dictionaries({}, optional={name: OPTION_VALUES for name in (
    "prefix_tokens", "block_size", "max_tokens", "timeout", "min_hit_tokens", "max_body_bytes", "engine", "model",
    "validate_certs", "use_proxy", "expect_warm_faster", "metrics_url", "prefix")}))
def test_generated_options_never_raise(vllm, options):
    """Wrong types and out-of-range numbers for every option: a measurement or one sentence, never an exception."""
    vllm.good()
    failed, result = run(dict(options, url=vllm.server.url))
    if failed:
        assert_one_sentence(result["msg"])


# -- the LMCache tier in the same run (lmcache), the real probes against a fake engine with LMCache beside it ---------
def tier_args(stack, **tier):
    return {"url": stack.engine.url, "model": "tiny", "prefix_tokens": 96, "block_size": 32, "max_tokens": 2,
            "lmcache": dict({"lmcache_url": stack.lmcache.url + "/", "prefix_tokens": 300, "settle": 0.3, "chunk_size": 64}, **tier)}


def test_the_tier_is_checked_after_the_prefix_cache_in_the_same_run(stack):
    failed, result = run(tier_args(stack))
    assert not failed, result
    assert result["hit_tokens"] == 96 and result["external_prefix_cache"] is True
    tier = result["lmcache"]
    assert tier["lmcache_url"] == stack.lmcache.url and tier["connector"] == "multiprocess" and tier["chunk_size"] == 64
    assert tier["external_hit_tokens"] == tier["expected_hit_tokens"] > 0 and tier["same_text"] is True
    # Two requests of the prefix cache's, then the tier's cold and restored ones, the last after the reset.
    assert len(stack.completions) == 4 and stack.completions[2]["prompt"] == stack.completions[3]["prompt"]
    assert stack.completions[3]["external"] > 0 and stack.completions[3]["device"] == 0


def test_only_with_connector_skips_an_engine_without_one(stack):
    stack.external_counters = False
    failed, result = run(tier_args(stack, only_with_connector=True))
    assert not failed, result
    assert result["external_prefix_cache"] is False and "lmcache" not in result and len(stack.completions) == 2


def test_without_only_with_connector_an_engine_without_one_fails_the_tier(stack):
    stack.external_counters = False
    failed, result = run(tier_args(stack))
    assert failed and assert_one_sentence(result["msg"]).startswith("The engine exposes no vllm:external_prefix_cache_hits_total")
    assert result["hit_tokens"] == 96, "the prefix cache's facts come with the tier's failure"


def test_a_degraded_tier_fails_with_its_sentence_and_both_checks_facts(stack):
    stack.stop_lmcache()
    failed, result = run(tier_args(stack))
    assert failed and assert_one_sentence(result["msg"]).startswith(
        "The LMCache tier is degraded: the LMCache server at %s does not answer" % stack.lmcache.url)
    assert result["hit_tokens"] == 96 and result["lmcache"]["degraded"] is True
    assert result["lmcache"]["lmcache_url"] == stack.lmcache.url and len(stack.completions) == 2


def test_a_failed_prefix_cache_check_leaves_the_tier_unchecked(stack):
    failed, result = run(dict(tier_args(stack), min_hit_tokens=512))
    assert failed and "fewer than min_hit_tokens=512" in result["msg"]
    assert "lmcache" not in result and len(stack.completions) == 2


def test_the_tiers_kv_events_that_never_arrive_are_named(stack):
    endpoint = "tcp://127.0.0.1:%d" % free_port()
    failed, result = run(tier_args(stack, kv_events={"endpoint": endpoint, "socket_mode": "bind", "connect_timeout": 0.3}))
    assert failed and "The engine's KV events at %s never arrived within 0.3 s" % endpoint in result["msg"]


@pytest.mark.parametrize("tier, message", [
    ({"prefix_tokens": 1}, "lmcache.prefix_tokens must be between 2 and 131072, got 1."),
    ({"max_tokens": 257}, "lmcache.max_tokens must be between 1 and 256, got 257."),
    ({"settle": 0}, "lmcache.settle must be above 0 and at most 300, got 0."),
    ({"lmcache_url": "127.0.0.1:8051"}, "lmcache.lmcache_url must be an http:// or https:// URL of the LMCache server's HTTP API"),
    ({"kv_events": {"endpoint": "localhost:5557"}}, "lmcache.kv_events.endpoint must be a ZMQ endpoint"),
    ({"miss": "flush"}, "miss must be one of"),
])
def test_bad_lmcache_options(probe, tier, message):
    failed, result = run({"lmcache": tier})
    assert failed and message in result["msg"], result["msg"]
    assert_one_sentence(result["msg"])
    assert "client" not in probe, "the probe must not start with a bad option"
