#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

DOCUMENTATION = r"""
module: epp_route_check
short_description: Ask a running llm-d EPP where it routes requests and check that each pick holds the longest cached prefix
version_added: 0.1.0
description:
  - Sends each request's headers and body to a running EPP (the llm-d router's endpoint picker) over Envoy's external
    processing protocol (C(envoy.service.ext_proc.v3), gRPC), the same way Envoy asks it, and reads the endpoint it
    picks from the C(x-gateway-destination-endpoint) header (and the C(envoy.lb) metadata). The stream is then closed,
    so the request never reaches an engine.
  - Subscribes to the engines' KV-event streams and keeps the collection's KV-block index of what each engine holds
    (copies counted; what M(inference_cache.substrate.kv_index_check) proves exact). Before each request it reads from
    the index how many tokens of the prompt each engine holds as a cached prefix (prompts tokenized by the engines'
    C(/tokenize)).
  - The precise router's claim is that its pick holds the longest cached prefix among the endpoints. The module fails
    with one sentence at the first pick that does not (unless O(expect_longest_prefix=false)), and when the EPP picks
    an endpoint that is none of O(engines), answers the request itself, or cannot be reached.
  - The EPP handles each request as any other up to the pick, so plugins that record a pick at routing time (the
    approximate producer, speculative indexing) record these ones too. Nothing is sent to an engine but C(/tokenize),
    C(/v1/models) and C(/metrics) reads.
  - Prompts and token ids stay inside the module; the result carries counts and endpoint addresses only.
  - "An engine whose KV-event sequence starts again while the module listens restarted in place (same pod, same
    address). The module's index forgets its blocks; the EPP v0.9.0's does not: llm-d-kv-cache v0.9.0 reads the sequence
    number only to log it and forgets a pod's blocks only on AllBlocksCleared, which vLLM does not send when it starts.
    The engine is named in RV(restarted_engines), the module warns in one sentence (replace the pod rather than restart
    its container), and a pick of that engine that misses the longest prefix fails with a sentence that says so.
    A restart before the module started listening is not seen."
author:
  - inference_cache maintainers (@inference-cache)
extends_documentation_fragment:
  - inference_cache.substrate._attributes
  - inference_cache.substrate._attributes.CHECK
  - inference_cache.substrate._engines.EPP_ROUTE
options:
  epp:
    description: The EPP's ext_proc service.
    type: dict
    required: true
    suboptions:
      address:
        description:
          - C(host:port) of the EPP's ext_proc gRPC service (C(--grpc-port), 9002 by default; in a cluster the EPP
            Service, for example C(inference-cache-router-epp.inference-cache.svc.cluster.local:9002)).
        type: str
        required: true
      tls:
        description:
          - Speak TLS. The EPP serves TLS unless it runs with C(--secure-serving=false) (the router role's
            C(router_epp_secure_serving)).
        type: bool
        default: false
      validate_certs:
        description:
          - Verify the EPP's certificate. The EPP's own certificate is self-signed with no name; set V(false) for it,
            or give O(epp.ca_path) and O(epp.server_name) for a certificate of your own.
        type: bool
        default: true
      ca_path:
        description: PEM file of the certificate authorities to trust instead of the system's.
        type: path
      client_cert:
        description: PEM file of a client certificate (it may hold the key too) for an EPP that requires mutual TLS.
        type: path
      client_key:
        description: PEM file of the private key of O(epp.client_cert).
        type: path
      server_name:
        description: The name to verify the certificate against (default the host of O(epp.address)).
        type: str
      path:
        description: The request path the EPP sees (the OpenAI completions API).
        type: str
        default: /v1/completions
      headers:
        description: Headers sent with every request (for example C(x-llm-d-inference-objective)).
        type: dict
        default: {}
  requests:
    description: The requests to route, one after the other.
    type: list
    elements: dict
    required: true
    suboptions:
      prompt:
        description: The prompt (sent to the EPP in a C(/v1/completions) body with O(model) and O(max_tokens)).
        type: str
        required: true
      name:
        description: Name of the request in the results (default its position).
        type: str
      headers:
        description: Headers of this request, added to O(epp.headers).
        type: dict
        default: {}
  model:
    description: Model name to send. Defaults to the first model the first engine lists at C(/v1/models).
    type: str
  max_tokens:
    description: C(max_tokens) of the request bodies.
    type: int
    default: 1
  expect_longest_prefix:
    description: Fail when a pick does not hold the longest cached prefix; V(false) only reports it.
    type: bool
    default: true
  send_to_pick:
    description:
      - Send each request on to the engine the EPP picked, as the Gateway would, and record the cached tokens the engine
        reports for it (C(picks[].cached_tokens), and whether the KV-block index predicted them, C(picks[].index_exact));
        the engine's KV events reach the index before the next request is routed.
      - An EPP that learns a prefix from its own picks (an approximate prefix-cache scorer, the Gateway API Inference
        Extension's) is then warmed by the requests themselves, and its later picks are held against what its earlier
        ones left in the engines' caches. V(false) asks for the picks only; nothing reaches an engine.
    type: bool
    default: false
  settle:
    description: Seconds every event stream must be quiet before a request is routed (the EPP reads the same events).
    type: float
    default: 1.0
  event_wait:
    description:
      - Seconds to wait for the engines' streams to connect (twice this, at least 2), and for the first KV event after
        a caller's warm-up traffic.
    type: float
    default: 5.0
  timeout:
    description: Most seconds for the whole check.
    type: float
    default: 120
  request_timeout:
    description: Timeout in seconds of each HTTP request to an engine and of each question to the EPP.
    type: float
    default: 30
notes:
  - Needs the Python libraries C(grpcio), C(xds-protos) (Envoy's data-plane API), C(pyzmq) and C(msgspec) where the
    module runs.
  - Runs the engines' events through the same index as M(inference_cache.substrate.kv_index_check); with a replay
    endpoint per engine it starts from what the engine holds, otherwise from what it publishes once the module listens.
seealso:
  - module: inference_cache.substrate.kv_index_check
  - module: inference_cache.substrate.epp_config_check
"""

