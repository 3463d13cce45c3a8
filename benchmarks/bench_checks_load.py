#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The checks under load: kv_index_check's core and one kv_events_check per engine, over real engines, for minutes.

Four real vLLM engines (``make bench-load`` runs ``benchmarks/bench_load.yml``, which starts them with roles/local_engine
with 72 KV blocks each, so the workload overflows their caches and BlockRemoved events keep coming, and stops them in
``always``) are watched at once, for ``--minutes`` (10 by default), by:

* ``kv_index_check``'s check (``kv/index_check.KVIndexCheck``, driven step by step through its ``run_step``; its index is
  the collection's live index, ``kv/live_index.LiveIndex``): one KV-block index per engine from the live streams, the
  engines' replay buffers read from seq 0 at the start, gaps repaired through the replay endpoints; before every checked
  request it records what the index predicts the engine has cached and compares with
  ``usage.prompt_tokens_details.cached_tokens``;
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
``--restart-at`` of the run one engine (the last; ``--restart-engine``) is stopped and started again through the service
record its role published (``--engines-file``; ``service/supervisor.restart``, what local_service does): it leaves the
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
      [--no-restart] [--restart-at 0.4] [--burst-every 30] [--burst-size 16] [--json] [--require]
"""

from __future__ import absolute_import, division, print_function

import argparse
import concurrent.futures
import itertools
import json
import os
import random
import sys
import threading
import time

import _lab
from ansible_collections.inference_cache.substrate.plugins.module_utils.common import errors, wiring
from ansible_collections.inference_cache.substrate.plugins.module_utils.http import openai as http
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import events_check, index_check, workload

ROOT = _lab.ROOT

WORDS = ("ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "be", "do", "fu", "gi", "ha", "ju", "ze", "po")
RSS_EVERY = 3.0   # seconds between RSS samples


def rss_kib():
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def reachable(url):
    """None when ``url``/health answers, else why not."""
    return _lab.reachable(url)


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
            self.core.live.pump(0.2)
        for job in jobs:
            self.requests["burst"] += 1
            try:
                job.result()
            except errors.CheckError as exc:
                self.requests["burst_failed"] += 1
                self.errors.append("burst request: %s" % exc.msg)
        self.core.live.settle()

    def checked_step(self, step, among):
        names = [e.name for e in among]
        targets = [name for name in step.targets if name in names]
        if not targets:
            return
        before = self.core.results["requests"]
        wrong = len(self.core.results["mismatches"])
        one = workload.Step(step.index, step.family, step.kind, step.base, step.tail, targets)
        try:
            self.core.run_step(one, among)
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
        """Take ``engine`` out of the rotation, fetch its tail, restart it through its service record in a thread."""
        core = self.core
        core.live.settle()
        core.live.fetch_tail(engine.stream)
        self.restart["engine"] = engine.name
        self.restart["stopped_at"] = round(time.monotonic() - self.started, 1)
        result = {}

        def restart():
            try:
                _lab.restart(engine.spec, wait=1200)
                result["rc"] = 0
            except errors.CheckError as exc:
                result["rc"], result["tail"] = 1, exc.msg
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
        stream = engine.stream
        restarts = stream.restarts
        for _try in range(10):
            if stream.restarts > restarts:
                break
            since = stream.activity
            self.send(engine.spec["url"], "wake up %d: %s." % (_try, self.tail_words(40, 80)), 1, self.core.model)
            self.requests["wake_up"] += 1
            self.restart["wake_up_requests"] += 1
            self.core.live.settle(wait_for=stream, since=since)
        self.restart["noticed_by_index"] = stream.restarts > restarts
        noticed = stream.starts[-1]["noticed_at"]
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
        self.core = core = index_check.KVIndexCheck(params)
        self.sampler.start()
        core.prepare()
        for engine in core.engines:   # the topic: kv@<host>:<port>@<served model name>; the service record to restart it
            spec = [s for s in self.specs if s["name"] == engine.name][0]
            engine.stream.topic = wiring.kv_topic(spec["host"], spec["port"], core.model)
            engine.spec["service"] = spec.get("service")
        for engine in core.engines:
            watcher = EventsWatcher(engine.spec, engine.stream.topic, duration + 3600.0, self.stop)
            watcher.start()
            self.watchers.append(watcher)
        everyone = list(core.engines)
        restart_engine = core.by_name[args.restart_engine] if args.restart_engine else everyone[-1]
        self.started = time.monotonic()
        restart_at = self.started + args.restart_at * duration
        restarting = None
        next_burst = self.started + args.burst_every
        try:
            with core.live.listening(), concurrent.futures.ThreadPoolExecutor(max(args.burst_size, 1)) as pool:
                self.rss_window = (len(self.sampler.samples), None)
                # What the index replayed of each engine's past (batches published before this run) at the start.
                self.history = dict((engine.name, engine.stream.batches) for engine in core.engines)
                steps = itertools.cycle(core.steps)
                rotation = list(everyone)   # the engines served: all but the one restarting
                try:
                    while time.monotonic() - self.started < duration:
                        now = time.monotonic()
                        if restarting is None and not args.no_restart and now >= restart_at:
                            rotation = [e for e in everyone if e is not restart_engine]
                            restarting = self.leave(restart_engine)
                        elif restarting not in (None, False) and not restarting[0].is_alive():
                            self.rejoin(restart_engine, restarting[1])
                            rotation = list(everyone)
                            restarting = False
                        if now >= next_burst and args.burst_size:
                            self.burst(rotation, pool)
                            next_burst = time.monotonic() + args.burst_every
                            continue
                        self.checked_step(next(steps), rotation)
                    if restarting not in (None, False):   # the run ended while the engine restarted: wait for it
                        restarting[0].join()
                        self.rejoin(restart_engine, restarting[1])
                    core.live.settle()
                except errors.CheckError as exc:   # the run cannot go on (a request failed, the restart failed): report
                    self.errors.append(exc.msg)
                    if restarting not in (None, False):
                        restarting[0].join()
                for engine in core.engines:
                    if engine.stream.source.replay_endpoint and reachable(engine.spec["url"]) is None:
                        core.live.fetch_tail(engine.stream)
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
        removed = core.live.removed_blocks()
        for engine in core.engines:
            watcher = [w for w in self.watchers if w.spec["name"] == engine.name][0]
            if watcher.facts is None and watcher.failure is None:
                watcher.failure = "still running when the run ended" if watcher.is_alive() else "ended without facts"
            wf = watcher.facts or {}
            gaps = wf.get("gaps", {})
            tracked = watcher.check.seqs.gaps   # every gap and tail of its sequence tracker (the facts list 20)
            stream = engine.stream
            engines[engine.name] = {
                "index": {"batches": stream.batches, "before_the_run": self.history.get(engine.name, 0),
                          "starts": [{"last_seq": s["last_seq"], "applied": s["applied"]} for s in stream.starts],
                          "gaps_seen": stream.gaps_seen, "gaps_unrepaired": stream.gaps_unrepaired,
                          "batches_lost": stream.lost(), "restarts_noticed": stream.restarts,
                          "blocks_removed": removed[engine.name], "malformed": stream.tally.malformed},
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
                        help="the engines as their roles published them, with each one's service record (benchmarks/bench_load.yml "
                        "writes it)")
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the load runs")
    parser.add_argument("--families", type=int, default=12, help="prompt families of the checked workload")
    parser.add_argument("--burst-every", type=float, default=30.0, help="seconds between bursts")
    parser.add_argument("--burst-size", type=int, default=16, help="concurrent requests per burst (0: no bursts)")
    parser.add_argument("--no-restart", action="store_true", help="restart no engine part way")
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
    specs = _lab.load_engines(args.engines_file)
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
