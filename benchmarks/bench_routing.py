#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Prefix-cache routing policies on real vLLM engines: the collection's stand-in router, and real EPPs beside it.

The entry point of the routing bench; its parts are in ``benchmarks/_routing/`` (workloads, policies, runner, lanes,
report). The study at scale over simulated engines is ``benchmarks/bench_fleet.py``.

This measures the routing claim on real engines. Each request is routed to ONE of the engines, by the
collection's stand-in router (its own index in the llm-d EPP's place) under one of five policies:

* precise: the engine with the most predicted cached tokens in the KV-block index built from the engines' KV
  events (``kv/index_check.KVIndexCheck``: copies counted, what ``kv_index_check`` proves exact);
* precise-speculative: precise, plus, for ``SPECULATIVE_TTL`` seconds after each pick, the picked engine counted
  as holding the prompt's blocks (the EPP's ``speculativeIndexing``: a request routed before its same-prefix
  predecessor's KV events arrive follows it);
* approximate: the engine with the most matched blocks in ``kv/index_approx.ApproxPrefixPredictor``, the
  model of llm-d's approx-prefix-cache-producer (routing history only, character blocks, an LRU of
  ``num_gpu_blocks`` entries per engine), fed with its own routing decisions;
* load-only: the engine with the fewest requests sent so far (round robin);
* random: a seeded random engine.

Ties are broken the same way in every stand-in policy: fewest requests sent so far in this configuration, then name.

Real EPPs (``--epp``, repeatable; ``make bench-routing EPP="..."``), each with its own configurations, one policy
``epp:NAME`` per configuration (names distinct over both EPPs; ``make bench-routing`` renders them all with the router
role, ``benchmarks/epp_configs.yml``):

* the llm-d EPP (``--epp PATH``, ``--epp llm-d``, or ``SUBSTRATE_EPP_BINARY``), configurations ``--epp-config
  NAME=PATH`` (the role's precise, precise-speculative, approximate and approximate-equal (all scorer weights 1)): a
  fresh EPP per configuration, with file discovery over the engines (``epp/local.py``). Each engine connects
  to its KV-event endpoint; a relay binds it and republishes at ``tcp://<engine address>:<--kv-port>``, the one port
  the EPP's precise producer dials per endpoint (``podDiscoveryConfig.socketPort``), which this script subscribes to
  as well; every engine runs with ``--enable-scale-out`` (the token producer reads ``/v1/completions/render``, 403
  without it).
* the Gateway API Inference Extension's EPP (``--epp gie``: the build of ``make gie-epp``; or
  ``--epp gie=PATH``), configurations ``--gie-config NAME=PATH`` (the role's ``router_impl: gie`` render: gie, at
  its weights queue 2, KV-cache utilization 2, prefix 3; gie-equal, all at 1): approximate prefix-cache scoring from
  its own routing history (character blocks of 4 characters per token, the engines' block size and cache size read
  from their metrics), no KV events. It discovers its endpoints through the Kubernetes API only, so this script
  puts, in the kwok cluster of ``--kubeconfig`` (``benchmarks/bench_routing.yml`` starts it: roles/kwok_cluster, a name
  and ports of its own), one simulated pod per engine whose IP is the engine's address (kwok_cluster's pod-IP stage) and an InferencePool
  over them (``epp/local_kube.GIEPool``: the router role's InferencePool as it rendered it, ``--gie-pool``; the CRDs
  generated from GIE's API types); a fresh EPP per configuration
  reconciles that pool as in a cluster (its metrics count the ready pods before the first request). An
  InferencePool has one target port, so the engines listen on one port, each on its own 127.x address. The
  pool and every EPP are stopped at the end, also on failure; the cluster is the playbook's (``--kubeconfig``).

Without ``--epp`` (and without ``SUBSTRATE_EPP_BINARY``): llm-d's EPP where it can be had (the build of the catalog
``vars/go_builds.yml``), else the GIE EPP (``epp/local.resolve_epp``). An EPP named by a word (``llm-d``, ``gie``, or
none) that cannot be had is left out with one sentence and the rest runs; a binary given by path that is not
executable fails the run. Every EPP is asked for its pick over ext_proc exactly as Envoy asks
(``epp/extproc.ask_pick``: headers and body, the pick read from ``x-gateway-destination-endpoint``), and the
request is then sent to the picked engine. Each EPP runs in a network namespace whose only interface is loopback
(it listens on every interface and has no bind flag); ``--epp-listen-all`` runs it unconfined.

