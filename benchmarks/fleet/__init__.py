# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The fleet study: when precise prefix-cache routing pays over approximate, on a fleet of simulated engines in the regime of
llm-d's blog "KV-Cache Wins You Can See" (docs/routing-study/fleet.md is its report).

* ``workload``: the blog's workload scaled to the fleet (prefix groups, users, a unique suffix per request, a warm-up and a
  Poisson ramp), and the compulsory-miss bound of each request;
* ``policies``: the routers' scorers and pickers as they score at their pins (GIE v1.4.0's queue, kv-cache-utilization and
  prefix-cache scorers and its max-score picker; llm-d v0.9.0's precise configuration; load-only; random) and an oracle
  heuristic;
* ``engines``: the simulated engines (an engines file of roles/simulated_engine), a keep-alive HTTP client, each engine's
  true cache from its KV events;
* ``run``: one configuration (a policy, a seed) over the fleet: caches reset, warm-up, ramp, every request recorded;
* ``report``: per step and policy the metrics, the sustained rate, the tables and the plots (matplotlib).

``benchmarks/bench_fleet.py`` is the entry point; ``benchmarks/fleet/study.yml`` the playbook that sets the fleet up through
the collection's roles, runs it, and tears everything down. ``module_utils(name)`` loads the collection's
``plugins/module_utils/<name>.py`` by its dotted name (the collection's one loader, ``plugins/module_utils/_loader.py``,
through ``benchmarks/_routing``).
"""

from __future__ import absolute_import, division, print_function

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARKS = os.path.join(ROOT, "benchmarks")
if BENCHMARKS not in sys.path:
    sys.path.insert(0, BENCHMARKS)
import _lab  # noqa: E402,F401  pylint: disable=wrong-import-position,unused-import
from _routing import module_utils  # noqa: E402,F401  pylint: disable=wrong-import-position,unused-import
