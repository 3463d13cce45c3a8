#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The checks under load: kv_index_check's core and one kv_events_check per engine, over real engines, for minutes.

Four real vLLM engines (``make bench-load`` starts them through playbooks/kv_index.yml with 72 KV blocks each, so
the workload overflows their caches and BlockRemoved events keep coming) are watched at once, for ``--minutes``
(10 by default), by:

* the core of ``kv_index_check`` (``kv/index_check.KVIndexCheck``, driven step by step as bench_routing.py drives it):
  one KV-block index per engine from the live streams, the engines' replay buffers read from seq 0 at the start,
  gaps repaired through the replay endpoints; before every checked request it records what the index predicts the
  engine has cached and compares with ``usage.prompt_tokens_details.cached_tokens``;
* one ``kv_events_check`` per engine (``kv/events_check.KVEventsCheck``, each in a thread of its own with its own
  ZMQ context), listening for the whole run (``enough`` says when to stop) with its own sequence tracking, gap and
  tail repair, then its own verdict.

Every engine binds its KV-event endpoint (an ``ipc://`` path: only this machine can reach it), so both checks
subscribe to the same stream (one bound subscriber would take it alone).

The traffic: the kv_index_check workload's prompt families (12 by default), one checked request at a time (a
prediction must be made before the request and nothing else may change that engine's cache meanwhile); every
``--burst-every`` seconds a burst of ``--burst-size`` concurrent, unchecked requests over the engines (family
prefixes with new tails, 1 to 32 generated tokens: stores, copies and evictions while the checker applies events);
the checked requests after a burst show whether the index still holds exactly what each engine holds. At
``--restart-at`` of the run one engine (the last; ``--restart-engine``) is stopped and started again with
``--restart-command`` (``make bench-load`` passes playbooks/kv_index.yml with ``kv_index_only``): it leaves the
rotation first (its tail of events fetched through its replay endpoint), the others keep serving, and when it
answers again an unchecked request makes it publish: vLLM publishes nothing at start, so its first batch (sequence
number 0 again) is how a subscriber notices the restart. Then it rejoins.

Printed: requests (checked, burst, wake-up), per engine the batches each checker applied or counted (the index also
replays what the engines published before the run, shown apart), gaps seen and repaired, batches lost (per engine
start: the last sequence number + 1 minus the batches applied; for kv_events_check the batches its unrepaired gaps
miss), the tails kv_events_check fetched through the replay endpoint when its stream went quiet (batches after the
last one it had seen live, which no gap reveals: still on their way, or dropped), the index's predictions
exact/total, the restart noticed by both checkers, the checker process's RSS sampled every few seconds (start, max,
end, and its growth over the second half), and the wall time. Exit status 1 when a batch was lost, a gap stayed
unrepaired, a prediction was wrong, the restart went unnoticed, a kv_events_check failed, the two checkers counted
different batches or the RSS grew more than ``--rss-limit-mib`` over the second half of the run. Without the engines
it prints why and exits 0 (``--require``: 1), as ``make bench`` runs it. The engines should be fresh (their replay
buffers, 10000 batches by default, holding all they published), as ``make bench-load`` starts them.

  .venv/bin/python benchmarks/bench_checks_load.py [--engines-file out/bench-load/engines.json] [--minutes 10]
      [--restart-command CMD] [--restart-at 0.4] [--burst-every 30] [--burst-size 16] [--json] [--require]
