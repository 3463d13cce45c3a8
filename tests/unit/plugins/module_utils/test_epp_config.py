# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""EndpointPickerConfig checks: good configs pass, each kind of bad one fails with its own sentence."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import copy

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils._epp_config import check_epp_config

ENGINE = {"block_size": 32, "hash_seed": "42", "topic": "kv@$(POD_IP):8000@Qwen/Qwen3-0.6B", "kv_events_port": 5557,
          "engine_type": "vllm", "kv_events_enabled": True}

PRECISE = {
    "apiVersion": "llm-d.ai/v1alpha1",
    "kind": "EndpointPickerConfig",
    "plugins": [
        {"type": "token-producer", "parameters": {"modelName": "Qwen/Qwen3-0.6B", "vllm": {"url": "http://engine:8000"}}},
        {"type": "precise-prefix-cache-producer", "parameters": {
            "tokenProcessorConfig": {"blockSizeTokens": 32, "hashSeed": "42"},
            "kvEventsConfig": {"topicFilter": "kv@", "engineType": "vllm", "discoverPods": True,
                               "podDiscoveryConfig": {"socketPort": 5557}}}},
        {"type": "prefix-cache-scorer", "parameters": {"prefixMatchInfoProducerName": "precise-prefix-cache-producer"}},
        {"type": "decode-filter"},
        {"type": "kv-cache-utilization-scorer"},
        {"type": "queue-scorer"},
        {"type": "max-score-picker"},
        {"type": "single-profile-handler"},
        {"type": "endpoint-notification-source"},
    ],
    "dataLayer": {"sources": [{"pluginRef": "endpoint-notification-source", "extractors": [{"pluginRef": "precise-prefix-cache-producer"}]}]},
    "schedulingProfiles": [{"name": "default", "plugins": [
        {"pluginRef": "decode-filter"}, {"pluginRef": "prefix-cache-scorer", "weight": 2.0},
        {"pluginRef": "kv-cache-utilization-scorer", "weight": 1.0}, {"pluginRef": "queue-scorer", "weight": 1.0},
        {"pluginRef": "max-score-picker"}]}],
}

APPROXIMATE = {
    "apiVersion": "llm-d.ai/v1alpha1",
    "kind": "EndpointPickerConfig",
    "plugins": [{"type": "decode-filter"}, {"type": "prefix-cache-scorer"}, {"type": "load-aware-scorer"},
                {"type": "kv-cache-utilization-scorer"}, {"type": "max-score-picker"}, {"type": "single-profile-handler"}],
    "schedulingProfiles": [{"name": "default", "plugins": [
        {"pluginRef": "decode-filter"}, {"pluginRef": "prefix-cache-scorer", "weight": 2.0}, {"pluginRef": "load-aware-scorer", "weight": 2.0},
        {"pluginRef": "kv-cache-utilization-scorer", "weight": 1.0}, {"pluginRef": "max-score-picker"}]}],
}

# Central mode as in llm-d-router deploy/config/sim-epp-kvcache-config.yaml (no data-layer source needed).
CENTRAL = copy.deepcopy(PRECISE)
CENTRAL["plugins"][1]["parameters"]["kvEventsConfig"] = {"zmqEndpoint": "tcp://*:5557", "topicFilter": "kv@", "discoverPods": False}
del CENTRAL["dataLayer"]


def plugin(config, ptype):
    return [p for p in config["plugins"] if p["type"] == ptype][0]


def mutate(base, fn):
    config = copy.deepcopy(base)
    fn(config)
    return config


@pytest.mark.parametrize("config,mode", [(PRECISE, "precise"), (APPROXIMATE, "approximate"), (CENTRAL, "precise"), (PRECISE, None)],
                         ids=["precise", "approximate", "central-mode", "no-mode"])
def test_good_configs_pass(config, mode):
    result = check_epp_config(config, engine=ENGINE, mode=mode)
    assert result.ok, result.problems
    assert result.deprecations == []


def test_precise_summary_reports_what_was_checked():
    summary = check_epp_config(PRECISE, engine=ENGINE).summary
    expected = {"block_size": 32, "hash_seed": "42", "topic_filter": "kv@", "engine_type": "vllm", "discover_pods": True}
    assert summary["precise-prefix-cache-producer"] == expected


