# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""Facts about the processes of this machine, read through psutil (Linux; no Ansible import).

What the supervisor (``service/supervisor.py``) needs to know of a process: whether it lives (a zombie does not), its
identity (its start time in clock ticks since boot, and the boot id, so a pid reused after a reboot or after the process
died is told apart), its command line, the processes of its session or process group and their descendants, their
resident memory, and who listens on a TCP port. psutil is imported when present; without it ``HAS_PSUTIL`` is false
and the module fails with ``missing_required_lib`` before calling anything here (community.general's ``pids`` does the
same).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import collections
import errno
import os
import socket
import traceback

try:
    import psutil
    HAS_PSUTIL = True
    PSUTIL_IMPORT_ERROR = None
except ImportError:  # pragma: no cover - exercised through the module's missing_required_lib path
    psutil = None
    HAS_PSUTIL = False
    PSUTIL_IMPORT_ERROR = traceback.format_exc()

from ..common.errors import CheckError

BOOT_ID = "/proc/sys/kernel/random/boot_id"

# One live process of ``_process_table``: its parent, its session and its process group.
Lineage = collections.namedtuple("Lineage", "ppid sid pgid")


class ServiceError(CheckError):
    """One sentence for the user, with the facts for the result (``facts``, given as keywords)."""

    def __init__(self, message, **facts):
        super(ServiceError, self).__init__(message, facts)


def _gone_states():
    return (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


def _live(pid):
    """The psutil Process of a live pid (not a zombie), None when there is none."""
    if not pid:
        return None
    try:
        proc = psutil.Process(pid)
        return None if proc.status() in _gone_states() else proc
    except psutil.Error:
        return None


def boot_id():
    """The kernel's id of this boot (it changes at every reboot), empty when unreadable."""
    try:
        with open(BOOT_ID) as handle:
            return handle.read().strip()
    except (IOError, OSError):
        return ""


def start_ticks(pid):
    """Start time of a live process in clock ticks since boot (as /proc/<pid>/stat has it), None when gone.

    psutil gives the start as a Unix time (the ticks over the clock rate, plus the boot time): taking the boot time off
    again gives back the kernel's integer, which no clock change after the start alters.
    """
    proc = _live(pid)
    if proc is None:
        return None
    try:
        since_boot = proc.create_time() - psutil.boot_time()
    except psutil.Error:
        return None
    return int(round(since_boot * os.sysconf("SC_CLK_TCK")))


def started_at(pid):
    """Start time of a live process as a Unix time, None when gone."""
    proc = _live(pid)
    try:
        return proc.create_time() if proc else None
    except psutil.Error:
        return None


def cmdline(pid):
    """The command line of a live process, one string; empty when gone or unreadable."""
    proc = _live(pid)
    try:
        return " ".join(proc.cmdline()).strip() if proc else ""
    except psutil.Error:
        return ""


def identity(pid):
    """What tells this process apart from any later one with its pid: pid, start ticks, boot id, command line."""
    return {"pid": pid, "start_ticks": start_ticks(pid), "boot_id": boot_id(), "cmdline": cmdline(pid)[:500]}


def _process_table():
    """{pid: Lineage} of every live process that can be read."""
    table = {}
    for proc in psutil.process_iter(["ppid", "status"]):
        info = proc.info
        if info.get("status") in _gone_states() or info.get("ppid") is None:
            continue
        try:
            table[proc.pid] = Lineage(info["ppid"], os.getsid(proc.pid), os.getpgid(proc.pid))
        except OSError:
            continue
    return table


def members(leader):
    """PIDs of every live process in the session or process group led by ``leader``, and of their descendants.

    A process stays in its session and group when its parent dies, and Linux never gives a pid to a new process while
    it names a live session or group; a descendant that left the group (``setsid``) is found through its parents.
    """
    if not leader:
        return []
    table = _process_table()
    found = set(pid for pid, lineage in table.items() if leader in (lineage.sid, lineage.pgid))
    grown = True
    while grown and found:
        more = set(pid for pid, lineage in table.items() if lineage.ppid in found) - found
        found |= more
        grown = bool(more)
    return sorted(found)


def group(leader):
    """PIDs of the live processes whose process group is ``leader``'s (while there are any, no new process gets its id)."""
    return sorted(pid for pid, lineage in _process_table().items() if lineage.pgid == leader) if leader else []


def rss_kib(pids):
    """Resident memory of ``pids`` together, in KiB (a process gone meanwhile counts nothing)."""
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            continue
    return total // 1024


def listeners(port):
    """Owners (pid and command line) of the TCP sockets listening on ``port`` (IPv4 and IPv6), by pid."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except psutil.Error:
        return []
    pids = sorted(set(c.pid for c in connections
                      if c.pid and c.status == psutil.CONN_LISTEN and c.laddr and c.laddr[1] == port))
    return [{"pid": pid, "cmdline": cmdline(pid)[:200]} for pid in pids]


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
                raise ServiceError("Cannot check port %d on %s: %s." % (port, host, exc.strerror or exc))
            busy.append({"port": port, "owners": listeners(port)})
        finally:
            sock.close()
    descriptions = []
    for item in busy:
        who = ", ".join("pid %d (%s)" % (o["pid"], o["cmdline"] or "?") for o in item["owners"]) or "an unknown process"
        descriptions.append("port %d is taken by %s" % (item["port"], who))
    return busy, "; ".join(descriptions)


def handles(pids):
    """psutil Process objects of the live ``pids``: a signal sent through one never reaches a later process that
    reused its pid (psutil compares the start time first)."""
    found = []
    for pid in pids:
        proc = _live(pid)
        if proc is not None:
            found.append(proc)
    return found


def running(handle):
    """Whether the process behind a handle of ``handles`` still lives (the same process, not a zombie)."""
    try:
        return handle.is_running() and handle.status() not in _gone_states()
    except psutil.Error:
        return False