"""

from __future__ import absolute_import, division, print_function

import argparse
import concurrent.futures
import inspect
import itertools
import json
import os
import random
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from _loader import module_utils  # noqa: E402  pylint: disable=wrong-import-position

errors = module_utils("common.errors")
wiring = module_utils("common.wiring")
http = module_utils("http.openai")
index_check = module_utils("kv.index_check")
events_check = module_utils("kv.events_check")
workload = module_utils("kv.workload")

WORDS = ("ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "be", "do", "fu", "gi", "ha", "ju", "ze", "po")
RSS_EVERY = 3.0   # seconds between RSS samples


def rss_kib():
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def reachable(url, timeout=5.0):
    """None when ``url``/health answers 200, else why not."""
    try:
        client = http.OpenAIClient(url, timeout=timeout)
        client.get_text("/health")
        return None
    except errors.CheckError as exc:
        return exc.msg


def load_engines(path, host="127.0.0.1"):
    """The engines of a playbooks/kv_index.yml engines file: name, url, and what a subscriber needs (wiring.subscriber)."""
    with open(path) as handle:
        listed = json.load(handle)["kv_index_engines"]
    engines = []
    for item in listed:
        address = item.get("host", host)
        endpoint = item.get("kv_events_endpoint") or "tcp://127.0.0.1:%d" % item["kv_events_port"]
        sub = wiring.subscriber(endpoint, "", "tcp://127.0.0.1:%d" % item["replay_port"], host=address)
        engines.append({"name": item["instance"], "url": "http://%s:%d" % (address, item["port"]), "port": item["port"],
                        "host": address, "endpoint": sub["endpoint"], "socket_mode": sub["socket_mode"],
                        "replay_endpoint": sub["replay_endpoint"]})
    return engines


class RSSSampler(threading.Thread):
    """This process's RSS every ``every`` seconds: (seconds since start, KiB)."""

    def __init__(self, every=RSS_EVERY):
        super(RSSSampler, self).__init__(name="rss", daemon=True)
        self.every = every
        self.samples = []
        self.origin = time.monotonic()
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            self.samples.append((round(time.monotonic() - self.origin, 1), rss_kib()))
            self.done.wait(self.every)

    def stop(self):
        self.done.set()
        self.join()
        self.samples.append((round(time.monotonic() - self.origin, 1), rss_kib()))


class EventsWatcher(threading.Thread):
    """One engine's kv_events_check for the whole run (stops once ``stop`` is set and its stream is quiet)."""

    def __init__(self, spec, topic, timeout, stop):
        super(EventsWatcher, self).__init__(name="kv_events_check-%s" % spec["name"], daemon=True)
        self.spec = spec
        self.stop = stop
        self.params = {"endpoint": spec["endpoint"], "socket_mode": spec["socket_mode"], "topic": topic,
                       "replay_endpoint": spec["replay_endpoint"], "timeout": timeout, "expect": {"BlockStored": 1}}
        self.check = events_check.KVEventsCheck(self.params, enough=self.stop.is_set)
        self.facts = None
        self.failure = None

    def run(self):
        try:
            self.facts = self.check.run()
        except errors.CheckError as exc:
            self.failure = exc.msg
            self.facts = exc.facts
        except Exception as exc:  # pylint: disable=broad-except
            self.failure = "%s: %s" % (type(exc).__name__, exc)
            self.facts = self.check.facts()


