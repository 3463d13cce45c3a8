# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""plugins/module_utils/epp/local.py (and service/confine.py): the local EPP's confinement to loopback, its file
discovery, its errors.

A stand-in program plays the EPP's network side: like the EPP v0.9.0 it listens on every interface on the ports its
flags name (ext_proc, health, metrics), and on each request it reads every endpoint of its file-discovery list and
answers with what they said. Confined, it must serve through the host-side 127.0.0.1 ports, reach engines on the host's
loopback (127.0.0.2 included), and have no listening socket in this machine's network namespace.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.epp import local as L
from ansible_collections.inference_cache.substrate.tests.harness import epp_lab

STAND_IN = textwrap.dedent('''\
    import argparse, http.server, json, sys, threading, urllib.request
    p = argparse.ArgumentParser()
    for flag in ("--config-file", "--pool-name", "--grpc-port", "--grpc-health-port", "--metrics-port", "--secure-serving", "--v"):
        p.add_argument(flag)
    a = p.parse_args()
    config = json.load(open(a.config_file))
    path = [q for q in config["plugins"] if q["type"] == "file-discovery"][0]["parameters"]["path"]
    endpoints = json.load(open(path))["endpoints"]
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            said = [urllib.request.urlopen("http://%s:%s/" % (e["address"], e["port"]), timeout=5).read().decode() for e in endpoints]
            body = json.dumps({"port": self.server.server_address[1], "said": said}).encode()
            self.send_response(200); self.end_headers(); self.wfile.write(body)
        def log_message(self, *args):
            pass
    servers = [http.server.ThreadingHTTPServer(("0.0.0.0", int(port)), H) for port in (a.grpc_port, a.grpc_health_port, a.metrics_port)]
    for s in servers[1:]:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    servers[0].serve_forever()
''')


def _userns_problem():
    if not shutil.which("unshare"):
        return "no unshare command (util-linux)"
    run = subprocess.run(["unshare", "--net", "--map-root-user", "true"], capture_output=True, text=True, check=False)
    return None if run.returncode == 0 else (run.stderr.strip() or "unshare --net --map-root-user failed")


@pytest.fixture(name="confinable", scope="module")
def _confinable():
    problem = _userns_problem()
    if problem:
        pytest.skip("This machine cannot make an unprivileged network namespace (%s): the EPP cannot be confined here." % problem)


class Engine(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("engine at %s:%d" % self.server.server_address).encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):   # pylint: disable=arguments-differ
        pass


@pytest.fixture(name="engines")
def _engines():
    servers = [http.server.ThreadingHTTPServer((host, 0), Engine) for host in ("127.0.0.1", "127.0.0.2")]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield [("engine-%d" % i, s.server_address[0], s.server_address[1]) for i, s in enumerate(servers)]
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture(name="stand_in")
def _stand_in(tmp_path):
    path = tmp_path / "stand_in_epp.py"
    path.write_text(STAND_IN)
    wrapper = tmp_path / "epp"
    wrapper.write_text("#!/bin/sh\nexec %s %s \"$@\"\n" % (sys.executable, path))
    wrapper.chmod(0o755)
    return str(wrapper)


