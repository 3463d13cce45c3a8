# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The routing benchmark's parts (benchmarks/bench_routing.py is their entry point; the fleet study is benchmarks/fleet/).

* ``workloads``: the named workloads of the closed-loop bench (tenants, follow-ups, bursts, resets...), built per seed
  behind a per-configuration tag;
* ``policies``: the stand-in router's policies (precise, precise-speculative, approximate, load-only, random): scores
  and the pick;
* ``runner``: ``RoutingBench``, kv_index_check's subscriptions and index driving requests to ONE engine each;
* ``lanes``: the real EPPs (the llm-d EPP with file discovery and KV relays; the GIE EPP over a kwok cluster's
  InferencePool), which EPPs run and with which configurations;
* ``report``: the printed tables and the study folder (``benchmarks/_study_report.py``, plots by ``plots``);
* ``simkeys``: a simulated engine's tokens and block keys (the fleet study and bench_kv_scale.py).

``module_utils(name)`` loads the collection's ``plugins/module_utils/<name>.py`` (tools/_loader.py).
"""

from __future__ import absolute_import, division, print_function

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARKS = os.path.join(ROOT, "benchmarks")
for _path in (os.path.join(ROOT, "tools"), BENCHMARKS):
    if _path not in sys.path:
        sys.path.insert(0, _path)
from _loader import module_utils  # noqa: E402,F401  pylint: disable=wrong-import-position,unused-import
