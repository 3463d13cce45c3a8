#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Verify every engine pod individually from inside the cluster (run by the cluster_verify role's Job).

A NodePort or ClusterIP in front of several pods reaches a random one, so this tool resolves the engines'
headless Service (one DNS record per ready pod) and runs, against each pod IP in turn:

* the KV-event check (plugins/module_utils/_kv_check.py): SUB-connect to tcp://<pod>:<kv port> (the engines
  bind tcp://*:<port>), send one trigger completion to that same pod, expect BlockStored events under the
  pod's own topic (the engines' topic with $(POD_IP) replaced by the pod IP), each batch one the EPP v0.9.0's
  KV-event decoder takes (required with --scoring-mode precise);
* the prefix-cache check (plugins/module_utils/_prefix_cache.py): a cold and a warm request sharing a prefix,
  hits read from that pod's /metrics.

and once, through the router (checks in ROUTER_CHECKS):

* routed_prefix: a cold and a warm request sharing a long prefix sent to the router's URL (--router-url, the
  proxy beside the EPP), never to a pod. The engine pod that served the repeated prefix must report the hit
  (its prefix-cache hit counter moves by at least one block); with --epp-metrics-url, the EPP's KV-block index
  must have admitted blocks (KV events ingested) and, in precise mode, found the prefix on lookup.

Prints one JSON document (per-pod results, then the router's) on stdout; exit status 0 when every check passed
and at least --expect-pods pods were found, 1 otherwise, 2 on a usage or environment error. A new per-pod check
is one function ``check_<name>(ip, args)`` plus one entry in CHECKS; a check that runs once is one function
``check_<name>(ips, args)`` plus one entry in ROUTER_CHECKS (through the router) or POOL_CHECKS (over every pod at once:
kv_index, plugins/module_utils/_kv_index_check.py: a KV-block index built from all pods' events must predict the
cached tokens each pod reports for a generated workload).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import argparse
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _loader import module_utils  # noqa: E402  pylint: disable=wrong-import-position


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--service", required=True, help="headless Service DNS name of the engines")
    parser.add_argument("--expect-pods", type=int, default=1, help="fail unless at least this many pods resolve")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--kv-port", type=int, default=5557)
    parser.add_argument("--topic-template", default="kv@$(POD_IP):8000@",
                        help="the engines' topic; $(POD_IP) is replaced by each pod's IP (default kv@$(POD_IP):8000@)")
    parser.add_argument("--model", default=None, help="served model name (default: the first of /v1/models)")
    parser.add_argument("--engine", default="auto", choices=["auto", "vllm", "sglang"])
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--checks", default="kv_events,prefix_cache",
                        help="comma-separated: kv_events, prefix_cache (per pod), routed_prefix (through the router), "
                             "kv_index (over every pod at once)")
    parser.add_argument("--pods", default="", help="comma-separated pod IPs to check instead of resolving --service")
    parser.add_argument("--router-url", default="", help="the router's OpenAI URL (routed_prefix), e.g. http://<release>-epp.<ns>:8081")
    parser.add_argument("--epp-metrics-url", default="", help="the EPP's metrics page (routed_prefix), e.g. http://<release>-epp.<ns>:9090/metrics")
    parser.add_argument("--scoring-mode", default="precise", choices=["precise", "approximate"],
                        help="precise: the EPP's index must also find the repeated prefix on lookup")
    parser.add_argument("--prefix-words", type=int, default=400, help="words of shared prefix in routed_prefix")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds between the cold and the warm request (events reach the EPP)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per check and pod")
    parser.add_argument("--resolve-timeout", type=float, default=60.0, help="seconds to wait for --expect-pods DNS records")
    return parser.parse_args(argv)


