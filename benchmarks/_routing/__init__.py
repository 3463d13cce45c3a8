# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The routing benchmark's parts (benchmarks/bench_routing.py is their entry point; the fleet study is benchmarks/fleet/).

* ``workloads``: the named workloads of the closed-loop bench (tenants, follow-ups, bursts, resets...), built per seed
  behind a per-configuration tag;
* ``policies``: the stand-in router's policies (precise, precise-speculative, approximate, load-only, random): scores
  and the pick;
* ``runner``: ``RoutingBench``, the collection's live KV-block index (``kv/live_index.LiveIndex``) and engines
  (``kv/engines.py``) driving requests to ONE engine each;
* ``lanes``: the real EPPs (the llm-d EPP with file discovery and KV relays; the GIE EPP over the InferencePool of the kwok
  cluster the benchmark's playbook started), which EPPs run and with which configurations;
* ``report``: the printed tables and the study folder (``benchmarks/_study_report.py``, plots by ``plots``);
* ``simkeys``: a simulated engine's tokens and block keys (the fleet study and bench_kv_scale.py).

The collection's Python is imported by its full name, made importable by its one loader (``benchmarks/_lab.py`` runs it);
``module_utils(name)`` is that loader's, for the parts that load a module by its dotted name.
"""

from __future__ import absolute_import, division, print_function

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARKS = os.path.join(ROOT, "benchmarks")
if BENCHMARKS not in sys.path:
    sys.path.insert(0, BENCHMARKS)
_LOADER_SPEC = importlib.util.spec_from_file_location(
    "inference_cache_substrate_loader", os.path.join(ROOT, "plugins", "module_utils", "_loader.py"))
_LOADER = importlib.util.module_from_spec(_LOADER_SPEC)
_LOADER_SPEC.loader.exec_module(_LOADER)
module_utils = _LOADER.module_utils
