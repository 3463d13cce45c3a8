# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The pieces of `make bench-site` and `make bench-load` that need no engine.

* the callback plugin inference_cache.substrate.timings writes every task (name, role, path, action, start, end, CPU,
  status per host) and the recap to its file, and nothing without one;
* benchmarks/bench_site.py splits a run into its phases by the tasks' files and reads the engine's stages from a
  vLLM log;
* benchmarks/bench_checks_load.py skips without its engines (``make bench`` runs it) and fails with ``--require``.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json
import os
import subprocess
import sys
import time

import pytest
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.path.join(ROOT, ".venv", "bin")
ENV = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".cache", "collections"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import bench_site  # noqa: E402  pylint: disable=wrong-import-position,import-error


def _playbook(tmp_path, env):
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"name": "First", "ansible.builtin.debug": {"msg": "one"}},
        {"name": "Second", "ansible.builtin.command": {"cmd": "true"}, "changed_when": True},
        {"name": "Third", "ansible.builtin.debug": {"msg": "three"}, "when": False},
    ]}]))
    return subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local", "-e",
                           "ansible_python_interpreter=%s" % sys.executable, str(playbook)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_timings_callback_writes_every_task(tmp_path):
    out = tmp_path / "timings.json"
    env = dict(ENV, ANSIBLE_CALLBACKS_ENABLED="inference_cache.substrate.timings", INFERENCE_CACHE_TIMINGS_PATH=str(out))
    run = _playbook(tmp_path, env)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    timings = json.loads(out.read_text())
    assert [t["name"] for t in timings["tasks"]] == ["First", "Second", "Third"]
    assert [t["hosts"]["localhost"]["status"] for t in timings["tasks"]] == ["ok", "ok", "skipped"]
    assert [t["hosts"]["localhost"]["changed"] for t in timings["tasks"]] == [False, True, False]
    assert timings["tasks"][1]["action"] == "ansible.builtin.command" and timings["tasks"][1]["path"].startswith(str(tmp_path / "play.yml") + ":")
    starts = [t["start"] for t in timings["tasks"]]
    assert starts == sorted(starts) and all(t["end"] >= t["start"] for t in timings["tasks"]) and timings["elapsed"] >= starts[-1]
    assert timings["cpu"] >= timings["tasks"][-1]["cpu"] >= timings["tasks"][0]["cpu"] > 0
    assert timings["stats"]["localhost"]["changed"] == 1 and timings["stats"]["localhost"]["skipped"] == 1
    assert abs(timings["started"] - time.time()) < 600


def test_timings_callback_without_a_file_writes_nothing(tmp_path):
    env = dict(ENV, ANSIBLE_CALLBACKS_ENABLED="inference_cache.substrate.timings")
    env.pop("INFERENCE_CACHE_TIMINGS_PATH", None)
    run = _playbook(tmp_path, env)
    assert run.returncode == 0 and "timings" not in run.stdout + run.stderr
    assert sorted(os.listdir(str(tmp_path))) == ["play.yml"]


def test_bench_site_splits_a_run_into_its_phases():
    role = "/x/roles/%s/tasks/%s.yml:1"
    tasks = [
        {"name": "facts", "path": role % ("local_engine", "preflight"), "action": "ansible.builtin.setup", "start": 1.0, "cpu": 1.0},
        {"name": "install", "path": role % ("local_engine", "install"), "action": "ansible.builtin.command", "start": 2.0, "cpu": 1.5},
        {"name": "model", "path": role % ("local_engine", "model"), "action": "ansible.builtin.script", "start": 12.0, "cpu": 2.0},
        {"name": "launcher", "path": role % ("local_engine", "service"), "action": "ansible.builtin.template", "start": 15.0, "cpu": 9.0},
        {"name": "engine", "path": role % ("local_engine", "service"),
         "action": "inference_cache.substrate.local_service", "start": 16.0, "cpu": 10.0},
        {"name": "check", "path": role % ("verify", "main"), "action": "inference_cache.substrate.kv_events_check", "start": 46.0, "cpu": 10.5},
    ]
    phases, cpu, slowest = bench_site.breakdown({"tasks": tasks, "elapsed": 50.0, "cpu": 13.0}, 55.0)
    assert phases == {"install": 10.0, "model build": 3.0, "engine start": 30.0, "first verification": 4.0, "rest": 8.0}
    # A task's CPU shows once Ansible reaps its worker, at the next task's start: between the next two starts.
    assert cpu == {"install": 7.0, "model build": 1.0, "engine start": 2.5, "first verification": 0.0, "rest": 2.5}
    assert slowest[0] == (30.0, "engine", "engine start")


