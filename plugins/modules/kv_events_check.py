#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

DOCUMENTATION = r"""
module: kv_events_check
short_description: Verify that an inference engine publishes KV-cache events over ZMQ
version_added: 0.1.0
description:
  - Subscribes to the KV-cache event stream of vLLM or SGLang (ZMQ PUB/SUB, frames C([topic, seq, msgpack batch])),
    decodes every wire dialect (vLLM map-encoded events from 0.24 on, positional arrays before, SGLang arrays,
    integer or byte block hashes) and reports what arrived.
  - Tracks sequence numbers per topic and data-parallel rank, detects gaps and engine restarts, and repairs gaps
    through the engine's replay ROUTER endpoint when O(replay_endpoint) is set, including the tail of a burst
    (batches after the last one that arrived, dropped at the publisher's high-water mark).
  - Every option is checked (types, ranges, endpoint and URL shapes) before anything is opened; a wrong one fails
    with one sentence that names it. Frames larger than 64 MiB are refused, and at most 256 topics are tracked.
  - Optionally sends one completion request (O(trigger)) once the subscription is live, so the events it causes
    are not lost to the ZMQ slow-joiner effect.
  - Stops as soon as the expectations are met and the stream was quiet for O(settle) seconds, or fails after O(timeout).
  - Token ids never leave the module unless O(include_token_ids=true); prompts are never returned or captured.
author:
  - inference_cache.substrate contributors (@inference-cache)
requirements:
  - pyzmq >= 25.0
  - msgspec >= 0.18
extends_documentation_fragment:
  - inference_cache.substrate.kv_events
  - inference_cache.substrate.kv_events.TRIGGER
  - inference_cache.substrate._attributes
  - inference_cache.substrate._attributes.CHECK
attributes:
  check_mode:
    details:
      - Check mode runs the same read-only check, including the O(trigger) request (it changes no managed state,
        it only warms the engine's prefix cache); O(capture_path) is not written in check mode.
options:
  expect:
    description:
      - Minimum number of events per type, keyed by V(BlockStored), V(BlockRemoved) or V(AllBlocksCleared)
        (each between V(0) and V(1000000000)).
      - V({}) only requires that at least one batch arrives.
    type: dict
    default: {BlockStored: 1}
  expect_removed_after_stored:
    description:
      - Also require a V(BlockRemoved) event for a block hash that a V(BlockStored) event announced during the check
        (an eviction observed end to end).
    type: bool
    default: false
  settle:
    description:
      - Once the expectations are met, keep listening until no message arrived for this many seconds, then stop.
      - V(0) stops as soon as the expectations are met. At most V(3600).
    type: float
    default: 1.0
  capture_path:
    description:
      - Write every received event as one JSON line (metadata only, token ids only with O(include_token_ids)) to this
        path on the managed host.
    type: path
  include_token_ids:
    description:
      - Opt in to decoding token ids (returned in O(capture_path) lines). Off by default so that prompt content
        never leaves the decoder; RV(sample) never contains them.
    type: bool
    default: false
  router_version:
    description:
      - Hold every batch (the first 1000) against the KV-event decoder of this llm-d router version, the one a precise
        prefix-cache router runs (C(v0.9.0) decodes with llm-d-kv-cache v0.9.0's vLLM adapter, whatever the engine).
      - That decoder drops a whole batch when one event does not fit it, silently; RV(router_decoder) counts such batches
        and names the first problem. V(none) skips this.
    type: str
    default: v0.9.0
    choices: [v0.9.0, none]
  expect_router_decodes:
    description:
      - Fail when the router of O(router_version) would drop any batch checked. Off by default, when the module only
        reports it (with a warning).
    type: bool
    default: false
notes:
  - vLLM binds its endpoint only when it contains V(*) or V(::); for any other address, such as V(tcp://127.0.0.1:5557),
    it connects and this module must use O(socket_mode=bind).
  - Reused prefix blocks are not re-announced by vLLM; a repeated prompt may cause no new V(BlockStored).
seealso:
  - name: vLLM KV events subscriber example
    description: The reference subscriber in the vLLM repository.
    link: https://github.com/vllm-project/vllm/tree/main/examples
"""

EXAMPLES = r"""
- name: Check the local vLLM engine (it connects to tcp://127.0.0.1:5557, so bind)
  inference_cache.substrate.kv_events_check:
    endpoint: tcp://127.0.0.1:5557
    socket_mode: bind
    topic: kv-events
    replay_endpoint: tcp://127.0.0.1:5558
    trigger:
      url: http://127.0.0.1:8011
      model: tiny
    timeout: 60
  register: kv

- name: Check an engine that binds tcp://*:5557, with two data-parallel ranks, and require an eviction
  inference_cache.substrate.kv_events_check:
    endpoint: tcp://10.0.0.5:5557
    data_parallel_size: 2
    topic: "kv@"
    expect:
      BlockStored: 1
      BlockRemoved: 1
    expect_removed_after_stored: true
"""