Workloads are named (``--workload``, ``WORKLOADS``; ``all`` runs every one) and parameterised: tenants (prompt
families) with a long shared prefix each, picked with a Zipf skew, each request a new question or a follow-up that
extends the tenant's conversation; a share of one-shot cold prompts; bursts of same-tenant requests sent
together; concurrent workers; a working set stated as a multiple of the engines' KV caches together (the prefix
length is fitted to it with the engines' tokenizer); a reset of every engine's prefix cache part way (vLLM's
``/reset_prefix_cache``, a development endpoint: the engines run with ``VLLM_SERVER_DEV_MODE=1``, on loopback);
two routers sharing the engines, requests alternating between them (two EPP processes; two stand-in approximate
histories, while the precise stand-ins read the same events). ``--repeats N`` runs each workload with N seeds,
and the report gives mean and spread (min to max) over them. Every configuration gets its own prompt families: the
same prompts (same tenants, sequence, follow-ups, token counts for one seed) behind a per-configuration tag of equal
token length in the first block ("r12345:"). Block hashes chain, so no block of one
configuration matches another's and what an earlier configuration left in the caches cannot help a later one
(it is evicted like any cold block); the engines are not restarted between configurations (a start takes 45 to
150 s per engine on the 2-core machine here). The script checks that the token counts agree.

Per configuration: the prefix-cache hit rate from the engines' own counters (deltas of
``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total`` on /metrics, in tokens), the cached
tokens per request (``usage.prompt_tokens_details.cached_tokens``), how often the chosen engine held the
longest cached prefix (refereed by the exact index, copies counted, read just before the request; the index's
prediction for the chosen engine is checked against what it then reports, in sequential workloads), time to first token measured by
streaming (p50/p90; requests ask for ``max_tokens`` tokens, 1 by default, so the whole request takes about
as long), requests failed; for a real EPP, the mean share of each prompt its own prefix index matched on the
engine it picked (``inference_extension_prefix_indexer_hit_ratio``, which the GIE EPP exports). Configurations run
one after the other, so load from other processes on the
machine affects their latencies unevenly.

With more than one workload or seed (or ``--report DIR``) the study is written to a folder
(``benchmarks/_study_report.py``): every run as JSON lines, the summary, ``report.md`` with a table per workload,
and plots of hit rate and TTFT per policy per workload with their spread (SVG).

``make bench-routing`` runs ``benchmarks/bench_routing.yml``: it renders the EPP configurations, starts two engines
(``roles/local_engine``) on 127.0.0.1:8400 and 127.0.0.2:8400 (events 5800/5802, replay 5801/5803) and the GIE lane's kwok
cluster, writes what the engines published to an engines file (``--engines-file``: each engine's service record, through
which the restart workload restarts it), runs this with ``--require`` and stops everything in ``always``; ``make
study-routing`` runs every workload with three seeds into ``out/bench-routing/study``. Without engines (``make bench``) it
prints that it skipped and exits 0.

  .venv/bin/python benchmarks/bench_routing.py [--engines-file PATH | --engine NAME=[HOST:]PORT,EVENTS_PORT,REPLAY_PORT ...] [--requests 80]
      [--workload bench|NAME,...|all] [--repeats 1] [--report DIR] [--policies precise,...] [--seed 0] [--json] [--require]
      [--tenants N] [--prefix-words N] [--zipf X] [--follow-up X]
      [--epp BINARY|llm-d|gie|gie=BINARY ... --epp-config NAME=PATH ... --gie-config NAME=PATH ... [--kv-port 5810]
       [--kubeconfig PATH] [--epp-listen-all]]
