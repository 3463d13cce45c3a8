# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The routing study at scale: open-loop load over a fleet of simulated engines, one policy per configuration.

``FleetStudy(engines, ...)`` subscribes to every engine's KV events (it binds each engine's endpoint: the simulator
connects) and keeps, from them, two views of each engine's cache:

* the truth: the set of the engine's own block hashes (BlockStored adds, BlockRemoved drops, AllBlocksCleared empties).
  A prompt's block keys are computed here exactly as the simulator computes them (``simkeys``), so a lookup in that set is
  what the engine holds, whatever the order it evicts in;
* the stand-in router's index (``kv/index.KVBlockIndex``: request keys chained from each BlockStored's parent, what
  ``kv_index_check`` proves exact on vLLM and what llm-d's index does).

``run(config)`` resets every engine's cache (the simulator's /sleep and /wake_up development endpoints: AllBlocksCleared),
then sends the configuration's arrivals at their times (Poisson, a ramp of rates), each routed at its arrival by the
configuration's policy and sent to ONE engine (max_tokens 1, so the request's latency is its time to first token), and
returns a row: per ramp step and overall, the hit rate (cached / prompt tokens the engines reported, and their
vllm:prefix_cache_hits / queries counters), TTFT p50 and p90, completed requests per second, failures.

