# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""benchmarks/bench_fleet.py and its parts without a fleet: the simulator's tokens and block keys, the workloads, the
policies' scores, the truth, the report and its plots (deterministic SVG), and the CLI's sentences.

The runs over a fleet of simulated engines are ``make study-fleet``; the simulator's hashes here were read from a running
llm-d-inference-sim v0.10.2 (BlockStored of a known prompt, model tiny, no hash seed).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from _routing import fleet, fleet_report, fleet_workloads, plots, simkeys  # noqa: E402  pylint: disable=wrong-import-position

# What llm-d-inference-sim v0.10.2 answered here (its /tokenize for the first 16 tokens, the hashes of its BlockStored).
PROMPT = ("hello world this is a test of the simulator with a fairly long prompt that has many words in it so that we get blocks "
          "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau 1 ")
TOKENS_HEAD = [3801292497, 1241993673, 335319923, 1477013615, 186949092, 2317555999, 3845842264, 2938279028, 1010175447,
               2735623403, 186949092, 831439732, 1306771977, 2458195329, 3273153508, 113627129]
SIM_HASHES = [9264554860239610660, 11834786882386206930]


def test_the_dummy_tokenizer_and_the_block_keys_are_the_simulators():
    tokens = simkeys.tokenize(PROMPT)
    assert len(tokens) == 45 and tokens[:16] == TOKENS_HEAD
    keys = simkeys.BlockKeys(16, "tiny", "")
    assert keys.keys(tokens) == SIM_HASHES
    assert keys.keys(tokens, ("prefix", 16)) == SIM_HASHES == keys.keys(tokens, ("prefix", 16))   # cached prefix, same keys
    assert simkeys.BlockKeys(16, "tiny", "0").keys(tokens) != SIM_HASHES   # the seed is hashed in
    assert simkeys.BlockKeys(16, "other", "").keys(tokens) != SIM_HASHES   # so is the model
    assert simkeys.split("a,b  c?") == ["a", ",", "b  ", "c", "?"]


def test_the_blog_workload_fits_its_demand_and_has_exact_token_counts():
    spec = fleet_workloads.spec_of("blog", ramp=(10,), step_seconds=30.0)
    arrivals, groups = fleet_workloads.build(spec, "r12345", 0, 16, 16 * 680)
    per_group = fleet_workloads.blocks_per_group(spec, 16)
    assert per_group == (1024 + 5 * 192) // 16
    assert abs(groups * per_group - 0.75 * 16 * 680) <= per_group
    assert 200 < len(arrivals) < 400 and all(0 <= a.at < 30 for a in arrivals)
    for arrival in arrivals[:20]:
        assert len(simkeys.tokenize(arrival.prompt)) == 1024 + 192 + 8 and arrival.shared_tokens == 1216
        assert arrival.prompt.startswith("r12345 g%d " % arrival.group)
    again, _groups = fleet_workloads.build(spec, "r99999", 0, 16, 16 * 680)
    assert [a.prompt.replace("r99999", "r12345") for a in again] == [a.prompt for a in arrivals]   # same seed, other tag


def test_hot_cold_sends_cold_prompts_of_their_own():
    spec = fleet_workloads.spec_of("hot-cold", ramp=(20,), step_seconds=10.0)
    arrivals, groups = fleet_workloads.build(spec, "r1", 3, 16, 1000)
    cold = [a for a in arrivals if a.kind == "cold"]
    assert groups == 2 and 0.3 < len(cold) / float(len(arrivals)) < 0.7 and all(a.group is None for a in cold)
    assert set(a.group for a in arrivals if a.kind != "cold") == {0, 1}


def test_queue_scores_normalise_as_gie_does():
    assert fleet.queue_scores({"a": 2, "b": 2}) == {"a": 1.0, "b": 1.0}
    assert fleet.queue_scores({"a": 0, "b": 4, "c": 2}) == {"a": 1.0, "b": 0.0, "c": 0.5}


