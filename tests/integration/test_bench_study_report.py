# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""benchmarks/_study_report.py: a routing study's rows summarized, as markdown tables, SVG bar charts and a folder."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json
import os
import sys
import xml.etree.ElementTree as ET

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"))
import _study_report  # noqa: E402  pylint: disable=wrong-import-position,import-error

SVG = "{http://www.w3.org/2000/svg}"


def _run(workload, policy, seed, hit_rate, ttft, held=30, requests=40, failed=0, router="stand-in", **extra):
    run = {"workload": workload, "policy": policy, "router": router, "seed": seed, "hit_rate": hit_rate,
           "cached_per_request": None if hit_rate is None else hit_rate * 1000, "prompt_tokens_per_request": 1000.0,
           "ttft_ms_p50": ttft, "ttft_ms_p90": None if ttft is None else ttft * 2, "held_longest": held,
           "requests": requests, "failed": failed, "steps_with_a_cached_prefix": 20, "held_longest_of_those": 15}
    run.update(extra)
    return run


@pytest.fixture(name="runs")
def _runs():
    return [
        _run("shared-prefix", "precise", 0, 0.587, 40.0, held=36),
        _run("shared-prefix", "precise", 1, None, 50.0, held=30, failed=10),
        _run("shared-prefix", "precise", 2, 0.643, None, held=0, requests=0),
        _run("shared-prefix", "random", 0, 0.25, 80.0, held=10),
        _run("shared-prefix", "epp:precise", 0, 0.5, 45.0, router="EPP", extra_key=[1, 2]),
        _run("multi-turn", "random", 0, 0.3, 70.0),
        _run("multi-turn", "precise", 0, 0.6, None),
    ]


def _row(summary, workload, policy):
    return [r for r in summary if r["workload"] == workload and r["policy"] == policy][0]


def test_summary_over_seeds_skips_none(runs):
    summary = _study_report.summarize(runs)
    assert [(r["workload"], r["policy"]) for r in summary] == [
        ("shared-prefix", "precise"), ("shared-prefix", "random"), ("shared-prefix", "epp:precise"),
        ("multi-turn", "random"), ("multi-turn", "precise")]
    row = _row(summary, "shared-prefix", "precise")
    assert row["n"] == 3 and row["router"] == "stand-in"
    assert row["requests"] == 80 and row["failed"] == 10
    assert row["hit_rate"]["mean"] == pytest.approx(0.615)
    assert row["hit_rate"]["min"] == pytest.approx(0.587) and row["hit_rate"]["max"] == pytest.approx(0.643)
    assert row["ttft_ms_p50"] == {"mean": pytest.approx(45.0), "min": 40.0, "max": 50.0}
    assert row["ttft_ms_p90"]["max"] == pytest.approx(100.0)
    assert row["cached_per_request"]["mean"] == pytest.approx(615.0)
    assert _row(summary, "multi-turn", "precise")["ttft_ms_p50"] == {"mean": None, "min": None, "max": None}
    assert _row(summary, "shared-prefix", "epp:precise")["router"] == "EPP"


def test_held_longest_share(runs):
    summary = _study_report.summarize(runs)
    share = _row(summary, "shared-prefix", "precise")["held_longest_share"]
    # 36/40 and 30/(40-10); the run with no requests has no share
    assert share["min"] == pytest.approx(0.9) and share["max"] == pytest.approx(1.0)
    assert share["mean"] == pytest.approx(0.95)
    assert _study_report.held_longest_share({"held_longest": 3, "requests": 5, "failed": 5}) is None
    assert _study_report.held_longest_share({"held_longest": 3, "requests": 12, "failed": 0}) == pytest.approx(0.25)


