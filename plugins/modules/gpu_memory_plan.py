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

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.module import ansible_module
from ansible_collections.inference_cache.substrate.plugins.module_utils.engine.sizing import SizingError, plan


def main():
    module = ansible_module(
        dict(
            model_config=dict(type="dict"),
            model_config_path=dict(type="path"),
            parameters=dict(type="str", required=True),
            dtype=dict(type="str"),
            kv_cache_dtype=dict(type="str", default="auto"),
            gpu_memory=dict(type="str", required=True),
            gpu_memory_utilization=dict(type="float", default=0.9),
            reserved_memory=dict(type="str", default="1GiB"),
            max_model_len=dict(type="int", required=True),
            max_num_seqs=dict(type="int", default=1),
            max_gpus=dict(type="int", default=8),
            tensor_parallel_size=dict(type="int"),
        ),
        mutually_exclusive=[("model_config", "model_config_path")],
        required_one_of=[("model_config", "model_config_path")],
        supports_check_mode=True,
    )
    p = module.params
    config = p["model_config"]
    if p["model_config_path"]:
        try:
            with open(p["model_config_path"], "r") as handle:
                config = json.load(handle)
        except (IOError, OSError, ValueError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc).splitlines()[0]
            module.fail_json(msg="Cannot read the model config %s: %s." % (p["model_config_path"], reason.rstrip(".")), changed=False)
    try:
        result = plan(config, p["parameters"], p["gpu_memory"], p["max_model_len"], max_num_seqs=p["max_num_seqs"],
                      dtype=p["dtype"], kv_cache_dtype=p["kv_cache_dtype"], gpu_memory_utilization=p["gpu_memory_utilization"],
                      reserved_memory=p["reserved_memory"], max_gpus=p["max_gpus"], tensor_parallel_size=p["tensor_parallel_size"])
    except SizingError as exc:
        module.fail_json(msg=str(exc), changed=False, **exc.details)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
