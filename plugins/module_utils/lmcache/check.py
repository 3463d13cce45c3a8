# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""Does the LMCache tier work? Store a prompt, lose it from vLLM's own cache, get it back from LMCache (pure Python).

``LMCacheProbe`` (behind ``lmcache_check``) drives a vLLM engine that reaches an LMCache server through its connector:

1. reads the engine's metrics (``vllm:external_prefix_cache_{hits,queries}_total``, the counters of any KV connector;
   ``vllm:lmcache_mp_*``, those of LMCache's multiprocess connector; ``lmcache:*``, LMCache's in-process connector when
   its metrics reach the page) and the LMCache server's ``/config`` (chunk size, hash algorithm) and ``/metrics``
   (``lmcache_mp_l1_write_chunks_total``, ``lmcache_mp_lookup_hit_tokens_total``; names read from the running
   lmcache 0.5.6 server);
2. sends a cold greedy completion (temperature 0, logprobs) of a unique prompt of ``prefix_tokens`` tokens and waits
   until LMCache has written its full chunks;
3. makes the engine's own prefix cache lose it: ``POST /reset_prefix_cache`` (vLLM's development endpoints,
   ``VLLM_SERVER_DEV_MODE=1``; LMCache keeps its chunks), or, where the engine does not serve it, a bounded flood of
   other prompts that fills its KV cache;
4. sends the same completion again and holds: vLLM's external hits equal LMCache's lookup hits and the hit a working
   LMCache tier gives (the prompt's full chunks: only full chunks are stored, and vLLM computes the last prompt token
   itself), the engine's own cache hit nothing, and the text and the log-probabilities equal the cold ones.

When it fails, one sentence names the cause where the facts show it, one cause per sentence:

* no KV connector at all: vLLM exports the external counters whether or not a connector is configured
  (vllm/v1/metrics/loggers.py at 0.32.0), but counts external queries only through one (vllm/v1/core/sched/scheduler.py:
  ``connector_prefix_cache_stats`` exists only with a ``kv_transfer_config``), so the cold request's queries not moving
  the counter says there is none;
* vLLM's in-process ``LMCacheConnectorV1`` (named by the engine's ``/server_info``, a development endpoint, or by
  LMCache's ``lmcache:*`` metrics on its page), which on a CPU engine falls back to recompute in LMCache 0.5.6;
