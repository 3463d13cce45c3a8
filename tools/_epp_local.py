# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A real EPP on this machine, for the routing benchmark and the tests: binary, discovery, KV relays, loopback only.

Two EPPs: the llm-d router's (``llm-d``, v0.9.0: precise routing from the engines' KV events; discovery from a file) and
the Gateway API Inference Extension's (``gie``, v1.4.0, the upstream EPP llm-d's extends: approximate prefix-cache
scoring; it always discovers its endpoints through the Kubernetes API, here a kwok cluster's real API server).

``resolve_binary(given)``: the llm-d EPP binary (``given``, else ``SUBSTRATE_EPP_BINARY``, else ``go install
github.com/llm-d/llm-d-router/cmd/epp@<pinned>`` into ``~/.cache/inference_cache/epp/<pinned>``), or ``None`` and the
reason in one sentence. ``resolve_epp(given, impl)``: ``(path, impl, None)`` or ``(None, None, sentence)``: llm-d's
where it can be had, else the GIE EPP (kwok_cluster's build cache, built by ``playbooks/go_build.yml`` when missing).

``GIEPool(kubeconfig, namespace, name, engines, port)``: the Kubernetes side of a GIE EPP over local engines: in a kwok
cluster, one simulated pod per engine, annotated with the engine's address (kwok_cluster's pod-IP stage makes it the
pod's IP), and an InferencePool selecting them; the EPP reconciles it as in a cluster and routes to the real engines.

``with_file_discovery(config, endpoints_path)``: an EndpointPickerConfig (the router role's, or any) with its endpoints
from a file instead of Kubernetes: the ``file-discovery`` plugin, ``dataLayer.discovery`` on it, no injected defaults
(they discover pods through the API server) and the metrics data source the defaults would have brought.

``EPP(binary, config, endpoints, folder, secure=False, confine=True, impl="llm-d", pool=..., kubeconfig=None)``: one
EPP process over ``endpoints`` (``[(name, address, port)]``; for ``gie``, the InferencePool ``pool`` of ``namespace``
read through ``kubeconfig``, whose API server it reaches through the bridge too). The EPP listens on every interface
(ext_proc 9002, health 9003, metrics 9090) and has no
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
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from urllib.parse import urlsplit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _loader import module_utils  # noqa: E402  pylint: disable=wrong-import-position

_WIRING = module_utils("common.wiring")
ROUTER_VERSION = _WIRING.ROUTER_VERSION
GIE_VERSION = _WIRING.GIE_VERSION
IMPLS = tuple(sorted(_WIRING.ROUTER_IMPLS))
duplex = module_utils("common.duplex").duplex
EPP_MODULE = "github.com/llm-d/llm-d-router/cmd/epp"
GO_INSTALL_TIMEOUT = 300
GIE_BUILD_TIMEOUT = 3600
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# kwok_cluster's default pod-IP annotation (roles/kwok_cluster/defaults/main.yml kwok_cluster_pod_ip_annotation).
POD_IP_ANNOTATION = "inference-cache.substrate/pod-ip"
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


def resolve_binary(given=None, install=True, use_env=True):
    """``(path, None)`` or ``(None, sentence)``: ``given``, ``SUBSTRATE_EPP_BINARY``, the cache, ``go install``."""
    given = given or (os.environ.get("SUBSTRATE_EPP_BINARY") if use_env else None)
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


def gie_build_dir():
    """kwok_cluster's build of the GIE EPP (playbooks/go_build.yml): ``epp`` and ``inferencepool-crds.yaml`` in it."""
    return os.path.expanduser(os.path.join("~", ".cache", "inference_cache", "kwok_cluster", "bin", "gie-%s" % GIE_VERSION))


def gie_crds():
    return os.path.join(gie_build_dir(), "inferencepool-crds.yaml")


def resolve_gie(build=True):
    """``(path, None)`` or ``(None, sentence)``: the GIE EPP of kwok_cluster's build cache, built when missing."""
    cached = os.path.join(gie_build_dir(), "epp")
    if os.path.isfile(cached) and os.access(cached, os.X_OK) and os.path.isfile(gie_crds()):
        return cached, None
    if not build:
        return None, "No GIE EPP %s at %s; build it with `ansible-playbook playbooks/go_build.yml` (make gie-epp)." % (GIE_VERSION, cached)
    playbook = os.path.join(ROOT, ".venv", "bin", "ansible-playbook")
    cmd = [playbook if os.path.exists(playbook) else "ansible-playbook", os.path.join(ROOT, "playbooks", "go_build.yml")]
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    try:
        run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=GIE_BUILD_TIMEOUT, check=False)
    except FileNotFoundError:
        return None, "No ansible-playbook to build the GIE EPP %s with; run `make setup`, then `make gie-epp`." % GIE_VERSION
    except subprocess.TimeoutExpired:
        return None, "Building the GIE EPP %s did not finish within %d s; run `make gie-epp` and look at its output." % (
            GIE_VERSION, GIE_BUILD_TIMEOUT)
    if run.returncode == 0 and os.path.isfile(cached):
        return cached, None
    said = [line.strip() for line in run.stdout.splitlines() if '"msg":' in line]
    return None, "Building the GIE EPP %s failed (%s)." % (GIE_VERSION, (said[-1][7:].strip(' "') if said else _install_problem(run.stdout))[:300])


def resolve_epp(given=None, impl=None, install=True):
    """``(path, impl, None)`` or ``(None, None, sentence)``: which EPP the tests and the bench run.

    A binary given (``given``, or ``SUBSTRATE_EPP_BINARY``) is of ``impl`` (or ``SUBSTRATE_EPP_IMPL``, default llm-d).
    Otherwise ``impl`` gie asks for the GIE EPP alone; any other asks for llm-d's (cache, ``go install``) and takes the
    GIE EPP where llm-d's cannot be had.
    """
    if impl is not None and impl not in IMPLS:
        return None, None, "EPP %s is none this collection knows (%s)." % (impl, ", ".join(IMPLS))
    env_impl = os.environ.get("SUBSTRATE_EPP_IMPL") or "llm-d"
    if not given and os.environ.get("SUBSTRATE_EPP_BINARY") and impl in (None, env_impl):
        given, impl = os.environ["SUBSTRATE_EPP_BINARY"], env_impl   # the binary named, of the kind named beside it
    if given:
        if os.path.isfile(given) and os.access(given, os.X_OK):
            return given, impl or env_impl, None
        return None, None, "%s is no executable file; give the path of an EPP binary (llm-d %s or GIE %s)." % (given, ROUTER_VERSION, GIE_VERSION)
    why_llmd = None
    if impl != "gie":
        path, why_llmd = resolve_binary(install=install, use_env=False)
        if path:
            return path, "llm-d", None
        if impl == "llm-d":
            return None, None, why_llmd
    path, why = resolve_gie(build=install)
    if path:
        return path, "gie", None
    return None, None, " ".join(w for w in (why_llmd, why) if w)


def kube_server(kubeconfig):
    """``(host, port)`` of the API server of ``kubeconfig``'s current context."""
    import yaml  # pylint: disable=import-outside-toplevel
    with open(kubeconfig, encoding="utf-8") as handle:
        doc = yaml.safe_load(handle) or {}
    current = doc.get("current-context")
    contexts = dict((c["name"], c.get("context") or {}) for c in doc.get("contexts") or [])
    cluster_name = contexts.get(current, {}).get("cluster") or ((doc.get("clusters") or [{}])[0].get("name"))
    clusters = dict((c["name"], c.get("cluster") or {}) for c in doc.get("clusters") or [])
    url = urlsplit(clusters.get(cluster_name, {}).get("server") or "")
    if not url.hostname:
        raise EPPError("The kubeconfig %s names no API server for its current context." % kubeconfig)
    return url.hostname, url.port or (443 if url.scheme == "https" else 80)


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

    def __init__(self, command, reach, serve, folder, log_path, host_ports=None):
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
        self.proc = None
        self.ports = {}
        # The bridge's Unix sockets live in a private folder of their own under the temporary folder: a socket's path
        # holds at most 107 bytes (sun_path), which a folder under a long HOME exceeds.
        self.sockets = tempfile.mkdtemp(prefix="epp-")
        spec = {"reach": [], "serve": [], "ready": os.path.join(folder, "confined-%d.ready" % id(self))}
        try:
            if len(os.path.join(self.sockets, "serve-99.sock")) > 107:
                raise EPPError("The temporary folder %s is too long for the bridge's Unix sockets (107 bytes at most); set "
                               "TMPDIR to a shorter folder." % self.sockets)
            for i, (host, port) in enumerate(reach):
                path = os.path.join(self.sockets, "reach-%d.sock" % i)
                self.forwards.append(Forward(unix_listener(path), dial_tcp(host, port)))
                spec["reach"].append((host, port, path))
            for i, port in enumerate(serve):
                path = os.path.join(self.sockets, "serve-%d.sock" % i)
                try:
                    listener = tcp_listener("127.0.0.1", (host_ports or {}).get(port, 0))
                except OSError as exc:
                    raise EPPError("Cannot serve the EPP's port %d on 127.0.0.1:%d: %s; free that port or choose another." % (
                        port, (host_ports or {}).get(port, 0), exc.strerror or exc))
                self.ports[port] = listener.getsockname()[1]
                self.forwards.append(Forward(listener, dial_unix(path)))
                spec["serve"].append((port, path))
        except BaseException:
            self.stop()
            raise
        self.ready_path = spec["ready"]
        self.cmd = [unshare, "--net", "--map-root-user", sys.executable, os.path.abspath(__file__), "--inside", json.dumps(spec),
                    "--"] + list(command)
        self.log_path = log_path

    def start(self, env=None):
        with open(self.log_path, "w", encoding="utf-8") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)  # pylint: disable=consider-using-with
        return self.proc

    def ready(self):
        return os.path.exists(self.ready_path)

    def stop(self):
        _stop_group(self.proc)
        for forward in self.forwards:
            forward.stop()
        shutil.rmtree(self.sockets, ignore_errors=True)


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
    """One EPP process; ``address`` is its ext_proc host:port, ``metrics_url`` its metrics.

    ``impl`` llm-d: file discovery over ``endpoints``. ``impl`` gie: the InferencePool ``pool`` of ``namespace`` through
    ``kubeconfig`` (its API server is bridged in too), ``endpoints`` naming the engines its pods resolve to.
    """

    def __init__(self, binary, config, endpoints, folder, secure=False, name="epp", confine=True, pool="substrate-local",
                 impl="llm-d", kubeconfig=None, namespace="default", host_ports=None):
        self.folder = folder
        self.name = name
        self.impl = impl
        self.env = None
        reach = []
        if impl == "gie":
            if not kubeconfig:
                raise EPPError("The GIE EPP discovers its endpoints through the Kubernetes API only; give the kubeconfig of a "
                               "cluster holding its InferencePool (a kwok cluster: roles/kwok_cluster).")
            self.config = copy.deepcopy(config) if config else {}
            self.env = dict(os.environ, KUBECONFIG=kubeconfig, NAMESPACE=namespace, POD_NAME=name)
            reach = [kube_server(kubeconfig)]
        else:
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
        if impl == "gie":
            # Its flags (sigs.k8s.io/gateway-api-inference-extension@v1.4.0:pkg/epp/server/options.go): no tracing
            # exporter here, metrics without a Kubernetes token, the pool's namespace.
            self.cmd += ["--pool-namespace", namespace, "--tracing=false", "--metrics-endpoint-auth=false"]
        if confine:
            wanted = dict((ports[key], port) for key, port in (host_ports or {}).items())
            self.confined = Confined(self.cmd, sorted(set(reach + reached_addresses(self.config, endpoints))),
                                     [ports["grpc"], ports["metrics"]], folder, self.log_path, host_ports=wanted)
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
            self.proc = self.confined.start(self.env)
        else:
            with open(self.log_path, "w", encoding="utf-8") as log:
                self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
                    self.cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=self.env)
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

    def wait_ready_pods(self, count, pool, timeout=120.0):
        """Until the GIE EPP's metrics count ``count`` ready pods in ``pool`` (inference_pool_ready_pods, flushed every 5 s):
        it has reconciled the InferencePool and its pods (sigs.k8s.io/gateway-api-inference-extension@v1.4.0:
        pkg/epp/metrics/metrics.go)."""
        pattern = re.compile(r'^inference_pool_ready_pods\{[^}]*name="%s"[^}]*\}\s+(\S+)' % re.escape(pool), re.M)
        deadline = time.monotonic() + timeout
        seen = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise EPPError("The EPP exited with %s; its log ends:\n%s" % (self.proc.returncode, self.log()))
            try:
                with urllib.request.urlopen(self.metrics_url, timeout=5) as resp:
                    found = pattern.search(resp.read().decode("utf-8", "replace"))
                seen = float(found.group(1)) if found else None
            except OSError:
                seen = None
            if seen is not None and int(seen) == count:
                return
            time.sleep(0.5)
        raise EPPError("The EPP counted %s ready pods in InferencePool %s within %ss, not %d; its log ends:\n%s" % (
            "no" if seen is None else int(seen), pool, timeout, count, self.log()))

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class GIEPool:
    """In a kwok cluster: one simulated pod per local engine, annotated with the engine's address (kwok_cluster's pod-IP
    stage makes it the pod's IP), and an InferencePool selecting them on ``port`` (every engine listens on it, each on
    its own 127.x address); what a GIE EPP on this machine discovers, as it would the engine pods of a cluster.

    ``engines``: ``[(name, address)]``. Needs the InferencePool CRDs (``gie_crds()``, applied by ``apply``)."""

    def __init__(self, kubeconfig, namespace, name, engines, port, annotation=POD_IP_ANNOTATION):
        from kubernetes import config, dynamic  # pylint: disable=import-outside-toplevel
        self.client = dynamic.DynamicClient(config.new_client_from_config(kubeconfig))
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.name = name
        self.engines = list(engines)
        self.port = int(port)
        self.annotation = annotation
        self.labels = {"app.kubernetes.io/name": "%s-engine" % name, "app.kubernetes.io/part-of": "inference-cache-substrate"}

    def _resource(self, api_version, kind):
        return self.client.resources.get(api_version=api_version, kind=kind)

    def objects(self):
        pool = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {"selector": {"matchLabels": self.labels}, "targetPorts": [{"number": self.port}],
                         "endpointPickerRef": {"name": "%s-epp" % self.name, "port": {"number": INSIDE_PORTS["grpc"]}}}}
        pods = [{"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": engine, "namespace": self.namespace, "labels": self.labels, "annotations": {self.annotation: address}},
                 "spec": {"containers": [{"name": "engine", "image": "vllm-on-this-machine:%s" % address,
                                          "ports": [{"name": "http", "containerPort": self.port}]}]}}
                for engine, address in self.engines]
        return [pool] + pods

    def apply(self, timeout=120.0, crds=None):
        """The CRDs (when given), the namespace, the pool and the pods; then until every pod is Ready with its engine's IP."""
        import yaml  # pylint: disable=import-outside-toplevel
        if crds:
            crd = self._resource("apiextensions.k8s.io/v1", "CustomResourceDefinition")
            with open(crds, encoding="utf-8") as handle:
                for doc in yaml.safe_load_all(handle):
                    if doc:
                        crd.server_side_apply(body=doc, name=doc["metadata"]["name"], field_manager="inference-cache-substrate", force_conflicts=True)
            self._wait(lambda: self._crd_established(crd), timeout, "the InferencePool CRDs to be established")
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}}
        self._resource("v1", "Namespace").server_side_apply(body=namespace, name=self.namespace, field_manager="inference-cache-substrate")
        for doc in self.objects():
            self._resource(doc["apiVersion"], doc["kind"]).server_side_apply(
                body=doc, name=doc["metadata"]["name"], namespace=self.namespace, field_manager="inference-cache-substrate")
        want = dict(self.engines)
        self._wait(lambda: self.pod_ips() == want, timeout, "pods %s to run with the IPs %s" % (", ".join(want), want))

    def _crd_established(self, crd):
        for item in crd.get().items:
            if item.metadata.name.endswith(".inference.networking.k8s.io") or "inference.networking" in item.metadata.name:
                conditions = dict((c.type, c.status) for c in item.status.conditions or [])
                if conditions.get("Established") != "True":
                    return False
        return True

    def pod_ips(self):
        """``{pod: IP}`` of the pool's Ready pods."""
        selector = ",".join("%s=%s" % kv for kv in sorted(self.labels.items()))
        out = {}
        for pod in self._resource("v1", "Pod").get(namespace=self.namespace, label_selector=selector).items:
            ready = any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))
            if ready and pod.status.podIP:
                out[pod.metadata.name] = pod.status.podIP
        return out

    def _wait(self, done, timeout, what):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if done():
                return
            time.sleep(0.5)
        raise EPPError("Waited %ss for %s in the kwok cluster of %s; look at kwok's log in its cluster folder." % (
            timeout, what, self.kubeconfig))

    def delete(self, timeout=120.0):
        """The namespace (pool and pods with it), until it is gone."""
        from kubernetes.dynamic.exceptions import NotFoundError  # pylint: disable=import-outside-toplevel
        namespaces = self._resource("v1", "Namespace")
        try:
            namespaces.delete(name=self.namespace)
        except NotFoundError:
            return

        def gone():
            try:
                namespaces.get(name=self.namespace)
                return False
            except NotFoundError:
                return True
        self._wait(gone, timeout, "namespace %s to go" % self.namespace)


