# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A real llm-d EPP on this machine, for the routing benchmark and the tests: binary, discovery, KV relays, loopback only.

``resolve_binary(given)``: the EPP binary (``given``, else ``SUBSTRATE_EPP_BINARY``, else ``go install
github.com/llm-d/llm-d-router/cmd/epp@<pinned>`` into ``~/.cache/inference_cache/epp/<pinned>``), or ``None`` and the
reason in one sentence.

``with_file_discovery(config, endpoints_path)``: an EndpointPickerConfig (the router role's, or any) with its endpoints
from a file instead of Kubernetes: the ``file-discovery`` plugin, ``dataLayer.discovery`` on it, no injected defaults
(they discover pods through the API server) and the metrics data source the defaults would have brought.

``EPP(binary, config, endpoints, folder, secure=False, confine=True)``: one EPP process over ``endpoints``
(``[(name, address, port)]``). The EPP listens on every interface (ext_proc 9002, health 9003, metrics 9090) and has no
bind flag (llm-d-router@v0.9.0:cmd/epp/runner/runner.go), so by default it runs in a network namespace of its own
(``unshare --net --map-root-user``) whose only interface is loopback: nothing it opens is reachable from the network.
The engines it must reach (their HTTP port, their KV-event port, the token producer's URL: loopback addresses) and
the ports it serves are bridged between the two loopbacks through Unix sockets in ``folder``; ``address`` and
``metrics_url`` are the host side, on 127.0.0.1. ``confine=False`` (only when the user asks) runs it unconfined on
free ports.

``Relay(engine_endpoint, public_endpoint)``: the precise producer dials ``tcp://<endpoint address>:<socketPort>``
for every endpoint, but vLLM connects (does not bind) to an endpoint without ``*``. The relay binds an XSUB at the
engine's own endpoint (the engine connects to it) and an XPUB at ``tcp://<engine address>:<common port>``, and
forwards both ways (events down, subscriptions up), as ``zmq.proxy`` does, counting the subscriptions it saw.

Run as a script with ``--inside SPEC -- COMMAND``, this file is the namespace's side of the bridge (started by ``EPP``).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import copy
import fcntl
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _loader import module_utils  # noqa: E402  pylint: disable=wrong-import-position

ROUTER_VERSION = module_utils("common.wiring").ROUTER_VERSION
pump = module_utils("common.pump").pump
EPP_MODULE = "github.com/llm-d/llm-d-router/cmd/epp"
GO_INSTALL_TIMEOUT = 300
# The EPP's own ports inside its namespace (its defaults: llm-d-router@v0.9.0:cmd/epp/runner/runner.go flags).
INSIDE_PORTS = {"grpc": 9002, "health": 9003, "metrics": 9090}


class EPPError(Exception):
    """One sentence: what went wrong with the local EPP and what to do."""


def cache_dir():
    return os.path.expanduser(os.path.join("~", ".cache", "inference_cache", "epp", ROUTER_VERSION))


def _install_problem(text):
    for line in text.splitlines():
        if "403" in line or "Forbidden" in line or "refus" in line.lower():
            return " ".join(line.split())[:200]
    lines = [line for line in text.splitlines() if line.strip()]
    return " ".join(lines[-1].split())[:200] if lines else "no output"


def resolve_binary(given=None, install=True):
    """``(path, None)`` or ``(None, sentence)``: ``given``, ``SUBSTRATE_EPP_BINARY``, the cache, ``go install``."""
    given = given or os.environ.get("SUBSTRATE_EPP_BINARY")
    if given:
        if os.path.isfile(given) and os.access(given, os.X_OK):
            return given, None
        return None, "%s is no executable file; give the path of an EPP %s binary." % (given, ROUTER_VERSION)
    cached = os.path.join(cache_dir(), "epp")
    if os.path.isfile(cached) and os.access(cached, os.X_OK):
        return cached, None
    if not install:
        return None, "No EPP binary given and none at %s; set SUBSTRATE_EPP_BINARY to an EPP %s binary." % (cached, ROUTER_VERSION)
    try:
        run = subprocess.run(["go", "install", "%s@%s" % (EPP_MODULE, ROUTER_VERSION)], env=dict(os.environ, GOBIN=cache_dir()),
                             capture_output=True, text=True, timeout=GO_INSTALL_TIMEOUT, check=False)
    except FileNotFoundError:
        return None, "No Go toolchain to install the EPP %s with; set SUBSTRATE_EPP_BINARY to an EPP %s binary." % (
            ROUTER_VERSION, ROUTER_VERSION)
    except subprocess.TimeoutExpired:
        return None, "go install %s@%s did not finish within %d s; set SUBSTRATE_EPP_BINARY to an EPP %s binary." % (
            EPP_MODULE, ROUTER_VERSION, GO_INSTALL_TIMEOUT, ROUTER_VERSION)
    if run.returncode == 0 and os.path.isfile(cached):
        return cached, None
    return None, ("The Go module proxy refuses github.com/llm-d/llm-d-router (%s); set SUBSTRATE_EPP_BINARY to an EPP %s binary." % (
        _install_problem(run.stderr + run.stdout), ROUTER_VERSION))


def free_port(*hosts):
    """A TCP port free on every one of ``hosts`` (the relays' common port is the same on two addresses)."""
    for _attempt in range(50):
        probe = socket.socket()
        probe.bind((hosts[0], 0))
        port = probe.getsockname()[1]
        probe.close()
        try:
            for host in hosts[1:]:
                other = socket.socket()
                try:
                    other.bind((host, port))
                finally:
                    other.close()
        except OSError:
            continue
        return port
    raise EPPError("No TCP port is free on all of %s." % ", ".join(hosts))


def with_file_discovery(config, endpoints_path):
    """``config`` with its endpoints read from ``endpoints_path`` (file-discovery) instead of Kubernetes."""
    config = copy.deepcopy(config) if config else {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig"}
    plugins = [p for p in config.get("plugins") or [] if p.get("type") != "file-discovery"]
    names = set(p.get("name") or p.get("type") for p in plugins)
    plugins.insert(0, {"name": "file-discovery", "type": "file-discovery", "parameters": {"path": endpoints_path, "watchFile": False}})
    layer = config.setdefault("dataLayer", {})
    layer["injectDefaults"] = False
    layer["discovery"] = {"pluginRef": "file-discovery"}
    sources = layer.setdefault("sources", [])
    if "metrics-source" not in names:
        plugins += [{"name": "metrics-source", "type": "metrics-data-source"}, {"name": "metrics-extractor", "type": "core-metrics-extractor"}]
        sources.append({"pluginRef": "metrics-source", "extractors": [{"pluginRef": "metrics-extractor"}]})
    config["plugins"] = plugins
    return config


def reached_addresses(config, endpoints):
    """The (host, port) pairs the EPP dials: each endpoint's HTTP port and KV-event port, the token producer's URL."""
    out = [(address, int(port)) for _name, address, port in endpoints]
    for plugin in config.get("plugins") or []:
        params = plugin.get("parameters") or {}
        if plugin.get("type") == "token-producer" and (params.get("vllm") or {}).get("url"):
            url = urlsplit(params["vllm"]["url"])
            out.append((url.hostname, url.port or (443 if url.scheme == "https" else 80)))
        events = params.get("kvEventsConfig") or {}
        port = (events.get("podDiscoveryConfig") or {}).get("socketPort")
        if plugin.get("type") == "precise-prefix-cache-producer" and events.get("discoverPods") and port:
            out += [(address, int(port)) for _name, address, _port in endpoints]
    return sorted(set(out))


def _loopback(host):
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
    back = threading.Thread(target=pump, args=(other, accepted), daemon=True)
    back.start()
    pump(accepted, other)
    back.join()
    accepted.close()
    other.close()


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


class Relay:
    """XSUB bound at the engine's endpoint, XPUB bound at the public one; events down, subscriptions up."""

    def __init__(self, engine_endpoint, public_endpoint):
        import zmq  # pylint: disable=import-outside-toplevel
        self.zmq = zmq
        self.ctx = zmq.Context()
        self.xsub = self.ctx.socket(zmq.XSUB)
        self.xpub = self.ctx.socket(zmq.XPUB)
        self.xpub.setsockopt(zmq.XPUB_VERBOSE, 1)   # every subscriber's subscription comes up (and is counted)
        for sock in (self.xsub, self.xpub):
            sock.setsockopt(zmq.LINGER, 0)
        self.xsub.bind(engine_endpoint)
        self.xpub.bind(public_endpoint)
        self.public_endpoint = public_endpoint
        self.subscriptions = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        poller = self.zmq.Poller()
        poller.register(self.xsub, self.zmq.POLLIN)
        poller.register(self.xpub, self.zmq.POLLIN)
        while not self.stopping.is_set():
            for sock, _event in poller.poll(100):
                frames = sock.recv_multipart()
                if sock is self.xsub:
                    self.xpub.send_multipart(frames)
                else:
                    if frames and frames[0][:1] == b"\x01":
                        self.subscriptions.append(frames[0][1:])
                    self.xsub.send_multipart(frames)
        self.xsub.close(0)
        self.xpub.close(0)

    def stop(self):
        self.stopping.set()
        self.thread.join(5)
        self.ctx.term()


def wait_subscribed(relays, counts, timeout=30.0):
    """Until each relay saw its count of subscriptions: the streams reach their subscribers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(len(r.subscriptions) >= count for r, count in zip(relays, counts)):
            return
        time.sleep(0.1)
    raise EPPError("The KV-event relays saw these subscriptions only: %s." % [(r.public_endpoint, r.subscriptions) for r in relays])


class Confined:
    """``command`` in a network namespace of its own; ``reach`` bridged in, ``serve`` ports bridged out to 127.0.0.1."""

    def __init__(self, command, reach, serve, folder, log_path):
        unshare = shutil.which("unshare")
        if not unshare:
            raise EPPError("Cannot confine the EPP to loopback: no unshare command (util-linux); install it, or ask for an "
                           "unconfined EPP, whose ports listen on every interface.")
        remote = [host for host, _port in reach if not _loopback(host)]
        if remote:
            raise EPPError("A confined EPP reaches loopback addresses only, not %s; run the engines on 127.0.0.0/8, or ask "
                           "for an unconfined EPP." % ", ".join(sorted(set(remote))))
        self.folder = folder
        self.forwards = []
        spec = {"reach": [], "serve": [], "ready": os.path.join(folder, "confined-%d.ready" % id(self))}
        for i, (host, port) in enumerate(reach):
            path = os.path.join(folder, "reach-%d-%d.sock" % (id(self), i))
            self.forwards.append(Forward(unix_listener(path), dial_tcp(host, port)))
            spec["reach"].append((host, port, path))
        self.ports = {}
        for i, port in enumerate(serve):
            path = os.path.join(folder, "serve-%d-%d.sock" % (id(self), i))
            listener = tcp_listener("127.0.0.1", 0)
            self.ports[port] = listener.getsockname()[1]
            self.forwards.append(Forward(listener, dial_unix(path)))
            spec["serve"].append((port, path))
        self.ready_path = spec["ready"]
        self.cmd = [unshare, "--net", "--map-root-user", sys.executable, os.path.abspath(__file__), "--inside", json.dumps(spec),
                    "--"] + list(command)
        self.log_path = log_path
        self.proc = None

    def start(self):
        with open(self.log_path, "w", encoding="utf-8") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # pylint: disable=consider-using-with
        return self.proc

    def ready(self):
        return os.path.exists(self.ready_path)

    def stop(self):
        _stop_group(self.proc)
        for forward in self.forwards:
            forward.stop()


def _stop_group(proc):
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


class EPP:
    """One EPP process with file discovery; ``address`` is its ext_proc host:port, ``metrics_url`` its metrics."""

    def __init__(self, binary, config, endpoints, folder, secure=False, name="epp", confine=True, pool="substrate-local"):
        self.folder = folder
        self.name = name
        self.endpoints_path = os.path.join(folder, "%s-endpoints.yaml" % name)
        with open(self.endpoints_path, "w", encoding="utf-8") as out:
            json.dump({"endpoints": [{"name": n, "address": a, "port": str(p)} for n, a, p in endpoints]}, out)
        self.config = with_file_discovery(config, self.endpoints_path)
        self.config_path = os.path.join(folder, "%s-config.yaml" % name)
        with open(self.config_path, "w", encoding="utf-8") as out:
            json.dump(self.config, out, indent=1)   # JSON is YAML
        self.log_path = os.path.join(folder, "%s.log" % name)
        self.confined = None
        if confine:
            ports = dict(INSIDE_PORTS)
        else:
            ports = {}
            while len(set(ports.values())) < 3:
                ports = dict((key, free_port("0.0.0.0")) for key in INSIDE_PORTS)
        self.cmd = [binary, "--config-file", self.config_path, "--pool-name", pool, "--grpc-port", str(ports["grpc"]),
                    "--grpc-health-port", str(ports["health"]), "--metrics-port", str(ports["metrics"]),
                    "--secure-serving=%s" % ("true" if secure else "false"), "--v", "3"]
        if confine:
            self.confined = Confined(self.cmd, reached_addresses(self.config, endpoints), [ports["grpc"], ports["metrics"]],
                                     folder, self.log_path)
            ports = {"grpc": self.confined.ports[ports["grpc"]], "metrics": self.confined.ports[ports["metrics"]]}
        self.address = "127.0.0.1:%d" % ports["grpc"]
        self.metrics_url = "http://127.0.0.1:%d/metrics" % ports["metrics"]
        self.proc = None

    def log(self, chars=3000):
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as log:
                return log.read()[-chars:]
        except OSError:
            return ""

    def _up(self):
        if self.confined is not None:
            return self.confined.ready()
        try:
            socket.create_connection(("127.0.0.1", int(self.address.rsplit(":", 1)[1])), timeout=1).close()
            return True
        except OSError:
            return False

    def start(self, timeout=60.0):
        if self.confined is not None:
            self.proc = self.confined.start()
        else:
            with open(self.log_path, "w", encoding="utf-8") as log:
                self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # pylint: disable=consider-using-with
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                log = self.log()
                if self.confined is not None and log.startswith("unshare:"):
                    raise EPPError("Cannot confine the EPP to loopback (%s); allow unprivileged user namespaces, or ask for an "
                                   "unconfined EPP, whose ports then listen on every interface." % log.strip().splitlines()[0])
                raise EPPError("The EPP exited with %s at start; its log ends:\n%s" % (self.proc.returncode, log))
            if self._up():
                return self
            time.sleep(0.2)
        self.stop()
        raise EPPError("The EPP's ext_proc port did not open within %ss; its log ends:\n%s" % (timeout, self.log()))

    def stop(self):
        if self.confined is not None:
            self.confined.stop()
        else:
            _stop_group(self.proc)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def main(argv):
    if len(argv) >= 3 and argv[0] == "--inside" and "--" in argv:
        split = argv.index("--")
        return inside(json.loads(argv[1]), argv[split + 1:])
    sys.stderr.write("usage: _epp_local.py --inside SPEC -- COMMAND (started by EPP(confine=True), not by hand)\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