def resolve_pods(service, port, expect, timeout, clock=time.monotonic, sleep=time.sleep, lookup=socket.getaddrinfo):
    """Pod IPs behind a headless Service, waiting (bounded) until at least ``expect`` resolve."""
    deadline = clock() + timeout
    ips = []
    while True:
        try:
            ips = sorted(set(info[4][0] for info in lookup(service, port, socket.AF_UNSPEC, socket.SOCK_STREAM)))
        except socket.gaierror:
            ips = []
        if len(ips) >= expect or clock() >= deadline:
            return ips
        sleep(2.0)


def _host(ip):
    return "[%s]" % ip if ":" in ip else ip


def check_kv_events(ip, args):
    check = module_utils("_kv_check")
    base = "http://%s:%d" % (_host(ip), args.http_port)
    params = {
        "endpoint": "tcp://%s:%d" % (_host(ip), args.kv_port), "socket_mode": "connect",
        "topic": args.topic_template.replace("$(POD_IP)", ip), "engine": args.engine,
        "data_parallel_size": 1, "replay_endpoint": None, "timeout": args.timeout, "expect": None, "settle": 1.0,
        "include_token_ids": False, "trigger": {"url": base, "model": args.model, "max_tokens": 1, "delay": 1.0, "headers": {}},
        # Precise mode: every batch must be one the EPP v0.9.0's decoder takes, or its index silently misses those blocks.
        "router_version": "v0.9.0", "expect_router_decodes": args.scoring_mode == "precise",
    }
    try:
        facts = check.KVEventsCheck(params).run()
    except check.CheckFailed as exc:
        return {"ok": False, "msg": exc.msg, "counts": exc.facts.get("counts")}
    return {"ok": True, "msg": "KV events arrived under the pod's own topic.", "counts": facts.get("counts"),
            "topics": facts.get("topics"), "router_decoder": facts.get("router_decoder")}


def check_prefix_cache(ip, args):
    http = module_utils("_openai_http")
    prefix = module_utils("_prefix_cache")
    base = "http://%s:%d" % (_host(ip), args.http_port)
    client = http.OpenAIClient(base, timeout=args.timeout)
    probe = prefix.PrefixCacheProbe(client, base + "/metrics", model=args.model, block_size=args.block_size, engine=args.engine,
                                    sleep=time.sleep)
    try:
        result = probe.run()
    except (prefix.PrefixCacheError, http.OpenAIHTTPError) as exc:
        return {"ok": False, "msg": str(exc)}
    failures = prefix.evaluate(result)
    return {"ok": not failures, "msg": " ".join(failures) or "The warm request hit the prefix cache.",
            "hit_tokens": result.get("hit_tokens"), "expected_hit_tokens": result.get("expected_hit_tokens")}


# The EPP's KV-block index counters (indexerConfig.kvBlockIndexConfig.enableMetrics). llm-d-kv-cache@7be76e1 (the
# newest commit read before v0.9.0, pkg/kvcache/metrics/collector.go) names them kvcache_index_*; the router's own
# copy after v0.9.0 names them llm_d_epp_kv_cache_index_*. Either is accepted, the first found wins.
EPP_ADMISSIONS = ("kvcache_index_admissions_total", "llm_d_epp_kv_cache_index_admissions_total")
EPP_LOOKUP_HITS = ("kvcache_index_lookup_hits_total", "llm_d_epp_kv_cache_index_lookup_hits_total")


def make_client(base_url, timeout):
    return module_utils("_openai_http").OpenAIClient(base_url, timeout=timeout)


def read_metrics(url, timeout):
    """The Prometheus page at ``url`` as {name: value summed over labels}; raises OpenAIHTTPError or PrefixCacheError."""
    base, path = url.split("/metrics", 1)[0], "/metrics"
    text = make_client(base, timeout).get_text(path)
    return module_utils("_prefix_cache").parse_metrics(text)["samples"]


def _first(samples, names):
    for name in names:
        if name in samples:
            return name
    return None


