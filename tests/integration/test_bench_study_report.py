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


def _bars(root):
    return [e for e in root.iter(SVG + "rect") if e.get("class") == "bar"]


def test_svg_bars(runs):
    summary = _study_report.summarize(runs)
    text = _study_report.svg_bars(summary, "ttft_ms_p50", "TTFT <p50> & co", "ms")
    root = ET.fromstring(text.encode("utf-8"))
    assert root.tag == SVG + "svg"
    bars = _bars(root)
    # five (workload, policy) rows, one of them without a TTFT p50
    assert len(bars) == 4
    heights = {b.find(SVG + "title").text.split(":")[0]: float(b.get("height")) for b in bars}
    assert heights["precise, shared-prefix"] / heights["random, shared-prefix"] == pytest.approx(45.0 / 80.0, rel=1e-3)
    assert heights["random, multi-turn"] / heights["random, shared-prefix"] == pytest.approx(70.0 / 80.0, rel=1e-3)
    # bars stand on the same base line
    assert len({round(float(b.get("y")) + float(b.get("height")), 2) for b in bars}) == 1
    errors = [e for e in root.iter(SVG + "line") if e.get("class") == "error-bar"]
    assert len(errors) == 4
    precise = [b for b in bars if b.find(SVG + "title").text.startswith("precise, shared-prefix")][0]
    centre = float(precise.get("x")) + float(precise.get("width")) / 2
    spans = [e for e in errors if abs(float(e.get("x1")) - centre) < 0.01]
    assert len(spans) == 1 and float(spans[0].get("y1")) > float(spans[0].get("y2"))  # min below max
    texts = [t.text for t in root.iter(SVG + "text")]
    assert "TTFT <p50> & co" in texts
    legend = [t.text for t in root.iter(SVG + "text") if t.get("class") == "legend"]
    assert legend == ["precise", "random", "epp:precise"]
    assert [t.text for t in root.iter(SVG + "text") if t.get("class") == "group"] == ["shared-prefix", "multi-turn"]
    assert len([t for t in root.iter(SVG + "text") if t.get("class") == "tick"]) == 5
    # the same policy has the same colour in every group
    colours = {}
    for b in bars:
        colours.setdefault(b.find(SVG + "title").text.split(",")[0], set()).add(b.get("fill"))
    assert all(len(c) == 1 for c in colours.values()) and len(set().union(*colours.values())) == 3
    assert text == _study_report.svg_bars(summary, "ttft_ms_p50", "TTFT <p50> & co", "ms")


def test_svg_percent_and_escaping():
    runs = [_run("w<1>", "a<b", 0, 0.4, 1.0), _run("w<1>", "plain", 0, 0.8, 1.0), _run("w2", "a<b", 0, None, 1.0)]
    text = _study_report.svg_bars(_study_report.summarize(runs), "hit_rate", "Hit rate", "hit rate", percent=True)
    assert "a<b" not in text and "a&lt;b" in text and "w&lt;1&gt;" in text
    root = ET.fromstring(text.encode("utf-8"))
    bars = _bars(root)
    assert len(bars) == 2
    assert float(bars[1].get("height")) / float(bars[0].get("height")) == pytest.approx(2.0, rel=1e-3)
    assert [t.text for t in root.iter(SVG + "text") if t.get("class") == "legend"] == ["a<b", "plain"]
    ticks = [t.text for t in root.iter(SVG + "text") if t.get("class") == "tick"]
    assert ticks[0] == "0%" and ticks[-1] == "100%"


def test_svg_no_values():
    runs = [_run("w", "p", 0, None, None)]
    root = ET.fromstring(_study_report.svg_bars(_study_report.summarize(runs), "hit_rate", "t", "", percent=True))
    assert not _bars(root)


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
