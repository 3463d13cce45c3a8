# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""GPU sizing arithmetic, checked against hand-computed numbers, and its failures."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.errors import CheckError
from ansible_collections.inference_cache.substrate.plugins.module_utils.engine import sizing as S

GIB = 1024 ** 3
# Llama-3.1-8B: 32 layers, 32 heads, 8 KV heads, hidden 4096 (head 128), bf16.
LLAMA_8B = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096, "torch_dtype": "bfloat16"}
# Llama-3.1-70B: 80 layers, 64 heads, 8 KV heads, hidden 8192.
LLAMA_70B = {"num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "hidden_size": 8192, "torch_dtype": "bfloat16"}
# Qwen3-0.6B declares head_dim explicitly (128, not hidden/heads = 64).
QWEN3_06B = {"num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "hidden_size": 1024, "head_dim": 128,
             "torch_dtype": "bfloat16"}


def test_kv_bytes_per_token_llama_8b():
    # 2 (K,V) x 32 layers x 8 heads x 128 x 2 bytes = 131072 bytes = 128 KiB per token
    assert S.kv_bytes_per_token(S.model_shape(LLAMA_8B), 2) == 131072


def test_head_dim_from_config_wins():
    shape = S.model_shape(QWEN3_06B)
    assert shape["head_dim"] == 128
    assert S.kv_bytes_per_token(shape, 2) == 2 * 28 * 8 * 128 * 2


def test_kv_heads_split_then_replicated():
    shape = S.model_shape(LLAMA_70B)
    assert S.kv_bytes_per_token(shape, 2, tp=2) == 2 * 80 * 4 * 128 * 2
    assert S.kv_bytes_per_token(shape, 2, tp=16) == 2 * 80 * 1 * 128 * 2  # 8 KV heads over 16 ranks: one each


def test_llama_8b_32k_fits_one_80g_gpu():
    plan = S.plan(LLAMA_8B, "8B", "80GiB", 32768)
    assert plan["tensor_parallel_size"] == 1
    assert plan["weights_bytes"] == 16 * 10 ** 9
    assert plan["kv_cache_bytes_required"] == 131072 * 32768  # 4 GiB
    assert plan["kv_cache_gib_required"] == 4.0
    usable = int(80 * GIB * 0.9) - GIB
    assert plan["max_tokens_fit"] == (usable - 16 * 10 ** 9) // 131072
    assert plan["engine_args"] == ["--tensor-parallel-size", "1", "--max-model-len", "32768"]


def test_llama_70b_needs_tensor_parallelism():
    plan = S.plan(LLAMA_70B, "70B", "80GiB", 8192)
    # 140e9 B of weights do not fit one GPU (71 GiB usable); TP 2: 65.2 GiB of weights + 1.25 GiB of KV per GPU fits.
    assert plan["tensor_parallel_size"] == 2
    assert [c["fits"] for c in plan["candidates"]][:2] == [False, True]


def test_context_that_does_not_fit_fails_early_with_the_numbers():
    with pytest.raises(CheckError) as err:
        S.plan(LLAMA_8B, "8B", "24GiB", 131072, max_num_seqs=4, max_gpus=1)
    msg = str(err.value)
    assert msg.startswith("The requested context of 524288 tokens (131072 x 4 sequences) does not fit: weights 14.9 GiB plus KV cache 64.0 GiB")
    assert "exceed 1 GPU(s) of 24.0 GiB" in msg
    assert err.value.facts["kv_cache_bytes_required"] == 131072 * 524288


def test_fp8_kv_cache_halves_the_kv_bytes():
    plan = S.plan(LLAMA_8B, "8B", "24GiB", 8192, kv_cache_dtype="fp8")
    assert plan["kv_cache_bytes_per_token"] == 65536


def test_explicit_tp_is_checked_only():
    with pytest.raises(CheckError, match="tensor_parallel_size 3 does not divide the 32 attention heads"):
        S.plan(LLAMA_8B, "8B", "24GiB", 8192, tensor_parallel_size=3)
    assert S.plan(LLAMA_8B, "8B", "24GiB", 8192, tensor_parallel_size=2)["tensor_parallel_size"] == 2


@pytest.mark.parametrize("value,expected", [(80, 80 * GIB), ("80GiB", 80 * GIB), ("24 GB", 24 * 10 ** 9), ("81920MiB", 80 * GIB), ("1.5", int(1.5 * GIB))])
def test_parse_bytes(value, expected):
    assert S.parse_bytes(value) == expected


@pytest.mark.parametrize("value,expected", [("8B", 8 * 10 ** 9), ("0.6B", 600000000), ("70b", 70 * 10 ** 9), (8e9, 8 * 10 ** 9), ("125M", 125 * 10 ** 6)])
def test_parse_count(value, expected):
    assert S.parse_count(value) == expected


@pytest.mark.parametrize("call,message", [
    (lambda: S.parse_bytes("lots"), "Memory size 'lots' is not understood; write e.g. 80GiB or 24GB."),
    (lambda: S.parse_count("many"), "Parameter count 'many' is not understood; write e.g. 8B or 8000000000."),
    (lambda: S.dtype_bytes("float13"), "Data type 'float13' is not one of"),
    (lambda: S.model_shape({"hidden_size": 10}), "The model config has no num_hidden_layers or num_attention_heads."),
    (lambda: S.plan(LLAMA_8B, "8B", "2GiB", 1024, reserved_memory="4GiB"), "A GPU of 2.0 GiB leaves no memory"),
    (lambda: S.plan(LLAMA_8B, "8B", "24GiB", 0), "max_model_len must be a whole number between 1 and 100000000, got 0."),
    (lambda: S.plan(LLAMA_8B, "8B", "24GiB", 1024, gpu_memory_utilization=1.5), "gpu_memory_utilization must be in (0, 1]"),
    # the numbers are checked by the module's option table (PLAN_OPTIONS), with the same words for a wrong type
    (lambda: S.plan(LLAMA_8B, "8B", "24GiB", 1024, max_gpus="8"), "max_gpus must be a whole number between 1 and 4096, got '8'."),
    (lambda: S.plan(LLAMA_8B, "8B", "24GiB", 1024, gpu_memory_utilization=True), "gpu_memory_utilization must be in (0, 1], got True."),
    (lambda: S.plan(LLAMA_8B, "8B", "24GiB", 1024, tensor_parallel_size=5000),
     "tensor_parallel_size must be a whole number between 1 and 4096, got 5000."),
])
def test_bad_inputs_fail_with_one_sentence(call, message):
    with pytest.raises(CheckError) as err:
        call()
    assert str(err.value).startswith(message)


def test_multimodal_text_config_is_used():
    config = {"text_config": dict(LLAMA_8B), "vision_config": {"num_hidden_layers": 1}}
    assert S.model_shape(config)["num_layers"] == 32
