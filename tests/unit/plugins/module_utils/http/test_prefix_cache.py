# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Prefix-cache measurement: metrics parsing, engine detection, expectations, and the probe against a fake server."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.http import openai as http
from ansible_collections.inference_cache.substrate.plugins.module_utils.http import prefix_cache as pc

VLLM_PAGE = """\
# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 2898.0
vllm:prefix_cache_queries_created{engine="0",model_name="tiny"} 1.7e+09
# HELP vllm:prefix_cache_hits Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 1280.0
vllm:prefix_cache_hits_total{engine="0",model_name="other"} 99.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="32",enable_prefix_caching="True",engine="0"} 1.0
"""

VLLM_OLD_PAGE = """\
# TYPE vllm:gpu_prefix_cache_queries counter
vllm:gpu_prefix_cache_queries_total{model_name="m"} 10.0
# TYPE vllm:gpu_prefix_cache_hits counter
vllm:gpu_prefix_cache_hits_total{model_name="m"} 4.0
"""

SGLANG_PAGE = """\
# TYPE sglang:prompt_tokens counter
sglang:prompt_tokens_total{model_name="qwen"} 100.0
# TYPE sglang:cached_tokens counter
sglang:cached_tokens_total{model_name="qwen",cache_source="device"} 30.0
sglang:cached_tokens_total{model_name="qwen",cache_source="host"} 2.0
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="qwen"} 0.3
"""


# -- parsing and detection -------------------------------------------------------------------------------------
def test_parse_vllm_sums_labels_of_the_model_and_reads_block_size():
    parsed = pc.parse_metrics(VLLM_PAGE, model="tiny")
    assert parsed["samples"]["vllm:prefix_cache_hits_total"] == 1280.0
    assert parsed["samples"]["vllm:prefix_cache_queries_total"] == 2898.0
    assert parsed["block_size"] == 32


def test_histogram_buckets_are_left_unread_and_their_count_and_sum_kept():
    page = VLLM_PAGE + (
        "# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.\n"
        "# TYPE vllm:time_to_first_token_seconds histogram\n"
        'vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="tiny"} 0.0\n'
        'vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="tiny"} 7.0\n'
        'vllm:time_to_first_token_seconds_count{model_name="tiny"} 7.0\n'
        'vllm:time_to_first_token_seconds_sum{model_name="tiny"} 0.42\n'
        "# TYPE vllm:bucket_bytes_total counter\n"   # a name with "bucket" in it that is no bucket line
        'vllm:bucket_bytes_total{model_name="tiny"} 3.0\n')
    samples = pc.parse_metrics(page, model="tiny")["samples"]
    assert not [name for name in samples if name.endswith("_bucket")]
    assert samples["vllm:time_to_first_token_seconds_count"] == 7.0 and samples["vllm:time_to_first_token_seconds_sum"] == 0.42
    assert samples["vllm:bucket_bytes_total"] == 3.0
    assert samples["vllm:prefix_cache_hits_total"] == 1280.0


def test_parse_without_model_sums_everything():
    assert pc.parse_metrics(VLLM_PAGE)["samples"]["vllm:prefix_cache_hits_total"] == 1379.0


def test_parse_unknown_model_does_not_filter():
    assert pc.parse_metrics(VLLM_PAGE, model="nope")["samples"]["vllm:prefix_cache_hits_total"] == 1379.0


def test_parse_sglang_sums_cache_sources():
    parsed = pc.parse_metrics(SGLANG_PAGE, model="qwen")
    assert parsed["samples"]["sglang:cached_tokens_total"] == 32.0
    assert parsed["block_size"] is None


def test_parse_rejects_garbage():
    with pytest.raises(pc.PrefixCacheError, match="not in the Prometheus text format"):
        pc.parse_metrics("this is {not a metrics page\n")


