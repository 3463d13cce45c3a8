# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""lmcache_check's core: the arithmetic, the metrics it reads, and the probe against a fake engine with LMCache beside it."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import time

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.http.openai import OpenAIClient
from ansible_collections.inference_cache.substrate.plugins.module_utils.lmcache import check as lc
from ansible_collections.inference_cache.substrate.tests.unit.plugins.lmcache_fake import FakeStack
from ansible_collections.inference_cache.substrate.tests.unit.plugins.net_utils import free_port
from ansible_collections.inference_cache.substrate.tests.unit.plugins.sentences import assert_one_sentence


# -- pure functions -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("prompt, chunk, expected", [
    (614, 64, 576),   # REFERENCE M1: 601 -> 576, and what the local engine showed for 614
    (600, 64, 576),
    (640, 64, 576),   # exactly ten chunks: vLLM computes the last token itself, so nine come back
    (641, 64, 640),
    (64, 64, 0),
    (65, 64, 64),
    (0, 64, 0),
    (100, 0, 0),
])
def test_expected_hit_tokens(prompt, chunk, expected):
    assert lc.expected_hit_tokens(prompt, chunk) == expected


def test_max_logprob_difference():
    assert lc.max_logprob_difference([-1.0, -2.0], [-1.0, -2.5]) == 0.5
    assert lc.max_logprob_difference([-1.0], [-1.0]) == 0.0
    assert lc.max_logprob_difference([], [-1.0]) is None
    assert lc.max_logprob_difference([-1.0], [-1.0, -2.0]) is None


def test_cache_info_and_connector_kind():
    stack = FakeStack()
    page = stack.engine_page()
    assert lc.cache_info(page) == {"num_gpu_blocks": 256, "block_size": 32}
    assert lc.connector_kind(page) == "multiprocess"
    stack.connector = "in-process"
    assert lc.connector_kind(stack.engine_page()) == "in-process"
    stack.connector = None
    assert lc.connector_kind(stack.engine_page()) == "unknown"
    assert lc.cache_info("no such metric\n") == {}


# -- the probe against the fake stack --------------------------------------------------------------------------------
@pytest.fixture
def stack():
    fake = FakeStack().start()
    yield fake
    fake.stop()


def probe(stack, lmcache=True, lmcache_timeout=10, **kwargs):
    client = OpenAIClient(stack.engine.url, timeout=10)
    server = OpenAIClient(stack.lmcache.url if lmcache is True else lmcache, timeout=lmcache_timeout) if lmcache else None
    kwargs.setdefault("settle", 0.3)
    kwargs.setdefault("prefix_tokens", 300)
    return lc.LMCacheProbe(client, server, stack.engine.url + "/metrics", model="tiny", **kwargs)


def failure(stack, **kwargs):
    with pytest.raises(lc.LMCacheCheckError) as info:
        probe(stack, **kwargs).run()
    return assert_one_sentence(info.value.msg), info.value.facts


def test_a_working_tier_gives_the_prompt_back(stack):
    result = probe(stack, chunk_size=64, hash_algorithm="blake3").run()
    assert result["connector"] == "multiprocess" and result["miss_method"] == "reset"
    expected = lc.expected_hit_tokens(result["prompt_tokens"], 64)
    assert result["prompt_tokens"] >= 300 and expected >= 256
    assert result["external_hit_tokens"] == result["expected_hit_tokens"] == expected == result["lmcache_hit_tokens"]
    assert result["stored_tokens"] == result["prompt_tokens"] // 64 * 64
    assert result["device_hit_tokens"] == 0 and result["hit_tokens"] == expected
    assert result["same_text"] is True and result["logprob_max_difference"] == 0.0 and result["compared_tokens"] == 2
    assert result["lmcache_server"] == {"chunk_size": 64, "hash_algorithm": "blake3", "kv_event_log_size": 0}
    # The engine registered with the server, and the model name that keys its chunks there.
    assert result["lmcache_registered"] == [7] and result["lmcache_model_names"] == ["/m"] and "degraded" not in result
    # Where the time went, phase by phase.
    assert sorted(result["seconds"]) == ["cold", "miss", "preflight", "restored", "stored"]
    assert all(value >= 0 for value in result["seconds"].values())
    assert "events" not in result and result["warnings"] == []
    # The cold request missed everything; the restored one came from LMCache, not from the engine's own cache.
    assert [(c["device"], c["external"]) for c in stack.completions] == [(0, 0), (0, expected)]


