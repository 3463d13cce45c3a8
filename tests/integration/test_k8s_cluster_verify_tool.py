# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""tools/cluster_verify.py run as the cluster_verify Job runs it (a subprocess, real HTTP), against stand-ins.

Two engine "pods" listen on the same port at 127.0.0.1 and 127.0.0.2 (the pod IPs), each serving /v1/completions
and a vLLM-style /metrics whose prefix-cache hit counter moves when a prompt shares leading words with one it
served before. A "router" forwards each completion to one pod (by prefix affinity, or round robin to show the
check failing) and an "EPP" serves its KV-block index counters. The test runs the real CLI with
``--checks routed_prefix`` and reads its JSON report and exit status.
"""

from __future__ import absolute_import, division, print_function

import json
import os
import socket
import subprocess
import sys
import threading
import urllib.request

import pytest

from ansible_collections.inference_cache.substrate.tests.unit.plugins.net_utils import free_port

try:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
except ImportError:  # pragma: no cover
    pytest.skip("Python 3.7+ http.server is required", allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "cluster_verify.py")
PODS = ("127.0.0.1", "127.0.0.2")


class State:
    def __init__(self, route):
        self.route = route
        self.lock = threading.Lock()
        self.pods = dict((ip, {"prompts": [], "hits": 0, "queries": 0}) for ip in PODS)
        self.epp = {"admissions": 0, "lookups": 0}
        self.forwarded = []


def shared_words(a, b):
    count = 0
    for x, y in zip(a.split(), b.split()):
        if x != y:
            break
        count += 1
    return count


def handler(state, role, ip=None, engine_port=None):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def reply(self, code, body, kind="application/json"):
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/metrics" and role == "engine":
                pod = state.pods[ip]
                self.reply(200, "# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total{model_name=\"tiny\"} %d\n"
                                "# TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total{model_name=\"tiny\"} %d\n"
                           % (pod["hits"], pod["queries"]), "text/plain")
            elif self.path == "/metrics" and role == "epp":
                self.reply(200, "kvcache_index_admissions_total %d\nkvcache_index_lookup_hits_total %d\n"
                           % (state.epp["admissions"], state.epp["lookups"]), "text/plain")
            elif self.path == "/v1/models" and role in ("engine", "router"):
                self.reply(200, {"object": "list", "data": [{"id": "tiny", "object": "model"}]})
            else:
                self.reply(404, {"error": "no such path"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            prompt = body["prompt"]
            if role == "router":
                with state.lock:
                    if state.route == "affinity":
                        target = max(PODS, key=lambda p: max([shared_words(prompt, q) for q in state.pods[p]["prompts"]] or [0]))
                        best = max([shared_words(prompt, q) for q in state.pods[target]["prompts"]] or [0])
                        state.epp["lookups"] += best // 32
                    else:
                        target = PODS[len(state.forwarded) % 2]
                    state.forwarded.append(target)
                request = urllib.request.Request("http://%s:%d/v1/completions" % (target, engine_port), data=json.dumps(body).encode(),
                                                 headers={"Content-Type": "application/json"}, method="POST")
                with urllib.request.urlopen(request, timeout=10) as response:
                    self.reply(response.status, json.loads(response.read()))
                return
            with state.lock:
                pod = state.pods[ip]
                hit = max([shared_words(prompt, q) for q in pod["prompts"]] or [0])
                pod["hits"] += (hit // 32) * 32
                pod["queries"] += len(prompt.split())
                pod["prompts"].append(prompt)
                state.epp["admissions"] += len(prompt.split()) // 32
            self.reply(200, {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
                             "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": 1, "total_tokens": 1}})
    return Handler


@pytest.fixture
def cluster(request):
    try:
        probe = socket.socket()
        probe.bind(("127.0.0.2", 0))
        probe.close()
    except OSError:
        pytest.skip("127.0.0.2 is not a loopback address here: two pod IPs cannot be emulated on one machine")
    state = State(getattr(request, "param", "affinity"))
    engine_port = free_port()
    servers = [ThreadingHTTPServer((ip, engine_port), handler(state, "engine", ip=ip)) for ip in PODS]
    router = ThreadingHTTPServer(("127.0.0.1", 0), handler(state, "router", engine_port=engine_port))
    epp = ThreadingHTTPServer(("127.0.0.1", 0), handler(state, "epp"))
    servers += [router, epp]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield {"state": state, "engine_port": engine_port, "router": "http://127.0.0.1:%d" % router.server_address[1],
           "epp": "http://127.0.0.1:%d/metrics" % epp.server_address[1]}
    for server in servers:
        server.shutdown()
        server.server_close()


def run_tool(cluster, *extra):
    cmd = [sys.executable, TOOL, "--service", "engines-kv-events.test", "--pods", ",".join(PODS), "--expect-pods", "2",
           "--http-port", str(cluster["engine_port"]), "--checks", "routed_prefix", "--router-url", cluster["router"],
           "--epp-metrics-url", cluster["epp"], "--block-size", "32", "--settle", "0.1", "--prefix-words", "300",
           "--timeout", "10"] + list(extra)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=60, check=False)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_the_tool_passes_when_the_router_keeps_a_prefix_on_its_pod(cluster):
    code, report = run_tool(cluster)
    assert code == 0, report
    result = report["router"]["routed_prefix"]
    assert len(cluster["state"].forwarded) == 2 and len(set(cluster["state"].forwarded)) == 1, "both requests went through the router"
    assert result["served_by"] == [cluster["state"].forwarded[0]]
    assert result["epp_admissions"] > 0 and result["epp_lookup_hits"] > 0
    assert report["msg"] == "All 2 pod(s) passed routed_prefix."


@pytest.mark.parametrize("cluster", ["round-robin"], indirect=True)
def test_the_tool_fails_when_the_router_ignores_the_prefix(cluster):
    code, report = run_tool(cluster)
    assert code == 1
    assert "No engine pod reported a prefix-cache hit" in report["msg"]
    assert cluster["state"].forwarded == list(PODS)


def test_the_tool_fails_when_the_router_does_not_answer(cluster):
    cluster["router"] = "http://127.0.0.1:%d" % free_port()
    code, report = run_tool(cluster)
    assert code == 1
    assert report["msg"].startswith("Through the router, routed_prefix: A request through the router or a metrics read failed:")
