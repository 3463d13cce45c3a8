# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""benchmarks/bench_kv_scale.py without a fleet: its verdict from the checkers' figures, its sentence without a fleet, and
the truth it keeps (each engine's own block hashes, ``benchmarks/fleet/engines.Truth``).

The runs over a fleet of simulated engines are ``make bench-kv-scale``.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from fleet import engines  # noqa: E402  pylint: disable=wrong-import-position


class _Event:
    def __init__(self, kind, hashes=()):
        self.type = kind
        self.block_hashes = list(hashes)


def test_the_truth_is_the_engines_own_hashes_whatever_the_eviction_order():
    truth = engines.Truth()
    truth.apply("a", _Event("BlockStored", [1, 2, 3]))
    assert truth.leading("a", [1, 2, 3, 4]) == 3 and truth.anywhere("a", [1, 2, 3, 4]) == 3
    truth.apply("a", _Event("BlockRemoved", [1]))   # the simulator evicts a parent before its child (llm-d-inference-sim#704)
    assert truth.leading("a", [1, 2, 3]) == 0 and truth.anywhere("a", [1, 2, 3]) == 2
    truth.apply("a", _Event("AllBlocksCleared"))
    assert truth.anywhere("a", [2, 3]) == 0 and truth.leading("b", [1]) == 0


def _scale_result(gaps, restarted=("scale-3",), truth_exact=64, noticed=1):
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    engines = dict(("scale-%d" % i, {"batches": 100, "events": 300, "gaps": [], "unrepaired": 0, "restarts": 0, "malformed": 0,
                                     "failure": None}) for i in range(4))
    engines["scale-3"].update(gaps=gaps, restarts=noticed)
    return {"engines": 4, "seconds": 60.0, "requests": 2400, "failed": 120, "errors": {"500": 80, "429": 40}, "bursts": 3,
            "restarted": [{"engine": e, "rc": 0} for e in restarted],
            "events_check": {"engines": engines, "cpu_s": 3.0, "rss_kib": 60000},
            "index": {"batches": 400, "events": 1200, "gaps": [], "restarts": [{}], "cpu_s": 1.2, "rss_kib": 50000, "rss_start_kib": 40000,
                      "rss_max_kib": 51000, "probes": 64, "truth_exact": truth_exact, "index_exact": 60, "failed": 0}}


def test_the_scale_verdict_counts_lost_batches_but_not_the_simulators_numbering():
    import bench_kv_scale  # pylint: disable=import-outside-toplevel,import-error
    numbering = [{"start": 0, "end": 0, "missing": 1, "repaired": False}]   # after a restart: the simulator starts at 1
    lines, ok = bench_kv_scale.fleet_figures(_scale_result(numbering))
    assert ok and "batches lost 0 (plus 1 gaps of batch 0 after a restart" in lines[1] and "restarts noticed 1/1" in lines[1]
    assert "probes 64: truth exact 64, request-key index exact 60" in lines[2]
    _lines, ok = bench_kv_scale.fleet_figures(_scale_result([{"start": 5, "end": 7, "missing": 3, "repaired": False}]))
    assert not ok
    _lines, ok = bench_kv_scale.fleet_figures(_scale_result(numbering, restarted=()))   # no restart: batch 0 was lost
    assert not ok
    _lines, ok = bench_kv_scale.fleet_figures(_scale_result([], truth_exact=63))
    assert not ok
    _lines, ok = bench_kv_scale.fleet_figures(_scale_result([], noticed=0))
    assert not ok
    result = _scale_result(numbering)
    result["events_check"]["engines"]["scale-3"]["failure"] = "1 sequence gap left 1 batch missing (first in stream x, seq 0-0); ..."
    lines, ok = bench_kv_scale.fleet_figures(result)
    assert ok and lines[-1].endswith("(each the simulator's numbering after a restart)")
    result["events_check"]["engines"]["scale-1"]["failure"] = "No KV event arrived."
    _lines, ok = bench_kv_scale.fleet_figures(result)
    assert not ok


def test_the_scale_benchmark_without_a_fleet_skips_and_says_so():
    script = os.path.join(ROOT, "benchmarks", "bench_kv_scale.py")
    run = subprocess.run([sys.executable, script], capture_output=True, text=True, check=False, timeout=120)
    assert run.returncode == 0 and run.stdout.startswith("bench_kv_scale: fleet part skipped: no fleet (--engines-file)"), run.stdout
    run = subprocess.run([sys.executable, script, "--require"], capture_output=True, text=True, check=False, timeout=120)
    assert run.returncode == 1 and "fleet part failed: no fleet" in run.stdout, run.stdout