def service_account_kubeconfig(kubeconfig, namespace, account, path, seconds=86400):
    """A kubeconfig for ``account`` of ``namespace`` (a TokenRequest through ``kubeconfig``): the EPP then runs with exactly
    the rights its ServiceAccount has in the cluster, so what the router role's RBAC lacks shows here too."""
    import yaml  # pylint: disable=import-outside-toplevel
    from kubernetes import client, config  # pylint: disable=import-outside-toplevel
    api = config.new_client_from_config(kubeconfig)
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": int(seconds)}}
    try:
        token = client.CoreV1Api(api).create_namespaced_service_account_token(account, namespace, request).status.token
    except client.exceptions.ApiException as exc:
        raise EPPError("Cannot get a token for ServiceAccount %s/%s (%s %s); is the router installed in that namespace?" % (
            namespace, account, exc.status, exc.reason))
    with open(kubeconfig, encoding="utf-8") as handle:
        doc = yaml.safe_load(handle)
    current = doc.get("current-context")
    context = [c for c in doc["contexts"] if c["name"] == current][0]["context"]
    cluster = [c for c in doc["clusters"] if c["name"] == context["cluster"]][0]
    out = {"apiVersion": "v1", "kind": "Config", "clusters": [cluster], "current-context": "epp",
           "contexts": [{"name": "epp", "context": {"cluster": cluster["name"], "user": "epp", "namespace": namespace}}],
           "users": [{"name": "epp", "user": {"token": token}}]}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        yaml.safe_dump(out, handle)
    return path


