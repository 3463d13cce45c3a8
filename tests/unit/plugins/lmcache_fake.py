# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A fake vLLM engine with LMCache beside it, on two scripted HTTP servers, for the tests of lmcache_check.

``FakeStack`` keeps one state behind both: the engine's own prefix cache (prompts it holds, at most ``capacity``), the
prompts LMCache stored (in full chunks), the counters vLLM and the LMCache server expose, and switches for what can go
wrong: ``connector`` (``multiprocess``, ``in-process``, ``other``, a connector that is neither and shows no metric of
its own, or None, no connector at all, whose engine counts no external query: which metrics the engine's page shows and
whether the tier works), ``reset_clears``, ``lookup_works`` (chunks stored but never found again, as after a
hash mismatch), ``short_chunks`` (the restored request gets that many chunks less), ``restored_text`` and
``logprob_drift`` (what the restored completion says), ``registered`` (the engine registered with the LMCache server, as
its ``/status`` lists it; False: a server started again that the connector has not found yet, whose tier is degraded),
``kv_connector`` (what the engine's ``/server_info`` names; None: no such page, as without VLLM_SERVER_DEV_MODE).
Tokens: one per word, plus the start-of-text token. The engine's own cache hits the full blocks a prompt shares with a
prompt it holds (so prefix_cache_check's cold and warm requests run against it too).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json

from .http_server import ScriptedServer, sse


class FakeStack:
    def __init__(self, chunk_size=64, block_size=32, capacity=4, connector="multiprocess", hash_algorithm="blake3",
                 kv_event_log_size=0):
        self.chunk_size = chunk_size
        self.block_size = block_size
        self.capacity = capacity
        self.connector = connector
        self.hash_algorithm = hash_algorithm
        self.kv_event_log_size = kv_event_log_size
        self.reset_clears = True
        self.lookup_works = True
        self.short_chunks = 0
        self.restored_text = None
        self.logprob_drift = 0.0
        self.external_counters = True
        self.lmcache_running = True
        self.registered = True
        self.kv_connector = None
        self.model_name = "/m"
        self.device = []      # prompts the engine's own cache holds, oldest first
        self.stored = {}      # prompt -> tokens LMCache holds
        self.counters = {"ext_hits": 0, "ext_queries": 0, "dev_hits": 0, "dev_queries": 0, "writes": 0, "lookup_hits": 0,
                         "lookup_requested": 0}
        self.completions = []
        self.engine = ScriptedServer()
        self.lmcache = ScriptedServer()
        self.engine.routes.update({
            "/metrics": (200, "text/plain", lambda body: self.engine_page().encode()),
            "/v1/models": (200, "application/json", json.dumps({"data": [{"id": "tiny", "max_model_len": 2048}]}).encode()),
            "/tokenize": (200, "application/json", self.tokenize),
            "/v1/completions": (200, "text/event-stream", self.complete),
            "/reset_prefix_cache": (200, "application/json", self.reset),
            "/server_info": (200, "application/json", self.server_info),
        })
        self.lmcache.routes.update({
            "/config": (200, "application/json", lambda body: json.dumps({"mp": {
                "chunk_size": self.chunk_size, "hash_algorithm": self.hash_algorithm,
                "kv_event_log_size": self.kv_event_log_size}}).encode()),
            "/metrics": (200, "text/plain", lambda body: self.lmcache_page().encode()),
            "/healthcheck": (200, "application/json", b'{"status": "healthy"}'),
            "/status": (200, "application/json", self.status),
        })

    def start(self):
        self.engine.start()
        self.lmcache.start()
        return self

    def stop(self):
        self.engine.stop()
        self.stop_lmcache()

    def tokenize(self, body):
        tokens = self.tokens(body["prompt"])
        return json.dumps({"tokens": tokens, "count": len(tokens)}).encode()

    @staticmethod
    def tokens(prompt):
        return [1] + [2 + (sum(bytearray(word.encode())) % 1000) for word in prompt.split()]

    # -- the engine -------------------------------------------------------------------------
    def server_info(self, body):  # pylint: disable=unused-argument
        if self.kv_connector is None:
            return b'{"detail": "Not Found"}'   # the route answers 404 (no_server_info), or a page without the config
        transfer = {"kv_connector": self.kv_connector, "kv_role": "kv_both"} if self.kv_connector else None
        return json.dumps({"vllm_config": {"kv_transfer_config": transfer}, "vllm_env": {}}).encode()

    def engine_page(self):
        c = self.counters
        lines = ["# TYPE vllm:prefix_cache_hits counter", 'vllm:prefix_cache_hits_total{model_name="tiny"} %d' % c["dev_hits"],
                 "# TYPE vllm:prefix_cache_queries counter",
                 'vllm:prefix_cache_queries_total{model_name="tiny"} %d' % c["dev_queries"],
                 "# TYPE vllm:cache_config_info gauge",
                 'vllm:cache_config_info{block_size="%d",num_gpu_blocks="%d",engine="0"} 1.0' % (
                     self.block_size, self.capacity * 2048 // self.block_size)]
        if self.external_counters:
            lines += ["# TYPE vllm:external_prefix_cache_hits counter",
                      'vllm:external_prefix_cache_hits_total{model_name="tiny"} %d' % c["ext_hits"],
                      "# TYPE vllm:external_prefix_cache_queries counter",
                      'vllm:external_prefix_cache_queries_total{model_name="tiny"} %d' % c["ext_queries"]]
        if self.connector == "multiprocess":
            lines += ["# TYPE vllm:lmcache_mp_lookup_duration_seconds histogram",
                      'vllm:lmcache_mp_lookup_duration_seconds_count{model_name="tiny"} 1.0',
                      'vllm:lmcache_mp_lookup_duration_seconds_sum{model_name="tiny"} 0.01']
        elif self.connector == "in-process":
            lines += ["# TYPE lmcache:num_hit_tokens counter", 'lmcache:num_hit_tokens_total{model_name="/m"} 0.0']
        return "\n".join(lines) + "\n"

    def complete(self, body):
        prompt = body["prompt"]
        count = len(self.tokens(prompt))
        c = self.counters
        last = ((count - 1) // self.block_size) * self.block_size
        device = min(last, max([self.shared_blocks(prompt, held) for held in self.device] or [0]))
        external = 0
        works = self.connector == "multiprocess" and self.lmcache_up() and self.registered
        if not device and works and prompt in self.stored:
            full = min(self.stored[prompt], ((count - 1) // self.chunk_size) * self.chunk_size)
            c["lookup_requested"] += (count // self.chunk_size) * self.chunk_size
            if self.lookup_works:
                external = max(0, full - self.short_chunks * self.chunk_size)
                c["lookup_hits"] += full
        c["dev_hits"] += device
        c["dev_queries"] += count
        c["ext_hits"] += external
        c["ext_queries"] += (count - device) if self.connector else 0   # vLLM counts them only through a connector
        if prompt not in self.device:
            self.device.append(prompt)
            del self.device[:-self.capacity]
        if works and prompt not in self.stored:
            self.stored[prompt] = (count // self.chunk_size) * self.chunk_size
            c["writes"] += count // self.chunk_size
        restored = bool(device or external)
        self.completions.append({"prompt": prompt, "device": device, "external": external})
        if not body.get("stream"):
            return json.dumps({"choices": [{"text": " ok"}], "usage": {"prompt_tokens": count, "completion_tokens": 1}}).encode()
        text = self.restored_text if restored and self.restored_text is not None else " cache block"
        drift = self.logprob_drift if restored else 0.0
        pieces = [{"choices": [{"text": " " + word, "logprobs": {"token_logprobs": [-0.5 - i + drift]}}]}
                  for i, word in enumerate(text.split())]
        usage = {"prompt_tokens": count, "completion_tokens": len(pieces),
                 "prompt_tokens_details": {"cached_tokens": device + external}}
        return sse(*(pieces + [{"choices": [], "usage": usage}]))

    def shared_blocks(self, prompt, held):
        """Tokens of the full blocks ``prompt`` shares with a prompt the engine's own cache holds (its prefix cache)."""
        mine, theirs = self.tokens(prompt), self.tokens(held)
        common = 0
        while common < min(len(mine), len(theirs)) and mine[common] == theirs[common]:
            common += 1
        return (common // self.block_size) * self.block_size

    def reset(self, body):  # pylint: disable=unused-argument
        if self.reset_clears:
            self.device = []
        return b'{"success": true}'

    # -- the LMCache server --------------------------------------------------------------------
    def lmcache_up(self):
        return self.lmcache_running

    def lmcache_page(self):
        c = self.counters
        return ("# TYPE lmcache_mp_l1_write_chunks counter\n"
                'lmcache_mp_l1_write_chunks_total{l1_tag="_default"} %d\n'
                "# TYPE lmcache_mp_lookup_hit_tokens counter\n"
                'lmcache_mp_lookup_hit_tokens_total{cache_salt="",model_name="/m"} %d\n'
                "# TYPE lmcache_mp_lookup_requested_tokens counter\n"
                'lmcache_mp_lookup_requested_tokens_total{cache_salt="",model_name="/m"} %d\n'
                % (c["writes"], c["lookup_hits"], c["lookup_requested"]))

    def status(self, body):  # pylint: disable=unused-argument
        ids = [7] if self.registered else []
        meta = {"7": {"model_name": self.model_name, "world_size": 1, "block_size": self.block_size}} if self.registered else {}
        return json.dumps({"is_healthy": True, "chunk_size": self.chunk_size, "registered_non_cuda_instance_ids": ids,
                           "non_cuda_context_meta": meta}).encode()

    def stop_lmcache(self):
        """The server is gone (connections refused) and the connector's tier with it."""
        if self.lmcache_running:
            self.lmcache.stop()
            self.lmcache_running = False

    def no_reset(self):
        """An engine without vLLM's development endpoints (VLLM_SERVER_DEV_MODE unset): 404."""
        self.engine.routes["/reset_prefix_cache"] = (404, "application/json", b'{"detail": "Not Found"}')
