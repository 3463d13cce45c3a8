#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

DOCUMENTATION = r"""
module: gpu_memory_plan
short_description: Plan GPU memory for a model (weights, KV cache per token, reserve, tensor-parallel size)
version_added: 0.1.0
description:
  - From a model's Hugging Face C(config.json) (layers, attention and KV heads, head size, hidden and intermediate size,
    vocabulary, dtype), its parameter count and one GPU (O(gpu) by product, or O(gpu_memory)), computes the weights'
    size, the KV-cache bytes per token, the memory each GPU needs beside them (the reserve) and the smallest
    tensor-parallel size whose per-GPU share of the weights plus the KV cache for O(max_model_len) x O(max_num_seqs)
    tokens fits.
  - "The GPU's memory is the total CUDA reports (what vLLM multiplies by O(gpu_memory_utilization)), below
    nvidia-smi's total and not the datasheet's: on an H200 the datasheet says 141 GB (131.3 GiB), nvidia-smi
    143771 MiB (140.4 GiB), CUDA 139.80 GiB. A O(gpu_memory) that is a known card's datasheet or nvidia-smi figure is
    planned with that card's CUDA total, with a warning."
  - "The reserve per GPU, unless O(reserved_memory) is given: the CUDA context (0.68 GiB, measured on an H200 with
    PyTorch 2.11 and CUDA 13), 416 MiB of workspaces, and the larger of the activations of one prefill chunk of
    O(max_num_batched_tokens) tokens (T x 2 bytes x (3 x intermediate_size / tp + 4 x hidden_size), plus the float32
    log-sum-exp of each query head) and the sampler's (the logits of O(engine_max_num_seqs) sequences over the
    vocabulary, in the model's dtype and three float32 copies, as vLLM 0.32.0's memory profile samples them). Against
    an H200 it covers what five 7-8B models needed for an 8192-token prefill and a sampling step of 1 or 1024
    sequences (1.71-2.77 GiB with the CUDA context; the plan keeps 0.01-0.41 GiB more)."
  - "Not covered: CUDA graphs (vLLM captures them after sizing the KV cache, out of the memory above
    O(gpu_memory_utilization), unless C(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS) is set), NCCL and all-reduce buffers
    at tensor-parallel sizes above 1, LoRA adapters, multimodal encoders and MoE expert activations (the dense
    C(intermediate_size) is used). Multi-head latent attention (DeepSeek), sliding-window and hybrid (Mamba) models are
    sized as full attention, so their KV cache is an upper bound; a quantized KV cache (O(kv_cache_dtype)) is sized
    without its scales."
  - Fails early, with one sentence naming the numbers, when the requested context does not fit on O(max_gpus) GPUs.
  - Runs where the task runs, as every module does, so on the target host (on the controller only with a local
    connection or C(delegate_to) localhost), and changes nothing. O(model_config_path) is read on that host; for a
    C(config.json) on the controller, pass its content in O(model_config) instead (an P(ansible.builtin.file#lookup)
    lookup read through P(ansible.builtin.from_json#filter)).
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
        C(num_attention_heads) (or C(n_head)), C(num_key_value_heads), C(head_dim), C(hidden_size) (or C(n_embd)),
        C(intermediate_size) (or C(n_inner)), C(vocab_size) positive whole numbers; C(torch_dtype), C(dtype) strings;
        C(text_config) a mapping (multimodal models, read instead of the top level). Other keys are ignored.
      - C(num_key_value_heads) must divide C(num_attention_heads); without C(head_dim), C(hidden_size) must be a
        multiple of C(num_attention_heads).
      - Without C(intermediate_size) or C(vocab_size) the reserve assumes 8 x C(hidden_size) and 262144 (above the
        common dense models), with a warning.
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
  gpu:
    description:
      - The GPU by product, planned with the memory CUDA reports on it. Exactly one of O(gpu) and O(gpu_memory) is
        required.
      - C(H200) (CUDA 139.80 GiB, measured), C(H100-80GB), C(A100-80GB), C(A100-40GB), C(L40S), C(L40), C(L4), C(A10G),
        C(A10), C(T4) (nvidia-smi's published total less 1 GiB, more than the driver keeps on the cards where both
        were published). nvidia-smi's names (C(NVIDIA H100 80GB HBM3)) and GPU feature discovery's
        C(nvidia.com/gpu.product) values (C(NVIDIA-A100-SXM4-80GB)) are understood too.
    type: str
  gpu_memory:
    description:
      - Memory of one GPU, a number of GiB or a size such as C(80GiB), C(139.8GiB), C(143771MiB); positive.
      - The total CUDA reports (the second value of C(torch.cuda.mem_get_info)) unless O(gpu_memory_source=nvml). A
        figure that is a known card's datasheet size (C(141GB)), the same number read as GiB (C(141GiB)) or its nvidia-smi total
        (C(143771MiB)) is planned with that card's CUDA total, and the task warns.
    type: str
  gpu_memory_source:
    description:
      - What O(gpu_memory) counts. C(cuda), the total CUDA reports. C(nvml), NVML's total, as nvidia-smi prints it and
        GPU feature discovery labels a node with (C(nvidia.com/gpu.memory), in MiB); a known card's becomes its CUDA
        total, another loses 1 GiB.
    type: str
    choices: [cuda, nvml]
    default: cuda
  gpu_memory_utilization:
    description: Fraction of the GPU the engine may use (vLLM C(--gpu-memory-utilization)); above 0 and at most 1.
    type: float
    default: 0.9
  reserved_memory:
    description:
      - Memory per GPU kept beside weights and KV cache (CUDA context, workspaces, activations), instead of the reserve
        the module derives from the model's shape and the batch; the task warns when it is below that.
    type: str
  max_model_len:
    description: The context length to serve (vLLM C(--max-model-len)); between 1 and 100000000.
    type: int
    required: true
  max_num_seqs:
    description:
      - Sequences that must fit at full context at the same time; between 1 and 1000000.
      - Not the engine's C(--max-num-seqs) (that is O(engine_max_num_seqs)).
    type: int
    default: 1
  max_num_batched_tokens:
    description:
      - Tokens the engine runs in one step (vLLM C(--max-num-batched-tokens), SGLang C(--chunked-prefill-size)); one
        prefill chunk's activations are part of the reserve. Between 1 and 100000000.
      - Default, vLLM 0.32.0's OpenAI server's, at most O(engine_max_num_seqs) x O(max_model_len) - 16384 on GPUs of
        160 GiB or more, 8192 on GPUs of 70 GiB or more but A100s, 2048 otherwise.
    type: int
  engine_max_num_seqs:
    description:
      - Sequences the engine runs at once (vLLM C(--max-num-seqs), SGLang C(--max-running-requests)); vLLM samples this
        many at once in its memory profile, so their logits are part of the reserve. Between 1 and 1000000.
      - Default, vLLM 0.32.0's OpenAI server's - 1024 on GPUs of 70 GiB or more but A100s, 256 otherwise.
    type: int
  max_gpus:
    description: Largest tensor-parallel size allowed (GPUs per replica); between 1 and 4096.
    type: int
    default: 8
  tensor_parallel_size:
    description:
      - Check this tensor-parallel size only, instead of searching for the smallest that fits.
      - Between 1 and 4096, and a divisor of the attention heads.
    type: int
notes:
  - The arithmetic, its sources (vLLM 0.32.0's profile run and batch defaults, the H200 measurements) and the cited
    nvidia-smi totals are in C(plugins/module_utils/gpu/memory_plan.py) and C(plugins/module_utils/gpu/products.py).
"""

