# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""epp_config_check and gpu_memory_plan through AnsibleModule (set_module_args / AnsibleExitJson pattern)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import copy
import json

import pytest
import yaml
from ansible.module_utils import basic
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.inference_cache.substrate.plugins.modules import epp_config_check, gpu_memory_plan
from ansible_collections.inference_cache.substrate.tests.unit.plugins.modules.utils import AnsibleExitJson, AnsibleFailJson, run_module
from ansible_collections.inference_cache.substrate.tests.unit.plugins.module_utils.epp.test_config import ENGINE, PRECISE
from ansible_collections.inference_cache.substrate.tests.unit.plugins.module_utils.epp.test_gie import ROLE as GIE_ROLE
from ansible_collections.inference_cache.substrate.tests.unit.plugins.module_utils.epp.test_config_properties import JUNK, NOISE


@pytest.fixture
def warned(monkeypatch):
    """What the module passed to AnsibleModule.warn (exit_json is patched, so the result never carries 'warnings')."""
    seen = []
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda self, message: seen.append(message))
    return seen


def run(module, args, expect=AnsibleExitJson):
    exited, result = run_module(module, args)
    assert exited is (expect is AnsibleExitJson), result
    return result


def test_result_keys_are_not_ones_ansible_reserves():
    result = run(epp_config_check, {"config": PRECISE})
    assert not set(result) & {"warnings", "deprecations", "exception"}


def test_good_config_from_a_file_passes(tmp_path, warned):
    path = tmp_path / "epp.yaml"
    path.write_text(yaml.safe_dump(PRECISE))
    result = run(epp_config_check, {"path": str(path), "engine": ENGINE, "mode": "precise"})
    assert result["changed"] is False
    assert result["problems"] == [] and result["deprecations_found"] == [] and result["warnings_found"] == []
    assert result["router_version"] == "v0.9.0"
    assert "precise-prefix-cache-producer" in result["summary"]
    assert warned == []


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


def test_deprecations_warn_or_fail(warned):
    config = copy.deepcopy(PRECISE)
    config["plugins"][0]["type"] = "tokenizer"
    result = run(epp_config_check, {"config": config, "engine": ENGINE})
    assert result["deprecations_found"] == ["Plugin type tokenizer is deprecated; use token-producer."]
    assert warned == ["Plugin type tokenizer is deprecated; use token-producer."]
    failed = run(epp_config_check, {"config": config, "engine": ENGINE, "fail_on_deprecations": True}, AnsibleFailJson)
    assert failed["msg"] == "The EndpointPickerConfig has 1 problem(s): Plugin type tokenizer is deprecated; use token-producer."


def test_tolerated_differences_pass_with_a_warning(warned):
    config = copy.deepcopy(PRECISE)
    config["plugins"][1]["parameters"]["tokenProcessorConfig"]["hashSeed"] = "7"
    result = run(epp_config_check, {"config": config, "engine": ENGINE, "fail_on_deprecations": True})
    assert result["problems"] == [] and result["deprecations_found"] == []
    assert len(result["warnings_found"]) == 1 and result["warnings_found"][0].startswith(
        "Producer precise-prefix-cache-producer uses hashSeed '7' while the engines run with PYTHONHASHSEED '42';")
    assert warned == result["warnings_found"]


def test_replay_socket_port_fails_at_the_pinned_router():
    config = copy.deepcopy(PRECISE)
    config["plugins"][1]["parameters"]["kvEventsConfig"]["podDiscoveryConfig"]["replaySocketPort"] = 5558
    result = run(epp_config_check, {"config": config, "router_version": "v0.9.0"}, AnsibleFailJson)
    assert result["problems"] == [
        "Plugin precise-prefix-cache-producer parameter kvEventsConfig.podDiscoveryConfig.replaySocketPort is not a field of "
        "precise-prefix-cache-producer in llm-d-router v0.9.0; the EPP decodes parameters strictly (DisallowUnknownFields), "
        "so the plugin fails and the EPP does not start."]


def test_an_empty_config_starts_with_a_warning(tmp_path, warned):
    """The EPP replaces an empty file (or --config-text "") with its default configuration and starts."""
    path = tmp_path / "empty.yaml"
    path.write_text("")
    for args in ({"path": str(path)}, {"config": ""}):
        result = run(epp_config_check, args)
        assert result["epp_starts"] is True and result["problems"] == []
        assert [f["kind"] for f in result["findings"]] == ["warning"]
        assert "default configuration" in result["findings"][0]["sentence"]
    assert len(warned) == 2 and all("is empty" in message for message in warned)