"""

from __future__ import absolute_import, division, print_function

import argparse
import signal
import sys
import time

import _lab
from _routing.lanes import (  # noqa: F401  pylint: disable=unused-import
    CONFIG_OPTIONS, EPP_LABELS, EPP_WORDS, GIE_NAMESPACE, GIE_POOL, GIE_POOL_MANIFESTS, EPPLane, GIELane, Lanes,
    asked_epps, epp_lanes, epp_policies, one_port, parse_epp, parse_epp_config, parse_gie_config, prefix_match, resolve_epps,
    select_configs)
from _routing.policies import POLICIES, SPECULATIVE_TTL  # noqa: F401  pylint: disable=unused-import
from _routing.report import fmt, report, table  # noqa: F401  pylint: disable=unused-import
from _routing.runner import RoutingBench, parse_engine, percentile, prefix_counters, reachable  # noqa: F401  pylint: disable=unused-import
from _routing.workloads import (  # noqa: F401  pylint: disable=unused-import
    DEFAULTS, WORKLOAD_NOTES, WORKLOADS, Request, build_workload, draw_tag, fit_prefix_words, plan, sequential, workload_spec)

from ansible_collections.inference_cache.substrate.plugins.module_utils.common import errors  # noqa: E402  pylint: disable=wrong-import-order
from ansible_collections.inference_cache.substrate.plugins.module_utils.epp import local as _epp_local  # noqa: E402  pylint: disable=wrong-import-order

# One port on two addresses: an InferencePool (the GIE EPP) has one target port for all its pods.
DEFAULT_ENGINES = ("bench-a=8400,5800,5801", "bench-b=127.0.0.2:8400,5802,5803")


def parser_of():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines-file", metavar="PATH", help="the engines a playbook started, as their roles published them "
                        "(benchmarks/bench_routing.yml writes it): with each one's service record, which the restart workload needs")
    parser.add_argument("--engine", action="append", type=parse_engine, help="NAME=[HOST:]PORT,EVENTS_PORT,REPLAY_PORT (repeat; "
                        "default: %s)" % " ".join(DEFAULT_ENGINES))
    parser.add_argument("--policies", help="comma-separated, of %s and epp:NAME for each --epp-config (default: all)" % ", ".join(POLICIES))
    parser.add_argument("--workload", default="bench", help="comma-separated names of %s, or all (default: bench)" % ", ".join(WORKLOADS))
    parser.add_argument("--repeats", type=int, default=1, help="seeds per workload, from --seed on (mean and spread over them)")
    parser.add_argument("--report", metavar="DIR", help="write the study (runs, summary, report.md, plots) into DIR; the default "
                        "with more than one workload or seed: out/bench-routing/study")
    parser.add_argument("--epp", metavar="BINARY|IMPL|IMPL=BINARY", action="append", type=parse_epp, default=[],
                        help="a real EPP (repeat, one per EPP): the llm-d EPP's binary; llm-d (SUBSTRATE_EPP_BINARY, else the "
                        "build of vars/go_builds.yml llm-d-router); gie (the Gateway API Inference Extension's EPP of `make "
                        "gie-epp`); or gie=BINARY, llm-d=BINARY. Default: SUBSTRATE_EPP_BINARY, else llm-d's where it can be "
                        "had, else the GIE EPP")
    parser.add_argument("--epp-config", metavar="NAME=PATH", action="append", type=parse_epp_config, default=[],
                        help="an EndpointPickerConfig of the llm-d EPP for policy epp:NAME (repeat); its endpoints come from "
                        "file discovery")
    parser.add_argument("--gie-config", metavar="NAME=PATH", action="append", type=parse_gie_config, default=[],
                        help="an EndpointPickerConfig of the GIE EPP for policy epp:NAME (repeat); its endpoints come from an "
                        "InferencePool in a kwok cluster (benchmarks/kwok_cluster.yml), which needs every engine on one port")
    parser.add_argument("--gie-pool", metavar="PATH", default=GIE_POOL_MANIFESTS, help="the router role's rendered manifests "
                        "holding its InferencePool (router_impl gie), which the GIE lane applies in its kwok cluster; default: "
                        "what make bench-routing renders (benchmarks/epp_configs.yml)")
    parser.add_argument("--kubeconfig", metavar="PATH", help="the kwok cluster the GIE lane puts its InferencePool in "
                        "(benchmarks/bench_routing.yml starts one and passes it)")
    parser.add_argument("--kv-port", type=int, default=5810, help="the relays' KV-event port on each engine address (the "
                        "configs' podDiscoveryConfig.socketPort)")
    parser.add_argument("--epp-listen-all", action="store_true", help="run the EPP unconfined: its ext_proc, health and "
                        "metrics ports then listen on every interface of this machine")
    parser.add_argument("--requests", type=int, default=80, help="requests per configuration")
    parser.add_argument("--tenants", type=int, help="prompt families (default: the workload's; bench: 16)")
    parser.add_argument("--prefix-words", type=int, help="words of each tenant's shared prefix (default: the workload's; bench: 48)")
    parser.add_argument("--zipf", type=float, help="skew of the tenants' popularity (default: the workload's; 1.0)")
    parser.add_argument("--follow-up", type=float, help="chance that a request extends the tenant's conversation (default: 0.3)")
    parser.add_argument("--max-tokens", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0, help="the first workload seed (tenants, sequence and text)")
    parser.add_argument("--settle", type=float, default=0.3, help="seconds without KV events before the index counts as current")
    parser.add_argument("--timeout", type=float, default=14400.0)
    parser.add_argument("--records", metavar="PATH", help="write every request (policy, engine, tokens, cached, predicted, "
                        "TTFT) to PATH as JSON lines")
    parser.add_argument("--json", action="store_true", help="one JSON object per configuration instead of a table")
    parser.add_argument("--require", action="store_true", help="fail (instead of skipping) when an engine is unreachable")
    return parser


def chosen(parser, args):
    """``(engines, policies, workload names)`` of the arguments; a wrong one ends the run with one sentence (exit 2)."""
    if args.engines_file and args.engine:
        parser.error("give the engines by --engines-file or by --engine, not both")
    try:
        engines = (_lab.load_engines(args.engines_file) if args.engines_file
                   else args.engine or [parse_engine(e) for e in DEFAULT_ENGINES])
    except (OSError, ValueError, KeyError) as exc:
        parser.error("cannot read the engines file %s (%s); benchmarks/bench_routing.yml writes it" % (args.engines_file, exc))
    try:
        asked_epps(args.epp)
        epp_names = list(epp_policies({"llm-d": args.epp_config, "gie": args.gie_config}))
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    policies = [p.strip() for p in args.policies.split(",") if p.strip()] if args.policies else list(POLICIES) + epp_names
    unknown = [p for p in policies if p not in POLICIES and p not in epp_names]
    if unknown:
        parser.error("unknown policies %s: the policies are %s" % (", ".join(unknown), ", ".join(list(POLICIES) + epp_names)))
    names = list(WORKLOADS) if args.workload == "all" else [w.strip() for w in args.workload.split(",") if w.strip()]
    if [w for w in names if w not in WORKLOADS] or not names:
        parser.error("unknown workload in %r: the workloads are %s, or all" % (args.workload, ", ".join(WORKLOADS)))
    if "restart" in names and not all(e.get("service") for e in engines):
        if args.workload != "all":
            parser.error("the restart workload needs the engines' service records: give --engines-file (make bench-routing does)")
        print("bench_routing: the restart workload is left out: the engines' service records are not known (no --engines-file)")
        names.remove("restart")
    if len(engines) < 2 or args.repeats < 1 or args.requests < 1:
        parser.error("at least two engines, one repeat and one request")
    return engines, policies, names


def run(bench, lane):
    """The configurations, the EPPs' lanes opened first and closed at the end (also on failure): ``(rows, rc)``."""
    # SIGTERM as SIGINT: the finally below stops the EPPs, the pool and the kwok cluster.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rows, rc = None, 0
    try:
        if lane is not None:
            lane.open()
        rows = bench.run()
    except (errors.CheckError, _epp_local.EPPError, OSError) as exc:
        print("bench_routing: %s" % (getattr(exc, "msg", None) or exc))
        rc = 1
    finally:
        if lane is not None:
            try:
                lane.close()
            except errors.CheckError as exc:
                print("bench_routing: %s" % exc.msg)
                rc = 1
    return rows, rc