def serve(argv):
    """``serve``: one confined EPP in the foreground until SIGTERM, on fixed host ports (a service for
    local_engine_service: playbooks/kwok_traffic.yml)."""
    import argparse  # pylint: disable=import-outside-toplevel
    parser = argparse.ArgumentParser(prog="_epp_local.py serve", description=serve.__doc__)
    parser.add_argument("--binary", required=True)
    parser.add_argument("--impl", choices=IMPLS, default="gie")
    parser.add_argument("--config", required=True, help="the EndpointPickerConfig (YAML)")
    parser.add_argument("--folder", required=True, help="a private folder for the bridge's sockets and the EPP's files")
    parser.add_argument("--grpc-port", type=int, required=True, help="ext_proc on 127.0.0.1")
    parser.add_argument("--metrics-port", type=int, required=True, help="metrics on 127.0.0.1")
    parser.add_argument("--endpoint", action="append", default=[], metavar="NAME=HOST:PORT", help="an engine it reaches")
    parser.add_argument("--kubeconfig")
    parser.add_argument("--pool")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--service-account", help="run with this ServiceAccount's token (of --namespace), not --kubeconfig's user")
    parser.add_argument("--secure", action="store_true")
    args = parser.parse_args(argv)
    import yaml  # pylint: disable=import-outside-toplevel
    with open(args.config, encoding="utf-8") as handle:
        config = yaml.safe_load(handle) or {}
    endpoints = []
    for item in args.endpoint:
        name, _eq, where = item.partition("=")
        host, _colon, port = where.rpartition(":")
        endpoints.append((name, host, int(port)))
    os.makedirs(args.folder, mode=0o700, exist_ok=True)
    kubeconfig = args.kubeconfig
    if kubeconfig and args.service_account:
        kubeconfig = service_account_kubeconfig(kubeconfig, args.namespace, args.service_account,
                                                os.path.join(args.folder, "epp.kubeconfig"))
    epp = EPP(args.binary, config, endpoints, args.folder, secure=args.secure, name="epp", impl=args.impl,
              pool=args.pool or "substrate-local", kubeconfig=kubeconfig, namespace=args.namespace,
              host_ports={"grpc": args.grpc_port, "metrics": args.metrics_port})
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    epp.start(timeout=120)
    sys.stdout.write("EPP (%s) serving ext_proc on %s, metrics on %s; log %s\n" % (args.impl, epp.address, epp.metrics_url, epp.log_path))
    sys.stdout.flush()
    try:
        while not stopping.is_set() and epp.proc.poll() is None:
            stopping.wait(0.5)
    finally:
        epp.stop()
    if not stopping.is_set():
        sys.stderr.write("The EPP exited with %s; its log ends:\n%s\n" % (epp.proc.returncode, epp.log()))
        return 1
    return 0


def main(argv):
    if len(argv) >= 3 and argv[0] == "--inside" and "--" in argv:
        split = argv.index("--")
        return inside(json.loads(argv[1]), argv[split + 1:])
    if argv[:1] == ["serve"]:
        try:
            return serve(argv[1:])
        except EPPError as exc:
            sys.stderr.write("%s\n" % exc)
            return 1
        except OSError as exc:
            sys.stderr.write("The EPP could not be started: %s.\n" % exc)
            return 1
    sys.stderr.write("usage: _epp_local.py serve ... (a confined EPP as a service), or --inside SPEC -- COMMAND (started by "
                     "EPP(confine=True), not by hand)\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
