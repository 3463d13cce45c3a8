# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The pieces of benchmarks/bench_lmcache_faults.py that need no engine: it skips without its stack (``make bench`` runs
it) and fails with ``--require``; a fault's row from the requests around it; the connector's log lines read back."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import os
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import bench_lmcache_faults as bench  # noqa: E402  pylint: disable=wrong-import-position,import-error


def test_without_an_engine_it_skips_and_with_require_it_fails():
    script = os.path.join(ROOT, "benchmarks", "bench_lmcache_faults.py")
    url = "http://127.0.0.1:9"
    run = subprocess.run([sys.executable, script, "--url", url], capture_output=True, text=True, check=False, timeout=120)
    assert run.returncode == 0 and run.stdout.startswith("bench_lmcache_faults: skipped: no engine answers at %s" % url), run.stdout
    run = subprocess.run([sys.executable, script, "--url", url, "--require"], capture_output=True, text=True, check=False, timeout=120)
    assert run.returncode == 1 and "skipped: no engine answers" in run.stdout
    run = subprocess.run([sys.executable, script, "--faults", "kill,flood"], capture_output=True, text=True, check=False, timeout=120)
    assert run.returncode == 2 and "unknown fault(s) flood: choose among kill, pause, restart" in run.stderr


def test_prompts_are_distinct_from_their_first_word_on():
    texts = bench.prompts(12, 600, seed=7)
    assert len(set(t.split()[2] for t in texts)) == 12 and all(len(t.split()) >= 500 for t in texts)
    assert bench.prompts(12, 600, seed=7) == texts


def record(t, latency, tier, answered=True, right=True):
    return {"t": t, "latency": latency, "tier": tier, "answered": answered, "right": right}


def test_a_fault_s_row():
    """Requests that ended from the fault on: the stall is the slowest until the tier served again after the fault's end."""
    records = [record(0.0, 0.2, True), record(10.0, 0.2, True),                        # before the fault (at 10.5)
               record(10.4, 11.1, False), record(21.6, 0.3, False, right=False),       # in flight at the fault, stalled; one wrong
               record(22.0, 0.3, False, answered=False),                              # unanswered
               record(40.0, 0.2, False), record(41.0, 0.25, True), record(42.0, 0.2, True),  # fault over at 40.5
               record(99.0, 300.0, False, answered=False)]                            # hung by the next fault (at 100)
    events = [("degraded", 1000.0 + 13.0), ("healthy_again", 1000.0 + 41.2), ("degraded", 1000.0 + 300.0)]
    row = bench.summarize("kill", records, 10.5, 40.5, 0.2, events, 1000.0, 100.0)
    assert row == {"fault": "kill", "requests": 6, "unanswered": 1, "wrong": 1, "served_from_tier": 2, "stall_s": 11.1,
                   "stall_over_median_s": 10.9, "fault_seconds": 30.0, "tier_back_after_fault_end_s": 0.8,
                   "connector": [("degraded", 2.5), ("healthy_again", 30.7)]}


def test_a_request_is_booked_to_the_phase_it_ended_in():
    """The request in flight when a fault begins belongs to that fault: the one the restart hung (sent in the pause's
    last seconds, never answered) was booked to the pause by its start time (the 2026-12-06 run: pause 1 unanswered,
    restart 0 requests)."""
    records = [record(5.0, 0.1, True), record(9.9, 0.5, False),                      # steady; the second ends in the fault
               record(59.9, 300.0, False, answered=False)]                           # sent before the next fault, hung by it
    assert bench.ended_within(records, 0.0, 10.0) == records[:1]
    assert bench.ended_within(records, 10.0, 60.0) == records[1:2]
    assert bench.ended_within(records, 60.0, float("inf")) == records[2:]


def test_the_connector_s_log_lines_are_read_back(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text(
        "\x1b[33;20m[2026-12-05 17:54:03,123] LMCache WARNING:\x1b[0m LMCache server is unhealthy \u2014 entering degraded mode\n"
        "(APIServer pid=1) INFO something else\n"
        "[2026-12-05 17:54:38,737] LMCache WARNING: Finished re-registering KV caches after server recovery\n"
        "[2026-12-05 17:54:38,737] LMCache WARNING: LMCache server is healthy again \u2014 resuming normal operation\n")
    start = time.mktime(time.strptime("2026-12-05 17:54:00", "%Y-%m-%d %H:%M:%S"))
    found = bench.connector_events(str(log), start)
    expected = [("degraded", 3.123), ("reregistered", 38.737), ("healthy_again", 38.737)]
    assert [(what, round(at - start, 3)) for what, at in found] == expected
    assert bench.connector_events(str(log), start + 60) == [] and bench.connector_events(str(tmp_path / "none"), 0) == []


def test_an_engine_that_stops_answering_after_the_faults_is_reported_not_raised():
    """The answers without the tier after the traffic: all of them, or those before the first request the engine does
    not answer and its error (one timeout, not one per prompt)."""
    asked = []

    def complete(text, salt=None):
        asked.append((text, salt))
        if text == "b":
            raise bench.http.OpenAIHTTPError("Cannot reach http://127.0.0.1:8000/v1/completions: timed out")
        return text.upper()
    assert bench.answers_after(complete, ["a", "c"], "s") == (["A", "C"], None)
    assert asked == [("a", "s-after-0"), ("c", "s-after-1")]
    del asked[:]
    answers, error = bench.answers_after(complete, ["a", "b", "c"], "s")
    assert answers == ["A"] and error == "Cannot reach http://127.0.0.1:8000/v1/completions: timed out"
    assert [text for text, _salt in asked] == ["a", "b"]
