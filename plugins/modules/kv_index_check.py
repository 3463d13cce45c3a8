#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

DOCUMENTATION = r"""
module: kv_index_check
short_description: Prove that a KV-block index built from live KV events predicts what every engine has cached
version_added: 0.1.0
description:
  - Subscribes to the KV-event streams of several vLLM engines at once and keeps, per engine, the KV-block index a
    precise prefix-cache router keeps (the semantics of the llm-d KV-block index that llm-d-router v0.9.0 uses
    (llm-d-kv-cache), with one difference, see below).
  - Sends a generated workload of prompt families that share long prefixes to chosen engines. Before each request it
    records what the index predicts each engine has cached of the prompt (tokenized by the engines' C(/tokenize)),
    then sends the request and compares with the C(usage.prompt_tokens_details.cached_tokens) the engine reports
    (vLLM C(--enable-prompt-tokens-details)).
  - "Mirrors what vLLM really caches: full blocks only, and when every full block of a prompt is cached vLLM still
    computes the last token, so the report is min(cached blocks x block size, floor((prompt tokens - 1) / block size)
    x block size) (vllm 0.32.0 C(vllm/v1/core/kv_cache_manager.py))."
  - The index reference-counts the engine's block hashes (BlockStored +1, BlockRemoved -1, gone at 0), because vLLM can
    hold more than one cached block with the same hash and sends a BlockRemoved for each copy. The same index with
    llm-d's uncounted eviction runs beside it; RV(uncounted) says how many of its predictions were wrong.
  - Beside it also runs the approximate predictor of the router's C(approx-prefix-cache-producer) (character blocks,
    routing history, an LRU per engine as large as its C(num_gpu_blocks)); RV(approximate) counts its stale hits
    (it predicted a hit where the engine reported no cached token).
  - Fails with one sentence naming the prompt family, the engine and the predicted and reported counts at the first
    wrong prediction, and when an expectation (O(expect)) is not met.
  - After each request it waits until the engine's KV events show every full block of the prompt held (at most
    O(event_wait) seconds; then, with a replay endpoint, it asks the engine's replay buffer for what followed the last
    batch it applied), so a slow stream delays the check instead of failing it.
  - "Sequence numbers are tracked per engine and data-parallel rank. One that jumps forward is a gap, repaired through
    O(engines[].replay_endpoint). One that starts again means the engine restarted in place (same pod, same address):
    the index forgets what the engine held, the engine is named in RV(restarted_engines), and the module warns in one
    sentence that llm-d-kv-cache v0.9.0, the KV-block index of the llm-d EPP v0.9.0, keeps a restarted engine's old
    blocks until its pod is replaced, so a precise EPP may route to blocks the engine no longer holds; replace the pod
    rather than restart its container."
  - A request to an engine that restarted just before it, whose restart only that request's own events revealed, cannot
    be predicted by any index; it is counted in RV(restart_misses), not as a wrong prediction.
  - Token ids stay inside the module; prompts are generated, never user data.
  - The module changes nothing but the engines' prefix caches, and in check mode it runs the same workload.
author:
  - inference_cache maintainers (@inference-cache)
extends_documentation_fragment:
  - inference_cache.substrate._attributes
  - inference_cache.substrate._attributes.CHECK
  - inference_cache.substrate._engines.KV_INDEX
options:
  model:
    description: Model name to send. Defaults to the first model the first engine lists at C(/v1/models).
    type: str
  workload:
    description: The generated workload (prompt families with a shared preamble and long per-family prefixes).
    type: dict
    default: {}
    suboptions:
      families:
        description: Number of prompt families; family N's home engine is engine N modulo the number of engines.
        type: int
        default: 8
      rounds:
        description: Requests per family.
        type: int
        default: 6
      preamble_words:
        description: Words of the preamble all families share.
        type: int
        default: 10
      prefix_words:
        description: Words of each family's own prefix.
        type: int
        default: 70
      suffix_words:
        description: Most words of a request's own tail after the family's base.
        type: int
        default: 12
      fan_out_every:
        description: Every Nth step goes to every engine, one after the other (0 never).
        type: int
        default: 4
      move_every:
        description: Every Nth step goes to the next engine instead of the family's home (0 never).
        type: int
        default: 7
      repeat_every:
        description: Every Nth step repeats the family's previous prompt (0 never).
        type: int
        default: 5
      prefix_every:
        description:
          - Every Nth step sends a family's base alone (0 only in the first round). The check pads every base to a whole
            number of blocks, so when the base comes again vLLM recomputes its cached last block and holds two blocks
            with the same hash, which llm-d's uncounted eviction loses track of.
        type: int
        default: 3
      seed:
        description: Seed of the generator; the same seed gives the same workload.
        type: int
        default: 0
  expect:
    description: What the run must show besides every prediction being exact.
    type: dict
    default: {}
    suboptions:
      min_requests:
        description: Least number of requests.
        type: int
        default: 50
      min_evictions_per_engine:
        description: Least number of evicted blocks (hashes in BlockRemoved events) per engine.
        type: int
        default: 0
  max_tokens:
    description: Tokens to generate per request.
    type: int
    default: 1
  settle:
    description: Seconds every event stream must be quiet before a prediction.
    type: float
    default: 0.3
  event_wait:
    description:
      - Most seconds to wait for the events of a request that computed new blocks (until they show every full block of
        the prompt held). Nothing is concluded from the time it takes; a longer wait only delays the check.
    type: float
    default: 5.0
  timeout:
    description: Most seconds for the whole check.
    type: float
    default: 600
  request_timeout:
    description: Timeout in seconds of each HTTP request.
    type: float
    default: 60
notes:
  - Needs the Python libraries C(pyzmq) and C(msgspec) where the module runs.
  - Start the engines with a small KV cache (C(--num-gpu-blocks-override)) so that the workload overflows it and
    evictions are part of the proof.
seealso:
  - module: inference_cache.substrate.kv_events_check
  - module: inference_cache.substrate.prefix_cache_check
"""

