# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""The option tables the KV checks share (``common/options.py``: argument spec and validation in one).

``KV_STREAM_ARG_SPEC``, a KV-event stream connection, is documented by the ``inference_cache.substrate.kv_events`` doc
fragment (``plugins/doc_fragments/kv_events.py``); ``ENGINE_ARG_SPEC``, one entry of the ``engines`` of a check over
several engines, by the ``inference_cache.substrate._engines`` one (``plugins/doc_fragments/_engines.py``). Keep each
pair in lock-step (``tests/unit/plugins/doc_fragments/test_fragments.py`` holds them against each other).
``ENDPOINT_SHAPE`` and ``URL_SHAPE`` are the shapes every KV check gives its ZMQ endpoints and its OpenAI-compatible
servers.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

from ..http.args import HTTP_ARG_SPEC

ENDPOINT_SHAPE = (r"^(tcp|ipc|inproc)://\S+$", "a ZMQ endpoint such as tcp://HOST:PORT, ipc:///PATH or inproc://NAME")
URL_SHAPE = (r"(?i)^https?://[^\s/]+", "an http:// or https:// URL of the OpenAI-compatible server")

KV_STREAM_ARG_SPEC = {
    "endpoint": {"type": "str", "required": True, "shape": ENDPOINT_SHAPE},
    "socket_mode": {"type": "str", "default": "connect", "choices": ["connect", "bind"]},
    "topic": {"type": "str", "default": ""},
    "engine": {"type": "str", "default": "auto", "choices": ["auto", "vllm", "sglang"]},
    # Each rank costs a SUB socket, its monitor and a replay socket; vLLM's largest data-parallel deployments stay
    # far below 64 ranks per engine.
    "data_parallel_size": {"type": "int", "default": 1, "range": (1, 64)},
    "replay_endpoint": {"type": "str", "shape": ENDPOINT_SHAPE},
    "timeout": {"type": "float", "default": 30.0, "range": (0, 86400, "open-low")},
}

# One engine of a check over several engines (kv_index_check, epp_route_check): its OpenAI-compatible server, reached
# with the collection's HTTP options (auth, TLS, proxy, body limit: http/args.py), and its KV-event stream.
ENGINE_ARG_SPEC = dict(HTTP_ARG_SPEC, **{
    "name": {"type": "str"},
    "url": {"type": "str", "required": True, "shape": URL_SHAPE},
    "endpoint": {"type": "str", "required": True, "shape": ENDPOINT_SHAPE},
    "socket_mode": {"type": "str", "default": "connect", "choices": ["connect", "bind"]},
    "topic": {"type": "str"},
    "replay_endpoint": {"type": "str", "shape": ENDPOINT_SHAPE},
})
