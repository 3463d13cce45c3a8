# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""Supervision of one local process started from a launcher script (Linux; no Ansible import).

Every local process the collection runs (a vLLM engine, etcd and the control plane of a kwok cluster, a confined EPP)
is one service instance, described by four files: the launcher it runs, its log, its pid file (the pid alone, one line)
and its run file, which records the settings checksum it was started with and the identity of the process: its start
time in clock ticks since boot and the boot id (``process.identity``). A pid is only signalled when the live process
with that pid is the one recorded (same boot, same start time), so a pid reused by an unrelated process (after a
reboot, or after the service died) is never killed. A run file from before identities were recorded (one line, the
checksum) is accepted when the process started before its pid file was written.

``Supervisor.ensure_started`` (ports checked first, the owner of a taken one named; a start waits for the health URL
within a bound; a new checksum restarts) and ``ensure_stopped`` (SIGTERM to the whole group, or first to its leader alone:
``stop_scope``; a bounded wait, SIGKILL) are what the module local_service calls, one at a time per instance (a lock beside
the pid file). The health probe is passed in, so this file needs no HTTP client.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import fcntl
import hashlib
import json
import os
import signal
import subprocess
import time

from . import process
from .process import ServiceError

__all__ = ["ServiceError", "ServiceFiles", "Supervisor", "file_checksum", "identify", "log_tail", "restart", "status", "stop_group"]

# A legacy run file (no identity) is trusted when the process started at most this long after its pid file was written.
LEGACY_START_SLACK = 2.0


def _read(path):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except (IOError, OSError):
        return None


def log_tail(path, lines=25):
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 65536))
            text = handle.read().decode("utf-8", "replace")
    except (IOError, OSError):
        return []
    return text.splitlines()[-lines:]


def file_checksum(path):
    """SHA-1 of a file, as Ansible's template and stat report it; None when unreadable."""
    try:
        with open(path, "rb") as handle:
            return hashlib.sha1(handle.read()).hexdigest()  # nosec - a change detector, as Ansible's own checksum
    except (IOError, OSError):
        return None


class ServiceFiles(object):
    """The files of one service instance."""

    def __init__(self, pidfile, runfile, log=None, launcher=None):
        self.pidfile = pidfile
        self.runfile = runfile
        self.log = log
        self.launcher = launcher

    def read(self):
        """(pid or None, record dict): what the pid file and the run file say."""
        raw = _read(self.pidfile)
        pid = int(raw) if raw and raw.isdigit() and int(raw) > 0 else None
        text = _read(self.runfile) or ""
        record = {}
        if text.startswith("{"):
            try:
                record = json.loads(text)
            except ValueError:
                record = {}
            if not isinstance(record, dict):
                record = {}
        elif text:
            record = {"checksum": text.splitlines()[0].strip()}  # written before identities were recorded
        return pid, record

    def write(self, pid, checksum):
        record = dict(process.identity(pid), checksum=checksum)
        with open(self.pidfile, "w") as handle:
            handle.write("%d\n" % pid)
        with open(self.runfile, "w") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
        return record

    def remove(self):
        for path in (self.pidfile, self.runfile):
            try:
                os.unlink(path)
            except OSError:
                pass


def identify(pid, record, pidfile):
    """Whether ``pid`` is the process the files describe: (True, None) or (False, why not)."""
    if pid is None:
        return False, "no pid file"
    ticks = process.start_ticks(pid)
    if ticks is None:
        return False, "pid %d is gone" % pid
    if record.get("start_ticks") is not None:
        if record.get("boot_id") != process.boot_id():
            return False, "pid %d was recorded before the last reboot" % pid
        if record.get("pid") != pid or record.get("start_ticks") != ticks:
            return False, "pid %d is now another process (%s)" % (pid, process.cmdline(pid)[:200] or "?")
        return True, None
    if not record.get("checksum"):
        return False, "pid %d has no run file recording it (%s)" % (pid, process.cmdline(pid)[:200] or "?")
    try:
        written = os.stat(pidfile).st_mtime
    except OSError:
        return False, "no pid file"
    if process.started_at(pid) > written + LEGACY_START_SLACK:
        return False, "pid %d is now another process (%s), started after the pid file was written" % (
            pid, process.cmdline(pid)[:200] or "?")
    return True, None


def status(files):
    """What runs for these files: a dict with running, pid, pids, checksum, foreign (a live pid that is not the one
    recorded), leftovers (processes of a recorded group whose leader is gone)."""
    pid, record = files.read()
    running, why_not = identify(pid, record, files.pidfile)
    leader_alive = pid is not None and process.start_ticks(pid) is not None
    leftovers = []
    if not running and pid is not None and record.get("boot_id") == process.boot_id() and not leader_alive:
        # The leader is gone but processes of its session may remain (Linux never reuses a pid while it names a live
        # session or process group): those belong to the service.
        leftovers = process.members(pid)
    pids = process.members(pid) if running else leftovers
    foreign = None
    if not running and leader_alive:
        foreign = {"pid": pid, "cmdline": process.cmdline(pid)[:200], "reason": why_not}
    return {
        "running": running,
        "pid": pid if running else None,
        "recorded_pid": pid,
        "pids": pids,
        "leftovers": leftovers,
        "rss_kib": process.rss_kib(pids),
        "checksum": record.get("checksum") if running else None,
        "stale": pid is not None and not running,
        "foreign": foreign,
    }