Policies (``POLICIES``; a real EPP's ``epp:NAME`` through ``lanes.Lanes``):

* referee: the engine whose true cache holds the most leading blocks of the prompt (ties: fewest requests in flight,
  then name), and a prompt no engine holds any of to the engine holding the fewest blocks (the most free cache): a router
  that knows every cache exactly and always takes the longest hit, the limit the others are held against;
* precise: the stand-in's KV-event index, scored as the GIE EPP scores (prefix 3 x the share of the prompt's blocks
  held, queue 2 x (most - this engine's) / (most - fewest) requests in flight, ``WEIGHTS``);
* precise-kvcache: the same score, the prefix part from llm-d-kv-cache v0.9.0's own index and scorer
  (tools/kvcache_probe, fed with every engine's events through a relay);
* approximate: the stand-in's model of the approx-prefix-cache-producer (routing history only, an LRU of the engines'
  capacity), same score;
* load-only: fewest requests in flight (then fewest sent, then name);
* random: a seeded random engine.
"""

from __future__ import absolute_import, division, print_function

import concurrent.futures
import http.client
import json
import random
import subprocess
import threading
import time

from . import module_utils, simkeys
from .fleet_workloads import build as build_arrivals
from .runner import percentile

consumer_mod = module_utils("kv.consumer")
events_mod = module_utils("kv.events")
kv_index = module_utils("kv.index")
approx_mod = module_utils("kv.index_approx")
wiring = module_utils("common.wiring")
errors = module_utils("common.errors")

POLICIES = ("referee", "precise", "precise-kvcache", "approximate", "load-only", "random")
WEIGHTS = {"prefix": 3.0, "queue": 2.0}   # the router role's GIE weights for prefix and queue (roles/router defaults)
COUNTER_NAMES = ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries")


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
        held = self.held.get(name) or ()
        count = 0
        for key in keys:
            if key not in held:
                break
            count += 1
        return count

    def anywhere(self, name, keys):
        held = self.held.get(name) or ()
        return sum(1 for key in keys if key in held)


class Probe:
    """llm-d-kv-cache v0.9.0's own index and scorer (tools/kvcache_probe), connected to the study's relay of every event."""

    def __init__(self, binary, endpoint, block_size, seed):
        self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
            [binary, "-endpoint", endpoint, "-mode", "connect", "-block-size", str(block_size), "-hash-seed", seed],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        first = json.loads(self.proc.stdout.readline() or "{}")
        if "ready" not in first:
            self.close()
            raise errors.CheckError("tools/kvcache_probe did not start (it said %r)." % first)
        self.lock = threading.Lock()

    def prefix_blocks(self, tokens, model):
        with self.lock:
            self.proc.stdin.write(json.dumps({"lookup": tokens, "model": model}) + "\n")
            answer = json.loads(self.proc.stdout.readline() or "{}")
        if "error" in answer:
            raise errors.CheckError("tools/kvcache_probe: %s" % answer["error"])
        return answer.get("prefix_blocks") or {}

    def stats(self):
        with self.lock:
            self.proc.stdin.write(json.dumps({"stats": True}) + "\n")
            return json.loads(self.proc.stdout.readline() or "{}")

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def queue_scores(inflight):
    """GIE's queue-scorer normalisation over the requests in flight: (most - this) / (most - fewest), 1 when all equal."""
    most, fewest = max(inflight.values()), min(inflight.values())
    return dict((n, 1.0 if most == fewest else (most - q) / float(most - fewest)) for n, q in inflight.items())


def counters(text):
    out = dict((name, 0.0) for name in COUNTER_NAMES)
    for line in (text or "").splitlines():
        for name in COUNTER_NAMES:
            if line.startswith(name + "_total") or line.startswith(name + "{") or line.startswith(name + " "):
                try:
                    out[name] += float(line.rsplit(None, 1)[1])
                except (IndexError, ValueError):
                    pass
    return out


class Client:
    """Keep-alive HTTP per thread and engine (each request to a confined engine crosses its bridge)."""

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

    def request(self, engine, method, path, body=None):
        for attempt in (1, 2):
            conn = self._conn(engine)
            try:
                conn.request(method, path, body=None if body is None else json.dumps(body),
                             headers={"Content-Type": "application/json"} if body is not None else {})
                resp = conn.getresponse()
                data = resp.read()
                return resp.status, data
            except (OSError, http.client.HTTPException):
                conn.close()
                self.local.conns.pop(engine.name, None)
                if attempt == 2:
                    raise
        return None, b""


class FleetStudy:
    """The fleet, its two views of every cache, and the configurations run over it (see the module's docstring)."""

    def __init__(self, engines, policies_seed=0, lanes=None, probe_binary=None, relay_endpoint=None, hash_seed="0",
                 max_workers=512, request_timeout=120.0, clock=time.monotonic):
        self.engines = list(engines)
        self.by_name = dict((e.name, e) for e in self.engines)
        self.by_pod = dict((e.pod, e) for e in self.engines)
        first = self.engines[0]
        self.model, self.block_size = first.model, first.block_size
        self.keys = simkeys.BlockKeys(self.block_size, self.model, hash_seed)
        self.hash_seed = hash_seed
        self.lanes = lanes
        self.clock = clock
        self.lock = threading.Lock()
        self.truth = Truth()
        self.index = kv_index.KVBlockIndex(self.block_size, self.model, seed="")
        self.batches = dict((e.name, 0) for e in self.engines)
        self.events = dict((e.name, 0) for e in self.engines)
        self.client = Client(request_timeout)
        self.max_workers = max_workers
        self.consumer = consumer_mod.KVConsumer(events_mod.KVDecoder("vllm", include_token_ids=True), self.on_batch)
        self.relay = None
        self.relay_endpoint = relay_endpoint
        self.probe_binary = probe_binary
        self.probe = None
        self.stopping = threading.Event()
        self.thread = None
        self.policies_seed = policies_seed
        self.state = None

    # -- events -------------------------------------------------------------------------------
    def on_batch(self, batch, payload, _live, source):
        with self.lock:
            self.batches[source.name] += 1
            for event in batch.events:
                self.events[source.name] += 1
                self.truth.apply(source.name, event)
                try:
                    self.index.apply(source.name, event)
                except ValueError:
                    pass
        if self.relay is not None:
            self.relay.send_multipart([batch.topic.encode("utf-8"), batch.seq.to_bytes(8, "big"), bytes(payload)])

    def _loop(self):
        while not self.stopping.is_set():
            self.consumer.poll(0.05)
            self.consumer.drain_all()

    def open(self):
        for engine in self.engines:
            engine.source = consumer_mod.Source(engine.endpoint, engine.bind, engine.topic, name=engine.name)
            self.consumer.open(engine.source)
        if self.relay_endpoint:
            zmq = consumer_mod.zmq
            self.relay = self.consumer.context().socket(zmq.PUB)
            self.relay.setsockopt(zmq.LINGER, 0)
            self.relay.setsockopt(zmq.SNDHWM, 100000)
            self.relay.bind(self.relay_endpoint)
            if self.probe_binary:
                self.probe = Probe(self.probe_binary, self.relay_endpoint, self.block_size, self.hash_seed)
        self.thread = threading.Thread(target=self._loop, name="kv-events", daemon=True)
        self.thread.start()
        deadline = self.clock() + 30
        while not all(e.source.connected for e in self.engines):
            if self.clock() > deadline:
                missing = [e.name for e in self.engines if not e.source.connected]
                raise errors.CheckError("The KV events of %s never connected (%s)." % (", ".join(missing), consumer_mod.unconnected(True)))
            time.sleep(0.1)
        return self

    def close(self):
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(5)
        if self.probe is not None:
            self.probe.close()
        if self.relay is not None:
            self.relay.close(0)
        self.consumer.close()

    # -- the fleet ----------------------------------------------------------------------------
    def reset(self, timeout=30.0):
        """Every engine's prefix cache dropped (/sleep, then /wake_up: AllBlocksCleared) and both views empty."""
        for engine in self.engines:
            for path in ("/sleep", "/wake_up"):
                status, data = self.client.request(engine, "POST", path, {} if path == "/sleep" else None)
                if status != 200:
                    raise errors.CheckError("Engine %s answered %s to POST %s (%s); the study resets caches through the "
                                            "simulator's development endpoints: start the fleet with simulated_engine_dev_mode."
                                            % (engine.name, status, path, data[:200]))
        deadline = self.clock() + timeout
        while True:
            with self.lock:
                left = [n for n, held in self.truth.held.items() if held]
            if not left:
                break
            if self.clock() > deadline:
                raise errors.CheckError("Engines %s still hold blocks %d s after their reset (no AllBlocksCleared arrived)." % (
                    ", ".join(sorted(left)), timeout))
            time.sleep(0.1)
        with self.lock:
            for engine in self.engines:
                self.index.cleared(engine.name)

    def read_counters(self):
        out = {}
        for engine in self.engines:
            status, data = self.client.request(engine, "GET", "/metrics")
            out[engine.name] = counters(data.decode("utf-8", "replace")) if status == 200 else None
        return out

    def fleet_blocks(self):
        return sum(e.capacity for e in self.engines)

    def check_model(self, prompt):
        """The simulator's tokens and block keys of ``prompt``, as computed here, are the engine's (/tokenize, one call)."""
        status, data = self.client.request(self.engines[0], "POST", "/tokenize", {"model": self.model, "prompt": prompt})
        theirs = json.loads(data or b"{}").get("tokens") if status == 200 else None
        if theirs != simkeys.tokenize(prompt):
            raise errors.CheckError("The simulator tokenizes differently from the study's copy of its dummy tokenizer (/tokenize "
                                    "answered %s); start the engines with --force-dummy-tokenizer (roles/simulated_engine does)." % status)

    # -- routing ------------------------------------------------------------------------------
    def route(self, policy, arrival, tokens, keys):
        """ONE engine's name for ``arrival``; ``keys``: its simulator block keys (the truth's)."""
        state = self.state
        with self.lock:
            inflight = dict(state["inflight"])
        names = sorted(inflight)
        if policy == "random":
            return state["rng"].choice(names)
        if policy == "load-only":
            return min(names, key=lambda n: (inflight[n], state["sent"][n], n))
        if policy == "referee":
            with self.lock:
                held = dict((n, self.truth.leading(n, keys)) for n in names)
                size = dict((n, len(self.truth.held.get(n) or ())) for n in names)
            if max(held.values()) == 0:   # a prefix no engine holds goes where the most cache is free
                return min(names, key=lambda n: (size[n], inflight[n], n))
            return min(names, key=lambda n: (-held[n], inflight[n], n))
        if policy.startswith("epp:"):
            body = {"model": self.model, "prompt": arrival.prompt, "max_tokens": 1, "temperature": 0}
            return self.lanes.pick(0, body, [_Named(e) for e in self.engines])
        total = max(len(keys), 1)
        if policy == "precise":
            request_keys = self.index.prompt_keys(tokens)
            with self.lock:
                share = dict((n, self.index.lookup(n, request_keys) / float(max(len(request_keys), 1))) for n in names)
        elif policy == "precise-kvcache":
            blocks = self.probe.prefix_blocks(tokens, self.model)
            share = dict((n, blocks.get(self.by_name[n].pod, 0) / float(total)) for n in names)
        elif policy == "approximate":
            approx = state["approx"]
            hashes = approx_mod.block_hashes(arrival.prompt, approx.block_size, self.model)
            matched = approx.match(hashes)
            share = dict((n, matched.get(n, 0) / float(max(len(hashes), 1))) for n in names)
            state["approx_hashes"] = hashes
        else:
            raise errors.CheckError("Unknown policy %s." % policy)
        queue = queue_scores(inflight)
        return min(names, key=lambda n: (-(WEIGHTS["prefix"] * share[n] + WEIGHTS["queue"] * queue[n]), inflight[n], n))

    # -- one configuration ------------------------------------------------------------------
    def run(self, policy, spec, seed, tag):
        arrivals, groups = build_arrivals(spec, tag, seed, self.block_size, self.fleet_blocks())
        self.check_model(arrivals[0].prompt)
        self.reset()
        names = [e.name for e in self.engines]
        self.state = {"inflight": dict((n, 0) for n in names), "sent": dict((n, 0) for n in names), "rng": random.Random(seed),
                      "approx": approx_mod.ApproxPrefixPredictor(approx_mod.effective_block_size(self.block_size))}
        for engine in self.engines:
            self.state["approx"].set_capacity(engine.name, engine.capacity)
        before = self.read_counters()
        records = []
        context = self.lanes.router(policy[4:]) if policy.startswith("epp:") else _Nothing()
        with context, concurrent.futures.ThreadPoolExecutor(self.max_workers) as pool:
            start = self.clock()
            for arrival in arrivals:
                delay = start + arrival.at - self.clock()
                if delay > 0:
                    time.sleep(delay)
                record = self.dispatch(policy, arrival, start)
                records.append(record)
                if record.get("engine") is not None:
                    pool.submit(self.send, record, arrival)
        after = self.read_counters()
        return self.row(policy, spec, seed, groups, records, before, after, start)

    def dispatch(self, policy, arrival, start):
        tokens = simkeys.tokenize(arrival.prompt)
        # The shared part's keys are cached per configuration (its tag, the first token) and group and user.
        prefix = (("g", tokens[0], arrival.group, arrival.user), arrival.shared_tokens) if arrival.group is not None else None
        keys = self.keys.keys(tokens, prefix)
        record = {"index": arrival.index, "step": arrival.step, "at": round(arrival.at, 4), "kind": arrival.kind,
                  "group": arrival.group, "prompt_tokens": len(tokens), "blocks": len(keys), "engine": None}
        try:
            name = self.route(policy, arrival, tokens, keys)
        except errors.CheckError as exc:
            record["error"] = "route: %s" % exc.msg
            return record
        with self.lock:
            record["truth_blocks"] = self.truth.leading(name, keys)
            record["truth_best"] = max(self.truth.leading(n, keys) for n in self.by_name)
        state = self.state
        with self.lock:
            state["inflight"][name] += 1
        state["sent"][name] += 1
        if policy == "approximate":
            state["approx"].routed(name, state.pop("approx_hashes"))
        record.update(engine=name, sent=round(self.clock() - start, 4))
        return record

    def send(self, record, arrival):
        engine = self.by_name[record["engine"]]
        body = {"model": self.model, "prompt": arrival.prompt, "max_tokens": 1, "temperature": 0}
        began = self.clock()
        try:
            status, data = self.client.request(engine, "POST", "/v1/completions", body)
            answer = json.loads(data or b"{}")
            if status != 200:
                record["error"] = "HTTP %s: %s" % (status, ((answer.get("error") or {}).get("message") or "")[:120])
            else:
                usage = answer.get("usage") or {}
                record["cached"] = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
                record["reported_prompt_tokens"] = usage.get("prompt_tokens")
        except (OSError, ValueError, http.client.HTTPException) as exc:
            record["error"] = "%s: %s" % (type(exc).__name__, exc)
        record["ttft"] = round(self.clock() - began, 4)
        record["finished"] = round(record["sent"] + record["ttft"], 4)
        with self.lock:
            self.state["inflight"][record["engine"]] -= 1

    # -- the row ------------------------------------------------------------------------------
    @staticmethod
    def summarize(records, seconds):
        ok = [r for r in records if r.get("engine") and "error" not in r and "cached" in r]
        ttfts = [r["ttft"] for r in ok]
        prompt = sum(r["prompt_tokens"] for r in ok)
        cached = sum(r["cached"] for r in ok)
        return {"requests": len(records), "failed": len(records) - len(ok),
                "hit_rate": round(cached / float(prompt), 4) if prompt else None,
                "ttft_ms_p50": round(1000 * percentile(ttfts, 50), 1) if ttfts else None,
                "ttft_ms_p90": round(1000 * percentile(ttfts, 90), 1) if ttfts else None,
                "throughput_rps": round(len(ok) / seconds, 2) if seconds else None,
                "held_best": sum(1 for r in ok if r.get("truth_blocks") == r.get("truth_best")),
                "cached_per_request": round(cached / float(len(ok)), 1) if ok else None}

    def row(self, policy, spec, seed, groups, records, before, after, _start):
        hits = queries = 0.0
        for name in before:
            if before[name] and after.get(name):
                hits += after[name]["vllm:prefix_cache_hits"] - before[name]["vllm:prefix_cache_hits"]
                queries += after[name]["vllm:prefix_cache_queries"] - before[name]["vllm:prefix_cache_queries"]
        finished = [r["finished"] for r in records if r.get("finished") is not None]
        makespan = max(finished) if finished else 0.0
        row = {"policy": policy, "workload": spec["name"], "seed": seed, "groups": groups,
               "router": self.lanes.label(policy[4:]) if policy.startswith("epp:") and self.lanes is not None else "stand-in",
               "counter_hit_rate": round(hits / queries, 4) if queries else None,
               "steps": [], "requests_per_engine": dict(self.state["sent"])}
        row.update(self.summarize(records, makespan))
        step_seconds = float(spec["step_seconds"])
        for step, rate in enumerate(spec["ramp"]):
            mine = [r for r in records if r["step"] == step]
            summary = self.summarize(mine, step_seconds)
            summary["qps"] = rate
            row["steps"].append(summary)
        errors_seen = sorted(set(r["error"][:100] for r in records if r.get("error")))
        row["failures"] = errors_seen[:3]
        row["demand"] = round(groups * (int(spec["prefix_tokens"]) + int(spec["users"]) * int(spec["user_tokens"]))
                              / float(self.block_size) / float(self.fleet_blocks()), 3)
        row["records"] = records
        return row


class _Named:
    """What ``lanes.Lanes.pick`` reads of an engine: its name and its spec's URL."""

    def __init__(self, engine):
        self.name = engine.name
        self.spec = engine.spec


class _Nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def load_engines(path):
    """The engines of an engines file (what playbooks/simulated_engines.yml writes: local_engine_instances)."""
    with open(path, encoding="utf-8") as handle:
        listed = json.load(handle)["engines"]
    engines = [Engine(name, info) for name, info in sorted(listed.items(), key=lambda kv: (len(kv[0]), kv[0]))
               if info.get("kind") == "simulated"]
    if not engines:
        raise errors.CheckError("%s lists no simulated engine; start the fleet with playbooks/simulated_engines.yml." % path)
    return engines