@pytest.mark.parametrize("fn,starts,kind,words", [
    (lambda c: c["plugins"][1]["parameters"]["kvEventsConfig"].update(concurrency=0), True, "broken",
     ("integer divide by zero", "on the first KV event")),
    (lambda c: c["plugins"].pop(0), True, "broken", ("estimating backend", "never matches an engine block")),
    (lambda c: c["plugins"][0].update(parameters={"estimate": {}}), True, "broken", ("never matches an engine block",)),
    (lambda c: c.pop("dataLayer"), True, "broken", ("never subscribes to an engine",)),
    (lambda c: c["plugins"][1]["parameters"]["kvEventsConfig"]["podDiscoveryConfig"].update(replaySocketPort=5558), False, "refused",
     ("DisallowUnknownFields", "does not start")),
], ids=["zero-concurrency", "no-token-producer", "estimating-token-producer", "no-extractor", "unknown-field"])
def test_refused_and_broken_configs_fail_and_say_whether_the_epp_starts(fn, starts, kind, words):
    config = copy.deepcopy(PRECISE)
    fn(config)
    result = run(epp_config_check, {"config": config, "engine": ENGINE}, AnsibleFailJson)
    assert result["failed"] is True and result["epp_starts"] is starts
    assert [f["kind"] for f in result["findings"]] == [kind]
    sentence = result["findings"][0]["sentence"]
    assert all(word in sentence for word in words), sentence
    assert result["problems"] == [sentence] and sentence in result["msg"] and "\n" not in result["msg"]


@pytest.mark.parametrize("fn,words", [
    (lambda c: c["schedulingProfiles"][0]["plugins"][1].update(weight=-2.0), ("the weight -2.0", "accepts a negative weight")),
    (lambda c: c["plugins"][1]["parameters"].update(speculativeTTL="later"), ("speculativeIndexing is off", "never parses it")),
], ids=["negative-weight", "speculative-ttl-while-off"])
def test_what_the_epp_starts_with_passes_with_a_warning(fn, words, warned):
    config = copy.deepcopy(PRECISE)
    fn(config)
    result = run(epp_config_check, {"config": config, "engine": ENGINE})
    assert result["epp_starts"] is True and result["problems"] == []
    assert [f["kind"] for f in result["findings"]] == ["warning"]
    assert all(word in result["warnings_found"][0] for word in words), result["warnings_found"]
    assert warned == result["warnings_found"]


def test_a_good_config_starts_with_no_findings():
    result = run(epp_config_check, {"config": PRECISE, "engine": ENGINE})
    assert result["epp_starts"] is True and result["findings"] == []


def test_router_version_choices():
    result = run(epp_config_check, {"config": PRECISE, "router_version": "v0.8.0"}, AnsibleFailJson)
    assert result["msg"].startswith("value of router_version must be one of: v0.9.0")


@pytest.mark.parametrize("args,msg", [
    ({"config": ["not", "a", "mapping"]}, "The EndpointPickerConfig has 1 problem(s): The EndpointPickerConfig is not a mapping (got list)."),
    ({"config": "- just\n- a list\n"}, "The EndpointPickerConfig has 1 problem(s): The EndpointPickerConfig is not a mapping (got list)."),
    ({"config": PRECISE, "engine": {"kv_events_port": 70000}},
     "The EndpointPickerConfig has 1 problem(s): engine.kv_events_port must be between 1 and 65535 (got 70000)."),
    ({"config": PRECISE, "engine": {"block_size": -16}},
     "The EndpointPickerConfig has 1 problem(s): engine.block_size must be between 1 and 1048576 (got -16)."),
], ids=["list", "yaml-list", "port-range", "block-size-range"])
def test_wrong_input_is_one_sentence(args, msg):
    result = run(epp_config_check, args, AnsibleFailJson)
    assert result["msg"] == msg and result["changed"] is False


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# An empty text is left out: the EPP starts with its default configuration then (test_an_empty_config_starts_with_a_warning).
@given(JUNK.filter(lambda value: value is not None and value != "") | st.sampled_from(["a: [", "\t", "{", "plugins: [1, {", "- x\n  - y:"]))
def test_any_value_as_config_fails_with_sentences(junk):
    exited, result = run_module(epp_config_check, {"config": junk})
    if exited:
        # A mapping llm-d-router v0.9.0 decodes all the same ({}, no apiVersion and kind, empty plugins) passes, and
        # only with the warnings that say why it routes nowhere useful.
        assert isinstance(junk, dict) and result["epp_starts"] is True and result["warnings_found"], "generated junk passed: %r" % (junk,)
        return
    msg = result["msg"]
    assert "\n" not in msg and msg.endswith(".") and not NOISE.search(msg), msg
    if "problems" in result:
        assert result["problems"] and all(problem in msg for problem in result["problems"])
    else:
        assert msg.startswith("The EndpointPickerConfig is not valid YAML: "), msg


