#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Verify every engine pod individually from inside the cluster (run by the cluster_verify role's Job).

A NodePort or ClusterIP in front of several pods reaches a random one, so this tool resolves the engines'
headless Service (one DNS record per ready pod) and runs, against each pod IP in turn:

* the KV-event check (plugins/module_utils/kv/events_check.py): SUB-connect to tcp://<pod>:<kv port> (the engines
  bind tcp://*:<port>), send one trigger completion to that same pod, expect BlockStored events under the
  pod's own topic (the engines' topic with $(POD_IP) replaced by the pod IP), each batch one the EPP v0.9.0's
  KV-event decoder takes (required with --scoring-mode precise);
* the prefix-cache check (plugins/module_utils/http/prefix_cache.py): a cold and a warm request sharing a prefix,
  hits read from that pod's /metrics.

and once, through the router (checks in ROUTER_CHECKS):

* epp_route: the prefix warmed through the router, then the EPP asked over ext_proc (--epp-address; the route check,
  plugins/module_utils/epp/route_check.py) where the same prefix with another question goes: its pick must hold the
  longest cached prefix by the pods' KV events (and a prompt nobody holds is asked too);
* routed_prefix: a cold and a warm request sharing a long prefix sent to the router's URL (--router-url, the
  proxy beside the EPP), never to a pod. The engine pod that served the repeated prefix must report the hit
  (its prefix-cache hit counter moves by at least one block). With --epp-metrics-url, the EPP's own evidence
  (epp_evidence in the report): in precise mode its KV-block index admitted blocks (KV events ingested) and found
  the prefix on lookup; with --speculative-indexing those counters also move at routing time, so only a lookup hit
  after the speculative entries expired (the warm request waits out --speculative-ttl) counts as KV-event evidence;
  in approximate mode (P/D included) the EPP consumes no KV events and the approximate producer's prefix indexer
  must have recorded both requests and matched the prefix.

Prints one JSON document (per-pod results, then the router's) on stdout; exit status 0 when every check passed
and at least --expect-pods pods were found, 1 otherwise, 2 on a usage or environment error. A new per-pod check
is one function ``check_<name>(ip, args)`` plus one entry in CHECKS; a check that runs once is one function
``check_<name>(ips, args)`` plus one entry in ROUTER_CHECKS (through the router) or POOL_CHECKS (over every pod at once:
kv_index, plugins/module_utils/kv/index_check.py: a KV-block index built from all pods' events must predict the
cached tokens each pod reports for a generated workload).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import argparse
import importlib.util
import json
import os
import socket
import sys
import time

# The collection's Python by its full name, through its one loader (plugins/module_utils/_loader.py), found from this
# file's place in the collection (roles/cluster_verify/files/): in the Job the ConfigMap mounts both at the same relative
# paths. module_utils("kv.events_check") loads ansible_collections.inference_cache.substrate.plugins.module_utils.kv.events_check
# where it is used, so a check whose libraries the image lacks fails alone.
_LOADER_SPEC = importlib.util.spec_from_file_location(
    "inference_cache_substrate_loader", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "plugins", "module_utils", "_loader.py"))
_LOADER = importlib.util.module_from_spec(_LOADER_SPEC)
_LOADER_SPEC.loader.exec_module(_LOADER)
module_utils = _LOADER.module_utils


def _errors():
    """The collection's one error type: plugins/module_utils/common/errors.py."""
    return module_utils("common.errors")


def _wiring():
    """The KV-event wiring contract (topic form, router version): plugins/module_utils/common/wiring.py."""
    return module_utils("common.wiring")


