# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""GPU memory planning (module_utils/gpu): the arithmetic against hand-computed numbers and against what an H200 measured
(REFERENCE M5), GPUs by product, and the failures."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.errors import CheckError
from ansible_collections.inference_cache.substrate.plugins.module_utils.gpu import memory_plan as S
from ansible_collections.inference_cache.substrate.plugins.module_utils.gpu import products as P

GIB = 1024 ** 3
MIB = 1024 ** 2
# The config.json fields of the five models measured on the H200 (Hugging Face configs of each).
LLAMA31_8B = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
              "intermediate_size": 14336, "vocab_size": 128256, "torch_dtype": "bfloat16"}
QWEN25_7B = {"num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "hidden_size": 3584,
             "intermediate_size": 18944, "vocab_size": 152064, "torch_dtype": "bfloat16"}
MISTRAL_7B = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
              "intermediate_size": 14336, "vocab_size": 32768, "torch_dtype": "bfloat16"}
LLAMA2_7B = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "hidden_size": 4096,
             "intermediate_size": 11008, "vocab_size": 32000, "torch_dtype": "bfloat16"}
QWEN3_8B = {"num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 4096,
            "intermediate_size": 12288, "vocab_size": 151936, "torch_dtype": "bfloat16"}
# Llama-3.1-70B: 80 layers, 64 heads, 8 KV heads, hidden 8192.
LLAMA_70B = {"num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "hidden_size": 8192,
             "intermediate_size": 28672, "vocab_size": 128256, "torch_dtype": "bfloat16"}
# Qwen3-0.6B declares head_dim explicitly (128, not hidden/heads = 64).
QWEN3_06B = {"num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "hidden_size": 1024, "head_dim": 128,
             "intermediate_size": 3072, "vocab_size": 151936, "torch_dtype": "bfloat16"}

# What the H200 measured (benchmarks/bench_gpu_plan.py, 2026-12-04; PyTorch 2.11 + CUDA 13, transformers 5.17, random
# bf16 weights): one 8192-token prefill (sdpa, the logits of the last token) and a sampling step over 1 or 1024 rows of
# logits, each as the peak of PyTorch's reserved memory over weights and cache, plus the CUDA context outside PyTorch
# (0.679 GiB): GiB beside weights and KV cache, by sequences sampled.
MEASURED_H200_GIB = {"Llama-3.1-8B": {1: 1.804, 1024: 2.458}, "Qwen2.5-7B": {1: 1.907, 1024: 2.764},
                     "Mistral-7B": {1: 1.804, 1024: 1.772}, "Llama-2-7B": {1: 1.827, 1024: 1.796},
                     "Qwen3-8B": {1: 1.712, 1024: 2.772}}


@pytest.mark.parametrize("name, config, kv_per_token", [
    ("Llama-3.1-8B", LLAMA31_8B, 131072), ("Qwen2.5-7B", QWEN25_7B, 57344), ("Mistral-7B", MISTRAL_7B, 131072),
    ("Llama-2-7B", LLAMA2_7B, 524288), ("Qwen3-8B", QWEN3_8B, 147456),
])
@pytest.mark.parametrize("sampled", [1, 1024])
def test_reserve_covers_what_the_h200_measured(name, config, kv_per_token, sampled):
    shape = S.model_shape(config)
    # the KV bytes per token the H200's tensors had (ratio 1.000)
    assert S.kv_bytes_per_token(shape, 2) == kv_per_token, name
    # at least what the card needed, and not more than half a GiB above it
    measured = MEASURED_H200_GIB[name][sampled] * GIB
    reserve = S.reserve(shape, 8192, sampled)["total_bytes"]
    assert measured <= reserve <= measured + 0.5 * GIB, (name, sampled, reserve / GIB)
    # the old fixed reserve of 1 GiB fell short of every one of them
    assert measured > GIB and reserve > GIB