def test_bench_site_reads_the_engines_stages(tmp_path):
    start = time.mktime((2026, 12, 3, 8, 13, 0, 0, 0, -1))
    log = tmp_path / "engine.log"
    log.write_text("\n".join([
        "Triton is installed, but doesn't include CPU backend. Disabling Triton.",
        "(APIServer pid=9) INFO 12-03 08:13:08 [api_utils.py:347] version 0.32.0",
        "(EngineCore pid=10) INFO 12-03 08:13:40 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: ...",
        "(EngineCore pid=10) INFO 12-03 08:13:45 [core.py:402] init engine (profile, create kv cache, warmup model) took 0.06 s",
        "(APIServer pid=9) INFO 12-03 08:13:46 [entry.py:140] Starting vLLM server on http://127.0.0.1:8500",
    ]) + "\n")
    assert bench_site.engine_phases(str(log), start) == [
        ("API server imported, arguments parsed", 8.0), ("EngineCore process up", 40.0),
        ("model loaded, KV cache allocated", 45.0), ("server listening", 46.0)]


def test_bench_checks_load_skips_without_its_engines(tmp_path):
    script = os.path.join(ROOT, "benchmarks", "bench_checks_load.py")
    missing = str(tmp_path / "engines.json")
    run = subprocess.run([sys.executable, script, "--engines-file", missing], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0 and "skipped" in run.stdout, run.stdout + run.stderr
    engines = tmp_path / "engines.json"
    engines.write_text(json.dumps({"engines": {"load-a": {   # what roles/local_engine publishes (local_engine_instances)
        "url": "http://127.0.0.1:9", "kv_subscriber": {"endpoint": "ipc:///nowhere/load-a.kv", "socket_mode": "connect",
                                                       "topic": "kv@127.0.0.1:9@tiny", "replay_endpoint": "tcp://127.0.0.1:5911"},
        "service": {"name": "engine", "launcher": "/nowhere/engine.sh"}}}}))
    run = subprocess.run([sys.executable, script, "--engines-file", str(engines), "--require"], capture_output=True, text=True,
                         timeout=120, check=False)
    assert run.returncode == 1 and "failed: engine load-a" in run.stdout, run.stdout + run.stderr


def _runs(folder, rows, tasks, log_tail="PLAY RECAP\nlocalhost : ok=9 changed=0 unreachable=0 failed=0\n"):
    """What benchmarks/time_playbook.sh leaves: runs.tsv, and per run its timings and output."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "runs.tsv").write_text("".join("%d\t%d\t%.3f\n" % row for row in rows))
    for number, _code, seconds in rows:
        (folder / ("run-%d.json" % number)).write_text(json.dumps({"started": 1000.0, "elapsed": seconds, "cpu": 2.0, "tasks": tasks}))
        (folder / ("run-%d.log" % number)).write_text(log_tail)


def test_the_verify_report_reads_the_runs_and_fails_on_a_failed_one_or_a_slow_median(tmp_path):
    tasks = [{"name": "kv events", "start": 0.1, "end": 1.1, "cpu": 0.0}, {"name": "prefix cache", "start": 1.1, "end": 3.1, "cpu": 0.5}]
    _runs(tmp_path / "ok", [(1, 0, 3.0), (2, 0, 5.0), (3, 0, 4.0)], tasks)
    script = os.path.join(ROOT, "benchmarks", "bench_verify.py")
    run = subprocess.run([sys.executable, script, "--report", str(tmp_path / "ok"), "--json"], capture_output=True, text=True, check=False)
    result = json.loads(run.stdout)
    assert run.returncode == 0 and (result["min"], result["median"], result["max"]) == (3.0, 4.0, 5.0)
    assert result["slowest_tasks"][0] == {"seconds": 2.0, "task": "prefix cache"}
    run = subprocess.run([sys.executable, script, "--report", str(tmp_path / "ok"), "--limit", "3.5"], capture_output=True, text=True,
                         check=False)
    assert run.returncode == 1 and "the median 4.00 s is over the limit of 3.50 s" in run.stdout
    _runs(tmp_path / "bad", [(1, 0, 3.0), (2, 2, 1.0)], tasks)
    run = subprocess.run([sys.executable, script, "--report", str(tmp_path / "bad")], capture_output=True, text=True, check=False)
    assert run.returncode == 1 and "make verify failed (exit 2)" in run.stdout


def test_the_site_report_splits_the_cold_run_and_holds_the_warm_one_to_changed_0(tmp_path):
    tasks = [{"name": "install", "path": "/c/roles/local_engine/tasks/install.yml:3", "action": "command", "start": 1.0, "cpu": 0.5},
             {"name": "start", "path": "/c/roles/local_engine/tasks/service.yml:5", "action": "inference_cache.substrate.local_service",
              "start": 30.0, "cpu": 5.0}]
    _runs(tmp_path / "runs", [(1, 0, 100.0), (2, 0, 12.0)], tasks)
    (tmp_path / "runs" / "engine-cpu.json").write_text("40.0")
    figures = bench_site.figures_of(str(tmp_path / "runs"), str(tmp_path), ["", ""])
    assert figures["cold"] == 100.0 and figures["phases"]["install"] == 29.0 and figures["phases"]["engine start"] == 70.0
    assert figures["engine_cpu"] == 40.0 and figures["warm"] == 12.0 and figures["warm_changed"] == 0
    _runs(tmp_path / "failed", [(1, 4, 100.0)], tasks)
    with pytest.raises(SystemExit, match=r"^the cold run failed \(4\)"):
        bench_site.figures_of(str(tmp_path / "failed"), str(tmp_path), ["", ""])
