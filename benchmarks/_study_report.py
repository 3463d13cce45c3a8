# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A routing study's rows, one per (workload, policy, seed), turned into a report folder.

``write(folder, runs, title)`` writes runs.jsonl (the rows as given), summary.json (``summarize``: mean, min and max
over the seeds of each (workload, policy)), report.md (``markdown``: one table per workload) and two bar charts,
hit_rate.svg and ttft_p50.svg, drawn by the benchmarks' one plotting path (``_routing/plots.py``, matplotlib, deterministic
SVG): the same rows give the same files.
"""

from __future__ import absolute_import, division, print_function

import json
import os

from _routing import plots

METRICS = ("hit_rate", "cached_per_request", "ttft_ms_p50", "ttft_ms_p90", "held_longest_share")

DASH = "\u2013"  # en dash, between a min and a max


def held_longest_share(run):
    """The share of a run's answered requests routed to the engine that held the longest cached prefix, or None."""
    answered = (run.get("requests") or 0) - (run.get("failed") or 0)
    if answered <= 0 or run.get("held_longest") is None:
        return None
    return run["held_longest"] / answered


def _stats(values):
    """{"mean", "min", "max"} of the values that are not None; all three None when there are none."""
    values = [v for v in values if v is not None]
    if not values:
        return {"mean": None, "min": None, "max": None}
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values)}


def summarize(runs):
    """One row per (workload, policy), in first-seen order: n, failed and requests summed, each metric's stats."""
    groups = {}
    for run in runs:
        groups.setdefault((run["workload"], run["policy"]), []).append(run)
    summary = []
    for (workload, policy), members in groups.items():
        row = {"workload": workload, "policy": policy, "router": members[0].get("router"), "n": len(members),
               "failed": sum(r.get("failed") or 0 for r in members),
               "requests": sum(r.get("requests") or 0 for r in members)}
        for metric in METRICS:
            if metric == "held_longest_share":
                values = [held_longest_share(r) for r in members]
            else:
                values = [r.get(metric) for r in members]
            row[metric] = _stats(values)
        summary.append(row)
    return summary


def _workloads(summary):
    """The workloads, in first-seen order."""
    return list(dict.fromkeys(row["workload"] for row in summary))


def _policies(summary):
    """The policies, in first-seen order."""
    return list(dict.fromkeys(row["policy"] for row in summary))


def _fmt(value, percent=False, digits=1):
    """A number with the given digits (times 100 when percent), or n/a."""
    if value is None:
        return "n/a"
    return "%.*f" % (digits, value * 100 if percent else value)


def _pct(value):
    """A share as a percentage with one decimal, e.g. '61.0%', or n/a."""
    return "n/a" if value is None else _fmt(value, percent=True) + "%"


def _with_range(stats, percent=False):
    """'mean (min–max)', e.g. '61.0% (58.7–64.3)', or n/a."""
    if stats["mean"] is None:
        return "n/a"
    return "%s%s (%s%s%s)" % (_fmt(stats["mean"], percent), "%" if percent else "", _fmt(stats["min"], percent),
                              DASH, _fmt(stats["max"], percent))


def _cell(text):
    """Text safe in a markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(summary, title, notes=()):
    """The summary as markdown: the title, one table per workload, then the notes as bullets."""
    header = ("Policy", "Router", "Hit rate mean (min%smax)" % DASH, "Cached tokens / request",
              "Held the longest cached prefix", "TTFT p50 ms mean (min%smax)" % DASH, "TTFT p90 ms", "Runs", "Failed")
    lines = ["# %s" % title, ""]
    for workload in _workloads(summary):
        lines += ["## %s" % _cell(workload), "", "| %s |" % " | ".join(header), "|%s" % ("---|" * len(header))]
        for row in summary:
            if row["workload"] != workload:
                continue
            cells = (row["policy"], row["router"], _with_range(row["hit_rate"], percent=True),
                     _fmt(row["cached_per_request"]["mean"]), _pct(row["held_longest_share"]["mean"]),
                     _with_range(row["ttft_ms_p50"]), _fmt(row["ttft_ms_p90"]["mean"]), row["n"], row["failed"])
            lines.append("| %s |" % " | ".join(_cell(c) for c in cells))
        lines.append("")
    if notes:
        lines += ["- %s" % note for note in notes] + [""]
    return "\n".join(lines)


def write(folder, runs, title, notes=()):
    """Write the report folder; return the paths written, by name."""
    os.makedirs(folder, exist_ok=True)
    summary = summarize(runs)
    paths = {name: os.path.join(folder, name)
             for name in ("runs.jsonl", "summary.json", "report.md", "hit_rate.svg", "ttft_p50.svg")}
    contents = {
        "runs.jsonl": "".join(json.dumps(run, sort_keys=True) + "\n" for run in runs),
        "summary.json": json.dumps(summary, indent=2, sort_keys=True) + "\n",
        "report.md": markdown(summary, title, notes)
        + "\n![Hit rate](hit_rate.svg)\n\n![TTFT p50](ttft_p50.svg)\n",
    }
    for name, text in contents.items():
        with open(paths[name], "w", encoding="utf-8") as handle:
            handle.write(text)
    plots.summary_bars(summary, "hit_rate", paths["hit_rate.svg"], "%s: prefix-cache hit rate" % title, "hit rate", percent=True)
    plots.summary_bars(summary, "ttft_ms_p50", paths["ttft_p50.svg"], "%s: TTFT p50" % title, "ms")
    return paths