def signal_all(leader, handles, signum):
    """``signum`` to the process group of ``leader`` (while it has members, so its id cannot name another group) and
    to each process of ``handles`` outside it that is still the one listed: each process gets it once."""
    grouped = set(process.group(leader))
    if grouped:
        try:
            os.killpg(leader, signum)
        except OSError:
            grouped = set()
    for handle in handles:
        if handle.pid in grouped:
            continue
        try:
            handle.send_signal(signum)
        except process.psutil.Error:
            pass


def _still(leader, handles):
    return sorted(set(process.members(leader)) | set(h.pid for h in handles if process.running(h)))


# Who gets the first SIGTERM of a stop: the whole process group, or its leader alone (the rest once the leader is gone).
STOP_SCOPES = ("group", "leader")


def stop_group(leader, pids, timeout, scope="group"):
    """SIGTERM the group of ``leader`` and ``pids``, a bounded wait, SIGKILL what is left; returns what remains.

    ``scope`` ``leader``: the first SIGTERM goes to the live leader alone, as the kubelet signals a container's first
    process, and the rest of the group gets it once the leader has exited (or at once when the leader is already gone).
    A program that stops its own children (vLLM's API server stops its EngineCore) then gets one SIGTERM each, not two."""
    if scope not in STOP_SCOPES:
        raise ValueError("scope must be one of %s, not %r" % (", ".join(STOP_SCOPES), scope))
    handles = process.handles(sorted(set(pids) | set(process.members(leader)) | {leader}))
    targets = sorted(h.pid for h in handles)
    heads = [h for h in handles if h.pid == leader and process.running(h)] if scope == "leader" else []
    for head in heads:
        try:
            head.send_signal(signal.SIGTERM)
        except process.psutil.Error:
            pass
    rest_signalled = not heads
    if rest_signalled:
        signal_all(leader, handles, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _still(leader, handles):
        if not rest_signalled and not any(process.running(h) for h in heads):
            signal_all(leader, handles, signal.SIGTERM)
            rest_signalled = True
        time.sleep(0.2)
    killed = _still(leader, handles)
    if killed:
        handles = process.handles(sorted(set(killed) | set(h.pid for h in handles if process.running(h))))
        signal_all(leader, handles, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _still(leader, handles):
            time.sleep(0.1)
    return {"pids": sorted(set(targets) | set(killed)), "killed": killed, "remaining": _still(leader, handles)}


class Supervisor(object):
    """Bring one service instance to a state. ``healthy(url)`` returns True when the process answers its health URL.

    ``name`` is what the process is in the sentences of a failure (``engine``, ``etcd``); ``ports_hint`` names the
    variables that set its ports, in the sentence for a taken port; ``stop_scope`` who gets a stop's first SIGTERM
    (``stop_group``).
    """

    def __init__(self, files, healthy, check_mode=False, clock=time.monotonic, sleep=time.sleep, name="service",
                 ports_hint="", stop_scope="group"):
        if stop_scope not in STOP_SCOPES:
            raise ServiceError("stop_scope must be one of %s, not %r." % (", ".join(STOP_SCOPES), stop_scope))
        self.stop_scope = stop_scope
        self.files = files
        self.name = name
        self.ports_hint = ports_hint
        self.healthy = healthy
        self.check_mode = check_mode
        self.clock = clock
        self.sleep = sleep
        self._child = None

    def _lock(self):
        handle = open(self.files.pidfile + ".lock", "w")  # pylint: disable=consider-using-with
        fcntl.flock(handle, fcntl.LOCK_EX)
        return handle

    def _never_ran(self):
        """True when the instance's folder does not exist: no process of it can run, and nothing is to be written."""
        return not os.path.isdir(os.path.dirname(os.path.abspath(self.files.pidfile)))

    def ensure_stopped(self, timeout):
        if self._never_ran():
            return {"changed": False, "state": "stopped", "stopped_pids": [], "foreign": None}
        with self._lock():
            current = status(self.files)
            result = {"changed": False, "state": "stopped", "stopped_pids": [], "foreign": current["foreign"]}
            if current["running"] or current["leftovers"]:
                result["changed"] = True
                result["stopped_pids"] = current["pids"] or [current["recorded_pid"]]
                if not self.check_mode:
                    stopped = stop_group(current["recorded_pid"], current["pids"], timeout, self.stop_scope)
                    if stopped["remaining"]:
                        raise ServiceError(
                            "Cannot stop the %s: processes %s are still running after SIGKILL."
                            % (self.name, " ".join(map(str, stopped["remaining"]))), remaining=stopped["remaining"])
                    result["stopped_pids"] = stopped["pids"]
                    result["killed"] = stopped["killed"]
            if not self.check_mode and (current["recorded_pid"] is not None or os.path.exists(self.files.runfile)):
                self.files.remove()
            return result

    def ensure_started(self, checksum, health_url, host, ports, start_timeout, stop_timeout):
        if self._never_ran():
            if not self.check_mode:
                raise ServiceError("The launcher %s is missing or not executable." % self.files.launcher)
            return {"changed": True, "state": "started", "started": True, "restarted": False, "foreign": None,
                    "pid": None, "pids": [], "rss_kib": 0, "start_seconds": None}
        with self._lock():
            current = status(self.files)
            if current["running"] and current["checksum"] == checksum:
                return self._running(current, health_url)
            result = {"changed": True, "state": "started", "started": True,
                      "restarted": bool(current["running"]), "foreign": current["foreign"]}
            if self.check_mode:
                result.update(pid=None, pids=[], rss_kib=0, start_seconds=None)
                return result
            if current["running"] or current["leftovers"]:
                stopped = stop_group(current["recorded_pid"], current["pids"], stop_timeout, self.stop_scope)
                if stopped["remaining"]:
                    raise ServiceError(
                        "Cannot restart the %s: processes %s of the old one are still running after SIGKILL."
                        % (self.name, " ".join(map(str, stopped["remaining"]))), remaining=stopped["remaining"])
            self.files.remove()
            busy, message = process.busy_ports(host, ports)
            if busy:
                hint = " (%s)" % self.ports_hint if self.ports_hint else ""
                raise ServiceError("Cannot start the %s on %s: %s; stop that process or choose other ports%s."
                                   % (self.name, host, message, hint), busy=busy)
            pid = self._spawn(checksum)
            result.update(self._wait(pid, health_url, start_timeout))
            return result

    def _running(self, current, health_url):
        if not self.healthy(health_url):
            raise ServiceError(
                "The %s (pid %d) runs with these settings but %s does not answer; see its log %s."
                % (self.name, current["pid"], health_url, self.files.log), pid=current["pid"], log_tail=log_tail(self.files.log))
        return {"changed": False, "state": "started", "started": False, "restarted": False, "pid": current["pid"],
                "pids": current["pids"], "rss_kib": current["rss_kib"], "start_seconds": None, "foreign": None}

    def _spawn(self, checksum):
        if not os.access(self.files.launcher or "", os.X_OK):
            raise ServiceError("The launcher %s is missing or not executable." % self.files.launcher)
        with open(self.files.log, "wb") as log:
            proc = subprocess.Popen(  # pylint: disable=consider-using-with
                [self.files.launcher], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True, cwd=os.path.dirname(os.path.abspath(self.files.pidfile)),
            )
        self.files.write(proc.pid, checksum)
        self._child = proc  # reaped when it exits during start-up; otherwise it outlives this process
        return proc.pid

    def _wait(self, pid, health_url, timeout):
        started = self.clock()
        deadline = started + timeout
        while True:
            if self._child.poll() is not None or process.start_ticks(pid) is None:
                reason = "The %s exited during start-up" % self.name
                break
            if self.healthy(health_url):
                pids = process.members(pid)
                return {"pid": pid, "pids": pids, "rss_kib": process.rss_kib(pids),
                        "start_seconds": round(self.clock() - started, 1)}
            if self.clock() >= deadline:
                reason = "The %s was not ready within %d s" % (self.name, timeout)
                break
            self.sleep(1)
        stop_group(pid, process.members(pid), 10)
        self.files.remove()
        tail = log_tail(self.files.log)
        raise ServiceError(
            "%s (%s) and was stopped; last log lines: %s" % (reason, self.files.log, " | ".join(tail[-8:])),
            reason=reason, pid=pid, log_tail=tail, start_seconds=round(self.clock() - started, 1))


# The record a role publishes of a service instance it runs (local_engine_info.service, a simulated engine's service): what
# restarts it from outside a playbook (a benchmark that restarts an engine part way, as local_service would).
SERVICE_KEYS = ("name", "launcher", "log", "pidfile", "runfile", "health_url", "host", "ports", "start_timeout", "stop_timeout",
                "stop_scope")


def restart(service, healthy, clock=time.monotonic, sleep=time.sleep):
    """Stop, then start again, the instance ``service`` records (its launcher as it is): ``ensure_stopped`` and
    ``ensure_started`` in turn, as local_service's ``stopped`` then ``started``; the start's result."""
    missing = [key for key in ("launcher", "log", "pidfile", "runfile", "health_url") if not service.get(key)]
    if missing:
        raise ServiceError("The service record lacks %s; restart it through its role, whose record (local_engine_info.service) "
                           "has them." % ", ".join(missing))
    files = ServiceFiles(service["pidfile"], service["runfile"], log=service["log"], launcher=service["launcher"])
    supervisor = Supervisor(files, healthy, clock=clock, sleep=sleep, name=service.get("name") or "service",
                            stop_scope=service.get("stop_scope") or "group")
    stop_timeout = int(service.get("stop_timeout") or 30)
    supervisor.ensure_stopped(stop_timeout)
    return supervisor.ensure_started(file_checksum(service["launcher"]) or "", service["health_url"], service.get("host") or "127.0.0.1",
                                     [int(port) for port in service.get("ports") or []], int(service.get("start_timeout") or 300),
                                     stop_timeout)