def test_unreadable_and_invalid_inputs(tmp_path):
    missing = run(epp_config_check, {"path": str(tmp_path / "nope.yaml")}, AnsibleFailJson)
    assert missing["msg"].startswith("Cannot read the EndpointPickerConfig file")
    broken = run(epp_config_check, {"config": "plugins: [unclosed"}, AnsibleFailJson)
    assert broken["msg"].startswith("The EndpointPickerConfig is not valid YAML")


# --- router_impl gie and text that is not YAML ---------------------------------------------------------------------------

def test_a_gie_config_passes_with_router_impl_gie(tmp_path, warned):
    path = tmp_path / "epp.yaml"
    path.write_text(yaml.safe_dump(GIE_ROLE))
    result = run(epp_config_check, {"path": str(path), "router_impl": "gie", "mode": "approximate"})
    assert result["router_impl"] == "gie" and result["router_version"] == "v1.4.0"
    assert result["epp_starts"] is True and result["findings"] == [] and warned == []
    assert run(epp_config_check, {"config": PRECISE})["router_impl"] == "llm-d"


@pytest.mark.parametrize("args,msg", [
    ({"config": PRECISE, "router_impl": "gie"},
     "The EndpointPickerConfig has 1 problem(s): apiVersion llm-d.ai/v1alpha1 is llm-d-router's; GIE v1.4.0 registers "
     "EndpointPickerConfig only under inference.networking.x-k8s.io/v1alpha1, so it cannot decode this config and does not start "
     "(check it with router_impl llm-d)."),
    ({"config": GIE_ROLE, "router_impl": "gie", "router_version": "v0.9.0"},
     "The EndpointPickerConfig has 1 problem(s): router_version 'v0.9.0' is not one this collection encodes for router_impl gie (v1.4.0)."),
    ({"config": GIE_ROLE, "router_impl": "gie", "mode": "precise"},
     "The EndpointPickerConfig has 1 problem(s): mode precise needs a KV-event consumer, and GIE v1.4.0 has none (approximate "
     "prefix-cache scoring only); use router_impl llm-d for precise routing."),
], ids=["llm-d-config-as-gie", "llm-d-version-for-gie", "precise-with-gie"])
def test_gie_refusals_are_one_sentence(args, msg):
    result = run(epp_config_check, args, AnsibleFailJson)
    assert result["msg"] == msg and result["router_impl"] == "gie"


def test_router_impl_choices():
    result = run(epp_config_check, {"config": PRECISE, "router_impl": "envoy"}, AnsibleFailJson)
    assert result["msg"].startswith("value of router_impl must be one of: llm-d, gie")


@pytest.mark.parametrize("impl,router", [(None, "llm-d-router v0.9.0"), ("gie", "GIE v1.4.0")])
def test_invalid_yaml_does_not_start_the_epp(tmp_path, impl, router):
    path = tmp_path / "epp.yaml"
    path.write_text("plugins: [unclosed\n")
    for args in ({"config": "plugins: [unclosed"}, {"path": str(path)}):
        if impl:
            args["router_impl"] = impl
        result = run(epp_config_check, args, AnsibleFailJson)
        assert result["epp_starts"] is False and [f["kind"] for f in result["findings"]] == ["refused"]
        assert result["msg"] == result["problems"][0] == result["findings"][0]["sentence"]
        assert result["msg"].startswith("The EndpointPickerConfig is not valid YAML, so %s cannot decode it and does not start: " % router)


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
