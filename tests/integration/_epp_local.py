# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A real llm-d EPP on this machine for tests: the binary, its file-discovery config, KV-event relays, start and stop.

``epp_binary()``: ``SUBSTRATE_EPP_BINARY`` when set; else ``go install github.com/llm-d/llm-d-router/cmd/epp@<pinned>``
into ``~/.cache/inference_cache/epp/<pinned>`` (bounded); else the test is skipped with the reason in one sentence.

``EPP(binary, config, endpoints, folder, secure=False)``: the EPP with ``file-discovery`` over ``endpoints``
(``[(name, address, port)]``), on free ports (ext_proc, health, metrics; the EPP listens on every interface and has no
bind flag, so they are fresh high ports, and the process is stopped by ``stop()``).

``Relay(engine_endpoint, public_endpoint)``: the precise producer dials ``tcp://<endpoint address>:<socketPort>`` for
every endpoint, but vLLM connects (does not bind) to an endpoint without ``*``. The relay binds an XSUB at the
engine's own endpoint (the engine connects to it) and an XPUB at ``tcp://<engine address>:<common port>``, and forwards
both ways (events down, subscriptions up), as ``zmq.proxy`` does, counting the subscriptions it saw.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json
import os
import socket
import subprocess
import threading
import time

import pytest
import zmq

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.wiring import ROUTER_VERSION

EPP_MODULE = "github.com/llm-d/llm-d-router/cmd/epp"
EPP_CACHE = os.path.expanduser(os.path.join("~", ".cache", "inference_cache", "epp", ROUTER_VERSION))
GO_INSTALL_TIMEOUT = 300
_RESOLVED = {}


def _install_problem(text):
    for line in text.splitlines():
        if "403" in line or "Forbidden" in line or "refus" in line.lower():
            return " ".join(line.split())[:200]
    lines = [line for line in text.splitlines() if line.strip()]
    return " ".join(lines[-1].split())[:200] if lines else "no output"


def epp_binary():
    """The EPP binary to test with, or skip (one sentence) when none can be had."""
    if "path" not in _RESOLVED:
        _RESOLVED["path"], _RESOLVED["why"] = _resolve()
    if not _RESOLVED["path"]:
        pytest.skip(_RESOLVED["why"])
    return _RESOLVED["path"]


def _resolve():
    given = os.environ.get("SUBSTRATE_EPP_BINARY")
    if given:
        if os.path.isfile(given) and os.access(given, os.X_OK):
            return given, None
        return None, "SUBSTRATE_EPP_BINARY=%s is no executable file; set it to an EPP %s binary." % (given, ROUTER_VERSION)
    cached = os.path.join(EPP_CACHE, "epp")
    if os.path.isfile(cached) and os.access(cached, os.X_OK):
        return cached, None
    try:
        run = subprocess.run(["go", "install", "%s@%s" % (EPP_MODULE, ROUTER_VERSION)], env=dict(os.environ, GOBIN=EPP_CACHE),
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
    raise RuntimeError("no free port on %s" % ", ".join(hosts))


class Relay:
    """XSUB bound at the engine's endpoint, XPUB bound at the public one; events down, subscriptions up."""

    def __init__(self, engine_endpoint, public_endpoint):
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
        self.messages = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        poller = zmq.Poller()
        poller.register(self.xsub, zmq.POLLIN)
        poller.register(self.xpub, zmq.POLLIN)
        while not self.stopping.is_set():
            for sock, _event in poller.poll(100):
                frames = sock.recv_multipart()
                if sock is self.xsub:
                    self.messages += 1
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


class EPP:
    """One EPP process with file discovery; ``address`` is its ext_proc host:port."""

    def __init__(self, binary, config, endpoints, folder, secure=False, name="epp"):
        self.folder = folder
        self.grpc_port, self.health_port, self.metrics_port = free_port("0.0.0.0"), free_port("0.0.0.0"), free_port("0.0.0.0")
        while len({self.grpc_port, self.health_port, self.metrics_port}) < 3:
            self.metrics_port = free_port("0.0.0.0")
        self.endpoints_path = os.path.join(folder, "%s-endpoints.yaml" % name)
        with open(self.endpoints_path, "w") as out:
            json.dump({"endpoints": [{"name": n, "address": a, "port": str(p)} for n, a, p in endpoints]}, out)
        config = dict(config)
        config["plugins"] = [{"name": "file-discovery", "type": "file-discovery",
                              "parameters": {"path": self.endpoints_path, "watchFile": False}}] + list(config["plugins"])
        self.config = config
        self.config_path = os.path.join(folder, "%s-config.yaml" % name)
        with open(self.config_path, "w") as out:
            json.dump(config, out, indent=1)   # JSON is YAML
        self.log_path = os.path.join(folder, "%s.log" % name)
        self.cmd = [binary, "--config-file", self.config_path, "--pool-name", "substrate-test", "--grpc-port", str(self.grpc_port),
                    "--grpc-health-port", str(self.health_port), "--metrics-port", str(self.metrics_port),
                    "--secure-serving=%s" % ("true" if secure else "false"), "--v", "3"]
        self.address = "127.0.0.1:%d" % self.grpc_port
        self.proc = None

    def log(self, chars=3000):
        try:
            with open(self.log_path) as log:
                return log.read()[-chars:]
        except OSError:
            return ""

    def start(self, timeout=60.0):
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("The EPP exited with %s at start:\n%s" % (self.proc.returncode, self.log()))
            try:
                socket.create_connection(("127.0.0.1", self.grpc_port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise AssertionError("The EPP's ext_proc port %d did not open within %ss:\n%s" % (self.grpc_port, timeout, self.log()))

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(15)


def wait_subscribed(relays, counts, timeout=30.0):
    """Until each relay saw its count of subscriptions (the EPP's and the check's): the streams reach their subscribers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(len(r.subscriptions) >= count for r, count in zip(relays, counts)):
            return
        time.sleep(0.1)
    raise AssertionError("subscriptions seen by the relays: %s" % [(r.public_endpoint, r.subscriptions) for r in relays])