def test_reserve_terms_by_hand():
    # Llama-3.1-8B, 8192 tokens, 1024 sequences sampled (vLLM's default on an H200), bf16
    terms = S.reserve(S.model_shape(LLAMA31_8B), 8192, 1024)
    forward = 8192 * 2 * (3 * 14336 + 4 * 4096) + 8192 * 32 * 4
    sampler = 8192 * 4096 * 2 + 1024 * 128256 * (2 + 12)
    assert (terms["forward_bytes"], terms["sampler_bytes"]) == (forward, sampler)
    assert terms["total_bytes"] == int(0.68 * GIB) + 416 * MIB + max(forward, sampler)
    # tensor parallelism splits the MLP and the heads, not the residual stream nor the sampled vocabulary
    split = S.reserve(S.model_shape(LLAMA31_8B), 8192, 1024, tp=2)
    assert split["forward_bytes"] == 8192 * 2 * (3 * 7168 + 4 * 4096) + 8192 * 16 * 4 and split["sampler_bytes"] == sampler
    # no more sequences sampled than tokens in the batch; float32 models keep 4-byte activations
    assert S.reserve(S.model_shape(LLAMA31_8B), 16, 1024)["sampled_sequences"] == 16
    assert S.reserve(S.model_shape(LLAMA31_8B), 8192, 1, activation_bytes=4)["forward_bytes"] == 2 * forward - 8192 * 32 * 4


def test_issue_example_llama_31_8b_on_an_h200():
    # nvidia-smi's 143771 MiB: the old plan promised 904,427 tokens (1 GiB reserved, the 143771 MiB taken as CUDA's);
    # at most ~894,900 fit once the measured overhead is paid on the 139.80 GiB CUDA reports.
    for extra in ({}, {"engine_max_num_seqs": 1}):
        plan = S.plan(LLAMA31_8B, 8030261248, "143771MiB", 131072, **extra)
        assert plan["gpu"] == "H200" and plan["gpu_memory_bytes"] == int(139.80 * GIB)
        assert plan["max_tokens_fit"] <= 894900, extra
        assert "CUDA reports 139.80 GiB" in plan["warning"]
    assert S.plan(LLAMA31_8B, 8030261248, None, 131072, gpu="H200")["max_tokens_fit"] <= 894900


def test_llama_8b_32k_fits_one_h100_by_hand():
    plan = S.plan(LLAMA31_8B, "8B", None, 32768, gpu="H100-80GB")
    assert plan["tensor_parallel_size"] == 1 and plan["gpu"] == "H100-80GB" and plan["warning"] == ""
    assert plan["weights_bytes"] == 16 * 10 ** 9
    assert plan["kv_cache_bytes_required"] == 131072 * 32768  # 4 GiB
    assert plan["kv_cache_gib_required"] == 4.0
    cuda = 81559 * MIB - GIB  # nvidia-smi's total less the 1 GiB the driver may keep
    assert plan["gpu_memory_bytes"] == cuda
    assert (plan["max_num_batched_tokens"], plan["engine_max_num_seqs"]) == (8192, 1024)
    reserve = int(0.68 * GIB) + 416 * MIB + 8192 * 4096 * 2 + 1024 * 128256 * 14  # the sampler is the larger here
    assert plan["reserve"]["total_bytes"] == reserve
    assert plan["max_tokens_fit"] == (int(cuda * 0.9) - reserve - 16 * 10 ** 9) // 131072
    assert plan["engine_args"] == ["--tensor-parallel-size", "1", "--max-model-len", "32768"]


def test_kv_bytes_per_token_llama_8b():
    # 2 (K,V) x 32 layers x 8 heads x 128 x 2 bytes = 131072 bytes = 128 KiB per token
    assert S.kv_bytes_per_token(S.model_shape(LLAMA31_8B), 2) == 131072


def test_head_dim_from_config_wins():
    shape = S.model_shape(QWEN3_06B)
    assert shape["head_dim"] == 128
    assert S.kv_bytes_per_token(shape, 2) == 2 * 28 * 8 * 128 * 2


def test_kv_heads_split_then_replicated():
    shape = S.model_shape(LLAMA_70B)
    assert S.kv_bytes_per_token(shape, 2, tp=2) == 2 * 80 * 4 * 128 * 2
    assert S.kv_bytes_per_token(shape, 2, tp=16) == 2 * 80 * 1 * 128 * 2  # 8 KV heads over 16 ranks: one each


def test_llama_70b_needs_tensor_parallelism():
    plan = S.plan(LLAMA_70B, "70B", None, 8192, gpu="H100-80GB")
    # 140e9 B of weights do not fit one GPU; TP 2: 65.2 GiB of weights + 1.25 GiB of KV + 2.9 GiB reserved fit 70.8 GiB.
    assert plan["tensor_parallel_size"] == 2
    assert [c["fits"] for c in plan["candidates"]][:2] == [False, True]