def _get(url):
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def _stand_in_pid(root_pid, timeout=60.0):
    """The stand-in's pid: the process under ``root_pid`` whose command line names stand_in_epp.py."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open("/proc/%s/cmdline" % entry, "rb") as cmd:
                        if b"stand_in_epp.py" in cmd.read() and _descends(int(entry), root_pid):
                            return int(entry)
                except OSError:
                    continue
        time.sleep(0.1)
    raise AssertionError("no stand-in process under %d" % root_pid)


def _descends(pid, root):
    while pid > 1:
        if pid == root:
            return True
        try:
            with open("/proc/%d/stat" % pid) as stat:
                pid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            return False
    return False


def _listening(table_paths):
    """{inode: port} of the listening TCP sockets (state 0A) in /proc net tables."""
    out = {}
    for path in table_paths:
        with open(path) as table:
            for line in table.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A":
                    out[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    return out


def _socket_inodes(pid):
    out = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        match = re.match(r"socket:\[(\d+)\]$", target)
        if match:
            out.add(match.group(1))
    return out


def _tables(pid):
    return ["/proc/%s/net/%s" % (pid, name) for name in ("tcp", "tcp6")]


def test_confined_epp_serves_and_reaches_through_loopback_and_listens_nowhere_here(confinable, engines, stand_in, tmp_path):  # pylint: disable=unused-argument
    epp = L.EPP(stand_in, epp_lab.file_discovery({"plugins": []}, engines, str(tmp_path)), engines, str(tmp_path))
    with epp:
        answer = _get("http://%s/" % epp.address)
        assert answer["port"] == L.INSIDE_PORTS["grpc"], answer
        assert answer["said"] == ["engine at %s:%d" % (host, port) for _name, host, port in engines], answer
        assert _get(epp.metrics_url)["port"] == L.INSIDE_PORTS["metrics"]
        pid = _stand_in_pid(epp.confined.proc.pid)
        assert os.readlink("/proc/%d/ns/net" % pid) != os.readlink("/proc/self/ns/net")
        theirs = _socket_inodes(pid)
        inside = dict((inode, port) for inode, port in _listening(_tables(pid)).items() if inode in theirs)
        assert sorted(inside.values()) == sorted(L.INSIDE_PORTS.values()), inside   # it does listen: on 9002, 9003, 9090
        here = _listening(_tables("self"))
        assert not set(inside) & set(here), "the stand-in listens in this machine's network namespace: %s" % inside
        assert int(epp.address.rsplit(":", 1)[1]) in here.values()   # the host side: ours, on 127.0.0.1
    assert not os.path.exists("/proc/%d" % pid) or open("/proc/%d/stat" % pid).read().split()[2] == "Z"


def test_a_confined_epp_runs_from_a_folder_too_long_for_a_unix_socket(confinable, engines, stand_in, tmp_path):  # pylint: disable=unused-argument
    """Under a long HOME (CI's own, a deep state folder) the EPP's folder is past sun_path's 107 bytes: the bridge's
    sockets live in a private temporary folder, gone after stop."""
    folder = tmp_path / ("deep-" * 8) / ("state-" * 8)
    folder.mkdir(parents=True)
    assert len(os.path.join(str(folder), "serve-0.sock")) > 107
    epp = L.EPP(stand_in, epp_lab.file_discovery({"plugins": []}, engines, str(folder)), engines, str(folder))
    with epp:
        assert len(_get("http://%s/" % epp.address)["said"]) == 2
        sockets = epp.confined.sockets
        assert (os.stat(sockets).st_mode & 0o777) == 0o700 and sorted(os.listdir(sockets))
    assert not os.path.exists(sockets)


def test_unconfined_epp_listens_here_which_the_test_would_see(engines, stand_in, tmp_path):
    """The control: asked to run unconfined, the same program's listeners are in this namespace's table."""
    epp = L.EPP(stand_in, epp_lab.file_discovery({"plugins": []}, engines, str(tmp_path)), engines, str(tmp_path), confine=False)
    with epp:
        answer = _get("http://%s/" % epp.address)
        assert len(answer["said"]) == 2
        pid = _stand_in_pid(epp.proc.pid)
        here = _listening(_tables("self"))
        assert _socket_inodes(pid) & set(here)


def test_confined_epp_refuses_an_engine_off_loopback(confinable, stand_in, tmp_path):  # pylint: disable=unused-argument
    with pytest.raises(L.EPPError, match=r"^A confined EPP reaches loopback addresses only, not 10\.1\.2\.3; run the engines on "
                       r"127\.0\.0\.0/8, or ask for an unconfined EPP\.$"):
        L.EPP(stand_in, {"plugins": []}, [("remote", "10.1.2.3", 8000)], str(tmp_path))


def test_an_epp_that_exits_at_start_says_so_with_its_log(confinable, tmp_path):  # pylint: disable=unused-argument
    binary = tmp_path / "epp"
    binary.write_text("#!/bin/sh\necho 'config: unknown field \"nope\"' >&2\nexit 3\n")
    binary.chmod(0o755)
    epp = L.EPP(str(binary), {"plugins": []}, [("a", "127.0.0.1", 8000)], str(tmp_path))
    with pytest.raises(L.EPPError) as caught:
        epp.start(timeout=20)
    assert caught.value.args[0].startswith("The EPP exited with ") and 'unknown field "nope"' in caught.value.args[0]


def test_file_discovery_replaces_kubernetes_and_keeps_the_config():
    config = {"plugins": [{"type": "prefix-cache-scorer"}], "schedulingProfiles": [{"name": "default", "plugins": []}],
              "dataLayer": {"sources": [{"pluginRef": "x"}]}}
    out = epp_lab.with_file_discovery(config, "/tmp/e.yaml")
    assert out["plugins"][0] == {"name": "file-discovery", "type": "file-discovery", "parameters": {"path": "/tmp/e.yaml", "watchFile": False}}
    assert out["dataLayer"]["discovery"] == {"pluginRef": "file-discovery"} and out["dataLayer"]["injectDefaults"] is False
    assert out["dataLayer"]["sources"] == [{"pluginRef": "x"}, {"pluginRef": "metrics-source", "extractors": [{"pluginRef": "metrics-extractor"}]}]
    assert out["schedulingProfiles"] == config["schedulingProfiles"] and config["plugins"] == [{"type": "prefix-cache-scorer"}]
    again = epp_lab.with_file_discovery(out, "/tmp/f.yaml")
    assert [p["type"] for p in again["plugins"]].count("file-discovery") == 1 and len(again["dataLayer"]["sources"]) == 2


def test_reached_addresses_are_the_endpoints_their_kv_port_and_the_token_producer():
    config = {"plugins": [
        {"type": "token-producer", "parameters": {"vllm": {"url": "http://127.0.0.1:8400"}}},
        {"type": "precise-prefix-cache-producer", "parameters": {"kvEventsConfig": {"discoverPods": True, "podDiscoveryConfig": {"socketPort": 5810}}}}]}
    got = L.reached_addresses(config, [("a", "127.0.0.1", 8400), ("b", "127.0.0.2", 8401)])
    assert got == [("127.0.0.1", 5810), ("127.0.0.1", 8400), ("127.0.0.2", 5810), ("127.0.0.2", 8401)]
    config["plugins"][1]["parameters"]["kvEventsConfig"]["discoverPods"] = False
    assert L.reached_addresses(config, [("a", "127.0.0.1", 8400)]) == [("127.0.0.1", 8400)]


def test_resolve_binary_names_what_is_wrong(tmp_path, monkeypatch):
    path, why = L.resolve_binary(str(tmp_path / "missing"))
    assert path is None and why == "%s is no executable file; give the path of an EPP %s binary." % (tmp_path / "missing", L.ROUTER_VERSION)
    monkeypatch.delenv("SUBSTRATE_EPP_BINARY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    path, why = L.resolve_binary()
    assert path is None and why.startswith("No EPP binary given and none at %s" % tmp_path)


def test_an_unshare_that_is_refused_asks_for_user_namespaces_or_an_unconfined_epp(stand_in, tmp_path, monkeypatch):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "unshare").write_text("#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n")
    (fake / "unshare").chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (fake, os.environ["PATH"]))
    epp = L.EPP(stand_in, {"plugins": []}, [("a", "127.0.0.1", 8000)], str(tmp_path))
    with pytest.raises(L.EPPError, match=r"^Cannot confine the EPP to loopback \(unshare: unshare failed: Operation not permitted\); "
                       r"allow unprivileged user namespaces, or ask for an unconfined EPP, whose ports then listen on every interface\.$"):
        epp.start(timeout=20)


def test_no_unshare_at_all_is_one_sentence(stand_in, tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(L.EPPError, match=r"^Cannot confine the EPP to loopback: no unshare command \(util-linux\); install it, or ask "
                       r"for an unconfined EPP, whose ports listen on every interface\.$"):
        L.EPP(stand_in, {"plugins": []}, [("a", "127.0.0.1", 8000)], str(tmp_path))


def test_resolve_epp_takes_llm_d_first_then_the_gie_build(tmp_path, monkeypatch):
    """Which EPP the tests and the bench run: a binary named (of the kind named beside it), llm-d's, else the GIE's."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SUBSTRATE_EPP_BINARY", raising=False)
    monkeypatch.delenv("SUBSTRATE_EPP_IMPL", raising=False)
    path, impl, why = L.resolve_epp()
    assert path is None and impl is None
    assert why.startswith("No EPP binary given and none at %s" % tmp_path) and "No GIE EPP %s at %s" % (L.GIE_VERSION, tmp_path) in why
    gie = tmp_path / ".cache" / "inference_cache" / "kwok_cluster" / "bin" / ("gie-%s" % L.GIE_VERSION)
    gie.mkdir(parents=True)
    (gie / "epp").write_text("#!/bin/sh\n")
    (gie / "epp").chmod(0o755)
    (gie / "inferencepool-crds.yaml").write_text("---\n")
    assert L.resolve_epp() == (str(gie / "epp"), "gie", None)
    named = tmp_path / "llm-d-epp"
    named.write_text("#!/bin/sh\n")
    named.chmod(0o755)
    monkeypatch.setenv("SUBSTRATE_EPP_BINARY", str(named))
    assert L.resolve_epp() == (str(named), "llm-d", None)
    assert L.resolve_epp(impl="gie") == (str(gie / "epp"), "gie", None)   # an llm-d binary is not a GIE one
    monkeypatch.setenv("SUBSTRATE_EPP_IMPL", "gie")
    assert L.resolve_epp() == (str(named), "gie", None)
    assert L.resolve_epp(impl="nginx")[2] == "EPP nginx is none this collection knows (gie, llm-d)."


