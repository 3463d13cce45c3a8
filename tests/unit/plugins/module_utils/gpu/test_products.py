# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""gpu/products.py: GPUs by product, with the memory CUDA reports, named as nvidia-smi and GPU feature discovery name them."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.errors import CheckError
from ansible_collections.inference_cache.substrate.plugins.module_utils.gpu import products as P


@pytest.mark.parametrize("alias", ["NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3", "h100-80gb-hbm3"])
def test_a_product_is_found_by_every_name_it_goes_by(alias):
    entry = P.lookup(alias)
    assert entry["name"] == P.lookup(P.NAMES[[P.lookup(n)["name"] for n in P.NAMES].index(entry["name"])])["name"]
    assert entry["cuda_bytes"] <= entry["nvml_bytes"] and entry["datasheet_gb"] > 0


def test_an_unknown_gpu_is_one_sentence_naming_what_to_give_instead():
    with pytest.raises(CheckError, match=r"^gpu 'Voodoo 2' is not a GPU the plan knows \(.*\); give gpu_memory"):
        P.lookup("Voodoo 2")


def test_nvml_totals_and_recognised_figures():
    entry = P.lookup(P.NAMES[0])
    cuda, card = P.from_nvml(entry["nvml_bytes"])
    assert cuda <= entry["nvml_bytes"] and (card is None or card["nvml_bytes"] == entry["nvml_bytes"])
    assert P.from_nvml(12345 * P.MIB) == (12345 * P.MIB - P.NVML_TO_CUDA, None)
    found, what = P.recognise(entry["nvml_bytes"])
    assert entry["name"] in [e["name"] for e in found] and what == "nvidia-smi total"
    assert P.recognise(7) == ([], None)
