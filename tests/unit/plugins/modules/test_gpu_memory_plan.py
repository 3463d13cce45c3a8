# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The gpu_memory_plan module: a plan, and one sentence for every wrong input (hand-picked and generated)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.inference_cache.substrate.plugins.modules import gpu_memory_plan as module
from ansible_collections.inference_cache.substrate.tests.unit.plugins.modules.utils import infinite_int_sentence, run_module
from ansible_collections.inference_cache.substrate.tests.unit.plugins.sentences import assert_one_sentence

LLAMA_8B = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
            "intermediate_size": 14336, "vocab_size": 128256, "torch_dtype": "bfloat16"}
BASE = {"model_config": LLAMA_8B, "parameters": "8B", "gpu_memory": "22GiB", "max_model_len": 8192}
GIB = 1024 ** 3
DROP = object()  # an option left out


def test_plan_exits_with_engine_args():
    exited, result = run_module(module, BASE)
    assert exited and result["changed"] is False
    assert result["tensor_parallel_size"] == 1 and result["kv_cache_bytes_per_token"] == 131072
    assert result["engine_args"] == ["--tensor-parallel-size", "1", "--max-model-len", "8192"]


def test_gpu_by_product_and_the_reserve_it_gets():
    args = dict(BASE, gpu="H200")
    del args["gpu_memory"]
    exited, result = run_module(module, args)
    assert exited and result["gpu"] == "H200" and result["gpu_memory_bytes"] == int(139.80 * GIB) and result["warning"] == ""
    assert (result["max_num_batched_tokens"], result["engine_max_num_seqs"]) == (8192, 1024)
    # the old fixed 1 GiB fell short of the 1.44-1.77 GiB an H200 measured
    assert result["reserve"]["total_bytes"] > 1.77 * GIB and result["reserve"]["given_bytes"] is None


@pytest.mark.parametrize("gpu_memory, source", [("141GB", "cuda"), ("143771MiB", "cuda"), ("143771MiB", "nvml")])
def test_datasheet_and_nvidia_smi_figures_plan_with_cudas(gpu_memory, source):
    exited, result = run_module(module, dict(BASE, gpu_memory=gpu_memory, gpu_memory_source=source))
    assert exited and result["gpu"] == "H200" and result["gpu_memory_bytes"] == int(139.80 * GIB)
    # the datasheet's and nvidia-smi's figures are told, the node label's (nvml) is what it is meant to be
    assert ("CUDA reports 139.80 GiB" in result["warning"]) is (source == "cuda")


def test_the_warning_reaches_the_task(monkeypatch):
    from ansible.module_utils import basic  # pylint: disable=import-outside-toplevel
    told = []
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda self, warning, **kwargs: told.append(warning))
    run_module(module, dict(BASE, gpu_memory="141GB"))
    assert len(told) == 1 and "is the datasheet figure of an H200" in told[0]
    run_module(module, dict(BASE, gpu_memory="139.8GiB"))
    assert len(told) == 1


def test_check_mode_gives_the_same_plan():
    assert run_module(module, BASE, check_mode=True)[1] == run_module(module, BASE)[1]


def test_model_config_path(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_8B))
    args = dict(BASE, model_config_path=str(path))
    del args["model_config"]
    assert run_module(module, args)[1]["kv_cache_bytes_per_token"] == 131072


@pytest.mark.parametrize("content, message", [
    (None, "Cannot read the model config {path}: No such file or directory."),
    ("{not json", "Cannot read the model config {path}: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)."),
    ("[1, 2]", "The model config must be a mapping (a Hugging Face config.json), got list."),
])
def test_bad_model_config_file(tmp_path, content, message):
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    args = dict(BASE, model_config_path=str(path))
    del args["model_config"]
    exited, result = run_module(module, args)
    assert not exited and result["msg"] == message.format(path=path) and result["changed"] is False


