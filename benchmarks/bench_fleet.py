#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The fleet study's entry point (the harness is ``benchmarks/fleet/``; ``benchmarks/fleet/study.yml`` runs the whole study).

  run     configurations over a running fleet: each policy of --policies with each seed of --seeds (the stand-ins of
          benchmarks/fleet/policies.py, or epp:NAME, the real EPP at --epp NAME=HOST:PORT, asked over ext_proc), one row
          each appended to --runs;
  report  the study folder from the rows of --runs: runs.jsonl, summary.json, report.md and the plots;
  gie-config  the GIE EPP's EndpointPickerConfig of the blog's approximate setup, scaled to the fleet of --engines-file.

  .venv/bin/python benchmarks/bench_fleet.py run --engines-file ENGINES.json --runs RUNS.jsonl [--policies random,precise,...]
      [--seeds 0,1] [--epp NAME=HOST:PORT --router-label NAME=LABEL] [--latency 10ms,1ms,4,4] [--ramp 4,8,...]
      [--step-seconds 8] [--warmup-requests 300] [--warmup-rate 12] [--target-ms 1000] [--records PATH]
  .venv/bin/python benchmarks/bench_fleet.py report --runs RUNS.jsonl --out FOLDER [--note TEXT ...]
  .venv/bin/python benchmarks/bench_fleet.py gie-config --engines-file ENGINES.json
