# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""roles/cluster_verify/files/cluster_verify.py run as the cluster_verify Job runs it (a subprocess, real HTTP), against stand-ins.

Two engine "pods" listen on the same port at 127.0.0.1 and 127.0.0.2 (the pod IPs), each serving /v1/completions
and a vLLM-style /metrics whose prefix-cache hit counter moves when a prompt shares leading words with one it
served before. A "router" forwards each completion to one pod (by prefix affinity, or round robin to show the
check failing) and an "EPP" serves the metrics page of one EPP mode (llm-d-router v0.9.0):

* ``precise``: the KV-block index counters, admissions when an engine's KV events arrive, lookup hits at routing
  (``precise-no-events``: the same page, no KV event arrives);
* ``approximate``: only the approximate producer's prefix indexer histogram (no kvcache_index_* counter);
* ``speculative``: precise with speculative indexing, entries (and admissions) added at routing time that expire after
  the TTL, plus the engines' KV events; ``speculative-no-events``: the same with no KV event at all.

The test runs the real CLI with ``--checks routed_prefix`` and reads its JSON report and exit status.
"""

from __future__ import absolute_import, division, print_function

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from ansible_collections.inference_cache.substrate.tests.unit.plugins.net_utils import free_port

try:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
except ImportError:  # pragma: no cover
    pytest.skip("Python 3.7+ http.server is required", allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "roles", "cluster_verify", "files", "cluster_verify.py")
PODS = ("127.0.0.1", "127.0.0.2")


APPROX_PAGE = """# TYPE llm_d_epp_prefix_indexer_size gauge
llm_d_epp_prefix_indexer_size{plugin_name="approx-prefix-cache-producer",plugin_type="approx-prefix-cache-producer"} %(size)d
# TYPE llm_d_epp_prefix_indexer_hit_bytes histogram
llm_d_epp_prefix_indexer_hit_bytes_bucket{le="+Inf",plugin_name="approx-prefix-cache-producer",plugin_type="approx-prefix-cache-producer"} %(count)d
llm_d_epp_prefix_indexer_hit_bytes_sum{plugin_name="approx-prefix-cache-producer",plugin_type="approx-prefix-cache-producer"} %(bytes)d
llm_d_epp_prefix_indexer_hit_bytes_count{plugin_name="approx-prefix-cache-producer",plugin_type="approx-prefix-cache-producer"} %(count)d
# TYPE inference_extension_prefix_indexer_hit_bytes histogram
inference_extension_prefix_indexer_hit_bytes_bucket{le="+Inf"} %(count)d
inference_extension_prefix_indexer_hit_bytes_sum %(bytes)d
inference_extension_prefix_indexer_hit_bytes_count %(count)d
"""
PRECISE_PAGE = """# TYPE kvcache_index_admissions counter
kvcache_index_admissions_total %(admissions)d
# TYPE kvcache_index_lookup_hits counter
kvcache_index_lookup_hits_total %(lookups)d
"""


class State:
    def __init__(self, route="affinity", epp="precise", ttl=1.0):
        self.route = route
        self.epp_mode = epp
        self.ttl = ttl
        self.lock = threading.Lock()
        self.pods = dict((ip, {"prompts": [], "hits": 0, "queries": 0}) for ip in PODS)
        self.epp = {"admissions": 0, "lookups": 0, "count": 0, "bytes": 0, "size": 0}
        # The EPP's index: (prompt, pod, expiry or None); KV events add lasting entries, speculative indexing expiring ones.
        self.index = []
        self.forwarded = []

    @property
    def events(self):
        return self.epp_mode in ("precise", "speculative")

    def lookup(self, prompt, pod):
        now = time.monotonic()
        live = [q for q, p, expiry in self.index if p == pod and (expiry is None or expiry > now)]
        return max([shared_words(prompt, q) for q in live] or [0])


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
                page = APPROX_PAGE if state.epp_mode == "approximate" else PRECISE_PAGE
                self.reply(200, page % state.epp, "text/plain")
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
                    else:
                        target = PODS[len(state.forwarded) % 2]
                    state.forwarded.append(target)
                    if state.epp_mode == "approximate":  # PreRequest: observe the matched bytes, index the prompt
                        state.epp["count"] += 1
                        state.epp["bytes"] += 4 * max([shared_words(prompt, q) for q, p, _e in state.index if p == target] or [0])
                        state.index.append((prompt, target, None))
                        state.epp["size"] = len(state.index)
                    else:  # Produce: look the prompt up; PreRequest: speculative entries until the TTL
                        state.epp["lookups"] += state.lookup(prompt, target) // 32
                        if state.epp_mode.startswith("speculative"):
                            state.index.append((prompt, target, time.monotonic() + state.ttl))
                            state.epp["admissions"] += len(prompt.split()) // 32
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
                if state.events:  # the pod's KV events reach the EPP's index
                    state.index.append((prompt, ip, None))
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
    param = getattr(request, "param", {})
    state = State(**({"route": param} if isinstance(param, str) else param))
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
    mode = "approximate" if cluster["state"].epp_mode == "approximate" else "precise"
    cmd = [sys.executable, TOOL, "--service", "engines-kv-events.test", "--pods", ",".join(PODS), "--expect-pods", "2",
           "--http-port", str(cluster["engine_port"]), "--checks", "routed_prefix", "--router-url", cluster["router"],
           "--epp-metrics-url", cluster["epp"], "--block-size", "32", "--settle", "0.1", "--prefix-words", "300",
           "--timeout", "10", "--scoring-mode", mode] + list(extra)
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


# -- the EPP's evidence in each mode (issue 17) -----------------------------------------------------------------

@pytest.mark.parametrize("cluster", [{"epp": "approximate"}], indirect=True)
def test_approximate_mode_passes_on_the_approximate_producers_metrics(cluster):
    """v0.9.0's approximate producer registers no kvcache_index_* counter: its own prefix indexer histogram is the evidence."""
    code, report = run_tool(cluster)
    assert code == 0, report
    result = report["router"]["routed_prefix"]
    assert result["epp_evidence"] == "approximate_indexer"
    assert result["epp_prefix_lookups"] == 2 and result["epp_prefix_match_bytes"] > 0
    assert "epp_admissions" not in result, "approximate mode makes no claim about KV events"
    assert "consumes no KV events" in result["msg"]