EXAMPLES = r"""
- name: Two local engines, each connecting to its own event endpoint (the check binds them)
  inference_cache.substrate.kv_index_check:
    engines:
      - name: kvindex-a
        url: http://127.0.0.1:8300
        endpoint: tcp://127.0.0.1:5700
        socket_mode: bind
        replay_endpoint: tcp://127.0.0.1:5701
        topic: kv@127.0.0.1:8300@tiny
      - name: kvindex-b
        url: http://127.0.0.1:8301
        endpoint: tcp://127.0.0.1:5702
        socket_mode: bind
        replay_endpoint: tcp://127.0.0.1:5703
        topic: kv@127.0.0.1:8301@tiny
    expect:
      min_requests: 50
      min_evictions_per_engine: 1
  register: kv_index

- name: Show the side-by-side summary
  ansible.builtin.debug:
    var: kv_index.summary
"""

RETURN = r"""
requests:
  description: Requests sent.
  returned: always
  type: int
  sample: 60
exact:
  description: Requests whose predicted cached tokens equalled the reported ones.
  returned: always
  type: int
  sample: 60
exact_percent:
  description: RV(exact) as a percentage of the requests (null before the first request).
  returned: always
  type: float
  sample: 100.0
largest_error:
  description: Largest difference in tokens between prediction and report.
  returned: always
  type: int
  sample: 0
mismatches:
  description: The wrong predictions (step, family, kind, engine, predicted, reported, prompt_tokens).
  returned: always
  type: list
  elements: dict
  sample: []
block_size:
  description: The engines' block size (from C(vllm:cache_config_info)).
  returned: always
  type: int
  sample: 32
model:
  description: The model sent.
  returned: always
  type: str
  sample: tiny
steps:
  description: Workload steps run (a step sent to every engine counts once).
  returned: always
  type: int
  sample: 48
workload_kinds:
  description: Steps per kind (C(prefix), C(suffix), C(repeat)).
  returned: always
  type: dict
  sample: {prefix: 8, suffix: 31, repeat: 9}
engines:
  description:
    - Per engine, what its stream carried and what the index holds (requests, batches, blocks stored and removed,
      removals of unknown hashes, stores skipped for an unknown parent, clears, restarts, gaps, other topics,
      block size and C(num_gpu_blocks)).
    - C(restart_seqs) lists each restart's data-parallel rank, the last sequence number before it (C(from)) and the
      first after (C(to)), up to 10.
  returned: always
  type: dict
  sample: {kvindex-a: {requests: 30, blocks_removed: 120, held_blocks: 70, restarts: 0}}
restarted_engines:
  description:
    - The engines whose KV-event sequence started again during the check (restarted in place, same address), sorted.
  returned: always
  type: list
  elements: str
  sample: []
restart_warning:
  description:
    - The one sentence the module also warns with when RV(restarted_engines) is not empty (null otherwise).
  returned: always
  type: str
  sample: "Engine kvindex-a restarted in place during the check (its KV-event sequence started again); llm-d-kv-cache v0.9.0
    keeps a restarted engine's old blocks until the pod is replaced, so a precise llm-d EPP may route to blocks that engine
    no longer holds: replace the pod (delete it so its Deployment creates a new one with a new address) rather than restart
    its container."
restart_misses:
  description:
    - Requests to an engine that had restarted in place just before them, predicted above what the engine reported, whose
      restart only their own events revealed; not counted in RV(exact) nor as wrong.
  returned: always
  type: int
  sample: 0
restart_miss_steps:
  description: The first 10 of RV(restart_misses) (step, family, engine, predicted, reported).
  returned: always
  type: list
  elements: dict
  sample: []
routing:
  description:
    - On the steps sent to every engine, how often the engine with the longest predicted prefix (first on ties)
      really reported the most cached tokens, for the precise index, the uncounted one and the approximate predictor.
  returned: always
  type: dict
  sample: {steps_on_every_engine: 12, precise_agrees: 12, uncounted_agrees: 11, approximate_agrees: 8}
uncounted:
  description: The same index with llm-d's uncounted eviction, over the same events and requests.
  returned: always
  type: dict
  sample: {exact: 57, wrong: 3, largest_error: 32}
approximate:
  description:
    - The approximate predictor over the same workload. C(predicted_hits) requests where it predicted a cached prefix
      on the chosen engine, C(stale_hits) those where the engine reported no cached token, C(missed_hits) requests
      with cached tokens it did not predict; its block size in pseudo-tokens and bytes and its LRU size per engine.
  returned: always
  type: dict
  sample: {predicted_hits: 40, stale_hits: 6, missed_hits: 2, block_size_pseudo_tokens: 64, block_size_bytes: 256}
summary:
  description: The results side by side, one line each.
  returned: always
  type: list
  elements: str
  sample: ["precise index (copies counted): 60/60 predictions exact, largest error 0 tokens"]
elapsed:
  description: Seconds spent.
  returned: always
  type: float
  sample: 41.2
"""

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.module import run_module
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.consumer import HAS_ZMQ, ZMQ_IMPORT_ERROR
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.events import HAS_MSGSPEC, MSGSPEC_IMPORT_ERROR
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.index_check import OPTIONS, KVIndexCheck


def run(params, module):  # pylint: disable=unused-argument
    return KVIndexCheck(params).run()


def main():
    run_module(OPTIONS, run, requirements=[("pyzmq", HAS_ZMQ, ZMQ_IMPORT_ERROR), ("msgspec", HAS_MSGSPEC, MSGSPEC_IMPORT_ERROR)],
               facts=lambda params: KVIndexCheck(params).facts(), warn_facts=("restart_warning",))


if __name__ == "__main__":
    main()