def test_a_garbage_page_with_line_breaks_in_the_parser_error_is_still_one_line():
    """Hypothesis found it: the parser quotes the bad line, carriage return included."""
    with pytest.raises(pc.PrefixCacheError) as caught:
        pc.parse_metrics("\x00\r\x00")
    msg = caught.value.msg
    assert msg.startswith("The metrics page is not in the Prometheus text format: ") and msg.endswith(".")
    assert "\n" not in msg and "\r" not in msg, repr(msg)


@pytest.mark.parametrize("page, engine, expected", [
    (VLLM_PAGE, "auto", ("vllm", "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")),
    (VLLM_OLD_PAGE, "auto", ("vllm", "vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total")),
    (SGLANG_PAGE, "auto", ("sglang", "sglang:cached_tokens_total", "sglang:prompt_tokens_total")),
    (SGLANG_PAGE, "sglang", ("sglang", "sglang:cached_tokens_total", "sglang:prompt_tokens_total")),
    (VLLM_PAGE, "sglang", None),
    ("# TYPE x counter\nx_total 1\n", "auto", None),
])
def test_detect_engine(page, engine, expected):
    assert pc.detect_engine(pc.parse_metrics(page)["samples"], engine) == expected


@pytest.mark.parametrize("tokens, block, expected", [(0, 32, 0), (31, 32, 0), (32, 32, 32), (95, 32, 64), (5, 0, 0)])
def test_blocks_floor(tokens, block, expected):
    assert pc.blocks_floor(tokens, block) == expected


@pytest.mark.parametrize("prompt_tokens, cached_blocks, block, expected", [
    (64, 2, 32, 32),       # every full block cached: vLLM still computes the last token, so one block less
    (65, 2, 32, 64),       # one token past the blocks: both count
    (96, 3, 32, 64),
    (97, 3, 32, 96),
    (100, 1, 32, 32),      # fewer blocks cached than the prompt has
    (1300, 40, 32, 1280),  # REFERENCE part L: a 1299-token shared prefix, 40 blocks x 32 hit
    (1449, 45, 32, 1440),
    (0, 3, 32, 0),
    (10, 0, 32, 0),
    (10, 1, 0, 0),
])
def test_expected_cached_tokens(prompt_tokens, cached_blocks, block, expected):
    assert pc.expected_cached_tokens(prompt_tokens, cached_blocks, block) == expected


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_counter_that_is_not_finite_is_a_sentence(value):
    before = {"samples": {"c": 1.0}}
    with pytest.raises(pc.PrefixCacheError, match=r"^The counter c is not a finite number on the metrics page\.$"):
        pc.delta(before, {"samples": {"c": value}}, "c")


# -- expectations ----------------------------------------------------------------------------------------------
def _result(hits=256, cached=256, cold_ttft=0.09, warm_ttft=0.03):
    return {"block_size": 32, "hit_tokens": hits, "prefix_tokens": 260,
            "metric_names": {"hits": "vllm:prefix_cache_hits_total", "queries": "q"},
            "cold": {"ttft": cold_ttft, "cached_tokens": 0}, "warm": {"ttft": warm_ttft, "cached_tokens": cached}}


@pytest.mark.parametrize("result, kwargs, message", [
    (_result(), {}, None),
    (_result(), {"min_hit_tokens": 256, "expect_warm_faster": True}, None),
    (_result(hits=0), {}, "hit no cached tokens"),
    (_result(hits=32), {"min_hit_tokens": 256}, "hit 32 cached tokens, fewer than min_hit_tokens=256"),
    (_result(hits=0), {"min_hit_tokens": 0}, None),
    (_result(warm_ttft=0.2), {"expect_warm_faster": True}, "was not faster"),
    (_result(warm_ttft=0.2), {}, None),
])
def test_evaluate(result, kwargs, message):
    failures = pc.evaluate(result, **kwargs)
    if message is None:
        assert failures == []
    else:
        assert len(failures) == 1 and message in failures[0]
        assert failures[0].endswith(".")


