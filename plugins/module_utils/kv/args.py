# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""The option table of a KV-event stream connection (``common/options.py``: argument spec and validation in one).

One source of truth, documented by the ``inference_cache.substrate.kv_events`` doc fragment
(``plugins/doc_fragments/kv_events.py``): keep the two in lock-step. ``ENDPOINT_SHAPE`` and ``URL_SHAPE`` are the
shapes every KV check gives its ZMQ endpoints and its OpenAI-compatible servers.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

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
