#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Where the time of a newcomer's first ``make site`` goes: playbooks/site.yml on a fresh HOME, then once more.

A HOME of its own, made empty here (as .ci/run does): the engine's virtual environment, model, run folder and
report start from nothing. Download caches are shared with the machine's (uv's and pip's archive caches under
``~/.cache/substrate-ci`` of the real HOME, or UV_CACHE_DIR / PIP_CACHE_DIR when set), as CI shares them;
``--no-shared-cache`` leaves them in the fresh HOME too (every package downloaded again).

The first (cold) run is timed task by task by the collection's callback plugin ``inference_cache.substrate.timings``
(enabled for these runs only) and split into: install (roles/local_engine/tasks/install.yml; right after an install
its check builds the tiny model too, in a child process beside the imports, so that time shows here), model build
(model.yml), engine start (the local_service task), first verification (the verify role) and the rest
(Ansible's own start, facts, the launcher, ...). The engine's start is split further from its log: the API server's
imports, the EngineCore process, the worker process (when there is one), model and KV cache, the server listening.
Beside each phase's seconds, its CPU seconds (user and system): those of ansible-playbook and the processes it waited
for (the callback's), and for the engine start those of the engine's own processes, read from /proc when the run
ends (the verification's few requests included). A job of an ``async`` task (the vLLM install) is not counted. On a
loaded machine the seconds grow with the load and the CPU seconds much less: compare those.
The second run must report ``changed=0`` and take less than ``--warm-limit`` seconds (20). The engine is stopped at
the end (playbooks/teardown.yml with the same HOME), also on failure, and the fresh HOME removed (``--keep-home``
keeps it).

The engine listens on its own ports (8500, events 5900, replay 5901 by default), not the local default's 8000, so
that an engine of ``make site`` may run beside it.

  .venv/bin/python benchmarks/bench_site.py [--runs 1] [--port 8500] [--kv-port 5900] [--replay-port 5901]
                                            [--no-shared-cache] [--keep-home] [--json] [-- more ansible-playbook args]
"""

from __future__ import absolute_import, division, print_function

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAYBOOK = os.path.join(ROOT, ".venv", "bin", "ansible-playbook")
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


def run_site(env, extra, log_path):
    """One site.yml run: (wall seconds, return code, output)."""
    command = [PLAYBOOK, "-i", "inventories/local", "playbooks/site.yml"] + extra
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.run(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    wall = time.monotonic() - start
    with open(log_path, errors="replace") as handle:
        output = handle.read()
    return wall, proc.returncode, output


def recap_changed(output):
    recap = output[output.rfind("PLAY RECAP"):]
    found = RECAP_RE.findall(recap)
    return sum(int(n) for n in found) if found else None


def fresh_env(home, shared):
    env = dict(os.environ, HOME=home, ANSIBLE_ASYNC_DIR=os.path.join(home, ".ansible_async"),
               ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1",
               ANSIBLE_CALLBACKS_ENABLED="inference_cache.substrate.timings")
    for name in ("UV_CACHE_DIR", "PIP_CACHE_DIR"):
        env.pop(name, None)
    if shared:
        real = os.path.expanduser("~")
        env["UV_CACHE_DIR"] = os.environ.get("UV_CACHE_DIR") or os.path.join(real, ".cache", "substrate-ci", "uv")
        env["PIP_CACHE_DIR"] = os.environ.get("PIP_CACHE_DIR") or os.path.join(real, ".cache", "substrate-ci", "pip")
    return env


def one_round(args, extra):
    """Cold run, warm run, teardown on a fresh HOME; returns the figures."""
    home = tempfile.mkdtemp(prefix="substrate-bench-site-home.")
    env = fresh_env(home, not args.no_shared_cache)
    figures = {"home": home, "shared_caches": [env.get("UV_CACHE_DIR"), env.get("PIP_CACHE_DIR")],
               "load_average": os.getloadavg()}
    try:
        env["INFERENCE_CACHE_TIMINGS_PATH"] = os.path.join(home, "timings-cold.json")
        wall, code, output = run_site(env, extra, os.path.join(home, "site-cold.log"))
        if code != 0:
            raise SystemExit("the cold run failed (%d); its output: %s\n%s" % (code, os.path.join(home, "site-cold.log"), output[-3000:]))
        with open(env["INFERENCE_CACHE_TIMINGS_PATH"]) as handle:
            timings = json.load(handle)
        phases, cpu, per_task = breakdown(timings, wall)
        engine = engine_cpu(home)
        if engine is not None:
            cpu["engine start"] += engine
        engine_task = [t for t in timings["tasks"] if phase_of(t) == "engine start"]
        log = os.path.join(home, ".cache", "inference_cache", "local_engine", "run", "default", "engine.log")
        marks = engine_phases(log, timings["started"] + engine_task[0]["start"]) if engine_task else []
        figures.update(cold=round(wall, 1), phases=dict((k, round(v, 1)) for k, v in phases.items()),
                       cpu=dict((k, round(v, 1)) for k, v in cpu.items()), engine_cpu=engine,
                       slowest_tasks=[(round(s, 1), name, phase) for s, name, phase in per_task[:8]], engine_marks=marks)

        env["INFERENCE_CACHE_TIMINGS_PATH"] = os.path.join(home, "timings-warm.json")
        wall, code, output = run_site(env, extra, os.path.join(home, "site-warm.log"))
        if code != 0:
            raise SystemExit("the second run failed (%d); its output: %s\n%s" % (code, os.path.join(home, "site-warm.log"), output[-3000:]))
        with open(env["INFERENCE_CACHE_TIMINGS_PATH"]) as handle:
            warm_cpu = json.load(handle)["cpu"]
        figures.update(warm=round(wall, 1), warm_cpu=round(warm_cpu, 1), warm_changed=recap_changed(output))
        figures["load_average_after"] = os.getloadavg()
    finally:
        env.pop("ANSIBLE_CALLBACKS_ENABLED", None)
        stop = subprocess.run([PLAYBOOK, "-i", "inventories/local", "playbooks/teardown.yml"] + extra, cwd=ROOT, env=env,
                              capture_output=True, text=True, check=False)
        if stop.returncode != 0:
            sys.stderr.write("teardown failed (%d): %s\n" % (stop.returncode, stop.stdout[-2000:]))
        if not args.keep_home:
            shutil.rmtree(home, ignore_errors=True)
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
    parser.add_argument("--runs", type=int, default=1, help="fresh-HOME rounds (cold, warm, teardown each)")
    parser.add_argument("--port", type=int, default=8500, help="the engine's HTTP port")
    parser.add_argument("--kv-port", type=int, default=5900, help="the KV-event port (the check binds it)")
    parser.add_argument("--replay-port", type=int, default=5901, help="the engine's replay port")
    parser.add_argument("--no-shared-cache", action="store_true", help="download caches in the fresh HOME too (all downloaded again)")
    parser.add_argument("--keep-home", action="store_true", help="keep each fresh HOME (its logs, timings and the engine's venv)")
    parser.add_argument("--warm-limit", type=float, default=20.0, help="seconds the second run may take")
    parser.add_argument("--json", action="store_true", help="one JSON object per round instead of the text")
    parser.add_argument("extra", nargs="*", help="more ansible-playbook arguments (after --)")
    args = parser.parse_args()
    extra = ["-e", json.dumps({"local_engine_port": args.port,
                               "local_engine_kv_events_endpoint": "tcp://127.0.0.1:%d" % args.kv_port,
                               "local_engine_kv_events_replay_endpoint": "tcp://127.0.0.1:%d" % args.replay_port})] + args.extra
    failed = False
    for number in range(args.runs):
        figures = one_round(args, extra)
        if args.json:
            print(json.dumps(figures, sort_keys=True))
        else:
            if args.runs > 1:
                print("== round %d of %d" % (number + 1, args.runs))
            show(figures, args.warm_limit)
        failed = failed or figures["warm_changed"] != 0 or figures["warm"] >= args.warm_limit
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