# -- the probe against a fake engine -----------------------------------------------------------------------------
class FakeEngine:
    """A prefix-caching server in miniature: one token per word plus BOS, block-granular cache, Prometheus page."""

    def __init__(self, block_size=32, page="vllm", tokenize=True, metrics_status=None, reachable=True, hit=True):
        self.block_size = block_size
        self.page = page
        self.tokenize = tokenize
        self.metrics_status = metrics_status
        self.reachable = reachable
        self.hit = hit
        self.blocks = set()
        self.hits = 0
        self.queries = 0
        self.now = 0.0
        self.requests = []

    def clock(self):
        return self.now

    def url(self, path):
        return "http://engine" + path

    def _fail(self, path, status=None):
        if status is None:
            raise http.OpenAIHTTPError("Cannot reach http://engine%s: Connection refused" % path, "http://engine" + path)
        raise http.OpenAIHTTPError("http://engine%s answered HTTP %d" % (path, status), "http://engine" + path, status)

    def tokens(self, text):
        return ["<s>"] + text.split()

    def get_text(self, path):
        if not self.reachable:
            self._fail(path)
        if path == "/v1/models":
            return json.dumps({"data": [{"id": "tiny"}]})
        if self.metrics_status:
            self._fail(path, self.metrics_status)
        if self.page == "none":
            return "# TYPE up gauge\nup 1\n"
        return ("# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total{model_name=\"tiny\"} %d\n"
                "# TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total{model_name=\"tiny\"} %d\n"
                "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"%d\"} 1\n"
                % (self.hits, self.queries, self.block_size))

    def get_json(self, path):
        return json.loads(self.get_text(path))

    def post_json(self, path, body):
        if not self.reachable:
            self._fail(path)
        if not self.tokenize:
            self._fail(path, 404)
        return {"count": len(self.tokens(body["prompt"])), "max_model_len": 2048}

    def stream_completion(self, body):
        if not self.reachable:
            self._fail("/v1/completions")
        self.requests.append(body)
        toks = self.tokens(body["prompt"])
        chain, cached = [], 0
        full = len(toks) // self.block_size
        for i in range(full):
            chain.append(tuple(toks[:(i + 1) * self.block_size]))
        # like vLLM, the last prompt token is always computed: only blocks before it can hit
        for key in chain[:(len(toks) - 1) // self.block_size]:
            if self.hit and key in self.blocks:
                cached += self.block_size
            else:
                break
        self.blocks.update(chain)
        self.hits += cached
        self.queries += len(toks)
        start = self.now
        ttft = 0.08 if cached == 0 else 0.02
        self.now += ttft + 0.01
        return {"ttft": ttft, "latency": self.now - start, "text": "xy",
                "usage": {"prompt_tokens": len(toks), "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": cached}},
                "chunks": 3}


def _probe(engine, **kwargs):
    kwargs.setdefault("nonce", "n0nce")
    return pc.PrefixCacheProbe(engine, "/metrics", **kwargs)


def test_probe_measures_a_hit():
    engine = FakeEngine()
    result = _probe(engine, prefix_tokens=100).run()
    assert result["engine"] == "vllm" and result["model"] == "tiny"
    assert result["block_size"] == 32 and result["block_size_source"] == "metrics"
    # 100 filler words, the BOS token and the nonce; each prompt adds six words and a block of its own (32 words) after
    # the shared part, so the warm request fills a block past the shared prefix's full blocks, one the cold did not
    assert result["prefix_tokens"] == 102 and not result["prefix_tokens_estimated"]
    assert result["cold"]["hit_tokens"] == 0 and result["cold"]["cached_tokens"] == 0
    assert result["cold"]["prompt_tokens"] == result["warm"]["prompt_tokens"] == 140
    assert result["warm"]["prompt_tokens"] // 32 > 102 // 32
    assert result["expected_hit_tokens"] == 96 and result["hit_tokens"] == 96 and result["cached_tokens"] == 96
    assert result["query_tokens"] == 280
    assert result["ttft_ratio"] == 4.0
    assert pc.evaluate(result, expect_warm_faster=True) == []
    # the nonce opens both prompts, and the prompts differ after the shared part
    cold, warm = (r["prompt"] for r in engine.requests)
    assert cold.startswith("[n0nce] ") and warm.startswith("[n0nce] ") and cold != warm


