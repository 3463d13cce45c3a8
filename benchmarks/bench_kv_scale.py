#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The KV checks at scale: kv_events_check and kv_index_check's index over 32 or more publishers at once, and the largest
fleet one checker on one core keeps up with.

Two parts, each run by ``make bench-kv-scale`` (either alone with ``--part``):

* ``fleet``: a fleet of simulated engines (llm-d-inference-sim, roles/simulated_engine: 32 by default, small caches so
  that every engine evicts) under open-loop traffic for ``--seconds``: requests over prompt families at ``--rate``, a burst
  of ``--burst-size`` concurrent requests every ``--burst-every`` seconds, ``--restart-count`` engines restarted part way
  (through the service record each engine's role published: ``service/supervisor.restart``), the failures the fleet injects
  (``simulated_engine_failure_injection_rate``). Each engine connects to its own endpoint; a relay process binds them
  and republishes each stream (libzmq's proxy), so that two checker processes read every stream at once:
  ``kv_events_check`` (``kv/events_check.KVEventsCheck``, one per engine, each in a thread, its own sequence tracking)
  and the index (``kv/consumer.KVConsumer`` feeding ``kv/index.KVBlockIndex``, kv_index_check's index, and the set of
  each engine's own block hashes, its true cache). Then, traffic stopped and the streams quiet, the index process sends
  probe requests one at a time and holds each engine's reported ``cached_tokens`` against its prediction.
  Printed: publishers, batches and events per second, batches lost (unrepaired sequence gaps; a simulator numbers its
  batches from 1, llm-d-inference-sim@v0.10.2:pkg/common/publisher.go, so the gap of batch 0 a restart shows is counted
  apart), restarts noticed, predictions exact, each checker's CPU per event and RSS.
* ``capacity``: synthetic publishers (pre-encoded vLLM batches, each a BlockStored of two 16-token blocks, every other one
  with a BlockRemoved, at ``--publisher-rate`` batches/s each) against the index checker pinned to one CPU, stepping
  the publisher count (``--publishers``) up: per step the events/s applied, the checker's CPU share, batches lost; the
  largest count it keeps up with (no batch lost, CPU under 90% of the core).

Without an engines file the fleet part is skipped with one sentence; the capacity part needs nothing but this machine.
``make bench-kv-scale`` runs ``benchmarks/bench_kv_scale.yml``: the fleet started (roles/simulated_engine), this script, the
fleet stopped in ``always``.

  .venv/bin/python benchmarks/bench_kv_scale.py [--part fleet,capacity] [--engines-file out/bench-kv-scale/engines.json]
      [--seconds 60] [--rate 40] [--burst-every 15] [--burst-size 64] [--restart-count 2]
      [--publishers 32,64,128,256] [--publisher-rate 50] [--step-seconds 10] [--json] [--require]
"""

from __future__ import absolute_import, division, print_function

import argparse
import concurrent.futures
import json
import os
import random
import resource
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import _lab
from _routing import simkeys
from fleet import engines as fleet
from fleet.workload import words
from ansible_collections.inference_cache.substrate.plugins.module_utils.common import errors
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import consumer as consumer_mod
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import events as events_mod
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import events_check
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import index as kv_index
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import sockets as sockets_mod
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import stream as stream_mod

zmq = sockets_mod.zmq
HERE = os.path.abspath(__file__)


def rss_kib():
    with open("/proc/self/status", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def emit(obj):
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


# ---- the relay (a process of its own): each engine's endpoint bound, republished on an ipc endpoint ----

def relay_main(spec):
    ctx = zmq.Context()
    for pair in spec:
        xsub, xpub = ctx.socket(zmq.XSUB), ctx.socket(zmq.XPUB)
        for sock in (xsub, xpub):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVHWM, 100000)
            sock.setsockopt(zmq.SNDHWM, 100000)
        xsub.bind(pair[0])
        xpub.bind(pair[1])
        threading.Thread(target=zmq.proxy, args=(xsub, xpub), daemon=True).start()
    emit({"ready": len(spec)})
    sys.stdin.read()   # until the parent closes it
    return 0


# ---- checker A: one kv_events_check per engine ----

def events_main(spec, seconds):
    stop = threading.Event()
    checks = []
    for engine in spec:
        params = {"endpoint": engine["endpoint"], "socket_mode": "connect", "topic": engine["topic"], "timeout": seconds + 120,
                  "expect": {"BlockStored": 1}}
        checks.append((engine["name"], events_check.KVEventsCheck(params, enough=stop.is_set)))
    results = {}

    def run(name, check):
        try:
            results[name] = {"facts": check.run(), "failure": None}
        except errors.CheckError as exc:
            results[name] = {"facts": exc.facts, "failure": exc.msg}
    threads = [threading.Thread(target=run, args=pair, daemon=True) for pair in checks]
    for thread in threads:
        thread.start()
    emit({"ready": len(threads)})
    cpu0, t0 = cpu_seconds(), time.monotonic()
    sys.stdin.readline()   # the traffic ended
    stop.set()
    for thread in threads:
        thread.join(60)
    cpu, wall = cpu_seconds() - cpu0, time.monotonic() - t0
    out = {"cpu_s": round(cpu, 2), "wall_s": round(wall, 1), "rss_kib": rss_kib(), "engines": {}}
    for name, result in sorted(results.items()):
        facts = result["facts"] or {}
        gaps = facts.get("gaps") or {}
        out["engines"][name] = {"batches": facts.get("batches"), "events": sum((facts.get("counts") or {}).values()),
                                "gaps": gaps.get("details") or [], "unrepaired": gaps.get("unrepaired"),
                                "restarts": len(facts.get("restarts") or []), "malformed": (facts.get("malformed") or {}).get("count"),
                                "failure": result["failure"]}
    emit(out)
    return 0


# ---- checker B: kv_index_check's index (request keys) and each engine's own hashes, then the probes ----

class IndexWatcher:
    def __init__(self, spec, block_size, model, seed):
        self.spec = spec
        self.index = kv_index.KVBlockIndex(block_size, model, seed="")
        self.truth = fleet.Truth()
        self.keys = simkeys.BlockKeys(block_size, model, seed)
        self.block_size = block_size
        self.tracker = stream_mod.SequenceTracker()
        self.batches = self.events = 0
        # libzmq's context holds 1023 sockets by default; each stream takes three (SUB, its monitor's pair)
        self.ctx = zmq.Context()
        self.ctx.set(zmq.MAX_SOCKETS, 4 * len(spec) + 64)
        self.consumer = consumer_mod.KVConsumer(events_mod.KVDecoder("vllm", include_token_ids=True), self.on_batch,
                                                tracker=self.tracker, ctx=self.ctx)
        self.names = {}
        for engine in spec:
            source = consumer_mod.Source(engine["endpoint"], False, engine["topic"], name=engine["name"])
            self.consumer.open(source)
        self.last = time.monotonic()

    def on_batch(self, batch, _payload, _live, source):
        self.batches += 1
        self.last = time.monotonic()
        for event in batch.events:
            self.events += 1
            self.truth.apply(source.name, event)
            try:
                self.index.apply(source.name, event)
            except ValueError:
                pass
        if self.tracker.restarts and self.tracker.restarts[-1].get("applied") is None:
            restart = self.tracker.restarts[-1]
            restart["applied"] = True
            name = restart["topic"]
            for engine in self.spec:
                if engine["topic"] == name:
                    self.index.cleared(engine["name"])   # what kv_index_check does when a stream starts again

    def pump(self, seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.consumer.poll(0.05)
            self.consumer.drain_all()

    def quiet(self, seconds, limit=60.0):
        end = time.monotonic() + limit
        while time.monotonic() < end and time.monotonic() - self.last < seconds:
            self.pump(0.1)

    def probe(self, prompts, client):
        """One request at a time per probe; the engine's cached tokens against both predictions."""
        out = {"probes": 0, "truth_exact": 0, "index_exact": 0, "failed": 0, "misses": []}
        for name, prompt in prompts:
            engine = self.names[name]
            tokens = simkeys.tokenize(prompt)
            keys = self.keys.keys(tokens)
            self.quiet(0.5)
            truth = self.truth.anywhere(name, keys) * self.block_size
            leading = self.index.lookup(name, self.index.prompt_keys(tokens)) * self.block_size
            body = {"model": engine.model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
            status, data = client.request(engine, "POST", "/v1/completions", body)
            if status != 200:
                out["failed"] += 1
                continue
            cached = int(((json.loads(data).get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
            out["probes"] += 1
            out["truth_exact"] += cached == truth
            out["index_exact"] += cached == leading
            if cached != truth and len(out["misses"]) < 5:
                out["misses"].append({"engine": name, "reported": cached, "truth": truth, "index": leading})
        return out


def index_main(spec, block_size, model, seed):
    watcher = IndexWatcher(spec, block_size, model, seed)
    engines = [fleet.Engine(e["name"], e["info"]) for e in spec]
    watcher.names = dict((e.name, e) for e in engines)
    emit({"ready": len(spec)})
    cpu0, t0, rss0 = cpu_seconds(), time.monotonic(), rss_kib()
    line = [None]
    reader = threading.Thread(target=lambda: line.__setitem__(0, sys.stdin.readline()), daemon=True)
    reader.start()
    rss_max = rss0
    while reader.is_alive():
        watcher.pump(0.5)
        rss_max = max(rss_max, rss_kib())
    watcher.quiet(2.0)
    cpu, wall = cpu_seconds() - cpu0, time.monotonic() - t0
    facts = watcher.tracker.facts()
    out = {"cpu_s": round(cpu, 2), "wall_s": round(wall, 1), "rss_kib": rss_kib(), "rss_start_kib": rss0, "rss_max_kib": rss_max,
           "batches": watcher.batches, "events": watcher.events, "gaps": facts["gaps"]["details"], "restarts": facts["restarts"],
           "index_keys": watcher.index.size(), "truth_blocks": sum(len(h) for h in watcher.truth.held.values())}
    prompts = json.loads(line[0] or "[]")
    out.update(watcher.probe(prompts, fleet.Client(60.0)))
    emit(out)
    watcher.consumer.close()
    watcher.ctx.term()
    return 0


# ---- the fleet part: relay, two checkers, traffic ----

class Child:
    def __init__(self, args):
        self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, HERE] + args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        ready = self.proc.stdout.readline()
        if not ready or "ready" not in json.loads(ready):
            self.close()
            raise errors.CheckError("A helper process of the benchmark did not start (%s)." % " ".join(args[:1]))

    def tell(self, text):
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def result(self, timeout):
        """The helper's result line, waited for ``timeout`` seconds at most (then the helper is stopped: None)."""
        ready, _w, _x = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        self.close(1 if not line else timeout)
        return json.loads(line) if line else None

    def close(self, timeout=10):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class Traffic:
    """Prompt families over the engines: steady requests at ``rate``, bursts, restarts."""

    def __init__(self, engines, args, services=None):
        self.engines = engines
        self.args = args
        self.services = services or {}   # engine name -> the spec of _lab.load_engines, with its service record
        self.rng = random.Random(args.seed)
        self.client = fleet.Client(60.0)
        self.families = ["family %d %s" % (i, words(self.rng, self.rng.randint(40, 120))) for i in range(args.families)]
        self.sent = self.failed = self.bursts = 0
        self.restarted = []
        self.errors = {}
        self.lock = threading.Lock()

    def prompt(self):
        return self.rng.choice(self.families) + words(self.rng, self.rng.randint(1, 60)).rstrip()

    def send(self, engine, prompt):
        try:
            body = {"model": engine.model, "prompt": prompt, "max_tokens": self.rng.randint(1, 4), "temperature": 0}
            status, _data = self.client.request(engine, "POST", "/v1/completions", body)
        except (OSError, ValueError) as exc:
            status = type(exc).__name__
        with self.lock:
            self.sent += 1
            if status != 200:
                self.failed += 1
                self.errors[str(status)] = self.errors.get(str(status), 0) + 1

    def run(self, seconds, pool, restart_at):
        start = time.monotonic()
        next_burst = start + self.args.burst_every
        restarts = sorted(restart_at)
        while time.monotonic() - start < seconds:
            now = time.monotonic()
            if restarts and now - start >= restarts[0][0]:
                _at, engine = restarts.pop(0)
                pool.submit(self.restart, engine)
            if now >= next_burst:
                self.bursts += 1
                for _i in range(self.args.burst_size):
                    pool.submit(self.send, self.rng.choice(self.engines), self.prompt())
                next_burst += self.args.burst_every
            pool.submit(self.send, self.rng.choice(self.engines), self.prompt())
            time.sleep(self.rng.expovariate(self.args.rate))

    def restart(self, engine):
        """Stop and start the engine through the service record its role published (no playbook)."""
        try:
            _lab.restart(self.services[engine.name], wait=300.0)
            rc = 0
        except (errors.CheckError, KeyError) as exc:
            rc = getattr(exc, "msg", None) or "no service record for %s" % exc
        self.restarted.append({"engine": engine.name, "rc": rc})

    def probes(self):
        """Two probes per engine: a family prompt it was likely sent, and a fresh one (a miss)."""
        out = []
        for engine in self.engines:
            out.append((engine.name, self.prompt()))
            out.append((engine.name, "fresh %s" % words(self.rng, 40).rstrip()))
        return out


def fleet_part(args):
    engines = fleet.load_engines(args.engines_file)
    folder = tempfile.mkdtemp(prefix="bench-kv-scale-")
    children = []
    try:
        spec = []
        for engine in engines:
            spec.append({"name": engine.name, "endpoint": "ipc://%s/%s.kv" % (folder, engine.name), "topic": engine.topic,
                         "bind_endpoint": engine.endpoint, "info": {"url": engine.url, "address": engine.address, "port": engine.port,
                                                                    "model": engine.model, "block_size": engine.block_size,
                                                                    "num_gpu_blocks": engine.capacity,
                                                                    "kv_subscriber": {"endpoint": engine.endpoint, "socket_mode": "bind",
                                                                                      "topic": engine.topic}}})
        children.append(Child(["--relay", json.dumps([[s["bind_endpoint"], s["endpoint"]] for s in spec])]))
        events = Child(["--watch-events", json.dumps([dict(s, info=None) for s in spec]), "--seconds", str(args.seconds)])
        children.append(events)
        index = Child(["--watch-index", json.dumps(spec), "--block-size", str(engines[0].block_size), "--model", engines[0].model,
                       "--hash-seed", args.hash_seed])
        children.append(index)
        time.sleep(2.0)   # the engines' connections come up (each dials its endpoint again every second)
        traffic = Traffic(engines, args, dict((s["name"], s) for s in _lab.load_engines(args.engines_file)))
        picks = random.Random(args.seed + 1).sample(engines, min(args.restart_count, len(engines)))
        restart_at = [(args.seconds * (i + 1) / (len(picks) + 1), engine) for i, engine in enumerate(picks)]
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(256) as pool:
            traffic.run(args.seconds, pool, restart_at)
        wall = time.monotonic() - started
        events.tell("stop")
        index.tell(json.dumps(traffic.probes()))
        return {"engines": len(engines), "seconds": round(wall, 1), "requests": traffic.sent, "failed": traffic.failed,
                "errors": traffic.errors, "bursts": traffic.bursts, "restarted": traffic.restarted,
                "events_check": events.result(300), "index": index.result(900)}
    finally:
        for child in reversed(children):
            child.close()
        shutil.rmtree(folder, ignore_errors=True)


def fleet_figures(result):
    """The printed lines of the fleet part; and whether it passed."""
    ev, ix = result["events_check"] or {}, result["index"] or {}
    restarted = set(r["engine"] for r in result["restarted"] if r["rc"] == 0)
    lost = numbering = 0
    for name, facts in (ev.get("engines") or {}).items():
        for gap in facts["gaps"]:
            if gap.get("repaired"):
                continue
            if gap["start"] == 0 and gap["end"] == 0 and name in restarted:
                numbering += 1   # the simulator numbers from 1: batch 0 of a new run never existed
            else:
                lost += gap["missing"]
    ev_batches = sum(f["batches"] or 0 for f in (ev.get("engines") or {}).values())
    ev_events = sum(f["events"] or 0 for f in (ev.get("engines") or {}).values())
    noticed = sum(1 for name, f in (ev.get("engines") or {}).items() if name in restarted and f["restarts"] >= 1)
    index_lost = sum(g["missing"] for g in ix.get("gaps") or [] if not (g["start"] == 0 and g["end"] == 0))
    seconds = result["seconds"] or 1
    lines = [
        "Fleet: %d simulated engines, %.0f s of traffic: %d requests (%d failed: %s), %d bursts, restarted %s" % (
            result["engines"], seconds, result["requests"], result["failed"], result["errors"] or "none", result["bursts"],
            ", ".join(sorted(restarted)) or "none"),
        "kv_events_check x %d (one process): %d batches, %d events (%.0f events/s), batches lost %d (plus %d gaps of batch 0 "
        "after a restart: the simulator numbers from 1), restarts noticed %d/%d, failed checks %d; CPU %.2f s = %.1f us per "
        "event, RSS %.0f MiB" % (
            len(ev.get("engines") or {}), ev_batches, ev_events, ev_events / seconds, lost, numbering, noticed, len(restarted),
            sum(1 for f in (ev.get("engines") or {}).values() if f["failure"]), ev.get("cpu_s", 0),
            1e6 * ev.get("cpu_s", 0) / max(ev_events, 1), ev.get("rss_kib", 0) / 1024.0),
        "index (kv_index_check's KVBlockIndex + each engine's own hashes, one process): %d batches, %d events, batches lost %d, "
        "restarts seen %d; CPU %.2f s = %.1f us per event, RSS %.0f MiB (start %.0f, max %.0f); probes %d: truth exact %d, "
        "request-key index exact %d, failed %d%s" % (
            ix.get("batches", 0), ix.get("events", 0), index_lost, len(ix.get("restarts") or []), ix.get("cpu_s", 0),
            1e6 * ix.get("cpu_s", 0) / max(ix.get("events", 0), 1), ix.get("rss_kib", 0) / 1024.0, ix.get("rss_start_kib", 0) / 1024.0,
            ix.get("rss_max_kib", 0) / 1024.0, ix.get("probes", 0), ix.get("truth_exact", 0), ix.get("index_exact", 0),
            ix.get("failed", 0), ("; first misses: %s" % ix["misses"]) if ix.get("misses") else ""),
    ]
    failures = [(name, f["failure"]) for name, f in sorted((ev.get("engines") or {}).items()) if f["failure"]]
    other = [(name, why) for name, why in failures if not (name in restarted and "seq 0-0" in why)]
    if failures:
        tail = "" if other else " (each the simulator's numbering after a restart)"
        lines.append("kv_events_check failed on %s: %s%s" % (", ".join(n for n, _w in failures), failures[0][1], tail))
    ok = lost == 0 and index_lost == 0 and noticed == len(restarted) and ix.get("truth_exact") == ix.get("probes") and not other
    return lines, ok


# ---- the capacity part: synthetic publishers against the index checker on one core ----

def publisher_main(count, rate, seconds, folder):
    raise_file_limit()
    synth = _synthetic()
    ctx = zmq.Context()
    pubs = []
    for i in range(count):
        # a topic of its own per publisher (the checker tells streams apart by topic): 127.0.2.1 on, 250 to an octet
        topic = "kv@127.0.%d.%d:9100@tiny" % (2 + i // 250, 1 + i % 250)
        pub = synth.SyntheticPublisher("ipc://%s/pub-%d.kv" % (folder, i), bind=True, topic=topic,
                                       wire_format="vllm-array", ctx=ctx)
        pubs.append((pub, [pub.next_payload() for _j in range(64)]))
    emit({"ready": count})
    sys.stdin.readline()
    # Each checker's subscription has arrived: nothing is sent to a pipe not yet joined. All publishers polled together
    # (wait_subscriber, one after the other, spends 50 ms on each: 256 publishers outlasted the checker's window).
    waiting, deadline = [pub for pub, _payloads in pubs], time.monotonic() + 30.0
    while waiting and time.monotonic() < deadline:
        waiting = [pub for pub in waiting if not pub.subscriptions()]
        if waiting:
            time.sleep(0.01)
    interval = 1.0 / float(rate)
    start = time.monotonic()
    tick = 0
    sent = 0
    while time.monotonic() - start < seconds:
        for pub, payloads in pubs:
            pub.publish(payload=payloads[tick % len(payloads)])
            sent += 1
        tick += 1
        delay = start + tick * interval - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    emit({"sent": sent, "ticks": tick, "seconds": round(time.monotonic() - start, 2)})
    time.sleep(1.0)
    for pub, _payloads in pubs:
        pub.close()
    return 0


def _synthetic():
    from ansible_collections.inference_cache.substrate.tests.harness import kv_synthetic  # pylint: disable=import-outside-toplevel
    return kv_synthetic


def raise_file_limit():
    """Each stream costs the checker about four descriptors (its SUB socket, the socket's monitor and the monitor's pair, the
    connection): the usual soft limit of 1024 ends near 250 streams, so the helpers raise it to the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return soft, hard


def capacity_main(count, folder, seconds, cpu):
    raise_file_limit()
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})
    spec = [{"name": "pub-%d" % i, "endpoint": "ipc://%s/pub-%d.kv" % (folder, i), "topic": ""} for i in range(count)]
    watcher = IndexWatcher(spec, 16, "tiny", "0")
    emit({"ready": count})
    sys.stdin.readline()
    cpu0, t0 = cpu_seconds(), time.monotonic()
    watcher.last = time.monotonic()
    while time.monotonic() - t0 < seconds + 0.5:
        watcher.pump(0.2)
    watcher.quiet(1.0, limit=30.0)
    used, wall = cpu_seconds() - cpu0, time.monotonic() - t0
    facts = watcher.tracker.facts()
    emit({"batches": watcher.batches, "events": watcher.events, "cpu_s": round(used, 2), "wall_s": round(wall, 2),
          "lost": sum(g["missing"] for g in facts["gaps"]["details"]), "gaps": facts["gaps"]["found"], "rss_kib": rss_kib()})
    return 0


def capacity_part(args):
    steps = []
    for count in args.publishers:
        folder = tempfile.mkdtemp(prefix="bench-kv-scale-")
        try:
            pubs = Child(["--publish", str(count), "--publisher-rate", str(args.publisher_rate), "--step-seconds",
                          str(args.step_seconds), "--folder", folder])
            checker = Child(["--check-capacity", str(count), "--folder", folder, "--step-seconds", str(args.step_seconds)]
                            + (["--cpu", str(args.cpu)] if args.cpu is not None else []))
            time.sleep(1.0)
            checker.tell("go")
            pubs.tell("go")
            sent = pubs.result(args.step_seconds + 60)
            got = checker.result(args.step_seconds + 90)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        if not sent or not got:
            sys.stderr.write("bench_kv_scale: %d publishers: the %s gave no result in time; the steps before it stand\n" % (
                count, "publishers" if not sent else "checker"))
            break
        share = got["cpu_s"] / max(got["wall_s"], 0.001)
        steps.append({"publishers": count, "sent": sent["sent"], "batches": got["batches"], "events": got["events"],
                      "events_per_s": round(got["events"] / max(got["wall_s"], 0.001)), "cpu_share": round(share, 3),
                      "us_per_event": round(1e6 * got["cpu_s"] / max(got["events"], 1), 1), "lost": sent["sent"] - got["batches"],
                      "rss_mib": round(got["rss_kib"] / 1024.0, 1)})
        sys.stderr.write("bench_kv_scale: %d publishers: %s\n" % (count, steps[-1]))
        if steps[-1]["lost"] > 0 and count != args.publishers[0]:
            break
    kept = [s for s in steps if s["lost"] == 0 and s["cpu_share"] < 0.9]
    return {"publisher_rate": args.publisher_rate, "steps": steps, "largest": kept[-1]["publishers"] if kept else None}


def capacity_lines(result):
    lines = ["Capacity: synthetic publishers at %s batches/s each (a BlockStored of two 16-token blocks in every batch, a "
             "BlockRemoved too in every other one) against the index checker on one CPU:" % result["publisher_rate"]]
    for s in result["steps"]:
        lines.append("  %4d publishers: sent %d, applied %d batches (lost %d), %d events/s, CPU %.0f%% of a core, %.1f us per "
                     "event, RSS %.0f MiB" % (s["publishers"], s["sent"], s["batches"], s["lost"], s["events_per_s"],
                                              100 * s["cpu_share"], s["us_per_event"], s["rss_mib"]))
    lines.append("Largest fleet the checker keeps up with on one core (no batch lost, CPU under 90%%): %s publishers at %s batches/s "
                 "each" % (result["largest"] or "none of these", result["publisher_rate"]))
    return lines


def parser_of():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", default="fleet", help="fleet, capacity or both (comma-separated)")
    parser.add_argument("--engines-file", help="what playbooks/simulated_engines.yml wrote (the fleet part)")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=40.0, help="steady requests/s over the fleet")
    parser.add_argument("--families", type=int, default=24)
    parser.add_argument("--burst-every", type=float, default=15.0)
    parser.add_argument("--burst-size", type=int, default=64)
    parser.add_argument("--restart-count", type=int, default=2, help="engines restarted part way, through their service records")
    parser.add_argument("--hash-seed", default="0")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--publishers", type=lambda t: [int(x) for x in t.split(",")], default=[32, 64, 128, 256, 512])
    parser.add_argument("--publisher-rate", type=float, default=50.0)
    parser.add_argument("--step-seconds", type=float, default=10.0)
    parser.add_argument("--cpu", type=int, default=None, help="pin the capacity checker to this CPU")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--require", action="store_true")
    # the helper processes (started by this script)
    parser.add_argument("--relay", help=argparse.SUPPRESS)
    parser.add_argument("--watch-events", help=argparse.SUPPRESS)
    parser.add_argument("--watch-index", help=argparse.SUPPRESS)
    parser.add_argument("--block-size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--publish", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--check-capacity", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    return parser


def helper(args):
    """The helper processes' entry points (None when this is the benchmark itself)."""
    if args.relay:
        return relay_main(json.loads(args.relay))
    if args.watch_events:
        return events_main(json.loads(args.watch_events), args.seconds)
    if args.watch_index:
        return index_main(json.loads(args.watch_index), args.block_size, args.model, args.hash_seed)
    if args.publish:
        return publisher_main(args.publish, args.publisher_rate, args.step_seconds, args.folder)
    if args.check_capacity:
        return capacity_main(args.check_capacity, args.folder, args.step_seconds, args.cpu)
    return None


def main():
    args = parser_of().parse_args()
    rc = helper(args)
    if rc is not None:
        return rc
    parts = [p.strip() for p in args.part.split(",") if p.strip()]
    results, rc = {}, 0
    try:
        if "fleet" in parts:
            if not args.engines_file or not os.path.exists(args.engines_file):
                print("bench_kv_scale: fleet part %s: no fleet (--engines-file); `make bench-kv-scale` starts one" % (
                    "failed" if args.require else "skipped"))
                rc = 1 if args.require else 0
            else:
                results["fleet"] = fleet_part(args)
        if "capacity" in parts:
            results["capacity"] = capacity_part(args)
    except (errors.CheckError, OSError) as exc:
        print("bench_kv_scale: %s" % (getattr(exc, "msg", None) or exc))
        return 1
    if args.json:
        print(json.dumps(results, sort_keys=True))
    if "fleet" in results:
        lines, ok = fleet_figures(results["fleet"])
        if not args.json:
            print("\n".join(lines))
        rc = rc or (0 if ok else 1)
    if "capacity" in results and not args.json:
        print("\n".join(capacity_lines(results["capacity"])))
    return rc


if __name__ == "__main__":
    sys.exit(main())