* another connector than LMCache's;
* the tier degraded: the multiprocess connector with its LMCache server away (not answering: stopped, paused,
  overloaded), or answering with no engine registered (a server started again under a running engine: the connector
  registers again only when a heartbeat found the server away first, lmcache@0.5.6
  integration/vllm/vllm_multi_process_adapter.py ``HeartbeatThread`` and ``_reregister_kv_caches_callback``, so a
  restart within one heartbeat leaves it unregistered, and a CPU engine's stores then wait on the server). While it
  lasts vLLM recomputes every prompt, or hangs;
* a chunk size or hash algorithm other than the one expected, chunks stored but never found again.

The LMCache server's ``/status`` names the engines registered with it and the model name each registered with, which
keys its chunks (lmcache@0.5.6 ``ObjectKey.model_name``): reported as ``lmcache_model_names``.

With a ``tiers.TierWatch`` it also reports what the engine's KV events announced of each tier and what an index built
from them predicted for the restored prompt: the reuse a precise router could not see.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import math
import re
import time
import uuid

from ..common.errors import CheckError
from ..http.openai import OpenAIClient, OpenAIHTTPError, cached_tokens, check_usage, model_ids
from ..http.prefix_cache import filler, parse_metrics
from ..kv.args import ENDPOINT_SHAPE, URL_SHAPE
from .tiers import TierWatch

# vLLM (vllm/v1/metrics/loggers.py at 0.32.0): the counters of any KV connector, and the engine's own prefix cache.
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
EXTERNAL_QUERIES = "vllm:external_prefix_cache_queries_total"
DEVICE_HITS = "vllm:prefix_cache_hits_total"
DEVICE_QUERIES = "vllm:prefix_cache_queries_total"
CACHE_INFO = "vllm:cache_config_info"
# LMCache's multiprocess connector registers vllm:lmcache_mp_* on the engine's page (lmcache@0.5.6
# integration/vllm/vllm_multi_process_adapter.py); the in-process one (LMCacheConnectorV1) its lmcache:* metrics.
MP_CONNECTOR_PREFIX = "vllm:lmcache_mp_"
IN_PROCESS_PREFIX = "lmcache:"
# The LMCache server's own metrics (its HTTP port's /metrics, lmcache@0.5.6 mp_observability).
L1_WRITE_CHUNKS = "lmcache_mp_l1_write_chunks_total"
LOOKUP_HIT_TOKENS = "lmcache_mp_lookup_hit_tokens_total"
LOOKUP_REQUESTED_TOKENS = "lmcache_mp_lookup_requested_tokens_total"
TOKENS_PER_WORD_GUESS = 1.2
# What the LMCache server's /status lists of the engines registered with it: engine-driven transfer (a CPU engine) and
# LMCache-driven transfer (CUDA), each with per-instance metadata holding the model name its chunks are keyed by
# (lmcache@0.5.6 v1/multiprocess/modules/engine_driven_transfer.py and lmcache_driven_transfer.py report_status).
REGISTERED_KEYS = (("registered_non_cuda_instance_ids", "non_cuda_context_meta"), ("registered_gpu_ids", "cache_context_meta"))
# vLLM's connector names (vllm/distributed/kv_transfer/kv_connector/factory.py at 0.32.0).
MP_CONNECTOR = "LMCacheMPConnector"
IN_PROCESS_CONNECTORS = ("LMCacheConnectorV1", "LMCacheConnectorV1Dynamic")
# How often LMCacheMPConnector pings its server and re-registers with one that came back (lmcache.mp.heartbeat_interval).
HEARTBEAT_SECONDS = 10
# Seconds each request to the LMCache server may take: its pages answer at once, so a server that does not (paused,
# SIGSTOP) is named as a degraded tier instead of being waited for as long as the engine's requests are.
LMCACHE_TIMEOUT = 10.0
# The tier check's own options (common/options.py tables): lmcache_check's, and prefix_cache_check's O(lmcache) suboptions.
TIER_OPTIONS = dict(
    lmcache_url=dict(type="str", shape=(URL_SHAPE[0], "an http:// or https:// URL of the LMCache server's HTTP API")),
    prefix_tokens=dict(type="int", default=600, no_log=False, range=(2, 131072)),
    max_tokens=dict(type="int", default=8, no_log=False, range=(1, 256)),
    miss=dict(type="str", default="auto", choices=["auto", "reset", "evict"]),
    flood_prompts=dict(type="int", default=32, range=(1, 1024)),
    chunk_size=dict(type="int", range=(1, 1048576)),
    hash_algorithm=dict(type="str"),
    logprob_tolerance=dict(type="float", default=0.0001, range=(0, None)),
    settle=dict(type="float", default=5.0, range=(0, 300, "open-low")),
)
# Where the engine's KV events are watched during the check (lmcache_check's O(kv_events)).
EVENTS_OPTIONS = {
    "endpoint": {"type": "str", "required": True, "shape": ENDPOINT_SHAPE},
    "socket_mode": {"type": "str", "default": "connect", "choices": ["connect", "bind"]},
    "topic": {"type": "str", "default": ""},
    "connect_timeout": {"type": "float", "default": 5.0, "range": (0, 60, "open-low")},
}
_CACHE_INFO = re.compile(r"^vllm:cache_config_info\{([^}]*)\}", re.M)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


class LMCacheCheckError(CheckError):
    """The LMCache tier does not work, or cannot be checked: one sentence, and the facts gathered so far."""


def full_chunks(tokens, chunk_size):
    return (tokens // chunk_size) * chunk_size if chunk_size > 0 else 0


def expected_hit_tokens(prompt_tokens, chunk_size):
    """The tokens a working LMCache tier gives back for a prompt it stored: its full chunks, short of the last token.

    LMCache stores only full chunks; vLLM computes the last prompt token itself, so a prompt of exactly N chunks gets
    N - 1 of them back (the connector counts whole chunks).
    """
    if prompt_tokens <= 0 or chunk_size <= 0:
        return 0
    return full_chunks(prompt_tokens - 1, chunk_size)


def _delta(before, after, name):
    change = after["samples"].get(name, 0.0) - before["samples"].get(name, 0.0)
    if math.isnan(change) or math.isinf(change):
        raise LMCacheCheckError("The counter %s is not a finite number on its metrics page." % name)
    return int(round(change))


def cache_info(text):
    """``num_gpu_blocks`` and ``block_size`` from the labels of ``vllm:cache_config_info`` (those that are numbers)."""
    match = _CACHE_INFO.search(text)
    labels = dict(_LABEL.findall(match.group(1))) if match else {}
    return dict((k, int(labels[k])) for k in ("num_gpu_blocks", "block_size") if labels.get(k, "").isdigit())


def connector_kind(text):
    """Which LMCache connector the engine's metrics page shows: ``multiprocess``, ``in-process`` or ``unknown``."""
    if re.search(r"^%s" % re.escape(MP_CONNECTOR_PREFIX), text, re.M):
        return "multiprocess"
    if re.search(r"^%s" % re.escape(IN_PROCESS_PREFIX), text, re.M):
        return "in-process"
    return "unknown"


def registered_instances(status):
    """``(instance ids, model names)`` of the engines registered with an LMCache server, from its ``/status``; None when
    the page lists neither kind of registration (a server that does not report them)."""
    if not isinstance(status, dict) or not any(ids in status for ids, _meta in REGISTERED_KEYS):
        return None
    instances, names = [], []
    for ids, meta in REGISTERED_KEYS:
        listed = status.get(ids)
        instances += [i for i in listed if isinstance(i, (int, str))] if isinstance(listed, list) else []
        details = status.get(meta)
        for entry in (details.values() if isinstance(details, dict) else []):
            name = entry.get("model_name") if isinstance(entry, dict) else None
            if isinstance(name, str) and name not in names:
                names.append(name)
    return instances, names


def max_logprob_difference(first, second):
    """Largest absolute difference of two lists of log-probabilities (None when their lengths differ or one is empty)."""
    if not first or not second or len(first) != len(second):
        return None
    return max(abs(a - b) for a, b in zip(first, second))


class LMCacheProbe:
    """Store a prompt, make the engine's own prefix cache miss it, send it again: what came back from LMCache.

    ``client`` talks to the engine, ``lmcache`` to the LMCache server's HTTP API (``http.openai.OpenAIClient``: ``get_text``,
    ``get_json``, ``post_json``, ``stream_completion``); ``lmcache`` may be None (no server to ask: the check then relies on
    the engine's counters alone). ``watch``: a ``tiers.TierWatch`` on the engine's KV events, or None.
    """

    def __init__(self, client, lmcache, metrics_url, model=None, prefix_tokens=600, max_tokens=8, miss="auto",
                 flood_prompts=32, chunk_size=None, hash_algorithm=None, logprob_tolerance=1e-4, settle=5.0, watch=None,
                 nonce=None, sleep=None, clock=None):
        self.client = client
        self.lmcache = lmcache
        self.metrics_url = metrics_url
        self.model = model
        self.prefix_tokens = prefix_tokens
        self.max_tokens = max_tokens
        self.miss = miss
        self.flood_prompts = flood_prompts
        self.chunk_size = chunk_size
        self.hash_algorithm = hash_algorithm
        self.logprob_tolerance = logprob_tolerance
        self.settle = settle
        self.watch = watch
        self.nonce = nonce or uuid.uuid4().hex
        self.sleep = sleep or time.sleep
        self.clock = clock or client.clock
        self.facts = {}
        self.warnings = []

    # -- the two servers ----------------------------------------------------------------------
    def fail(self, sentence):
        raise LMCacheCheckError(sentence, dict(self.facts, warnings=list(self.warnings)))

    def engine_metrics(self):
        try:
            text = self.client.get_text(self.metrics_url)
            page = parse_metrics(text, self.model)
        except OpenAIHTTPError as exc:
            self.fail("The engine's metrics cannot be read: %s." % str(exc).rstrip("."))
        except CheckError as exc:
            self.fail(exc.msg)
        page["cache_info"] = cache_info(text)
        page["connector"] = connector_kind(text)
        return page

    def lmcache_metrics(self):
        if self.lmcache is None or not self.facts.get("lmcache_reachable"):
            return {"samples": {}, "block_size": None}
        try:
            return parse_metrics(self.lmcache.get_text("/metrics"))
        except OpenAIHTTPError as exc:
            self.fail("The LMCache server at %s stopped answering during the check (%s): was it stopped?"
                      % (self.lmcache.base_url, str(exc).rstrip(".")))
        except CheckError as exc:
            self.fail(exc.msg)
        return None

    def read_lmcache_config(self):
        """The server's chunk size and hash algorithm from ``/config`` (``mp``); records whether it answered."""
        self.facts["lmcache_reachable"] = False
        if self.lmcache is None:
            return None
        try:
            config = self.lmcache.get_json("/config")
        except OpenAIHTTPError as exc:
            self.facts["lmcache_error"] = str(exc)
            return None
        self.facts["lmcache_reachable"] = True
        mp = config.get("mp") if isinstance(config, dict) else None
        if not isinstance(mp, dict):
            self.fail("%s/config is not the configuration of an LMCache server in multiprocess mode (no 'mp' section)."
                      % self.lmcache.base_url)
        server = {"chunk_size": mp.get("chunk_size"), "hash_algorithm": mp.get("hash_algorithm"),
                  "kv_event_log_size": mp.get("kv_event_log_size")}
        self.facts["lmcache_server"] = server
        return server

    def read_lmcache_registrations(self):
        """The engines registered with the server (``/status``): their instance ids, or None where it does not say; the
        model names their chunks are keyed by go to ``lmcache_model_names``."""
        if self.lmcache is None or not self.facts.get("lmcache_reachable"):
            return None
        try:
            found = registered_instances(self.lmcache.get_json("/status"))
        except OpenAIHTTPError:
            return None
        if found is None:
            return None
        self.facts["lmcache_registered"], self.facts["lmcache_model_names"] = found
        return found[0]

    def degraded(self, why):
        """The multiprocess connector's tier is degraded: fail with one sentence saying why and what happens meanwhile."""
        self.facts["degraded"] = True
        self.fail("The LMCache tier is degraded: %s, so the engine's LMCacheMPConnector neither stores nor retrieves and vLLM "
                  "recomputes every prompt until it is over." % why)

    def engine_connector(self):
        """The engine's KV connector by name from its ``/server_info`` (vLLM's development endpoints): the name, "" for
        none, None where the engine does not say."""
        try:
            info = self.client.get_json("/server_info?config_format=json")
        except OpenAIHTTPError:
            return None
        config = info.get("vllm_config") if isinstance(info, dict) else None
        if not isinstance(config, dict) or "kv_transfer_config" not in config:
            return None
        transfer = config.get("kv_transfer_config")
        name = transfer.get("kv_connector") if isinstance(transfer, dict) else None
        return name if isinstance(name, str) else ""

    def resolve_model(self):
        if self.model:
            return self.model
        try:
            models = model_ids(self.client.get_json("/v1/models"))
        except OpenAIHTTPError as exc:
            self.fail("%s." % str(exc).rstrip("."))
        if not models:
            self.fail("The engine lists no model at /v1/models; set the model option.")
        self.model = models[0]
        return self.model

    def tokenize(self, text):
        try:
            answer = self.client.post_json("/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": True})
        except OpenAIHTTPError as exc:
            self.fail("The engine cannot tokenize the prompt (%s); the check needs vLLM's /tokenize." % str(exc).rstrip("."))
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            self.fail("The engine's /tokenize answered no list of token ids.")
        return tokens

    def build_prompt(self, nonce, tokens_wanted):
        """A prompt of about ``tokens_wanted`` tokens starting with ``nonce``, and its token ids."""
        head = "[%s] " % nonce
        words = max(8, int(tokens_wanted / TOKENS_PER_WORD_GUESS))
        for dummy in range(6):
            text = head + filler(words, seed=7)
            tokens = self.tokenize(text)
            if len(tokens) >= tokens_wanted:
                return text, tokens
            words = int(words * float(tokens_wanted) / max(len(tokens), 1)) + 4
        return text, tokens

    # -- requests -------------------------------------------------------------------------------
    def complete(self, prompt, what):
        body = {"model": self.model, "prompt": prompt, "max_tokens": self.max_tokens, "temperature": 0, "logprobs": 1}
        try:
            answer = self.client.stream_completion(body)
            usage = check_usage(answer.get("usage") or {})
        except OpenAIHTTPError as exc:
            self.fail("The %s request failed: %s." % (what, str(exc).rstrip(".")))
        return {"ttft": round(answer["ttft"], 4), "latency": round(answer["latency"], 4), "text": answer["text"],
                "logprobs": answer.get("logprobs") or [], "prompt_tokens": usage.get("prompt_tokens"),
                "cached_tokens": cached_tokens(usage)}

    def after(self, before, prompt_tokens):
        """The engine's metrics once the request shows in its query counter (bounded by ``settle``)."""
        deadline = self.clock() + self.settle
        while True:
            page = self.engine_metrics()
            if prompt_tokens is None or _delta(before, page, DEVICE_QUERIES) >= prompt_tokens or self.clock() >= deadline:
                return page
            self.sleep(0.05)

    def wait_stored(self, before, chunks):
        """LMCache's metrics once it wrote ``chunks`` chunks more (or ``settle`` passed)."""
        deadline = self.clock() + self.settle
        while True:
            page = self.lmcache_metrics()
            if _delta(before, page, L1_WRITE_CHUNKS) >= chunks or self.clock() >= deadline:
                return page
            self.sleep(0.05)

    # -- making the engine's own cache miss ---------------------------------------------------
    def reset(self):
        """``POST /reset_prefix_cache``: True when done, False when the engine does not serve it (404, 405)."""
        for dummy in range(20):
            try:
                answer = self.client.post_json("/reset_prefix_cache", {})
            except OpenAIHTTPError as exc:
                if exc.status in (404, 405):
                    return False
                self.fail("Resetting the engine's prefix cache failed: %s." % str(exc).rstrip("."))
            if not isinstance(answer, dict) or answer.get("success") is not False:
                return True
            self.sleep(0.1)   # blocks still held by a running request
        self.fail("The engine refused to reset its prefix cache 20 times (blocks held by running requests?).")
        return False

    def flood(self, page):
        """Fill the engine's KV cache with other prompts until the stored one is evicted (at most ``flood_prompts``)."""
        info = self.cache_info(page)
        capacity = info.get("num_gpu_blocks", 0) * info.get("block_size", 0)
        length = max(64, min(self.facts.get("max_model_len") or 2048, 4096) - self.max_tokens - 16)
        count = self.flood_prompts if not capacity else min(self.flood_prompts, int(capacity * 1.25 // length) + 2)
        for index in range(count):
            text = "[%s-flood-%d] " % (self.nonce, index) + filler(int(length / TOKENS_PER_WORD_GUESS * 0.9), seed=index + 1)
            body = {"model": self.model, "prompt": text, "max_tokens": 1, "temperature": 0}
            try:
                self.client.post_json("/v1/completions", body)
            except OpenAIHTTPError as exc:
                self.fail("A request of the eviction flood failed: %s." % str(exc).rstrip("."))
        return count

    @staticmethod
    def cache_info(page):
        return page.get("cache_info") or {}

    def learn_engine(self):
        try:
            listing = self.client.get_json("/v1/models")
        except OpenAIHTTPError:
            return
        for entry in (listing.get("data") or []) if isinstance(listing, dict) else []:
            if isinstance(entry, dict) and entry.get("id") == self.model and isinstance(entry.get("max_model_len"), int):
                self.facts["max_model_len"] = entry["max_model_len"]

    # -- the check --------------------------------------------------------------------------------
    def preflight(self):
        """What the check knows before its first request: the model, the server's settings, the engine's metrics and its
        connector; fails on an engine without external counters and on a degraded tier. ``(server settings or None,
        engine metrics)``. It sends no completion, so it can be asked at any time, under traffic (the fault benchmark)."""
        self.resolve_model()
        self.facts["model"] = self.model
        server = self.read_lmcache_config()
        m0 = self.engine_metrics()
        connector = self.facts["connector"] = m0["connector"]
        if EXTERNAL_HITS not in m0["samples"] or EXTERNAL_QUERIES not in m0["samples"]:
            self.fail("The engine exposes no %s counter: no KV connector is configured (start vLLM with --kv-transfer-config "
                      "naming LMCacheMPConnector and the LMCache server's port)." % EXTERNAL_HITS)
        if connector == "multiprocess" and self.lmcache is not None:
            if server is None:
                self.degraded("the LMCache server at %s does not answer (%s: stopped, paused or overloaded; make site starts a "
                              "stopped one, which the connector finds again within its %d s heartbeat)"
                              % (self.lmcache.base_url, self.facts.get("lmcache_error", "no answer").rstrip("."), HEARTBEAT_SECONDS))
            if self.read_lmcache_registrations() == []:
                self.degraded("the LMCache server at %s answers but no engine is registered with it (a server started again "
                              "under the running engine: its connector registers again only after a heartbeat, every %d s, found "
                              "the server away, so after a quicker restart a CPU engine's stores wait on the server and requests "
                              "hang; make site restarts an engine that stays unregistered)" % (self.lmcache.base_url, HEARTBEAT_SECONDS))
        elif server is not None:
            self.read_lmcache_registrations()
        return server, m0

    def lap(self, name):
        """Seconds since the previous lap, recorded as ``seconds[name]`` (where the check spends its time)."""
        now = self.clock()
        self.facts.setdefault("seconds", {})[name] = round(now - self._lap, 3)
        self._lap = now

    def run(self):
        self._lap = self.clock()
        server, m0 = self.preflight()
        chunk_size = self.check_server(server)
        self.learn_engine()
        nonce = self.nonce
        prompt, token_ids = self.build_prompt(nonce, self.prefix_tokens)
        prompt_tokens = len(token_ids)
        self.facts.update(prompt_tokens=prompt_tokens, chunk_size=chunk_size, nonce=nonce)
        if chunk_size and prompt_tokens < chunk_size + 1:
            self.fail("The prompt has %d tokens, not more than one LMCache chunk (%d tokens), and only full chunks are "
                      "stored: raise prefix_tokens." % (prompt_tokens, chunk_size))
        self.lap("preflight")
        if self.watch is not None:
            self.watch.start()
            self.lap("events_connected")
        try:
            return self.cycle(prompt, token_ids, m0, chunk_size)
        finally:
            if self.watch is not None:
                self.watch.close()

    def check_server(self, server):
        """The chunk size to expect; fails on a server whose chunk size or hash algorithm is not the expected one."""
        if server is None:
            return self.chunk_size
        actual = server.get("chunk_size")
        if not isinstance(actual, int) or isinstance(actual, bool) or actual <= 0:
            self.fail("The LMCache server's /config names no chunk size (mp.chunk_size).")
        if self.chunk_size and actual != self.chunk_size:
            self.fail("The LMCache server stores chunks of %d tokens, not the %d expected (chunk_size): a chunk-size mismatch "
                      "between the server (--chunk-size) and what the engine's side was set up for." % (actual, self.chunk_size))
        algorithm = server.get("hash_algorithm")
        if self.hash_algorithm and algorithm != self.hash_algorithm:
            self.fail("The LMCache server hashes chunks with %s, not %s (hash_algorithm): a hash-algorithm mismatch between the "
                      "server (--hash-algorithm) and the connector (lmcache.mp.hash_algorithm), whose KV events then name chunks "
                      "the server does not hold." % (algorithm, self.hash_algorithm))
        return actual

    def cycle(self, prompt, token_ids, m0, chunk_size):
        l0 = self.lmcache_metrics()
        cold = self.complete(prompt, "cold")
        m1 = self.after(m0, cold["prompt_tokens"])
        self.lap("cold")
        if cold["prompt_tokens"] and _delta(m0, m1, EXTERNAL_QUERIES) == 0 and _delta(m0, m1, DEVICE_QUERIES) > 0:
            self.facts["connector"] = "none"
            self.fail("The engine has no KV connector: %s did not move over the cold request's %d prompt tokens (vLLM counts "
                      "them only through a connector); start vLLM with --kv-transfer-config naming %s and the LMCache "
                      "server's port." % (EXTERNAL_QUERIES, cold["prompt_tokens"], MP_CONNECTOR))
        expected_chunks = full_chunks(len(token_ids), chunk_size) // chunk_size if chunk_size else 0
        l1 = self.wait_stored(l0, expected_chunks) if self.facts.get("lmcache_reachable") else l0
        stored_chunks = _delta(l0, l1, L1_WRITE_CHUNKS) if self.facts.get("lmcache_reachable") else None
        if self.watch is not None:   # LMCache's store events (medium CPU) come with the engine's next step or two
            self.watch.wait_for(lambda: self.watch.stored_chunks() >= expected_chunks, min(self.settle, 1.0))
        self.lap("stored")
        method = self.miss
        if method in ("auto", "reset"):
            if self.reset():
                method = "reset"
            elif method == "reset":
                self.fail("The engine does not serve POST /reset_prefix_cache (start it with VLLM_SERVER_DEV_MODE=1, or use "
                          "miss=evict).")
            else:
                method = "evict"
        flood = self.flood(m1) if method == "evict" else 0
        self.lap("miss")
        m2 = self.engine_metrics()
        if self.watch is not None:
            self.watch.mark("restored")
        restored = self.complete(prompt, "restored")
        m3 = self.after(m2, restored["prompt_tokens"])
        l2 = self.lmcache_metrics()
        self.lap("restored")
        if self.watch is not None:
            self.watch.settle("restored", 0.05, 0.2)   # the restored request's events, then a quiet moment
            self.lap("events")
        facts = self.measure(cold, restored, (m0, m1, m2, m3), (l0, l1, l2), chunk_size, stored_chunks, method, flood)
        if self.watch is not None:
            facts["events"] = self.events(token_ids, facts)
        self.facts.update(facts)
        self.judge()
        return dict(self.facts, warnings=list(self.warnings))

    def measure(self, cold, restored, engine_pages, lmcache_pages, chunk_size, stored_chunks, method, flood):
        m0, m1, m2, m3 = engine_pages
        l0, l1, l2 = lmcache_pages
        reachable = self.facts.get("lmcache_reachable")
        prompt_tokens = restored["prompt_tokens"] or self.facts["prompt_tokens"]
        difference = max_logprob_difference(cold["logprobs"], restored["logprobs"])
        return {
            "miss_method": method,
            "flood_prompts": flood,
            "block_size": self.cache_info(m0).get("block_size"),
            "stored_tokens": stored_chunks * chunk_size if stored_chunks is not None and chunk_size else None,
            "expected_hit_tokens": expected_hit_tokens(prompt_tokens, chunk_size) if chunk_size else None,
            "external_hit_tokens": _delta(m2, m3, EXTERNAL_HITS),
            "external_query_tokens": _delta(m2, m3, EXTERNAL_QUERIES),
            "device_hit_tokens": _delta(m2, m3, DEVICE_HITS),
            "cold_external_hit_tokens": _delta(m0, m1, EXTERNAL_HITS),
            "lmcache_hit_tokens": _delta(l1, l2, LOOKUP_HIT_TOKENS) if reachable else None,
            "lmcache_requested_tokens": _delta(l1, l2, LOOKUP_REQUESTED_TOKENS) if reachable else None,
            "hit_tokens": restored["cached_tokens"],
            "cold": dict((k, cold[k]) for k in ("ttft", "latency", "prompt_tokens", "cached_tokens", "text")),
            "restored": dict((k, restored[k]) for k in ("ttft", "latency", "prompt_tokens", "cached_tokens", "text")),
            "same_text": cold["text"] == restored["text"],
            "logprob_max_difference": difference,
            "compared_tokens": len(restored["logprobs"]),
        }

    def events(self, token_ids, facts):
        media = self.watch.media()
        tiers = self.watch.tiers(token_ids, facts["block_size"] or 16)
        served = facts["external_hit_tokens"] + facts["device_hit_tokens"]
        host = media.get("CPU", {})
        return dict(tiers, media=media, host_events=host.get("stored_events", 0) > 0,
                    host_removed_blocks=host.get("removed_blocks", 0),
                    invisible_tokens=max(0, served - tiers["predicted_tokens"]))

    # -- verdict ------------------------------------------------------------------------------
    def judge(self):
        f = self.facts
        hit = f["external_hit_tokens"]
        expected = f["expected_hit_tokens"]
        if hit == 0:
            self.fail(self.no_hit_sentence())
        if f["device_hit_tokens"] and f["miss_method"] == "evict":
            self.warnings.append("The engine's own prefix cache still held %d tokens of the prompt after the flood."
                                 % f["device_hit_tokens"])
        if expected is not None and hit != expected:
            self.fail("The restored request got %d tokens from LMCache (vllm:external_prefix_cache_hits_total), not the %d its %d "
                      "prompt tokens give in full chunks of %d: a chunk-size mismatch, or chunks lost in between."
                      % (hit, expected, f["prompt_tokens"], f["chunk_size"]))
        if f["lmcache_hit_tokens"] is not None and f["lmcache_hit_tokens"] < hit:
            self.fail("The engine counts %d tokens from its connector, but the LMCache server at %s found only %d on lookup: the "
                      "connector talks to another server." % (hit, self.lmcache.base_url, f["lmcache_hit_tokens"]))
        if not f["same_text"]:
            self.fail("The restored request's greedy completion differs from the cold one (%r against %r): the KV cache LMCache "
                      "gave back is not the one the engine computed." % (_clip(f["restored"]["text"]), _clip(f["cold"]["text"])))
        difference = f["logprob_max_difference"]
        if difference is None:
            self.warnings.append("The engine returned no log-probabilities to compare; only the texts were compared.")
        elif difference > self.logprob_tolerance:
            self.fail("The restored request's log-probabilities differ from the cold one's by up to %.3g (tolerance %.3g): the KV "
                      "cache LMCache gave back is not the one the engine computed." % (difference, self.logprob_tolerance))

    def no_hit_sentence(self):
        f = self.facts
        base = "The restored request got no token from LMCache (vllm:external_prefix_cache_hits_total did not move over %d " \
               "prompt tokens)" % f["prompt_tokens"]
        if f["device_hit_tokens"] and f["device_hit_tokens"] >= (f["expected_hit_tokens"] or 1):
            return base + ", because the engine's own prefix cache still held it (%d tokens): the %s did not make it miss." % (
                f["device_hit_tokens"], "reset" if f["miss_method"] == "reset" else "flood of %d prompts" % f["flood_prompts"])
        if f["connector"] != "multiprocess":
            named = self.engine_connector()
            if named is not None:
                f["kv_connector"] = named
            if named in IN_PROCESS_CONNECTORS or (named is None and f["connector"] == "in-process"):
                f["connector"] = "in-process"
                how = "its /server_info" if named else "lmcache:* metrics on its page, no vllm:lmcache_mp_* ones"
                return (base + ": vLLM runs LMCache's in-process connector (%s, by %s), which on a CPU engine falls back to "
                        "recompute (LMCache 0.5.6 has no CPU connector, lmcache/v1/gpu_connector/__init__.py); run LMCache in "
                        "multiprocess mode (an lmcache server and %s)." % (named or IN_PROCESS_CONNECTORS[0], how, MP_CONNECTOR))
            if named and named != MP_CONNECTOR:
                return base + (": the engine's KV connector is %s (its /server_info), not LMCache's; start vLLM with "
                               "--kv-transfer-config naming %s and the LMCache server's port." % (named, MP_CONNECTOR))
            if not f.get("lmcache_reachable"):
                return base + (": the engine's connector is not LMCache's multiprocess one (no vllm:lmcache_mp_* metrics) and no "
                               "LMCache server answers%s; run LMCache in multiprocess mode (an lmcache server and %s) and name "
                               "its HTTP API (lmcache_url)." % ((" at %s" % self.lmcache.base_url) if self.lmcache is not None else "",
                                                                MP_CONNECTOR))
        if f["connector"] == "multiprocess" and self.lmcache is not None and f.get("stored_tokens") == 0:
            if self.read_lmcache_registrations() == []:
                f["degraded"] = True
                return ("The LMCache tier is degraded: the restored request got no token from LMCache and the server at %s stored "
                        "none of the cold request, with no engine registered with it (a server started again under the running "
                        "engine; its connector registers again only after a heartbeat, every %d s, found the server away), so "
                        "vLLM recomputes every prompt until it is over; make site restarts an engine that stays unregistered."
                        % (self.lmcache.base_url, HEARTBEAT_SECONDS))
        if f.get("stored_tokens") == 0:
            return base + ": the LMCache server stored no chunk of the cold request (is the connector pointed at %s?)." % (
                self.lmcache.base_url if self.lmcache is not None else "the server")
        if f.get("lmcache_hit_tokens") == 0 and f.get("stored_tokens"):
            return base + (": the LMCache server holds the %d tokens the cold request stored but its lookup found none of "
                           "them: a hash-algorithm or hash-seed mismatch between the connector and the server (PYTHONHASHSEED, "
                           "--hash-algorithm)." % f["stored_tokens"])
        return base + "."


def tier_probe(client, metrics_url, model, options, http_options, timeout, shared=None):
    """The ``LMCacheProbe`` of ``TIER_OPTIONS`` ``options`` for the engine of ``client`` (``model``: its model, or None for
    the first it lists): its LMCache server (``lmcache_url``) asked with the engine's TLS settings (``http_options``,
    ``http.args.client_options``) but not its token, each request bounded by ``LMCACHE_TIMEOUT``; with
    ``options["kv_events"]`` (``EVENTS_OPTIONS``) a ``tiers.TierWatch`` on that stream, on ``shared`` where given (another
    watch's open subscription of it, ``RequestWindows.hand_over``)."""
    lmcache = None
    if options["lmcache_url"]:
        server_options = dict(http_options, api_key=None)   # the engine's token, not the LMCache server's
        lmcache = OpenAIClient(options["lmcache_url"].rstrip("/"), timeout=min(timeout, LMCACHE_TIMEOUT), **server_options)
    events, watch = options.get("kv_events"), None
    if events:
        watch = TierWatch(events["endpoint"], events["socket_mode"] == "bind", events["topic"], connect_timeout=events["connect_timeout"])
        if shared is not None:
            watch.take_over(shared)
    return LMCacheProbe(
        client, lmcache, metrics_url, model=model, prefix_tokens=options["prefix_tokens"],
        max_tokens=options["max_tokens"], miss=options["miss"], flood_prompts=options["flood_prompts"],
        chunk_size=options["chunk_size"], hash_algorithm=options["hash_algorithm"],
        logprob_tolerance=options["logprob_tolerance"], settle=options["settle"], watch=watch,
    )


def server_url(options):
    """The LMCache server's URL as results report it (``lmcache_url`` without a trailing slash), or None."""
    return (options.get("lmcache_url") or "").rstrip("/") or None


def _clip(text, limit=40):
    text = str(text)
    return text if len(text) <= limit else text[:limit] + "..."
