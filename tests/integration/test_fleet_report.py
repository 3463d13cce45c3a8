# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""benchmarks/fleet/report.py: the metrics of a step from its records and samples, the sustained rate, the summary over
the seeds, the tables, and the plots (SVG, the same bytes for the same rows)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import os
import sys
import xml.etree.ElementTree as ET

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from fleet import report, workload  # noqa: E402  pylint: disable=wrong-import-position

NAMES = ["e0", "e1", "e2"]


def _rec(step, engine, ttft, cached=100, status=200, group=0, queue=0.01, prompt=200, bound=150, best=3, picked=3):
    rec = {"i": 0, "step": step, "engine": engine, "ttft": ttft, "status": status, "prompt_tokens": prompt, "bound": bound,
           "group": group, "queue": queue, "truth_best": best, "truth_picked": picked, "pick_ms": 1.0}
    if status == 200:
        rec["cached"] = cached
    else:
        rec["error"] = "HTTP %d: busy" % status
    return rec


def test_a_steps_metrics_come_from_its_records_and_samples():
    records = [_rec(0, "e0", 0.1 * (i + 1), group=i % 2, queue=0.001 * i) for i in range(9)] + [
        _rec(0, "e1", 2.0, cached=0, group=5, picked=0), _rec(0, "e1", 0.0, status=429)]
    samples = [{"t": 10.0 + 0.1 * i, "waiting": [i % 3, 0, 1], "running": [4, 1, 0]} for i in range(10)]
    gauges = [{"t": 10.5, "waiting": [1, 0, None], "running": [4, 1, None], "usage": [0.1, 0.0, None]}]
    step = report.step_metrics(records, samples, gauges, NAMES, 4.0, 10.0, (10.0, 20.0), 1.0)
    assert step["requests"] == 11 and step["ok"] == 10 and step["http_429"] == 1 and step["http_500"] == 0 and step["failed"] == 1
    assert step["hit_rate"] == pytest.approx(900 / 2000.0) and step["bound"] == pytest.approx(0.75)
    assert step["ttft_ms"]["p50"] == pytest.approx(550.0) and step["ttft_ms"]["p90"] == pytest.approx(1010.0)
    assert step["ttft_ms"]["p99"] == pytest.approx(1901.0)
    assert step["queue_ms"]["max"] == pytest.approx(10.0) and step["queue_ms"]["mean"] == pytest.approx(4.6)
    assert step["requests_per_engine"] == [9, 2, 0] and step["groups_per_engine"] == [2, 2, 0]
    assert step["goodput_rps"] == pytest.approx(0.9) and step["within_target"] == pytest.approx(9 / 11.0, abs=1e-4)
    assert step["waiting"]["max"] == 2 and step["waiting"]["mean"] == pytest.approx((sum(i % 3 for i in range(10)) + 10) / 30.0, abs=1e-3)
    assert step["waiting_reported"]["mean"] == 0.5
    assert step["held_best"] == pytest.approx(10 / 11.0, abs=1e-4)   # every pick but the one of no cached block


def _step(rate, p90, requests=100, failed=0):
    return {"rate": rate, "ttft_ms": {"p90": p90}, "requests": requests, "failed": failed}


def test_the_sustained_rate_is_the_last_step_of_an_unbroken_run_within_the_target():
    assert report.sustained([_step(4, 300), _step(8, 900), _step(12, 1200), _step(16, 800)], 1000.0) == 8
    assert report.sustained([_step(4, 1300), _step(8, 900)], 1000.0) == 0.0
    assert report.sustained([_step(4, 300), _step(8, 300, failed=2)], 1000.0) == 4   # more than 1% failed
    assert report.sustained([_step(4, 300), _step(8, 300, failed=1)], 1000.0) == 8


def _row(policy, seed, p90s, hit=0.5, per_engine=(10, 5, 0)):
    spec = workload.spec_of(engines=3, ramp=(4.0, 8.0, 12.0), step_seconds=10.0)
    records = []
    for step, p90 in enumerate(p90s):
        for i in range(10):
            records.append(_rec(step, NAMES[i % 2], p90 / 1000.0 * (i + 1) / 9.0, cached=int(200 * hit), group=i))
    records.append(_rec(-1, "e2", 0.1))   # the warm-up: not measured
    row = report.row(policy, "stand-in", seed, spec, NAMES, records, [], [], {"ramp_start": 0.0}, 1.0)
    return row


def test_rows_the_summary_and_the_tables():
    rows = [_row("random", 0, (500, 1500, 3000), 0.1), _row("random", 1, (600, 900, 2000), 0.12),
            _row("precise", 0, (100, 200, 300), 0.8), _row("precise", 1, (100, 250, 400), 0.82)]
    assert [r["sustained_rps"] for r in rows] == [4.0, 8.0, 12.0, 12.0]
    assert rows[0]["idle_engines"] == 1 and rows[0]["ramp_total"]["requests"] == 30   # the warm-up's request is not counted
    summary = report.summarize(rows)
    random_entry = summary[0]
    assert random_entry["sustained"] == {"mean": 6.0, "min": 4.0, "max": 8.0} and random_entry["sustained_by_seed"] == [4.0, 8.0]
    assert random_entry["steps"][2]["ttft_p90"]["max"] == pytest.approx(3000.0 * 9.1 / 9, abs=0.1)   # p90 of 10 values
    assert report.headline_rates(summary) == [4.0, 8.0, 12.0]
    text = report.markdown(summary, rows, notes=("a note",))
    assert "| random | stand-in | 6.0 (4, 8) | 11.0% (10.0\u201312.0) |" in text
    assert "| Policy | Seed | Requests per engine (min / median / max) | Idle engines |" in text and "| random | 0 | 0 / 15 / 15 | 1 |" in text
    assert text.rstrip().endswith("- a note")


def test_the_plots_are_svg_and_the_same_rows_give_the_same_bytes(tmp_path):
    rows = [_row("random", 0, (500, 1500, 3000)), _row("precise", 0, (100, 200, 300), 0.8)]
    first = report.write(str(tmp_path / "one"), rows)
    second = report.write(str(tmp_path / "two"), rows)
    for name in ("ttft_p90.svg", "ttft_p99.svg", "hit_rate.svg", "requests_per_engine.svg"):
        with open(first[name], "rb") as one, open(second[name], "rb") as two:
            data = one.read()
            assert data == two.read(), name
        root = ET.fromstring(data)
        assert root.tag.endswith("svg") and b"<dc:date>" not in data
        assert "precise" in "".join(t.text or "" for t in root.iter() if t.tag.endswith("text"))
    assert report.read_rows(first["runs.jsonl"]) == rows