"""

from __future__ import absolute_import, division, print_function

import argparse
import json
import os
import signal
import sys
import time

from fleet import engines as engines_mod
from fleet import module_utils, policies, report, workload
from fleet.run import FleetRun

errors = module_utils("common.errors")


def _duration(text):
    """Seconds of a Go duration of one unit (10ms, 1ms, 500us, 2s)."""
    text = text.strip()
    for unit, scale in (("us", 1e-6), ("\u00b5s", 1e-6), ("ms", 1e-3), ("s", 1.0)):
        if text.endswith(unit):
            return float(text[:-len(unit)]) * scale
    return float(text)


def _latency(text):
    try:
        parts = [p.strip() for p in text.split(",")]
        overhead, per_token, seqs, factor = parts[:4]
        itl, output = (parts[4], parts[5]) if len(parts) == 6 else ("0s", "1")
        if len(parts) not in (4, 6):
            raise ValueError(text)
        return policies.Latency(_duration(overhead), _duration(per_token), int(seqs), float(factor), _duration(itl), int(output))
    except ValueError:
        raise argparse.ArgumentTypeError("--latency wants OVERHEAD,PER_TOKEN,MAX_NUM_SEQS,TIME_FACTOR[,INTER_TOKEN,OUTPUT_TOKENS] "
                                         "(10ms,1ms,4,2,40ms,8), got %r" % text)


def _floats(text):
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError("wants numbers separated by commas, got %r" % text)


def _named(option):
    def parse(text):
        name, sep, value = text.partition("=")
        if not sep or not name or not value:
            raise argparse.ArgumentTypeError("%s wants NAME=VALUE, got %r" % (option, text))
        return name, value
    return parse


def parser_of():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="configurations over a running fleet, rows appended to --runs")
    run.add_argument("--engines-file", required=True, help="what roles/simulated_engine published (local_engine_instances as JSON)")
    run.add_argument("--runs", required=True, help="the JSON-lines file the rows are appended to")
    run.add_argument("--policies", default=",".join(policies.POLICIES), help="comma-separated, of %s and epp:NAME for each --epp" %
                     ", ".join(policies.POLICIES))
    run.add_argument("--seeds", default="0", help="comma-separated seeds (each one schedule, the same for every policy)")
    run.add_argument("--epp", action="append", type=_named("--epp"), default=[], metavar="NAME=HOST:PORT",
                     help="a real EPP's ext_proc address for policy epp:NAME (plain gRPC)")
    run.add_argument("--router-label", action="append", type=_named("--router-label"), default=[], metavar="NAME=LABEL",
                     help="how the report names epp:NAME's router")
    run.add_argument("--latency", type=_latency, default="10ms,1ms,4,4",
                     help="the engines' latency settings: prefill overhead, prefill time per token, max_num_seqs, time factor under load, "
                     "and optionally the inter-token latency and the output tokens of every request")
    run.add_argument("--ramp", type=_floats, help="offered rates of the ramp's steps (requests/s)")
    run.add_argument("--step-seconds", type=float)
    run.add_argument("--warmup-requests", type=int)
    run.add_argument("--warmup-rate", type=float)
    run.add_argument("--groups", type=int, help="prefix groups (default: fitted to the demand)")
    run.add_argument("--target-ms", type=float, default=1000.0, help="the TTFT target of goodput and the sustained rate")
    run.add_argument("--records", help="every request as JSON lines (appended)")
    rep = sub.add_parser("report", help="the study folder from the rows of --runs")
    rep.add_argument("--runs", required=True)
    rep.add_argument("--out", required=True)
    rep.add_argument("--note", action="append", default=[])
    gie = sub.add_parser("gie-config", help="the GIE EPP's config of the blog's approximate setup, scaled to the fleet")
    gie.add_argument("--engines-file", required=True)
    return parser


def gie_blog_config(spec):
    """The blog's approximate setup as a GIE v1.4.0 EndpointPickerConfig: queue, kv-cache-utilization and prefix-cache
    scorers at weight 1 each, max-score picker; the prefix scorer without autoTune, its blocks the engine's block size (64
    characters at 16 tokens, the blog's hashBlockSize), its LRU and match limit scaled as ``policies.blog_approx`` says."""
    approx = policies.blog_approx(spec)
    return "\n".join([
        "# The approximate setup of llm-d's blog \"KV-Cache Wins You Can See\" (llm-d-kv-cache-manager",
        "# benchmarking/73-capacity/README.md, estimated-scheduling), scaled to this fleet by benchmarks/fleet/policies.py",
        "# blog_approx: LRU %.3f times each engine's KV blocks, matching %.3f of the shared prompt." % (approx["lru_ratio"], approx["match_ratio"]),
        "apiVersion: inference.networking.x-k8s.io/v1alpha1",
        "kind: EndpointPickerConfig",
        "plugins:",
        "  - type: queue-scorer",
        "  - type: kv-cache-utilization-scorer",
        "  - type: prefix-cache-scorer",
        "    parameters:",
        "      autoTune: false",
        "      blockSizeTokens: %d" % int(spec["block_size"]),
        "      maxPrefixBlocksToMatch: %d" % approx["max_blocks"],
        "      lruCapacityPerServer: %d" % approx["lru_capacity"],
        "  - type: max-score-picker",
        "  - type: single-profile-handler",
        "schedulingProfiles:",
        "  - name: default",
        "    plugins:",
        "      - pluginRef: queue-scorer",
        "        weight: 1.0",
        "      - pluginRef: kv-cache-utilization-scorer",
        "        weight: 1.0",
        "      - pluginRef: prefix-cache-scorer",
        "        weight: 1.0",
        "      - pluginRef: max-score-picker",
        ""])


def spec_for(engines, args=None):
    first = engines[0]
    get = (lambda name: getattr(args, name, None)) if args is not None else (lambda name: None)
    return workload.spec_of(engines=len(engines), capacity_blocks=first.capacity, block_size=first.block_size, ramp=get("ramp"),
                            step_seconds=get("step_seconds"), warmup_requests=get("warmup_requests"),
                            warmup_rate=get("warmup_rate"), groups=get("groups"))


def picker_of(address, engines):
    """``pick(body) -> engine name``: the EPP at ``address`` asked over ext_proc (plain gRPC), its pick mapped to an engine."""
    extproc = module_utils("epp.extproc")
    by_target = dict(("%s:%d" % (e.address, e.port), e.name) for e in engines)

    def pick(body):
        picked = extproc.ask_pick(address, json.dumps(body).encode("utf-8"), timeout=30.0)["picked"]
        if picked not in by_target:
            raise errors.CheckError("The EPP picked %s, which is none of the engines (%s)." % (picked, ", ".join(sorted(by_target))))
        return by_target[picked]
    return pick


