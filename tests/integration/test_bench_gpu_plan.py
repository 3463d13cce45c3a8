# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""benchmarks/bench_gpu_plan.py where no GPU can be used (its GPU part ran on an H200: docs/kubernetes.md).

Without CUDA it prints the plan's rows only, ``--require`` turns that into one sentence and exit 2, and wrong arguments
get one sentence too; the plan's rows are gpu_memory_plan's own figures for the same inputs.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "benchmarks", "bench_gpu_plan.py")

from ansible_collections.inference_cache.substrate.plugins.module_utils.gpu import memory_plan  # noqa: E402  pylint: disable=wrong-import-position


def _cuda():
    try:
        import torch  # pylint: disable=import-outside-toplevel
    except ImportError:
        return False
    return torch.cuda.is_available()


pytestmark = pytest.mark.skipif(_cuda(), reason="a CUDA device is here: the benchmark measures instead (minutes, 16 GiB per model)")


def run(*args):
    proc = subprocess.run([sys.executable, BENCH] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def test_without_a_gpu_the_plans_rows_are_printed(tmp_path):
    out_file = tmp_path / "rows.json"
    code, out, err = run("--models", "Llama-3.1-8B,Qwen3-8B", "--rows", "1,1024", "--json", str(out_file))
    assert code == 0 and err == "", err
    assert "nothing measured" in out.splitlines()[0]
    rows = json.loads(out_file.read_text())
    assert [(r["model"], r["rows"]) for r in rows] == [("Llama-3.1-8B", 1), ("Llama-3.1-8B", 1024), ("Qwen3-8B", 1), ("Qwen3-8B", 1024)]
    config = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
              "intermediate_size": 14336, "vocab_size": 128256, "torch_dtype": "bfloat16"}
    plan = memory_plan.plan(config, "8.03B", gpu="H200", max_model_len=8192, gpu_memory_utilization=1.0,
                            max_num_batched_tokens=8192, engine_max_num_seqs=1024)
    assert rows[1]["promised_tokens"] == plan["max_tokens_fit"]
    assert rows[1]["reserve_gib"] == round(plan["reserve"]["total_bytes"] / 1024.0 ** 3, 3)
    assert rows[0]["reserve_gib"] < rows[1]["reserve_gib"], "sampling 1024 sequences over 128k words needs more"


def test_require_without_a_gpu_is_one_sentence():
    code, out, err = run("--require", "--models", "Mistral-7B")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "run it on a machine with an NVIDIA GPU" in err


@pytest.mark.parametrize("args", [("--models", "Llama-4"), ("--rows", "0"), ("--rows", "many")])
def test_wrong_arguments_are_one_sentence(args):
    code, out, err = run(*args)
    assert code == 2 and out == "" and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("bench_gpu_plan: --models takes names of")