def test_a_gie_epp_needs_a_kubeconfig(tmp_path, stand_in):
    with pytest.raises(L.EPPError, match=r"^The GIE EPP discovers its endpoints through the Kubernetes API only; give the kubeconfig"):
        L.EPP(stand_in, {}, [("a", "127.0.0.1", 8000)], str(tmp_path), impl="gie")


def test_a_runner_killed_while_its_program_is_slow_to_stop_leaves_no_sockets_folder(confinable, tmp_path):  # pylint: disable=unused-argument
    """A confined program's runner (the simulated_engine role's ``files/confined.py``, a simulated engine's service) gets
    SIGTERM, then SIGKILL when it has not exited within the
    service's stop timeout (local_service; the simulated engine's is 10 s), while the program it confines is still
    stopping. The bridge's sockets' folder, in the temporary folder, is gone by then: it goes at SIGTERM, not after the
    program has exited (a CI run found one left behind)."""
    import psutil  # pylint: disable=import-outside-toplevel
    scratch = tempfile.mkdtemp(prefix="cf-")   # the runner's temporary folder: short, as the bridge's socket paths must be
    entry = os.path.join(os.path.dirname(L.__file__), "..", "..", "..", "roles", "simulated_engine", "files", "confined.py")
    spec = {"reach": [], "serve": [9555], "folder": str(tmp_path), "label": "slow program"}
    slow = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"]
    runner = subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, entry, json.dumps(spec), "--"] + slow, env=dict(os.environ, TMPDIR=scratch, PYTHONPATH=""),
        start_new_session=True)
    family = []
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (os.listdir(scratch) and len(psutil.Process(runner.pid).children(recursive=True)) >= 3):
            time.sleep(0.1)
        sockets = [name for name in os.listdir(scratch) if name.startswith("epp-")]
        assert len(sockets) == 1, os.listdir(scratch)
        family = psutil.Process(runner.pid).children(recursive=True)
        assert any("time.sleep(60)" in " ".join(p.cmdline()) for p in family), [p.cmdline() for p in family]
        runner.send_signal(signal.SIGTERM)
        time.sleep(2)   # the program ignores SIGTERM: the runner is still waiting on it
        assert runner.poll() is None
        os.killpg(runner.pid, signal.SIGKILL)
        runner.wait(10)
        assert os.listdir(scratch) == [], "left in the temporary folder: %s" % os.listdir(scratch)
    finally:
        for proc in family + [runner]:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except OSError:
                pass
        runner.wait(10)
        shutil.rmtree(scratch, ignore_errors=True)
