#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

DOCUMENTATION = r"""
module: prefix_cache_check
short_description: Prove that an LLM server's prefix cache hits, with a cold and a warm request
version_added: 0.1.0
description:
  - Sends a cold and a warm completion that share a long prefix to an OpenAI-compatible server (vLLM, SGLang).
    A unique nonce at the start of the prefix makes the cold request really cold. Each request ends with a tail of
    its own at least one block long, so the warm request also stores a block the cold one did not.
  - Measures time to first token (by streaming) and total latency of both, reads the engine's Prometheus counters
    before, between and after, and reports the prefix-cache hit and query token deltas of each request, the
    C(cached_tokens) the server reports in C(usage.prompt_tokens_details), and the cold/warm ratios.
  - "Picks the counters the metrics page exposes: vLLM C(vllm:prefix_cache_hits_total) and
    C(vllm:prefix_cache_queries_total) (or the deprecated C(vllm:gpu_prefix_cache_*)), SGLang
    C(sglang:cached_tokens_total) and C(sglang:prompt_tokens_total)."
  - Counts prefix tokens with the server's C(/tokenize) endpoint; without one the length is estimated and a warning
    says so. A prefix shorter than one block is refused, because it is never cached.
  - Fails with one sentence when the server or its metrics cannot be reached, or when an expectation does not hold.
  - The counters are server-wide, so concurrent traffic on the same server can add to the measured deltas.
  - The module never changes anything (the requests only fill the server's cache).
author:
  - inference_cache maintainers (@inference-cache)
extends_documentation_fragment:
  - inference_cache.substrate._attributes
  - inference_cache.substrate._attributes.CHECK
  - inference_cache.substrate._http
options:
  url:
    description:
      - Base URL of the OpenAI-compatible server, without C(/v1); C(http://) or C(https://).
      - For C(https://) see O(validate_certs), O(ca_path), O(client_cert) and O(client_key).
    type: str
    default: http://127.0.0.1:8000
  metrics_url:
    description: URL of the Prometheus metrics page. Defaults to O(url) followed by C(/metrics).
    type: str
  model:
    description: Model name to send. Defaults to the first model the server lists at C(/v1/models).
    type: str
  prefix:
    description:
      - Shared prefix text to use instead of a generated one. The nonce is put in front of it.
      - Mutually exclusive with O(prefix_tokens).
    type: str
  prefix_tokens:
    description:
      - Length in tokens of the generated shared prefix (nonce included), measured with the server's tokenizer.
      - Must be at least one block; several blocks give a clearer signal. At most 131072.
    type: int
    default: 256
  block_size:
    description:
      - KV-cache block size of the engine in tokens.
      - Defaults to the C(block_size) label of C(vllm:cache_config_info), else 16 with a warning.
      - Between 1 and 4096.
    type: int
  engine:
    description: Which engine's counters to read; V(auto) picks by what the metrics page exposes.
    type: str
    choices: [auto, vllm, sglang]
    default: auto
  max_tokens:
    description: Tokens to generate per request, between 1 and 4096.
    type: int
    default: 8
  timeout:
    description: Timeout in seconds of each HTTP request; above 0 and at most 3600.
    type: float
    default: 60
  min_hit_tokens:
    description:
      - Least number of prefix-cache hit tokens the warm request must show. Defaults to one block.
      - V(0) disables the expectation. Negative values are refused.
    type: int
  expect_warm_faster:
    description: Fail unless the warm request's time to first token is lower than the cold one's.
    type: bool
    default: false
  kv_events:
    description:
      - The engine's KV-event stream, to watch what it announces for the cold and for the warm request apart
        (RV(kv_events)), as M(inference_cache.substrate.kv_events_check) with each request as its trigger, without
        two more requests and module runs. Omit it to skip that part.
      - Each request gets a window of its own. The subscription opens, the request goes O(kv_events.delay) after the
        engine's publisher connected, and the window closes once the expectations are met and the stream stayed
        quiet for O(kv_events.settle). A window that fails fails the module, naming the request.
      - The wire dialect is O(engine)'s (V(auto) detects it from the frames).
    type: dict
    suboptions:
      endpoint:
        description:
          - ZMQ endpoint of the engine's KV-event publisher (a C(tcp://), C(ipc://) or C(inproc://) endpoint).
          - With O(kv_events.socket_mode=connect) the address the engine binds; with O(kv_events.socket_mode=bind) the
            local address the engine connects to.
        type: str
        required: true
      socket_mode:
        description: V(bind) when the engine connects (vLLM with an endpoint without C(*) or C(::)), V(connect) when it binds.
        type: str
        choices: [connect, bind]
        default: connect
      topic:
        description: Topic prefix of the engine's messages (a byte-prefix match); V("") accepts every topic.
        type: str
        default: ""
      data_parallel_size:
        description: Number of data-parallel ranks (rank N publishes on the port of O(kv_events.endpoint) plus N); 1 to 64.
        type: int
        default: 1
      replay_endpoint:
        description:
          - ROUTER endpoint of the engine's replay buffer, to repair sequence gaps and fetch the tail of each window.
        type: str
      timeout:
        description: Seconds each window may take in total (connection, request, events, replay); above 0, at most 86400.
        type: float
        default: 30.0
      settle:
        description: Seconds without a message, once the expectations are met, that close a window; 0 to 3600.
        type: float
        default: 1.0
      delay:
        description: Seconds between the publisher's connection and the request of each window; 0 to 60.
        type: float
        default: 0.05
      expect:
        description:
          - Least number of events per type in each window, keyed by V(BlockStored), V(BlockRemoved) or
            V(AllBlocksCleared). V({}) only requires one batch.
        type: dict
        default: {BlockStored: 1}
      router_version:
        description: The llm-d router whose KV-event decoder each batch is held against; V(none) skips it.
        type: str
        default: v0.9.0
        choices: [v0.9.0, none]
      expect_router_decodes:
        description: Fail when that router's decoder would drop a batch.
        type: bool
        default: false
  lmcache:
    description:
      - The engine's LMCache tier, checked after the prefix cache in the same run, as
        M(inference_cache.substrate.lmcache_check) checks it (RV(lmcache)). A prompt is stored, lost from the engine's
        own prefix cache (which empties it) and got back from LMCache. Omit it to skip that part.
      - Its suboptions are lmcache_check's options of the same name; the engine, the model, the HTTP settings and
        O(timeout) are this module's.
      - A tier that fails fails the module with lmcache_check's sentence; the prefix cache's facts are returned with it.
    type: dict
    suboptions:
      lmcache_url:
        description: Base URL of the LMCache server's HTTP API (lmcache_check's O(inference_cache.substrate.lmcache_check#module:lmcache_url)).
        type: str
      prefix_tokens:
        description: Length of the tier's prompt in tokens (several LMCache chunks); between 2 and 131072.
        type: int
        default: 600
      max_tokens:
        description: Greedy tokens generated by the tier's cold and restored request; between 1 and 256.
        type: int
        default: 8
      miss:
        description: How the engine's own prefix cache is made to lose the prompt (lmcache_check's O(inference_cache.substrate.lmcache_check#module:miss)).
        type: str
        choices: [auto, reset, evict]
        default: auto
      flood_prompts:
        description: Most prompts of an eviction flood; between 1 and 1024.
        type: int
        default: 32
      chunk_size:
        description: LMCache chunk size the engine's side was set up for; the check fails when the server's differs.
        type: int
      hash_algorithm:
        description: Chunk hash algorithm the connector was set up with; the check fails when the server's differs.
        type: str
      logprob_tolerance:
        description: Largest difference allowed between a cold and a restored token's log-probability; at least 0.
        type: float
        default: 0.0001
      settle:
        description: Seconds to wait for the counters and LMCache's write to show a request; above 0 and at most 300.
        type: float
        default: 5
      only_with_connector:
        description:
          - Check the tier only where the engine exports a KV connector's counters (RV(external_prefix_cache)); elsewhere
            RV(lmcache) is not returned. V(false) checks it anyway, and an engine without a connector fails it.
        type: bool
        default: false
      kv_events:
        description:
          - The engine's KV-event stream, to report what it announced of each tier during the tier's check
            (lmcache_check's O(inference_cache.substrate.lmcache_check#module:kv_events), C(events) in RV(lmcache)).
            Omit it to skip that part.
          - Usually O(kv_events)'s stream. Where it is (the same endpoint, socket mode and topic), the windows' subscription
            is handed on to the tier's watch, which then waits neither for the engine to connect again nor for the
            subscription to settle.
        type: dict
        suboptions:
          endpoint:
            description: ZMQ endpoint of the engine's KV-event publisher (a C(tcp://), C(ipc://) or C(inproc://) endpoint).
            type: str
            required: true
          socket_mode:
            description: V(bind) when the engine connects, V(connect) when it binds.
            type: str
            choices: [connect, bind]
            default: connect
          topic:
            description: Topic prefix of the engine's messages; V("") accepts every topic.
            type: str
            default: ""
          connect_timeout:
            description: Seconds to wait for the engine to connect to the stream; above 0 and at most 60.
            type: float
            default: 5
requirements:
  - prometheus_client
  - pyzmq and msgspec, with O(kv_events)
notes:
  - Use a prefix of several blocks; only full blocks are cached, so the expected hit is the prefix length rounded
    down to a block (RV(expected_hit_tokens)). When every full block of a prompt is cached, vLLM still computes the
    prompt's last token, so the hit is at most the prompt length minus one, rounded down to a block.
  - Requests go through C(ansible.module_utils.urls), so proxies, CA bundles and client certificates work as in
    M(ansible.builtin.uri).
seealso:
  - module: inference_cache.substrate.kv_events_check
  - module: inference_cache.substrate.lmcache_check
"""

