# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A routing study's rows, one per (workload, policy, seed), turned into a report folder.

``write(folder, runs, title)`` writes runs.jsonl (the rows as given), summary.json (``summarize``: mean, min and max
over the seeds of each (workload, policy)), report.md (``markdown``: one table per workload) and two bar charts,
hit_rate.svg and ttft_p50.svg (``svg_bars``: plain SVG, no plotting library). Standard library only, and deterministic:
the same rows give the same files.
"""

from __future__ import absolute_import, division, print_function

import json
import os
from xml.sax.saxutils import escape

METRICS = ("hit_rate", "cached_per_request", "ttft_ms_p50", "ttft_ms_p90", "held_longest_share")

# One colour per policy, in first-seen order (a colour-blind-safe palette, then greys).
COLOURS = ("#4477aa", "#ee6677", "#228833", "#ccbb44", "#66ccee", "#aa3377", "#bbbbbb", "#555555", "#999933",
           "#882255")

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


def _x(text):
    """Text escaped for XML content and attribute values."""
    return escape(str(text), {'"': "&quot;"})


def _nice_top(value):
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is at least value (1 when value is not positive)."""
    if value <= 0:
        return 1.0
    power = 1.0
    while power * 10 < value:
        power *= 10
    while power > value:
        power /= 10
    for step in (1, 2, 2.5, 5, 10):
        if power * step >= value:
            return power * step
    return power * 10


def _tick(value):
    """A number without trailing zeros."""
    return "%.6g" % value


def svg_bars(summary, metric, title, unit, percent=False):
    """A standalone SVG grouped bar chart of one metric: a group per workload, a bar per policy (the mean, with a
    min-max error bar), a y axis with 5 ticks and a legend. A missing value leaves its slot empty."""
    workloads, policies = _workloads(summary), _policies(summary)
    cells = {(row["workload"], row["policy"]): row.get(metric) or {} for row in summary}
    scale = 100.0 if percent else 1.0

    def value(stats, key):
        return None if stats.get(key) is None else stats[key] * scale

    highest = max([value(s, k) for s in cells.values() for k in ("mean", "max") if value(s, k) is not None] or [0])
    top = _nice_top(highest)

    bar_w, group_gap, left, top_m, bottom_m, plot_h = 20, 40, 70, 50, 50, 320
    group_w = bar_w * len(policies)
    plot_w = max(len(workloads) * (group_w + group_gap), 200)
    legend_x = left + plot_w + 20
    legend_w = 30 + 7 * max([len(str(p)) for p in policies] or [0])
    width = legend_x + legend_w + 10
    height = max(top_m + plot_h + bottom_m, top_m + 18 * len(policies) + 20)
    base = top_m + plot_h

    def y_of(v):
        return base - plot_h * v / top

    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           '<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
           'font-family="sans-serif" font-size="12">' % (width, height, width, height),
           '<text x="%.1f" y="25" text-anchor="middle" font-size="15" font-weight="bold">%s</text>'
           % (width / 2, _x(title))]
    for i in range(5):
        tick = top * i / 4
        y = y_of(tick)
        out.append('<line class="grid" x1="%d" y1="%.2f" x2="%d" y2="%.2f" stroke="#dddddd"/>'
                   % (left, y, left + plot_w, y))
        out.append('<text class="tick" x="%d" y="%.2f" text-anchor="end">%s%s</text>'
                   % (left - 6, y + 4, _tick(tick), "%" if percent else ""))
    out.append('<line class="axis" x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (left, top_m, left, base))
    out.append('<line class="axis" x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (left, base, left + plot_w, base))
    if unit:
        out.append('<text class="unit" x="18" y="%.1f" text-anchor="middle" transform="rotate(-90 18 %.1f)">%s</text>'
                   % (top_m + plot_h / 2, top_m + plot_h / 2, _x(unit)))
    for g, workload in enumerate(workloads):
        x0 = left + group_gap / 2 + g * (group_w + group_gap)
        out.append('<text class="group" x="%.2f" y="%d" text-anchor="middle">%s</text>'
                   % (x0 + group_w / 2, base + 20, _x(workload)))
        for p, policy in enumerate(policies):
            stats = cells.get((workload, policy), {})
            mean = value(stats, "mean")
            if mean is None:
                continue
            x = x0 + p * bar_w
            label = "%s, %s: %s" % (policy, workload, _tick(round(mean, 3)))
            out.append('<rect class="bar" x="%.2f" y="%.2f" width="%d" height="%.4f" fill="%s">'
                       '<title>%s</title></rect>'
                       % (x + 1, y_of(mean), bar_w - 2, plot_h * mean / top, COLOURS[p % len(COLOURS)], _x(label)))
            low, high = value(stats, "min"), value(stats, "max")
            if low is not None and high is not None:
                cx = x + bar_w / 2
                out.append('<line class="error-bar" x1="%.2f" y1="%.2f" x2="%.2f" y2="%.2f" stroke="black" '
                           'stroke-width="1"/>' % (cx, y_of(low), cx, y_of(high)))
                for v in (low, high):
                    out.append('<line class="error-cap" x1="%.2f" y1="%.2f" x2="%.2f" y2="%.2f" stroke="black" '
                               'stroke-width="1"/>' % (cx - 4, y_of(v), cx + 4, y_of(v)))
    for p, policy in enumerate(policies):
        y = top_m + 18 * p
        out.append('<rect class="legend-swatch" x="%d" y="%d" width="12" height="12" fill="%s"/>'
                   % (legend_x, y, COLOURS[p % len(COLOURS)]))
        out.append('<text class="legend" x="%d" y="%d">%s</text>' % (legend_x + 18, y + 10, _x(policy)))
    out.append("</svg>")
    return "\n".join(out) + "\n"


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
        "hit_rate.svg": svg_bars(summary, "hit_rate", "%s: prefix-cache hit rate" % title, "hit rate", percent=True),
        "ttft_p50.svg": svg_bars(summary, "ttft_ms_p50", "%s: TTFT p50" % title, "ms"),
    }
    for name, path in paths.items():
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(contents[name])
    return paths
