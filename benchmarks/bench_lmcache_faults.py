#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The LMCache tier under faults: steady traffic against the real local engine while its LMCache server is killed, paused
and restarted.

Runs against the local default that ``make site`` leaves running (vLLM on CPU, ``local_engine_lmcache``: an ``lmcache
server`` beside it, reached through LMCacheMPConnector). One client sends greedy requests (temperature 0) back to back,
round robin over ``--prompts`` prompts of about ``--prompt-tokens`` tokens each, more than the engine's own KV cache
holds together (128 blocks of 32 tokens by default), so its prefix cache evicts them and the tier serves them again.
Every answer is held against the prompt's answer without the tier: the same request with a ``cache_salt`` of its own,
which no block of the engine's cache or LMCache's shares (vLLM and LMCache both key by it), computed once before the
traffic and once after it.

The faults, each after ``--steady`` seconds of steady traffic, on the server the role recorded
(``run/<instance>/lmcache.pid``, checked against its recorded identity):

* ``kill``: SIGKILL to the server's process group; ``--down`` seconds later the server is started again as
  ``make site`` starts it (the module local_service's supervisor, the same launcher and settings checksum), and the
  engine left running;
* ``pause``: SIGSTOP to the group for ``--down`` seconds, then SIGCONT;
* ``restart``: SIGKILL and an immediate start again (a restart by an operator or an orchestrator).

Per fault: the requests, those not answered and those answered wrong (a text other than the one without the tier), the
stall (the slowest request from the fault to recovery, against the steady median), the seconds from the fault's end
(server healthy again, or continued) until a request is served from the tier again (``vllm:external_prefix_cache_hits``
moved by it), the connector's own view (its "entering degraded mode" and "re-registering" log lines, with their times),
and memory (RSS of the engine's and the server's processes, largest and last). The recovery is what the connector does
on its own: nothing restarts the engine.

Without an engine and an LMCache server to run against it prints that it skipped and exits 0 (``make bench`` runs
it); ``--require`` makes that a failure. It leaves the stack as it found it: a paused server is continued, a killed one
started again, whatever fails.

  .venv/bin/python benchmarks/bench_lmcache_faults.py [--steady 60] [--down 30] [--faults kill,pause,restart] [--json]
"""

from __future__ import absolute_import, division, print_function

import argparse
import json
import os
import random
import re
import signal
import statistics
import sys
import threading
import time
import uuid

import _lab  # noqa: F401  pylint: disable=unused-import
from ansible_collections.inference_cache.substrate.plugins.module_utils.http import openai as http  # noqa: E402
from ansible_collections.inference_cache.substrate.plugins.module_utils.http import prefix_cache  # noqa: E402
from ansible_collections.inference_cache.substrate.plugins.module_utils.lmcache import check as lmcache_check  # noqa: E402
from ansible_collections.inference_cache.substrate.plugins.module_utils.service import process, supervisor  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
STATE = os.path.expanduser("~/.cache/inference_cache/local_engine")
WORDS = ("cache block token prefix engine model event store query stream request server router index alpha beta gamma "
         "delta epsilon zeta theta kappa lambda sigma omega red green blue one two three four five six seven eight nine "
         "ten data value key hash chain parent child node tree list map set queue time space memory").split()
# The connector's own log lines (lmcache@0.5.6 integration/vllm/vllm_multi_process_adapter.py HeartbeatThread).
CONNECTOR_LINES = (("degraded", "entering degraded mode"), ("healthy_again", "resuming normal operation"),
                   ("reregistered", "Finished re-registering KV caches"))
_LOG_TIME = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\]")


def prompts(count, tokens, seed):
    """``count`` prompts of about ``tokens`` tokens (a word is about 1.2 tokens for the tiny model), distinct from their
    first word on."""
    rng = random.Random(seed)
    words = int(tokens / 1.2)
    return ["[fault %d %d] " % (seed, i) + " ".join(rng.choice(WORDS) for dummy in range(words)) for i in range(count)]


class Stack:
    """The engine and its LMCache server as the local_engine role runs them (instance ``instance``)."""

    def __init__(self, url, instance, max_tokens, timeout):
        self.url = url.rstrip("/")
        port = int(self.url.rsplit(":", 1)[1])
        self.lmcache_url = "http://127.0.0.1:%d" % (port + 51)
        self.run_dir = os.path.join(STATE, "run", instance)
        self.files = supervisor.ServiceFiles(os.path.join(self.run_dir, "lmcache.pid"), os.path.join(self.run_dir, "lmcache.settings.sha1"),
                                             log=os.path.join(self.run_dir, "lmcache.log"), launcher=os.path.join(self.run_dir, "lmcache.sh"))
        self.engine_files = supervisor.ServiceFiles(os.path.join(self.run_dir, "engine.pid"), os.path.join(self.run_dir, "engine.settings.sha1"))
        self.client = http.OpenAIClient(self.url, timeout=timeout)
        self.server = http.OpenAIClient(self.lmcache_url, timeout=3)
        self.max_tokens = max_tokens
        self.ports = [port + 50, port + 51]
        self.paused = None
        self.killed = False
        self.port_wait = None

    def why_not(self):
        """None when the engine and its LMCache server run here, else what is missing, in one sentence."""
        try:
            self.client.get_text("/health")
        except http.OpenAIHTTPError as exc:
            return "no engine answers at %s (%s): run `make site` first" % (self.url, exc)
        try:
            self.server.get_json("/config")
        except http.OpenAIHTTPError as exc:
            return "no LMCache server answers at %s (%s): the local default runs one (make site)" % (self.lmcache_url, exc)
        if not supervisor.status(self.files)["running"]:
            return "the LMCache server at %s is not the one the role recorded in %s" % (self.lmcache_url, self.run_dir)
        return None

    def complete(self, prompt, salt=None):
        body = {"model": "tiny", "prompt": prompt, "max_tokens": self.max_tokens, "temperature": 0}
        if salt:
            body["cache_salt"] = salt
        answer = self.client.post_json("/v1/completions", body)
        return answer["choices"][0]["text"]

    def external_hits(self):
        return prefix_cache.parse_metrics(self.client.get_text("/metrics"))["samples"].get(EXTERNAL_HITS, 0.0)

    def server_pid(self):
        found = supervisor.status(self.files)
        return found["pid"] if found["running"] else None

    def memory_mib(self):
        out = {}
        for name, files in (("engine", self.engine_files), ("lmcache", self.files)):
            found = supervisor.status(files)
            out[name] = round(process.rss_kib(found["pids"]) / 1024.0) if found["running"] else 0
        return out

    # -- the faults ---------------------------------------------------------------------------
    def _signal(self, pid, signum):
        """``signum`` to the server's process group and every process of its session and their descendants."""
        targets = process.handles(sorted(set(process.members(pid)) | {pid}))
        supervisor.signal_all(pid, targets, signum)
        return [h.pid for h in targets]

    def kill(self):
        pid = self.server_pid()
        self._signal(pid, signal.SIGKILL)
        self.killed = True
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and process.members(pid):
            time.sleep(0.1)

    def pause(self):
        self.paused = self.server_pid()
        self._signal(self.paused, signal.SIGSTOP)

    def resume(self):
        self._signal(self.paused, signal.SIGCONT)
        self.paused = None

    def wait_ports_free(self, timeout=120):
        """Seconds until the server's ports can be bound again (a killed server's sockets go with its last process)."""
        start = time.monotonic()
        while process.busy_ports("127.0.0.1", self.ports)[0] and time.monotonic() - start < timeout:
            time.sleep(0.2)
        return time.monotonic() - start

    def start(self):
        """Start the server again as local_service does for `make site`: same launcher, same settings checksum."""
        self.port_wait = self.wait_ports_free()
        checksum = supervisor.file_checksum(self.files.launcher)

        def healthy(url):
            try:
                self.server.get_text(url)
                return True
            except http.OpenAIHTTPError:
                return False
        started = supervisor.Supervisor(self.files, healthy, name="LMCache server").ensure_started(
            checksum, self.lmcache_url + "/healthcheck", "127.0.0.1", self.ports, 300, 30)
        self.killed = False
        return started

    def tier_says(self):
        """What lmcache_check says of the tier right now, before any request of its own (its preflight): None when it
        finds nothing wrong, else its sentence."""
        probe = lmcache_check.LMCacheProbe(http.OpenAIClient(self.url, timeout=10), http.OpenAIClient(self.lmcache_url, timeout=3),
                                           self.url + "/metrics", model="tiny")
        try:
            probe.preflight()
        except lmcache_check.LMCacheCheckError as exc:
            return exc.msg
        return None

    def leave_as_found(self):
        if self.paused:
            self.resume()
        if self.killed:
            self.start()


class Traffic(threading.Thread):
    """One client, requests back to back; each: time, latency, answered, right, served from the tier."""

    def __init__(self, stack, texts, references):
        super(Traffic, self).__init__(name="traffic", daemon=True)
        self.stack = stack
        self.texts = texts
        self.references = references
        self.records = []
        self.halt = threading.Event()
        self.started_at = time.monotonic()

    def run(self):
        index = 0
        while not self.halt.is_set():
            prompt = index % len(self.texts)
            index += 1
            start = time.monotonic()
            record = {"t": start - self.started_at, "prompt": prompt}
            try:
                before = self.stack.external_hits()
                text = self.stack.complete(self.texts[prompt])
                record.update(answered=True, right=text == self.references[prompt], tier=self.stack.external_hits() - before > 0)
            except (http.OpenAIHTTPError, KeyError, ValueError) as exc:
                record.update(answered=False, right=False, tier=False, error=str(exc)[:200])
            record["latency"] = time.monotonic() - start
            self.records.append(record)


def connector_events(log, since_wall):
    """The connector's degraded / healthy again / re-registered lines of the engine log after ``since_wall``: [(what, unix time)]."""
    found = []
    try:
        with open(log, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                for what, needle in CONNECTOR_LINES:
                    if needle in line:
                        match = _LOG_TIME.search(line)
                        if match:
                            at = time.mktime(time.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")) + int(match.group(2)) / 1000.0
                            if at >= since_wall:
                                found.append((what, at))
    except OSError:
        pass
    return found


def answers_after(complete, texts, salt):
    """The answers without the tier after the traffic, and None; or, at the first request the engine does not answer
    (an engine that hangs after a fault), the answers so far and the error's sentence: one unanswered request is enough
    to say so, and waiting out the request timeout for every prompt would only add to it."""
    answers = []
    for index, text in enumerate(texts):
        try:
            answers.append(complete(text, salt="%s-after-%d" % (salt, index)))
        except (http.OpenAIHTTPError, KeyError, ValueError) as exc:
            return answers, str(exc)
    return answers, None


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))] if ordered else None