RETURN = r"""
counts:
  description: Events received per type.
  returned: always
  type: dict
  sample: {BlockStored: 3, BlockRemoved: 1, AllBlocksCleared: 0}
batches:
  description: Batches (messages) decoded, live and replayed.
  returned: always
  type: int
  sample: 4
seq:
  description: First and last sequence number (replayed ones included) and the number of batches that arrived live, per stream, keyed C(<topic>#<rank>).
  returned: always
  type: dict
  sample: {"kv-events#0": {first: 0, last: 3, batches: 4}}
gaps:
  description:
    - Sequence gaps found, repaired through replay, and left unrepaired (with up to 20 details).
    - C(tail) counts the gaps found at the end of a stream by asking the replay endpoint for everything after the
      last batch seen, and the batches they returned; such a gap has C(tail=true) in the details.
  returned: always
  type: dict
  sample: {found: 1, repaired: 1, unrepaired: 0, details: [], tail: {found: 0, batches: 0}}
restarts:
  description: Engine restarts seen (sequence went back), up to 20.
  returned: always
  type: list
  elements: dict
  sample: []
topics:
  description: Batches per accepted topic.
  returned: always
  type: dict
  sample: {kv-events: 4}
other_topics:
  description: Messages that arrived under topics not matching O(topic).
  returned: always
  type: dict
  sample: {}
ranks:
  description: Data-parallel ranks seen.
  returned: always
  type: list
  elements: int
  sample: [0]
block_size:
  description: Block size announced in V(BlockStored) events; a list if several were seen, null if none.
  returned: always
  type: raw
  sample: 32
stored_blocks:
  description: Number of block hashes announced by V(BlockStored) events.
  returned: always
  type: int
  sample: 45
stored_tokens:
  description: Number of tokens announced by V(BlockStored) events.
  returned: always
  type: int
  sample: 1440
removed_blocks:
  description: Number of block hashes in V(BlockRemoved) events.
  returned: always
  type: int
  sample: 0
removed_after_stored:
  description: Removed block hashes that had been announced as stored during the check.
  returned: always
  type: int
  sample: 0
media:
  description:
    - RV(stored_blocks), RV(stored_tokens), RV(removed_blocks) and RV(block_size) per medium of the events (the cache
      tier; V(unspecified) when an event names none). vLLM names its own cache V(GPU), even on CPU; LMCache's connector
      in vLLM announces the chunks LMCache stored as V(CPU), in chunks of LMCache's chunk size.
  returned: always
  type: dict
  sample:
    GPU: {stored_blocks: 8, stored_tokens: 256, removed_blocks: 0, block_size: 32}
    CPU: {stored_blocks: 4, stored_tokens: 256, removed_blocks: 0, block_size: 64}
wire_format:
  description: Encoding seen (C(batch) array or map, C(events) map or array, C(hashes) int or bytes); a list if mixed.
  returned: always
  type: dict
  sample: {batch: array, events: map, hashes: int}
engine:
  description: Engine dialect detected (V(vllm), V(sglang), V(unknown) when the frames fit both) or forced by O(engine).
  returned: always
  type: str
  sample: vllm
sample:
  description: The first few events, redacted (no token ids, at most 4 hashes each).
  returned: always
  type: list
  elements: dict
  sample: [{type: BlockStored, num_blocks: 45, token_count: 1440, block_size: 32, seq: 0, topic: kv-events, rank: 0}]
malformed:
  description: Number of malformed messages or events and the first reason.
  returned: always
  type: dict
  sample: {count: 0, first_reason: null}
unknown_event_types:
  description: Events of types this module does not know, per type (counted, not fatal).
  returned: always
  type: dict
  sample: {}
elapsed:
  description: Seconds spent.
  returned: always
  type: float
  sample: 1.62
endpoints:
  description: The endpoints subscribed to, one per data-parallel rank.
  returned: always
  type: list
  elements: str
  sample: [tcp://127.0.0.1:5557]
backlog_batches:
  description:
    - With O(socket_mode=bind) and a O(trigger), the batches that arrived before the trigger was sent and are left
      out of the counts. An engine that connects queues its events while nothing is bound and delivers them when
      the checker binds, so they belong to earlier requests.
  returned: always
  type: int
  sample: 2
peer_connected:
  description: Per endpoint, whether a ZMQ peer connected.
  returned: always
  type: list
  elements: bool
  sample: [true]
router_decoder:
  description:
    - The batches held against the KV-event decoder of O(router_version) and how many it would drop. C(first_problem) names
      the batch, the event and the field (never its value).
  returned: always
  type: dict
  sample: {router_version: v0.9.0, decoder: llm-d-kv-cache v0.9.0 vLLM adapter, checked_batches: 12, refused_batches: 0, first_problem: null}
trigger:
  description:
    - The trigger request, if any. C(cached_tokens) comes from C(usage.prompt_tokens_details.cached_tokens) (vLLM
      C(--enable-prompt-tokens-details)) and is null when the server does not report it.
  returned: always
  type: dict
  sample: {sent: true, url: http://127.0.0.1:8011/v1/completions, status: 200, model: tiny, prompt_tokens: 57, cached_tokens: null}
"""


from ansible_collections.inference_cache.substrate.plugins.module_utils.common.module import run_module
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.consumer import HAS_ZMQ, ZMQ_IMPORT_ERROR
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.events import HAS_MSGSPEC, MSGSPEC_IMPORT_ERROR
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.events_check import OPTIONS, KVEventsCheck


def run(params, module):
    facts = KVEventsCheck(params, check_mode=module.check_mode).run()
    router = facts["router_decoder"]
    if router["refused_batches"]:
        module.warn("The llm-d router %s would drop %d of the %d batches checked; first: %s." % (
            router["router_version"], router["refused_batches"], router["checked_batches"], router["first_problem"]))
    return facts


def main():
    # A wrong option fails with the facts this module documents as returned always (counts, gaps, ... at zero).
    run_module(OPTIONS, run, requirements=[("pyzmq", HAS_ZMQ, ZMQ_IMPORT_ERROR), ("msgspec", HAS_MSGSPEC, MSGSPEC_IMPORT_ERROR)],
               facts=lambda params: KVEventsCheck(params).facts())


if __name__ == "__main__":
    main()