def parse_args(argv):
    # The engines' topic as model_server generates it, with the pod IP and the model left open.
    default_topic = _wiring().kv_topic("$(POD_IP)", 8000, "")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--service", required=True, help="headless Service DNS name of the engines")
    parser.add_argument("--expect-pods", type=int, default=1, help="fail unless at least this many pods resolve")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--kv-port", type=int, default=5557)
    parser.add_argument("--topic-template", default=default_topic,
                        help="the engines' topic; $(POD_IP) is replaced by each pod's IP (default %s)" % default_topic.replace("%", "%%"))
    parser.add_argument("--model", default=None, help="served model name (default: the first of /v1/models)")
    parser.add_argument("--engine", default="auto", choices=["auto", "vllm", "sglang"])
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--checks", default="kv_events,prefix_cache",
                        help="comma-separated: kv_events, prefix_cache (per pod), routed_prefix (through the router), "
                             "kv_index (over every pod at once)")
    parser.add_argument("--pods", default="", help="comma-separated pod IPs to check instead of resolving --service")
    parser.add_argument("--router-url", default="", help="the router's OpenAI URL (routed_prefix), e.g. http://<release>-epp.<ns>:8081")
    parser.add_argument("--epp-metrics-url", default="", help="the EPP's metrics page (routed_prefix), e.g. http://<release>-epp.<ns>:9090/metrics")
    parser.add_argument("--epp-address", default="",
                        help="the EPP's ext_proc service (epp_route), e.g. <release>-epp.<ns>.svc.cluster.local:9002")
    parser.add_argument("--epp-tls", action="store_true",
                        help="the EPP serves ext_proc over TLS (its default, --secure-serving=true; its certificate is self-signed)")
    parser.add_argument("--scoring-mode", default="precise", choices=["precise", "approximate"],
                        help="precise: the EPP's KV-block index must admit the KV events and find the repeated prefix on lookup; "
                             "approximate: the approximate producer's prefix indexer must match it")
    parser.add_argument("--speculative-indexing", action="store_true",
                        help="precise mode with speculativeIndexing: the index counters also move at routing time")
    parser.add_argument("--speculative-ttl", default="2s",
                        help="the precise producer's speculativeTTL (Go duration, v0.9.0 default 2s); the warm request waits it out")
    parser.add_argument("--prefix-words", type=int, default=400, help="words of shared prefix in routed_prefix")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds between the cold and the warm request (events reach the EPP), and at most "
                        "this long after the warm request for a pod's hit counter to move")
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
    check = module_utils("kv.events_check")
    base = "http://%s:%d" % (_host(ip), args.http_port)
    params = {
        "endpoint": "tcp://%s:%d" % (_host(ip), args.kv_port), "socket_mode": "connect",
        "topic": args.topic_template.replace("$(POD_IP)", ip), "engine": args.engine,
        "data_parallel_size": 1, "replay_endpoint": None, "timeout": args.timeout, "expect": None, "settle": 1.0,
        "include_token_ids": False, "trigger": {"url": base, "model": args.model, "max_tokens": 1, "delay": 1.0, "headers": {}},
        # Precise mode: every batch must be one the EPP v0.9.0's decoder takes, or its index silently misses those blocks.
        "router_version": _wiring().ROUTER_VERSION, "expect_router_decodes": args.scoring_mode == "precise",
    }
    try:
        facts = check.KVEventsCheck(params).run()
    except _errors().CheckError as exc:
        return {"ok": False, "msg": exc.msg, "counts": exc.facts.get("counts")}
    return {"ok": True, "msg": "KV events arrived under the pod's own topic.", "counts": facts.get("counts"),
            "topics": facts.get("topics"), "router_decoder": facts.get("router_decoder")}


def check_prefix_cache(ip, args):
    http = module_utils("http.openai")
    prefix = module_utils("http.prefix_cache")
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


