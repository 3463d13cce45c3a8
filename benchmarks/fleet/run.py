# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""One configuration (a policy and a seed) over the fleet, every request recorded.

``FleetRun(engines, latency)`` subscribes to every engine's KV events (it binds each engine's endpoint; the simulator
connects) with the collection's consumer (``kv/consumer.KVConsumer``) and keeps two views of the caches from them: the
KV-block index a precise router keeps (``kv/index.KVBlockIndex``, llm-d's semantics) and each engine's true cache
(``engines.Truth``). It also keeps the books of the fleet: per engine, the requests sent and not yet answered, in the order
sent; the simulator runs the first ``max_num_seqs`` of them and queues the rest in that order
(llm-d-inference-sim@v0.10.2:pkg/llm-d-inference-sim/simulator.go processing, dequeue), so the books give each engine's
waiting requests, running requests and the KV blocks its running requests hold (its ``kv_cache_usage_perc``) at any moment,
and each request's time in the queue (from being sent to being one of the running ones).

``run(policy, spec, seed)``: every engine's cache emptied (the simulator's development endpoints /sleep and /wake_up:
AllBlocksCleared), the configuration's warm-up sent at its Poisson times and drained (not measured), then its ramp, each
request routed at its arrival and sent to ONE engine, streamed (its first chunk is its first token; every request asks for
the same number of output tokens, ignore_eos, and holds its slot and its blocks until the last). A stand-in
policy (``policies.Policy``) reads the books' waiting requests and KV-cache usage, the numbers an EPP scrapes from each
engine's /metrics, exactly and at once (an EPP reads them every 50 ms); a real EPP (``epp:NAME``) is asked over ext_proc
as Envoy asks it (``epp/extproc.ask_pick``). Every 100 ms the books' waiting and running requests per engine are sampled,
and every second the engines' own gauges are read beside them. Returns the records and samples; ``report`` makes the rows.
"""

from __future__ import absolute_import, division, print_function

import concurrent.futures
import http.client
import json
import random
import threading
import time

from . import engines as engines_mod
from . import module_utils, policies, workload
from _routing import simkeys  # pylint: disable=wrong-import-order

consumer_mod = module_utils("kv.consumer")
events_mod = module_utils("kv.events")
kv_index = module_utils("kv.index")
errors = module_utils("common.errors")

COUNTERS = ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries", "vllm:request_queue_time_seconds_sum",
            "vllm:request_queue_time_seconds_count")


def counters(text):
    """The counters of ``COUNTERS`` summed over their label sets (``_total`` suffixes accepted)."""
    out = dict((name, 0.0) for name in COUNTERS)
    for line in (text or "").splitlines():
        if line.startswith("#"):
            continue
        head, _sep, value = line.rpartition(" ")
        name = head.split("{", 1)[0].strip()
        if name.endswith("_total"):
            name = name[:-len("_total")]
        if name in out:
            try:
                out[name] += float(value)
            except ValueError:
                pass
    return out


class Books:
    """Per engine, the requests sent and not yet answered, in the order sent: the first ``max_num_seqs`` run, the rest wait."""

    def __init__(self, names, max_num_seqs, capacity):
        self.outstanding = dict((name, []) for name in names)
        self.max_num_seqs = int(max_num_seqs)
        self.capacity = dict(capacity)

    def add(self, name, record, now):
        queue = self.outstanding[name]
        queue.append(record)
        record["queued"] = len(queue) > self.max_num_seqs
        if not record["queued"]:
            record["started"] = now

    def done(self, name, record, now):
        queue = self.outstanding[name]
        position = queue.index(record)
        queue.pop(position)
        if position < self.max_num_seqs and len(queue) >= self.max_num_seqs:
            promoted = queue[self.max_num_seqs - 1]
            promoted.setdefault("started", now)

    def waiting(self, name):
        return max(0, len(self.outstanding[name]) - self.max_num_seqs)

    def running(self, name):
        return min(len(self.outstanding[name]), self.max_num_seqs)

    def usage(self, name):
        """The blocks the engine's running requests hold, over its blocks (the simulator's kv_cache_usage_perc)."""
        held = set()
        for record in self.outstanding[name][:self.max_num_seqs]:
            held.update(record["keys"])
        return len(held) / float(self.capacity[name] or 1)

    def queued_work(self, name):
        return sum(record["work"] for record in self.outstanding[name][self.max_num_seqs:])

    def total(self):
        return sum(len(q) for q in self.outstanding.values())


class FleetRun:
    """The fleet, its caches' views, its books, and the configurations run over it (see the module's docstring)."""

    def __init__(self, engines, latency, picker=None, workers=384, timeout=120.0, clock=time.monotonic, hash_seed="0",
                 sample_every=0.1, scrape_every=1.0):
        self.engines = list(engines)
        self.names = [e.name for e in self.engines]
        self.by_name = dict((e.name, e) for e in self.engines)
        first = self.engines[0]
        self.model, self.block_size = first.model, first.block_size
        self.latency = latency
        self.picker = picker
        self.workers = workers
        self.clock = clock
        self.lock = threading.Lock()
        self.truth = engines_mod.Truth()
        self.index = kv_index.KVBlockIndex(self.block_size, self.model, seed="", count_copies=False)
        self.keys = simkeys.BlockKeys(self.block_size, self.model, hash_seed)
        self.client = engines_mod.Client(timeout)
        self.consumer = consumer_mod.KVConsumer(events_mod.KVDecoder("vllm", include_token_ids=True), self.on_batch)
        self.events = 0
        self.stopping = threading.Event()
        self.thread = None
        self.sample_every, self.scrape_every = sample_every, scrape_every
        self.books = None

    # -- events -------------------------------------------------------------------------------
    def on_batch(self, batch, _payload, _live, source):
        with self.lock:
            for event in batch.events:
                self.events += 1
                self.truth.apply(source.name, event)
                try:
                    self.index.apply(source.name, event)
                except ValueError:
                    pass

    def _loop(self):
        while not self.stopping.is_set():
            self.consumer.poll(0.05)
            self.consumer.drain_all()

    def open(self, connect_timeout=30.0):
        for engine in self.engines:
            engine.source = consumer_mod.Source(engine.endpoint, engine.bind, engine.topic, name=engine.name)
            self.consumer.open(engine.source)
        self.thread = threading.Thread(target=self._loop, name="kv-events", daemon=True)
        self.thread.start()
        deadline = self.clock() + connect_timeout
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
        self.consumer.close()

    # -- the fleet ----------------------------------------------------------------------------
    def reset(self, timeout=30.0):
        """Every engine's prefix cache dropped (/sleep, then /wake_up: AllBlocksCleared), both views empty."""
        for engine in self.engines:
            for path in ("/sleep", "/wake_up"):
                status, data = self.client.request(engine, "POST", path, {} if path == "/sleep" else None)
                if status != 200:
                    raise errors.CheckError("Engine %s answered %s to POST %s (%s); the study empties the caches through the "
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
            for name in self.names:
                self.index.cleared(name)

    def scrape(self, parse):
        out = {}
        for engine in self.engines:
            try:
                status, data = self.client.request(engine, "GET", "/metrics")
            except (OSError, http.client.HTTPException):
                status, data = None, b""
            out[engine.name] = parse(data.decode("utf-8", "replace")) if status == 200 else None
        return out

    def check_tokenizer(self, prompt):
        """The study's copy of the simulator's dummy tokenizer gives the engine's tokens (/tokenize, one call)."""
        status, data = self.client.request(self.engines[0], "POST", "/tokenize", {"model": self.model, "prompt": prompt})
        theirs = json.loads(data or b"{}").get("tokens") if status == 200 else None
        if theirs != simkeys.tokenize(prompt):
            raise errors.CheckError("The simulator tokenizes differently from the study's copy of its dummy tokenizer (/tokenize "
                                    "answered %s); start the engines with --force-dummy-tokenizer (roles/simulated_engine does)." % status)

    # -- one configuration --------------------------------------------------------------------
    def policy_for(self, name, spec, seed):
        if name.startswith("epp:"):
            if self.picker is None:
                raise errors.CheckError("Policy %s needs a real EPP (--epp NAME=HOST:PORT)." % name)
            return None
        engines = dict((e.name, (e.block_size, e.capacity)) for e in self.engines)
        approx = policies.blog_approx(spec)
        return policies.Policy(name, random.Random(1000003 * seed + 17), engines=engines, model=self.model, index=self.index,
                               latency=self.latency, block_size=self.block_size,
                               approx={"lru_capacity": approx["lru_capacity"], "max_blocks": approx["max_blocks"]})

    def run(self, name, spec, seed, drain_timeout=90.0):
        """``(records, samples, scraped)`` of one configuration (see the module's docstring)."""
        arrivals = workload.build(spec, seed)
        policy = self.policy_for(name, spec, seed)
        self.check_tokenizer(arrivals[0].prompt)
        self.reset()
        capacity = dict((e.name, e.capacity) for e in self.engines)
        self.books = Books(self.names, self.latency.max_num_seqs, capacity)
        shared = {}
        records, samples, gauges = [], [], []
        before = self.scrape(counters)
        sampling = threading.Event()
        sampler = threading.Thread(target=self._sample, args=(samples, gauges, sampling), daemon=True)
        start = self.clock()
        sampler.start()
        futures = []
        with concurrent.futures.ThreadPoolExecutor(self.workers) as pool:
            warm_end = workload.warmup_end(arrivals)
            offset, ramping = 0.0, False
            for arrival in arrivals:
                if arrival.step >= 0 and not ramping:
                    ramping = True
                    offset = self._drain(futures, start, drain_timeout) - warm_end
                delay = start + offset + arrival.at - self.clock()
                if delay > 0:
                    time.sleep(delay)
                record = self.dispatch(name, policy, arrival, shared, start)
                records.append(record)
                if policy is None:
                    futures.append(pool.submit(self.ask_and_send, record, arrival, start))
                elif record.get("engine") is not None:
                    futures.append(pool.submit(self.send, record, arrival))
            self._drain(futures, start, drain_timeout)
        sampling.set()
        sampler.join(5)
        after = self.scrape(counters)
        return records, samples, gauges, {"before": before, "after": after, "ramp_start": round(offset + warm_end, 3)}

    def _drain(self, futures, start, timeout):
        """Wait until every request sent so far is answered (bounded); the seconds since ``start``."""
        deadline = self.clock() + timeout
        while self.clock() < deadline:
            for future in futures:
                if future.done() and future.exception() is not None:
                    exc = future.exception()
                    raise errors.CheckError("A request's thread failed: %s: %s." % (type(exc).__name__, exc))
            futures[:] = [f for f in futures if not f.done()]
            if not futures:
                break
            time.sleep(0.05)
        return self.clock() - start

    def _sample(self, samples, gauges, stop):
        start = self.clock()
        next_scrape = start
        while not stop.wait(self.sample_every):
            now = self.clock()
            with self.lock:
                samples.append({"t": round(now - start, 3),
                                "waiting": [self.books.waiting(n) for n in self.names],
                                "running": [self.books.running(n) for n in self.names]})
            if now >= next_scrape:
                next_scrape = now + self.scrape_every
                got = self.scrape(engines_mod.gauges)
                gauges.append({"t": round(self.clock() - start, 3),
                               "waiting": [(got[n] or {}).get("waiting") for n in self.names],
                               "running": [(got[n] or {}).get("running") for n in self.names],
                               "usage": [(got[n] or {}).get("usage") for n in self.names]})

    def tokens_and_keys(self, arrival, shared):
        """The prompt's tokens (the simulator's dummy tokenizer) and its block keys (the simulator's), the shared part once."""
        key = (arrival.group, arrival.user)
        got = shared.get(key)
        if got is None:
            text = arrival.prompt[:arrival.shared_tokens * workload.CHARS_PER_TOKEN]
            tokens = simkeys.tokenize(text)
            got = shared[key] = (tokens, self.keys.chain(self.keys.root, tokens))
        tokens, keys = got
        tail = simkeys.tokenize(arrival.prompt[arrival.shared_tokens * workload.CHARS_PER_TOKEN:])
        return tokens + tail, keys + self.keys.chain(keys[-1] if keys else self.keys.root, tail)

    def dispatch(self, name, policy, arrival, shared, start):
        """The request's record; a stand-in picks here, at its arrival, under the lock (its view of the books is exact)."""
        tokens, keys = self.tokens_and_keys(arrival, shared)
        record = {"i": arrival.index, "step": arrival.step, "at": round(arrival.at, 4), "group": arrival.group, "user": arrival.user,
                  "prompt_tokens": len(tokens), "bound": arrival.bound_tokens, "engine": None, "keys": keys, "_tokens": tokens}
        if policy is None:
            return record   # a real EPP is asked in the request's own thread (``ask_and_send``), as a gateway asks it
        began = self.clock()
        request = policies.Request(arrival.prompt, tokens, self.model)
        with self.lock:
            view = self.view(keys, oracle=policy.config.get("picker") == "oracle")
            picked = policy.pick(request, view, self.names)
            policy.picked(picked, request)
            self._book(record, picked, start)
        record["pick_ms"] = round(1000 * (self.clock() - began), 2)
        return record

    def ask_and_send(self, record, arrival, start):
        """A real EPP's pick over ext_proc, then the request to the engine it picked."""
        began = self.clock()
        body = {"model": self.model, "prompt": arrival.prompt, "max_tokens": self.latency.output_tokens, "temperature": 0}
        try:
            picked = self.picker(body)
        except errors.CheckError as exc:
            record["error"] = "route: %s" % exc.msg
            for key in ("keys", "_tokens"):
                record.pop(key, None)
            record["pick_ms"] = round(1000 * (self.clock() - began), 2)
            return
        record["pick_ms"] = round(1000 * (self.clock() - began), 2)
        with self.lock:
            self._book(record, picked, start)
        self.send(record, arrival)

    def _book(self, record, picked, start):
        """Under the lock: the truth at the pick, then the request in the picked engine's books."""
        keys, tokens = record["keys"], record.pop("_tokens")
        held = dict((n, self.truth.anywhere(n, keys)) for n in self.names)
        record.update(engine=picked, truth_picked=held[picked], truth_best=max(held.values()),
                      work=self.latency.work(len(tokens) - held[picked] * self.block_size))
        now = self.clock()
        record["sent"] = round(now - start, 4)
        record["_start"] = start
        self.books.add(picked, record, now)

    def view(self, keys, oracle=False):
        names = self.names
        books = self.books
        view = policies.View(dict((n, books.waiting(n)) for n in names), dict((n, books.usage(n)) for n in names))
        if oracle:
            view.running = dict((n, books.running(n)) for n in names)
            view.queued_work = dict((n, books.queued_work(n)) for n in names)
            view.cached_blocks = dict((n, self.truth.anywhere(n, keys)) for n in names)
        return view

    def send(self, record, arrival):
        """The request, streamed (its first chunk is its first token); its time to first token, cached tokens, status."""
        engine = self.by_name[record["engine"]]
        lat = self.latency
        body = {"model": self.model, "prompt": arrival.prompt, "max_tokens": lat.output_tokens, "ignore_eos": True,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        began = self.clock()
        first = None
        try:
            status, first, usage, message = self.client.stream(engine, body, self.clock)
            record["status"] = status
            if status == 200:
                record["cached"] = int(((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
                if usage is None or first is None:
                    record["status"] = None
                    record["error"] = "a streamed answer without %s" % ("usage" if usage is None else "a token")
                    record.pop("cached", None)
            else:
                record["error"] = "HTTP %s: %s" % (status, (message or "")[:120])
        except (OSError, ValueError, http.client.HTTPException) as exc:
            record["status"] = None
            record["error"] = "%s: %s" % (type(exc).__name__, exc)
        now = self.clock()
        record["ttft"] = round((first if first is not None else now) - began, 4)
        record["latency"] = round(now - began, 4)
        with self.lock:
            self.books.done(record["engine"], record, now)
        start = record.pop("_start")
        record["queue"] = round(max(0.0, record.get("started", now) - start - record["sent"]), 4)
        record.pop("started", None)
        record.pop("keys", None)
        record.pop("work", None)