class LoadIndexCheck(index_check.KVIndexCheck):
    """KVIndexCheck's core, steps chosen by the load loop; it also counts, per engine start, the batches applied and the
    last sequence number applied, and the gaps the live stream showed. Kept beside the core's own bookkeeping (read
    only through ``batches`` and ``restarts`` of its engines), so the core's way of tracking sequences may change."""

    def __init__(self, params):
        super(LoadIndexCheck, self).__init__(params)
        self.gaps_seen = {}
        self.starts = {}     # engine name -> one dict per engine start: last_seq, applied, noticed_at
        self.seen = {}       # engine name -> (engine.batches, engine.restarts) when last looked at
        self.depth = 0       # on_batch calls in progress (a live batch's gap repair replays inside it)
        # KVIndexCheck's own, set again for pylint (it does not see the base class through tools/_loader.py)
        self.start = self.deadline = self.index = None
        self.engines, self.by_name = [], {}

    def prepare(self):
        super(LoadIndexCheck, self).prepare()
        for engine in self.engines:
            self.gaps_seen[engine.name] = 0
            self.starts[engine.name] = [{"last_seq": -1, "applied": 0, "noticed_at": None}]
            self.seen[engine.name] = (engine.batches, engine.restarts)

    def account(self, engine, seq):
        """Bring this engine's start records up to date with the core: a new start, the batches applied since."""
        batches, restarts = self.seen[engine.name]
        if engine.restarts > restarts:
            self.starts[engine.name].append({"last_seq": -1, "applied": 0, "noticed_at": time.monotonic()})
        current = self.starts[engine.name][-1]
        if engine.batches > batches:
            current["applied"] += engine.batches - batches
            current["last_seq"] = max(current["last_seq"], seq)
        self.seen[engine.name] = (engine.batches, engine.restarts)

    def on_batch(self, batch, payload, live, source):
        engine = self.by_name[source.name]
        self.account(engine, -1)
        outer = self.depth == 0
        before = self.starts[engine.name][-1]["last_seq"]
        restarts = engine.restarts
        self.depth += 1
        try:
            super(LoadIndexCheck, self).on_batch(batch, payload, live, source)
        finally:
            self.depth -= 1
        self.account(engine, batch.seq)
        if live and outer:
            # A gap: the live batch is ahead of the last one applied (after a restart, of nothing: seq 0 comes first).
            expected = 0 if engine.restarts > restarts else before + 1
            if batch.seq > expected and batch.seq > (-1 if engine.restarts > restarts else before):
                self.gaps_seen[engine.name] += 1

    def last_seq(self, engine):
        return self.starts[engine.name][-1]["last_seq"]

    def fetch_tail(self, engine):
        """Everything the engine's replay buffer holds after the last batch applied (a dropped tail shows no gap)."""
        if not engine.source.replay_endpoint:
            return
        start = self.last_seq(engine) + 1
        if len(inspect.signature(self.replay_into).parameters) == 4:   # (engine, rank, start, end): sequences per rank
            self.replay_into(engine, engine.source.rank, start, None)
        else:
            self.replay_into(engine, start, None)
        self.account(engine, -1)

    def pump(self, seconds):
        """Apply events for ``seconds`` (while requests of a burst run)."""
        end = self.clock() + seconds
        while self.clock() < end:
            self.consumer.poll(0.05)
            self.drain()


