# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""roles/cluster_verify/files/cluster_verify.py (the in-cluster CLI over the module_utils): per-pod fan-out, pod-count check, report and exit
status (per-pod checks faked); the routed_prefix check against a fake router, fake engines and a fake EPP."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import importlib.util
import json
import os
import socket
import time

import pytest

from ansible_collections.inference_cache.substrate.tests.unit.plugins.net_utils import free_port

TOOL = os.path.join(os.path.dirname(__file__), "..", "..", "..", "roles", "cluster_verify", "files", "cluster_verify.py")


@pytest.fixture
def cli():
    spec = importlib.util.spec_from_file_location("cluster_verify_cli", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_lookup(ips):
    def lookup(host, port, family, kind):  # pylint: disable=unused-argument
        if not ips:
            raise socket.gaierror("no such host")
        return [(socket.AF_INET, kind, 6, "", (ip, port)) for ip in ips]
    return lookup


def test_resolve_waits_boundedly_for_the_expected_pods(cli):
    now = [0.0]
    answers = [["10.0.0.1"], ["10.0.0.1", "10.0.0.2"]]

    def lookup(*args):
        return fake_lookup(answers.pop(0) if len(answers) > 1 else answers[0])(*args)

    ips = cli.resolve_pods("svc", 8000, 2, 10, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s), lookup=lookup)
    assert ips == ["10.0.0.1", "10.0.0.2"]
    assert cli.resolve_pods("svc", 8000, 3, 4, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s),
                            lookup=fake_lookup(["10.0.0.1"])) == ["10.0.0.1"]


def run_main(cli, monkeypatch, capsys, ips, results, argv=()):
    monkeypatch.setattr(cli, "resolve_pods", lambda service, port, expect, timeout: ips)
    seen = []

    def check(name):
        def run(ip, args):
            seen.append((name, ip, args.topic_template.replace("$(POD_IP)", ip)))
            return results.get((name, ip), {"ok": True, "msg": "fine"})
        return run
    monkeypatch.setattr(cli, "CHECKS", {"kv_events": check("kv_events"), "prefix_cache": check("prefix_cache")})
    code = cli.main(["--service", "engines-kv-events.ns.svc.cluster.local", "--expect-pods", "2",
                     "--topic-template", "kv@$(POD_IP):8000@tiny"] + list(argv))
    return code, json.loads(capsys.readouterr().out), seen


def test_every_pod_is_checked_individually(cli, monkeypatch, capsys):
    code, report, seen = run_main(cli, monkeypatch, capsys, ["10.0.0.1", "10.0.0.2"], {})
    assert code == 0 and report["ok"]
    assert report["msg"] == "All 2 pod(s) passed kv_events and prefix_cache."
    assert ("kv_events", "10.0.0.2", "kv@10.0.0.2:8000@tiny") in seen
    assert len(seen) == 4


def test_one_failing_pod_fails_the_run_with_its_sentence(cli, monkeypatch, capsys):
    bad = {("prefix_cache", "10.0.0.2"): {"ok": False, "msg": "The warm request hit no cached tokens."}}
    code, report, _seen = run_main(cli, monkeypatch, capsys, ["10.0.0.1", "10.0.0.2"], bad)
    assert code == 1 and not report["ok"]
    assert report["msg"] == "1 of 2 pod(s) failed; first: pod 10.0.0.2, prefix_cache: The warm request hit no cached tokens."


def test_missing_pods_fail(cli, monkeypatch, capsys):
    code, report, _seen = run_main(cli, monkeypatch, capsys, ["10.0.0.1"], {})
    assert code == 1
    assert report["msg"] == "engines-kv-events.ns.svc.cluster.local resolved to 1 pod(s), fewer than the 2 expected."


def test_unknown_check_is_a_usage_error(cli, monkeypatch, capsys):
    monkeypatch.setattr(cli, "resolve_pods", lambda *a: [])
    assert cli.main(["--service", "x", "--checks", "bogus"]) == 2
    assert "--checks takes epp_route, kv_events, kv_index, prefix_cache, routed_prefix" in capsys.readouterr().err


