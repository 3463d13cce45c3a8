# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""Argument dict for a KV-event stream connection.

One source of truth, documented by the ``inference_cache.substrate.kv_events`` doc fragment
(``plugins/doc_fragments/kv_events.py``): keep the two in lock-step.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

KV_STREAM_ARG_SPEC = {
    "endpoint": {"type": "str", "required": True},
    "socket_mode": {"type": "str", "default": "connect", "choices": ["connect", "bind"]},
    "topic": {"type": "str", "default": ""},
    "engine": {"type": "str", "default": "auto", "choices": ["auto", "vllm", "sglang"]},
    "data_parallel_size": {"type": "int", "default": 1},
    "replay_endpoint": {"type": "str"},
    "timeout": {"type": "float", "default": 30.0},
}

# Inclusive ranges (low, high, integer?) of the numeric options above, checked before any socket opens.
# data_parallel_size: each rank costs a SUB socket, its monitor and a replay socket; vLLM's largest data-parallel
# deployments stay far below 64 ranks per engine.
LIMITS = {
    "data_parallel_size": (1, 64, True),
    "timeout": (0.0, 86400.0, False),
}
