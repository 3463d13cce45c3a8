#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""How long ``make verify`` takes on a warm engine, and where the time goes.

Runs ``make verify`` (playbooks/verify.yml on the local default) ``--runs`` times against the engine that is already up
(``make site`` first), each run timed as a whole process (what a person waits for), and the tasks of the last one by the
collection's callback ``inference_cache.substrate.timings``. Prints the minimum, median and maximum, the slowest tasks
and the load average at the start; fails when a run fails, or, with ``--limit``, when the median is over it.

  .venv/bin/python benchmarks/bench_verify.py [--runs 5] [--limit 5] [--json] [-- more ansible-playbook args]
"""

from __future__ import absolute_import, division, print_function

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_once(extra, timings=None):
    """One ``make verify``: (seconds, return code, output)."""
    env = dict(os.environ)
    args = ""
    if extra:
        args = " ".join(extra)
    if timings:
        env.update(ANSIBLE_CALLBACKS_ENABLED="inference_cache.substrate.timings", INFERENCE_CACHE_TIMINGS_PATH=timings)
    command = ["make", "--no-print-directory", "verify"]
    if args:
        command = ["make", "--no-print-directory", "--eval", "verify-bench: setup ; $(BIN)/ansible-playbook -i inventories/local "
                   "playbooks/verify.yml " + args, "verify-bench"]
    start = time.monotonic()
    proc = subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, check=False)
    return time.monotonic() - start, proc.returncode, proc.stdout


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of make verify (default 5)")
    parser.add_argument("--limit", type=float, default=0.0, help="fail when the median is over this many seconds")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("extra", nargs="*", help="more ansible-playbook arguments (after --)")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    seconds = []
    folder = tempfile.mkdtemp(prefix="bench-verify-")
    timings = os.path.join(folder, "timings.json")
    try:
        for index in range(args.runs):
            took, code, output = run_once(args.extra, timings if index == args.runs - 1 else None)
            if code != 0:
                print("make verify failed (exit %d):\n%s" % (code, output[-3000:]))
                return 1
            seconds.append(took)
        with open(timings) as handle:
            recorded = json.load(handle)
    finally:
        for name in os.listdir(folder):
            os.remove(os.path.join(folder, name))
        os.rmdir(folder)
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