def test_context_that_does_not_fit_fails_early_with_the_numbers():
    with pytest.raises(CheckError) as err:
        S.plan(LLAMA31_8B, "8B", None, 131072, max_num_seqs=4, max_gpus=1, gpu="L4")
    msg = str(err.value)
    assert msg.startswith("The requested context of 524288 tokens (131072 x 4 sequences) does not fit: weights 14.9 GiB plus KV cache 64.0 GiB")
    assert "exceed 1 GPU(s) of 21.5 GiB" in msg
    assert err.value.facts["kv_cache_bytes_required"] == 131072 * 524288


def test_fp8_kv_cache_halves_the_kv_bytes():
    assert S.plan(LLAMA31_8B, "8B", "22GiB", 8192, kv_cache_dtype="fp8")["kv_cache_bytes_per_token"] == 65536


def test_explicit_tp_is_checked_only():
    with pytest.raises(CheckError, match="tensor_parallel_size 3 does not divide the 32 attention heads"):
        S.plan(LLAMA31_8B, "8B", "22GiB", 8192, tensor_parallel_size=3)
    assert S.plan(LLAMA31_8B, "8B", "22GiB", 8192, tensor_parallel_size=2)["tensor_parallel_size"] == 2


@pytest.mark.parametrize("name, product, cuda_bytes", [
    ("H200", "H200", int(139.80 * GIB)), ("NVIDIA-H200", "H200", int(139.80 * GIB)),
    ("H100-80GB", "H100-80GB", 81559 * MIB - GIB), ("NVIDIA H100 80GB HBM3", "H100-80GB", 81559 * MIB - GIB),
    ("NVIDIA-H100-80GB-HBM3-SHARED", "H100-80GB", 81559 * MIB - GIB), ("h100", "H100-80GB", 81559 * MIB - GIB),
    ("A100-80GB", "A100-80GB", 80 * GIB - GIB), ("NVIDIA-A100-SXM4-80GB", "A100-80GB", 80 * GIB - GIB),
    ("NVIDIA A100 80GB PCIe", "A100-80GB", 80 * GIB - GIB), ("A100-40GB", "A100-40GB", 40 * GIB - GIB),
    ("NVIDIA A100-PCIE-40GB", "A100-40GB", 40 * GIB - GIB), ("L40S", "L40S", 46068 * MIB - GIB), ("L40", "L40", 46068 * MIB - GIB),
    ("NVIDIA L4", "L4", 23034 * MIB - GIB), ("A10G", "A10G", 23028 * MIB - GIB), ("A10", "A10", 23028 * MIB - GIB),
    ("Tesla T4", "T4", 15360 * MIB - GIB), ("Tesla-T4", "T4", 15360 * MIB - GIB),
])
def test_gpus_by_product(name, product, cuda_bytes):
    card = S.gpu_total(gpu=name)
    assert (card["product"], card["bytes"], card["warning"]) == (product, cuda_bytes, None)


def test_every_product_has_its_cuda_total_below_nvidia_smi():
    for name in P.NAMES:
        entry = P.lookup(name)
        assert entry["nvml_bytes"] - GIB <= entry["cuda_bytes"] < entry["nvml_bytes"], name
        assert entry["source"], name


