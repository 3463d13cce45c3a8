# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""A program confined to a network namespace whose only interface is loopback, bridged to this machine's loopback
through Unix sockets (pure Python, no Ansible).

A program that listens on every interface and has no bind flag (the EPPs: ``epp/local.py``) runs here with
``unshare --net --map-root-user``: nothing it opens is reachable from the network. What it must reach (``reach``:
``(host, port)`` pairs on the host's loopback) is bridged in, and the ports it serves (``serve``) are bridged out to
127.0.0.1, each through a Unix socket in a private folder of the temporary folder (a socket's path holds at most 107
bytes, which a folder under a long HOME exceeds). ``Confined(...).ports`` maps each served port to its host port.

Run with ``--inside SPEC -- COMMAND`` (``Confined`` does it, through the collection's loader, ``plugins/module_utils/_loader.py``,
however this module was loaded here), this module is the namespace's side of the bridge: loopback up, TCP listeners for
what the command reaches, Unix listeners for what it serves, then the command itself. ``run(spec, command)`` keeps a
confined program in the foreground until SIGTERM (``roles/simulated_engine/files/confined.py`` is its entry).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import fcntl
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

from ..common.duplex import duplex
from ..common.errors import CheckError

# The namespace's side runs this module through the collection's one loader, beside this package's folders.
_LOADER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_loader.py")
SUN_PATH_MAX = 107


class ConfinementError(CheckError):
    """One sentence: why the program cannot be confined, and what to do."""


def is_loopback(host):
    try:
        return socket.inet_aton(host)[0] == 127
    except OSError:
        return host == "localhost"


# ---- the bridge: TCP on one loopback <-> a Unix socket in a shared folder <-> TCP on the other loopback ----

def _join(accepted, dial):
    try:
        other = dial()
    except OSError:
        accepted.close()
        return
    duplex(accepted, other)


class Forward:
    """Accept on ``listener``; join each connection to a new one made by ``dial()``, bytes both ways."""

    def __init__(self, listener, dial):
        self.listener = listener
        self.listener.settimeout(0.2)
        self.dial = dial
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stopping.is_set():
            try:
                accepted, _peer = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            accepted.settimeout(None)
            threading.Thread(target=_join, args=(accepted, self.dial), daemon=True).start()

    def stop(self):
        self.stopping.set()
        self.thread.join(2)
        self.listener.close()


def tcp_listener(host, port):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(64)
    return sock


def unix_listener(path):
    if os.path.exists(path):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(64)
    return sock


def dial_tcp(host, port):
    return lambda: socket.create_connection((host, port), timeout=10)


def dial_unix(path):
    def dial():
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        return sock
    return dial


def loopback_up():
    """Bring ``lo`` up in this (new) network namespace: SIOCGIFFLAGS, then SIOCSIFFLAGS with IFF_UP."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        request = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(sock, 0x8913, request))[1]
        fcntl.ioctl(sock, 0x8914, struct.pack("16sH14s", b"lo", flags | 0x1, b""))
    finally:
        sock.close()


def inside(spec, command):
    """The namespace's side: loopback up, TCP listeners for what the command reaches, Unix listeners for what it serves."""
    loopback_up()
    forwards = [Forward(tcp_listener(host, port), dial_unix(path)) for host, port, path in spec["reach"]]
    forwards += [Forward(unix_listener(path), dial_tcp("127.0.0.1", port)) for port, path in spec["serve"]]
    proc = subprocess.Popen(command)  # pylint: disable=consider-using-with

    def stop(_signum, _frame):
        proc.terminate()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    ready = False
    while proc.poll() is None:
        if not ready:
            try:
                for port, _path in spec["serve"]:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                with open(spec["ready"], "w", encoding="utf-8") as out:
                    out.write("ready\n")
                ready = True
            except OSError:
                pass
        time.sleep(0.2)
    for forward in forwards:
        forward.stop()
    return proc.returncode


class StopRequest:
    """SIGTERM or SIGINT, kept for a foreground loop to see (``asked``; ``wait(seconds)`` sleeps unless asked, and says
    whether it was). The handler only sets a flag: one that takes a lock, such as ``threading.Event.set``, deadlocks
    when the signal lands while the main thread holds that lock inside ``Event.wait`` (measured: 1 stop in 300 hung),
    and the process, killed later, leaves its bridge's sockets' folder behind."""

    def __init__(self):
        self.asked = False
        signal.signal(signal.SIGTERM, self._ask)
        signal.signal(signal.SIGINT, self._ask)

    def _ask(self, _signum, _frame):
        self.asked = True

    def wait(self, seconds):
        if not self.asked:
            time.sleep(seconds)   # a signal's handler runs during the sleep, which then goes on (PEP 475)
        return self.asked


def stop_group(proc):
    """SIGTERM to ``proc``'s process group, then SIGKILL after 15 s; each wait bounded."""
    if proc is None or proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


class Confined:
    """``command`` in a network namespace of its own; ``reach`` bridged in, ``serve`` ports bridged out to ``serve_host``
    (127.0.0.1 by default; ``host_ports`` maps a served port to a fixed host port; any other gets a free one). ``label``
    names the program in the sentences (``EPP``). ``log_path`` None: the program writes to this process's output."""

    def __init__(self, command, reach, serve, folder, log_path, host_ports=None, label="program", serve_host="127.0.0.1"):
        unshare = shutil.which("unshare")
        if not unshare:
            raise ConfinementError("Cannot confine the %s to loopback: no unshare command (util-linux); install it, or ask for an "
                                   "unconfined %s, whose ports listen on every interface." % (label, label))
        remote = [host for host, _port in reach if not is_loopback(host)]
        if remote:
            raise ConfinementError("A confined %s reaches loopback addresses only, not %s; run the engines on 127.0.0.0/8, or ask "
                                   "for an unconfined %s." % (label, ", ".join(sorted(set(remote))), label))
        self.folder = folder
        self.forwards = []
        self.proc = None
        self.ports = {}
        self.sockets = tempfile.mkdtemp(prefix="epp-")
        spec = {"reach": [], "serve": [], "ready": os.path.join(folder, "confined-%d.ready" % id(self))}
        try:
            if len(os.path.join(self.sockets, "serve-99.sock")) > SUN_PATH_MAX:
                raise ConfinementError("The temporary folder %s is too long for the bridge's Unix sockets (%d bytes at most); set "
                                       "TMPDIR to a shorter folder." % (self.sockets, SUN_PATH_MAX))
            for i, (host, port) in enumerate(reach):
                path = os.path.join(self.sockets, "reach-%d.sock" % i)
                self.forwards.append(Forward(unix_listener(path), dial_tcp(host, port)))
                spec["reach"].append((host, port, path))
            for i, port in enumerate(serve):
                path = os.path.join(self.sockets, "serve-%d.sock" % i)
                try:
                    listener = tcp_listener(serve_host, (host_ports or {}).get(port, 0))
                except OSError as exc:
                    raise ConfinementError("Cannot serve the %s's port %d on %s:%d: %s; free that port or choose another." % (
                        label, port, serve_host, (host_ports or {}).get(port, 0), exc.strerror or exc))
                self.ports[port] = listener.getsockname()[1]
                self.forwards.append(Forward(listener, dial_unix(path)))
                spec["serve"].append((port, path))
        except BaseException:
            self.stop()
            raise
        self.ready_path = spec["ready"]
        self.cmd = ([unshare, "--net", "--map-root-user", sys.executable, _LOADER, "service.confine", "--inside", json.dumps(spec), "--"]
                    + list(command))
        self.log_path = log_path

    def start(self, env=None):
        if self.log_path is None:
            self.proc = subprocess.Popen(self.cmd, start_new_session=True, env=env)  # pylint: disable=consider-using-with
            return self.proc
        with open(self.log_path, "w", encoding="utf-8") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)  # pylint: disable=consider-using-with
        return self.proc

    def ready(self):
        return os.path.exists(self.ready_path)

    def stop(self):
        # The sockets' folder first: the program may take its time to exit (up to stop_group's bounds), and whoever
        # stops this process may kill it meanwhile (local_service: SIGKILL after its stop timeout); the folder is in the
        # temporary folder, where nothing else would remove it. New connections are refused from here on.
        shutil.rmtree(self.sockets, ignore_errors=True)
        try:
            stop_group(self.proc)
        finally:
            for forward in self.forwards:
                forward.stop()
            try:
                os.unlink(self.ready_path)
            except (AttributeError, OSError):
                pass


