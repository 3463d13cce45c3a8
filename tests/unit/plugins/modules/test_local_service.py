# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The local_service module in-process: psutil absent, wrong options, and check mode on a throwaway process."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import os

from ansible_collections.inference_cache.substrate.plugins.module_utils.service import supervisor as S
from ansible_collections.inference_cache.substrate.plugins.modules import local_service as module
from ansible_collections.inference_cache.substrate.tests.unit.plugins.modules.utils import run_module


def _files(tmp_path):
    return {"pidfile": str(tmp_path / "svc.pid"), "runfile": str(tmp_path / "svc.run")}


def test_without_psutil_it_fails_with_missing_required_lib(tmp_path, monkeypatch):
    monkeypatch.setattr(module, "HAS_PSUTIL", False)
    monkeypatch.setattr(module, "PSUTIL_IMPORT_ERROR", "Traceback: No module named 'psutil'")
    exited, result = run_module(module, dict(_files(tmp_path), state="stopped"))
    assert not exited and result["msg"].startswith("Failed to import the required Python library (psutil)")
    assert result["exception"] == "Traceback: No module named 'psutil'"


def test_a_port_out_of_range_is_one_sentence(tmp_path):
    exited, result = run_module(module, dict(_files(tmp_path), launcher="/bin/true", log=str(tmp_path / "log"),
                                             health_url="http://127.0.0.1:9/", ports=[0, 70000]))
    assert not exited and result["msg"] == "ports must lie in 1-65535, got 0, 70000."


def test_started_needs_a_launcher(tmp_path):
    exited, result = run_module(module, dict(_files(tmp_path), state="started"))
    assert not exited and "launcher" in result["msg"] and "health_url" in result["msg"]


def test_check_mode_starts_and_stops_nothing(tmp_path):
    launcher = tmp_path / "svc.sh"
    launcher.write_text("#!/bin/sh\nexec sleep 300\n")
    launcher.chmod(0o700)
    args = dict(_files(tmp_path), launcher=str(launcher), log=str(tmp_path / "svc.log"), health_url="http://127.0.0.1:9/")
    exited, result = run_module(module, args, check_mode=True)
    assert exited and result["changed"] and result["started"] and result["pid"] is None
    assert not os.path.exists(args["pidfile"]) and not os.path.exists(args["log"])
    exited, result = run_module(module, dict(_files(tmp_path), state="stopped"), check_mode=True)
    assert exited and not result["changed"] and result["stopped_pids"] == []


def test_the_checksum_defaults_to_the_launchers(tmp_path, monkeypatch):
    """Without a checksum the launcher's SHA-1 is recorded: a changed launcher restarts the process."""
    launcher = tmp_path / "svc.sh"
    launcher.write_text("#!/bin/sh\nexec sleep 300\n")
    launcher.chmod(0o700)
    args = dict(_files(tmp_path), launcher=str(launcher), log=str(tmp_path / "svc.log"), health_url="http://127.0.0.1:9/",
                start_timeout=5)
    healthy = []
    monkeypatch.setattr(module, "_health_probe", lambda api_key, ca_path=None: (lambda url: healthy.append(url) or True))
    try:
        exited, first = run_module(module, args)
        assert exited and first["changed"] and S.status(S.ServiceFiles(args["pidfile"], args["runfile"]))["checksum"] == S.file_checksum(str(launcher))
        launcher.write_text("#!/bin/sh\nexec sleep 301\n")
        exited, second = run_module(module, args)
        assert exited and second["restarted"] and second["pid"] != first["pid"] and healthy
    finally:
        exited, stopped = run_module(module, dict(_files(tmp_path), state="stopped"))
    assert exited and stopped["changed"]


def test_stop_scope_reaches_the_supervisor(tmp_path, monkeypatch):
    """stop_scope leader: the stop signals the launcher's process alone first; a scope not offered is refused."""
    seen = []
    monkeypatch.setattr(module, "Supervisor", lambda *args, **kwargs: seen.append(kwargs["stop_scope"]) or S.Supervisor(*args, **kwargs))
    exited, result = run_module(module, dict(_files(tmp_path), state="stopped", stop_scope="leader"))
    assert exited and not result["changed"] and seen == ["leader"]
    exited, result = run_module(module, dict(_files(tmp_path), state="stopped"))
    assert exited and seen == ["leader", "group"]
    exited, result = run_module(module, dict(_files(tmp_path), state="stopped", stop_scope="session"))
    assert not exited and "stop_scope" in result["msg"] and "group, leader" in result["msg"]