# The EPP's KV-block index counters (indexerConfig.kvBlockIndexConfig.enableMetrics), registered only by the precise
# producer's index. llm-d-kv-cache@v0.9.0 (the router's pinned module: pkg/kvcache/metrics/collector.go,
# counted in pkg/kvcache/kvblock/instrumented_index.go) names them kvcache_index_*; the router's own copy after v0.9.0
# names them llm_d_epp_kv_cache_index_*. Either is accepted, the first found wins.
EPP_ADMISSIONS = ("kvcache_index_admissions_total", "llm_d_epp_kv_cache_index_admissions_total")
EPP_LOOKUP_HITS = ("kvcache_index_lookup_hits_total", "llm_d_epp_kv_cache_index_lookup_hits_total")
# Approximate mode: the approximate producer (the default producer of prefix-cache-scorer, llm-d-router@v0.9.0:
# cmd/epp/runner/runner.go) observes, once per routed request, the bytes of the prompt that matched the picked pod
# (pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix/metrics.go and plugin.go PreRequest), as a
# histogram under its name and a deprecated one. It registers no kvcache_index_* counter.
EPP_APPROX_HIT_BYTES = ("llm_d_epp_prefix_indexer_hit_bytes", "inference_extension_prefix_indexer_hit_bytes")
# Seconds beyond speculativeTTL before the warm request: the TTL cache evicts on its own timer (prerequest.go).
SPECULATIVE_MARGIN = 1.0
_GO_UNITS = (("ns", 1e-9), ("us", 1e-6), ("\u00b5s", 1e-6), ("ms", 1e-3), ("s", 1.0), ("m", 60.0), ("h", 3600.0))


def parse_go_duration(text):
    """Seconds of a Go duration string (``2s``, ``500ms``, ``1m30s``); ValueError when it is not one."""
    rest, total = str(text).strip(), 0.0
    if rest == "0":
        return 0.0
    if not rest:
        raise ValueError("empty duration")
    while rest:
        number = ""
        while rest and (rest[0].isdigit() or rest[0] == "."):
            number, rest = number + rest[0], rest[1:]
        unit = next((u for u, _f in sorted(_GO_UNITS, key=lambda x: -len(x[0])) if rest.startswith(u)), None)
        if not number or unit is None:
            raise ValueError("not a Go duration: %r" % text)
        total += float(number) * dict(_GO_UNITS)[unit]
        rest = rest[len(unit):]
    return total


def make_client(base_url, timeout):
    return module_utils("http.openai").OpenAIClient(base_url, timeout=timeout)


def read_metrics(url, timeout):
    """The Prometheus page at ``url`` as {name: value summed over labels}; raises OpenAIHTTPError or PrefixCacheError."""
    base, path = url.split("/metrics", 1)[0], "/metrics"
    text = make_client(base, timeout).get_text(path)
    return module_utils("http.prefix_cache").parse_metrics(text)["samples"]


def _first(samples, names):
    for name in names:
        if name in samples:
            return name
    return None


