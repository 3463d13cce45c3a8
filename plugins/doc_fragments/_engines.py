# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""The ``engines`` option of the checks over several engines: each engine's OpenAI-compatible server, with the HTTP
options of the ``_http`` fragment, and its KV-event stream.

Ansible merges a fragment's options at the top level only (a module that documents ``engines`` itself replaces the
fragment's whole), so each variant of the option is one attribute here, built from the same pieces:

* ``DOCUMENTATION``: the shared suboptions, paired with ``module_utils/kv/args.py`` ``ENGINE_ARG_SPEC``;
* ``KV_INDEX``: those and ``withhold_after`` (``kv_index_check``, ``module_utils/kv/index_check.py`` ``ENGINE_SPEC``);
* ``EPP_ROUTE``: those and ``address`` (``epp_route_check``, ``module_utils/epp/route_check.py`` ``ROUTE_ENGINE_SPEC``).

tests/unit/plugins/doc_fragments/test_fragments.py holds each against its spec. The attributes are set after the
class, from the text below, because ansible-test's yamllint reads a fragment class's attributes as string literals.
"""

from ._http import http_suboptions

_ENGINES = r"""
options:
  engines:
    description: The engines, each with its HTTP server and its KV-event stream. All must run the same block size.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description:
          - Name used in the results. Defaults to the pod id of O(engines[].topic) (C(host:port)), else the host and port
            of O(engines[].url).
        type: str
      url:
        description: Base URL of the engine's OpenAI-compatible server, without C(/v1).
        type: str
        required: true
      endpoint:
        description: The engine's KV-event ZMQ endpoint (C(tcp://HOST:PORT)).
        type: str
        required: true
      socket_mode:
        description:
          - V(connect) when the engine binds its endpoint (vLLM binds endpoints with C(*)), V(bind) when it connects.
        type: str
        choices: [connect, bind]
        default: connect
      topic:
        description:
          - The engine's KV-event topic, C(kv@<host>:<port>@<model>) as the router identifies engines, or a prefix of it
            (ZMQ topics match by prefix). Messages under another topic are counted, not indexed. Empty accepts every topic.
        type: str
      replay_endpoint:
        description:
          - The engine's replay endpoint. Used at the start to load the engine's buffered history from seq 0 and to
            repair gaps.
        type: str
"""

_WITHHOLD_AFTER = r"""      withhold_after:
        description:
          - Fault injection. Stop reading this engine's events after that many requests of the whole workload, as a
            router that stopped hearing the engine; the check must then fail.
        type: int
"""

_ADDRESS = r"""      address:
        description:
          - C(host:port) the EPP knows this endpoint by (the pod IP and the engine's port). Defaults to the host and port
            of O(engines[].url).
        type: str
"""


class ModuleDocFragment(object):
    """The ``engines`` option; DOCUMENTATION, KV_INDEX and EPP_ROUTE are set below (see the module docstring)."""


ModuleDocFragment.DOCUMENTATION = _ENGINES + http_suboptions("engines[]")
ModuleDocFragment.KV_INDEX = ModuleDocFragment.DOCUMENTATION + _WITHHOLD_AFTER
ModuleDocFragment.EPP_ROUTE = ModuleDocFragment.DOCUMENTATION + _ADDRESS