# -- routed_prefix: requests through the router, hits on the pod that served them, the EPP's index counters --------

class FakeCluster:
    """Two engine pods behind a router. Each pod caches the prompts it served (a hit = the shared leading words,
    one 'token' per word); the EPP counts admitted blocks and lookup hits as a precise index would."""

    def __init__(self, route="affinity", epp_metrics=True, epp_admits=True, epp_names="kvcache_index", lag=0):
        self.pods = {"10.0.0.1": {"prompts": [], "hits": 0, "queries": 0}, "10.0.0.2": {"prompts": [], "hits": 0, "queries": 0}}
        # A pod's /metrics shows a request's hit only from the lag-th read after it on (counters that update late).
        self.lag, self.late = lag, {}
        self.metric_reads = 0
        self.route = route
        self.epp = {"admissions": 0, "lookup_hits": 0} if epp_metrics else None
        self.epp_admits = epp_admits
        self.epp_names = epp_names
        self.served = []

    def pick(self, prompt):
        ips = sorted(self.pods)
        if self.route == "affinity":  # the pod that already holds the longest shared prefix, else the first
            best = max(ips, key=lambda ip: max([shared(prompt, p) for p in self.pods[ip]["prompts"]] or [0]))
            return best
        return ips[len(self.served) % 2]  # round robin: the warm request lands on the other pod

    def complete(self, prompt):
        ip = self.pick(prompt)
        pod = self.pods[ip]
        words = len(prompt.split())
        hit = max([shared(prompt, p) for p in pod["prompts"]] or [0])
        if self.epp is not None and hit and self.route == "affinity":
            self.epp["lookup_hits"] += hit // 32
        pod["hits"] += (hit // 32) * 32
        if self.lag and hit >= 32:
            self.late[ip] = [(hit // 32) * 32, self.lag]
        pod["queries"] += words
        pod["prompts"].append(prompt)
        if self.epp is not None and self.epp_admits:
            self.epp["admissions"] += words // 32
        self.served.append(ip)
        return {"choices": [{"text": "x"}]}

    def metrics(self, ip):
        pod = self.pods[ip]
        self.metric_reads += 1
        hidden = 0
        if ip in self.late and self.late[ip][1] > 0:
            hidden, self.late[ip][1] = self.late[ip][0], self.late[ip][1] - 1
        return ("vllm:prefix_cache_hits_total{model_name=\"tiny\"} %d\nvllm:prefix_cache_queries_total{model_name=\"tiny\"} %d\n"
                % (pod["hits"] - hidden, pod["queries"]))

    def epp_metrics(self):
        return "%s_admissions_total %d\n%s_lookup_hits_total %d\n" % (
            self.epp_names, self.epp["admissions"], self.epp_names, self.epp["lookup_hits"])


def shared(a, b):
    count = 0
    for x, y in zip(a.split(), b.split()):
        if x != y:
            break
        count += 1
    return count


class FakeClient:
    def __init__(self, cluster, base):
        self.cluster, self.base = cluster, base

    def get_text(self, path):
        assert path == "/metrics"
        if "router-epp" in self.base and ":9090" in self.base:
            if self.cluster.epp is None:
                return "go_goroutines 12\n"
            return self.cluster.epp_metrics()
        ip = self.base.split("//")[1].rsplit(":", 1)[0]
        return self.cluster.metrics(ip)

    def get_json(self, path):
        assert path == "/v1/models" and ":8081" in self.base, "models are asked of the router"
        return {"data": [{"id": "tiny"}]}

    def post_json(self, path, body):
        assert path == "/v1/completions" and ":8081" in self.base, "completions go through the router, never to a pod"
        return self.cluster.complete(body["prompt"])


ROUTED_ARGV = ["--service", "engines-kv-events.ns.svc.cluster.local", "--pods", "10.0.0.1,10.0.0.2", "--expect-pods", "2",
               "--checks", "routed_prefix", "--router-url", "http://router-epp.ns:8081", "--block-size", "32",
               "--epp-metrics-url", "http://router-epp.ns:9090/metrics", "--settle", "0", "--prefix-words", "200"]


def run_routed(cli, monkeypatch, capsys, cluster, argv=None):
    monkeypatch.setattr(cli, "make_client", lambda base, timeout: FakeClient(cluster, base))
    code = cli.main(list(ROUTED_ARGV if argv is None else argv))
    return code, json.loads(capsys.readouterr().out)


def test_routed_prefix_passes_when_the_router_keeps_the_prefix_on_one_pod(cli, monkeypatch, capsys):
    cluster = FakeCluster()
    code, report = run_routed(cli, monkeypatch, capsys, cluster)
    result = report["router"]["routed_prefix"]
    assert code == 0 and report["ok"], report
    assert result["served_by"] == ["10.0.0.1"] and result["hit_tokens_by_pod"]["10.0.0.2"] == 0
    assert result["epp_admissions"] > 0 and result["epp_lookup_hits"] > 0
    assert cluster.served == ["10.0.0.1", "10.0.0.1"]
    assert report["pods"] == [{"ip": "10.0.0.1", "checks": {}, "ok": True}, {"ip": "10.0.0.2", "checks": {}, "ok": True}]


def test_routed_prefix_reads_again_until_a_late_hit_counter_moves(cli, monkeypatch, capsys):
    # The serving pod's counter shows the warm hit only from the third read on: read once after a fixed wait, the check
    # would report no hit; it reads again (up to --settle) and stops once the counter moved.
    cluster = FakeCluster(lag=2)
    argv = [a if a != "0" else "1" for a in ROUTED_ARGV]
    code, report = run_routed(cli, monkeypatch, capsys, cluster, argv)
    assert code == 0 and report["router"]["routed_prefix"]["served_by"] == ["10.0.0.1"], report
    # two pods read before, then three rounds of two until the hit shows: no reading on to the deadline
    assert cluster.metric_reads == 2 + 3 * 2


def test_routed_prefix_waits_at_most_settle_for_a_hit_that_never_comes(cli, monkeypatch, capsys):
    cluster = FakeCluster(route="round-robin")
    argv = [a if a != "0" else "0.5" for a in ROUTED_ARGV]
    started = time.monotonic()
    code, report = run_routed(cli, monkeypatch, capsys, cluster, argv)
    assert code == 1 and "No engine pod reported a prefix-cache hit" in report["msg"]
    assert time.monotonic() - started >= 0.5 and cluster.metric_reads > 2 + 2


def test_routed_prefix_fails_when_the_warm_request_lands_elsewhere(cli, monkeypatch, capsys):
    code, report = run_routed(cli, monkeypatch, capsys, FakeCluster(route="round-robin"))
    assert code == 1
    assert report["msg"].startswith("Through the router, routed_prefix: No engine pod reported a prefix-cache hit")


def test_routed_prefix_fails_when_the_epp_ingested_no_events(cli, monkeypatch, capsys):
    code, report = run_routed(cli, monkeypatch, capsys, FakeCluster(epp_admits=False))
    assert code == 1
    assert "admitted no block" in report["msg"] and "ingested no KV events" in report["msg"]


def test_routed_prefix_fails_without_the_index_counters(cli, monkeypatch, capsys):
    code, report = run_routed(cli, monkeypatch, capsys, FakeCluster(epp_metrics=False))
    assert code == 1
    assert "has no KV-block index counter (kvcache_index_admissions_total or llm_d_epp_kv_cache_index_admissions_total)" in report["msg"]


def test_routed_prefix_reads_the_newer_metric_names(cli, monkeypatch, capsys):
    code, report = run_routed(cli, monkeypatch, capsys, FakeCluster(epp_names="llm_d_epp_kv_cache_index"))
    assert code == 0, report


def test_routed_prefix_precise_needs_lookup_hits_approximate_its_own_metrics(cli, monkeypatch, capsys):
    class NoLookups(FakeCluster):
        def epp_metrics(self):
            self.epp["lookup_hits"] = 0
            return FakeCluster.epp_metrics(self)
    code, report = run_routed(cli, monkeypatch, capsys, NoLookups())
    assert code == 1 and "found no block of the repeated prefix on lookup" in report["msg"]
    # Approximate mode reads the approximate producer's metrics, never the precise index's counters (issue 17;
    # tests/integration/test_k8s_cluster_verify_tool.py runs both modes against stand-in EPP pages).
    code, report = run_routed(cli, monkeypatch, capsys, NoLookups(), ROUTED_ARGV + ["--scoring-mode", "approximate"])
    assert code == 1 and "has no approximate prefix indexer metric" in report["msg"], report


def test_routed_prefix_needs_the_router_url(cli, monkeypatch, capsys):
    argv = [a for a in ROUTED_ARGV if a != "http://router-epp.ns:8081" and a != "--router-url"]
    code, report = run_routed(cli, monkeypatch, capsys, FakeCluster(), argv)
    assert code == 1 and report["msg"] == "Through the router, routed_prefix: routed_prefix needs --router-url (the router's OpenAI URL)."


def test_routed_prefix_fails_when_the_pods_expose_no_hit_counter(cli, monkeypatch, capsys):
    class Bare(FakeCluster):
        def metrics(self, ip):
            return "process_cpu_seconds_total 1\n"
    code, report = run_routed(cli, monkeypatch, capsys, Bare())
    assert code == 1
    assert report["msg"] == "Through the router, routed_prefix: No engine pod exposes a prefix-cache hit counter on /metrics."


# -- epp_route: the prefix warmed through the router, then the EPP asked over ext_proc where it goes ---------------

def _epp_route_args(cli, engines, epp, router_url):
    ips = ["127.0.0.1"]
    args = cli.parse_args(["--service", "x", "--checks", "epp_route", "--http-port", str(engines[0].port), "--model", "tiny",
                           "--topic-template", engines[0].topic.decode().replace("127.0.0.1", "$(POD_IP)"),
                           "--kv-port", engines[0].endpoint.rsplit(":", 1)[1], "--router-url", router_url,
                           "--epp-address", epp.address, "--settle", "0.1", "--prefix-words", "60", "--timeout", "20"])
    return ips, args


def test_epp_route_passes_when_the_epp_picks_the_pod_holding_the_prefix(cli):
    from ansible_collections.inference_cache.substrate.tests.unit.plugins.fake_epp import FakeEPP  # pylint: disable=import-outside-toplevel
    from ansible_collections.inference_cache.substrate.tests.unit.plugins.kv_index_fake import FakeEngine  # pylint: disable=import-outside-toplevel
    port, kv = free_port(), free_port()
    with FakeEngine(port, "tcp://127.0.0.1:%d" % kv, "kv@127.0.0.1:%d@tiny" % port) as engine:
        with FakeEPP(pick="127.0.0.1:%d" % port) as epp:
            ips, args = _epp_route_args(cli, [engine], epp, engine.url)
            result = cli.check_epp_route(ips, args)
    assert result["ok"], result
    assert [p["holds_longest"] for p in result["picks"]] == [True, True]
    assert result["picks"][0]["longest_tokens"] > 0   # the warmed prefix is held: the pick was judged against it


def test_epp_route_fails_when_the_epp_picks_an_endpoint_it_does_not_know(cli):
    from ansible_collections.inference_cache.substrate.tests.unit.plugins.fake_epp import FakeEPP  # pylint: disable=import-outside-toplevel
    from ansible_collections.inference_cache.substrate.tests.unit.plugins.kv_index_fake import FakeEngine  # pylint: disable=import-outside-toplevel
    port, kv = free_port(), free_port()
    with FakeEngine(port, "tcp://127.0.0.1:%d" % kv, "kv@127.0.0.1:%d@tiny" % port) as engine:
        with FakeEPP(pick="10.1.2.3:8000") as epp:
            ips, args = _epp_route_args(cli, [engine], epp, engine.url)
            result = cli.check_epp_route(ips, args)
    assert not result["ok"]
    assert "The EPP picked 10.1.2.3:8000 for request warm prefix, which is none of the engines given" in result["msg"]


def test_epp_route_needs_its_addresses(cli):
    args = cli.parse_args(["--service", "x", "--checks", "epp_route"])
    assert cli.check_epp_route(["10.0.0.1"], args)["msg"] == "epp_route needs --epp-address (the EPP's ext_proc service, host:port)."
