# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""Process control of a local engine started from a launcher script (Linux, standard library only, no Ansible import).

One engine instance is described by four files: the launcher it runs, its log, its pid file (the pid alone, one line)
and its run file, which records the settings checksum it was started with and the identity of the process: its start
time in clock ticks since boot and the boot id. A pid is only signalled when the live process with that pid is the one
recorded (same boot, same start time), so a pid reused by an unrelated process (after a reboot, or after the engine
died) is never killed. A run file from before identities were recorded (one line, the checksum) is accepted when the
process started before its pid file was written.

``EngineService.ensure_started`` and ``ensure_stopped`` are what the module local_engine_service calls; the health probe
is passed in, so this file needs no HTTP client.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import errno
import fcntl
import hashlib
import json
import os
import signal
import socket
import subprocess
import time

from ..common.errors import CheckError

# A legacy run file (no identity) is trusted when the process started at most this long after its pid file was written.
LEGACY_START_SLACK = 2.0


class EngineProcessError(CheckError):
    """One sentence for the user, with the facts for the result (``facts``, given as keywords)."""

    def __init__(self, message, **facts):
        super(EngineProcessError, self).__init__(message, facts)


def _read(path):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except (IOError, OSError):
        return None


def _stat(pid):
    """The fields of /proc/<pid>/stat after the command name (state first), or None when gone or a zombie."""
    raw = _read("/proc/%d/stat" % pid)
    if not raw:
        return None
    # The command name is in parentheses and may contain spaces; the fields after it are fixed.
    rest = raw[raw.rfind(")") + 2:].split()
    if not rest or rest[0] in ("Z", "X"):
        return None
    return rest


def start_ticks(pid):
    """Start time of a live process in clock ticks since boot (field 22 of /proc/<pid>/stat), None when gone."""
    rest = _stat(pid)
    return int(rest[19]) if rest else None


def boot_id():
    return _read("/proc/sys/kernel/random/boot_id") or ""


def _boot_time():
    for line in (_read("/proc/stat") or "").splitlines():
        if line.startswith("btime "):
            return int(line.split()[1])
    return 0


def started_at(pid):
    """Start time of a live process as a Unix time (to about a second), None when gone."""
    ticks = start_ticks(pid)
    return None if ticks is None else _boot_time() + ticks / float(os.sysconf("SC_CLK_TCK"))


def cmdline(pid):
    raw = _read("/proc/%d/cmdline" % pid) if pid else None
    return raw.replace("\0", " ").strip() if raw else ""


def members(leader):
    """PIDs of every live process in the session or process group led by ``leader``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        rest = _stat(int(name))
        if rest and (int(rest[2]) == leader or int(rest[3]) == leader):
            found.append(int(name))
    return sorted(found)


def rss_kib(pids):
    total = 0
    for pid in pids:
        for line in (_read("/proc/%d/status" % pid) or "").splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total


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


def _listeners(port):
    """Owners (pid and command line) of the sockets listening on ``port`` (IPv4 and IPv6)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in (_read(table) or "").splitlines()[1:]:
            cols = line.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    owners = []
    if not inodes:
        return owners
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fd_dir = "/proc/%s/fd" % name
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                owners.append({"pid": int(name), "cmdline": cmdline(int(name))[:200]})
                break
    return owners


def busy_ports(host, ports):
    """The ports of ``ports`` that cannot be bound on ``host``, each with its owners, and one sentence naming them."""
    busy = []
    for port in ports:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except (IOError, OSError) as exc:
            if exc.errno != errno.EADDRINUSE:
                raise EngineProcessError("Cannot check port %d on %s: %s." % (port, host, exc.strerror or exc))
            busy.append({"port": port, "owners": _listeners(port)})
        finally:
            sock.close()
    descriptions = []
    for item in busy:
        who = ", ".join("pid %d (%s)" % (o["pid"], o["cmdline"] or "?") for o in item["owners"]) or "an unknown process"
        descriptions.append("port %d is taken by %s" % (item["port"], who))
    return busy, "; ".join(descriptions)


class EngineFiles(object):
    """The files of one engine instance."""

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
        record = {"checksum": checksum, "pid": pid, "start_ticks": start_ticks(pid), "boot_id": boot_id(),
                  "cmdline": cmdline(pid)[:500]}
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
    """Whether ``pid`` is the engine the files describe: (True, None) or (False, why not)."""
    if pid is None:
        return False, "no pid file"
    ticks = start_ticks(pid)
    if ticks is None:
        return False, "pid %d is gone" % pid
    if record.get("start_ticks") is not None:
        if record.get("boot_id") != boot_id():
            return False, "pid %d was recorded before the last reboot" % pid
        if record.get("pid") != pid or record.get("start_ticks") != ticks:
            return False, "pid %d is now another process (%s)" % (pid, cmdline(pid)[:200] or "?")
        return True, None
    if not record.get("checksum"):
        return False, "pid %d has no run file recording it (%s)" % (pid, cmdline(pid)[:200] or "?")
    try:
        written = os.stat(pidfile).st_mtime
    except OSError:
        return False, "no pid file"
    if started_at(pid) > written + LEGACY_START_SLACK:
        return False, "pid %d is now another process (%s), started after the pid file was written" % (
            pid, cmdline(pid)[:200] or "?")
    return True, None