@pytest.mark.parametrize("change, message", [
    ({"model_config": dict(LLAMA_8B, num_hidden_layers="lots")},
     "num_hidden_layers in the model config must be a positive whole number, got 'lots'."),
    ({"model_config": dict(LLAMA_8B, hidden_size=[4096])}, "hidden_size in the model config must be a positive whole number, got [4096]."),
    ({"model_config": dict(LLAMA_8B, num_key_value_heads=0)},
     "num_key_value_heads in the model config must be a positive whole number, got 0."),
    ({"model_config": dict(LLAMA_8B, num_key_value_heads=5)}, "num_key_value_heads 5 must divide the 32 attention heads."),
    ({"model_config": dict(LLAMA_8B, num_attention_heads=True)},
     "num_attention_heads in the model config must be a positive whole number, got True."),
    ({"model_config": dict(LLAMA_8B, torch_dtype=["bf16"])}, "torch_dtype in the model config must be a string, got ['bf16']."),
    ({"model_config": dict(LLAMA_8B, hidden_size=4097)}, "hidden_size 4097 is not a multiple of the 32 attention heads; set head_dim."),
    ({"model_config": {"text_config": [1]}}, "text_config in the model config must be a mapping, got [1]."),
    ({"model_config": {"text_config": {"num_hidden_layers": -1}}},
     "num_hidden_layers in the model config's text_config must be a positive whole number, got -1."),
    ({"tensor_parallel_size": -2}, "tensor_parallel_size must be a whole number between 1 and 4096, got -2."),
    ({"tensor_parallel_size": 0}, "tensor_parallel_size must be a whole number between 1 and 4096, got 0."),
    ({"max_gpus": 0}, "max_gpus must be a whole number between 1 and 4096, got 0."),
    ({"max_num_seqs": -1}, "max_num_seqs must be a whole number between 1 and 1000000, got -1."),
    ({"max_model_len": 0}, "max_model_len must be a whole number between 1 and 100000000, got 0."),
    ({"gpu_memory_utilization": 0}, "gpu_memory_utilization must be in (0, 1], got 0.0."),
    ({"gpu_memory_utilization": float("nan")}, "gpu_memory_utilization must be in (0, 1], got nan."),
    ({"gpu_memory": "0"}, "gpu_memory must be positive."),
    ({"gpu_memory": "1e400GiB"}, "Memory size '1e400GiB' is not a finite number."),
    ({"parameters": "-8B"}, "Parameter count '-8B' is not understood; write e.g. 8B or 8000000000."),
    ({"parameters": "0"}, "The parameter count must be positive."),
    ({"reserved_memory": "lots"}, "Memory size 'lots' is not understood; write e.g. 80GiB or 24GB."),
    ({"gpu": "H200"}, "parameters are mutually exclusive: gpu|gpu_memory"),
    ({"gpu": "B300", "gpu_memory": DROP}, "gpu 'B300' is not a GPU the plan knows"),
    ({"gpu_memory": DROP}, "one of the following is required: gpu, gpu_memory"),
    ({"gpu_memory_source": "smi"}, "value of gpu_memory_source must be one of: cuda, nvml, got: smi"),
    ({"max_num_batched_tokens": 0}, "max_num_batched_tokens must be a whole number between 1 and 100000000, got 0."),
    ({"engine_max_num_seqs": 0}, "engine_max_num_seqs must be a whole number between 1 and 1000000, got 0."),
    ({"dtype": "float13"}, "Data type 'float13' is not one of"),
    ({"max_model_len": float("inf")}, infinite_int_sentence("max_model_len", "max_model_len must be a whole number, got an infinite number.")),
    ({"max_gpus": float("-inf"), "max_num_seqs": float("inf")},
     infinite_int_sentence("max_num_seqs", "max_gpus and max_num_seqs must be a whole number, got an infinite number.")),
])
def test_wrong_input_is_one_sentence(change, message):
    args = dict((name, value) for name, value in dict(BASE, **change).items() if value is not DROP)
    exited, result = run_module(module, args)
    assert not exited and result["msg"].startswith(message) and result.get("changed", False) is False
    assert_one_sentence(result["msg"])


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10 ** 12, 10 ** 12), st.floats(), st.text(max_size=12))
ANY = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                   max_leaves=6)
FIELDS = ["num_hidden_layers", "n_layer", "num_attention_heads", "n_head", "num_key_value_heads", "head_dim", "hidden_size",
          "n_embd", "intermediate_size", "n_inner", "vocab_size", "torch_dtype", "dtype", "text_config"]


# A valid config with one to three fields replaced by anything: most examples get past the first check.
MUTATED = st.dictionaries(st.sampled_from(FIELDS), ANY, min_size=1, max_size=3).map(lambda change: dict(LLAMA_8B, **change))


@settings(max_examples=300, deadline=None)
@given(config=st.one_of(MUTATED, MUTATED, ANY, st.fixed_dictionaries({}, optional={k: ANY for k in FIELDS})),
       options=st.fixed_dictionaries({}, optional={
           "parameters": ANY, "gpu_memory": ANY, "max_model_len": ANY, "max_num_seqs": ANY, "max_gpus": ANY,
           "tensor_parallel_size": ANY, "gpu_memory_utilization": ANY, "reserved_memory": ANY, "dtype": ANY,
           "kv_cache_dtype": ANY, "max_num_batched_tokens": ANY, "engine_max_num_seqs": ANY,
           # a choice: ansible-core's own sentence, which repeats the value as given (a newline in it too)
           "gpu_memory_source": st.sampled_from(["cuda", "nvml", "smi"])}))
def test_generated_wrong_inputs_never_raise(config, options):
    """Whatever the shapes, the module exits with a plan or fails with one sentence; it never raises."""
    args = dict(BASE, model_config=config, **options)
    exited, result = run_module(module, args)
    if not exited:
        assert_one_sentence(result["msg"])
    else:
        assert result["tensor_parallel_size"] >= 1 and result["engine_args"][0] == "--tensor-parallel-size"