@pytest.mark.parametrize("cluster", [{"epp": "precise"}], indirect=True)
def test_approximate_mode_refuses_a_page_without_the_approximate_producer(cluster):
    code, report = run_tool(cluster, "--scoring-mode", "approximate")
    assert code == 1
    assert "has no approximate prefix indexer metric (llm_d_epp_prefix_indexer_hit_bytes" in report["msg"]


@pytest.mark.parametrize("cluster", [{"epp": "precise"}], indirect=True)
def test_precise_mode_passes_on_kv_events(cluster):
    code, report = run_tool(cluster)
    assert code == 0, report
    result = report["router"]["routed_prefix"]
    assert result["epp_evidence"] == "kv_events" and result["epp_admissions"] > 0 and result["epp_lookup_hits"] > 0


@pytest.mark.parametrize("cluster", [{"epp": "precise-no-events"}], indirect=True)
def test_precise_mode_fails_without_kv_events(cluster):
    code, report = run_tool(cluster)
    assert code == 1
    assert "admitted no block while the engines cached the prefix" in report["msg"]


@pytest.mark.parametrize("cluster", [{"epp": "speculative-no-events", "ttl": 1.0}], indirect=True)
def test_speculative_movement_alone_is_no_kv_event_evidence(cluster):
    """Speculative indexing moves admissions and lookup hits at routing time with no KV event: the check waits out the TTL."""
    code, report = run_tool(cluster, "--speculative-indexing", "--speculative-ttl", "1s")
    result = report["router"]["routed_prefix"]
    assert cluster["state"].epp["admissions"] > 0, "the stand-in EPP admitted speculative entries"
    assert code == 1, report
    assert result["epp_evidence"] == "kv_events_after_speculative_ttl"
    assert "once its speculative entries had expired (speculativeTTL 1s): no KV event from the engines reached it" in report["msg"]


@pytest.mark.parametrize("cluster", [{"epp": "speculative", "ttl": 1.0}], indirect=True)
def test_speculative_mode_passes_when_kv_events_outlive_the_ttl(cluster):
    code, report = run_tool(cluster, "--speculative-indexing", "--speculative-ttl", "1s")
    assert code == 0, report
    result = report["router"]["routed_prefix"]
    assert result["epp_evidence"] == "kv_events_after_speculative_ttl" and result["epp_lookup_hits"] > 0
    assert "no evidence of KV events" in result["epp_admissions_note"]


@pytest.mark.parametrize("cluster", [{"epp": "speculative-no-events", "ttl": 3600.0}], indirect=True)
def test_speculative_ttl_beyond_the_timeout_is_reported_not_provable(cluster):
    code, report = run_tool(cluster, "--speculative-indexing", "--speculative-ttl", "1h")
    result = report["router"]["routed_prefix"]
    assert code == 0, report
    assert result["epp_evidence"] == "not_provable" and result["kv_events"] == "not provable"
    assert "whether KV events reached the EPP is not provable" in result["msg"]
    assert "admitted" not in result["msg"], "no KV-event claim from counters speculative indexing moves"