def run(spec, command):
    """``command`` confined in the foreground until SIGTERM or its exit; its exit code (a service of local_service: the
    simulated_engine role's launcher runs ``roles/simulated_engine/files/confined.py``, a thin entry over this). ``spec``:
    ``{"reach": [[host, port]...], "serve": [port...], "serve_host", "host_ports": {port: host port}, "folder", "label"}``;
    the program's output is this process's; a failure to confine is one sentence on stderr and exit code 1."""
    host_ports = dict((int(k), int(v)) for k, v in (spec.get("host_ports") or {}).items())
    # A stop asked for while the bridge is being set up is kept for after it (the default action would leave its
    # sockets' folder behind).
    stopping = StopRequest()
    try:
        confined = Confined(command, [tuple(r) for r in spec.get("reach") or []], [int(p) for p in spec.get("serve") or []],
                            spec["folder"], None, host_ports=host_ports, label=spec.get("label") or "program",
                            serve_host=spec.get("serve_host") or "127.0.0.1")
    except ConfinementError as exc:
        sys.stderr.write("%s\n" % exc.msg)
        return 1
    try:
        if not stopping.asked:
            confined.start()
            while not stopping.asked and confined.proc.poll() is None:
                stopping.wait(0.5)
    finally:
        confined.stop()
    return 0 if stopping.asked else (confined.proc.returncode or 1)


def main(argv):
    """``--inside SPEC -- COMMAND``: the namespace's side, started by ``Confined`` through the collection's loader."""
    if len(argv) >= 3 and argv[0] == "--inside" and "--" in argv:
        return inside(json.loads(argv[1]), argv[argv.index("--") + 1:])
    sys.stderr.write("usage: --inside SPEC -- COMMAND (the namespace's side of a confined program, started by Confined)\n")
    return 2
