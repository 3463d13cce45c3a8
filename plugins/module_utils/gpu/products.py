# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""GPUs by product name, with the memory CUDA reports on each (plain Python, no Ansible import).

Three figures describe one card's memory, and only one of them is what an engine sizes its KV cache from:

* the datasheet's, in decimal gigabytes ("141 GB" for an H200: 131.3 GiB);
* NVML's total, in MiB, which ``nvidia-smi`` prints and GPU feature discovery puts in the node label
  ``nvidia.com/gpu.memory`` (143771 MiB = 140.40 GiB on an H200);
* CUDA's total (``cudaMemGetInfo``, ``torch.cuda.mem_get_info()[1]``), smaller than NVML's by what the driver keeps
  (139.80 GiB on an H200). vLLM multiplies this one by ``--gpu-memory-utilization`` (vllm 0.32.0
  ``vllm/v1/worker/gpu_worker.py`` ``requested_memory``), so the plan uses it.

``PRODUCTS``: the NVML figures are published ``nvidia-smi`` totals (sources beside each). CUDA's total was measured on
the H200 only (REFERENCE M5: 139.80 GiB beside nvidia-smi's 143771 MiB, 616 MiB apart); for the other cards it is
NVML's total less ``NVML_TO_CUDA`` (1 GiB), more than every gap PyTorch's own reports show where they name the card
(H100: 79.11 GiB beside 81559 MiB, 537 MiB, vllm-project/vllm#27508; T4: 14.75 GiB beside 15360 MiB, 256 MiB,
hpcaitech/Open-Sora#697). A figure a user types that is a card's datasheet or nvidia-smi total is recognised
(``recognise``), so the plan can say which figure CUDA reports instead.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import re

from ..common.errors import CheckError

GIB = 1024 ** 3
MIB = 1024 ** 2
GB = 1000 ** 3
# What the plan takes off NVML's total (nvidia-smi, the nvidia.com/gpu.memory label) where CUDA's was not measured.
NVML_TO_CUDA = GIB

# name, NVML total (MiB), CUDA total (bytes; None: NVML's less NVML_TO_CUDA), datasheet GB, other names, source.
PRODUCTS = (
    ("H200", 143771, int(139.80 * GIB), 141, ("H200 SXM", "H200-141GB", "H200 SXM 141GB"),
     "nvidia-smi 143771 MiB and CUDA 139.80 GiB, measured on this project's H200 (REFERENCE M5)"),
    ("H100-80GB", 81559, None, 80, ("H100", "H100 SXM", "H100 SXM5 80GB", "H100 80GB HBM3"),
     "nvidia-smi 81559 MiB: modal-labs/modal-client#2797, NVIDIA/nccl#1264 (NVIDIA H100 80GB HBM3)"),
    ("A100-80GB", 81920, None, 80, ("A100-SXM4-80GB", "A100 80GB PCIe"),
     "nvidia-smi 81920 MiB: modal-labs/modal-client#2797, NVIDIA/mig-parted#31 (NVIDIA A100-SXM4-80GB)"),
    ("A100-40GB", 40960, None, 40, ("A100-SXM4-40GB", "A100-PCIE-40GB"),
     "nvidia-smi 40960 MiB: modal-labs/modal-client#2797"),
    ("L40S", 46068, None, 48, (),
     "nvidia-smi 46068 MiB: modal-labs/modal-client#2797, akash-network/provider-configs#99"),
    ("L40", 46068, None, 48, (), "nvidia-smi 46068 MiB: InternLM/lmdeploy#1459"),
    ("L4", 23034, None, 24, (), "nvidia-smi 23034 MiB: modal-labs/modal-client#2797"),
    ("A10G", 23028, None, 24, (), "nvidia-smi 23028 MiB: NVIDIA/DCGM#232 (NVIDIA A10G)"),
    ("A10", 23028, None, 24, (), "nvidia-smi 23028 MiB: modal-labs/modal-client#2797"),
    ("T4", 15360, None, 16, (), "nvidia-smi 15360 MiB: modal-labs/modal-client#2797"),
)
NAMES = tuple(entry[0] for entry in PRODUCTS)

# The values GPU feature discovery gives each card in the node label nvidia.com/gpu.product: NVML's device name with
# every character but letters, digits, '-', '_', '.' and blanks dropped and the blanks joined by '-'
# (NVIDIA/k8s-device-plugin@v0.17.1:internal/lm/resource.go sanitise), from the nvidia-smi names the sources above print
# (and NVIDIA's PCIe variants of the same memory). Time-sliced GPUs get "-SHARED" after it; MIG slices other names.
GFD_PRODUCT_LABELS = {
    "H200": ("NVIDIA-H200",),
    "H100-80GB": ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe"),
    "A100-80GB": ("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe"),
    "A100-40GB": ("NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB"),
    "L40S": ("NVIDIA-L40S",),
    "L40": ("NVIDIA-L40",),
    "L4": ("NVIDIA-L4",),
    "A10G": ("NVIDIA-A10G",),
    "A10": ("NVIDIA-A10",),
    "T4": ("Tesla-T4",),
}


def _key(name):
    """``"NVIDIA H100 80GB HBM3"``, ``"NVIDIA-H100-80GB-HBM3"`` (GPU feature discovery), ``"h100-80gb"`` -> ``"H10080GBHBM3"``."""
    key = re.sub(r"[^A-Z0-9]", "", str(name).upper())
    for prefix in ("NVIDIA", "TESLA"):
        if key.startswith(prefix):
            key = key[len(prefix):]
    return key[:-len("SHARED")] if key.endswith("SHARED") else key


def _entry(row):
    name, nvml_mib, cuda_bytes, datasheet_gb, aliases, source = row
    nvml = nvml_mib * MIB
    return {"name": name, "nvml_bytes": nvml, "cuda_bytes": cuda_bytes or nvml - NVML_TO_CUDA,
            "cuda_measured": cuda_bytes is not None, "datasheet_gb": datasheet_gb, "aliases": aliases, "source": source}


_BY_KEY = dict((_key(alias), row[0]) for row in PRODUCTS for alias in (row[0],) + row[4] + GFD_PRODUCT_LABELS[row[0]])
_BY_NAME = dict((row[0], _entry(row)) for row in PRODUCTS)


def node_labels(name):
    """The nvidia.com/gpu.product values of the card ``name`` means (full GPUs, time-sliced ones too), or CheckError."""
    labels = GFD_PRODUCT_LABELS[lookup(name)["name"]]
    return [label for base in labels for label in (base, base + "-SHARED")]


def lookup(name):
    """The product a name means (its own name, an nvidia-smi name, a GPU feature discovery product label), or CheckError."""
    found = _BY_KEY.get(_key(name)) if isinstance(name, str) else None
    if not found:
        raise CheckError("gpu %r is not a GPU the plan knows (%s); give gpu_memory, the total CUDA reports, instead."
                         % (name, ", ".join(NAMES)))
    return _BY_NAME[found]


def from_nvml(nvml_bytes):
    """CUDA's total for NVML's (nvidia-smi's, the node label's) and the card, when one card has that total.

    A known total gives the known cards' CUDA total (the smallest where several share it: L40S and L40, A10G and A10);
    another, NVML's less NVML_TO_CUDA.
    """
    entries = [_BY_NAME[name] for name in NAMES if _BY_NAME[name]["nvml_bytes"] == nvml_bytes]
    if not entries:
        return max(nvml_bytes - NVML_TO_CUDA, 0), None
    return min(entry["cuda_bytes"] for entry in entries), entries[0] if len(entries) == 1 else None


def recognise(size_bytes):
    """The cards whose datasheet figure (GB, or the same number read as GiB) or nvidia-smi total is ``size_bytes``.

    Returns ``(entries, what)``: what the figure is of them, or ``([], None)``.
    """
    for what, figure in (("nvidia-smi total", lambda e: e["nvml_bytes"]), ("datasheet figure", lambda e: e["datasheet_gb"] * GB),
                         ("datasheet figure read as GiB", lambda e: e["datasheet_gb"] * GIB)):
        entries = [_BY_NAME[name] for name in NAMES if figure(_BY_NAME[name]) == size_bytes]
        if entries:
            return entries, what
    return [], None
