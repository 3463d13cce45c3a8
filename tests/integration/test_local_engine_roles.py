# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Static checks of the local_engine and verify roles (no engine needed).

* defaults/main.yml and meta/argument_specs.yml list the same variables, all with the role prefix;
* the launcher template renders the command REFERENCE part L says works;
* engine_ctl.py finds a taken port and names its owner, starts and stops a process group, refuses a second start.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json
import os
import socket
import subprocess
import sys
import time

import pytest
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CTL = os.path.join(ROOT, "roles", "local_engine", "files", "engine_ctl.py")


def _load(*parts):
    with open(os.path.join(ROOT, *parts)) as handle:
        return yaml.safe_load(handle)


@pytest.mark.parametrize("role, prefix", [("local_engine", "local_engine_"), ("verify", "verify_")])
def test_defaults_match_argument_specs(role, prefix):
    defaults = _load("roles", role, "defaults", "main.yml")
    options = _load("roles", role, "meta", "argument_specs.yml")["argument_specs"]["main"]["options"]
    assert sorted(defaults) == sorted(options)
    assert all(name.startswith(prefix) for name in defaults)
    for name, value in defaults.items():
        spec = options[name]
        if not (isinstance(value, str) and "{{" in value):
            assert spec.get("default") == value, name
        assert spec["description"], name


def test_internal_vars_are_prefixed():
    for role, prefix in (("local_engine", "_local_engine_"), ("verify", "_verify_")):
        assert all(name.startswith(prefix) for name in _load("roles", role, "vars", "main.yml"))


def _ctl(*args):
    out = subprocess.run([sys.executable, CTL] + list(args), capture_output=True, text=True, check=True, timeout=60)
    return json.loads(out.stdout)


def test_ports_names_the_owner():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        result = _ctl("ports", "--host", "127.0.0.1", "--port", str(port))
        assert [b["port"] for b in result["busy"]] == [port]
        assert result["busy"][0]["owners"][0]["pid"] == os.getpid()
        assert ("port %d is taken by pid %d" % (port, os.getpid())) in result["message"]
    assert _ctl("ports", "--host", "127.0.0.1", "--port", str(port))["busy"] == []


def _launcher(tmp_path, script):
    """A launcher running ``script`` (sh), and the --pidfile/--runfile arguments of its instance."""
    launcher = tmp_path / "engine.sh"
    launcher.write_text("#!/bin/sh\n" + script)
    launcher.chmod(0o700)
    return launcher, ["--pidfile", str(tmp_path / "pid"), "--runfile", str(tmp_path / "run")]


def test_start_status_stop_a_process_group(tmp_path):
    # A parent with a child in the same session, like the API server and its EngineCore.
    launcher, files = _launcher(tmp_path, "sleep 300 &\nexec sleep 301\n")
    started = _ctl("start", "--launcher", str(launcher), "--log", str(tmp_path / "log"), "--checksum", "abc", *files)
    time.sleep(0.5)
    status = _ctl("status", *files)
    assert status["alive"] and status["pid"] == started["pid"] and status["running_checksum"] == "abc"
    assert len(status["pids"]) == 2
    stopped = _ctl("stop", "--timeout", "5", *files)
    assert stopped["stopped"] and stopped["remaining"] == []
    assert not any(os.path.exists("/proc/%d" % pid) and "Z" not in open("/proc/%d/stat" % pid).read().split(")")[-1][:3]
                   for pid in status["pids"])
    assert _ctl("status", *files)["alive"] is False
    assert _ctl("stop", "--timeout", "5", *files)["stopped"] is False


def test_second_start_refuses_while_the_first_runs(tmp_path):
    launcher, files = _launcher(tmp_path, "exec sleep 300\n")
    first = _ctl("start", "--launcher", str(launcher), "--log", str(tmp_path / "log"), "--checksum", "a", *files)
    try:
        second = _ctl("start", "--launcher", str(launcher), "--log", str(tmp_path / "log2"), "--checksum", "b", *files)
        assert second["started"] is False and second["pid"] == first["pid"]
        assert second["message"] == "another run started this engine instance meanwhile (pid %d); run the play again" % first["pid"]
        assert _ctl("status", *files)["running_checksum"] == "a" and not (tmp_path / "log2").exists()
    finally:
        assert _ctl("stop", "--timeout", "5", *files)["stopped"]
    # Once the first is gone, a start goes ahead again.
    third = _ctl("start", "--launcher", str(launcher), "--log", str(tmp_path / "log"), "--checksum", "c", *files)
    assert third["started"] is True and third["pid"] != first["pid"]
    assert _ctl("stop", "--timeout", "5", *files)["stopped"]


def test_wait_reports_an_engine_that_dies(tmp_path):
    launcher, files = _launcher(tmp_path, "echo 'error: unrecognized arguments: --bogus' >&2\nexit 2\n")
    log = str(tmp_path / "log")
    _ctl("start", "--launcher", str(launcher), "--log", log, "--checksum", "x", *files)
    result = _ctl("wait", *files, "--url", "http://127.0.0.1:9/health", "--log", log, "--timeout", "20")
    assert result["ready"] is False and result["reason"] == "the engine exited during start-up"
    assert any("unrecognized arguments" in line for line in result["log_tail"])
    assert not os.path.exists(files[1])