def run_command(parser, args):
    names = [p.strip() for p in args.policies.split(",") if p.strip()]
    epps = dict(args.epp)
    labels = dict(args.router_label)
    unknown = [p for p in names if p not in policies.POLICIES and not (p.startswith("epp:") and p[4:] in epps)]
    if unknown:
        parser.error("unknown policies %s: the policies are %s, and epp:NAME for each --epp NAME=HOST:PORT" % (
            ", ".join(unknown), ", ".join(policies.POLICIES)))
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error("--seeds wants whole numbers separated by commas, got %r" % args.seeds)
    try:
        engines = engines_mod.load_engines(args.engines_file)
    except (errors.CheckError, OSError, ValueError, KeyError) as exc:
        print("bench_fleet: %s" % (getattr(exc, "msg", None) or exc))
        return 1
    spec = spec_for(engines, args)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    fleet = FleetRun(engines, args.latency)
    rc = 0
    try:
        fleet.open()
        for seed in seeds:
            for name in names:
                began = time.time()
                fleet.picker = picker_of(epps[name[4:]], engines) if name.startswith("epp:") else None
                records, samples, gauges, meta = fleet.run(name, spec, seed)
                router = labels.get(name[4:], "real EPP") if name.startswith("epp:") else policies.CONFIGS[name]["router"] + " (stand-in)"
                row = report.row(name, router, seed, spec, fleet.names, records, samples, gauges, meta, args.target_ms / 1000.0)
                row["latency"] = {"overhead_s": args.latency.overhead_s, "per_token_s": args.latency.per_token_s,
                                  "max_num_seqs": args.latency.max_num_seqs, "time_factor": args.latency.time_factor,
                                  "itl_s": args.latency.itl_s, "output_tokens": args.latency.output_tokens}
                row["approx"] = policies.blog_approx(spec)
                with open(args.runs, "a", encoding="utf-8") as out:
                    out.write(json.dumps(row, sort_keys=True) + "\n")
                if args.records:
                    with open(args.records, "a", encoding="utf-8") as out:
                        for rec in records:
                            out.write(json.dumps(dict(rec, policy=name, seed=seed), sort_keys=True) + "\n")
                print("bench_fleet: %s seed %d: sustained %.0f req/s, hit rate %s, TTFT p90 by step %s ms, idle engines %d, "
                      "%d failed, %.0f s" % (name, seed, row["sustained_rps"], row["ramp_total"]["hit_rate"],
                                             [s["ttft_ms"]["p90"] for s in row["steps"]], row["idle_engines"],
                                             row["ramp_total"]["failed"], time.time() - began))
                sys.stdout.flush()
    except errors.CheckError as exc:
        print("bench_fleet: %s" % exc.msg)
        rc = 1
    finally:
        fleet.close()
    return rc


def report_command(args):
    rows = report.read_rows(args.runs)
    if not rows:
        print("bench_fleet: %s holds no rows" % args.runs)
        return 1
    paths = report.write(args.out, rows, notes=args.note)
    print(report.markdown(report.summarize(rows), rows, notes=args.note))
    print("Report: %s" % ", ".join(sorted(os.path.relpath(p) for p in paths.values())))
    return 0


def main():
    parser = parser_of()
    args = parser.parse_args()
    if args.command == "run":
        return run_command(parser, args)
    if args.command == "gie-config":
        try:
            engines = engines_mod.load_engines(args.engines_file)
        except (errors.CheckError, OSError, ValueError, KeyError) as exc:
            print("bench_fleet: %s" % (getattr(exc, "msg", None) or exc))
            return 1
        sys.stdout.write(gie_blog_config(spec_for(engines)))
        return 0
    return report_command(args)


if __name__ == "__main__":
    sys.exit(main())
