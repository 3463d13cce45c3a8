# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What the routing bench prints and writes: a table per workload, a line per configuration, the study folder.

``report(args, bench, rows, engines, started, lane, left_out)``: the records as JSON lines (``--records``), then either
one JSON object per configuration (``--json``) or the header, the routers, a table per workload (``table``), a line per
configuration and the notes; with more than one workload or seed (or ``--report``) the study folder
(``benchmarks/_study_report.py``: runs, summary, report.md, plots).
"""

from __future__ import absolute_import, division, print_function

import json
import os
import time

import _study_report as study_report

from .policies import POLICIES, SPECULATIVE_TTL
from .workloads import WORKLOAD_NOTES


def fmt(value, pattern="%s"):
    return "-" if value is None else pattern % value


def table(rows):
    lines = [
        "| Policy | Router | Seed | Hit rate (engine counters) | Cached tokens / request | Chose the longest cached prefix | "
        "TTFT p50 / p90 (ms) | Failed | Requests per engine | Evicted blocks |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append("| %s | %s | %s | %s (%d/%d tokens) | %s of %s | %d/%d (%d/%d with a cached prefix somewhere) | %s / %s | %d/%d | %s | %s |" % (
            r["policy"], r.get("router", "-"), r.get("seed"), fmt(None if r["hit_rate"] is None else 100.0 * r["hit_rate"], "%.1f%%"), r["counter_hits"],
            r["counter_queries"], fmt(r["cached_per_request"]), fmt(r["prompt_tokens_per_request"]), r["held_longest"],
            r["requests"] - r["failed"], r["held_longest_of_those"], r["steps_with_a_cached_prefix"], fmt(r["ttft_ms_p50"]),
            fmt(r["ttft_ms_p90"]), r["failed"], r["requests"],
            " ".join("%s %d" % kv for kv in sorted(r["requests_per_engine"].items())),
            " ".join("%s %d" % kv for kv in sorted(r["evicted_blocks_per_engine"].items()))))
    return lines


def write_records(path, rows):
    """Every request of every configuration as JSON lines, tagged with its policy, workload and seed."""
    with open(path, "w", encoding="utf-8") as out:
        for row in rows:
            for rec in row["records"]:
                out.write(json.dumps(dict(rec, policy=row["policy"], workload=row["workload"], seed=row["seed"]), sort_keys=True) + "\n")


def heading(args, bench, rows, engines, started):
    return ("Routing over %d real vLLM engines (%s; %s blocks of %d tokens each), model %s; %d requests per configuration, "
            "max_tokens %d, seeds %s, %s" % (
                len(engines), ", ".join(e.name for e in bench.engines), "/".join(str(e.num_gpu_blocks) for e in bench.engines),
                bench.block_size, bench.model, args.requests, args.max_tokens, ", ".join(str(s) for s in sorted(set(r["seed"] for r in rows))),
                time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started))))


def routers_note(bench, lane, left_out):
    routers = ("Routers: %s: the collection's stand-in, with its KV-event index (precise; with speculative entries for %.0f s "
               "after each pick) and its model of llm-d's approx-prefix-cache-producer (approximate); ties: fewest requests so far, "
               "then name." % (", ".join(p for p in POLICIES if p in bench.policies), SPECULATIVE_TTL))
    if lane is not None:
        routers += " Real EPPs, a fresh one per configuration, %s; the referee is the same index. %s." % (
            "each confined to a loopback-only network namespace" if lane.lanes[0].confine else "unconfined (listening on every interface)",
            ". ".join(one.describe() for one in lane.lanes))
    for why in left_out:
        routers += " %s%s" % (why[:1].upper(), why[1:])
    return routers


def configuration_lines(rows):
    """A line per configuration, and a warning where the index missed on a sequential workload without reset or restart."""
    lines = []
    for r in rows:
        extra = ("; failures: " + "; ".join(r["failures"])) if r["failures"] else ""
        own = ("; the EPP's own prefix index matched %.1f%% of each prompt on its pick (mean)" % (100.0 * r["epp_prefix_match"])
               if r.get("epp_prefix_match") is not None else "")
        lines.append("%s: %d follow-ups, index exact on the chosen engine %d/%d, latency p50/p90 %s/%s ms, %.1f s%s%s" % (
            r["label"], r["follow_ups"], r["index_exact"], r["requests"] - r["failed"], fmt(r["latency_ms_p50"]),
            fmt(r["latency_ms_p90"]), r["elapsed_s"], own, extra))
        if r["sequential"] and not r["resets"] and not r["restarts"] and r["index_exact"] < r["requests"] - r["failed"]:
            lines.append("WARNING: %s: the index predicted the chosen engine's cached tokens on only %d of %d requests: the referee "
                         "(and the precise policy) missed KV events; see the engines' topics and event ports" % (
                             r["label"], r["index_exact"], r["requests"] - r["failed"]))
    return lines


def report(args, bench, rows, engines, started, lane, left_out):
    if args.records:
        write_records(args.records, rows)
    for row in rows:
        del row["records"]
    if args.json:
        for row in rows:
            print(json.dumps(row, sort_keys=True))
        return
    head, routers = heading(args, bench, rows, engines, started), routers_note(bench, lane, left_out)
    print(head)
    print(routers)
    for name in sorted(set(r["workload"] for r in rows), key=[r["workload"] for r in rows].index):
        mine = [r for r in rows if r["workload"] == name]
        print("\n%s: %s; %d distinct full blocks, %sx the caches together" % (
            name, WORKLOAD_NOTES.get(name, "custom"), mine[0]["distinct_blocks"], fmt(mine[0]["working_set"])))
        for line in table(mine):
            print(line)
    for line in configuration_lines(rows):
        print(line)
    same = all(len(set(tuple(c) for k, c in bench.token_counts.items() if k[:2] == group)) == 1
               for group in set(k[:2] for k in bench.token_counts))
    print("Hit rate: vllm:prefix_cache_hits_total / queries_total deltas summed over the engines (tokens). Chose the longest "
          "cached prefix: the chosen engine's cached tokens, per the exact index just before the request was routed, were the "
          "most of any engine. TTFT: streamed, to the first token; with max_tokens 1 the request ends right after it. Each "
          "configuration sends its workload's prompts behind its own tag in the first block (token counts per workload and "
          "seed %s), so none finds another's blocks; the engines were not restarted between configurations." % (
              "identical" if same else "NOT identical"))
    folder = args.report or (os.path.join("out", "bench-routing", "study") if len(set((r["workload"], r["seed"]) for r in rows)) > 1 else None)
    if folder:
        notes = [head, routers] + ["%s: %s" % (n, WORKLOAD_NOTES[n]) for n in WORKLOAD_NOTES if n in set(r["workload"] for r in rows)]
        written = study_report.write(folder, rows, "Routing study", notes=notes)
        print("Report: %s" % ", ".join(sorted(written.values())))
