# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The simulated engines of a fleet (llm-d-inference-sim v0.10.2, roles/simulated_engine) as the benchmarks see them.

* ``load_engines(path)``: the engines of an engines file (what roles/simulated_engine publishes as local_engine_instances,
  written as JSON by the playbook that started them), in the order of their names;
* ``Client``: keep-alive HTTP per thread and engine (each request to a confined engine crosses its bridge);
* ``Truth``: each engine's true cache, the set of its own block hashes from its KV events (BlockStored adds, BlockRemoved
  drops, AllBlocksCleared empties); a prompt's hashes are computed as the simulator computes them
  (``_routing/simkeys.BlockKeys``), so a lookup there is what the engine holds, whatever the order it evicts in;
* ``gauges(text)``: the three gauges of an engine's /metrics the routers read (waiting and running requests, KV-cache usage).
"""

from __future__ import absolute_import, division, print_function

import http.client
import json
import re
import threading

from . import module_utils

wiring = module_utils("common.wiring")
errors = module_utils("common.errors")
kv_index = module_utils("kv.index")

# What the simulator exports (llm-d-inference-sim@v0.10.2:pkg/llm-d-inference-sim/metrics.go ReqWaitingMetricName,
# ReqRunningMetricName, KVCacheUsageMetricName): the numbers the EPPs read as WaitingQueueSize, RunningRequestsSize and
# KVCacheUsagePercent (GIE v1.4.0 --total-queued-requests-metric etc., pkg/epp/server/options.go).
GAUGES = {"vllm:num_requests_waiting": "waiting", "vllm:num_requests_running": "running", "vllm:kv_cache_usage_perc": "usage"}
_GAUGE_RE = re.compile(r"^(vllm:num_requests_waiting|vllm:num_requests_running|vllm:kv_cache_usage_perc)(?:\{[^}]*\})?\s+(\S+)\s*$", re.M)


def gauges(text):
    """``{"waiting": n, "running": n, "usage": fraction}`` of a /metrics text (missing gauges absent)."""
    out = {}
    for name, value in _GAUGE_RE.findall(text or ""):
        try:
            out[GAUGES[name]] = float(value)
        except ValueError:
            continue
    return out


class Engine:
    """One simulated engine of the fleet (an entry of local_engine_instances)."""

    def __init__(self, name, info):
        self.name = name
        self.url = info["url"].rstrip("/")
        self.address = info.get("address") or self.url.split("//", 1)[1].rsplit(":", 1)[0]
        self.port = int(info.get("port") or self.url.rsplit(":", 1)[1])
        sub = info["kv_subscriber"]
        self.endpoint, self.bind, self.topic = sub["endpoint"], sub["socket_mode"] == "bind", sub["topic"]
        self.pod = wiring.topic_pod(self.topic)
        self.block_size = int(info["block_size"])
        self.capacity = int(info.get("num_gpu_blocks") or 0)
        self.model = info["model"]
        self.spec = {"name": name, "url": self.url, "host": self.address, "port": self.port}
        self.source = None


class Truth:
    """Per engine, the set of the engine's own block hashes its events say it holds."""

    def __init__(self):
        self.held = {}

    def apply(self, name, event):
        held = self.held.setdefault(name, set())
        if event.type == "BlockStored":
            held.update(kv_index.normalize_hash(h) for h in event.block_hashes)
        elif event.type == "BlockRemoved":
            held.difference_update(kv_index.normalize_hash(h) for h in event.block_hashes)
        elif event.type == "AllBlocksCleared":
            held.clear()

    def leading(self, name, keys):
        return kv_index.leading(self.held.get(name) or (), keys)

    def anywhere(self, name, keys):
        """The blocks of ``keys`` the engine holds wherever they are: what the simulator counts as cached
        (llm-d-inference-sim@v0.10.2:pkg/kv-cache/block_cache.go startRequest)."""
        held = self.held.get(name) or ()
        return sum(1 for key in keys if key in held)


class Client:
    """Keep-alive HTTP per thread and engine."""

    def __init__(self, timeout):
        self.timeout = timeout
        self.local = threading.local()

    def _conn(self, engine):
        conns = getattr(self.local, "conns", None)
        if conns is None:
            conns = self.local.conns = {}
        conn = conns.get(engine.name)
        if conn is None:
            conn = conns[engine.name] = http.client.HTTPConnection(engine.address, engine.port, timeout=self.timeout)
        return conn

    def stream(self, engine, body, clock):
        """POST a streamed completion: ``(status, first, usage, error)``: ``first`` when its first chunk arrived (``clock()``),
        ``usage`` the last chunk's usage (``stream_options.include_usage``), ``error`` the error's message of a refused one.
        A connection that broke before an answer is opened again once."""
        for attempt in (1, 2):
            conn = self._conn(engine)
            try:
                conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                if resp.status != 200:
                    data = resp.read()
                    try:
                        message = ((json.loads(data or b"{}").get("error") or {}).get("message") or "")
                    except ValueError:
                        message = data[:120].decode("utf-8", "replace")
                    return resp.status, None, None, message
                first = usage = None
                while True:
                    line = resp.readline()
                    if not line:
                        break
                    if not line.startswith(b"data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        break
                    if first is None:
                        first = clock()
                    chunk = json.loads(payload)
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                resp.read()
                return 200, first, usage, None
            except (OSError, http.client.HTTPException):
                conn.close()
                self.local.conns.pop(engine.name, None)
                if attempt == 2:
                    raise
        return None, None, None, None

    def request(self, engine, method, path, body=None):
        """``(status, bytes)``; a connection that broke is opened again once."""
        for attempt in (1, 2):
            conn = self._conn(engine)
            try:
                conn.request(method, path, body=None if body is None else json.dumps(body),
                             headers={"Content-Type": "application/json"} if body is not None else {})
                resp = conn.getresponse()
                return resp.status, resp.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self.local.conns.pop(engine.name, None)
                if attempt == 2:
                    raise
        return None, b""


def load_engines(path):
    """The simulated engines of an engines file (``{"engines": local_engine_instances}``), in the order of their names."""
    with open(path, encoding="utf-8") as handle:
        listed = json.load(handle)["engines"]
    engines = [Engine(name, info) for name, info in sorted(listed.items(), key=lambda kv: (len(kv[0]), kv[0]))
               if info.get("kind") == "simulated"]
    if not engines:
        raise errors.CheckError("%s lists no simulated engine; start the fleet with roles/simulated_engine "
                                "(playbooks/simulated_engines.yml, or benchmarks/fleet/study.yml)." % path)
    return engines
