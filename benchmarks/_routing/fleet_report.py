# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The fleet study's folder: every run as JSON lines, the summary, report.md (a table per workload, the referee's limit
beside each policy, TTFT p90 at each step of the ramp) and the two plots (``plots``). Deterministic: the same rows give
the same files.
"""

from __future__ import absolute_import, division, print_function

import json
import os

from . import plots

DASH = "\u2013"
METRICS = ("hit_rate", "counter_hit_rate", "ttft_ms_p50", "ttft_ms_p90", "throughput_rps", "cached_per_request")


def _stats(values):
    values = [v for v in values if v is not None]
    if not values:
        return {"mean": None, "min": None, "max": None}
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values)}


def summarize(rows):
    """One entry per (workload, policy), in first-seen order: runs, requests, failures, each metric's mean/min/max over the
    seeds, the referee's mean hit rate of that workload and this policy's share of it, and TTFT p90 per ramp step."""
    groups = {}
    for row in rows:
        groups.setdefault((row["workload"], row["policy"]), []).append(row)
    limits = dict((workload, _stats([r["hit_rate"] for r in members])["mean"])
                  for (workload, policy), members in groups.items() if policy == "referee")
    out = []
    for (workload, policy), members in groups.items():
        entry = {"workload": workload, "policy": policy, "router": members[0].get("router"), "runs": len(members),
                 "requests": sum(r["requests"] for r in members), "failed": sum(r["failed"] for r in members),
                 "demand": members[0].get("demand"), "groups": members[0].get("groups")}
        for metric in METRICS:
            entry[metric] = _stats([r.get(metric) for r in members])
        limit = limits.get(workload)
        entry["referee_hit_rate"] = limit
        entry["share_of_limit"] = (entry["hit_rate"]["mean"] / limit) if limit and entry["hit_rate"]["mean"] is not None else None
        steps = members[0].get("steps") or []
        entry["steps"] = [{"qps": steps[i]["qps"],
                           "ttft_ms_p90": _stats([r["steps"][i]["ttft_ms_p90"] for r in members if i < len(r["steps"])]),
                           "hit_rate": _stats([r["steps"][i]["hit_rate"] for r in members if i < len(r["steps"])])}
                          for i in range(len(steps))]
        out.append(entry)
    return out


def _fmt(value, digits=1, percent=False):
    if value is None:
        return "n/a"
    return "%.*f%s" % (digits, 100 * value if percent else value, "%" if percent else "")


def _spread(stats, digits=1, percent=False):
    if stats["mean"] is None:
        return "n/a"
    return "%s (%s%s%s)" % (_fmt(stats["mean"], digits, percent), _fmt(stats["min"], digits, percent).rstrip("%"), DASH,
                            _fmt(stats["max"], digits, percent).rstrip("%"))


def markdown(summary, title, notes=()):
    lines = ["# %s" % title, ""]
    for workload in dict.fromkeys(e["workload"] for e in summary):
        mine = [e for e in summary if e["workload"] == workload]
        lines += ["## %s" % workload, "",
                  "KV demand %s of the fleet's blocks (%s prefix groups)." % (_fmt(mine[0]["demand"], 0, True), mine[0]["groups"]), "",
                  "| Policy | Router | Hit rate mean (min%smax) | Of the referee's limit | TTFT p50 ms | TTFT p90 ms mean (min%smax) | "
                  "Throughput req/s | Failed | Runs |" % (DASH, DASH),
                  "|---|---|---|---|---|---|---|---|---|"]
        for e in mine:
            lines.append("| %s | %s | %s | %s | %s | %s | %s | %d/%d | %d |" % (
                e["policy"], e["router"], _spread(e["hit_rate"], percent=True), _fmt(e["share_of_limit"], 0, True),
                _fmt(e["ttft_ms_p50"]["mean"], 0), _spread(e["ttft_ms_p90"], 0), _fmt(e["throughput_rps"]["mean"], 2),
                e["failed"], e["requests"], e["runs"]))
        qps = [s["qps"] for s in mine[0]["steps"]]
        if qps:
            lines += ["", "TTFT p90 (ms, mean over the runs) at each step of the load ramp:", "",
                      "| Policy | %s |" % " | ".join("%s req/s" % q for q in qps), "|---|%s" % ("---|" * len(qps))]
            for e in mine:
                lines.append("| %s | %s |" % (e["policy"], " | ".join(_fmt(s["ttft_ms_p90"]["mean"], 0) for s in e["steps"])))
        lines.append("")
    lines += ["- %s" % note for note in notes]
    return "\n".join(lines) + "\n"


def write(folder, rows, title, notes=()):
    """Write the study folder; return the paths written, by name."""
    os.makedirs(folder, exist_ok=True)
    summary = summarize(rows)
    paths = dict((name, os.path.join(folder, name)) for name in ("runs.jsonl", "summary.json", "report.md", "ttft_p90_load.svg",
                                                                 "hit_rate_limit.svg"))
    with open(paths["runs.jsonl"], "w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, sort_keys=True) + "\n")
    with open(paths["summary.json"], "w", encoding="utf-8") as out:
        out.write(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    with open(paths["report.md"], "w", encoding="utf-8") as out:
        out.write(markdown(summary, title, notes) + "\n![TTFT p90 against load](ttft_p90_load.svg)\n\n"
                  "![Hit rate against the referee's limit](hit_rate_limit.svg)\n")
    plots.ttft_against_load(rows, paths["ttft_p90_load.svg"])
    plots.hit_rate_against_limit(rows, paths["hit_rate_limit.svg"])
    return paths
