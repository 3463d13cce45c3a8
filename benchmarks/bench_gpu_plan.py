#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What ``gpu_memory_plan`` promises, held against a real GPU (needs CUDA, PyTorch and transformers; no downloads).

For each of five model shapes (the config.json fields of Llama-3.1-8B, Qwen2.5-7B, Mistral-7B, Llama-2-7B and
Qwen3-8B, random bf16 weights built from the config on the GPU):

* weights and KV bytes per token: the plan's against the real tensors (the model's parameters as allocated; the output
  rows of every layer's key and value projections);
* the memory beside weights and KV cache, measured as vLLM 0.32.0 profiles it: one prefill of T tokens through the
  model (``logits_to_keep=1``), then a sampler step over R rows of logits (float32 copy, softmax, exponential noise,
  argmax), each peak over PyTorch's allocator (``max_memory_reserved``, so the allocator's rounding counts), plus the
  CUDA context outside it (the device's used memory less what PyTorch reserves). Against the plan's reserve for the
  same T and R: ``margin`` = reserve - measured (positive: the plan kept more than needed);
* the promise itself: with the KV cache the plan says fits at utilization 1.0 (the whole card) allocated beside the
  weights, the same prefill and sampler step run; ``fits`` says whether they did without running out of memory, and
  ``free`` how much of the card was never touched.

R = 1 is the run REFERENCE M5 records; R = 1024 is what vLLM's OpenAI server profiles on an H200 (``max_num_seqs``
1024, ``max_num_batched_tokens`` 8192). Not measured: CUDA graphs, NCCL, vLLM's own kernels (the prefill here is
transformers' with sdpa attention), so this bounds the plan's arithmetic, not a vLLM release.

  python benchmarks/bench_gpu_plan.py [--tokens 8192] [--rows 1,1024] [--models all] [--json FILE] [--require]

Without a CUDA device (or without PyTorch and transformers) the plan's figures are printed and the measured columns are
not; ``--require`` makes that an error (exit 2).
"""

from __future__ import absolute_import, division, print_function

import argparse
import gc
import json
import sys
import time

import _lab  # noqa: F401  pylint: disable=unused-import
from ansible_collections.inference_cache.substrate.plugins.module_utils.common import errors  # noqa: E402  pylint: disable=wrong-import-order
from ansible_collections.inference_cache.substrate.plugins.module_utils.gpu import memory_plan  # noqa: E402  pylint: disable=wrong-import-order

GIB = 1024 ** 3
# The config.json fields the plan reads, as in each model's Hugging Face config (tests/unit/.../test_memory_plan.py has
# the same five); model_type picks transformers' architecture. Mistral-7B is v0.3 (no sliding window: with v0.1's
# window of 4096, transformers' sdpa path builds a T x T mask that vLLM's attention never holds).
MODELS = {
    "Llama-3.1-8B": {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                     "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256},
    "Qwen2.5-7B": {"model_type": "qwen2", "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                   "hidden_size": 3584, "intermediate_size": 18944, "vocab_size": 152064},
    "Mistral-7B": {"model_type": "mistral", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                   "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 32768, "sliding_window": None},
    "Llama-2-7B": {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
                   "hidden_size": 4096, "intermediate_size": 11008, "vocab_size": 32000},
    "Qwen3-8B": {"model_type": "qwen3", "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
                 "head_dim": 128, "hidden_size": 4096, "intermediate_size": 12288, "vocab_size": 151936},
}
PARAMETERS = {"Llama-3.1-8B": "8.03B", "Qwen2.5-7B": "7.62B", "Mistral-7B": "7.25B", "Llama-2-7B": "6.74B", "Qwen3-8B": "8.19B"}


def plan_for(name, tokens, rows, parameters=None, gpu="H200", gpu_memory=None, utilization=1.0):
    config = dict(MODELS[name], torch_dtype="bfloat16")
    return memory_plan.plan(config, parameters or PARAMETERS[name], gpu=gpu, gpu_memory=gpu_memory, max_model_len=tokens,
                            gpu_memory_utilization=utilization, max_num_batched_tokens=tokens, engine_max_num_seqs=rows)


def _torch():
    """(torch, transformers) when a CUDA device can be used, else (None, the reason in one sentence)."""
    try:
        import torch  # pylint: disable=import-outside-toplevel
        import transformers  # pylint: disable=import-outside-toplevel
    except ImportError as exc:
        return None, "PyTorch and transformers are not importable here (%s)" % exc
    if not torch.cuda.is_available():
        return None, "PyTorch finds no CUDA device"
    return (torch, transformers), None


def _build(torch, transformers, name):
    fields = dict(MODELS[name])
    config = transformers.AutoConfig.for_model(fields.pop("model_type"), tie_word_embeddings=False, **fields)
    config._attn_implementation = "sdpa"  # pylint: disable=protected-access
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return model.eval()


def kv_bytes_per_token(model):
    """What one token's K and V take over every layer, from the model's own tensors: the output rows of each layer's
    key and value projections (KV heads x head size), in the projections' dtype."""
    attention = [module for name, module in model.named_modules() if name.endswith("self_attn")]
    return sum((a.k_proj.weight.shape[0] + a.v_proj.weight.shape[0]) * a.k_proj.weight.element_size() for a in attention)