EXAMPLES = r"""
- name: Prove that the local vLLM engine's prefix cache hits
  inference_cache.substrate.prefix_cache_check:
    url: http://127.0.0.1:8000
    model: tiny
    prefix_tokens: 512
    min_hit_tokens: 256
  register: prefix_cache

- name: Check an SGLang server behind a token, and require a faster warm request
  inference_cache.substrate.prefix_cache_check:
    url: https://sglang.example.com
    api_key: "{{ sglang_token }}"
    engine: sglang
    expect_warm_faster: true

- name: Check the prefix cache, the KV events of both requests and the LMCache tier in one run
  inference_cache.substrate.prefix_cache_check:
    url: http://127.0.0.1:8000
    kv_events:
      endpoint: tcp://127.0.0.1:5557
      socket_mode: bind
    lmcache:
      lmcache_url: http://127.0.0.1:8051
      only_with_connector: true
      kv_events:
        endpoint: tcp://127.0.0.1:5557
        socket_mode: bind
  register: checks
"""

RETURN = r"""
engine:
  description: Engine whose counters were read.
  returned: always
  type: str
  sample: vllm
model:
  description: Model the requests named.
  returned: always
  type: str
  sample: tiny
url:
  description: Base URL of the server.
  returned: always
  type: str
  sample: http://127.0.0.1:8000
metrics_url:
  description: URL of the metrics page read.
  returned: always
  type: str
  sample: http://127.0.0.1:8000/metrics
metric_names:
  description: Names of the hit and query counters read.
  returned: success
  type: dict
  sample: {hits: "vllm:prefix_cache_hits_total", queries: "vllm:prefix_cache_queries_total"}
external_prefix_cache:
  description:
    - Whether the engine exports the external prefix-cache counters of a KV connector (C(vllm:external_prefix_cache_queries_total)),
      that is, a connector with a tier of its own, such as LMCache, is configured. The role C(inference_cache.substrate.verify) then
      checks that tier (M(inference_cache.substrate.lmcache_check)) when C(verify_lmcache) is V(auto).
  returned: success
  type: bool
  sample: false
nonce:
  description: Unique text at the start of the shared prefix.
  returned: success
  type: str
  sample: 6f1c0a3e9d2b4c5a8e7f6d5c4b3a2910
block_size:
  description: Block size used for the expectations, in tokens.
  returned: success
  type: int
  sample: 32
block_size_source:
  description: Where the block size came from (V(option), V(metrics) or V(default)).
  returned: success
  type: str
  sample: metrics
prefix_tokens:
  description: Length of the shared prefix in tokens, nonce and start-of-text token included.
  returned: success
  type: int
  sample: 260
prefix_tokens_estimated:
  description: Whether RV(prefix_tokens) is an estimate because the server has no C(/tokenize) endpoint.
  returned: success
  type: bool
  sample: false
expected_hit_tokens:
  description:
    - The hit a working cache should show for the warm request, in tokens.
    - RV(prefix_tokens) rounded down to a full block, and at most the warm prompt's length minus one rounded down to
      a full block (vLLM computes the last prompt token even when every block is cached).
  returned: success
  type: int
  sample: 256
cold:
  description: The cold request.
  returned: success
  type: dict
  contains:
    ttft:
      description: Time to first token in seconds.
      type: float
      sample: 0.088
    latency:
      description: Total latency in seconds.
      type: float
      sample: 0.12
    prompt_tokens:
      description: Prompt tokens from the usage the server reported (null when none).
      type: int
      sample: 268
    completion_tokens:
      description: Generated tokens from the usage the server reported (null when none).
      type: int
      sample: 8
    cached_tokens:
      description: C(usage.prompt_tokens_details.cached_tokens), null when the server does not report it.
      type: int
      sample: 0
    hit_tokens:
      description: Increase of the hit counter over this request.
      type: int
      sample: 0
    query_tokens:
      description: Increase of the query counter over this request.
      type: int
      sample: 268
warm:
  description: The warm request, with the same keys as RV(cold).
  returned: success
  type: dict
  sample: {ttft: 0.025, latency: 0.06, prompt_tokens: 270, completion_tokens: 8, cached_tokens: 256, hit_tokens: 256, query_tokens: 270}
hit_tokens:
  description: Prefix-cache hit tokens of the warm request, from the metrics.
  returned: success
  type: int
  sample: 256
query_tokens:
  description: Prefix-cache query tokens of both requests, from the metrics.
  returned: success
  type: int
  sample: 538
cached_tokens:
  description: Cached prompt tokens the server reported for the warm request (null when it does not report them).
  returned: success
  type: int
  sample: 256
ttft_ratio:
  description: Cold time to first token divided by warm time to first token.
  returned: success
  type: float
  sample: 3.52
latency_ratio:
  description: Cold latency divided by warm latency.
  returned: success
  type: float
  sample: 2.1
kv_events:
  description:
    - With O(kv_events), what the engine's KV events announced during each request, under C(cold) and C(warm); each
      has the fields M(inference_cache.substrate.kv_events_check) returns (C(counts), C(stored_tokens),
      C(block_size), C(media), C(trigger) with the request's C(prompt_tokens) and C(cached_tokens), ...).
    - On failure, the windows watched until then.
  returned: success with O(kv_events), and failure in a window
  type: dict
  sample: {cold: {counts: {BlockStored: 10}, stored_tokens: 320, block_size: 32}, warm: {counts: {BlockStored: 1}}}
lmcache:
  description:
    - With O(lmcache), what M(inference_cache.substrate.lmcache_check) returns of the tier (C(connector), C(chunk_size),
      C(external_hit_tokens), C(expected_hit_tokens), C(same_text), C(degraded), C(seconds), ...) and C(lmcache_url).
    - On a failure of the tier, its facts until then.
  returned: success with O(lmcache) (not where O(lmcache.only_with_connector) skipped it), and failure of the tier
  type: dict
  sample: {connector: multiprocess, chunk_size: 256, external_hit_tokens: 512, expected_hit_tokens: 512, same_text: true}
failures:
  description: The expectations that did not hold, one sentence each.
  returned: failure
  type: list
  elements: str
  sample: ["The warm request hit 32 cached tokens, fewer than min_hit_tokens=256."]
"""