def test_probe_sends_its_requests_through_around():
    """``around`` gets the cold request, then the warm one, each sent only when it calls it."""
    engine, seen = FakeEngine(), []

    def around(name, send):
        before = len(engine.requests)
        answer = send()
        seen.append((name, len(engine.requests) - before, answer["cached_tokens"]))
        return answer

    result = _probe(engine, prefix_tokens=100, around=around).run()
    assert seen == [("cold", 1, 0), ("warm", 1, 96)]
    assert result["cached_tokens"] == 96


def test_probe_without_a_cache_reports_no_hit():
    result = _probe(FakeEngine(hit=False), prefix_tokens=100).run()
    assert result["hit_tokens"] == 0
    assert "hit no cached tokens" in pc.evaluate(result)[0]


def test_probe_with_a_given_prefix_and_block_size():
    result = _probe(FakeEngine(block_size=16), prefix=" ".join(["w"] * 40), block_size=16).run()
    assert result["block_size_source"] == "option"
    assert result["prefix_tokens"] == 42  # BOS + nonce + 40 words
    assert result["hit_tokens"] == 32


def test_probe_refuses_a_prefix_shorter_than_a_block():
    engine = FakeEngine()
    with pytest.raises(pc.PrefixCacheError, match="prefix_tokens=16 is shorter than one block"):
        _probe(engine, prefix_tokens=16).run()
    with pytest.raises(pc.PrefixCacheError, match="shared prefix is 5 tokens long"):
        _probe(engine, prefix="a b c").run()
    assert engine.requests == []


def test_probe_estimates_without_tokenize_and_says_so():
    probe = _probe(FakeEngine(tokenize=False), prefix_tokens=128)
    result = probe.run()
    assert result["prefix_tokens_estimated"] is True
    assert any("no /tokenize endpoint" in w for w in result["warnings"])


@pytest.mark.parametrize("engine, message", [
    (FakeEngine(reachable=False), "Cannot reach http://engine/v1/models"),
    (FakeEngine(metrics_status=404), "The metrics endpoint /metrics is missing (HTTP 404)."),
    (FakeEngine(page="none"), "exposes no prefix-cache counter"),
])
def test_probe_failures_are_one_sentence(engine, message):
    with pytest.raises(pc.PrefixCacheError) as info:
        _probe(engine).run()
    assert message in str(info.value)
    assert str(info.value).count(". ") == 0 and str(info.value).endswith(".")


def test_probe_uses_default_block_size_with_a_warning():
    engine = FakeEngine(block_size=16)
    engine.get_text = lambda path, orig=engine.get_text: "\n".join(
        line for line in orig(path).splitlines() if "cache_config_info" not in line) + "\n"
    result = _probe(engine, model="tiny", prefix_tokens=64).run()
    assert result["block_size"] == 16 and result["block_size_source"] == "default"
    assert any("block size is unknown" in w for w in result["warnings"])


def test_make_nonce_is_unique_and_seedable():
    import random
    assert pc.make_nonce() != pc.make_nonce()
    assert pc.make_nonce(random.Random(1)) == pc.make_nonce(random.Random(1))


def test_probe_without_a_listed_model():
    class ListsNoModel(FakeEngine):
        def get_json(self, path):
            return {"data": [{"object": "model"}]} if path == "/v1/models" else FakeEngine.get_json(self, path)

    engine = ListsNoModel()
    with pytest.raises(pc.PrefixCacheError, match=r"^The server lists no model at /v1/models; set the model option\.$"):
        pc.PrefixCacheProbe(engine, "http://engine/metrics").run()
