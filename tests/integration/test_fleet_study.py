# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""benchmarks/fleet/study.yml for real, kept short: 4 simulated engines, a warm-up and a ramp of 3 steps, three stand-in
policies (no kwok cluster: fleet_study_epp false), through the same playbook as ``make study-fleet``. Asserts the spread
(no engine idle under a cache-aware policy) and that every metric the study reports was recorded, not the conclusion.
Skipped with its reason where the simulator is not built (``make go-build`` builds it; the role builds it on first use).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json
import os
import pathlib
import shutil
import subprocess
import tempfile

import pytest
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.path.join(ROOT, ".venv", "bin")
VERSION = yaml.safe_load(open(os.path.join(ROOT, "vars", "pinned_versions.yml"), encoding="utf-8"))["tools"]["llm_d_inference_sim"]
BINARY = os.path.expanduser("~/.cache/inference_cache/kwok_cluster/bin/llm-d-inference-sim-%s/llm-d-inference-sim" % VERSION)
POLICIES = ["random", "approximate", "precise"]


def test_a_short_ramp_over_four_engines_records_every_metric(request, tmp_path):
    if not os.access(BINARY, os.X_OK):
        pytest.skip("llm-d-inference-sim %s is not built (make go-build builds it; the role builds it on first use, about 3 "
                    "minutes)." % VERSION)
    # Short folders: a confined engine's bridge sockets live under its state folder (Unix socket paths hold 107 bytes).
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="fleet-"))
    request.addfinalizer(lambda: shutil.rmtree(str(scratch), ignore_errors=True))
    (scratch / "tmp").mkdir()
    study = tmp_path / "study"
    extra = {"fleet_study_epp": False, "fleet_study_dir": str(study), "fleet_study_engines": 4, "fleet_study_seeds": [0],
             "fleet_study_policies": POLICIES, "fleet_study_addresses": ["127.0.3.1", "127.0.3.2", "127.0.3.3", "127.0.3.4"],
             "fleet_study_kv_cache_size": 256, "simulated_engine_name": "fleet-test", "simulated_engine_port": 9500,
             "simulated_engine_state_dir": str(scratch / "sim"),
             "fleet_study_args": ["--warmup-requests", "40", "--warmup-rate", "20", "--ramp", "4,8,16", "--step-seconds", "3"]}
    cmd = [os.path.join(BIN, "ansible-playbook"), "-i", os.path.join(ROOT, "inventories", "kwok"),
           os.path.join(ROOT, "benchmarks", "fleet", "study.yml"), "-e", json.dumps(extra)]
    run = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", TMPDIR=str(scratch / "tmp")),
                         capture_output=True, text=True, timeout=900, check=False)
    assert run.returncode == 0, run.stdout[-4000:]
    rows = [json.loads(line) for line in (study / "runs.jsonl").read_text().splitlines() if line.strip()]
    assert [r["policy"] for r in rows] == POLICIES and all(r["engines"] == 4 and r["seed"] == 0 for r in rows)
    for row in rows:
        assert [s["rate"] for s in row["steps"]] == [4.0, 8.0, 16.0] and row["sustained_rps"] in (0.0, 4.0, 8.0, 16.0)
        for step in row["steps"]:
            assert step["requests"] > 0 and step["ok"] + step["failed"] == step["requests"]
            assert all(isinstance(step["ttft_ms"][q], float) for q in ("p50", "p90", "p99"))
            assert step["ttft_ms"]["p50"] <= step["ttft_ms"]["p90"] <= step["ttft_ms"]["p99"]
            assert set(step["queue_ms"]) == {"mean", "p90", "max"} and set(step["waiting"]) == {"mean", "p90", "max"}
            assert 0.0 <= step["hit_rate"] <= step["bound"] + 0.01 and step["goodput_rps"] is not None
            assert len(step["requests_per_engine"]) == 4 and sum(step["requests_per_engine"]) == step["requests"]
            assert isinstance(step["http_429"], int) and isinstance(step["http_500"], int)
        # the engines' own counters agree with what the requests reported (warm-up included)
        assert abs(row["validation"]["counter_hit_rate"] - row["validation"]["records_hit_rate"]) < 0.01, row["validation"]
        if row["policy"] != "random":
            assert row["idle_engines"] == 0, (row["policy"], row["ramp_total"]["requests_per_engine"])
    assert rows[2]["ramp_total"]["hit_rate"] > rows[0]["ramp_total"]["hit_rate"]   # the index is fed: precise hits more than random
    for name in ("report.md", "summary.json", "ttft_p90.svg", "ttft_p99.svg", "hit_rate.svg", "requests_per_engine.svg"):
        assert (study / "report" / name).stat().st_size > 0, name
    left = subprocess.run(["pgrep", "-f", str(scratch / "sim")], capture_output=True, text=True, check=False)
    assert left.returncode == 1, left.stdout
    assert not (scratch / "sim" / "events").exists() and os.listdir(str(scratch / "tmp")) == []