def _complete(router, model, prompt):
    return router.post_json("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0})


def check_routed_prefix(ips, args):
    """Cold and warm request through the router; the pod that served the repeated prefix reports the hit."""
    http = module_utils("_openai_http")
    prefix = module_utils("_prefix_cache")
    if not args.router_url:
        return {"ok": False, "msg": "routed_prefix needs --router-url (the router's OpenAI URL)."}
    engine_urls = dict((ip, "http://%s:%d/metrics" % (_host(ip), args.http_port)) for ip in ips)
    router = make_client(args.router_url, args.timeout)
    try:
        model = args.model or http.model_ids(router.get_json("/v1/models"))[0]
        before = dict((ip, read_metrics(url, args.timeout)) for ip, url in engine_urls.items())
        epp_before = read_metrics(args.epp_metrics_url, args.timeout) if args.epp_metrics_url else None
        shared = prefix.make_nonce() + " " + prefix.filler(args.prefix_words, seed=7)
        _complete(router, model, shared + " cold")
        time.sleep(args.settle)
        _complete(router, model, shared + " warm")
        time.sleep(args.settle)
        after = dict((ip, read_metrics(url, args.timeout)) for ip, url in engine_urls.items())
        epp_after = read_metrics(args.epp_metrics_url, args.timeout) if args.epp_metrics_url else None
    except (http.OpenAIHTTPError, prefix.PrefixCacheError, IndexError) as exc:
        return {"ok": False, "msg": "A request through the router or a metrics read failed: %s" % (str(exc).rstrip(".") or "no model served") + "."}
    hits = {}
    for ip in ips:
        found = prefix.detect_engine(after[ip], args.engine)
        if found:
            hits[ip] = int(round(after[ip].get(found[1], 0.0) - before[ip].get(found[1], 0.0)))
    block = args.block_size or prefix.DEFAULT_BLOCK_SIZE
    served = sorted(ip for ip, value in hits.items() if value >= block)
    result = {"hit_tokens_by_pod": hits, "served_by": served}
    if not hits:
        result.update(ok=False, msg="No engine pod exposes a prefix-cache hit counter on /metrics.")
        return result
    if not served:
        result.update(ok=False, msg=("No engine pod reported a prefix-cache hit of at least one block (%d tokens) for the prefix "
                                     "repeated through the router: the warm request did not reach the pod that cached it." % block))
        return result
    if epp_after is not None:
        admissions = _first(epp_after, EPP_ADMISSIONS)
        if admissions is None:
            result.update(ok=False, msg="The EPP's metrics page has no KV-block index counter (%s): enableMetrics is off or the "
                                        "index is not running." % " or ".join(EPP_ADMISSIONS))
            return result
        admitted = int(round(epp_after[admissions] - epp_before.get(admissions, 0.0)))
        result["epp_admissions"] = admitted
        if admitted <= 0:
            result.update(ok=False, msg="The EPP's KV-block index admitted no block while the engines cached the prefix: it "
                                        "ingested no KV events.")
            return result
        lookups = _first(epp_after, EPP_LOOKUP_HITS)
        looked_up = int(round(epp_after.get(lookups, 0.0) - epp_before.get(lookups, 0.0))) if lookups else 0
        result["epp_lookup_hits"] = looked_up
        if args.scoring_mode == "precise" and looked_up <= 0:
            result.update(ok=False, msg="The EPP's KV-block index found no block of the repeated prefix on lookup, so precise "
                                        "scoring did not see it.")
            return result
    epp_part = (", and the EPP admitted %d KV blocks" % result["epp_admissions"]) if "epp_admissions" in result else ""
    result.update(ok=True, msg="The repeated prefix sent through the router hit the cache of pod %s (%d tokens)%s."
                  % (served[0], hits[served[0]], epp_part))
    return result


def check_kv_index(ips, args):
    """Precise routing proof over every pod at once: a KV-block index from the pods' events predicts each pod's cached tokens."""
    check = module_utils("_kv_index_check")
    engines = []
    for ip in ips:
        topic = args.topic_template.replace("$(POD_IP)", ip)
        engines.append({"name": ip, "url": "http://%s:%d" % (_host(ip), args.http_port), "endpoint": "tcp://%s:%d" % (_host(ip), args.kv_port),
                        "socket_mode": "connect", "topic": topic + (args.model or "") if topic.endswith("@") else topic})
    params = {"engines": engines, "model": args.model, "workload": {"families": 2 * max(len(ips), 1), "rounds": 4, "seed": int(time.time())},
              "expect": {"min_requests": 1, "min_evictions_per_engine": 0}, "max_tokens": 1, "settle": 0.3, "event_wait": 5.0,
              "timeout": 4 * args.timeout, "request_timeout": args.timeout}
    try:
        facts = check.KVIndexCheck(params).run()
    except check.CheckFailed as exc:
        return {"ok": False, "msg": exc.msg, "requests": exc.facts.get("requests"), "exact": exc.facts.get("exact")}
    return {"ok": True, "msg": "The KV-block index predicted every pod's cached tokens exactly (%d/%d)." % (facts["exact"], facts["requests"]),
            "requests": facts["requests"], "exact": facts["exact"], "summary": facts["summary"]}


CHECKS = {"kv_events": check_kv_events, "prefix_cache": check_prefix_cache}
ROUTER_CHECKS = {"routed_prefix": check_routed_prefix}
POOL_CHECKS = {"kv_index": check_kv_index}


def main(argv=None):
    args = parse_args(argv)
    names = [n.strip() for n in args.checks.split(",") if n.strip()]
    unknown = [n for n in names if n not in CHECKS and n not in ROUTER_CHECKS and n not in POOL_CHECKS]
    if unknown or not names:
        sys.stderr.write("error: --checks takes %s, got %s.\n" % (", ".join(sorted(list(CHECKS) + list(ROUTER_CHECKS) + list(POOL_CHECKS))),
                                                                  args.checks))
        return 2
    if args.pods:
        ips = [ip.strip() for ip in args.pods.split(",") if ip.strip()]
    else:
        ips = resolve_pods(args.service, args.http_port, args.expect_pods, args.resolve_timeout)
    report = {"service": args.service, "pods": [], "router": {}, "pool": {}, "ok": True, "msg": ""}
    if len(ips) < args.expect_pods:
        report["ok"] = False
        report["msg"] = "%s resolved to %d pod(s), fewer than the %d expected." % (args.service, len(ips), args.expect_pods)
    pod_names = [n for n in names if n in CHECKS]
    for ip in ips:
        pod = {"ip": ip, "checks": {}}
        for name in pod_names:
            pod["checks"][name] = CHECKS[name](ip, args)
        pod["ok"] = all(c["ok"] for c in pod["checks"].values())
        report["pods"].append(pod)
    for name in (n for n in names if n in ROUTER_CHECKS):
        report["router"][name] = ROUTER_CHECKS[name](ips, args)
    for name in (n for n in names if n in POOL_CHECKS):
        report["pool"][name] = POOL_CHECKS[name](ips, args)
    pool_failed = [n for n, c in report["pool"].items() if not c["ok"]]
    failed = [p for p in report["pods"] if not p["ok"]]
    router_failed = [n for n, c in report["router"].items() if not c["ok"]]
    if failed:
        report["ok"] = False
        first = failed[0]
        bad = [n for n, c in first["checks"].items() if not c["ok"]][0]
        report["msg"] = ("%d of %d pod(s) failed; first: pod %s, %s: %s" % (len(failed), len(ips), first["ip"], bad, first["checks"][bad]["msg"]))
    elif pool_failed:
        report["ok"] = False
        report["msg"] = "Across the pods, %s: %s" % (pool_failed[0], report["pool"][pool_failed[0]]["msg"])
    elif router_failed:
        report["ok"] = False
        report["msg"] = "Through the router, %s: %s" % (router_failed[0], report["router"][router_failed[0]]["msg"])
    elif report["ok"]:
        report["msg"] = "All %d pod(s) passed %s." % (len(ips), " and ".join(names))
    sys.stdout.write(json.dumps(report, sort_keys=True) + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