def status(files):
    """What runs for these files: a dict with running, pid, pids, checksum, foreign (a live pid that is not the engine)."""
    pid, record = files.read()
    running, why_not = identify(pid, record, files.pidfile)
    leftovers = []
    if not running and pid is not None and record.get("boot_id") == boot_id() and start_ticks(pid) is None:
        # The leader is gone but processes of its session may remain (Linux never reuses a pid while it names a live
        # session or process group): those belong to the engine.
        leftovers = members(pid)
    pids = members(pid) if running else leftovers
    foreign = None
    if not running and pid is not None and start_ticks(pid) is not None:
        foreign = {"pid": pid, "cmdline": cmdline(pid)[:200], "reason": why_not}
    return {
        "running": running,
        "pid": pid if running else None,
        "recorded_pid": pid,
        "pids": pids,
        "leftovers": leftovers,
        "rss_kib": rss_kib(pids),
        "checksum": record.get("checksum") if running else None,
        "stale": pid is not None and not running,
        "foreign": foreign,
    }


def _signal_all(leader, pids, signum):
    try:
        os.killpg(leader, signum)
    except OSError:
        pass
    for pid in pids:
        try:
            os.kill(pid, signum)
        except OSError:
            pass


def stop_group(leader, pids, timeout):
    """SIGTERM the session of ``leader`` and ``pids``, a bounded wait, SIGKILL what is left; returns what remains."""
    targets = sorted(set(pids) | ({leader} if start_ticks(leader) is not None else set()))
    _signal_all(leader, targets, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _still(leader, targets):
        time.sleep(0.2)
    left = _still(leader, targets)
    killed = list(left)
    if left:
        _signal_all(leader, left, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _still(leader, targets):
            time.sleep(0.1)
    return {"pids": targets, "killed": killed, "remaining": _still(leader, targets)}


def _still(leader, targets):
    return sorted(set(members(leader)) | set(p for p in targets if start_ticks(p) is not None))


class EngineService(object):
    """Bring one engine instance to a state. ``healthy(url)`` returns True when the engine answers its health URL."""

    def __init__(self, files, healthy, check_mode=False, clock=time.monotonic, sleep=time.sleep, name="engine",
                 ports_hint="local_engine_port, local_engine_kv_events_replay_endpoint"):
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
        """True when the instance's folder does not exist: no engine of it can run, and nothing is to be written."""
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
                    stopped = stop_group(current["recorded_pid"], current["pids"], timeout)
                    if stopped["remaining"]:
                        raise EngineProcessError(
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
                raise EngineProcessError("The launcher %s is missing or not executable." % self.files.launcher)
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
                stopped = stop_group(current["recorded_pid"], current["pids"], stop_timeout)
                if stopped["remaining"]:
                    raise EngineProcessError(
                        "Cannot restart the %s: processes %s of the old one are still running after SIGKILL."
                        % (self.name, " ".join(map(str, stopped["remaining"]))), remaining=stopped["remaining"])
            self.files.remove()
            busy, message = busy_ports(host, ports)
            if busy:
                raise EngineProcessError("Cannot start the %s on %s: %s; stop that process or choose other ports "
                                         "(%s)." % (self.name, host, message, self.ports_hint),
                                         busy=busy)
            pid = self._spawn(checksum)
            result.update(self._wait(pid, health_url, start_timeout))
            return result

    def _running(self, current, health_url):
        if not self.healthy(health_url):
            raise EngineProcessError(
                "The %s (pid %d) runs with these settings but %s does not answer; see its log %s."
                % (self.name, current["pid"], health_url, self.files.log), pid=current["pid"], log_tail=log_tail(self.files.log))
        return {"changed": False, "state": "started", "started": False, "restarted": False, "pid": current["pid"],
                "pids": current["pids"], "rss_kib": current["rss_kib"], "start_seconds": None, "foreign": None}

    def _spawn(self, checksum):
        if not os.access(self.files.launcher or "", os.X_OK):
            raise EngineProcessError("The launcher %s is missing or not executable." % self.files.launcher)
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
            if self._child.poll() is not None or start_ticks(pid) is None:
                reason = "The %s exited during start-up" % self.name
                break
            if self.healthy(health_url):
                pids = members(pid)
                return {"pid": pid, "pids": pids, "rss_kib": rss_kib(pids),
                        "start_seconds": round(self.clock() - started, 1)}
            if self.clock() >= deadline:
                reason = "The %s was not ready within %d s" % (self.name, timeout)
                break
            self.sleep(1)
        stop_group(pid, members(pid), 10)
        self.files.remove()
        tail = log_tail(self.files.log)
        raise EngineProcessError(
            "%s (%s) and was stopped; last log lines: %s" % (reason, self.files.log, " | ".join(tail[-8:])),
            reason=reason, pid=pid, log_tail=tail, start_seconds=round(self.clock() - started, 1))