def test_the_counters_of_the_simulators_metrics():
    text = ('# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total{model_name="tiny"} 32\n'
            'vllm:prefix_cache_queries_total{model_name="tiny"} 89\nvllm:prefix_cache_queries_created 1.7e9\n')
    assert fleet.counters(text) == {"vllm:prefix_cache_hits": 32.0, "vllm:prefix_cache_queries": 89.0}


class _Event:
    def __init__(self, kind, hashes=()):
        self.type = kind
        self.block_hashes = list(hashes)


def test_the_truth_is_the_engines_own_hashes_whatever_the_eviction_order():
    truth = fleet.Truth()
    truth.apply("a", _Event("BlockStored", [1, 2, 3]))
    assert truth.leading("a", [1, 2, 3, 4]) == 3 and truth.anywhere("a", [1, 2, 3, 4]) == 3
    truth.apply("a", _Event("BlockRemoved", [1]))   # the simulator evicts a parent before its child (llm-d-inference-sim#704)
    assert truth.leading("a", [1, 2, 3]) == 0 and truth.anywhere("a", [1, 2, 3]) == 2
    truth.apply("a", _Event("AllBlocksCleared"))
    assert truth.anywhere("a", [2, 3]) == 0 and truth.leading("b", [1]) == 0


def _row(workload, policy, seed, hit, p90s, failed=0):
    steps = [{"qps": q, "ttft_ms_p90": p, "hit_rate": hit, "requests": 10, "failed": 0} for q, p in zip((4, 8, 12), p90s)]
    return {"workload": workload, "policy": policy, "seed": seed, "router": "stand-in", "hit_rate": hit, "counter_hit_rate": hit,
            "ttft_ms_p50": p90s[0] / 2, "ttft_ms_p90": max(p90s), "throughput_rps": 7.5, "cached_per_request": 100.0,
            "requests": 30, "failed": failed, "steps": steps, "demand": 0.75, "groups": 48}


@pytest.fixture(name="rows")
def _rows():
    return [_row("blog", "referee", 0, 0.8, (50, 60, 80)), _row("blog", "referee", 1, 0.82, (50, 70, 90)),
            _row("blog", "precise", 0, 0.6, (60, 80, 400)), _row("blog", "precise", 1, 0.64, (70, 90, 500)),
            _row("blog", "random", 0, 0.2, (300, 2000, 9000), failed=2), _row("blog-light", "referee", 0, 0.9, (40, 40, 40)),
            _row("blog-light", "random", 0, 0.5, (50, 60, 70))]


def test_the_summary_holds_each_policy_against_the_referees_limit(rows):
    summary = fleet_report.summarize(rows)
    precise = [e for e in summary if e["workload"] == "blog" and e["policy"] == "precise"][0]
    assert precise["runs"] == 2 and precise["hit_rate"]["min"] == 0.6 and precise["hit_rate"]["max"] == 0.64
    assert precise["referee_hit_rate"] == pytest.approx(0.81) and precise["share_of_limit"] == pytest.approx(0.62 / 0.81)
    assert [s["ttft_ms_p90"]["mean"] for s in precise["steps"]] == [65, 85, 450]
    text = fleet_report.markdown(summary, "Fleet", notes=("a note",))
    assert "| precise | stand-in | 62.0% (60.0\u201364.0) | 77% | " in text
    assert "| random | stand-in | 20.0% (20.0\u201320.0) | 25% |" in text and "| 2/30 | 1 |" in text
    assert "| Policy | 4 req/s | 8 req/s | 12 req/s |" in text and "| precise | 65 | 85 | 450 |" in text
    assert text.index("## blog\n") < text.index("## blog-light\n") and text.rstrip().endswith("- a note")


