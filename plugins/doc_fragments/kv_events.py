# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from ._http import http_suboptions


class ModuleDocFragment(object):

    # Options of a KV-event stream connection; paired with module_utils/kv/args.py KV_STREAM_ARG_SPEC (the option table:
    # types, defaults, choices, ranges and endpoint shapes). Keep the two in step; TRIGGER (below the class) is
    # paired with module_utils/kv/events_check.py TRIGGER_SPEC. tests/unit/plugins/doc_fragments/test_fragments.py
    # holds each against its spec.
    DOCUMENTATION = r"""
options:
  endpoint:
    description:
      - ZMQ endpoint of the engine's KV-event publisher, for example V(tcp://10.0.0.5:5557) or V(tcp://*:5557); a
        C(tcp://), C(ipc://) or C(inproc://) endpoint.
      - With O(socket_mode=connect) this is the address the engine binds; with O(socket_mode=bind) the local
        address the engine connects to.
    type: str
    required: true
  socket_mode:
    description:
      - Which side binds. V(connect) when the engine binds (vLLM binds endpoints that contain V(*) or V(::),
        for example V(tcp://*:5557)).
      - V(bind) when the engine connects, which vLLM does for every other TCP endpoint, for example
        V(tcp://127.0.0.1:5557) or even V(tcp://0.0.0.0:5557). The local profile of this collection uses V(bind).
      - If both sides connect (or both bind) nothing flows; the failure message says which side should bind.
    type: str
    choices: [connect, bind]
    default: connect
  topic:
    description:
      - Topic prefix to accept (ZMQ SUB semantics, a byte-prefix match). V("") accepts every topic.
      - Messages under other topics are counted, so a mismatch is named in the failure message.
    type: str
    default: ""
  engine:
    description:
      - Wire dialect. V(auto) detects vLLM or SGLang from the frames; V(sglang) selects the SGLang positional
        field order (C(metadata) after C(medium)).
    type: str
    choices: [auto, vllm, sglang]
    default: auto
  data_parallel_size:
    description:
      - Number of data-parallel ranks. Rank N publishes on the port of O(endpoint) plus N (and its replay
        endpoint on the port of O(replay_endpoint) plus N), as vLLM and SGLang do.
      - Between V(1) and V(64); every rank costs a subscriber socket, its monitor and a replay socket.
    type: int
    default: 1
  replay_endpoint:
    description:
      - ROUTER endpoint of the engine's replay buffer (vLLM C(replay_endpoint)), for example V(tcp://127.0.0.1:5558); a
        C(tcp://), C(ipc://) or C(inproc://) endpoint.
      - When set, sequence gaps are repaired by asking for the missing batches; without it gaps stay unrepaired.
      - When set, the check also asks for everything after the last batch seen on each stream when the stream goes
        quiet with the expectations unmet, and once more before it reports, so a burst whose last batches were
        dropped at the publisher's high-water mark (no later batch reveals that gap) is still counted in full.
    type: str
  timeout:
    description:
      - Seconds to wait, in total (monotonic clock), for connection, events, replay and the trigger request.
      - More than V(0), at most V(86400).
    type: float
    default: 30.0
"""


# The trigger request of a KV-event check, its HTTP options those of the _http fragment. Set after the class because
# ansible-test's yamllint reads a fragment class's attributes as string literals.
_TRIGGER = r"""
options:
  trigger:
    description:
      - Send one completion request to an OpenAI-compatible server after the subscription is live (after the peer
        connected, plus O(trigger.delay)), to make the engine publish events.
    type: dict
    suboptions:
      url:
        description: Base URL of the OpenAI-compatible server, for example V(http://127.0.0.1:8000) (C(/v1) is added if missing).
        type: str
        required: true
      model:
        description: Model name for the request; when omitted the first model of C(/v1/models) is used.
        type: str
      prompt:
        description:
          - Prompt text; make it longer than one KV block (for example more than 16 or 32 tokens) or no block is stored.
          - Never returned or captured.
          - When omitted, a built-in English prompt of about 100 tokens is used.
        type: str
      max_tokens:
        description: Tokens to generate, between V(1) and V(1000000).
        type: int
        default: 1
      headers:
        description: Extra HTTP headers.
        type: dict
        default: {}
      delay:
        description: Seconds to wait after the peer connected before sending, so the subscription has propagated (at most V(3600)).
        type: float
        default: 0.5
"""
ModuleDocFragment.TRIGGER = _TRIGGER + http_suboptions("trigger")