@pytest.mark.parametrize("given, source, product, cuda_bytes, warned", [
    # the datasheet's decimal GB, the same number read as GiB, nvidia-smi's MiB: CUDA's total, and a warning
    ("141GB", "cuda", "H200", int(139.80 * GIB), "is the datasheet figure of an H200, but CUDA reports 139.80 GiB"),
    ("141GiB", "cuda", "H200", int(139.80 * GIB), "is the datasheet figure read as GiB of an H200"),
    ("143771MiB", "cuda", "H200", int(139.80 * GIB), "is the nvidia-smi total of an H200"),
    ("46068MiB", "cuda", None, 46068 * MIB - GIB, "is the nvidia-smi total of L40S or L40"),
    ("80GB", "cuda", None, 81559 * MIB - GIB, "so the plan uses the smallest, 78.65 GiB"),
    # CUDA's own figure is taken as it is
    ("139.8GiB", "cuda", None, int(139.8 * GIB), None),
    ("50000MiB", "cuda", None, 50000 * MIB, None),
    # NVML's total (the node label): a known card's CUDA total, else 1 GiB less
    ("143771MiB", "nvml", "H200", int(139.80 * GIB), None),
    ("23034MiB", "nvml", "L4", 23034 * MIB - GIB, None),
    ("23028MiB", "nvml", None, 23028 * MIB - GIB, None),  # an A10G or an A10: the same total, no product named
    ("50000MiB", "nvml", None, 50000 * MIB - GIB, None),
])
def test_gpu_memory_figures(given, source, product, cuda_bytes, warned):
    card = S.gpu_total(given=given, source=source)
    assert (card["product"], card["bytes"]) == (product, cuda_bytes)
    if warned:
        assert warned in card["warning"] and card["warning"].endswith(".")
    else:
        assert card["warning"] is None


@pytest.mark.parametrize("card, max_model_len, tokens, seqs", [
    ({"gpu": "H200"}, 131072, 8192, 1024), ({"gpu": "H100-80GB"}, 4096, 8192, 1024),
    ({"gpu": "A100-80GB"}, 4096, 2048, 256), ({"gpu": "L4"}, 4096, 2048, 256), ({"gpu_memory": "180GiB"}, 4096, 16384, 1024),
    ({"gpu": "H200"}, 4, 4096, 1024),  # at most max_num_seqs x max_model_len tokens
])
def test_engine_batch_follows_vllm_defaults(card, max_model_len, tokens, seqs):
    plan = S.plan(QWEN3_06B, "0.6B", card.get("gpu_memory"), max_model_len, gpu=card.get("gpu"))
    assert (plan["max_num_batched_tokens"], plan["engine_max_num_seqs"]) == (tokens, seqs)
    assert plan["reserve"]["batched_tokens"] == tokens


def test_given_batch_and_sequences_size_the_reserve():
    small = S.plan(LLAMA31_8B, "8B", None, 8192, gpu="H200", max_num_batched_tokens=2048, engine_max_num_seqs=64)
    large = S.plan(LLAMA31_8B, "8B", None, 8192, gpu="H200", max_num_batched_tokens=16384, engine_max_num_seqs=64)
    assert small["reserve"]["batched_tokens"] == 2048 and small["reserve"]["sampled_sequences"] == 64
    assert large["reserve"]["forward_bytes"] > 2 * small["reserve"]["forward_bytes"] - 1
    assert large["max_tokens_fit"] < small["max_tokens_fit"]


def test_reserved_memory_overrides_and_warns_when_low():
    plan = S.plan(LLAMA31_8B, "8B", None, 8192, gpu="H200", reserved_memory="1GiB")
    assert plan["candidates"][0]["reserved_bytes_per_gpu"] == GIB and plan["reserve"]["given_bytes"] == GIB
    assert plan["warning"].startswith("reserved_memory 1GiB is below the 2.86 GiB this model needs per GPU")
    assert S.plan(LLAMA31_8B, "8B", None, 8192, gpu="H200", reserved_memory="4GiB")["warning"] == ""


def test_missing_sizes_are_assumed_large_with_a_warning():
    config = dict((k, v) for k, v in LLAMA31_8B.items() if k not in ("intermediate_size", "vocab_size"))
    shape = S.model_shape(config)
    assert (shape["intermediate_size"], shape["vocab_size"], shape["assumed"]) == (8 * 4096, 262144, ["intermediate_size", "vocab_size"])
    plan = S.plan(config, "8B", None, 8192, gpu="H200")
    assert "The model config has no intermediate_size or vocab_size" in plan["warning"]
    assert plan["reserve"]["total_bytes"] > S.plan(LLAMA31_8B, "8B", None, 8192, gpu="H200")["reserve"]["total_bytes"]


