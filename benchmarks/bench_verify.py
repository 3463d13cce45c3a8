#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""How long ``make verify`` takes on a warm engine, and where the time goes.

Runs ``playbooks/verify.yml`` on the local default (what ``make verify`` runs, without make: its ``setup`` step costs
about 0.1 s once the toolchain is there) ``--runs`` times against the engine that is already up (``make site`` first),
each run timed as a whole process (what a person waits for), and the tasks of every run by the collection's callback
``inference_cache.substrate.timings``. Prints the minimum, median and maximum, the median of each task over the runs (the
slowest first) and the load average at the start; fails when a run fails, or, with ``--limit``, when the median is
over it.

  .venv/bin/python benchmarks/bench_verify.py [--runs 5] [--limit 3] [--json] [-- more ansible-playbook args]
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
BIN = os.path.join(ROOT, ".venv", "bin")


def environment(timings=None):
    """What the Makefile exports for its ansible commands (ANSIBLE_CONFIG, the async folder, no colours)."""
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", PY_COLORS="0",
               NO_COLOR="1", PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    env.setdefault("ANSIBLE_ASYNC_DIR", os.path.join(os.path.expanduser("~"), ".ansible_async"))
    if timings:
        env.update(ANSIBLE_CALLBACKS_ENABLED="inference_cache.substrate.timings", INFERENCE_CACHE_TIMINGS_PATH=timings)
    return env


def run_once(extra, timings=None):
    """One run of playbooks/verify.yml on inventories/local: (seconds, return code, output)."""
    command = [os.path.join(BIN, "ansible-playbook"), "-i", "inventories/local", "playbooks/verify.yml"] + list(extra or [])
    start = time.monotonic()
    proc = subprocess.run(command, cwd=ROOT, env=environment(timings), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, check=False)
    return time.monotonic() - start, proc.returncode, proc.stdout


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of playbooks/verify.yml (default 5)")
    parser.add_argument("--limit", type=float, default=0.0, help="fail when the median is over this many seconds")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("extra", nargs="*", help="more ansible-playbook arguments (after --)")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    seconds, per_task, plays = [], {}, []
    folder = tempfile.mkdtemp(prefix="bench-verify-")
    timings = os.path.join(folder, "timings.json")
    try:
        for dummy in range(args.runs):
            took, code, output = run_once(args.extra, timings)
            if code != 0:
                print("playbooks/verify.yml failed (exit %d):\n%s" % (code, output[-3000:]))
                return 1
            seconds.append(took)
            with open(timings) as handle:
                recorded = json.load(handle)
            plays.append(recorded["elapsed"])
            for task in recorded["tasks"]:
                per_task.setdefault(task["name"], []).append(task["end"] - task["start"])
    finally:
        for name in os.listdir(folder):
            os.remove(os.path.join(folder, name))
        os.rmdir(folder)
    tasks = sorted(((statistics.median(s), name) for name, s in per_task.items()), reverse=True)
    result = {"runs": len(seconds), "min": round(min(seconds), 2), "median": round(statistics.median(seconds), 2),
              "max": round(max(seconds), 2), "load_average": round(load, 2), "play_seconds": round(statistics.median(plays), 2),
              "start_seconds": round(statistics.median(s - p for s, p in zip(seconds, plays)), 2),
              "slowest_tasks": [{"seconds": round(s, 2), "task": name} for s, name in tasks[:8]]}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print("playbooks/verify.yml (make verify) on a warm engine, %d runs (load average %.2f at the start): min %.2f s, "
              "median %.2f s, max %.2f s" % (result["runs"], load, result["min"], result["median"], result["max"]))
        print("median %.2f s inside the play, %.2f s around it (ansible-playbook's start and end); slowest tasks (median):"
              % (result["play_seconds"], result["start_seconds"]))
        for task in result["slowest_tasks"]:
            print("  %5.2f s  %s" % (task["seconds"], task["task"]))
    if args.limit and result["median"] > args.limit:
        print("the median %.2f s is over the limit of %.2f s" % (result["median"], args.limit))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