def watch_check(stack, traffic, until):
    """lmcache_check's word on the tier every second until it finds nothing wrong (or ``until``): [(t, sentence or None)]."""
    said = []
    while True:
        sentence = stack.tier_says()
        said.append((round(time.monotonic() - traffic.started_at, 1), sentence))
        if sentence is None or time.monotonic() - traffic.started_at >= until:
            return said
        time.sleep(1.0)


def ended_within(records, start, end):
    """The requests that ended (answered, or given up) at ``start`` or later and before ``end``: each is booked to the
    phase it ended in, so one in flight when a fault began (stalled by it, or hung by it and never answered) counts
    for that fault, not for the phase it was sent in."""
    return [r for r in records if start <= r["t"] + r["latency"] < end]


def summarize(name, records, fault_at, over_at, baseline_median, events, wall_offset, end):
    """One fault's row from the requests that ended between its start and the next phase's (``ended_within``)."""
    during = ended_within(records, fault_at, end)
    served = [r for r in during if r["t"] >= over_at and r["tier"]]
    recovered_at = served[0]["t"] + served[0]["latency"] if served else None
    window = [r for r in during if recovered_at is None or r["t"] < recovered_at]
    slowest = max((r["latency"] for r in window), default=0.0)
    own = [(what, round(at - wall_offset - fault_at, 1)) for what, at in events if fault_at - 1 <= at - wall_offset < end]
    own = [item for index, item in enumerate(own) if item not in own[:index]]   # the scheduler's and the worker's adapter log alike
    return {
        "fault": name, "requests": len(during), "unanswered": sum(1 for r in during if not r["answered"]),
        "wrong": sum(1 for r in during if r["answered"] and not r["right"]),
        "served_from_tier": sum(1 for r in during if r["tier"]),
        "stall_s": round(slowest, 2), "stall_over_median_s": round(max(0.0, slowest - baseline_median), 2),
        "fault_seconds": round(over_at - fault_at, 1),
        "tier_back_after_fault_end_s": round(recovered_at - over_at, 1) if recovered_at is not None else None,
        "connector": own,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the engine (its LMCache server's HTTP API 51 above its port)")
    parser.add_argument("--instance", default="default", help="the local_engine instance (its run folder)")
    parser.add_argument("--faults", default="kill,pause,restart", help="which faults, in order (kill, pause, restart)")
    parser.add_argument("--steady", type=float, default=60.0, help="seconds of steady traffic before each fault and at the end")
    parser.add_argument("--down", type=float, default=30.0, help="seconds a killed server stays down, or a paused one paused")
    parser.add_argument("--prompts", type=int, default=12, help="prompts of the round robin")
    parser.add_argument("--prompt-tokens", type=int, default=600, help="about this many tokens each")
    parser.add_argument("--max-tokens", type=int, default=8, help="greedy tokens per answer")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a request may take")
    parser.add_argument("--require", action="store_true", help="fail (exit 1) instead of skipping without the stack")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--records", help="write every request (time, prompt, latency, answered, right, from the tier) to this JSON file")
    args = parser.parse_args(argv)
    faults = [f for f in args.faults.split(",") if f]
    unknown = [f for f in faults if f not in ("kill", "pause", "restart")]
    if unknown:
        parser.error("unknown fault(s) %s: choose among kill, pause, restart" % ", ".join(unknown))
    stack = Stack(args.url, args.instance, args.max_tokens, args.timeout)
    why = stack.why_not()
    if why:
        print("bench_lmcache_faults: skipped: %s." % why)
        return 1 if args.require else 0

    texts = prompts(args.prompts, args.prompt_tokens, seed=int(time.time()) % 100000)
    salt = uuid.uuid4().hex
    references = [stack.complete(text, salt="%s-ref-%d" % (salt, i)) for i, text in enumerate(texts)]
    memory = [stack.memory_mib()]
    wall_offset = time.time() - time.monotonic()
    traffic = Traffic(stack, texts, references)
    phases = []
    try:
        traffic.start()
        time.sleep(args.steady)
        baseline = [r["latency"] for r in traffic.records if r["answered"]]
        for fault in faults:
            memory.append(stack.memory_mib())
            fault_at = time.monotonic() - traffic.started_at
            during = None
            if fault == "kill":
                stack.kill()
                during = stack.tier_says()
                time.sleep(max(0.0, fault_at + args.down - (time.monotonic() - traffic.started_at)))
                stack.start()
            elif fault == "pause":
                stack.pause()
                during = stack.tier_says()
                time.sleep(max(0.0, fault_at + args.down - (time.monotonic() - traffic.started_at)))
                stack.resume()
            else:
                stack.kill()
                stack.start()
            over_at = time.monotonic() - traffic.started_at
            port_wait, stack.port_wait = stack.port_wait, None
            said_after = watch_check(stack, traffic, over_at + args.steady / 2)
            memory.append(stack.memory_mib())
            phases.append((fault, fault_at, over_at, during, said_after, port_wait))
            time.sleep(max(0.0, over_at + args.steady - (time.monotonic() - traffic.started_at)))
        memory.append(stack.memory_mib())
    finally:
        traffic.halt.set()
        traffic.join(args.timeout + 10)
        stack.leave_as_found()
    references_after, unanswered_after = answers_after(stack.complete, texts, salt)
    records = traffic.records
    if args.records:   # the raw data first, whatever the summary below does
        with open(args.records, "w") as out:
            json.dump({"records": records, "phases": [p[:3] for p in phases]}, out, indent=1)
    events = connector_events(os.path.join(stack.run_dir, "engine.log"), wall_offset + traffic.started_at)
    median = statistics.median(baseline) if baseline else 0.0
    rows = []
    for index, (fault, fault_at, over_at, during, said_after, port_wait) in enumerate(phases):
        end = phases[index + 1][1] if index + 1 < len(phases) else float("inf")
        row = summarize(fault, records, fault_at, over_at, median, events, wall_offset + traffic.started_at, end)
        passes = [t for t, sentence in said_after if sentence is None]
        row.update(ports_free_after_s=round(port_wait, 1) if port_wait is not None else None, check_during=during,
                   check_after=[sentence for _t, sentence in said_after if sentence][:1],
                   check_passes_after_fault_end_s=round(passes[0] - over_at, 1) if passes else None)
        rows.append(row)
    steady = ended_within(records, 0.0, phases[0][1] if phases else float("inf"))
    result = {
        "seconds": round(records[-1]["t"] + records[-1]["latency"], 1) if records else 0.0,
        "requests": len(records), "unanswered": sum(1 for r in records if not r["answered"]),
        "wrong": sum(1 for r in records if r["answered"] and not r["right"]),
        "served_from_tier": sum(1 for r in records if r["tier"]),
        "references_stable": references_after == references,
        "reference_changes": [{"prompt": i, "before": references[i], "after": references_after[i]}
                              for i in range(len(references_after)) if references_after[i] != references[i]],
        "unanswered_after": unanswered_after,
        "steady": {"requests": len(steady), "latency_p50_s": round(median, 3),
                   "latency_p99_s": round(percentile(baseline, 0.99) or 0.0, 3),
                   "served_from_tier": sum(1 for r in steady if r["tier"])},
        "faults": rows,
        "memory_mib": {"engine_max": max(m["engine"] for m in memory), "engine_last": memory[-1]["engine"],
                       "lmcache_max": max(m["lmcache"] for m in memory), "lmcache_last": memory[-1]["lmcache"]},
        "load_average": round(os.getloadavg()[0], 2),
    }
    if args.records:
        with open(args.records, "w") as out:
            json.dump({"result": result, "records": records, "phases": [p[:3] for p in phases]}, out, indent=1)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print("LMCache tier under faults: %d requests in %.0f s (one client, %d prompts of ~%d tokens round robin, greedy), "
              "%d unanswered, %d wrong (answer without the tier: cache_salt; references stable: %s), %d served from the tier"
              % (result["requests"], result["seconds"], args.prompts, args.prompt_tokens, result["unanswered"], result["wrong"],
                 result["references_stable"], result["served_from_tier"]))
        print("steady: %d requests, latency p50 %.3f s, p99 %.3f s, %d from the tier"
              % (result["steady"]["requests"], result["steady"]["latency_p50_s"], result["steady"]["latency_p99_s"],
                 result["steady"]["served_from_tier"]))
        print("%-8s %8s %10s %6s %9s %8s %11s %9s  %s" % ("fault", "requests", "unanswered", "wrong", "from tier", "stall s",
                                                          "fault s", "tier back", "connector (s after the fault)"))
        for row in rows:
            print("%-8s %8d %10d %6d %9d %8.2f %11.1f %9s  %s" % (
                row["fault"], row["requests"], row["unanswered"], row["wrong"], row["served_from_tier"], row["stall_s"],
                row["fault_seconds"], "-" if row["tier_back_after_fault_end_s"] is None else "%.1f s" % row["tier_back_after_fault_end_s"],
                ", ".join("%s %+.1f" % item for item in row["connector"]) or "-"))
        for row in rows:
            if row["ports_free_after_s"] is not None:
                print("  %s: the killed server's ports were free %.1f s after its new start was asked for" % (row["fault"], row["ports_free_after_s"]))
            print("  %s: lmcache_check during the fault: %s" % (row["fault"], row["check_during"] or "nothing wrong"))
            print("  %s: after it: %s; finds nothing wrong %s" % (
                row["fault"], row["check_after"][0] if row["check_after"] else "nothing wrong",
                "%.1f s after the fault's end" % row["check_passes_after_fault_end_s"]
                if row["check_passes_after_fault_end_s"] is not None else "not within the watch"))
        if unanswered_after:
            print("  the engine did not answer after the faults (the answers without the tier, %d s request timeout): %s"
                  % (args.timeout, unanswered_after))
        for change in result["reference_changes"]:
            print("  the answer without the tier changed for prompt %d: %r before the traffic, %r after it"
                  % (change["prompt"], change["before"], change["after"]))
        mem = result["memory_mib"]
        print("memory (RSS MiB): engine max %d, last %d; LMCache server max %d, last %d; load average %.2f"
              % (mem["engine_max"], mem["engine_last"], mem["lmcache_max"], mem["lmcache_last"], result["load_average"]))
    return 1 if result["unanswered"] or result["wrong"] or not result["references_stable"] else 0


if __name__ == "__main__":
    sys.exit(main())
