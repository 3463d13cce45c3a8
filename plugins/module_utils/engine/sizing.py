# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""GPU memory planning for a decoder-only transformer served by vLLM or SGLang.

Plain Python without any Ansible import. The arithmetic:

* weights            = parameters x bytes(dtype)                       (split evenly over TP ranks)
* KV bytes per token = 2 (K and V) x layers x kv_heads x head_dim x bytes(kv dtype)
  per TP rank the KV heads are split, and replicated when TP > kv_heads: ceil(kv_heads / tp) heads each
* usable per GPU     = gpu_memory x gpu_memory_utilization - reserved (activations, CUDA graphs, runtime)
* the smallest TP (a power of two dividing the attention heads, at most ``max_gpus``) whose weights share
  plus KV for ``max_model_len x max_num_seqs`` tokens fits in the usable memory is chosen.

Multi-head latent attention (DeepSeek MLA), sliding-window and hybrid models need other formulas:
the result is then an upper bound.

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

GIB = 1024 ** 3

DTYPE_BYTES = {
    "float32": 4, "fp32": 4,
    "float16": 2, "fp16": 2, "half": 2, "bfloat16": 2, "bf16": 2,
    "float8": 1, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1,
    "int4": 0.5,
}

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
    "gpu_memory": {"type": "str", "required": True},
    "gpu_memory_utilization": {"type": "float", "default": 0.9, "range": (0, 1, "open-low"), "must_be": "in (0, 1]"},
    "reserved_memory": {"type": "str", "default": "1GiB"},
    "max_model_len": _whole(1, 10 ** 8, required=True),
    "max_num_seqs": _whole(1, 10 ** 6, default=1),
    "max_gpus": _whole(1, 4096, default=8),
    "tensor_parallel_size": _whole(1, 4096),
}
PLAN_NUMBERS = ("gpu_memory_utilization", "max_model_len", "max_num_seqs", "max_gpus", "tensor_parallel_size")


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
    """Layers, attention heads, KV heads, head size and dtype from a Hugging Face ``config.json`` dict."""
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
    if not head_dim:
        hidden = _first(cfg, "hidden_size", "n_embd")
        if not hidden:
            raise CheckError("The model config has neither head_dim nor hidden_size.")
        if hidden % heads:
            raise CheckError("hidden_size %d is not a multiple of the %d attention heads; set head_dim." % (hidden, heads))
        head_dim = hidden // heads
    dtype = _first(cfg, "torch_dtype", "dtype") or _first(config, "torch_dtype", "dtype") or "bfloat16"
    return {"num_layers": layers, "num_attention_heads": heads, "num_kv_heads": kv_heads, "head_dim": head_dim, "dtype": dtype}


def check_plan_numbers(**numbers):
    """``numbers`` (arguments of ``plan``) checked against PLAN_OPTIONS, defaults applied; CheckError when one is wrong."""
    return validate(dict((name, PLAN_OPTIONS[name]) for name in numbers), numbers)


def kv_bytes_per_token(shape, kv_dtype_bytes, tp=1):
    """KV-cache bytes one token occupies on one TP rank."""
    heads_per_rank = int(math.ceil(shape["num_kv_heads"] / float(tp)))
    return int(2 * shape["num_layers"] * heads_per_rank * shape["head_dim"] * kv_dtype_bytes)


