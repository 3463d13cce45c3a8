# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The module local_service run through ``ansible`` (and through its old name ``local_engine_service``, redirected by
meta/runtime.yml): a throwaway HTTP server on 127.0.0.1 started once, left alone with the same settings, stopped; a
pid that is not the process it started is warned about and left alone; an instance that never ran stops as ok; an
absent psutil is one sentence. The supervisor itself is tested in tests/unit/plugins/module_utils/test_service_*.py."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.service import process as P
from ansible_collections.inference_cache.substrate.plugins.module_utils.service import supervisor as S

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.path.dirname(os.path.join(ROOT, ".venv", "bin", "python"))
ENV = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", ANSIBLE_CALLBACK_RESULT_FORMAT="json")


def _module(check=False, module="local_service", python=sys.executable, **args):
    """Run the module through ansible; return (rc, result), the warnings as result["_stderr"]."""
    cmd = [os.path.join(BIN, "ansible"), "localhost", "-i", "localhost,", "-c", "local", "-e",
           "ansible_python_interpreter=%s" % python, "-m", "inference_cache.substrate." + module,
           "-a", json.dumps(args)] + (["--check"] if check else [])
    run = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120, check=False)
    assert "=>" in run.stdout, run.stdout + run.stderr
    return run.returncode, dict(json.loads(run.stdout.split("=>", 1)[1]), _stderr=run.stderr)


def _alive(pid):
    return P.start_ticks(pid) is not None


@pytest.fixture
def unrelated():
    """A live process that has nothing to do with any service."""
    proc = subprocess.Popen(["sleep", "300"])  # pylint: disable=consider-using-with
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("module", ["local_service", "local_engine_service"])
def test_module_starts_once_and_stops(tmp_path, unrelated, module):
    # Ports no helper or role of this repository uses (the local engines take 8000-8249).
    port = 18108 if module == "local_engine_service" else 18109
    launcher = tmp_path / "engine.sh"
    launcher.write_text("#!/bin/sh\nexec %s -m http.server %d --bind 127.0.0.1\n" % (shlex.quote(sys.executable), port))
    launcher.chmod(0o700)
    files = {"pidfile": str(tmp_path / "engine.pid"), "runfile": str(tmp_path / "engine.run")}
    start = dict(files, name="engine", launcher=str(launcher), log=str(tmp_path / "engine.log"),
                 health_url="http://127.0.0.1:%d/" % port, ports=[port], start_timeout=30)
    (tmp_path / "engine.pid").write_text("%d\n" % unrelated)  # left over from before a reboot, say
    (tmp_path / "engine.run").write_text(json.dumps({"checksum": "x", "pid": unrelated, "start_ticks": 1, "boot_id": "old"}))
    try:
        rc, checked = _module(check=True, module=module, **start)
        assert rc == 0 and checked["changed"] and checked["started"] and checked["pid"] is None
        rc, first = _module(module=module, **start)
        assert rc == 0 and first["changed"] and first["started"] and first["start_seconds"] is not None
        assert first["foreign"]["pid"] == unrelated and _alive(unrelated)
        assert first["rss_kib"] > 0 and first["pid"] in first["pids"]
        assert "The pid file %s named pid %d, which is not the engine" % (files["pidfile"], unrelated) in first["_stderr"]
        rc, second = _module(module=module, **start)
        assert rc == 0 and not second["changed"] and second["pid"] == first["pid"] and second["foreign"] is None
        rc, checked = _module(check=True, module=module, state="stopped", **files)
        assert rc == 0 and checked["changed"] and _alive(first["pid"])
        rc, stopped = _module(module=module, state="stopped", **files)
        assert rc == 0 and stopped["changed"] and not _alive(first["pid"]) and _alive(unrelated)
        rc, again = _module(module=module, state="stopped", **files)
        assert rc == 0 and not again["changed"]
        start["start_timeout"] = 0
        rc, bad = _module(module=module, **start)
        assert rc != 0 and bad["msg"] == "start_timeout must be a positive number of seconds, got 0."
    finally:
        pid = S.status(S.ServiceFiles(files["pidfile"], files["runfile"]))["pid"]
        if pid:
            os.killpg(pid, signal.SIGKILL)


def test_a_taken_port_names_its_owner_and_the_service(tmp_path):
    """The default name and no variables named; the owner of the port is this machine's HTTP server."""
    port = 18110
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],  # pylint: disable=consider-using-with
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        launcher = tmp_path / "run.sh"
        launcher.write_text("#!/bin/sh\nexec sleep 300\n")
        launcher.chmod(0o700)
        deadline = time.monotonic() + 30  # until the server listens (bounded)
        while not P.listeners(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        rc, failed = _module(launcher=str(launcher), log=str(tmp_path / "run.log"), pidfile=str(tmp_path / "run.pid"),
                             runfile=str(tmp_path / "run.run"), health_url="http://127.0.0.1:%d/" % port, ports=[port])
        assert rc != 0 and failed["msg"].startswith("Cannot start the service on 127.0.0.1: port %d is taken by pid %d (" % (port, server.pid))
        assert failed["msg"].endswith("; stop that process or choose other ports.")
        assert failed["busy"][0]["owners"][0]["pid"] == server.pid and not (tmp_path / "run.pid").exists()
    finally:
        server.kill()
        server.wait()


def test_an_instance_that_never_ran_stops_as_ok(tmp_path):
    """A fresh machine: the instance's folder does not exist. Stopping is a no-op and writes nothing."""
    run_dir = tmp_path / "state" / "run" / "never"
    files = {"pidfile": str(run_dir / "engine.pid"), "runfile": str(run_dir / "engine.run")}
    rc, stopped = _module(state="stopped", **files)
    assert rc == 0 and stopped["changed"] is False
    rc, checked = _module(check=True, state="stopped", **files)
    assert rc == 0 and checked["changed"] is False
    assert not (tmp_path / "state").exists()


def test_without_psutil_the_module_says_so(tmp_path):
    """A Python without psutil on the managed host: missing_required_lib's sentence, nothing started."""
    bare = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    python = str(bare / "bin" / "python")
    assert subprocess.run([python, "-c", "import psutil"], capture_output=True, check=False).returncode != 0
    rc, failed = _module(python=python, state="stopped", pidfile=str(tmp_path / "x.pid"), runfile=str(tmp_path / "x.run"))
    assert rc != 0 and failed["msg"].startswith("Failed to import the required Python library (psutil)")