class LoadBench:
    """The load loop: checked steps, bursts, one restart; the figures."""

    def __init__(self, args, specs):
        self.args = args
        self.specs = specs
        self.rng = random.Random(args.seed)
        self.stop = threading.Event()
        self.sampler = RSSSampler()
        self.watchers = []
        self.core = None
        self.requests = {"checked": 0, "burst": 0, "burst_failed": 0, "wake_up": 0}
        self.bursts = 0
        self.restart = {"engine": None, "command_rc": None, "stopped_at": None, "answering_at": None, "noticed_at": None,
                        "noticed_by_index": False, "wake_up_requests": 0, "output_tail": None}
        self.mismatches = []
        self.errors = []
        self.started = None
        self.rss_window = None
        self.history = {}

    # -- traffic ----------------------------------------------------------------------------
    def tail_words(self, low, high):
        return " ".join("".join(self.rng.choice(WORDS) for _i in range(self.rng.randint(1, 3)))
                        for _j in range(self.rng.randint(low, high)))

    def burst_prompt(self):
        bases = list(self.core.bases.values())
        base = self.rng.choice(bases) if bases else "burst"
        return "%s\nburst %d: %s." % (base, self.bursts, self.tail_words(4, 60))

    @staticmethod
    def send(url, prompt, max_tokens, model):
        client = http.OpenAIClient(url, timeout=120.0)
        answer = client.post_json("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                                      "temperature": 0})
        return answer

    def burst(self, engines, pool):
        """``burst_size`` concurrent unchecked requests over ``engines``; events applied while they run."""
        self.bursts += 1
        jobs = []
        for number in range(self.args.burst_size):
            engine = engines[number % len(engines)]
            jobs.append(pool.submit(self.send, engine.spec["url"], self.burst_prompt(), self.rng.randint(1, 32), self.core.model))
        while not all(job.done() for job in jobs):
            self.core.pump(0.2)
        for job in jobs:
            self.requests["burst"] += 1
            try:
                job.result()
            except errors.CheckError as exc:
                self.requests["burst_failed"] += 1
                self.errors.append("burst request: %s" % exc.msg)
        self.core.settle()

    def checked_step(self, step, names):
        targets = [name for name in step.targets if name in names]
        if not targets:
            return
        before = self.core.results["requests"]
        wrong = len(self.core.results["mismatches"])
        one = workload.Step(step.index, step.family, step.kind, step.base, step.tail, targets)
        try:
            self.core.run_step(one)
        except errors.CheckError as exc:
            if len(self.core.results["mismatches"]) == wrong:   # not a wrong prediction: the run cannot go on
                self.errors.append(exc.msg)
                raise
            # A wrong prediction: the core counted it and stopped the step; the run goes on with the next one.
            self.mismatches.append(dict(self.core.results["mismatches"][-1], sentence=exc.msg))
        finally:
            self.requests["checked"] += self.core.results["requests"] - before

    # -- the restart --------------------------------------------------------------------------
    def leave(self, engine):
        """Take ``engine`` out of the rotation, fetch its tail, start the restart command in a thread."""
        core = self.core
        core.settle()
        core.fetch_tail(engine)
        self.restart["engine"] = engine.name
        self.restart["stopped_at"] = round(time.monotonic() - self.started, 1)
        command = self.args.restart_command.replace("{engine}", engine.name)
        result = {}

        def restart():
            try:
                run = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=1200, check=False)
                result["rc"] = run.returncode
                result["tail"] = " ".join((run.stdout + run.stderr).split()[-40:])
            except subprocess.TimeoutExpired:
                result["rc"] = "timeout"
        thread = threading.Thread(target=restart, name="restart", daemon=True)
        thread.start()
        return thread, result

    def rejoin(self, engine, result):
        """The engine answers again: make it publish until the index notices its new start."""
        self.restart["command_rc"] = result.get("rc")
        self.restart["output_tail"] = result.get("tail")
        if result.get("rc") != 0:
            raise errors.CheckError("Restarting %s failed (%s): ...%s" % (engine.name, result.get("rc"), result.get("tail")))
        self.restart["answering_at"] = round(time.monotonic() - self.started, 1)
        restarts = engine.restarts
        for _try in range(10):
            if engine.restarts > restarts:
                break
            since = engine.source.activity
            self.send(engine.spec["url"], "wake up %d: %s." % (_try, self.tail_words(40, 80)), 1, self.core.model)
            self.requests["wake_up"] += 1
            self.restart["wake_up_requests"] += 1
            self.core.settle(wait_for=engine, since=since)
        self.restart["noticed_by_index"] = engine.restarts > restarts
        noticed = self.core.starts[engine.name][-1]["noticed_at"]
        if noticed is not None and self.restart["noticed_by_index"]:
            self.restart["noticed_at"] = round(noticed - self.started, 1)

    # -- the run ------------------------------------------------------------------------------
    def run(self):
        args = self.args
        duration = args.minutes * 60.0
        params = {"engines": [dict((k, s[k]) for k in ("name", "url", "endpoint", "socket_mode", "replay_endpoint"))
                              for s in self.specs],
                  # Enough rounds for the run (a checked request takes a second or more here); cycled if they run out.
                  "workload": {"families": args.families, "rounds": max(10, int(duration / args.families) + 1), "seed": args.seed},
                  "expect": {"min_requests": 0}, "timeout": duration + 3600.0}
        self.core = core = LoadIndexCheck(params)
        self.sampler.start()
        core.prepare()
        for engine in core.engines:   # the topic: kv@<host>:<port>@<served model name>
            spec = [s for s in self.specs if s["name"] == engine.name][0]
            engine.source.topic = wiring.kv_topic(spec["host"], spec["port"], core.model)
        for engine in core.engines:
            watcher = EventsWatcher(engine.spec, engine.source.topic, duration + 3600.0, self.stop)
            watcher.start()
            self.watchers.append(watcher)
        everyone = list(core.engines)
        restart_engine = core.by_name[args.restart_engine] if args.restart_engine else everyone[-1]
        self.started = time.monotonic()
        restart_at = self.started + args.restart_at * duration
        restarting = None
        next_burst = self.started + args.burst_every
        try:
            with core.listening(), concurrent.futures.ThreadPoolExecutor(max(args.burst_size, 1)) as pool:
                self.rss_window = (len(self.sampler.samples), None)
                # What the index replayed of each engine's past (batches published before this run) at the start.
                self.history = dict((engine.name, engine.batches) for engine in core.engines)
                steps = itertools.cycle(core.steps)
                try:
                    while time.monotonic() - self.started < duration:
                        now = time.monotonic()
                        if restarting is None and args.restart_command and now >= restart_at:
                            core.engines = [e for e in everyone if e is not restart_engine]
                            restarting = self.leave(restart_engine)
                        elif restarting not in (None, False) and not restarting[0].is_alive():
                            self.rejoin(restart_engine, restarting[1])
                            core.engines = list(everyone)
                            restarting = False
                        if now >= next_burst and args.burst_size:
                            self.burst(core.engines, pool)
                            next_burst = time.monotonic() + args.burst_every
                            continue
                        self.checked_step(next(steps), [e.name for e in core.engines])
                    if restarting not in (None, False):   # the run ended while the engine restarted: wait for it
                        restarting[0].join()
                        self.rejoin(restart_engine, restarting[1])
                        core.engines = list(everyone)
                    core.settle()
                except errors.CheckError as exc:   # the run cannot go on (a request failed, the restart failed): report
                    self.errors.append(exc.msg)
                    if restarting not in (None, False):
                        restarting[0].join()
                    core.engines = list(everyone)
                for engine in core.engines:
                    if engine.source.replay_endpoint and reachable(engine.spec["url"]) is None:
                        core.fetch_tail(engine)
                self.rss_window = (self.rss_window[0], len(self.sampler.samples))
        finally:
            self.stop.set()
            for watcher in self.watchers:
                watcher.join(120)
            self.sampler.stop()
        return self.figures(time.monotonic() - self.started)

    # -- the figures --------------------------------------------------------------------------
    def figures(self, wall):
        core = self.core
        engines = {}
        for engine in core.engines:
            watcher = [w for w in self.watchers if w.spec["name"] == engine.name][0]
            if watcher.facts is None and watcher.failure is None:
                watcher.failure = "still running when the run ended" if watcher.is_alive() else "ended without facts"
            wf = watcher.facts or {}
            gaps = wf.get("gaps", {})
            tracked = watcher.check.seqs.gaps   # every gap and tail of its sequence tracker (the facts list 20)
            starts = core.starts[engine.name]
            lost = sum((s["last_seq"] + 1) - s["applied"] for s in starts if s["last_seq"] is not None and s["applied"] is not None)
            engines[engine.name] = {
                "index": {"batches": engine.batches, "before_the_run": self.history.get(engine.name, 0),
                          "starts": [{"last_seq": s["last_seq"], "applied": s["applied"]} for s in starts],
                          "gaps_seen": core.gaps_seen[engine.name], "gaps_unrepaired": engine.gaps_unrepaired,
                          "batches_lost": lost, "restarts_noticed": engine.restarts,
                          "blocks_removed": core.index.engines[engine.name].removed_blocks if engine.name in core.index.engines else 0,
                          "malformed": engine.tally.malformed},
                # kv_events_check's gaps include the tails it fetched through the replay endpoint whenever its stream went
                # quiet (batches after the last one seen live, which no gap reveals): counted apart here.
                "kv_events_check": {"passed": watcher.failure is None, "failure": watcher.failure, "batches": wf.get("batches"),
                                    "gaps_found": sum(1 for g in tracked if not g.get("tail")),
                                    "gaps_repaired": sum(1 for g in tracked if not g.get("tail") and g["repaired"]),
                                    "gaps_unrepaired": gaps.get("unrepaired"),
                                    "tail_fetches": sum(1 for g in tracked if g.get("tail")),
                                    "batches_lost": sum(g.get("still_missing", g["missing"]) for g in tracked if not g["repaired"]),
                                    "tail_batches": gaps.get("tail", {}).get("batches"),
                                    "restarts_noticed": len(wf.get("restarts", [])),
                                    "stored_hashes_tracked": len(watcher.check.stats.stored_hashes)},
            }
        samples = self.sampler.samples
        first, last = self.rss_window if self.rss_window else (0, None)
        window = samples[first:last] or samples
        half = window[len(window) // 2:] or window
        rss = {"start_mib": round(window[0][1] / 1024.0, 1), "max_mib": round(max(s[1] for s in window) / 1024.0, 1),
               "end_mib": round(window[-1][1] / 1024.0, 1),
               "second_half_growth_mib": round((half[-1][1] - half[0][1]) / 1024.0, 1),
               "samples": len(window), "every_s": RSS_EVERY}
        results = core.results
        return {"wall_s": round(wall, 1), "minutes": self.args.minutes, "requests": dict(self.requests), "bursts": self.bursts,
                "predictions": {"exact": results["exact"], "total": results["requests"], "largest_error": results["largest_error"],
                                "restart_misses": results.get("restart_misses", 0), "mismatches": self.mismatches[:10]},
                "engines": engines, "restart": dict(self.restart), "rss": rss, "errors": self.errors[:10],
                "load_average": os.getloadavg()}


def verdicts(fig, rss_limit):
    """The sentences of what failed (empty: everything held)."""
    out = []
    for name, eng in sorted(fig["engines"].items()):
        idx, evc = eng["index"], eng["kv_events_check"]
        if idx["batches_lost"]:
            out.append("%s: the index lost %d batches" % (name, idx["batches_lost"]))
        if idx["gaps_unrepaired"]:
            out.append("%s: %d gaps stayed unrepaired in the index" % (name, idx["gaps_unrepaired"]))
        if not evc["passed"]:
            out.append("%s: kv_events_check failed: %s" % (name, evc["failure"]))
        elif evc["batches"] != idx["batches"] - idx["before_the_run"]:
            out.append("%s: kv_events_check counted %s batches, the index %d during the run" % (
                name, evc["batches"], idx["batches"] - idx["before_the_run"]))
    pred = fig["predictions"]
    if pred["exact"] + pred["restart_misses"] != pred["total"]:
        out.append("%d of %d predictions were wrong" % (pred["total"] - pred["exact"] - pred["restart_misses"], pred["total"]))
    rst = fig["restart"]
    if rst["engine"]:
        if not rst["noticed_by_index"]:
            out.append("the index did not notice %s's restart" % rst["engine"])
        if not fig["engines"][rst["engine"]]["kv_events_check"]["restarts_noticed"]:
            out.append("kv_events_check did not notice %s's restart" % rst["engine"])
    if fig["rss"]["second_half_growth_mib"] > rss_limit:
        out.append("the checker's RSS grew %.1f MiB over the second half (limit %.1f)" % (fig["rss"]["second_half_growth_mib"], rss_limit))
    if fig["errors"]:
        out.append("errors: %s" % "; ".join(fig["errors"][:3]))
    return out


def show(fig, problems):
    req = fig["requests"]
    print("checks under load: %d engines, %.1f min (wall %.0f s), load average %s at the end" % (
        len(fig["engines"]), fig["minutes"], fig["wall_s"], " ".join("%.1f" % x for x in fig["load_average"])))
    print("requests: %d checked, %d in %d bursts (%d failed), %d wake-up" % (
        req["checked"], req["burst"], fig["bursts"], req["burst_failed"], req["wake_up"]))
    print("%-8s | %-77s | %s" % ("engine", "kv_index_check core", "kv_events_check"))
    for name, eng in sorted(fig["engines"].items()):
        idx, evc = eng["index"], eng["kv_events_check"]
        print("%-8s | %5d batches (%d before the run), gaps %d seen / %d unrepaired, lost %d, evicted %5d | %5s batches, "
              "gaps %s found / %s repaired, tails %s fetched (%s batches), lost %d, restarts %d, %s" % (
                  name, idx["batches"], idx["before_the_run"], idx["gaps_seen"], idx["gaps_unrepaired"], idx["batches_lost"],
                  idx["blocks_removed"],
                  evc["batches"], evc["gaps_found"], evc["gaps_repaired"], evc["tail_fetches"], evc["tail_batches"],
                  evc["batches_lost"], evc["restarts_noticed"], "passed" if evc["passed"] else "FAILED"))
    pred = fig["predictions"]
    print("index predictions exact: %d/%d (largest error %d tokens%s)" % (
        pred["exact"], pred["total"], pred["largest_error"],
        ", %d right after a restart, before its events (the core's restart misses)" % pred["restart_misses"] if pred["restart_misses"] else ""))
    rst = fig["restart"]
    if rst["engine"]:
        print("restart of %s: left at %s s, answering at %s s, noticed by the index at %s s after %d wake-up request(s); "
              "kv_events_check noticed it: %s" % (
                  rst["engine"], rst["stopped_at"], rst["answering_at"], rst["noticed_at"], rst["wake_up_requests"],
                  "yes" if fig["engines"][rst["engine"]]["kv_events_check"]["restarts_noticed"] else "no"))
    rss = fig["rss"]
    print("checker RSS: start %.1f MiB, max %.1f, end %.1f; second half %+.1f MiB (%d samples every %.0f s)" % (
        rss["start_mib"], rss["max_mib"], rss["end_mib"], rss["second_half_growth_mib"], rss["samples"], rss["every_s"]))
    print("verdict: " + ("everything held" if not problems else "; ".join(problems)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines-file", default=os.path.join(ROOT, "out", "bench-load", "engines.json"),
                        help="the JSON given to playbooks/kv_index.yml (kv_index_engines); make bench-load writes it")
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the load runs")
    parser.add_argument("--families", type=int, default=12, help="prompt families of the checked workload")
    parser.add_argument("--burst-every", type=float, default=30.0, help="seconds between bursts")
    parser.add_argument("--burst-size", type=int, default=16, help="concurrent requests per burst (0: no bursts)")
    parser.add_argument("--restart-command", metavar="CMD", help="a shell command that stops and starts the engine named by {engine}")
    parser.add_argument("--restart-engine", help="the engine restarted (default: the last)")
    parser.add_argument("--restart-at", type=float, default=0.4, help="when the restart begins, as a share of the run")
    parser.add_argument("--rss-limit-mib", type=float, default=8.0, help="RSS growth allowed over the second half")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="the figures as one JSON object")
    parser.add_argument("--require", action="store_true", help="fail (instead of skipping) when an engine is unreachable")
    args = parser.parse_args()
    if not os.path.exists(args.engines_file):
        print("bench_checks_load: skipped: no engines file %s (make bench-load writes it and starts the engines)" % args.engines_file)
        return 1 if args.require else 0
    specs = load_engines(args.engines_file)
    for spec in specs:
        problem = reachable(spec["url"])
        if problem:
            print("bench_checks_load: %s: engine %s: %s" % ("failed" if args.require else "skipped", spec["name"], problem))
            return 1 if args.require else 0
    bench = LoadBench(args, specs)
    fig = bench.run()
    problems = verdicts(fig, args.rss_limit_mib)
    if args.json:
        print(json.dumps(dict(fig, problems=problems), sort_keys=True))
    else:
        show(fig, problems)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