from ansible.module_utils.basic import missing_required_lib

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.errors import CheckError
from ansible_collections.inference_cache.substrate.plugins.module_utils.common.module import run_module
from ansible_collections.inference_cache.substrate.plugins.module_utils.http.args import HTTP_ARG_SPEC, HTTP_REQUIRED_BY, client_options
from ansible_collections.inference_cache.substrate.plugins.module_utils.http.openai import OpenAIClient
from ansible_collections.inference_cache.substrate.plugins.module_utils.http.prefix_cache import (
    HAS_PROMETHEUS_CLIENT,
    PROMETHEUS_CLIENT_IMPORT_ERROR,
    PrefixCacheProbe,
    evaluate,
)
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.consumer import HAS_ZMQ, ZMQ_IMPORT_ERROR
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.events import HAS_MSGSPEC, MSGSPEC_IMPORT_ERROR
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.events_check import WINDOW_OPTIONS, RequestWindows
from ansible_collections.inference_cache.substrate.plugins.module_utils.lmcache.check import EVENTS_OPTIONS, TIER_OPTIONS, server_url, tier_probe

# The option table (common/options.py): the argument spec and the ranges, checked before any request.
OPTIONS = dict(
    HTTP_ARG_SPEC,
    url=dict(type="str", default="http://127.0.0.1:8000"),
    metrics_url=dict(type="str"),
    model=dict(type="str"),
    prefix=dict(type="str"),
    prefix_tokens=dict(type="int", default=256, no_log=False, range=(1, 131072)),
    block_size=dict(type="int", range=(1, 4096)),
    engine=dict(type="str", default="auto", choices=["auto", "vllm", "sglang"]),
    max_tokens=dict(type="int", default=8, no_log=False, range=(1, 4096)),
    timeout=dict(type="float", default=60, range=(0, 3600, "open-low")),
    min_hit_tokens=dict(type="int", no_log=False, range=(0, None)),
    expect_warm_faster=dict(type="bool", default=False),
    kv_events=dict(type="dict", options=WINDOW_OPTIONS),
    lmcache=dict(type="dict", options=dict(
        TIER_OPTIONS,
        only_with_connector=dict(type="bool", default=False),
        kv_events=dict(type="dict", options=EVENTS_OPTIONS),
    )),
)


