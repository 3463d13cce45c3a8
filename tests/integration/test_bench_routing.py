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
    (["--workload", "restart"], "the restart workload needs --restart-command (make bench-routing passes one)"),
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
