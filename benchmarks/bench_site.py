#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Where the time of a newcomer's first ``make site`` goes: the report of ``benchmarks/bench_site.sh``.

``make bench-site`` runs ``benchmarks/bench_site.sh``: playbooks/site.yml on a fresh HOME, cold then warm, each timed task by
task by the collection's callback plugin ``inference_cache.substrate.timings`` (``benchmarks/time_playbook.sh``), the engine
stopped and the HOME removed at the end. This script runs no playbook: it reads what those runs left (``--report FOLDER``)
and, called between them, the engine's CPU (``--engine-cpu HOME``).

The cold run is split into: install (roles/local_engine/tasks/install.yml; right after an install its check builds the tiny
model too, in a child process beside the imports, so that time shows here), model build (model.yml), engine start (the
local_service task), first verification (the verify role) and the rest (Ansible's own start, facts, the launcher, ...). The
engine's start is split further from its log: the API server's imports, the EngineCore process, the worker process (when
there is one), model and KV cache, the server listening. Beside each phase's seconds, its CPU seconds (user and system):
those of ansible-playbook and the processes it waited for (the callback's), and for the engine start those of the engine's
own processes, read from /proc right after the cold run (the verification's few requests included). A job of an
``async`` task (the vLLM install) is not counted. On a loaded machine the seconds grow with the load and the CPU seconds
much less: compare those. The second run must report ``changed=0`` and take less than ``--warm-limit`` seconds (20).

  .venv/bin/python benchmarks/bench_site.py --report FOLDER --home HOME [--shared-caches UV PIP] [--warm-limit 20] [--json]
  .venv/bin/python benchmarks/bench_site.py --engine-cpu HOME
"""

from __future__ import absolute_import, division, print_function

import argparse
import json
import os
import re
import sys
import time

PHASES = ("install", "model build", "engine start", "first verification", "rest")
RECAP_RE = re.compile(r"changed=(\d+)")
# vLLM's log lines: "(APIServer pid=1) INFO 12-03 07:48:11 [file.py:1] message".
LOG_RE = re.compile(r"^\((\w+)[^)]*\) \w+ (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d) \[[^\]]*\] (.*)$")


def phase_of(task):
    """The phase a task of site.yml belongs to (by its role file)."""
    path = task.get("path") or ""
    if "/roles/local_engine/tasks/install.yml" in path:
        return "install"
    if "/roles/local_engine/tasks/model.yml" in path:
        return "model build"
    if task.get("action", "").endswith(("local_service", "local_engine_service")):
        return "engine start"
    if "/roles/verify/" in path:
        return "first verification"
    return "rest"


def breakdown(timings, wall):
    """Seconds and CPU seconds per phase: each task from its start to the next task's start (Ansible's start and exit
    go to the rest). CPU is what ansible-playbook and the processes it waited for used meanwhile."""
    tasks = timings["tasks"]
    phases = dict((name, 0.0) for name in PHASES)
    cpu = dict((name, 0.0) for name in PHASES)
    starts = [t["start"] for t in tasks] + [timings["elapsed"]]
    # A task's processes count once Ansible has reaped its worker, which it does as the next task starts: the CPU
    # between the starts of the next two tasks is the task's.
    cpus = [t["cpu"] for t in tasks] + [timings["cpu"]]
    per_task = []
    for pos, task in enumerate(tasks):
        seconds = max(starts[pos + 1] - starts[pos], 0.0)
        phases[phase_of(task)] += seconds
        last = len(cpus) - 1
        cpu[phase_of(task)] += max(cpus[min(pos + 2, last)] - cpus[min(pos + 1, last)], 0.0)
        per_task.append((seconds, task["name"], phase_of(task)))
    phases["rest"] += max(wall - sum(phases.values()), 0.0)
    cpu["rest"] += cpus[min(1, len(cpus) - 1)]   # Ansible's start and the first task
    return phases, cpu, sorted(per_task, reverse=True)


def engine_cpu(home):
    """CPU seconds the running engine's processes have used (every process of its session, and the children they
    waited for, such as vLLM's model-inspection process), or None."""
    pidfile = os.path.join(home, ".cache", "inference_cache", "local_engine", "run", "default", "engine.pid")
    try:
        with open(pidfile) as handle:
            leader = int(handle.read().strip())
    except (IOError, OSError, ValueError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name) as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (IOError, OSError, IndexError):
            continue
        if int(fields[3]) == leader:   # its session id: the engine runs in a session of its own
            total += sum(int(v) for v in fields[11:15])   # utime, stime, cutime, cstime
    return round(total / float(ticks), 1)


def engine_phases(log_path, start_epoch):
    """The engine's own start, from its log: seconds after the engine task started at which each stage was seen."""
    marks = []
    try:
        with open(log_path, errors="replace") as handle:
            lines = handle.read().splitlines()
    except (IOError, OSError):
        return marks
    year = time.localtime(start_epoch).tm_year
    seen = set()
    wanted = (
        ("APIServer", None, "API server imported, arguments parsed"),
        ("EngineCore", "Initializing a V1 LLM engine", "EngineCore process up"),
        ("Worker", "Starting to load model", "worker process up"),
        ("EngineCore", "init engine (profile, create kv cache, warmup model) took", "model loaded, KV cache allocated"),
        ("APIServer", "Starting vLLM server on", "server listening"),
    )
    for line in lines:
        match = LOG_RE.match(line)
        if not match:
            continue
        proc, month, day, hour, minute, second, message = match.groups()
        stamp = time.mktime((year, int(month), int(day), int(hour), int(minute), int(second), 0, 0, -1))
        for who, text, label in wanted:
            if label in seen or not proc.startswith(who) or (text is not None and text not in message):
                continue
            seen.add(label)
            marks.append((label, round(stamp - start_epoch, 0)))
    return marks


def recap_changed(output):
    recap = output[output.rfind("PLAY RECAP"):]
    found = RECAP_RE.findall(recap)
    return sum(int(n) for n in found) if found else None


def read_runs(folder):
    """``{run: (exit code, seconds)}`` of benchmarks/time_playbook.sh's runs.tsv."""
    runs = {}
    with open(os.path.join(folder, "runs.tsv")) as handle:
        for line in handle:
            number, code, seconds = line.split()
            runs[int(number)] = (int(code), float(seconds))
    return runs


def figures_of(folder, home, shared):
    """The figures of a cold and a warm run that benchmarks/bench_site.sh left in ``folder`` (HOME ``home``)."""
    runs = read_runs(folder)
    figures = {"home": home, "shared_caches": list(shared), "load_average": os.getloadavg()}
    code, wall = runs.get(1, (None, None))
    if code != 0:
        raise SystemExit("the cold run failed (%s); its output: %s" % (code, os.path.join(folder, "run-1.log")))
    with open(os.path.join(folder, "run-1.json")) as handle:
        timings = json.load(handle)
    phases, cpu, per_task = breakdown(timings, wall)
    try:
        with open(os.path.join(folder, "engine-cpu.json")) as handle:
            engine = json.load(handle)
    except (IOError, OSError, ValueError):
        engine = None
    if engine is not None:
        cpu["engine start"] += engine
    engine_task = [t for t in timings["tasks"] if phase_of(t) == "engine start"]
    log = os.path.join(home, ".cache", "inference_cache", "local_engine", "run", "default", "engine.log")
    marks = engine_phases(log, timings["started"] + engine_task[0]["start"]) if engine_task else []
    figures.update(cold=round(wall, 1), phases=dict((k, round(v, 1)) for k, v in phases.items()),
                   cpu=dict((k, round(v, 1)) for k, v in cpu.items()), engine_cpu=engine,
                   slowest_tasks=[(round(s, 1), name, phase) for s, name, phase in per_task[:8]], engine_marks=marks)
    code, wall = runs.get(2, (None, None))
    if code != 0:
        raise SystemExit("the second run failed (%s); its output: %s" % (code, os.path.join(folder, "run-2.log")))
    with open(os.path.join(folder, "run-2.json")) as handle:
        warm_cpu = json.load(handle)["cpu"]
    with open(os.path.join(folder, "run-2.log"), errors="replace") as handle:
        changed = recap_changed(handle.read())
    figures.update(warm=round(wall, 1), warm_cpu=round(warm_cpu, 1), warm_changed=changed)
    return figures


def show(figures, warm_limit):
    print("cold site.yml on a fresh HOME: %.1f s, %.1f s of CPU (load average %s at the start)" % (
        figures["cold"], sum(figures["cpu"].values()), " ".join("%.1f" % x for x in figures["load_average"])))
    for name in PHASES:
        print("  %-20s %6.1f s   %6.1f s of CPU" % (name, figures["phases"][name], figures["cpu"][name]))
    if figures["engine_marks"]:
        print("  engine start, from its log (seconds after the start task began):")
        for label, at in figures["engine_marks"]:
            print("    %+5.0f s  %s" % (at, label))
    print("  slowest tasks: " + "; ".join("%s %.1f s" % (name, s) for s, name, _phase in figures["slowest_tasks"][:5]))
    verdict = "ok" if figures["warm_changed"] == 0 and figures["warm"] < warm_limit else "NOT ok"
    print("second run: %.1f s, %.1f s of CPU, changed=%s (%s: changed=0 and under %d s)" % (
        figures["warm"], figures["warm_cpu"], figures["warm_changed"], verdict, warm_limit))
    print("download caches: %s" % (", ".join(c for c in figures["shared_caches"] if c) or "none shared (fresh HOME's own)"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", metavar="FOLDER", help="what benchmarks/bench_site.sh's runs left there")
    parser.add_argument("--home", help="the fresh HOME of those runs (the engine's log is under it)")
    parser.add_argument("--shared-caches", nargs=2, default=["", ""], metavar=("UV", "PIP"), help="the download caches shared")
    parser.add_argument("--engine-cpu", metavar="HOME", help="print the CPU seconds of the engine running under HOME (JSON)")
    parser.add_argument("--warm-limit", type=float, default=20.0, help="seconds the second run may take")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the text")
    args = parser.parse_args()
    if args.engine_cpu:
        print(json.dumps(engine_cpu(args.engine_cpu)))
        return 0
    if not args.report or not args.home:
        parser.error("give --report FOLDER --home HOME (benchmarks/bench_site.sh does), or --engine-cpu HOME")
    figures = figures_of(args.report, args.home, args.shared_caches)
    if args.json:
        print(json.dumps(figures, sort_keys=True))
    else:
        show(figures, args.warm_limit)
    return 1 if figures["warm_changed"] != 0 or figures["warm"] >= args.warm_limit else 0


if __name__ == "__main__":
    sys.exit(main())
