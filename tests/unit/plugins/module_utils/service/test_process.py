# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The process facts of service/process.py (psutil), held against real throwaway processes and against the kernel's
own /proc tables: the start ticks the run files record, the members of a group and their descendants, RSS, the owner
of a listening port."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.service import process as P


def _kernel_start_ticks(pid):
    """Field 22 of /proc/<pid>/stat, read by hand as the run files of the collection's first versions recorded it."""
    with open("/proc/%d/stat" % pid) as handle:
        raw = handle.read()
    return int(raw[raw.rfind(")") + 2:].split()[19])


def _wait_for(predicate, what, bound=30.0):
    """Poll ``predicate`` within a bound (a shell forks in milliseconds, later on a loaded machine)."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("not within %.0f s: %s" % (bound, what))


@pytest.fixture
def group():
    """A session of its own: a shell that runs a child in its group, a child that left the group (setsid), then
    becomes ``sleep 302`` (the leader). Killed whole at the end, whatever the test asserted."""
    proc = subprocess.Popen(["sh", "-c", "sleep 300 & setsid sleep 301 & exec sleep 302"],  # pylint: disable=consider-using-with
                            start_new_session=True)
    try:
        # Each has exec'd its sleep (for a moment a child is still the shell's fork, or setsid before its exec).
        _wait_for(lambda: sorted(P.cmdline(pid) for pid in P.members(proc.pid)) == ["sleep 300", "sleep 301", "sleep 302"],
                  "the leader and its two children")
        yield proc
    finally:  # psutil's own walk of the children too, so a broken members() leaves nothing behind either
        children = [child.pid for child in P.psutil.Process(proc.pid).children(recursive=True)]
        for pid in set(P.members(proc.pid)) | set(children):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        proc.kill()
        proc.wait()


def test_psutil_is_there():
    assert P.HAS_PSUTIL and P.PSUTIL_IMPORT_ERROR is None


def test_start_ticks_are_the_kernels(group):
    """The identity recorded through psutil equals /proc's integer, so run files of running processes stay valid."""
    for pid in P.members(group.pid):
        assert P.start_ticks(pid) == _kernel_start_ticks(pid)
    assert P.identity(group.pid) == {"pid": group.pid, "start_ticks": _kernel_start_ticks(group.pid),
                                     "boot_id": P.boot_id(), "cmdline": "sleep 302"}
    with open("/proc/sys/kernel/random/boot_id") as handle:
        assert P.boot_id() == handle.read().strip() != ""
    assert abs(P.started_at(group.pid) - time.time()) < 120


def test_members_count_children_and_descendants(group):
    members = P.members(group.pid)
    assert group.pid in members and len(members) == 3
    children = [pid for pid in members if pid != group.pid]
    assert sorted(P.cmdline(pid) for pid in children) == ["sleep 300", "sleep 301"]
    # The setsid child is no member of the group: it is counted as a descendant.
    assert P.group(group.pid) == sorted(pid for pid in members if P.cmdline(pid) != "sleep 301")
    assert P.members(0) == [] and P.group(0) == []


def test_rss_is_counted(group):
    members = P.members(group.pid)
    total = P.rss_kib(members)
    assert total > 0 and total == sum(P.rss_kib([pid]) for pid in members)
    with open("/proc/%d/status" % group.pid) as handle:
        vm_rss = [int(line.split()[1]) for line in handle if line.startswith("VmRSS:")][0]
    assert abs(P.rss_kib([group.pid]) - vm_rss) <= 8


def test_a_zombie_is_gone():
    proc = subprocess.Popen(["true"])  # pylint: disable=consider-using-with
    try:
        _wait_for(lambda: P.start_ticks(proc.pid) is None, "the exited child becomes a zombie")
        assert P.cmdline(proc.pid) == "" and P.handles([proc.pid]) == [] and P.members(proc.pid) == []
        assert P.rss_kib([proc.pid]) == 0 and P.identity(proc.pid)["start_ticks"] is None
    finally:
        proc.wait()


def test_a_handle_never_signals_a_later_process():
    """A handle holds the start time: once its process is gone, sending it a signal reaches nothing."""
    proc = subprocess.Popen(["sleep", "300"])  # pylint: disable=consider-using-with
    handle = P.handles([proc.pid])[0]
    assert P.running(handle)
    proc.kill()
    proc.wait()
    assert not P.running(handle)
    with pytest.raises(P.psutil.NoSuchProcess):
        handle.send_signal(signal.SIGTERM)


def test_busy_ports_names_the_owner():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        busy, message = P.busy_ports("127.0.0.1", [port])
        assert [b["port"] for b in busy] == [port] and busy[0]["owners"][0]["pid"] == os.getpid()
        assert ("port %d is taken by pid %d" % (port, os.getpid())) in message
    assert P.busy_ports("127.0.0.1", [port]) == ([], "")


def test_the_owner_of_a_listening_port_is_named():
    """A listener in another process: its pid and command line, on IPv4 and on IPv6 (when this machine has it)."""
    server = subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, "-c", "import socket, sys, time\n"
         "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1)\n"
         "print(s.getsockname()[1], flush=True); time.sleep(300)"], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        owners = P.listeners(port)
        assert [o["pid"] for o in owners] == [server.pid] and owners[0]["cmdline"].startswith(sys.executable + " -c import socket")
        busy, message = P.busy_ports("127.0.0.1", [port])
        assert busy == [{"port": port, "owners": owners}]
        assert message == "port %d is taken by pid %d (%s)" % (port, server.pid, owners[0]["cmdline"])
    finally:
        server.kill()
        server.wait()
        server.stdout.close()
    assert P.listeners(port) == []


def test_a_port_nobody_listens_on_has_no_owner():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, not listening: no owner, and free for a start with SO_REUSEADDR
        port = sock.getsockname()[1]
        assert P.listeners(port) == []


def test_a_port_that_cannot_be_checked_is_one_sentence():
    with pytest.raises(P.ServiceError) as info:
        P.busy_ports("192.0.2.1", [8000])  # TEST-NET-1: not an address of this machine
    assert str(info.value).startswith("Cannot check port 8000 on 192.0.2.1: ") and str(info.value).endswith(".")
