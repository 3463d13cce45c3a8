#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""How long ``make verify`` takes on a warm engine, and where the time goes: the report of ``benchmarks/bench_verify.sh``.

``make bench-verify`` runs ``benchmarks/bench_verify.sh``: ``--runs`` runs of playbooks/verify.yml against the engine that is
already up (``make site`` first), each timed as a whole process (what a person waits for) and task by task by the
collection's callback ``inference_cache.substrate.timings`` (``benchmarks/time_playbook.sh``). This script runs no playbook:
it reads what the runs left (``--report FOLDER``) and prints the minimum, median and maximum, the slowest tasks of the last
run and the load average at the start; it fails, with ``--limit``, when the median is over it.

  .venv/bin/python benchmarks/bench_verify.py --report FOLDER [--load L] [--limit 5] [--json]
"""

from __future__ import absolute_import, division, print_function

import argparse
import json
import os
import statistics
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", metavar="FOLDER", required=True, help="what benchmarks/bench_verify.sh's runs left there")
    parser.add_argument("--load", type=float, default=None, help="the load average at the start (default: now)")
    parser.add_argument("--limit", type=float, default=0.0, help="fail when the median is over this many seconds")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args(argv)
    load = args.load if args.load is not None else os.getloadavg()[0]
    with open(os.path.join(args.report, "runs.tsv")) as handle:
        runs = [line.split() for line in handle if line.strip()]
    failed = [r for r in runs if r[1] != "0"]
    if failed or not runs:
        print("make verify failed (exit %s); its output: %s" % (failed[0][1] if failed else "?", os.path.join(args.report, "run-%s.log" % (
            failed[0][0] if failed else 1))))
        return 1
    seconds = [float(r[2]) for r in runs]
    with open(os.path.join(args.report, "run-%s.json" % runs[-1][0])) as handle:
        recorded = json.load(handle)
    tasks = sorted(((t["end"] - t["start"], t["name"]) for t in recorded["tasks"]), reverse=True)
    result = {"runs": len(seconds), "min": round(min(seconds), 2), "median": round(statistics.median(seconds), 2),
              "max": round(max(seconds), 2), "load_average": round(load, 2), "play_seconds": round(recorded["elapsed"], 2),
              "slowest_tasks": [{"seconds": round(s, 2), "task": name} for s, name in tasks[:6]]}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print("make verify on a warm engine, %d runs (load average %.2f at the start): min %.2f s, median %.2f s, max %.2f s"
              % (result["runs"], load, result["min"], result["median"], result["max"]))
        print("last run: %.2f s inside the play; slowest tasks:" % result["play_seconds"])
        for task in result["slowest_tasks"]:
            print("  %5.2f s  %s" % (task["seconds"], task["task"]))
    if args.limit and result["median"] > args.limit:
        print("the median %.2f s is over the limit of %.2f s" % (result["median"], args.limit))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