def _urls(params):
    url = params["url"].rstrip("/")
    return url, params["metrics_url"] or url + "/metrics"


def _always(params):
    """What every result carries, failures included."""
    url, metrics_url = _urls(params)
    return dict(url=url, metrics_url=metrics_url, model=params["model"], engine=params["engine"])


def _measure(params, module):
    url, metrics_url = _urls(params)
    client = OpenAIClient(url, timeout=params["timeout"], **client_options(params))
    windows = None
    if params["kv_events"] or (params["lmcache"] or {}).get("kv_events"):
        for name, present, error in (("pyzmq", HAS_ZMQ, ZMQ_IMPORT_ERROR), ("msgspec", HAS_MSGSPEC, MSGSPEC_IMPORT_ERROR)):
            if not present:
                module.fail_json(msg=missing_required_lib(name), exception=error)
    if params["kv_events"]:
        windows = RequestWindows(params["kv_events"], url, model=lambda: probe.model, engine=params["engine"])
    probe = PrefixCacheProbe(
        client, metrics_url, model=params["model"], prefix=params["prefix"], prefix_tokens=params["prefix_tokens"],
        block_size=params["block_size"], max_tokens=params["max_tokens"], engine=params["engine"],
        around=windows.around if windows else None,
    )
    shared = None   # the windows' subscription, handed to the tier's watch of the same stream
    try:
        if windows:
            windows.open()   # the engine connects while the probe prepares its requests
        result = probe.run()
        if windows and _same_stream(params):
            shared = windows.hand_over()
    except CheckError as exc:
        exc.facts["model"] = probe.model
        if windows:
            exc.facts.setdefault("kv_events", dict(windows.windows))
        raise
    finally:
        if windows:
            windows.close()
    try:
        if windows:
            result["kv_events"] = dict(windows.windows)
        for warning in result.pop("warnings"):
            module.warn(warning)
        result.update(url=url)
        failures = evaluate(result, params["min_hit_tokens"], params["expect_warm_faster"])
        if failures:
            raise CheckError(" ".join(failures), dict(result, failures=failures))
        tier = params["lmcache"]
        if tier and (result.get("external_prefix_cache") or not tier["only_with_connector"]):
            result["lmcache"] = _tier(params, module, client, metrics_url, probe.model, result, shared)
    finally:
        if shared is not None:
            shared.close()
    return result


