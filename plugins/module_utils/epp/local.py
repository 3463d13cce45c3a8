# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""A real EPP on this machine, confined to loopback: which binary, its process, ``serve`` (pure Python, no Ansible).

Two EPPs: the llm-d router's (``llm-d``, v0.9.0: precise routing from the engines' KV events; discovery from a file) and
the Gateway API Inference Extension's (``gie``, v1.4.0, the upstream EPP llm-d's extends: approximate prefix-cache
scoring; it always discovers its endpoints through the Kubernetes API, here a kwok cluster's real API server, whose
side is ``epp/local_kube.py``). Used by the ``local_router`` role (``serve``, as a service of ``local_service``), and by
the benchmarks and tests, whose harness (``tests/harness/epp_lab.py``: file discovery, KV relays, an InferencePool over
local engines) stays out of the collection's payload.

``resolve_binary(given)``: the llm-d EPP binary (``given``, else ``SUBSTRATE_EPP_BINARY``, else the build of the
collection's catalog of Go builds, ``vars/go_builds.yml`` ``llm-d-router``), or ``None`` and the reason in one sentence.
``resolve_gie()``: the GIE EPP of that catalog's ``gie`` build. ``resolve_epp(given, impl)``: ``(path, impl, None)`` or
``(None, None, sentence)``: llm-d's where it can be had, else the GIE EPP. Nothing here builds: the builds are
``inference_cache.substrate.go_build``'s (``playbooks/go_build.yml``).

``EPP(binary, config, endpoints, folder, secure=False, confine=True, impl="llm-d", pool=..., kubeconfig=None)``: one
EPP process over ``endpoints`` (``[(name, address, port)]``; for ``gie``, the InferencePool ``pool`` of ``namespace``
read through ``kubeconfig``, whose API server it reaches through the bridge too). The EPP listens on every interface
(ext_proc 9002, health 9003, metrics 9090) and has no bind flag (llm-d-router@v0.9.0:cmd/epp/runner/runner.go), so by
default it runs confined (``service/confine.py``: a network namespace whose only interface is loopback); ``address`` and
``metrics_url`` are the host side, on 127.0.0.1. ``confine=False`` (only when the user asks) runs it unconfined on
free ports.

``serve(...)``: one confined EPP in the foreground until SIGTERM, on fixed host ports (``roles/local_router/files/epp_serve.py``
is its entry).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import copy
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import time
from urllib.parse import urlsplit

from ..common.errors import CheckError
from ..common.wiring import GIE_VERSION, ROUTER_IMPLS, ROUTER_VERSION
from ..go.build import build_dir as _build_dir, state_dir
from ..service.confine import Confined, ConfinementError, StopRequest, stop_group
from .local_kube import kube_server, service_account_kubeconfig

IMPLS = tuple(sorted(ROUTER_IMPLS))
# The EPP's own ports inside its namespace (its defaults: llm-d-router@v0.9.0:cmd/epp/runner/runner.go flags).
INSIDE_PORTS = {"grpc": 9002, "health": 9003, "metrics": 9090}
LLM_D_BUILD = "llm-d-router"
GIE_BUILD = "gie"
LLM_D_MODULE = "github.com/llm-d/llm-d-router"


class EPPError(CheckError):
    """One sentence: what went wrong with the local EPP and what to do."""


def build_dir(name, version):
    """The folder of the catalog's build ``name`` at ``version`` (vars/go_builds.yml, built by the go_builds role), where
    ``go/build.py`` says the builds live."""
    return _build_dir(state_dir(), name, version)


def _executable(path):
    return os.path.isfile(path) and os.access(path, os.X_OK)


def resolve_binary(given=None, use_env=True):
    """``(path, None)`` or ``(None, sentence)``: ``given``, ``SUBSTRATE_EPP_BINARY``, the catalog's llm-d-router build."""
    given = given or (os.environ.get("SUBSTRATE_EPP_BINARY") if use_env else None)
    if given:
        if _executable(given):
            return given, None
        return None, "%s is no executable file; give the path of an EPP %s binary." % (given, ROUTER_VERSION)
    built = os.path.join(build_dir(LLM_D_BUILD, ROUTER_VERSION), "epp")
    if _executable(built):
        return built, None
    return None, ("No EPP binary given and none at %s; set SUBSTRATE_EPP_BINARY to an EPP %s binary, or build it where the Go "
                  "module proxy serves %s (ansible-playbook playbooks/go_build.yml -e '{\"go_builds_names\": [\"%s\"]}')." % (
                      built, ROUTER_VERSION, LLM_D_MODULE, LLM_D_BUILD))


def gie_build_dir():
    """The catalog's build of the GIE EPP (playbooks/go_build.yml): ``epp`` and ``inferencepool-crds.yaml`` in it."""
    return build_dir(GIE_BUILD, GIE_VERSION)


def gie_crds():
    return os.path.join(gie_build_dir(), "inferencepool-crds.yaml")


def resolve_gie():
    """``(path, None)`` or ``(None, sentence)``: the GIE EPP of the catalog's gie build."""
    built = os.path.join(gie_build_dir(), "epp")
    if _executable(built) and os.path.isfile(gie_crds()):
        return built, None
    return None, "No GIE EPP %s at %s; build it with `ansible-playbook playbooks/go_build.yml` (make gie-epp)." % (GIE_VERSION, built)


def resolve_epp(given=None, impl=None):
    """``(path, impl, None)`` or ``(None, None, sentence)``: which EPP the tests and the bench run.

    A binary given (``given``, or ``SUBSTRATE_EPP_BINARY``) is of ``impl`` (or ``SUBSTRATE_EPP_IMPL``, default llm-d).
    Otherwise ``impl`` gie asks for the GIE EPP alone; any other asks for llm-d's and takes the GIE EPP where llm-d's
    cannot be had.
    """
    if impl is not None and impl not in IMPLS:
        return None, None, "EPP %s is none this collection knows (%s)." % (impl, ", ".join(IMPLS))
    env_impl = os.environ.get("SUBSTRATE_EPP_IMPL") or "llm-d"
    if not given and os.environ.get("SUBSTRATE_EPP_BINARY") and impl in (None, env_impl):
        given, impl = os.environ["SUBSTRATE_EPP_BINARY"], env_impl   # the binary named, of the kind named beside it
    if given:
        if _executable(given):
            return given, impl or env_impl, None
        return None, None, "%s is no executable file; give the path of an EPP binary (llm-d %s or GIE %s)." % (given, ROUTER_VERSION, GIE_VERSION)
    why_llmd = None
    if impl != "gie":
        path, why_llmd = resolve_binary(use_env=False)
        if path:
            return path, "llm-d", None
        if impl == "llm-d":
            return None, None, why_llmd
    path, why = resolve_gie()
    if path:
        return path, "gie", None
    return None, None, " ".join(w for w in (why_llmd, why) if w)


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


class EPP:
    """One EPP process; ``address`` is its ext_proc host:port, ``metrics_url`` its metrics.

    ``impl`` llm-d: ``config`` names how it discovers ``endpoints`` (a file, for the tests and benchmarks: their harness writes
    it). ``impl`` gie: the InferencePool ``pool`` of ``namespace`` through ``kubeconfig`` (its API server is bridged in too),
    ``endpoints`` naming the engines its pods resolve to.
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
            try:
                reach = [kube_server(kubeconfig)]
            except CheckError as exc:
                raise EPPError(exc.msg)
        else:
            self.config = copy.deepcopy(config) if config else {}
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
            try:
                self.confined = Confined(self.cmd, sorted(set(reach + reached_addresses(self.config, endpoints))),
                                         [ports["grpc"], ports["metrics"]], folder, self.log_path, host_ports=wanted, label="EPP")
            except ConfinementError as exc:
                raise EPPError(exc.msg)
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
            stop_group(self.proc)

    def _metrics(self):
        """The text of the EPP's metrics page (plain HTTP on 127.0.0.1)."""
        where = urlsplit(self.metrics_url)
        conn = http.client.HTTPConnection(where.hostname, where.port, timeout=5)
        try:
            conn.request("GET", where.path)
            return conn.getresponse().read().decode("utf-8", "replace")
        finally:
            conn.close()

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
                found = pattern.search(self._metrics())
                seen = float(found.group(1)) if found else None
            except (OSError, http.client.HTTPException):
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


def serve(binary, impl, config, folder, grpc_port, metrics_port, endpoints=(), kubeconfig=None, pool=None, namespace="default",
          service_account=None, secure=False, out=sys.stdout, err=sys.stderr):
    """One confined EPP in the foreground until SIGTERM, on fixed host ports; its exit code (a service of local_service: the
    local_router role's launcher runs ``roles/local_router/files/epp_serve.py``, a thin entry over this).

    ``config``: the EndpointPickerConfig's path (YAML); ``endpoints``: ``[(name, host, port)]`` it reaches;
    ``service_account``: run with that ServiceAccount's token (of ``namespace``), not ``kubeconfig``'s user."""
    import yaml  # pylint: disable=import-outside-toplevel
    try:
        with open(config, encoding="utf-8") as handle:
            loaded = yaml.safe_load(handle) or {}
        os.makedirs(folder, mode=0o700, exist_ok=True)
        if kubeconfig and service_account:
            kubeconfig = service_account_kubeconfig(kubeconfig, namespace, service_account, os.path.join(folder, "epp.kubeconfig"))
        # A stop asked for while the EPP and its bridge are being set up is kept for after it (the default action would
        # leave the bridge's sockets' folder behind).
        stopping = StopRequest()
        epp = EPP(binary, loaded, list(endpoints), folder, secure=secure, name="epp", impl=impl, pool=pool or "substrate-local",
                  kubeconfig=kubeconfig, namespace=namespace, host_ports={"grpc": grpc_port, "metrics": metrics_port})
    except CheckError as exc:
        err.write("%s\n" % exc.msg)
        return 1
    except OSError as exc:
        err.write("The EPP could not be started: %s.\n" % exc)
        return 1
    try:
        if stopping.asked:
            return 0
        epp.start(timeout=120)
        out.write("EPP (%s) serving ext_proc on %s, metrics on %s; log %s\n" % (impl, epp.address, epp.metrics_url, epp.log_path))
        out.flush()
        while not stopping.asked and epp.proc.poll() is None:
            stopping.wait(0.5)
    except CheckError as exc:
        err.write("%s\n" % exc.msg)
        return 1
    finally:
        epp.stop()
    if not stopping.asked:
        err.write("The EPP exited with %s; its log ends:\n%s\n" % (epp.proc.returncode, epp.log()))
        return 1
    return 0
