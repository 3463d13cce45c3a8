# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""benchmarks/bench_routing.py without engines: the named workloads, the engine and EPP-config arguments, the checks.

The runs on real engines (and the real EPP) are ``make bench-routing`` and ``make study-routing``; here the parts
that decide what those runs send and refuse.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import argparse
import os
import random
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import bench_routing as B  # noqa: E402  pylint: disable=wrong-import-position


def test_every_named_workload_has_a_note_and_known_parameters():
    assert set(B.WORKLOADS) == set(B.WORKLOAD_NOTES)
    for name, overrides in B.WORKLOADS.items():
        assert set(overrides) <= set(B.DEFAULTS), name
    assert B.workload_spec("pressure", tenants=None, zipf=0.5)["zipf"] == 0.5
    assert B.workload_spec("pressure", tenants=None)["tenants"] == 12


def test_same_seed_same_prompts_behind_another_tag():
    spec = B.workload_spec("bench")
    one, two = B.build_workload("r11111:", 40, spec, 3), B.build_workload("r22222:", 40, spec, 3)
    assert [r.prompt.replace("r11111:", "r22222:") for r in one] == [r.prompt for r in two]
    assert all(r.prompt.startswith("r11111: tenant ") for r in one)
    assert [r.prompt for r in B.build_workload("r11111:", 40, spec, 4)] != [r.prompt for r in one]
    assert any(r.kind == "follow-up" for r in one)


def test_bursts_share_a_tenant_and_a_group():
    requests = B.build_workload("r1:", 20, B.workload_spec("bursts"), 0)
    assert len(requests) == 20
    groups = {}
    for r in requests:
        groups.setdefault(r.group, []).append(r)
    assert [len(g) for g in groups.values()] == [4] * 5
    for members in groups.values():
        assert len(set(r.tenant for r in members)) == 1 and all(r.kind == "new" for r in members)
        assert len(set(r.prompt for r in members)) == 4   # new questions on one prefix


def test_hot_cold_sends_one_shot_cold_prompts_beside_two_hot_tenants():
    requests = B.build_workload("r1:", 200, B.workload_spec("hot-cold"), 0)
    cold = [r for r in requests if r.kind == "cold"]
    hot = [r for r in requests if r.kind != "cold"]
    assert 70 < len(cold) < 130 and len(set(r.tenant for r in cold)) == len(cold)
    assert set(r.tenant for r in hot) == {0, 1}