EXAMPLES = r"""
- name: Size Llama-3.1-8B for a 32k context on an H100
  inference_cache.substrate.gpu_memory_plan:
    model_config:
      num_hidden_layers: 32
      num_attention_heads: 32
      num_key_value_heads: 8
      hidden_size: 4096
      intermediate_size: 14336
      vocab_size: 128256
      torch_dtype: bfloat16
    parameters: 8B
    gpu: H100-80GB
    max_model_len: 32768
  register: plan

- name: The same from the config.json, on GPUs given by the memory nvidia-smi shows
  inference_cache.substrate.gpu_memory_plan:
    model_config_path: /models/Llama-3.1-8B-Instruct/config.json
    parameters: 8B
    gpu_memory: 23034MiB
    gpu_memory_source: nvml
    max_model_len: 32768
    max_num_batched_tokens: 4096

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
gpu:
  description: The product planned for (from O(gpu) or a recognised O(gpu_memory)); null when not known.
  returned: always
  type: str
  sample: H200
gpu_product_labels:
  description:
    - The values GPU feature discovery gives that product in the node label C(nvidia.com/gpu.product) (whole and
      time-sliced GPUs); empty when no product is known. A node affinity on them keeps the engines on that card.
  returned: always
  type: list
  elements: str
  sample: [NVIDIA-H200, NVIDIA-H200-SHARED]
gpu_memory_bytes:
  description: The memory of one GPU the plan used, as CUDA reports it.
  returned: always
  type: int
max_num_batched_tokens:
  description: The tokens of one engine step the reserve covers.
  returned: always
  type: int
engine_max_num_seqs:
  description: The sequences the engine samples at once, as the reserve covers them.
  returned: always
  type: int
reserve:
  description:
    - The reserve per GPU at the chosen (or, failing, the largest tried) tensor-parallel size, term by term.
    - C(given_bytes) is O(reserved_memory) when given (then the plan used it instead of C(total_bytes)).
  returned: always
  type: dict
  contains:
    cuda_context_bytes:
      description: The CUDA context.
      type: int
    workspace_bytes:
      description: Library workspaces and the allocator's rounding.
      type: int
    forward_bytes:
      description: The activations of one prefill chunk.
      type: int
    sampler_bytes:
      description: The sampler's logits and their copies, beside the chunk's hidden states.
      type: int
    activation_bytes:
      description: The larger of the two.
      type: int
    total_bytes:
      description: The derived reserve.
      type: int
    given_bytes:
      description: O(reserved_memory) in bytes, or null.
      type: int
warning:
  description: What the task also warned about (a datasheet or nvidia-smi figure, an assumed config field, a low
    O(reserved_memory)); empty when nothing.
  returned: always
  type: str
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
from ansible_collections.inference_cache.substrate.plugins.module_utils.gpu.memory_plan import PLAN_OPTIONS, plan


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
                max_gpus=params["max_gpus"], tensor_parallel_size=params["tensor_parallel_size"], gpu=params["gpu"],
                gpu_memory_source=params["gpu_memory_source"], max_num_batched_tokens=params["max_num_batched_tokens"],
                engine_max_num_seqs=params["engine_max_num_seqs"])


def main():
    run_module(PLAN_OPTIONS, _plan, warn_facts=("warning",),
               mutually_exclusive=[("model_config", "model_config_path"), ("gpu", "gpu_memory")],
               required_one_of=[("model_config", "model_config_path"), ("gpu", "gpu_memory")])


if __name__ == "__main__":
    main()