def test_the_server_s_chunk_size_is_taken_when_none_is_given(stack):
    stack.chunk_size = 128
    result = probe(stack).run()
    assert result["chunk_size"] == 128 and result["external_hit_tokens"] == lc.expected_hit_tokens(result["prompt_tokens"], 128)


def test_without_the_reset_endpoint_a_flood_evicts_the_prompt(stack):
    stack.no_reset()
    result = probe(stack).run()
    assert result["miss_method"] == "evict" and 1 <= result["flood_prompts"] <= 32
    assert result["external_hit_tokens"] == result["expected_hit_tokens"] > 0 and result["device_hit_tokens"] == 0


def test_miss_reset_without_the_endpoint_is_named(stack):
    stack.no_reset()
    message, dummy = failure(stack, miss="reset")
    assert "does not serve POST /reset_prefix_cache" in message and "VLLM_SERVER_DEV_MODE=1" in message


def test_a_stopped_lmcache_server_is_a_degraded_tier_named_before_any_request(stack):
    stack.stop_lmcache()
    message, facts = failure(stack)
    assert message.startswith("The LMCache tier is degraded: the LMCache server at %s does not answer (Cannot reach %s/config: "
                              % (stack.lmcache.url, stack.lmcache.url))
    assert "Connection refused: stopped, paused or overloaded; make site starts a stopped one" in message
    assert message.endswith("neither stores nor retrieves and vLLM recomputes every prompt until it is over.")
    assert facts["connector"] == "multiprocess" and facts["degraded"] is True and stack.completions == []


def test_a_paused_lmcache_server_is_a_degraded_tier(stack):
    """SIGSTOP: the server's socket accepts, nothing answers; the check says so within its own bound, not the engine's."""
    stack.lmcache.routes["/config"] = (200, "application/json", lambda body: time.sleep(2) or b"{}")
    message, facts = failure(stack, lmcache_timeout=0.5)
    assert message.startswith("The LMCache tier is degraded: the LMCache server at %s does not answer (" % stack.lmcache.url)
    assert "timed out" in message and facts["degraded"] is True and stack.completions == []


def test_a_server_with_no_engine_registered_is_a_degraded_tier(stack):
    """A server started again under a running engine answers, but the connector has not re-registered yet."""
    stack.registered = False
    message, facts = failure(stack)
    assert message.startswith("The LMCache tier is degraded: the LMCache server at %s answers but no engine is registered with "
                              "it (a server started again under the running engine: its connector registers again only after "
                              "a heartbeat, every 10 s, found the server away" % stack.lmcache.url)
    assert facts["degraded"] is True and facts["lmcache_registered"] == [] and stack.completions == []


def test_no_kv_connector_at_all_is_named(stack):
    """vLLM exports the external counters without a connector too; only a connector makes the queries move."""
    stack.connector = None
    message, facts = failure(stack)
    assert message == ("The engine has no KV connector: vllm:external_prefix_cache_queries_total did not move over the cold "
                       "request's %d prompt tokens (vLLM counts them only through a connector); start vLLM with "
                       "--kv-transfer-config naming LMCacheMPConnector and the LMCache server's port." % facts["prompt_tokens"])
    assert facts["connector"] == "none" and len(stack.completions) == 1


def test_the_in_process_connector_named_by_server_info_is_told_apart_from_none(stack):
    """The issue's two causes: in-process LMCacheConnectorV1 (no metrics of its own on the page) and no connector at all."""
    stack.connector = "other"
    stack.kv_connector = "LMCacheConnectorV1"
    stack.stop_lmcache()
    in_process, facts = failure(stack)
    assert "vLLM runs LMCache's in-process connector (LMCacheConnectorV1, by its /server_info), which on a CPU engine falls " \
           "back to recompute" in in_process
    assert facts["connector"] == "in-process" and facts["kv_connector"] == "LMCacheConnectorV1"
    none = FakeStack(connector=None).start()
    try:
        no_connector, dummy = failure(none)
    finally:
        none.stop()
    assert no_connector.startswith("The engine has no KV connector") and in_process != no_connector