def _complete(router, model, prompt):
    return router.post_json("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0})


def _moved(after, before, name):
    return int(round(after.get(name, 0.0) - before.get(name, 0.0))) if name else 0


def _speculative_wait(args):
    """(seconds the warm request waits, speculativeTTL in seconds or None): past the TTL when that fits in --timeout."""
    if args.scoring_mode != "precise" or not args.speculative_indexing:
        return args.settle, None
    ttl = parse_go_duration(args.speculative_ttl)
    if ttl + SPECULATIVE_MARGIN > args.timeout:
        return args.settle, ttl
    return max(args.settle, ttl + SPECULATIVE_MARGIN), ttl


def _approximate_evidence(args, before, mid, after):
    """Approximate mode: the approximate producer recorded both routed requests and matched the warm one's prefix."""
    name = _first(after, tuple(n + "_count" for n in EPP_APPROX_HIT_BYTES))
    if name is None:
        return {"ok": False, "msg": "The EPP's metrics page has no approximate prefix indexer metric (%s): the approximate producer "
                                    "behind prefix-cache-scorer did not record the routed requests." % " or ".join(EPP_APPROX_HIT_BYTES)}
    total = name[:-len("_count")] + "_sum"
    recorded, matched = _moved(after, before, name), _moved(after, mid, total)
    facts = {"epp_evidence": "approximate_indexer", "kv_events": "not consumed in approximate mode",
             "epp_prefix_lookups": recorded, "epp_prefix_match_bytes": matched}
    if recorded < 2:
        facts.update(ok=False, msg="The EPP's approximate prefix indexer recorded %d of the 2 requests sent through the router "
                                   "(%s), so it did not score them." % (recorded, name))
    elif matched <= 0:
        facts.update(ok=False, msg="The EPP's approximate prefix indexer matched none of the repeated prefix on the pod it picked "
                                   "for the warm request (%s did not move), so prefix-aware scoring did not see it." % total)
    else:
        facts.update(ok=True, note="approximate mode: the EPP consumes no KV events; its approximate prefix indexer matched "
                                   "about %d bytes of the repeated prefix" % matched)
    return facts


def _precise_evidence(args, before, mid, after, ttl, waited):
    """Precise mode: the KV-block index ingested the engines' KV events and found the prefix on lookup."""
    admissions = _first(after, EPP_ADMISSIONS)
    if admissions is None:
        return {"ok": False, "msg": "The EPP's metrics page has no KV-block index counter (%s): enableMetrics is off or the "
                                    "index is not running." % " or ".join(EPP_ADMISSIONS)}
    lookups = _first(after, EPP_LOOKUP_HITS)
    # Lookup hits of the warm request alone (read between the two requests).
    facts = {"epp_admissions": _moved(after, before, admissions), "epp_lookup_hits": _moved(after, mid, lookups)}
    if not args.speculative_indexing:
        facts["epp_evidence"] = "kv_events"
        if facts["epp_admissions"] <= 0:
            facts.update(ok=False, msg="The EPP's KV-block index admitted no block while the engines cached the prefix: it ingested "
                                       "no KV events.")
        elif facts["epp_lookup_hits"] <= 0:
            facts.update(ok=False, msg="The EPP's KV-block index found no block of the repeated prefix on lookup, so precise scoring "
                                       "did not see it.")
        else:
            facts.update(ok=True, note="the EPP admitted %d KV blocks and found %d of the prefix on lookup"
                                       % (facts["epp_admissions"], facts["epp_lookup_hits"]))
        return facts
    # Speculative indexing adds index entries (and admissions, lookup hits) at routing time, with no KV event
    # (llm-d-router@v0.9.0 .../preciseprefixcache/prerequest.go PreRequest -> Index.Add); no counter tells the two apart.
    # Its entries are evicted after speculativeTTL, and only they (PodEntry.Speculative), so a lookup hit of a warm
    # request sent after the TTL comes from entries the KV events made.
    facts["epp_admissions_note"] = "moves at routing time with speculative indexing: no evidence of KV events"
    if waited < ttl + SPECULATIVE_MARGIN:
        facts.update(ok=True, epp_evidence="not_provable", kv_events="not provable",
                     note="whether KV events reached the EPP is not provable: with speculative indexing its index counters move at "
                          "routing time, and speculativeTTL (%s) is longer than the check timeout (%gs) the warm request could "
                          "wait" % (args.speculative_ttl, args.timeout))
    elif facts["epp_lookup_hits"] <= 0:
        facts.update(ok=False, epp_evidence="kv_events_after_speculative_ttl",
                     msg="The EPP's KV-block index found no block of the repeated prefix once its speculative entries had expired "
                         "(speculativeTTL %s): no KV event from the engines reached it (with speculative indexing its admissions "
                         "move at routing time and prove nothing)." % args.speculative_ttl)
    else:
        facts.update(ok=True, epp_evidence="kv_events_after_speculative_ttl",
                     note="after its speculative entries expired (speculativeTTL %s) the EPP's index still found %d blocks of the "
                          "prefix, entries only KV events make" % (args.speculative_ttl, facts["epp_lookup_hits"]))
    return facts


def _hit_tokens(after, before, engine):
    """Hit tokens each pod's counter moved by, for the pods that expose one."""
    hits = {}
    for ip, samples in after.items():
        found = module_utils("http.prefix_cache").detect_engine(samples, engine)
        if found:
            hits[ip] = int(round(samples.get(found[1], 0.0) - before[ip].get(found[1], 0.0)))
    return hits


def _read_until_hit(engine_urls, before, block, args):
    """(metrics, hit tokens by pod) after the warm request: read again (every 0.2 s, up to --settle seconds) until a pod's
    hit counter moved by a block, so a pass costs no fixed wait and a miss waits --settle for a counter that updates late."""
    deadline = time.monotonic() + args.settle
    while True:
        after = dict((ip, read_metrics(url, args.timeout)) for ip, url in engine_urls.items())
        hits = _hit_tokens(after, before, args.engine)
        if any(v >= block for v in hits.values()) or time.monotonic() >= deadline:
            return after, hits
        time.sleep(min(0.2, max(deadline - time.monotonic(), 0.0)))


def check_routed_prefix(ips, args):
    """Cold and warm request through the router; the pod that served the repeated prefix reports the hit."""
    http = module_utils("http.openai")
    prefix = module_utils("http.prefix_cache")
    if not args.router_url:
        return {"ok": False, "msg": "routed_prefix needs --router-url (the router's OpenAI URL)."}
    try:
        wait, ttl = _speculative_wait(args)
    except ValueError:
        return {"ok": False, "msg": "--speculative-ttl %s is not a Go duration (e.g. 2s, 500ms)." % args.speculative_ttl}
    engine_urls = dict((ip, "http://%s:%d/metrics" % (_host(ip), args.http_port)) for ip in ips)
    block = args.block_size or prefix.DEFAULT_BLOCK_SIZE
    router = make_client(args.router_url, args.timeout)
    try:
        model = args.model or http.model_ids(router.get_json("/v1/models"))[0]
        before = dict((ip, read_metrics(url, args.timeout)) for ip, url in engine_urls.items())
        epp_before = read_metrics(args.epp_metrics_url, args.timeout) if args.epp_metrics_url else None
        shared = prefix.make_nonce() + " " + prefix.filler(args.prefix_words, seed=7)
        _complete(router, model, shared + " cold")
        time.sleep(wait)
        epp_mid = read_metrics(args.epp_metrics_url, args.timeout) if args.epp_metrics_url else None
        _complete(router, model, shared + " warm")
        after, hits = _read_until_hit(engine_urls, before, block, args)
        epp_after = read_metrics(args.epp_metrics_url, args.timeout) if args.epp_metrics_url else None
    except (http.OpenAIHTTPError, prefix.PrefixCacheError, IndexError) as exc:
        return {"ok": False, "msg": "A request through the router or a metrics read failed: %s" % (str(exc).rstrip(".") or "no model served") + "."}
    served = sorted(ip for ip, value in hits.items() if value >= block)
    result = {"hit_tokens_by_pod": hits, "served_by": served}
    if not hits:
        result.update(ok=False, msg="No engine pod exposes a prefix-cache hit counter on /metrics.")
        return result
    if not served:
        result.update(ok=False, msg=("No engine pod reported a prefix-cache hit of at least one block (%d tokens) for the prefix "
                                     "repeated through the router: the warm request did not reach the pod that cached it." % block))
        return result
    note = ""
    if epp_after is not None:
        if args.scoring_mode == "approximate":
            evidence = _approximate_evidence(args, epp_before, epp_mid, epp_after)
        else:
            evidence = _precise_evidence(args, epp_before, epp_mid, epp_after, ttl, wait)
        ok, msg, note = evidence.pop("ok"), evidence.pop("msg", ""), evidence.pop("note", "")
        result.update(evidence)
        if not ok:
            result.update(ok=False, msg=msg)
            return result
    result.update(ok=True, msg="The repeated prefix sent through the router hit the cache of pod %s (%d tokens)%s."
                  % (served[0], hits[served[0]], "; " + note if note else ""))
    return result


def check_kv_index(ips, args):
    """Precise routing proof over every pod at once: a KV-block index from the pods' events predicts each pod's cached tokens."""
    check = module_utils("kv.index_check")
    params = {"engines": _pod_engines(ips, args), "model": args.model, "workload": {"families": 2 * max(len(ips), 1), "rounds": 4, "seed": int(time.time())},
              "expect": {"min_requests": 1, "min_evictions_per_engine": 0}, "max_tokens": 1, "settle": 0.3, "event_wait": 5.0,
              "timeout": 4 * args.timeout, "request_timeout": args.timeout}
    try:
        facts = check.KVIndexCheck(params).run()
    except _errors().CheckError as exc:
        return {"ok": False, "msg": exc.msg, "requests": exc.facts.get("requests"), "exact": exc.facts.get("exact")}
    return {"ok": True, "msg": "The KV-block index predicted every pod's cached tokens exactly (%d/%d)." % (facts["exact"], facts["requests"]),
            "requests": facts["requests"], "exact": facts["exact"], "summary": facts["summary"]}


def _pod_engines(ips, args):
    """Each pod as an engine of the KV-block index checks: its HTTP server, KV-event stream and topic."""
    engines = []
    for ip in ips:
        topic = args.topic_template.replace("$(POD_IP)", ip)
        engines.append({"name": ip, "url": "http://%s:%d" % (_host(ip), args.http_port), "endpoint": "tcp://%s:%d" % (_host(ip), args.kv_port),
                        "socket_mode": "connect", "topic": topic + (args.model or "") if topic.endswith("@") else topic})
    return engines


def check_epp_route(ips, args):
    """Ask the EPP over ext_proc where it routes a prompt whose prefix a pod holds: its pick must hold the longest cached prefix.

    The prefix is warmed through the router once the pods' KV-event streams are open (so the index sees its blocks, and
    an approximate producer records that routing); then the EPP is asked, without sending the request on, where the
    same prefix with another question goes, and a prompt nobody holds is asked too.
    """
    if not args.epp_address:
        return {"ok": False, "msg": "epp_route needs --epp-address (the EPP's ext_proc service, host:port)."}
    if not args.router_url:
        return {"ok": False, "msg": "epp_route needs --router-url (the router's OpenAI URL) to warm a prefix through the router."}
    extproc = module_utils("epp.extproc")
    if not extproc.HAS_EXTPROC:
        return {"ok": False, "msg": "epp_route needs the Python libraries grpcio and xds-protos in the verifier's image "
                                    "(cluster_verify_image); leave epp_route out of cluster_verify_checks for an image without them."}
    route = module_utils("epp.route_check")
    prefix = module_utils("http.prefix_cache")
    shared = prefix.make_nonce() + " " + prefix.filler(args.prefix_words, seed=11)
    params = {"epp": {"address": args.epp_address, "tls": args.epp_tls, "validate_certs": False}, "engines": _pod_engines(ips, args),
              "requests": [{"name": "warm prefix", "prompt": shared + " second question"},
                           {"name": "cold prompt", "prompt": prefix.make_nonce() + " " + prefix.filler(40, seed=13)}],
              "model": args.model, "settle": args.settle, "timeout": 4 * args.timeout, "request_timeout": args.timeout}
    checker = route.RouteCheck(params)

    def warm():
        _complete(make_client(args.router_url, args.timeout), checker.model or args.model, shared + " first question")

    try:
        facts = checker.run(warm=warm)
    except _errors().CheckError as exc:
        return {"ok": False, "msg": exc.msg, "picks": exc.facts.get("picks")}
    except module_utils("http.openai").OpenAIHTTPError as exc:
        return {"ok": False, "msg": "The warm request through the router failed: %s." % str(exc).rstrip(".")}
    if not facts["warm_requests"]:
        return {"ok": False, "msg": "No pod's KV events showed the prefix warmed through the router, so the EPP's pick could not be "
                                    "held against it.", "picks": facts["picks"]}
    return {"ok": True, "msg": "The EPP picked the pod holding the longest cached prefix: %s." % facts["summary"], "picks": facts["picks"]}


CHECKS = {"kv_events": check_kv_events, "prefix_cache": check_prefix_cache}
ROUTER_CHECKS = {"routed_prefix": check_routed_prefix, "epp_route": check_epp_route}
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
