# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""GPU memory planning for a decoder-only transformer served by vLLM (or SGLang), in plain Python (no Ansible import).

The arithmetic, per GPU of one replica at tensor-parallel size ``tp`` (bytes throughout):

* weights            = parameters x bytes(dtype) / tp
* KV bytes per token = 2 (K and V) x layers x ceil(kv_heads / tp) x head_dim x bytes(kv dtype)
  (the KV heads are split over the ranks, and replicated when tp > kv_heads)
* reserve            = CUDA context + workspaces + max(forward, sampler), or ``reserved_memory`` when given:

  - CUDA context = 0.68 GiB: what a CUDA process holds outside PyTorch's allocator, measured on an H200 with
    PyTorch 2.11 + CUDA 13 (REFERENCE M5); smaller cards hold a little less.
  - workspaces   = 416 MiB: cuBLAS and attention-library workspaces and the allocator's rounding.
  - forward      = T x a x (3 x ceil(I / tp) + 4 x H) + T x ceil(heads / tp) x 4: one prefill chunk of T tokens
    (the engine's ``max_num_batched_tokens``) through one layer, a bytes per activation (2; 4 for float32 models),
    I the MLP's intermediate size, H the hidden size. The MLP holds the gate projection, its activation and the up
    projection at once (3 x T x I) beside the residual stream, the normed input, the attention output and the layer's
    result (4 x T x H); attention adds the float32 log-sum-exp of every query head (FlashAttention's softmax_lse).
  - sampler      = T x H x a + R x V x (a + 12): the engine samples R sequences at once, R = min(T, the engine's
    ``max_num_seqs``), over a vocabulary of V: the logits in the model's dtype, their float32 copy, the
    probabilities and the exponential noise (4 bytes each) per vocabulary entry, beside the chunk's hidden states
    (vLLM 0.32.0 profiles exactly this: ``vllm/v1/worker/gpu_model_runner.py`` ``_dummy_run`` with
    ``num_reqs = min(max_num_tokens, max_num_seqs)``, then ``_dummy_sampler_run``; ``vllm/v1/sample/sampler.py``,
    ``vllm/v1/sample/ops/topk_topp_sampler.py``).

* usable             = CUDA total x gpu_memory_utilization - reserve (vLLM 0.32.0 ``vllm/v1/worker/gpu_worker.py``
  ``determine_available_memory``: requested memory less weights, peak activation and non-PyTorch memory)
* the smallest tp (a power of two dividing the attention heads, at most ``max_gpus``) whose weights share plus the
  KV cache for ``max_model_len x max_num_seqs`` tokens fits the usable memory is chosen.

Held against an H200 (``benchmarks/bench_gpu_plan.py``, 2026-12-04): for Llama-3.1-8B, Qwen2.5-7B, Mistral-7B,
Llama-2-7B and Qwen3-8B, one 8192-token prefill and a sampling step of 1 or 1024 sequences took 1.71-2.77 GiB beside
weights and cache (PyTorch's reserved peak plus the 0.68 GiB CUDA context); this reserve is 0.01-0.41 GiB above each,
and with the KV cache it promises at utilization 1.0 allocated, the same steps ran on the card every time.

T and the engine's max_num_seqs default to what vLLM 0.32.0's OpenAI server picks (``vllm/engine/arg_utils.py``
``EngineArgs.get_batch_defaults``): 16384 and 1024 on GPUs of 160 GiB or more, 8192 and 1024 on GPUs of 70 GiB or
more but A100s, 2048 and 256 otherwise; T is then at most max_num_seqs x max_model_len
(``_set_default_max_num_seqs_and_batched_tokens_args``).

Not covered (the plan says so in its documentation): CUDA graphs (vLLM captures them after sizing the KV cache, out of
the memory beyond gpu_memory_utilization, unless VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS is set), NCCL and
all-reduce buffers at tp > 1, LoRA adapters, multimodal encoders, MoE expert activations (the dense
intermediate_size is used), multi-head latent attention, sliding-window and hybrid (Mamba) layers (their KV is
sized as full attention, an upper bound), the scales of a quantized KV cache.

Every wrong input and every plan that does not fit raises ``common.errors.CheckError`` with one sentence (and, for a
plan that does not fit, the numbers as its facts). ``PLAN_OPTIONS`` is the option table of the gpu_memory_plan module:
its argument spec and the checks of ``plan``'s numeric arguments.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import math
import re

from ..common.errors import CheckError
from ..common.options import validate
from . import products

GIB = 1024 ** 3
MIB = 1024 ** 2

DTYPE_BYTES = {
    "float32": 4, "fp32": 4,
    "float16": 2, "fp16": 2, "half": 2, "bfloat16": 2, "bf16": 2,
    "float8": 1, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1,
    "int4": 0.5,
}

# The reserve's fixed parts (see the module docstring).
CUDA_CONTEXT_BYTES = int(0.68 * GIB)
WORKSPACE_BYTES = 416 * MIB
SAMPLER_FLOAT32_COPIES = 3  # the float32 logits, the probabilities, the exponential noise (4 bytes each)
# A config.json without these: sizes above those of the common dense decoders (Gemma's 8 x hidden, Gemma 3's vocabulary).
FALLBACK_INTERMEDIATE_PER_HIDDEN = 8
FALLBACK_VOCAB = 262144

_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?(?:[eE][+]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")
_BYTE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000 ** 2, "mb": 1000 ** 2, "g": 1000 ** 3, "gb": 1000 ** 3,
               "t": 1000 ** 4, "tb": 1000 ** 4, "kib": 1024, "mib": 1024 ** 2, "gib": GIB, "tib": 1024 ** 4}
_COUNT_UNITS = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


# The fields of a Hugging Face config.json the plan reads, with the shape each must have when present (null counts
# as absent). A config.json carries dozens of other, model-specific keys, which are ignored; so this is an open
# schema, checked by ``check_config_shape``; the rules between fields are in ``model_shape``.
POSITIVE_INT = "a positive whole number"
TEXT = "a string"
MAPPING = "a mapping"
CONFIG_FIELDS = {
    "num_hidden_layers": POSITIVE_INT, "n_layer": POSITIVE_INT, "num_layers": POSITIVE_INT,
    "num_attention_heads": POSITIVE_INT, "n_head": POSITIVE_INT,
    "num_key_value_heads": POSITIVE_INT,
    "head_dim": POSITIVE_INT,
    "hidden_size": POSITIVE_INT, "n_embd": POSITIVE_INT,
    "intermediate_size": POSITIVE_INT, "n_inner": POSITIVE_INT,
    "vocab_size": POSITIVE_INT,
    "torch_dtype": TEXT, "dtype": TEXT,
    "text_config": MAPPING,
}


def _whole(low, high, **entry):
    """An int option between ``low`` and ``high``, worded as a whole number in its sentences."""
    return dict(entry, type="int", range=(low, high), must_be="a whole number between %d and %d" % (low, high))


# The option table of the gpu_memory_plan module (common/options.py); PLAN_NUMBERS are the ones ``plan`` checks itself.
PLAN_OPTIONS = {
    "model_config": {"type": "dict"},
    "model_config_path": {"type": "path"},
    "parameters": {"type": "str", "required": True},
    "dtype": {"type": "str"},
    "kv_cache_dtype": {"type": "str", "default": "auto"},
    "gpu": {"type": "str"},
    "gpu_memory": {"type": "str"},
    "gpu_memory_source": {"type": "str", "default": "cuda", "choices": ["cuda", "nvml"]},
    "gpu_memory_utilization": {"type": "float", "default": 0.9, "range": (0, 1, "open-low"), "must_be": "in (0, 1]"},
    "reserved_memory": {"type": "str"},
    "max_model_len": _whole(1, 10 ** 8, required=True),
    "max_num_seqs": _whole(1, 10 ** 6, default=1),
    "max_num_batched_tokens": _whole(1, 10 ** 8, no_log=False),
    "engine_max_num_seqs": _whole(1, 10 ** 6),
    "max_gpus": _whole(1, 4096, default=8),
    "tensor_parallel_size": _whole(1, 4096),
}
PLAN_NUMBERS = ("gpu_memory_utilization", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "engine_max_num_seqs",
                "max_gpus", "tensor_parallel_size")


def _finite(number, what, value):
    if math.isnan(number) or math.isinf(number):
        raise CheckError("%s %r is not a finite number." % (what, value))
    return number


def parse_bytes(value, default_unit="gib"):
    """``80`` (GiB by default), ``"80GiB"``, ``"24 GB"``, ``"81920MiB"`` -> bytes (int)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise CheckError("Memory size %r is not a number or a size such as 80GiB." % (value,))
    if isinstance(value, (int, float)):
        if value < 0:
            raise CheckError("Memory size %r is negative." % (value,))
        return int(_finite(value * _BYTE_UNITS[default_unit], "Memory size", value))
    match = _SIZE_RE.match(value)
    unit = match.group(2).lower() if match else None
    if not match or unit not in _BYTE_UNITS:
        raise CheckError("Memory size %r is not understood; write e.g. 80GiB or 24GB." % (value,))
    return int(_finite(float(match.group(1)) * (_BYTE_UNITS[unit] if unit else _BYTE_UNITS[default_unit]), "Memory size", value))


def parse_count(value):
    """``8e9``, ``"8B"``, ``"0.5B"``, ``"70b"`` -> number of parameters (int)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise CheckError("Parameter count %r is not a number or a count such as 8B." % (value,))
    if isinstance(value, (int, float)):
        if value < 0:
            raise CheckError("Parameter count %r is negative." % (value,))
        return int(_finite(value, "Parameter count", value))
    match = _SIZE_RE.match(value)
    unit = match.group(2).lower() if match else None
    if not match or unit not in _COUNT_UNITS:
        raise CheckError("Parameter count %r is not understood; write e.g. 8B or 8000000000." % (value,))
    return int(_finite(float(match.group(1)) * _COUNT_UNITS[unit], "Parameter count", value))


def dtype_bytes(dtype):
    key = str(dtype).lower().replace("torch.", "")
    if key not in DTYPE_BYTES:
        raise CheckError("Data type %r is not one of %s." % (dtype, ", ".join(sorted(DTYPE_BYTES))))
    return DTYPE_BYTES[key]


def _shape_problem(value, shape):
    if shape == POSITIVE_INT:
        return not isinstance(value, int) or isinstance(value, bool) or value < 1
    if shape == TEXT:
        return not isinstance(value, str)
    return not isinstance(value, dict)


def check_config_shape(config, where="model config"):
    """Raise CheckError naming the first field of ``CONFIG_FIELDS`` whose value has the wrong shape."""
    if not isinstance(config, dict):
        raise CheckError("The %s must be a mapping (a Hugging Face config.json), got %s." % (where, type(config).__name__))
    for name in sorted(CONFIG_FIELDS):
        value = config.get(name)
        if value is not None and _shape_problem(value, CONFIG_FIELDS[name]):
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
            raise CheckError("%s in the %s must be %s, got %s." % (name, where, CONFIG_FIELDS[name], shown))


def _first(cfg, *names):
    for name in names:
        if cfg.get(name) is not None:
            return cfg[name]
    return None


def model_shape(config):
    """Layers, heads, KV heads, head size, hidden and intermediate size, vocabulary and dtype from a ``config.json`` dict.

    ``hidden_size`` falls back to heads x head_dim; ``intermediate_size`` and ``vocab_size`` to sizes above the common
    dense decoders' (``FALLBACK_*``), named in ``assumed``.
    """
    check_config_shape(config)
    cfg = config
    if config.get("text_config") is not None:
        cfg = config["text_config"]
        check_config_shape(cfg, "model config's text_config")
    layers = _first(cfg, "num_hidden_layers", "n_layer", "num_layers")
    heads = _first(cfg, "num_attention_heads", "n_head")
    if not layers or not heads:
        raise CheckError("The model config has no num_hidden_layers or num_attention_heads.")
    kv_heads = _first(cfg, "num_key_value_heads") or heads
    if kv_heads > heads or heads % kv_heads:
        raise CheckError("num_key_value_heads %d must divide the %d attention heads." % (kv_heads, heads))
    head_dim = _first(cfg, "head_dim")
    hidden = _first(cfg, "hidden_size", "n_embd")
    if not head_dim:
        if not hidden:
            raise CheckError("The model config has neither head_dim nor hidden_size.")
        if hidden % heads:
            raise CheckError("hidden_size %d is not a multiple of the %d attention heads; set head_dim." % (hidden, heads))
        head_dim = hidden // heads
    hidden = hidden or heads * head_dim
    assumed = []
    intermediate = _first(cfg, "intermediate_size", "n_inner")
    if not intermediate:
        intermediate = FALLBACK_INTERMEDIATE_PER_HIDDEN * hidden
        assumed.append("intermediate_size")
    vocab = _first(cfg, "vocab_size")
    if not vocab:
        vocab = FALLBACK_VOCAB
        assumed.append("vocab_size")
    dtype = _first(cfg, "torch_dtype", "dtype") or _first(config, "torch_dtype", "dtype") or "bfloat16"
    return {"num_layers": layers, "num_attention_heads": heads, "num_kv_heads": kv_heads, "head_dim": head_dim,
            "hidden_size": hidden, "intermediate_size": intermediate, "vocab_size": vocab, "dtype": dtype, "assumed": assumed}


def check_plan_numbers(**numbers):
    """``numbers`` (arguments of ``plan``) checked against PLAN_OPTIONS, defaults applied; CheckError when one is wrong."""
    return validate(dict((name, PLAN_OPTIONS[name]) for name in numbers), numbers)


def kv_bytes_per_token(shape, kv_dtype_bytes, tp=1):
    """KV-cache bytes one token occupies on one TP rank."""
    heads_per_rank = int(math.ceil(shape["num_kv_heads"] / float(tp)))
    return int(2 * shape["num_layers"] * heads_per_rank * shape["head_dim"] * kv_dtype_bytes)


def engine_batch(gpu_bytes, product, max_model_len, max_num_batched_tokens=None, engine_max_num_seqs=None):
    """The engine's tokens per step (T) and sequences per step: as given, else vLLM 0.32.0's OpenAI-server defaults."""
    if gpu_bytes >= 160 * GIB:
        default_tokens, default_seqs = 16384, 1024
    elif gpu_bytes >= 70 * GIB and not (product or "").startswith("A100"):
        default_tokens, default_seqs = 8192, 1024
    else:
        default_tokens, default_seqs = 2048, 256
    seqs = int(engine_max_num_seqs or default_seqs)
    tokens = int(max_num_batched_tokens) if max_num_batched_tokens else min(default_tokens, seqs * int(max_model_len))
    return tokens, seqs


def reserve(shape, batched_tokens, sampled_seqs, activation_bytes=2, tp=1):
    """The memory one GPU needs beside weights and KV cache (a dict of the terms, ``total_bytes`` their sum)."""
    tokens, rows = int(batched_tokens), min(int(sampled_seqs), int(batched_tokens))
    intermediate = int(math.ceil(shape["intermediate_size"] / float(tp)))
    heads = int(math.ceil(shape["num_attention_heads"] / float(tp)))
    forward = tokens * activation_bytes * (3 * intermediate + 4 * shape["hidden_size"]) + tokens * heads * 4
    sampler = (tokens * shape["hidden_size"] * activation_bytes
               + rows * shape["vocab_size"] * (activation_bytes + 4 * SAMPLER_FLOAT32_COPIES))
    activations = max(forward, sampler)
    return {"cuda_context_bytes": CUDA_CONTEXT_BYTES, "workspace_bytes": WORKSPACE_BYTES, "forward_bytes": forward,
            "sampler_bytes": sampler, "activation_bytes": activations, "batched_tokens": tokens, "sampled_sequences": rows,
            "total_bytes": CUDA_CONTEXT_BYTES + WORKSPACE_BYTES + activations}


def _gib(size):
    return "%.2f GiB" % (size / float(GIB))


def _article(name):
    return ("an " if name[0] in "AEFHILMNORSX" else "a ") + name


def gpu_total(gpu=None, given=None, source="cuda"):
    """CUDA's total for one GPU: ``{"bytes", "product", "warning"}`` from a product name or a size (CUDA's or NVML's)."""
    if gpu is not None:
        entry = products.lookup(gpu)
        return {"bytes": entry["cuda_bytes"], "product": entry["name"], "warning": None}
    if given is None:
        raise CheckError("Name the GPU (gpu, e.g. H100-80GB) or give its memory (gpu_memory).")
    size = parse_bytes(given)
    if size <= 0:
        raise CheckError("gpu_memory must be positive.")
    if source == "nvml":
        cuda, entry = products.from_nvml(size)
        if cuda <= 0:
            raise CheckError("gpu_memory %s is NVML's total of a GPU too small to plan for." % (given,))
        return {"bytes": cuda, "product": entry["name"] if entry else None, "warning": None}
    entries, what = products.recognise(size)
    if not entries:
        return {"bytes": size, "product": None, "warning": None}
    cuda = min(entry["cuda_bytes"] for entry in entries)
    if len(entries) == 1:
        name = entries[0]["name"]
        sentence = ("gpu_memory %s (%s) is the %s of %s, but CUDA reports %s on that card and the engine sizes its KV cache "
                    "from that, so the plan uses %s; set gpu: %s to say so.")
        return {"bytes": cuda, "product": name,
                "warning": sentence % (given, _gib(size), what, _article(name), _gib(cuda), _gib(cuda), name)}
    names = [entry["name"] for entry in entries]
    return {"bytes": cuda, "product": None, "warning": (
        "gpu_memory %s (%s) is the %s of %s, but CUDA reports at most %s on those cards and the engine sizes its KV "
        "cache from that, so the plan uses the smallest, %s; set gpu to the card (%s) to plan for it." % (
            given, _gib(size), what, " or ".join(names), _gib(max(entry["cuda_bytes"] for entry in entries)), _gib(cuda),
            ", ".join(names)))}


def _candidates(shape, max_gpus, tensor_parallel_size):
    if tensor_parallel_size:
        if shape["num_attention_heads"] % int(tensor_parallel_size):
            raise CheckError("tensor_parallel_size %d does not divide the %d attention heads."
                             % (int(tensor_parallel_size), shape["num_attention_heads"]))
        return [int(tensor_parallel_size)]
    return [t for t in (1, 2, 4, 8, 16, 32, 64) if t <= int(max_gpus) and shape["num_attention_heads"] % t == 0]


def plan(model_config, parameters, gpu_memory=None, max_model_len=None, max_num_seqs=1, dtype=None,
         kv_cache_dtype="auto", gpu_memory_utilization=0.9, reserved_memory=None, max_gpus=8, tensor_parallel_size=None,
         gpu=None, gpu_memory_source="cuda", max_num_batched_tokens=None, engine_max_num_seqs=None):
    """Return a memory plan (a dict) or raise ``CheckError`` (with the numbers as facts) when the request does not fit."""
    numbers = check_plan_numbers(max_model_len=max_model_len, max_num_seqs=max_num_seqs, max_gpus=max_gpus,
                                 tensor_parallel_size=tensor_parallel_size, gpu_memory_utilization=gpu_memory_utilization,
                                 max_num_batched_tokens=max_num_batched_tokens, engine_max_num_seqs=engine_max_num_seqs)
    max_model_len, max_num_seqs, max_gpus = numbers["max_model_len"], numbers["max_num_seqs"], numbers["max_gpus"]
    gpu_memory_utilization = numbers["gpu_memory_utilization"]
    shape = model_shape(model_config)
    dtype = dtype or shape["dtype"] or "bfloat16"
    wbytes = dtype_bytes(dtype)
    kvbytes = wbytes if kv_cache_dtype in (None, "", "auto") else dtype_bytes(kv_cache_dtype)
    n_params = parse_count(parameters)
    card = gpu_total(gpu, gpu_memory, gpu_memory_source)
    gpu_bytes = card["bytes"]
    fixed_reserve = parse_bytes(reserved_memory) if reserved_memory not in (None, "") else None
    if n_params <= 0:
        raise CheckError("The parameter count must be positive.")
    activation_bytes = 4 if wbytes >= 4 else 2
    batched_tokens, engine_seqs = engine_batch(gpu_bytes, card["product"], max_model_len, numbers["max_num_batched_tokens"],
                                               numbers["engine_max_num_seqs"])
    tokens = int(max_model_len) * int(max_num_seqs)
    requested = int(gpu_bytes * float(gpu_memory_utilization))
    weights = int(n_params * wbytes)

    per_tp, reserves, chosen = [], {}, None
    for tp in _candidates(shape, max_gpus, tensor_parallel_size):
        derived = reserve(shape, batched_tokens, engine_seqs, activation_bytes, tp)
        reserves[tp] = dict(derived, given_bytes=fixed_reserve)
        reserved = derived["total_bytes"] if fixed_reserve is None else fixed_reserve
        usable = requested - reserved
        kv_tok = kv_bytes_per_token(shape, kvbytes, tp)
        need = weights // tp + kv_tok * tokens
        fit_tokens = max(0, (usable - weights // tp) // kv_tok) if kv_tok else 0
        row = {"tensor_parallel_size": tp, "weights_bytes_per_gpu": weights // tp, "kv_cache_bytes_per_token_per_gpu": kv_tok,
               "kv_cache_bytes_per_gpu": kv_tok * tokens, "reserved_bytes_per_gpu": reserved,
               "required_bytes_per_gpu": need, "usable_bytes_per_gpu": usable, "max_tokens_fit": int(fit_tokens),
               "fits": usable > 0 and need <= usable}
        per_tp.append(row)
        if row["fits"] and chosen is None:
            chosen = row
    last = per_tp[-1] if per_tp else None
    if last and all(row["usable_bytes_per_gpu"] <= 0 for row in per_tp):
        raise CheckError("A GPU of %.1f GiB leaves no memory after utilization %.2f and %.1f GiB reserved."
                         % (gpu_bytes / GIB, float(gpu_memory_utilization), last["reserved_bytes_per_gpu"] / GIB))

    warnings = [card["warning"]] if card["warning"] else []
    if shape["assumed"]:
        warnings.append("The model config has no %s, so the reserve assumes %s; give them (every Hugging Face config.json "
                        "has them) for a closer plan." % (" or ".join(shape["assumed"]), " and ".join(
                            {"intermediate_size": "an intermediate size of %d x hidden_size" % FALLBACK_INTERMEDIATE_PER_HIDDEN,
                             "vocab_size": "a vocabulary of %d" % FALLBACK_VOCAB}[name] for name in shape["assumed"])))
    shown = (chosen or last or {}).get("tensor_parallel_size")
    if fixed_reserve is not None and shown in reserves and fixed_reserve < reserves[shown]["total_bytes"]:
        terms = reserves[shown]
        warnings.append("reserved_memory %s is below the %s this model needs per GPU beside weights and KV cache (CUDA context "
                        "%s, workspaces %s, activations of a %d-token batch %s), so the engine will find less room than "
                        "planned." % (reserved_memory, _gib(terms["total_bytes"]), _gib(terms["cuda_context_bytes"]),
                                      _gib(terms["workspace_bytes"]), terms["batched_tokens"], _gib(terms["activation_bytes"])))
    result = {
        "model": dict((k, v) for k, v in shape.items() if k != "assumed"), "dtype": str(dtype),
        "kv_cache_dtype": str(kv_cache_dtype or "auto"), "parameters": n_params,
        "weights_bytes": weights, "weights_gib": round(weights / GIB, 2),
        "kv_cache_bytes_per_token": kv_bytes_per_token(shape, kvbytes, 1),
        "kv_cache_bytes_required": kv_bytes_per_token(shape, kvbytes, 1) * tokens,
        "kv_cache_gib_required": round(kv_bytes_per_token(shape, kvbytes, 1) * tokens / GIB, 2),
        "requested_tokens": tokens, "gpu": card["product"],
        "gpu_product_labels": products.node_labels(card["product"]) if card["product"] else [], "gpu_memory_bytes": gpu_bytes,
        "gpu_memory_gib": round(gpu_bytes / GIB, 2), "max_num_batched_tokens": batched_tokens, "engine_max_num_seqs": engine_seqs,
        "reserve": reserves.get(shown, {}), "usable_bytes_per_gpu": (chosen or last or {}).get("usable_bytes_per_gpu"),
        "candidates": per_tp, "warning": " ".join(warnings),
    }
    if chosen is None:
        largest = last["tensor_parallel_size"] if last else 0
        raise CheckError(
            "The requested context of %d tokens (%d x %d sequences) does not fit: weights %.1f GiB plus KV cache %.1f GiB "
            "exceed %d GPU(s) of %.1f GiB (%.1f GiB usable each)%s."
            % (tokens, int(max_model_len), int(max_num_seqs), weights / GIB, result["kv_cache_gib_required"], largest,
               gpu_bytes / GIB, (last["usable_bytes_per_gpu"] if last else 0) / GIB,
               "; at most %d tokens fit" % last["max_tokens_fit"] if last else ""),
            result)
    result.update({
        "tensor_parallel_size": chosen["tensor_parallel_size"],
        "max_tokens_fit": chosen["max_tokens_fit"],
        "kv_cache_bytes_per_gpu": chosen["kv_cache_bytes_per_gpu"],
        "engine_args": ["--tensor-parallel-size", str(chosen["tensor_parallel_size"]), "--max-model-len", str(int(max_model_len))],
    })
    return result