def test_fit_prefix_words_reaches_the_working_set():
    class Bench:   # distinct blocks: one per 4 prefix words per tenant (a stand-in tokenizer)
        @staticmethod
        def cache_blocks():
            return 144

        @staticmethod
        def distinct_blocks(requests):
            return len(set((r.tenant, i) for r in requests for i in range(len(r.prompt.split(":", 1)[1].split()) // 4)))
    spec = B.workload_spec("pressure")
    words = B.fit_prefix_words(Bench, spec, 80, 0)
    got = Bench.distinct_blocks(B.build_workload("r1:", 80, dict(spec, prefix_words=words), 0))
    assert abs(got - 1.9 * 144) <= 0.1 * 1.9 * 144, (words, got)


def test_engine_argument_takes_a_host_and_names_what_it_wants():
    spec = B.parse_engine("b=127.0.0.2:8401,5802,5803")
    assert spec["url"] == "http://127.0.0.2:8401" and spec["endpoint"] == "tcp://127.0.0.1:5802" and spec["host"] == "127.0.0.2"
    assert spec["topic"].startswith("kv@127.0.0.2:8401@")
    assert B.parse_engine("a=8400,5800,5801")["url"] == "http://127.0.0.1:8400"
    with pytest.raises(argparse.ArgumentTypeError, match=r"^--engine wants NAME=\[HOST:\]PORT,EVENTS_PORT,REPLAY_PORT, got 'a=x'$"):
        B.parse_engine("a=x")


def test_epp_config_argument(tmp_path):
    good = tmp_path / "c.yaml"
    good.write_text("apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins: []\n")
    assert B.parse_epp_config("precise=%s" % good) == ("precise", {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig", "plugins": []})
    with pytest.raises(argparse.ArgumentTypeError, match=r"^--epp-config wants NAME=PATH, got 'nothing'$"):
        B.parse_epp_config("nothing")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^--epp-config x: cannot read .*missing"):
        B.parse_epp_config("x=%s" % (tmp_path / "missing"))
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(argparse.ArgumentTypeError, match=r"holds no EndpointPickerConfig mapping$"):
        B.parse_epp_config("x=%s" % (tmp_path / "list.yaml"))


def _precise(size, port):
    return {"plugins": [{"type": "precise-prefix-cache-producer", "parameters": {
        "tokenProcessorConfig": {"blockSizeTokens": size}, "kvEventsConfig": {"discoverPods": True, "podDiscoveryConfig": {"socketPort": port}}}}]}


def test_epp_configs_must_hash_the_engines_blocks_and_dial_the_relays():
    lane = B.EPPLane("/bin/true", {"precise": _precise(32, 5810), "approximate": {"plugins": [{"type": "prefix-cache-scorer"}]}}, [], 5810, "/tmp")
    lane.check_configs(32)
    with pytest.raises(B.errors.CheckError, match=r"^EPP config precise hashes blocks of 32 tokens but the engines' blocks hold 16: "):
        lane.check_configs(16)
    lane.configs["precise"] = _precise(32, 5557)
    with pytest.raises(B.errors.CheckError, match=r"^EPP config precise dials KV events on port 5557 but the relays publish on 5810: "
                       r"render it with kv_events_port 5810, or pass --kv-port 5557\.$"):
        lane.check_configs(32)


@pytest.mark.parametrize("argv, sentence", [
    (["--workload", "nope"], "unknown workload in 'nope': the workloads are "),
    (["--policies", "precise,epp:x"], "unknown policies epp:x: the policies are "),
    (["--workload", "restart"], "the restart workload needs the engines' service records: give --engines-file (make bench-routing does)"),
])
def test_bad_arguments_get_one_sentence(argv, sentence):
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_routing.py")] + argv, capture_output=True,
                         text=True, check=False, timeout=60)
    assert run.returncode == 2 and sentence in run.stderr and "Traceback" not in run.stderr, run.stderr


def test_without_engines_it_skips_and_says_so():
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_routing.py"), "--engine", "a=1,2,3", "--engine",
                          "b=4,5,6"], capture_output=True, text=True, check=False, timeout=60)
    assert run.returncode == 0 and run.stdout.startswith("bench_routing: skipped: engine a is not reachable ("), run.stdout


def test_the_workloads_that_reset_or_restart_send_one_request_at_a_time():
    """run_policy resets and restarts only between sequential requests; a concurrent one would never see them."""
    for name in B.WORKLOADS:
        spec = B.workload_spec(name)
        if spec["reset_at"] is not None or spec["restart_at"] is not None:
            assert B.sequential(spec), name
    assert not B.sequential(B.workload_spec("bursts")) and not B.sequential(B.workload_spec("pressure-concurrent"))


# ---- real EPPs: which ones, their policies and configurations, the GIE lane's engines (no engine, no EPP started) ----

def test_epp_argument_names_an_epp_by_word_or_path():
    assert B.parse_epp("gie") == ("gie", None) and B.parse_epp("llm-d") == ("llm-d", None)
    assert B.parse_epp("/opt/epp") == ("llm-d", "/opt/epp") and B.parse_epp("./epp") == ("llm-d", "./epp")
    assert B.parse_epp("gie=/opt/gie-epp") == ("gie", "/opt/gie-epp") and B.parse_epp("llm-d=/opt/epp") == ("llm-d", "/opt/epp")
    for bad in ("", "nope=/opt/epp"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"^--epp wants a binary's path, gie or llm-d, or IMPL=PATH "):
            B.parse_epp(bad)


def test_which_epps_are_asked_for():
    assert B.asked_epps([("gie", None), ("llm-d", "/opt/epp")], env={}) == [("gie", None), ("llm-d", "/opt/epp")]
    assert B.asked_epps([], env={}) == [(None, None)]   # llm-d's where it can be had, else the GIE EPP
    assert B.asked_epps([], env={"SUBSTRATE_EPP_BINARY": "/opt/epp"}) == [("llm-d", "/opt/epp")]
    assert B.asked_epps([], env={"SUBSTRATE_EPP_BINARY": "/opt/g", "SUBSTRATE_EPP_IMPL": "gie"}) == [("gie", "/opt/g")]
    with pytest.raises(argparse.ArgumentTypeError, match=r"^--epp names the llm-d EPP more than once; give each EPP once$"):
        B.asked_epps([("llm-d", "/a"), ("llm-d", None)], env={})


def test_policies_are_named_per_epp_and_routers_say_which_ran_them():
    configs = {"llm-d": [("precise", {}), ("approximate", {})], "gie": [("gie", {}), ("gie-equal", {})]}
    assert B.epp_policies(configs) == {"epp:gie": "gie", "epp:gie-equal": "gie", "epp:precise": "llm-d", "epp:approximate": "llm-d"}
    with pytest.raises(argparse.ArgumentTypeError, match=r"^configuration approximate is given for both the gie and the llm-d EPP; "):
        B.epp_policies({"llm-d": [("approximate", {})], "gie": [("approximate", {})]})
    llmd = B.EPPLane("/opt/epp", {"precise": {}}, [], 5810, "/tmp")
    gie = B.GIELane("/opt/gie", {"gie": {}}, [B.parse_engine(e) for e in B.DEFAULT_ENGINES], "/tmp", kubeconfig="/tmp/kubeconfig")
    lanes = B.Lanes([llmd, gie])
    assert (lanes.label("precise"), lanes.label("gie")) == ("llm-d EPP v0.9.0", "GIE EPP v1.4.0")
    assert lanes.by_name == {"precise": llmd, "gie": gie}
    with pytest.raises(B.errors.CheckError, match=r"^The GIE EPP discovers its endpoints through the Kubernetes API only: give the "
                       r"kubeconfig of a kwok cluster \(--kubeconfig; benchmarks/bench_routing.yml starts one\), not '/tmp/kubeconfig'\.$"):
        gie.open()


def test_only_the_configurations_of_the_epps_that_run():
    configs = {"llm-d": [("precise", {"a": 1}), ("approximate", {"b": 2})], "gie": [("gie", {"c": 3}), ("gie-equal", {"d": 4})]}
    every = ["precise", "epp:precise", "epp:approximate", "epp:gie", "epp:gie-equal"]
    assert B.select_configs(configs, {"gie": "/g"}, every) == {"gie": {"gie": {"c": 3}, "gie-equal": {"d": 4}}}
    assert B.select_configs(configs, {"llm-d": "/e", "gie": "/g"}, ["epp:precise", "epp:gie-equal"]) == {
        "llm-d": {"precise": {"a": 1}}, "gie": {"gie-equal": {"d": 4}}}
    assert B.select_configs(configs, {"llm-d": "/e"}, ["epp:gie"]) == {}


def _args(epp=(), llmd=(("precise", {}),), gie=(("gie", {}), ("gie-equal", {}))):
    return argparse.Namespace(epp=list(epp), epp_config=list(llmd), gie_config=list(gie), kv_port=5810, epp_listen_all=False,
                              gie_pool=B.GIE_POOL_MANIFESTS)


def _resolvers(llmd=None, gie=None):
    refused = "The Go module proxy refuses github.com/llm-d/llm-d-router (403 Forbidden); set SUBSTRATE_EPP_BINARY to an EPP v0.9.0 binary."
    no_go = "No GIE EPP v1.4.0 at /x/epp; build it with `ansible-playbook playbooks/go_build.yml` (make gie-epp)."
    return {"llm-d": lambda: (llmd, None if llmd else refused), "gie": lambda: (gie, None if gie else no_go),
            None: lambda: (("llm-d", llmd), None) if llmd else ((("gie", gie), None) if gie else ((None, None), refused + " " + no_go))}


def test_an_epp_that_cannot_be_had_is_left_out_with_one_sentence(monkeypatch):
    monkeypatch.delenv("SUBSTRATE_EPP_BINARY", raising=False)
    every = ["precise", "epp:precise", "epp:gie", "epp:gie-equal"]
    lanes, left_out, failed = B.epp_lanes(_args(epp=[("gie", None)]), [], every, resolvers=_resolvers())
    assert lanes is None and failed is None
    assert left_out == ["the Gateway API Inference Extension's EPP v1.4.0 is left out: No GIE EPP v1.4.0 at /x/epp; build it with "
                        "`ansible-playbook playbooks/go_build.yml` (make gie-epp)."]
    lanes, left_out, failed = B.epp_lanes(_args(), [], every, resolvers=_resolvers())   # none asked for, none can be had
    assert lanes is None and failed is None and len(left_out) == 1
    assert left_out[0].startswith("the real EPP is left out: The Go module proxy refuses github.com/llm-d/llm-d-router (403 ")
    assert left_out[0].endswith(" No GIE EPP v1.4.0 at /x/epp; build it with `ansible-playbook playbooks/go_build.yml` (make gie-epp).")
    lanes, left_out, failed = B.epp_lanes(_args(epp=[("llm-d", "/no/such/epp")]), [], every, resolvers=_resolvers())
    assert (lanes, left_out) == (None, []) and failed == "/no/such/epp is no executable file; give the path of the llm-d router's EPP v0.9.0 binary."


def test_both_epps_run_each_with_its_own_configurations(tmp_path, monkeypatch):
    monkeypatch.delenv("SUBSTRATE_EPP_BINARY", raising=False)
    binary = tmp_path / "epp"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    engines = [B.parse_engine(e) for e in B.DEFAULT_ENGINES]
    every = ["precise", "epp:precise", "epp:gie", "epp:gie-equal"]
    lanes, left_out, failed = B.epp_lanes(_args(epp=[("gie", None), ("llm-d", str(binary))]), engines, every,
                                          resolvers=_resolvers(gie="/cache/gie/epp"))
    assert failed is None and left_out == []
    assert [(lane.impl, lane.binary, sorted(lane.configs)) for lane in lanes.lanes] == [
        ("gie", "/cache/gie/epp", ["gie", "gie-equal"]), ("llm-d", str(binary), ["precise"])]
    # Only the EPP asked for runs, though both have configurations (make bench-routing passes them all).
    lanes, left_out, failed = B.epp_lanes(_args(epp=[("llm-d", str(binary))]), engines, every, resolvers=_resolvers(gie="/g"))
    assert [lane.impl for lane in lanes.lanes] == ["llm-d"] and left_out == [] and failed is None
    # None asked for: llm-d's where it can be had, else the GIE EPP; and the one the policies name.
    lanes, _left, _failed = B.epp_lanes(_args(), engines, every, resolvers=_resolvers(gie="/g"))
    assert [lane.impl for lane in lanes.lanes] == ["gie"]
    lanes, _left, _failed = B.epp_lanes(_args(), engines, ["epp:gie"], resolvers=_resolvers(llmd=str(binary), gie="/g"))
    assert [lane.impl for lane in lanes.lanes] == ["gie"]
    _lanes, left_out, _failed = B.epp_lanes(_args(epp=[("gie", None)], gie=()), engines, every, resolvers=_resolvers(gie="/g"))
    assert left_out == ["the Gateway API Inference Extension's EPP v1.4.0 is left out: no configuration of it is given (--gie-config NAME=PATH)"]


def test_the_bench_engines_share_one_port_on_two_addresses():
    """An InferencePool has one target port: the GIE lane needs every engine on it, each on its own address."""
    a, b = [B.parse_engine(e) for e in B.DEFAULT_ENGINES]
    assert (a["host"], a["port"], b["host"], b["port"]) == ("127.0.0.1", 8400, "127.0.0.2", 8400)
    assert a["url"] == "http://127.0.0.1:8400" and b["url"] == "http://127.0.0.2:8400"
    assert a["topic"] != b["topic"] and b["topic"].startswith("kv@127.0.0.2:8400@")
    assert (a["endpoint"], b["endpoint"]) == ("tcp://127.0.0.1:5800", "tcp://127.0.0.1:5802")
    assert B.one_port([a, b]) == 8400
    apart = [a, B.parse_engine("bench-b=127.0.0.2:8401,5802,5803")]
    with pytest.raises(B.errors.CheckError, match=r"one target port for all its pods, but the engines are bench-a on 127.0.0.1:8400, "
                       r"bench-b on 127.0.0.2:8401: run them on one port, each on its own 127.x address"):
        B.one_port(apart)
    with pytest.raises(B.errors.CheckError, match=r"bench-a on 127.0.0.1:8400, bench-b on 127.0.0.1:8400"):
        B.one_port([a, B.parse_engine("bench-b=8400,5802,5803")])


def test_gie_configs_must_hash_the_engines_block_size():
    engines = [B.parse_engine(e) for e in B.DEFAULT_ENGINES]
    config = {"plugins": [{"type": "queue-scorer"}, {"type": "prefix-cache-scorer", "parameters": {"blockSizeTokens": 32}}]}
    lane = B.GIELane("/opt/gie", {"gie": config, "plain": {"plugins": [{"type": "prefix-cache-scorer"}]}}, engines, "/tmp", kubeconfig="/tmp/kubeconfig")
    lane.check_configs(32)
    with pytest.raises(B.errors.CheckError, match=r"^GIE config gie hashes blocks of 32 tokens but the engines' blocks hold 16: "):
        lane.check_configs(16)


def test_the_epps_own_prefix_match_from_its_metrics():
    gie = ("# TYPE inference_extension_prefix_indexer_hit_ratio histogram\n"
           'inference_extension_prefix_indexer_hit_ratio_bucket{le="0.5"} 1\n'
           "inference_extension_prefix_indexer_hit_ratio_sum 1.5\n"
           "inference_extension_prefix_indexer_hit_ratio_count 3\n")
    assert B.prefix_match([gie]) == 0.5
    assert B.prefix_match([gie, gie.replace("1.5", "0.5").replace("_count 3", "_count 1")]) == 0.5
    assert B.prefix_match(["vllm:prefix_cache_hits_total 3\n", ""]) is None


def test_make_renders_and_passes_every_configuration_of_both_epps():
    """benchmarks/epp_configs.yml renders the GIE configs with router_impl gie; the benchmark's playbook passes them as
    --gie-config, and starts bench-b on 127.0.0.2 at bench-a's port (an InferencePool's single target port)."""
    import yaml  # pylint: disable=import-outside-toplevel
    with open(os.path.join(ROOT, "benchmarks", "epp_configs.yml"), encoding="utf-8") as handle:
        tasks = yaml.safe_load(handle)[0]["tasks"]
    gie = dict((t["vars"]["router_render_dir"].rsplit("/", 1)[1], t["vars"]) for t in tasks if (t.get("vars") or {}).get("router_impl") == "gie")
    assert sorted(gie) == ["gie", "gie-equal"] and all(v["router_scoring_mode"] == "approximate" for v in gie.values())
    assert [gie["gie-equal"]["router_gie_%s_weight" % w] for w in ("queue_scorer", "kv_cache_utilization", "prefix_scorer")] == [1.0] * 3
    with open(os.path.join(ROOT, "benchmarks", "bench_routing.yml"), encoding="utf-8") as handle:
        play = [p for p in yaml.safe_load(handle) if "_bench_configs" in (p.get("vars") or {})][0]["vars"]
    assert "+ ['gie', 'gie-equal'] | map('regex_replace', '^(.*)$', '--gie-config=\\1=' ~ _bench_dir ~ '/epp/\\1/router/epp-config.yaml')" \
        in play["_bench_configs"]
    engines = dict((e["instance"], e) for e in play["bench_engines"])
    assert engines["bench-b"]["host"] == "127.0.0.2" and engines["bench-b"]["port"] == engines["bench-a"]["port"] == 8400


def test_every_configuration_gets_a_tag_of_one_token_count():
    """The tags are drawn until their token count is the first one's: the prompts of a workload and seed stay alike."""
    def tokens(text):   # a tokenizer that merges repeated digits
        return 2 + len(set(text[1:6]))
    rng = random.Random(1)
    tag, want = B.draw_tag(rng, tokens)
    assert re.match(r"^r\d{5}:$", tag) and want == tokens(tag + " tenant")
    for _i in range(20):
        other, count = B.draw_tag(rng, tokens, want)
        assert count == want == tokens(other + " tenant")
    with pytest.raises(B.errors.CheckError, match=r"^No tag r10000: to r99999: of 99 tokens came up in 500 draws; "):
        B.draw_tag(rng, tokens, 99)


def test_the_engines_file_of_the_playbook_gives_each_engine_and_its_service_record(tmp_path):
    """What benchmarks/bench_routing.yml writes (local_engine_instances) is what the bench runs on, and restarts through."""
    sub_b = {"endpoint": "tcp://127.0.0.1:5802", "socket_mode": "bind", "topic": "kv@127.0.0.2:8400@tiny",
             "replay_endpoint": "tcp://127.0.0.1:5803"}
    sub_a = {"endpoint": "tcp://127.0.0.1:5800", "socket_mode": "bind", "topic": "kv@127.0.0.1:8400@tiny", "replay_endpoint": None}
    published = {"bench-b": {"url": "http://127.0.0.2:8400", "kv_subscriber": sub_b,
                             "service": {"name": "engine", "launcher": "/run/bench-b/engine.sh"}},
                 "bench-a": {"url": "http://127.0.0.1:8400", "kv_subscriber": sub_a}}
    path = tmp_path / "engines.json"
    path.write_text(__import__("json").dumps({"engines": published}))
    a, b = B._lab.load_engines(str(path))   # pylint: disable=protected-access
    assert (a["name"], a["host"], a["port"], a["replay_endpoint"], a["service"]) == ("bench-a", "127.0.0.1", 8400, None, {})
    assert (b["name"], b["host"], b["endpoint"], b["socket_mode"], b["topic"]) == (
        "bench-b", "127.0.0.2", "tcp://127.0.0.1:5802", "bind", "kv@127.0.0.2:8400@tiny")
    assert B.one_port([a, b]) == 8400 and b["service"]["launcher"] == "/run/bench-b/engine.sh"
    with pytest.raises(B.errors.CheckError, match=r"^Engine bench-a has no service record, so it cannot be restarted here; "):
        B._lab.restart(a)   # pylint: disable=protected-access
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_routing.py"), "--engines-file", str(path), "--engine",
                          "a=1,2,3"], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 2 and "give the engines by --engines-file or by --engine, not both" in run.stderr