def _non_torch(torch):
    free, total = torch.cuda.mem_get_info()
    return total - free - torch.cuda.memory_reserved()


def _step(torch, model, tokens, rows):
    """Peak bytes over the allocator's reserve at entry, for one prefill and for one sampler step of ``rows``."""
    vocab = model.config.vocab_size
    peaks = {}
    with torch.inference_mode():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_reserved()
        torch.cuda.reset_peak_memory_stats()
        ids = torch.randint(0, vocab, (1, tokens), device="cuda")
        model(input_ids=ids, use_cache=False, logits_to_keep=1)
        torch.cuda.synchronize()
        peaks["forward"] = torch.cuda.max_memory_reserved() - base
        del ids
        torch.cuda.empty_cache()
        base = torch.cuda.memory_reserved()
        torch.cuda.reset_peak_memory_stats()
        hidden = torch.randn(tokens, model.config.hidden_size, device="cuda", dtype=torch.bfloat16)
        logits = model.lm_head(hidden[-rows:]).float()
        probs = logits.softmax(dim=-1)
        noise = torch.empty_like(probs).exponential_()
        probs.div_(noise).argmax(dim=-1)
        torch.cuda.synchronize()
        peaks["sampler"] = torch.cuda.max_memory_reserved() - base
        del hidden, logits, probs, noise
    torch.cuda.empty_cache()
    return peaks


def measure(libs, name, tokens, rows_list, gpu):
    torch, transformers = libs
    gc.collect()
    torch.cuda.empty_cache()
    start = time.time()
    before = torch.cuda.memory_allocated()
    model = _build(torch, transformers, name)
    weights = torch.cuda.memory_allocated() - before
    n_params = sum(p.numel() for p in model.parameters())
    kv_per_token = kv_bytes_per_token(model)
    rows_out = []
    for rows in rows_list:
        plan = plan_for(name, tokens, rows, parameters=n_params, gpu=gpu)
        peaks = _step(torch, model, tokens, rows)
        non_torch = _non_torch(torch)
        measured = non_torch + max(peaks["forward"], peaks["sampler"])
        # The promise: the plan's KV cache at utilization 1.0 beside the weights, then the same steps.
        promised = plan["max_tokens_fit"]
        fits, free_min, note, cache = True, None, "", None
        try:
            cache = torch.empty(promised * plan["kv_cache_bytes_per_token"], dtype=torch.uint8, device="cuda")
            again = _step(torch, model, tokens, rows)
            total = torch.cuda.mem_get_info()[1]
            free_min = total - _non_torch(torch) - (torch.cuda.memory_reserved() + max(again.values()))
        except torch.OutOfMemoryError as exc:  # the plan promised more than the card holds
            fits, note = False, str(exc).split(".", 1)[0]
        finally:
            cache = None
        torch.cuda.empty_cache()
        reserve = plan["reserve"]["total_bytes"]
        rows_out.append({
            "model": name, "tokens": tokens, "rows": rows, "parameters": n_params,
            "weights_ratio": round(weights / float(plan["weights_bytes"]), 4),
            "kv_per_token": kv_per_token, "kv_per_token_plan": plan["kv_cache_bytes_per_token"],
            "forward_gib": round(peaks["forward"] / GIB, 3), "sampler_gib": round(peaks["sampler"] / GIB, 3),
            "cuda_context_gib": round(non_torch / GIB, 3), "measured_gib": round(measured / GIB, 3),
            "reserve_gib": round(reserve / GIB, 3), "margin_gib": round((reserve - measured) / GIB, 3),
            "promised_tokens": promised, "fits": fits, "free_gib": round(free_min / GIB, 3) if free_min is not None else None,
            "note": note})
    del model
    gc.collect()
    torch.cuda.empty_cache()
    for row in rows_out:
        row["seconds"] = round(time.time() - start, 1)
    return rows_out