EXAMPLES = r"""
- name: The EPP's pick holds the longest cached prefix (two local engines, an EPP on loopback)
  inference_cache.substrate.epp_route_check:
    epp:
      address: 127.0.0.1:9002
    engines:
      - url: http://127.0.0.1:8400
        endpoint: tcp://127.0.0.1:5800
        replay_endpoint: tcp://127.0.0.1:5801
        topic: kv@127.0.0.1:8400@tiny
      - url: http://127.0.0.2:8401
        endpoint: tcp://127.0.0.2:5800
        replay_endpoint: tcp://127.0.0.2:5801
        topic: kv@127.0.0.2:8401@tiny
    requests:
      - prompt: "{{ shared_prefix }} What is the capital of France?"
"""

RETURN = r"""
requests:
  description: Requests routed.
  returned: always
  type: int
  sample: 2
holds_longest:
  description: Picks that held the longest cached prefix of their request (ties included).
  returned: always
  type: int
  sample: 2
warm_requests:
  description: Requests of which some engine held part as a cached prefix.
  returned: always
  type: int
  sample: 1
warm_holds_longest:
  description: Of RV(warm_requests), the picks that held the longest cached prefix.
  returned: always
  type: int
  sample: 1
sent:
  description: Requests sent on to the picked engine (O(send_to_pick)).
  returned: always
  type: int
  sample: 3
sent_cached_tokens:
  description: The cached tokens the picked engines reported for the requests sent on, together.
  returned: always
  type: int
  sample: 576
index_exact:
  description: Of RV(sent), the requests whose cached tokens the KV-block index predicted exactly.
  returned: always
  type: int
  sample: 3
picks:
  description:
    - Per request, the EPP's pick (C(picked), its address; C(engine), its name), the cached tokens the index predicted
      on each engine (C(predicted)), the engines holding the most (C(longest), C(longest_tokens)) and C(holds_longest).
    - With O(send_to_pick), also the engine's C(cached_tokens) and C(prompt_tokens) for it and C(index_exact).
  returned: always
  type: list
  elements: dict
  sample: [{request: 0, picked: "127.0.0.1:8400", engine: "127.0.0.1:8400", predicted: {"127.0.0.1:8400": 96, "127.0.0.2:8401": 0},
            longest: ["127.0.0.1:8400"], longest_tokens: 96, holds_longest: true}]
engines:
  description: Per engine, its address, the KV-event batches applied, the blocks the index holds for it and its restarts.
  returned: always
  type: dict
  sample: {"127.0.0.1:8400": {address: "127.0.0.1:8400", batches: 12, held_blocks: 40, restarts: 0}}
restarted_engines:
  description:
    - The engines whose KV-event sequence started again while the module listened (restarted in place), sorted.
  returned: always
  type: list
  elements: str
  sample: []
restart_warning:
  description:
    - The one sentence the module also warns with when RV(restarted_engines) is not empty (null otherwise).
  returned: always
  type: str
  sample: "Engine 127.0.0.1:8400 restarted in place during the check (its KV-event sequence started again); llm-d-kv-cache
    v0.9.0 keeps a restarted engine's old blocks until the pod is replaced, so a precise llm-d EPP may route to blocks that
    engine no longer holds: replace the pod (delete it so its Deployment creates a new one with a new address) rather than
    restart its container."
model:
  description: The model sent.
  returned: always
  type: str
  sample: tiny
block_size:
  description: The engines' block size (from C(vllm:cache_config_info)).
  returned: always
  type: int
  sample: 16
epp:
  description: The EPP's ext_proc address.
  returned: always
  type: str
  sample: 127.0.0.1:9002
summary:
  description: One line on the picks.
  returned: always
  type: str
  sample: the EPP's pick held the longest cached prefix on 2 of 2 requests (1 of 1 where an engine held part of the prompt)
"""

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.module import run_module
from ansible_collections.inference_cache.substrate.plugins.module_utils.epp.extproc import EXTPROC_IMPORT_ERROR, HAS_EXTPROC
from ansible_collections.inference_cache.substrate.plugins.module_utils.epp.route_check import OPTIONS, RouteCheck
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.consumer import HAS_ZMQ, ZMQ_IMPORT_ERROR
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.events import HAS_MSGSPEC, MSGSPEC_IMPORT_ERROR


def run(params, module):  # pylint: disable=unused-argument
    return RouteCheck(params).run()


def main():
    run_module(OPTIONS, run, requirements=[("grpcio and xds-protos", HAS_EXTPROC, EXTPROC_IMPORT_ERROR), ("pyzmq", HAS_ZMQ, ZMQ_IMPORT_ERROR),
                                           ("msgspec", HAS_MSGSPEC, MSGSPEC_IMPORT_ERROR)],
               facts=lambda params: RouteCheck(params).facts(), warn_facts=("restart_warning",))


if __name__ == "__main__":
    main()