def test_the_plots_are_svg_and_the_same_rows_give_the_same_bytes(tmp_path, rows):
    first = fleet_report.write(str(tmp_path / "one"), rows, "Fleet")
    second = fleet_report.write(str(tmp_path / "two"), rows, "Fleet")
    for name in ("ttft_p90_load.svg", "hit_rate_limit.svg"):
        with open(first[name], "rb") as one, open(second[name], "rb") as two:
            data = one.read()
            assert data == two.read(), name
        root = ET.fromstring(data)
        assert root.tag.endswith("svg") and b"<dc:date>" not in data
        texts = "".join(t.text or "" for t in root.iter() if t.tag.endswith("text"))
        assert "blog-light" in texts and "precise" in texts
    assert b"referee (the limit) 81.0%" in open(first["hit_rate_limit.svg"], "rb").read()
    assert plots.STYLE["svg.hashsalt"]
    with open(first["runs.jsonl"], encoding="utf-8") as handle:
        assert [json.loads(line) for line in handle] == rows


def test_without_a_fleet_it_skips_and_says_so():
    script = os.path.join(ROOT, "benchmarks", "bench_fleet.py")
    run = subprocess.run([sys.executable, script], capture_output=True, text=True, check=False, timeout=120)
    assert run.returncode == 0 and run.stdout.startswith("bench_fleet: skipped: no fleet (--engines-file)"), run.stdout + run.stderr
    run = subprocess.run([sys.executable, script, "--require"], capture_output=True, text=True, check=False, timeout=120)
    assert run.returncode == 1 and run.stdout.startswith("bench_fleet: failed: no fleet"), run.stdout
    run = subprocess.run([sys.executable, script, "--workload", "nope"], capture_output=True, text=True, check=False, timeout=120)
    assert run.returncode == 2 and "unknown workload in 'nope': the workloads are blog, " in run.stderr and "Traceback" not in run.stderr
    run = subprocess.run([sys.executable, script, "--policies", "precise,epp:gie"], capture_output=True, text=True, check=False,
                         timeout=120)
    assert run.returncode == 2 and "unknown policies epp:gie: the policies are referee, precise" in run.stderr


def test_an_engines_file_lists_simulated_engines(tmp_path):
    info = {"kind": "simulated", "url": "http://127.0.1.2:9100", "address": "127.0.1.2", "port": 9100, "model": "tiny",
            "block_size": 16, "num_gpu_blocks": 680,
            "kv_subscriber": {"endpoint": "tcp://127.0.0.1:6101", "socket_mode": "bind", "topic": "kv@127.0.1.2:9100@tiny"}}
    path = tmp_path / "engines.json"
    path.write_text(json.dumps({"engines": {"sim-10": dict(info), "sim-1": info, "default": dict(info, kind="vllm")}}))
    engines = fleet.load_engines(str(path))
    assert [e.name for e in engines] == ["sim-1", "sim-10"]
    assert engines[0].pod == "127.0.1.2:9100" and engines[0].bind and engines[0].capacity == 680
    assert engines[0].spec == {"name": "sim-1", "url": "http://127.0.1.2:9100", "host": "127.0.1.2", "port": 9100}
    path.write_text(json.dumps({"engines": {"default": dict(info, kind="vllm")}}))
    with pytest.raises(fleet.errors.CheckError, match=r"lists no simulated engine; start the fleet with playbooks/simulated_engines.yml\.$"):
        fleet.load_engines(str(path))


# ---- benchmarks/bench_kv_scale.py: its verdict from the checkers' figures, and its sentence without a fleet ----

def _scale_result(gaps, restarted=("scale-3",), truth_exact=64, noticed=1):
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    engines = dict(("scale-%d" % i, {"batches": 100, "events": 300, "gaps": [], "unrepaired": 0, "restarts": 0, "malformed": 0,
                                     "failure": None}) for i in range(4))
    engines["scale-3"].update(gaps=gaps, restarts=noticed)
    return {"engines": 4, "seconds": 60.0, "requests": 2400, "failed": 120, "errors": {"500": 80, "429": 40}, "bursts": 3,
            "restarted": [{"engine": e, "rc": 0} for e in restarted],
            "events_check": {"engines": engines, "cpu_s": 3.0, "rss_kib": 60000},
            "index": {"batches": 400, "events": 1200, "gaps": [], "restarts": [{}], "cpu_s": 1.2, "rss_kib": 50000, "rss_start_kib": 40000,
                      "rss_max_kib": 51000, "probes": 64, "truth_exact": truth_exact, "index_exact": 60, "failed": 0}}


