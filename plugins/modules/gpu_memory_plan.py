#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

DOCUMENTATION = r"""
module: gpu_memory_plan
short_description: Plan GPU memory for a model (weights, KV cache per token, tensor-parallel size)
version_added: 0.1.0
description:
  - From a model's Hugging Face C(config.json) (layers, attention and KV heads, head size, dtype), its parameter count and
    one GPU's memory, computes the weights' size, the KV-cache bytes per token and the smallest tensor-parallel size whose
    per-GPU share of the weights plus the KV cache for O(max_model_len) x O(max_num_seqs) tokens fits.
  - Fails early, with one sentence naming the numbers, when the requested context does not fit on O(max_gpus) GPUs.
  - Pure arithmetic on the controller; it reads O(model_config_path) when given and changes nothing.
  - Multi-head latent attention, sliding-window and hybrid models are sized as full attention (an upper bound).
author:
  - inference_cache.substrate contributors (@inference-cache)
extends_documentation_fragment:
  - inference_cache.substrate._attributes
  - inference_cache.substrate._attributes.CHECK
options:
  model_config:
    description:
      - The model's C(config.json) as a mapping. Exactly one of O(model_config) and O(model_config_path) is required.
      - The fields read must have their Hugging Face types when present (null counts as absent), or the module fails
        with one sentence naming the field; C(num_hidden_layers) (or C(n_layer), C(num_layers)),
        C(num_attention_heads) (or C(n_head)), C(num_key_value_heads), C(head_dim), C(hidden_size) (or C(n_embd))
        positive whole numbers; C(torch_dtype), C(dtype) strings; C(text_config) a mapping (multimodal models, read
        instead of the top level). Other keys are ignored.
      - C(num_key_value_heads) must divide C(num_attention_heads); without C(head_dim), C(hidden_size) must be a
        multiple of C(num_attention_heads).
    type: dict
  model_config_path:
    description: Path to the model's C(config.json).
    type: path
  parameters:
    description: Number of parameters, as a number or with a suffix (C(8B), C(0.6B), C(70b), C(8e9)); positive.
    type: str
    required: true
  dtype:
    description: Weight data type; defaults to the config's C(torch_dtype).
    type: str
  kv_cache_dtype:
    description: KV-cache data type (vLLM C(--kv-cache-dtype)); C(auto) means the weight dtype.
    type: str
    default: auto
  gpu_memory:
    description: Memory of one GPU, a number of GiB or a size such as C(80GiB), C(24GB); positive.
    type: str
    required: true
  gpu_memory_utilization:
    description: Fraction of the GPU the engine may use (vLLM C(--gpu-memory-utilization)); above 0 and at most 1.
    type: float
    default: 0.9
  reserved_memory:
    description: Memory per GPU kept for activations, CUDA graphs and the runtime.
    type: str
    default: 1GiB
  max_model_len:
    description: The context length to serve (vLLM C(--max-model-len)); between 1 and 100000000.
    type: int
    required: true
  max_num_seqs:
    description: Sequences that must fit at full context at the same time; between 1 and 1000000.
    type: int
    default: 1
  max_gpus:
    description: Largest tensor-parallel size allowed (GPUs per replica); between 1 and 4096.
    type: int
    default: 8
  tensor_parallel_size:
    description:
      - Check this tensor-parallel size only, instead of searching for the smallest that fits.
      - Between 1 and 4096, and a divisor of the attention heads.
    type: int
"""

EXAMPLES = r"""
- name: Size Llama-3.1-8B for a 32k context on 24 GiB GPUs
  inference_cache.substrate.gpu_memory_plan:
    model_config:
      num_hidden_layers: 32
      num_attention_heads: 32
      num_key_value_heads: 8
      hidden_size: 4096
      torch_dtype: bfloat16
    parameters: 8B
    gpu_memory: 24GiB
    max_model_len: 32768
  register: plan

- name: Pass the plan to the engine
  ansible.builtin.debug:
    msg: "{{ plan.engine_args }}"
"""

RETURN = r"""
tensor_parallel_size:
  description: Smallest tensor-parallel size that fits.
  returned: success
  type: int
  sample: 1
weights_bytes:
  description: Size of the weights.
  returned: always
  type: int
kv_cache_bytes_per_token:
  description: KV-cache bytes one token takes over the whole model (tensor-parallel size 1).
  returned: always
  type: int
kv_cache_bytes_required:
  description: KV-cache bytes for the requested tokens.
  returned: always
  type: int
max_tokens_fit:
  description: Tokens of KV cache that fit per replica at the chosen tensor-parallel size.
  returned: success
  type: int
engine_args:
  description: Engine arguments implementing the plan.
  returned: success
  type: list
  elements: str
  sample: ["--tensor-parallel-size", "2", "--max-model-len", "32768"]
candidates:
  description: The per-GPU numbers for every tensor-parallel size tried.
  returned: always
  type: list
  elements: dict
"""

import json

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.errors import CheckError
from ansible_collections.inference_cache.substrate.plugins.module_utils.common.module import run_module
from ansible_collections.inference_cache.substrate.plugins.module_utils.engine.sizing import PLAN_OPTIONS, plan


def _model_config(params):
    """The model's config.json as given, or read from its path."""
    path = params["model_config_path"]
    if not path:
        return params["model_config"]
    try:
        with open(path, "r") as handle:
            return json.load(handle)
    except (IOError, OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc).splitlines()[0]
        raise CheckError("Cannot read the model config %s: %s." % (path, reason.rstrip(".")))


def _plan(params, module):
    del module
    return plan(_model_config(params), params["parameters"], params["gpu_memory"], params["max_model_len"],
                max_num_seqs=params["max_num_seqs"], dtype=params["dtype"], kv_cache_dtype=params["kv_cache_dtype"],
                gpu_memory_utilization=params["gpu_memory_utilization"], reserved_memory=params["reserved_memory"],
                max_gpus=params["max_gpus"], tensor_parallel_size=params["tensor_parallel_size"])


def main():
    run_module(PLAN_OPTIONS, _plan, mutually_exclusive=[("model_config", "model_config_path")],
               required_one_of=[("model_config", "model_config_path")])


if __name__ == "__main__":
    main()