BAD = [
    ("dangling-plugin-ref", lambda c: c["schedulingProfiles"][0]["plugins"].append({"pluginRef": "nope-scorer"}),
     "Scheduling profile default references plugin nope-scorer, which is not declared in plugins."),
    ("dangling-extractor", lambda c: c["dataLayer"]["sources"][0]["extractors"].append({"pluginRef": "ghost"}),
     "dataLayer source endpoint-notification-source extractor references plugin ghost, which is not declared in plugins."),
    ("scorer-without-producer", lambda c: plugin(c, "prefix-cache-scorer")["parameters"].update(prefixMatchInfoProducerName="missing-producer"),
     "Scorer prefix-cache-scorer reads prefixMatchInfoProducerName missing-producer, which is not declared in plugins."),
    ("scorer-references-non-producer", lambda c: plugin(c, "prefix-cache-scorer")["parameters"].update(prefixMatchInfoProducerName="queue-scorer"),
     "Scorer prefix-cache-scorer reads prefixMatchInfoProducerName queue-scorer, which is a queue-scorer, not a prefix-cache producer."),
    ("no-token-producer", lambda c: c["plugins"].pop(0),
     "Producer precise-prefix-cache-producer needs a token-producer plugin, and none is declared."),
    ("topic-filter-mismatch", lambda c: plugin(c, "precise-prefix-cache-producer")["parameters"]["kvEventsConfig"].update(topicFilter="kv-events"),
     "Producer precise-prefix-cache-producer subscribes with topicFilter 'kv-events', which is not a prefix of the engines' topic "
     "'kv@$(POD_IP):8000@Qwen/Qwen3-0.6B'."),
    ("socket-port-mismatch", lambda c: plugin(c, "precise-prefix-cache-producer")["parameters"]["kvEventsConfig"]["podDiscoveryConfig"].update(socketPort=5556),
     "Producer precise-prefix-cache-producer dials KV events on port 5556 but the engines publish on port 5557."),
    ("no-notification-source", lambda c: c.pop("dataLayer"),
     "Producer precise-prefix-cache-producer discovers pods, but no endpoint-notification-source data source lists it as an extractor."),
    ("orphan-producer", lambda c: plugin(c, "prefix-cache-scorer").pop("parameters"),
     "Producer precise-prefix-cache-producer is declared but no prefix-cache-scorer references it by prefixMatchInfoProducerName."),
    ("tokenizers-pool", lambda c: plugin(c, "precise-prefix-cache-producer")["parameters"].update(indexerConfig={"tokenizersPoolConfig": {}}),
     "Producer precise-prefix-cache-producer sets indexerConfig.tokenizersPoolConfig, which the router rejects; configure a token-producer "
     "plugin instead."),
    ("duplicate-name", lambda c: c["plugins"].append({"type": "queue-scorer"}),
     "Plugin name queue-scorer is declared twice; give one of them another name."),
    ("bad-weight", lambda c: c["schedulingProfiles"][0]["plugins"][2].update(weight=-1),
     "Scheduling profile default gives kv-cache-utilization-scorer the weight -1; weights are numbers >= 0."),
    ("wrong-api-version", lambda c: c.update(apiVersion="llm-d.ai/v1"),
     "apiVersion is 'llm-d.ai/v1' but the router accepts llm-d.ai/v1alpha1."),
    ("wrong-kind", lambda c: c.update(kind="Config"), "kind is 'Config' but must be EndpointPickerConfig."),
    ("no-profiles", lambda c: c.update(schedulingProfiles=[]), "schedulingProfiles must be a non-empty list."),
    ("plugin-without-type", lambda c: c["plugins"].append({"name": "x"}), "plugins[9] has no type."),
]


@pytest.mark.parametrize("name,fn,sentence", BAD, ids=[b[0] for b in BAD])
def test_each_bad_config_is_rejected_with_its_sentence(name, fn, sentence):
    result = check_epp_config(mutate(PRECISE, fn), engine=ENGINE)
    assert not result.ok, name
    assert sentence in result.problems, result.problems


def test_engines_without_kv_events_reject_the_precise_producer():
    result = check_epp_config(PRECISE, engine=dict(ENGINE, kv_events_enabled=False))
    assert "Producer precise-prefix-cache-producer subscribes to KV events, but the engines do not publish them." in result.problems


def test_modes_are_checked():
    assert "Mode approximate must not declare a precise-prefix-cache-producer." in check_epp_config(PRECISE, mode="approximate").problems
    assert "Mode precise needs a precise-prefix-cache-producer plugin, and none is declared." in check_epp_config(APPROXIMATE, mode="precise").problems
    no_load = mutate(APPROXIMATE, lambda c: (c["plugins"].pop(2), c["schedulingProfiles"][0]["plugins"].pop(2)))
    assert "Mode approximate needs a load-aware-scorer plugin, and none is declared." in check_epp_config(no_load, mode="approximate").problems


def test_several_profiles_need_a_handler():
    config = mutate(APPROXIMATE, lambda c: (c["plugins"].pop(5), c["schedulingProfiles"].append({"name": "prefill", "plugins": []})))
    assert "Several scheduling profiles are declared but no profile handler plugin is." in check_epp_config(config).problems


@pytest.mark.parametrize("fn,sentence", [
    (lambda c: c.update(apiVersion="inference.networking.x-k8s.io/v1alpha1"),
     "apiVersion inference.networking.x-k8s.io/v1alpha1 is deprecated; use llm-d.ai/v1alpha1."),
    (lambda c: plugin(c, "token-producer").update(type="tokenizer"), "Plugin type tokenizer is deprecated; use token-producer."),
    (lambda c: plugin(c, "precise-prefix-cache-producer")["parameters"]["tokenProcessorConfig"].update(blockSize=32),
     "Plugin precise-prefix-cache-producer parameter tokenProcessorConfig.blockSize is deprecated in favour of blockSizeTokens."),
    (lambda c: c["plugins"].append({"type": "precise-prefix-cache-scorer"}),
     "Plugin type precise-prefix-cache-scorer is deprecated; use precise-prefix-cache-producer plus prefix-cache-scorer with "
     "prefixMatchInfoProducerName."),
], ids=["old-api-version", "tokenizer", "blockSize", "precise-prefix-cache-scorer"])
def test_deprecated_names_are_flagged_not_failed(fn, sentence):
    result = check_epp_config(mutate(PRECISE, fn), engine=ENGINE)
    assert sentence in result.deprecations
    assert result.ok, result.problems


def test_not_a_mapping():
    assert check_epp_config(["x"]).problems == ["The EndpointPickerConfig is not a mapping (got list)."]
