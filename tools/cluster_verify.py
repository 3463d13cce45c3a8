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
  pod's own topic (the engines' topic with $(POD_IP) replaced by the pod IP);
* the prefix-cache check (plugins/module_utils/_prefix_cache.py): a cold and a warm request sharing a prefix,
  hits read from that pod's /metrics.

Prints one JSON document (per-pod results) on stdout; exit status 0 when every pod passed and at least
--expect-pods pods were found, 1 otherwise, 2 on a usage or environment error.
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
    parser.add_argument("--checks", default="kv_events,prefix_cache", help="comma-separated: kv_events, prefix_cache")
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
    }
    try:
        facts = check.KVEventsCheck(params).run()
    except check.CheckFailed as exc:
        return {"ok": False, "msg": exc.msg, "counts": exc.facts.get("counts")}
    return {"ok": True, "msg": "KV events arrived under the pod's own topic.", "counts": facts.get("counts"),
            "topics": facts.get("topics")}


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


CHECKS = {"kv_events": check_kv_events, "prefix_cache": check_prefix_cache}


def main(argv=None):
    args = parse_args(argv)
    names = [n.strip() for n in args.checks.split(",") if n.strip()]
    unknown = [n for n in names if n not in CHECKS]
    if unknown or not names:
        sys.stderr.write("error: --checks takes %s, got %s.\n" % (", ".join(sorted(CHECKS)), args.checks))
        return 2
    ips = resolve_pods(args.service, args.http_port, args.expect_pods, args.resolve_timeout)
    report = {"service": args.service, "pods": [], "ok": True, "msg": ""}
    if len(ips) < args.expect_pods:
        report["ok"] = False
        report["msg"] = "%s resolved to %d pod(s), fewer than the %d expected." % (args.service, len(ips), args.expect_pods)
    for ip in ips:
        pod = {"ip": ip, "checks": {}}
        for name in names:
            pod["checks"][name] = CHECKS[name](ip, args)
        pod["ok"] = all(c["ok"] for c in pod["checks"].values())
        report["pods"].append(pod)
    failed = [p for p in report["pods"] if not p["ok"]]
    if failed:
        report["ok"] = False
        first = failed[0]
        bad = [n for n, c in first["checks"].items() if not c["ok"]][0]
        report["msg"] = ("%d of %d pod(s) failed; first: pod %s, %s: %s" % (len(failed), len(ips), first["ip"], bad, first["checks"][bad]["msg"]))
    elif report["ok"]:
        report["msg"] = "All %d pod(s) passed %s." % (len(ips), " and ".join(names))
    sys.stdout.write(json.dumps(report, sort_keys=True) + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