def _same_stream(params):
    """Whether the tier's KV events are the windows' stream (the same endpoint, side and topic)."""
    tier_events = (params["lmcache"] or {}).get("kv_events")
    return bool(tier_events) and all(tier_events[k] == params["kv_events"][k] for k in ("endpoint", "socket_mode", "topic"))


def _tier(params, module, client, metrics_url, model, result, shared=None):
    """The LMCache tier checked after the prefix cache, in the same run (lmcache_check's check): its facts, or a
    ``CheckError`` with its sentence, the prefix-cache facts and the tier's under ``lmcache``. ``shared``: the windows'
    open subscription of the tier's stream, or None (the tier's watch subscribes anew)."""
    tier = params["lmcache"]
    try:
        facts = tier_probe(client, metrics_url, model, tier, client_options(params), params["timeout"], shared=shared).run()
    except CheckError as exc:
        warnings = exc.facts.pop("warnings", [])
        raise CheckError(exc.msg, dict(result, lmcache=dict(exc.facts, lmcache_url=server_url(tier)), warnings=warnings))
    for warning in facts.pop("warnings"):
        module.warn(warning)
    return dict(facts, lmcache_url=server_url(tier))


def main():
    run_module(OPTIONS, _measure, requirements=[("prometheus_client", HAS_PROMETHEUS_CLIENT, PROMETHEUS_CLIENT_IMPORT_ERROR)],
               facts=_always, mutually_exclusive=[("prefix", "prefix_tokens")], required_by=HTTP_REQUIRED_BY)


if __name__ == "__main__":
    main()
