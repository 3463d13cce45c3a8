# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Process control for the local engine of the inference_cache.substrate.local_engine role.

Standard library only; runs on the managed host. Every sub-command prints one JSON object.

  status --pidfile F --runfile F                       is the engine alive, with which settings checksum
  ports  --host H --port P [--port P ...]              which of the ports are taken, and by which process
  start  --launcher F --log F --pidfile F --runfile F --checksum C   refuses while the pid file names a live engine
  wait   --pidfile F --runfile F --url U --log F --timeout S      bounded wait for /health; stops the engine on failure
  stop   --pidfile F --runfile F --timeout S           SIGTERM the session, bounded wait, SIGKILL what is left
"""

import argparse
import errno
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request


def _read(path):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return None


def _stat_fields(pid):
    """Return (ppid, pgrp, session) of a process, or None when it is gone."""
    raw = _read("/proc/%d/stat" % pid)
    if not raw:
        return None
    # The command name is in parentheses and may contain spaces; the fields after it are fixed.
    rest = raw[raw.rfind(")") + 2:].split()
    if rest[0] == "Z":
        return None
    return int(rest[1]), int(rest[2]), int(rest[3])


def _alive(pid):
    return pid is not None and _stat_fields(pid) is not None


def _members(leader):
    """PIDs of every live process in the session or process group led by ``leader``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(int(name))
        if fields and (fields[1] == leader or fields[2] == leader):
            found.append(int(name))
    return sorted(found)


def _rss_kib(pids):
    total = 0
    for pid in pids:
        for line in (_read("/proc/%d/status" % pid) or "").splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total


def _pid_from(pidfile):
    raw = _read(pidfile)
    return int(raw) if raw and raw.isdigit() else None


def _tail(path, lines=25):
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 65536))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]


def _cmdline(pid):
    raw = _read("/proc/%d/cmdline" % pid) if pid else None
    return raw.replace("\0", " ").strip() if raw else ""


def cmd_status(args):
    pid = _pid_from(args.pidfile)
    alive = _alive(pid)
    members = _members(pid) if alive else []
    return {
        "alive": alive,
        "pid": pid,
        "stale_pidfile": pid is not None and not alive,
        "running_checksum": _read(args.runfile) if alive else None,
        "pids": members,
        "rss_kib": _rss_kib(members),
        "cmdline": _cmdline(pid) if alive else "",
    }


def _listeners(port):
    """Map socket inodes listening on ``port`` (IPv4 and IPv6) to their owners."""
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
                owners.append({"pid": int(name), "cmdline": _cmdline(int(name))[:200]})
                break
    return owners


def cmd_ports(args):
    busy = []
    for port in args.port:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((args.host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            owners = _listeners(port)
            busy.append({"port": port, "owners": owners})
        finally:
            sock.close()
    descriptions = []
    for item in busy:
        who = ", ".join("pid %d (%s)" % (o["pid"], o["cmdline"] or "?") for o in item["owners"]) or "an unknown process"
        descriptions.append("port %d is taken by %s" % (item["port"], who))
    return {"busy": busy, "message": "; ".join(descriptions)}


def cmd_start(args):
    # Two runs of the role on one instance at once: the first start wins, the second says so instead of starting a
    # second engine over the first one's pid file.
    with open(args.pidfile + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        running = _pid_from(args.pidfile)
        if _alive(running):
            return {"pid": running, "started": False,
                    "message": "another run started this engine instance meanwhile (pid %d); run the play again" % running}
        with open(args.log, "wb") as log:
            proc = subprocess.Popen(  # pylint: disable=consider-using-with
                [args.launcher], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True,
            )
        with open(args.pidfile, "w") as handle:
            handle.write("%d\n" % proc.pid)
        with open(args.runfile, "w") as handle:
            handle.write(args.checksum + "\n")
    return {"pid": proc.pid, "started": True}


def _stop(pid, timeout):
    members = _members(pid) if pid else []
    if pid and _alive(pid) and pid not in members:
        members.append(pid)
    if not members:
        return {"stopped": False, "pids": [], "killed": []}
    try:
        os.killpg(pid, signal.SIGTERM)
    except OSError:
        pass
    for other in members:
        try:
            os.kill(other, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _members(pid):
        time.sleep(0.2)
    left = _members(pid)
    for other in left:
        try:
            os.kill(other, signal.SIGKILL)
        except OSError:
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _members(pid):
        time.sleep(0.1)
    return {"stopped": True, "pids": members, "killed": left, "remaining": _members(pid)}


def _remove(*paths):
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass


def cmd_stop(args):
    pid = _pid_from(args.pidfile)
    result = _stop(pid, args.timeout)
    _remove(args.pidfile, args.runfile)
    return result


def _healthy(url, api_key):
    request = urllib.request.Request(url)
    if api_key:
        request.add_header("Authorization", "Bearer " + api_key)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # nosec - loopback URL from the role
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def cmd_wait(args):
    pid = _pid_from(args.pidfile)
    api_key = os.environ.get("LOCAL_ENGINE_API_KEY", "")
    started = time.monotonic()
    deadline = started + args.timeout
    reason = None
    while True:
        if not _alive(pid):
            reason = "the engine exited during start-up"
            break
        if _healthy(args.url, api_key):
            members = _members(pid)
            return {"ready": True, "pid": pid, "elapsed": round(time.monotonic() - started, 1),
                    "pids": members, "rss_kib": _rss_kib(members)}
        if time.monotonic() >= deadline:
            reason = "the engine was not ready within %d s" % args.timeout
            break
        time.sleep(1)
    stopped = _stop(pid, 10)
    _remove(args.pidfile, args.runfile)
    return {"ready": False, "reason": reason, "pid": pid, "elapsed": round(time.monotonic() - started, 1),
            "stopped": stopped, "log_tail": _tail(args.log)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("status")
    p.add_argument("--pidfile", required=True)
    p.add_argument("--runfile", required=True)
    p = sub.add_parser("ports")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, action="append", required=True)
    p = sub.add_parser("start")
    for name in ("--launcher", "--log", "--pidfile", "--runfile", "--checksum"):
        p.add_argument(name, required=True)
    p = sub.add_parser("wait")
    for name in ("--pidfile", "--runfile", "--url", "--log"):
        p.add_argument(name, required=True)
    p.add_argument("--timeout", type=int, default=300)
    p = sub.add_parser("stop")
    p.add_argument("--pidfile", required=True)
    p.add_argument("--runfile", required=True)
    p.add_argument("--timeout", type=int, default=30)
    args = parser.parse_args(argv)
    handler = {"status": cmd_status, "ports": cmd_ports, "start": cmd_start, "wait": cmd_wait, "stop": cmd_stop}
    print(json.dumps(handler[args.command](args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