def plan(model_config, parameters, gpu_memory, max_model_len, max_num_seqs=1, dtype=None, kv_cache_dtype="auto",
         gpu_memory_utilization=0.9, reserved_memory="1GiB", max_gpus=8, tensor_parallel_size=None):
    """Return a memory plan (a dict) or raise ``CheckError`` (with the numbers as facts) when the request does not fit."""
    numbers = check_plan_numbers(max_model_len=max_model_len, max_num_seqs=max_num_seqs, max_gpus=max_gpus,
                                 tensor_parallel_size=tensor_parallel_size, gpu_memory_utilization=gpu_memory_utilization)
    max_model_len, max_num_seqs, max_gpus = numbers["max_model_len"], numbers["max_num_seqs"], numbers["max_gpus"]
    gpu_memory_utilization = numbers["gpu_memory_utilization"]
    shape = model_shape(model_config)
    dtype = dtype or shape["dtype"] or "bfloat16"
    wbytes = dtype_bytes(dtype)
    kvbytes = wbytes if kv_cache_dtype in (None, "", "auto") else dtype_bytes(kv_cache_dtype)
    n_params = parse_count(parameters)
    gpu_bytes = parse_bytes(gpu_memory)
    reserved = parse_bytes(reserved_memory)
    if n_params <= 0:
        raise CheckError("The parameter count must be positive.")
    if gpu_bytes <= 0:
        raise CheckError("gpu_memory must be positive.")
    tokens = int(max_model_len) * int(max_num_seqs)
    usable = int(gpu_bytes * float(gpu_memory_utilization)) - reserved
    if usable <= 0:
        raise CheckError("A GPU of %.1f GiB leaves no memory after utilization %.2f and %.1f GiB reserved."
                         % (gpu_bytes / GIB, float(gpu_memory_utilization), reserved / GIB))
    weights = int(n_params * wbytes)

    if tensor_parallel_size:
        candidates = [int(tensor_parallel_size)]
        if shape["num_attention_heads"] % candidates[0]:
            raise CheckError("tensor_parallel_size %d does not divide the %d attention heads."
                             % (candidates[0], shape["num_attention_heads"]))
    else:
        candidates = [t for t in (1, 2, 4, 8, 16, 32, 64) if t <= int(max_gpus) and shape["num_attention_heads"] % t == 0]

    per_tp = []
    chosen = None
    for tp in candidates:
        kv_tok = kv_bytes_per_token(shape, kvbytes, tp)
        need = weights // tp + kv_tok * tokens
        free_for_kv = usable - weights // tp
        fit_tokens = max(0, free_for_kv // kv_tok) if kv_tok else 0
        row = {"tensor_parallel_size": tp, "weights_bytes_per_gpu": weights // tp, "kv_cache_bytes_per_token_per_gpu": kv_tok,
               "kv_cache_bytes_per_gpu": kv_tok * tokens, "required_bytes_per_gpu": need, "usable_bytes_per_gpu": usable,
               "max_tokens_fit": int(fit_tokens), "fits": need <= usable}
        per_tp.append(row)
        if row["fits"] and chosen is None:
            chosen = row

    result = {
        "model": shape, "dtype": str(dtype), "kv_cache_dtype": str(kv_cache_dtype or "auto"), "parameters": n_params,
        "weights_bytes": weights, "weights_gib": round(weights / GIB, 2),
        "kv_cache_bytes_per_token": kv_bytes_per_token(shape, kvbytes, 1),
        "kv_cache_bytes_required": kv_bytes_per_token(shape, kvbytes, 1) * tokens,
        "kv_cache_gib_required": round(kv_bytes_per_token(shape, kvbytes, 1) * tokens / GIB, 2),
        "requested_tokens": tokens, "gpu_memory_bytes": gpu_bytes, "usable_bytes_per_gpu": usable,
        "candidates": per_tp,
    }
    if chosen is None:
        last = per_tp[-1] if per_tp else None
        largest = last["tensor_parallel_size"] if last else 0
        raise CheckError(
            "The requested context of %d tokens (%d x %d sequences) does not fit: weights %.1f GiB plus KV cache %.1f GiB "
            "exceed %d GPU(s) of %.1f GiB (%.1f GiB usable each)%s."
            % (tokens, int(max_model_len), int(max_num_seqs), weights / GIB, result["kv_cache_gib_required"], largest,
               gpu_bytes / GIB, usable / GIB,
               "; at most %d tokens fit" % last["max_tokens_fit"] if last else ""),
            result)
    result.update({
        "tensor_parallel_size": chosen["tensor_parallel_size"],
        "max_tokens_fit": chosen["max_tokens_fit"],
        "kv_cache_bytes_per_gpu": chosen["kv_cache_bytes_per_gpu"],
        "engine_args": ["--tensor-parallel-size", str(chosen["tensor_parallel_size"]), "--max-model-len", str(int(max_model_len))],
    })
    return result
