#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The routing study at scale: a fleet of simulated engines under cache pressure, open-loop load, every policy held
against a referee that knows every engine's true cache.

The fleet is llm-d's vLLM simulator (llm-d-inference-sim v0.10.2, roles/simulated_engine: ``make study-fleet`` starts 16
of them through playbooks/simulated_engines.yml and passes the engines file it writes). Each configuration (workload,
policy, seed) starts from empty caches (the simulators' /sleep and /wake_up) and sends its workload's Poisson arrivals
at their times, each routed on arrival and sent to ONE engine (``benchmarks/_routing/fleet.py``: the policies, the truth
and the stand-in index; ``fleet_workloads.py``: the blog-shaped workloads). A real EPP runs beside the stand-ins where
one is given: the Gateway API Inference Extension's EPP v1.4.0 (``--epp gie --gie-config NAME=PATH``), discovering the
engines through an InferencePool of a kwok cluster as ``bench_routing.py``'s GIE lane does (``_routing/lanes.py``).
``precise-kvcache`` asks llm-d-kv-cache v0.9.0's own index (tools/kvcache_probe, ``make kvcache-probe``), fed with every
engine's events through a relay on ``--relay-port``.

Printed: a table per workload (hit rate and its share of the referee's, TTFT p50/p90, throughput, failures, mean and
min-max over the seeds) and TTFT p90 at each step of the ramp; written with ``--report DIR`` (or more than one run):
runs.jsonl, summary.json, report.md and two plots (TTFT p90 against load, hit rate against the referee's limit).
Without an engines file it prints that it skipped and exits 0 (``make bench``); ``--require`` makes that a failure.

  .venv/bin/python benchmarks/bench_fleet.py --engines-file out/bench-fleet/engines.json [--workload blog,blog-light]
      [--policies referee,precise,...] [--repeats 2] [--seed 0] [--ramp 4,8,12] [--step-seconds 20] [--report DIR]
      [--epp gie --gie-config gie=PATH --gie-pool PATH] [--probe PATH] [--records PATH] [--json] [--require]
"""

from __future__ import absolute_import, division, print_function

import argparse
import json
import os
import random
import signal
import sys
import time

from _routing import ROOT, fleet, fleet_report, fleet_workloads, module_utils
from _routing.lanes import epp_lanes, epp_policies, parse_epp, parse_gie_config

errors = module_utils("common.errors")

DEFAULT_PROBE = os.path.join(ROOT, ".cache", "bin", "kvcache_probe")


def parser_of():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines-file", help="what playbooks/simulated_engines.yml wrote (simulated_engine_report_path)")
    parser.add_argument("--workload", default="blog,blog-light", help="comma-separated names of %s (NAME:REPEATS: that many "
                        "seeds for it), or all" % ", ".join(fleet_workloads.WORKLOADS))
    parser.add_argument("--policies", help="comma-separated, of %s and epp:NAME for each --gie-config (default: all)" % ", ".join(
        fleet.POLICIES))
    parser.add_argument("--repeats", type=int, default=1, help="seeds per workload (unless it names its own), from --seed on")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ramp", help="the load ramp, requests/s per step, comma-separated (default: the workload's)")
    parser.add_argument("--step-seconds", type=float, help="seconds per step of the ramp (default: the workload's)")
    parser.add_argument("--demand", type=float, help="the KV demand as a share of the fleet's blocks (default: the workload's)")
    parser.add_argument("--probe", default=DEFAULT_PROBE, help="tools/kvcache_probe's binary for precise-kvcache (make "
                        "kvcache-probe); left out when missing")
    parser.add_argument("--relay-port", type=int, default=6499, help="the port of the relay of every engine's events to the probe")
    parser.add_argument("--epp", metavar="gie|gie=BINARY", action="append", type=parse_epp, default=[],
                        help="a real EPP beside the stand-ins: the GIE EPP v1.4.0 (make gie-epp)")
    parser.add_argument("--gie-config", metavar="NAME=PATH", action="append", type=parse_gie_config, default=[],
                        help="an EndpointPickerConfig of the GIE EPP for policy epp:NAME (benchmarks/epp_configs.yml renders them)")
    parser.add_argument("--gie-pool", metavar="PATH", help="the router role's rendered manifests holding its InferencePool")
    parser.add_argument("--epp-listen-all", action="store_true", help="run the EPP unconfined (every interface)")
    parser.add_argument("--report", metavar="DIR", help="write the study folder there (default with more than one run: "
                        "out/bench-fleet/study)")
    parser.add_argument("--add-runs", metavar="PATH", help="a runs.jsonl of an earlier study whose rows join this one's report, "
                        "but for the (workload, policy) pairs this run measures again")
    parser.add_argument("--records", metavar="PATH", help="every request as JSON lines")
    parser.add_argument("--json", action="store_true", help="one JSON object per configuration instead of tables")
    parser.add_argument("--require", action="store_true", help="fail (instead of skipping) without a fleet")
    return parser


def chosen(parser, args):
    asked = list(fleet_workloads.WORKLOADS) if args.workload == "all" else [w.strip() for w in args.workload.split(",") if w.strip()]
    names = []
    for item in asked:
        name, _colon, repeats = item.partition(":")
        if repeats and not repeats.isdigit():
            parser.error("--workload wants NAME or NAME:REPEATS, got %r" % item)
        names.append((name, int(repeats) if repeats else args.repeats))
    if not names or [n for n, _r in names if n not in fleet_workloads.WORKLOADS]:
        parser.error("unknown workload in %r: the workloads are %s, or all" % (args.workload, ", ".join(fleet_workloads.WORKLOADS)))
    try:
        epp_names = list(epp_policies({"gie": args.gie_config}))
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    known = list(fleet.POLICIES) + epp_names
    policies = [p.strip() for p in args.policies.split(",") if p.strip()] if args.policies else known
    unknown = [p for p in policies if p not in known]
    if unknown:
        parser.error("unknown policies %s: the policies are %s" % (", ".join(unknown), ", ".join(known)))
    if args.repeats < 1:
        parser.error("at least one repeat")
    overrides = {"step_seconds": args.step_seconds, "demand": args.demand}
    if args.ramp:
        try:
            overrides["ramp"] = tuple(float(x) for x in args.ramp.split(",") if x.strip())
        except ValueError:
            parser.error("--ramp wants requests/s per step, comma-separated, got %r" % args.ramp)
    return names, policies, overrides


def open_epps(args, engines, policies):
    """The GIE lane where an epp:NAME policy is asked for: ``(lanes or None, policies that can run, sentences)``."""
    if not any(p.startswith("epp:") for p in policies):
        return None, policies, []
    lane_args = argparse.Namespace(epp=args.epp or [("gie", None)], epp_config=[], gie_config=args.gie_config, kv_port=0,
                                   epp_listen_all=args.epp_listen_all, gie_pool=args.gie_pool)
    lanes, left_out, failed = epp_lanes(lane_args, [e.spec for e in engines], policies)
    if failed:
        raise errors.CheckError(failed)
    keep = [p for p in policies if not p.startswith("epp:") or (lanes is not None and p[4:] in lanes.by_name)]
    return lanes, keep, left_out


def run_all(study, names, policies, overrides, first_seed):
    """Every (seed, workload, policy); a workload runs with as many seeds as it asks for (NAME:REPEATS)."""
    rows = []
    tags = random.Random(7)
    total = sum(repeats for _name, repeats in names) * len(policies)
    for seed in range(first_seed, first_seed + max(repeats for _name, repeats in names)):
        for name, repeats in names:
            if seed >= first_seed + repeats:
                continue
            spec = fleet_workloads.spec_of(name, **overrides)
            for policy in policies:
                tag = "r%05d" % tags.randrange(10000, 100000)
                began = time.time()
                row = study.run(policy, spec, seed, tag)
                rows.append(row)
                sys.stderr.write("bench_fleet: %d/%d %s %s seed %d: hit rate %s, TTFT p90 %s ms, %d failed, %.0f s\n" % (
                    len(rows), total, name, policy, seed,
                    "-" if row["hit_rate"] is None else "%.1f%%" % (100 * row["hit_rate"]), row["ttft_ms_p90"], row["failed"],
                    time.time() - began))
                sys.stderr.flush()
    return rows


def notes_of(study, engines, probe, lanes, left_out, started):
    capacity = engines[0].capacity
    notes = ["%d simulated engines (llm-d-inference-sim, confined to loopback), %d blocks of %d tokens each (%d in all), model %s; "
             "max_tokens 1 (the latency of a request is its time to first token); %s" % (
                 len(engines), capacity, study.block_size, study.fleet_blocks(), study.model,
                 time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)))]
    notes.append("Policies: referee (the true cache of every engine, from its own block hashes; the longest hit, ties to the "
                 "fewest in flight: the limit); precise (the stand-in's KV-event index) and approximate (its model of the "
                 "approx-prefix-cache-producer), scored as the GIE EPP scores: prefix %.0f x share of blocks held + queue %.0f x "
                 "GIE's queue normalisation of the requests in flight; precise-kvcache: the same, the prefix from llm-d-kv-cache "
                 "v0.9.0's own index (%s); load-only (fewest in flight); random." % (
                     fleet.WEIGHTS["prefix"], fleet.WEIGHTS["queue"], "tools/kvcache_probe" if probe else "not run: no probe binary"))
    if lanes is not None:
        notes.append("Real EPPs: %s." % ". ".join(one.describe() for one in lanes.lanes))
    notes += ["%s%s" % (why[:1].upper(), why[1:]) for why in left_out]
    return notes


def print_rows(rows, notes):
    summary = fleet_report.summarize(rows)
    print(fleet_report.markdown(summary, "Routing over a simulated fleet", notes))


def main():
    parser = parser_of()
    args = parser.parse_args()
    names, policies, overrides = chosen(parser, args)
    if not args.engines_file or not os.path.exists(args.engines_file):
        print("bench_fleet: %s: no fleet (--engines-file); `make study-fleet` starts one" % ("failed" if args.require else "skipped"))
        return 1 if args.require else 0
    try:
        engines = fleet.load_engines(args.engines_file)
    except (errors.CheckError, OSError, ValueError, KeyError) as exc:
        print("bench_fleet: failed: %s" % (getattr(exc, "msg", None) or exc))
        return 1
    probe = args.probe if "precise-kvcache" in policies and os.access(args.probe or "", os.X_OK) else None
    if "precise-kvcache" in policies and probe is None:
        print("bench_fleet: precise-kvcache is left out: no tools/kvcache_probe binary at %s (make kvcache-probe)" % args.probe)
        policies.remove("precise-kvcache")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    lanes = study = None
    rows, rc, left_out, load = [], 0, [], ()
    started = time.time()
    try:
        lanes, policies, left_out = open_epps(args, engines, policies)
        for why in left_out:
            print("bench_fleet: %s" % why)
        study = fleet.FleetStudy(engines, lanes=lanes, probe_binary=probe,
                                 relay_endpoint="tcp://127.0.0.1:%d" % args.relay_port if probe else None).open()
        if lanes is not None:
            lanes.open()
        load = os.getloadavg()
        rows = run_all(study, names, policies, overrides, args.seed)
        load += os.getloadavg()
    except (errors.CheckError, OSError) as exc:
        print("bench_fleet: %s" % (getattr(exc, "msg", None) or exc))
        rc = 1
    finally:
        if study is not None:
            study.close()
        if lanes is not None:
            try:
                lanes.close()
            except errors.CheckError as exc:
                print("bench_fleet: %s" % exc.msg)
                rc = 1
    if rc:
        return rc
    if args.records:
        with open(args.records, "w", encoding="utf-8") as out:
            for row in rows:
                for rec in row["records"]:
                    out.write(json.dumps(dict(rec, policy=row["policy"], workload=row["workload"], seed=row["seed"]), sort_keys=True) + "\n")
    for row in rows:
        del row["records"]
    if args.json:
        for row in rows:
            print(json.dumps(row, sort_keys=True))
        return 0
    if args.add_runs:
        measured = set((r["workload"], r["policy"]) for r in rows)
        with open(args.add_runs, encoding="utf-8") as handle:
            earlier = [json.loads(line) for line in handle if line.strip()]
        rows = [r for r in earlier if (r["workload"], r["policy"]) not in measured] + rows
        order = dict((p, i) for i, p in enumerate(fleet.POLICIES))
        rows.sort(key=lambda r: (r["seed"], [n for n, _r in names].index(r["workload"]) if r["workload"] in [n for n, _r in names] else 99,
                                 order.get(r["policy"], len(order))))
    notes = notes_of(study, engines, probe, lanes, left_out, started)
    if args.add_runs:
        notes.append("These notes describe this run (%s); the other rows come from the earlier runs in %s." % (
            ", ".join(sorted(set(r["policy"] for r in rows if (r["workload"], r["policy"]) in measured))), args.add_runs))
    notes.append("Machine load (1/5/15-minute averages, 2 cores shared with other work): %s at the start, %s at the end." % (
        "/".join("%.1f" % v for v in load[:3]), "/".join("%.1f" % v for v in load[3:])))
    print_rows(rows, notes)
    folder = args.report or (os.path.join(ROOT, "out", "bench-fleet", "study") if len(rows) > len(policies) else None)
    if folder:
        written = fleet_report.write(folder, rows, "Routing over a simulated fleet", notes)
        print("Report: %s" % ", ".join(sorted(written.values())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