def test_another_connector_is_named(stack):
    stack.connector = "other"
    stack.kv_connector = "NixlConnector"
    message, facts = failure(stack)
    assert "the engine's KV connector is NixlConnector (its /server_info), not LMCache's" in message
    assert facts["kv_connector"] == "NixlConnector"


def test_the_in_process_connector_falling_back_to_recompute_is_named(stack):
    stack.connector = "in-process"
    stack.stop_lmcache()
    message, facts = failure(stack)
    assert "vLLM runs LMCache's in-process connector (LMCacheConnectorV1" in message
    assert "falls back to recompute" in message and "run LMCache in multiprocess mode" in message
    assert facts["external_hit_tokens"] == 0 and facts["connector"] == "in-process"


def test_an_engine_without_external_counters_has_no_connector(stack):
    stack.external_counters = False
    message, dummy = failure(stack)
    assert "exposes no vllm:external_prefix_cache_hits_total counter: no KV connector is configured" in message


def test_an_unknown_connector_without_a_server(stack):
    stack.connector = "other"
    message, dummy = failure(stack, lmcache="http://127.0.0.1:%d" % free_port())
    assert "the engine's connector is not LMCache's multiprocess one" in message and "no LMCache server answers" in message


def test_a_chunk_size_mismatch_is_named(stack):
    message, dummy = failure(stack, chunk_size=256)
    assert message.startswith("The LMCache server stores chunks of 64 tokens, not the 256 expected") and "chunk-size mismatch" in message


def test_a_hash_algorithm_mismatch_is_named(stack):
    message, dummy = failure(stack, hash_algorithm="sha256_cbor")
    assert message.startswith("The LMCache server hashes chunks with blake3, not sha256_cbor") and "hash-algorithm mismatch" in message


def test_chunks_stored_and_never_found_again(stack):
    stack.lookup_works = False
    message, facts = failure(stack)
    assert "holds the %d tokens the cold request stored but its lookup found none" % facts["stored_tokens"] in message
    assert "hash-algorithm or hash-seed mismatch" in message


def test_fewer_tokens_than_the_full_chunks(stack):
    stack.short_chunks = 1
    message, facts = failure(stack)
    assert "got %d tokens from LMCache" % (facts["expected_hit_tokens"] - 64) in message and "not the %d" % facts["expected_hit_tokens"] in message


def test_an_engine_cache_that_did_not_miss(stack):
    stack.reset_clears = False
    message, facts = failure(stack)
    assert "because the engine's own prefix cache still held it" in message and "the reset did not make it miss" in message
    assert facts["device_hit_tokens"] > 0


def test_a_different_answer_from_the_restored_kv(stack):
    stack.restored_text = " other words"
    message, dummy = failure(stack)
    assert "greedy completion differs from the cold one" in message


def test_log_probabilities_beyond_the_tolerance(stack):
    stack.logprob_drift = 0.01
    message, dummy = failure(stack)
    assert "log-probabilities differ from the cold one's by up to 0.01 (tolerance 0.0001)" in message
    assert probe(stack, logprob_tolerance=0.05).run()["logprob_max_difference"] == pytest.approx(0.01)


def test_a_prompt_of_one_chunk_is_refused(stack):
    message, dummy = failure(stack, prefix_tokens=20)
    assert "not more than one LMCache chunk (64 tokens)" in message


def test_without_a_server_the_engine_counters_decide(stack):
    result = probe(stack, lmcache=None, chunk_size=64).run()
    assert result["external_hit_tokens"] == result["expected_hit_tokens"] > 0
    assert result["lmcache_hit_tokens"] is None and result["stored_tokens"] is None


def test_stream_logprobs_reads_the_sampled_tokens_only():
    from ansible_collections.inference_cache.substrate.plugins.module_utils.http.openai import stream_logprobs  # pylint: disable=import-outside-toplevel
    assert stream_logprobs({"choices": [{"text": "a", "logprobs": {"token_logprobs": [-0.5, None, True, -1]}}]}) == [-0.5, -1.0]
    assert stream_logprobs({"choices": [{"text": "a"}], "usage": {}}) == [] and stream_logprobs({"choices": []}) == []
    assert stream_logprobs({"choices": [{"logprobs": "x"}]}) == [] and stream_logprobs([]) == []