def main():
    parser = parser_of()
    args = parser.parse_args()
    engines, policies, names = chosen(parser, args)
    for spec in engines:
        problem = reachable(spec)
        if problem:
            print("bench_routing: %s: engine %s is not reachable (%s); `make bench-routing` starts two" % (
                "failed" if args.require else "skipped", spec["name"], problem))
            return 1 if args.require else 0
    lane, left_out, failed = epp_lanes(args, engines, policies) if any(p.startswith("epp:") for p in policies) else (None, [], None)
    if failed:
        print("bench_routing: failed: %s" % failed)
        return 1
    for why in left_out:
        print("bench_routing: %s" % why)
    policies = [p for p in policies if not p.startswith("epp:") or (lane is not None and p[4:] in lane.by_name)]
    seeds = list(range(args.seed, args.seed + args.repeats))
    params = {"engines": engines, "workload": {}, "expect": {}, "max_tokens": args.max_tokens, "settle": args.settle,
              "event_wait": 5.0, "timeout": args.timeout, "request_timeout": 120.0}
    bench = RoutingBench(params, plan(args, names, policies, seeds), epp=lane)
    started = time.time()
    rows, rc = run(bench, lane)
    if rc == 0:
        report(args, bench, rows, engines, started, lane, left_out)
    return rc


if __name__ == "__main__":
    sys.exit(main())