def test_hidden_size_from_heads_when_only_head_dim_is_given():
    config = {"num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 64, "intermediate_size": 1024, "vocab_size": 1000}
    assert S.model_shape(config)["hidden_size"] == 512


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
    (lambda: S.plan(LLAMA31_8B, "8B", "2GiB", 1024, reserved_memory="4GiB"), "A GPU of 2.0 GiB leaves no memory"),
    (lambda: S.plan(LLAMA31_8B, "8B", "1GiB", 1024), "A GPU of 1.0 GiB leaves no memory after utilization 0.90 and 1.5 GiB reserved."),
    (lambda: S.plan(LLAMA31_8B, "8B", "22GiB", 0), "max_model_len must be a whole number between 1 and 100000000, got 0."),
    (lambda: S.plan(LLAMA31_8B, "8B", "22GiB", 1024, gpu_memory_utilization=1.5), "gpu_memory_utilization must be in (0, 1]"),
    # the numbers are checked by the module's option table (PLAN_OPTIONS), with the same words for a wrong type
    (lambda: S.plan(LLAMA31_8B, "8B", "22GiB", 1024, max_gpus="8"), "max_gpus must be a whole number between 1 and 4096, got '8'."),
    (lambda: S.plan(LLAMA31_8B, "8B", "22GiB", 1024, gpu_memory_utilization=True), "gpu_memory_utilization must be in (0, 1], got True."),
    (lambda: S.plan(LLAMA31_8B, "8B", "22GiB", 1024, tensor_parallel_size=5000),
     "tensor_parallel_size must be a whole number between 1 and 4096, got 5000."),
    (lambda: S.plan(LLAMA31_8B, "8B", "22GiB", 1024, max_num_batched_tokens=0),
     "max_num_batched_tokens must be a whole number between 1 and 100000000, got 0."),
    (lambda: S.plan(LLAMA31_8B, "8B", "22GiB", 1024, engine_max_num_seqs=-1),
     "engine_max_num_seqs must be a whole number between 1 and 1000000, got -1."),
    (lambda: S.plan(LLAMA31_8B, "8B", None, 1024), "Name the GPU (gpu, e.g. H100-80GB) or give its memory (gpu_memory)."),
    (lambda: S.plan(LLAMA31_8B, "8B", None, 1024, gpu="RTX-9090"),
     "gpu 'RTX-9090' is not a GPU the plan knows (H200, H100-80GB, A100-80GB, A100-40GB, L40S, L40, L4, A10G, A10, T4); "
     "give gpu_memory, the total CUDA reports, instead."),
    (lambda: S.plan(LLAMA31_8B, "8B", "1000MiB", 1024, gpu_memory_source="nvml"),
     "gpu_memory 1000MiB is NVML's total of a GPU too small to plan for."),
])
def test_bad_inputs_fail_with_one_sentence(call, message):
    with pytest.raises(CheckError) as err:
        call()
    assert str(err.value).startswith(message)


def test_multimodal_text_config_is_used():
    config = {"text_config": dict(LLAMA31_8B), "vision_config": {"num_hidden_layers": 1}}
    assert S.model_shape(config)["num_layers"] == 32


@pytest.mark.parametrize("name, labels", [
    ("H200", ["NVIDIA-H200", "NVIDIA-H200-SHARED"]),
    ("NVIDIA H100 80GB HBM3", ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-80GB-HBM3-SHARED", "NVIDIA-H100-PCIe", "NVIDIA-H100-PCIe-SHARED"]),
    ("T4", ["Tesla-T4", "Tesla-T4-SHARED"]),
])
def test_gpu_feature_discovery_product_labels_of_a_card(name, labels):
    assert P.node_labels(name) == labels
    # Each label GFD writes names the card again (lookup reads GFD's product labels).
    assert all(P.lookup(label)["name"] == P.lookup(name)["name"] for label in labels)


def test_every_card_has_gfd_product_labels_and_the_plan_returns_them():
    assert sorted(P.GFD_PRODUCT_LABELS) == sorted(P.NAMES)
    result = S.plan({"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
                     "intermediate_size": 14336, "vocab_size": 128256, "torch_dtype": "bfloat16"}, "8.03B", gpu="L40S",
                    max_model_len=4096)
    assert result["gpu"] == "L40S" and result["gpu_product_labels"] == ["NVIDIA-L40S", "NVIDIA-L40S-SHARED"]
    unnamed = S.plan({"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
                      "intermediate_size": 14336, "vocab_size": 128256, "torch_dtype": "bfloat16"}, "8.03B", gpu_memory="75GiB",
                     max_model_len=4096)
    assert unnamed["gpu"] is None and unnamed["gpu_product_labels"] == []