def test_the_scale_verdict_counts_lost_batches_but_not_the_simulators_numbering():
    import bench_kv_scale  # pylint: disable=import-outside-toplevel,import-error
    numbering = [{"start": 0, "end": 0, "missing": 1, "repaired": False}]   # after a restart: the simulator starts at 1
    lines, ok = bench_kv_scale.fleet_figures(_scale_result(numbering))
    assert ok and "batches lost 0 (plus 1 gaps of batch 0 after a restart" in lines[1] and "restarts noticed 1/1" in lines[1]
    assert "probes 64: truth exact 64, request-key index exact 60" in lines[2]
    _lines, ok = bench_kv_scale.fleet_figures(_scale_result([{"start": 5, "end": 7, "missing": 3, "repaired": False}]))
    assert not ok
    _lines, ok = bench_kv_scale.fleet_figures(_scale_result(numbering, restarted=()))   # no restart: batch 0 was lost
    assert not ok
    _lines, ok = bench_kv_scale.fleet_figures(_scale_result([], truth_exact=63))
    assert not ok
    _lines, ok = bench_kv_scale.fleet_figures(_scale_result([], noticed=0))
    assert not ok
    result = _scale_result(numbering)
    result["events_check"]["engines"]["scale-3"]["failure"] = "1 sequence gap left 1 batch missing (first in stream x, seq 0-0); ..."
    lines, ok = bench_kv_scale.fleet_figures(result)
    assert ok and lines[-1].endswith("(each the simulator's numbering after a restart)")
    result["events_check"]["engines"]["scale-1"]["failure"] = "No KV event arrived."
    _lines, ok = bench_kv_scale.fleet_figures(result)
    assert not ok


def test_the_scale_benchmark_without_a_fleet_skips_and_says_so():
    script = os.path.join(ROOT, "benchmarks", "bench_kv_scale.py")
    run = subprocess.run([sys.executable, script], capture_output=True, text=True, check=False, timeout=120)
    assert run.returncode == 0 and run.stdout.startswith("bench_kv_scale: fleet part skipped: no fleet (--engines-file)"), run.stdout
    run = subprocess.run([sys.executable, script, "--require"], capture_output=True, text=True, check=False, timeout=120)
    assert run.returncode == 1 and "fleet part failed: no fleet" in run.stdout, run.stdout


def test_the_shared_keys_are_cached_per_configuration():
    """Two configurations send the same groups behind other tags: each gets its own keys (a stale cache made the referee blind)."""
    spec = fleet_workloads.spec_of("blog", ramp=(5,), step_seconds=4.0)
    one, _groups = fleet_workloads.build(spec, "r11111", 0, 16, 16 * 680)
    two, _groups = fleet_workloads.build(spec, "r22222", 0, 16, 16 * 680)

    class Study(fleet.FleetStudy):
        def __init__(self):   # pylint: disable=super-init-not-called
            self.keys = simkeys.BlockKeys(16, "tiny", "0")
            self.truth = fleet.Truth()
            self.lock = fleet.threading.Lock()
            self.by_name = {"a": None}
            self.state = {"inflight": {"a": 0}, "sent": {"a": 0}}
            self.clock = lambda: 0.0

        def route(self, policy, arrival, tokens, keys):
            self.seen = keys
            return "a"
    study = Study()
    study.dispatch("referee", one[0], 0.0)
    first = study.seen
    match = [a for a in two if a.group == one[0].group and a.user == one[0].user][0]
    study.dispatch("referee", match, 0.0)
    assert study.seen != first and study.seen == simkeys.BlockKeys(16, "tiny", "0").keys(simkeys.tokenize(match.prompt))