def _table(rows, measured):
    cols = ["model", "rows", "reserve_gib", "promised_tokens"]
    if measured:
        cols += ["weights_ratio", "kv_per_token", "forward_gib", "sampler_gib", "cuda_context_gib", "measured_gib",
                 "margin_gib", "fits", "free_gib"]
    widths = [max(len(c), *(len(str(r.get(c))) for r in rows)) for c in cols]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for row in rows:
        print("  ".join(str(row.get(c)).ljust(w) for c, w in zip(cols, widths)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--tokens", type=int, default=8192, help="prefill tokens (max_num_batched_tokens)")
    parser.add_argument("--rows", default="1,1024", help="sampled rows (max_num_seqs), comma-separated")
    parser.add_argument("--models", default="all", help="comma-separated names of %s" % ", ".join(MODELS))
    parser.add_argument("--gpu", default="H200", help="the product the plan is made for (gpu_memory_plan's gpu)")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--require", action="store_true", help="fail when no CUDA device can be used")
    args = parser.parse_args(argv)
    names = list(MODELS) if args.models == "all" else [n.strip() for n in args.models.split(",")]
    unknown = [n for n in names if n not in MODELS]
    try:
        rows_list = [int(r) for r in args.rows.split(",")]
        if unknown or min(rows_list) < 1:
            raise ValueError
    except ValueError:
        print("bench_gpu_plan: --models takes names of %s and --rows positive whole numbers (got %s, %s)."
              % (", ".join(MODELS), args.models, args.rows), file=sys.stderr)
        return 2
    libs, why = _torch()
    if libs is None:
        if args.require:
            print("bench_gpu_plan: %s; run it on a machine with an NVIDIA GPU, PyTorch and transformers." % why, file=sys.stderr)
            return 2
        print("bench_gpu_plan: %s: the plan's figures only, nothing measured." % why)
    try:
        if libs is None:
            out = [dict(model=n, tokens=args.tokens, rows=r, reserve_gib=round(p["reserve"]["total_bytes"] / GIB, 3),
                        promised_tokens=p["max_tokens_fit"])
                   for n in names for r in rows_list for p in [plan_for(n, args.tokens, r, gpu=args.gpu)]]
        else:
            torch = libs[0]
            print("device: %s, CUDA total %.2f GiB, PyTorch %s, transformers %s" % (
                torch.cuda.get_device_name(), torch.cuda.mem_get_info()[1] / GIB, torch.__version__, libs[1].__version__))
            out = [row for n in names for row in measure(libs, n, args.tokens, rows_list, args.gpu)]
    except errors.CheckError as exc:
        print("bench_gpu_plan: %s" % exc, file=sys.stderr)
        return 2
    _table(out, libs is not None)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(out, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
