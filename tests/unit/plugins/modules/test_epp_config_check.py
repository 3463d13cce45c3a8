# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""epp_config_check and gpu_memory_plan through AnsibleModule (set_module_args / AnsibleExitJson pattern)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import copy
import json

import yaml

from ansible_collections.inference_cache.substrate.plugins.modules import epp_config_check, gpu_memory_plan
from ansible_collections.inference_cache.substrate.tests.unit.plugins.modules.utils import AnsibleExitJson, AnsibleFailJson, run_module
from ansible_collections.inference_cache.substrate.tests.unit.plugins.module_utils.test_epp_config import ENGINE, PRECISE


def run(module, args, expect=AnsibleExitJson):
    exited, result = run_module(module, args)
    assert exited is (expect is AnsibleExitJson), result
    return result


def test_good_config_from_a_file_passes(tmp_path):
    path = tmp_path / "epp.yaml"
    path.write_text(yaml.safe_dump(PRECISE))
    result = run(epp_config_check, {"path": str(path), "engine": ENGINE, "mode": "precise"})
    assert result["changed"] is False
    assert result["problems"] == [] and result["deprecations"] == []
    assert "precise-prefix-cache-producer" in result["summary"]


def test_good_config_in_check_mode_is_the_same():
    result = run(epp_config_check, {"config": PRECISE, "engine": ENGINE, "_ansible_check_mode": True})
    assert result["changed"] is False and result["problems"] == []


def test_yaml_text_is_accepted():
    result = run(epp_config_check, {"config": yaml.safe_dump(PRECISE), "engine": ENGINE})
    assert result["problems"] == []


def test_bad_config_fails_with_each_sentence():
    config = copy.deepcopy(PRECISE)
    config["plugins"][1]["parameters"]["kvEventsConfig"]["podDiscoveryConfig"]["socketPort"] = 5556
    result = run(epp_config_check, {"config": config, "engine": ENGINE}, AnsibleFailJson)
    assert result["msg"] == ("The EndpointPickerConfig has 1 problem(s): Producer precise-prefix-cache-producer dials KV events on port 5556 "
                             "but the engines publish on port 5557.")
    assert result["changed"] is False


def test_deprecations_warn_or_fail():
    config = copy.deepcopy(PRECISE)
    config["plugins"][0]["type"] = "tokenizer"
    result = run(epp_config_check, {"config": config, "engine": ENGINE})
    assert result["deprecations"] == ["Plugin type tokenizer is deprecated; use token-producer."]
    assert "Plugin type tokenizer is deprecated; use token-producer." in result.get("warnings", result["deprecations"])
    failed = run(epp_config_check, {"config": config, "engine": ENGINE, "fail_on_deprecations": True}, AnsibleFailJson)
    assert "Plugin type tokenizer is deprecated" in failed["msg"]


def test_unreadable_and_invalid_inputs(tmp_path):
    missing = run(epp_config_check, {"path": str(tmp_path / "nope.yaml")}, AnsibleFailJson)
    assert missing["msg"].startswith("Cannot read the EndpointPickerConfig file")
    broken = run(epp_config_check, {"config": "plugins: [unclosed"}, AnsibleFailJson)
    assert broken["msg"].startswith("The EndpointPickerConfig is not valid YAML")


LLAMA_8B = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096, "torch_dtype": "bfloat16"}


def test_gpu_memory_plan_fits(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_8B))
    result = run(gpu_memory_plan, {"model_config_path": str(path), "parameters": "8B", "gpu_memory": "80GiB", "max_model_len": 32768})
    assert result["changed"] is False
    assert result["tensor_parallel_size"] == 1
    assert result["kv_cache_bytes_per_token"] == 131072
    assert result["engine_args"] == ["--tensor-parallel-size", "1", "--max-model-len", "32768"]


def test_gpu_memory_plan_fails_early():
    result = run(gpu_memory_plan, {"model_config": LLAMA_8B, "parameters": "8B", "gpu_memory": "24GiB", "max_model_len": 131072,
                                   "max_num_seqs": 4, "max_gpus": 1}, AnsibleFailJson)
    assert result["msg"].startswith("The requested context of 524288 tokens")
    assert result["changed"] is False
    assert result["kv_cache_bytes_required"] == 131072 * 524288