def test_markdown_tables(runs):
    runs = [r for r in runs if r["seed"] != 1 or r["policy"] != "precise"]
    runs[0]["hit_rate"], runs[1]["hit_rate"] = 0.587, 0.643
    text = _study_report.markdown(_study_report.summarize(runs), "Routing study", notes=("one note", "two"))
    lines = text.splitlines()
    assert lines[0] == "# Routing study"
    assert "## shared-prefix" in lines and "## multi-turn" in lines
    headers = [line for line in lines if line.startswith("| Policy |")]
    assert len(headers) == 2
    assert headers[0] == ("| Policy | Router | Hit rate mean (min\u2013max) | Cached tokens / request | "
                          "Held the longest cached prefix | TTFT p50 ms mean (min\u2013max) | TTFT p90 ms | Runs | Failed |")
    precise = [line for line in lines if line.startswith("| precise |")]
    assert len(precise) == 2
    assert "| 61.5% (58.7\u201364.3) |" in precise[0]
    assert "| 90.0% |" in precise[0]  # held the longest: 36 of 40
    assert "| 615.0 |" in precise[0] and "| n/a |" in precise[1]  # multi-turn precise has no TTFT
    assert "| 40.0 (40.0\u201340.0) |" in precise[0]
    assert precise[0].endswith("| 2 | 0 |")
    assert "| 60.0% (60.0\u201360.0) |" in precise[1]
    assert "| epp:precise | EPP | 50.0% (50.0\u201350.0) |" in text
    # the multi-turn table comes after the shared-prefix one and holds its own rows
    assert text.index("## multi-turn") < text.index(precise[1])
    assert lines[-2:] == ["- one note", "- two"] and text.endswith("- two\n")


def test_markdown_percent_format():
    runs = [_run("w", "p", s, h, 10.0) for s, h in enumerate((0.587, 0.6, 0.643))]
    assert "61.0% (58.7\u201364.3)" in _study_report.markdown(_study_report.summarize(runs), "t")


def _bars(path):
    """The bars of a summary plot, by the id each is drawn with ("bar <workload> <policy>")."""
    root = ET.parse(str(path)).getroot()
    return sorted(g.get("id") for g in root.iter(SVG + "g") if (g.get("id") or "").startswith("bar "))


def test_summary_bars_are_matplotlib_svg_and_deterministic(tmp_path, runs):
    summary = _study_report.summarize(runs)
    first, again = tmp_path / "a.svg", tmp_path / "b.svg"
    _study_report.plots.summary_bars(summary, "ttft_ms_p50", str(first), "TTFT <p50> & co", "ms")
    _study_report.plots.summary_bars(summary, "ttft_ms_p50", str(again), "TTFT <p50> & co", "ms")
    text = first.read_text()
    assert text == again.read_text(), "the same rows give the same bytes"
    root = ET.fromstring(text.encode("utf-8"))
    assert root.tag == SVG + "svg" and "matplotlib" in text
    assert "TTFT &lt;p50&gt; &amp; co" in text and "precise" in text and "epp:precise" in text
    # five (workload, policy) rows, four of them with a TTFT p50: four bars
    assert len(_bars(first)) == 4 and "bar shared-prefix precise" in _bars(first)


def test_summary_bars_without_values_draw_no_bar(tmp_path):
    runs = [_run("w", "p", 0, None, None)]
    path = tmp_path / "none.svg"
    _study_report.plots.summary_bars(_study_report.summarize(runs), "hit_rate", str(path), "t", "", percent=True)
    assert _bars(path) == []


def test_write(tmp_path, runs):
    folder = str(tmp_path / "report")
    paths = _study_report.write(folder, runs, "Routing study", notes=("a note",))
    names = ("runs.jsonl", "summary.json", "report.md", "hit_rate.svg", "ttft_p50.svg")
    assert sorted(os.path.basename(p) for p in paths.values()) == sorted(names)
    for name in names:
        assert os.path.isfile(os.path.join(folder, name))
    with open(os.path.join(folder, "runs.jsonl"), encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    assert [json.loads(line) for line in lines] == runs
    assert lines[0] == json.dumps(runs[0], sort_keys=True)
    with open(os.path.join(folder, "summary.json"), encoding="utf-8") as handle:
        assert json.load(handle) == json.loads(json.dumps(_study_report.summarize(runs)))
    with open(os.path.join(folder, "report.md"), encoding="utf-8") as handle:
        report = handle.read()
    assert report.startswith("# Routing study\n") and "- a note" in report
    assert "(hit_rate.svg)" in report and "(ttft_p50.svg)" in report
    for name in ("hit_rate.svg", "ttft_p50.svg"):
        ET.parse(os.path.join(folder, name))
