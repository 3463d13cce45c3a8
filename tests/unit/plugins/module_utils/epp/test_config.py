# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""EndpointPickerConfig checks: good configs pass, each kind of bad one fails with its own sentence.

The v0.9.0 facts asserted by hand here (field lists, sentences) were read at llm-d/llm-d-router@v0.9.0 (paths in
each test); the table-driven tests walk the data table in ``_epp_plugins`` and prove that the checker enforces every
entry of it. test_llm_d.py pins the table itself; test_config_properties.py feeds generated junk.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import copy

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.epp.config import check_epp_config
from ansible_collections.inference_cache.substrate.plugins.module_utils.epp.llm_d import PLUGINS, plugin_types

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

# Prefill/decode disaggregation with the nested disagg-profile-handler parameters
# (llm-d/llm-d-router@v0.9.0:pkg/epp/framework/plugins/scheduling/profilehandler/disagg/disagg_profile_handler.go).
DISAGG = {
    "apiVersion": "llm-d.ai/v1alpha1",
    "kind": "EndpointPickerConfig",
    "plugins": [
        {"type": "prefill-filter"}, {"type": "decode-filter"}, {"type": "prefix-cache-scorer"}, {"type": "queue-scorer"},
        {"type": "max-score-picker"}, {"type": "prefix-based-pd-decider", "parameters": {"nonCachedTokens": 256}},
        {"type": "disagg-profile-handler", "parameters": {"profiles": {"decode": "decode", "prefill": "prefill"},
                                                          "deciders": {"prefill": "prefix-based-pd-decider"}}},
    ],
    "schedulingProfiles": [
        {"name": "prefill", "plugins": [{"pluginRef": "prefill-filter"}, {"pluginRef": "queue-scorer", "weight": 1},
                                        {"pluginRef": "max-score-picker"}]},
        {"name": "decode", "plugins": [{"pluginRef": "decode-filter"}, {"pluginRef": "prefix-cache-scorer", "weight": 2},
                                       {"pluginRef": "max-score-picker"}]},
    ],
}


def plugin(config, ptype):
    return [p for p in config["plugins"] if p["type"] == ptype][0]


def mutate(base, fn):
    config = copy.deepcopy(base)
    fn(config)
    return config


def producer_params(config):
    return plugin(config, "precise-prefix-cache-producer")["parameters"]


@pytest.mark.parametrize("config,mode", [(PRECISE, "precise"), (APPROXIMATE, "approximate"), (CENTRAL, "precise"), (PRECISE, None),
                                         (DISAGG, None)],
                         ids=["precise", "approximate", "central-mode", "no-mode", "disagg"])
def test_good_configs_pass(config, mode):
    result = check_epp_config(config, engine=ENGINE, mode=mode)
    assert result.ok, result.problems
    assert result.deprecations == [] and result.warnings == []


def test_precise_summary_reports_what_was_checked():
    summary = check_epp_config(PRECISE, engine=ENGINE).summary
    expected = {"block_size": 32, "hash_seed": "42", "topic_filter": "kv@", "engine_type": "vllm", "discover_pods": True}
    assert summary["precise-prefix-cache-producer"] == expected


UNKNOWN_TAIL = ("in llm-d-router v0.9.0; the EPP decodes parameters strictly (DisallowUnknownFields), so the plugin fails and the "
                "EPP does not start.")

BAD = [
    ("dangling-plugin-ref", lambda c: c["schedulingProfiles"][0]["plugins"].append({"pluginRef": "nope-scorer"}),
     "Scheduling profile default references plugin nope-scorer, which is not declared in plugins."),
    ("dangling-extractor", lambda c: c["dataLayer"]["sources"][0]["extractors"].append({"pluginRef": "ghost"}),
     "dataLayer source endpoint-notification-source extractor references plugin ghost, which is not declared in plugins."),
    ("scorer-without-producer", lambda c: plugin(c, "prefix-cache-scorer")["parameters"].update(prefixMatchInfoProducerName="missing-producer"),
     "Scorer prefix-cache-scorer reads prefixMatchInfoProducerName missing-producer, which is not declared in plugins."),
    ("scorer-references-non-producer", lambda c: plugin(c, "prefix-cache-scorer")["parameters"].update(prefixMatchInfoProducerName="queue-scorer"),
     "Scorer prefix-cache-scorer reads prefixMatchInfoProducerName queue-scorer, which is a queue-scorer, not a prefix-cache producer."),
    ("scorer-references-token-producer", lambda c: plugin(c, "prefix-cache-scorer")["parameters"].update(prefixMatchInfoProducerName="token-producer"),
     "Scorer prefix-cache-scorer reads prefixMatchInfoProducerName token-producer, which is a token-producer, not a prefix-cache producer."),
    # The EPP starts with these two: it creates the estimating token producer itself (was: "needs a token-producer
    # plugin, and none is declared"), or uses the declared estimating one; neither ever matches an engine block.
    ("no-token-producer", lambda c: c["plugins"].pop(0),
     "Producer precise-prefix-cache-producer has no token-producer plugin; llm-d-router v0.9.0 then creates one itself with the "
     "estimating backend, which never yields an engine's block keys, so the EPP starts but never matches an engine block and "
     "precise scoring scores every endpoint 0."),
    ("token-producer-estimates", lambda c: plugin(c, "token-producer").pop("parameters"),
     "Producer precise-prefix-cache-producer reads tokens from Plugin token-producer, which has no tokenizer backend (no vllm, "
     "modelName or udsTokenizerConfig) and only estimates pseudo-tokens; the EPP starts but never matches an engine block, so "
     "precise scoring scores every endpoint 0."),
    ("token-producer-without-model", lambda c: plugin(c, "token-producer")["parameters"].pop("modelName"),
     "Plugin token-producer needs modelName with the vllm backend; its factory fails without it."),
    ("topic-filter-mismatch", lambda c: producer_params(c)["kvEventsConfig"].update(topicFilter="kv-events"),
     "Producer precise-prefix-cache-producer subscribes with topicFilter 'kv-events', which is not a prefix of the engines' topic "
     "'kv@$(POD_IP):8000@Qwen/Qwen3-0.6B'."),
    ("socket-port-mismatch", lambda c: producer_params(c)["kvEventsConfig"]["podDiscoveryConfig"].update(socketPort=5556),
     "Producer precise-prefix-cache-producer dials KV events on port 5556 but the engines publish on port 5557."),
    ("socket-port-default", lambda c: producer_params(c)["kvEventsConfig"].pop("podDiscoveryConfig"),
     None),  # the default port 5557 matches: no problem
    ("no-notification-source", lambda c: c.pop("dataLayer"),
     "Producer precise-prefix-cache-producer discovers pods, but no endpoint-notification-source data source lists it as an extractor; "
     "the EPP starts and never subscribes to an engine."),
    ("discovery-config-null", lambda c: producer_params(c)["kvEventsConfig"].update(podDiscoveryConfig=None),
     "Producer precise-prefix-cache-producer discovers pods but sets kvEventsConfig.podDiscoveryConfig to null, so it subscribes to no engine."),
    ("kv-events-config-null", lambda c: producer_params(c).update(kvEventsConfig=None),
     "Producer precise-prefix-cache-producer sets kvEventsConfig to null; the EPP then dereferences a nil kvEventsConfig at start and crashes."),
    ("orphan-producer", lambda c: plugin(c, "prefix-cache-scorer").pop("parameters"),
     "Producer precise-prefix-cache-producer is declared but no prefix-cache-scorer references it by prefixMatchInfoProducerName."),
    ("tokenizers-pool", lambda c: producer_params(c).update(indexerConfig={"tokenizersPoolConfig": {}}),
     "Producer precise-prefix-cache-producer sets indexerConfig.tokenizersPoolConfig, which the router rejects; configure a token-producer "
     "plugin instead."),
    ("duplicate-name", lambda c: c["plugins"].append({"type": "queue-scorer"}),
     "Plugin name queue-scorer is declared twice; give one of them another name."),
    ("weight-as-string", lambda c: c["schedulingProfiles"][0]["plugins"][2].update(weight="1"),
     "EndpointPickerConfig field schedulingProfiles[0].plugins[2].weight is a string but must be a number."),
    ("weight-not-a-number", lambda c: c["schedulingProfiles"][0]["plugins"][2].update(weight=float("nan")),
     "EndpointPickerConfig field schedulingProfiles[0].plugins[2].weight is nan (not a JSON number) but must be a number."),
    ("two-pickers", lambda c: (c["plugins"].append({"type": "random-picker"}),
                               c["schedulingProfiles"][0]["plugins"].append({"pluginRef": "random-picker"})),
     "Scheduling profile default references 2 pickers (max-score-picker, random-picker); the EPP allows one."),
    ("two-profile-handlers", lambda c: c["plugins"].append({"type": "data-parallel-profile-handler"}),
     "Several profile handlers are declared (single-profile-handler, data-parallel-profile-handler); the EPP allows one."),
    ("wrong-api-version", lambda c: c.update(apiVersion="llm-d.ai/v1"),
     "apiVersion is 'llm-d.ai/v1' but the router accepts llm-d.ai/v1alpha1."),
    ("wrong-kind", lambda c: c.update(kind="Config"), "kind is 'Config' but must be EndpointPickerConfig."),
    ("plugin-without-type", lambda c: c["plugins"].append({"name": "x"}), "plugins[9] has no type."),
    ("unknown-top-level-field", lambda c: c.update(metadata={"name": "x"}),
     "EndpointPickerConfig field metadata is not a field of llm-d-router v0.9.0's EndpointPickerConfig; the EPP decodes the config "
     "strictly and does not start."),
    # The top level goes through the Kubernetes strict serializer (sigs.k8s.io/json), which matches keys case-sensitively.
    ("top-level-key-case", lambda c: c.update(DataLayer=c.pop("dataLayer")),
     "EndpointPickerConfig field DataLayer is not a field of llm-d-router v0.9.0's EndpointPickerConfig; the EPP decodes the config "
     "strictly and does not start."),
    ("unknown-feature-gate", lambda c: c.update(featureGates=["prefixCache"]),
     "Feature gate prefixCache is not registered in llm-d-router v0.9.0 (known: dataLayer, flowControl); the EPP does not start."),
    ("replay-socket-port", lambda c: producer_params(c)["kvEventsConfig"]["podDiscoveryConfig"].update(replaySocketPort=5558),
     "Plugin precise-prefix-cache-producer parameter kvEventsConfig.podDiscoveryConfig.replaySocketPort is not a field of "
     "precise-prefix-cache-producer " + UNKNOWN_TAIL),
    ("burst-producer", lambda c: c["plugins"].append({"type": "burst-prefix-cache-producer"}),
     "Plugin type burst-prefix-cache-producer is not registered in llm-d-router v0.9.0 (first registered in llm-d-router v0.10.0), "
     "so the EPP does not start."),
    ("endpoint-attribute-scorer", lambda c: c["plugins"].append({"type": "endpoint-attribute-scorer"}),
     "Plugin type endpoint-attribute-scorer is not registered in llm-d-router v0.9.0 (first registered in llm-d-router v0.10.0), "
     "so the EPP does not start."),
    ("misspelled-type", lambda c: c["plugins"].append({"type": "queue-scorrer"}),
     "Plugin type queue-scorrer is not registered in llm-d-router v0.9.0, so the EPP does not start; check its spelling."),
    # The EPP starts with these two (was: "must be at least 1 (got 0)" / "must be at most 65535 (got 70000)", as if refused).
    ("zero-concurrency", lambda c: producer_params(c)["kvEventsConfig"].update(concurrency=0),
     "Producer precise-prefix-cache-producer sets kvEventsConfig.concurrency to 0; llm-d-router v0.9.0 starts, then panics with an "
     "integer divide by zero in the KV-event pool (kvevents.(*Pool).AddTask) on the first KV event."),
    ("port-out-of-range", lambda c: producer_params(c)["kvEventsConfig"]["podDiscoveryConfig"].update(socketPort=70000),
     "Plugin precise-prefix-cache-producer parameter kvEventsConfig.podDiscoveryConfig.socketPort is 70000, not a TCP port "
     "(1 to 65535); the EPP does not check it, starts, and never subscribes to an engine."),
    ("block-size-as-string", lambda c: producer_params(c)["tokenProcessorConfig"].update(blockSizeTokens="32"),
     "Plugin precise-prefix-cache-producer parameter tokenProcessorConfig.blockSizeTokens is a string but must be an integer."),
    ("metrics-interval-as-string", lambda c: producer_params(c).update(indexerConfig={"kvBlockIndexConfig": {"metricsLoggingInterval": "30s"}}),
     "Plugin precise-prefix-cache-producer parameter indexerConfig.kvBlockIndexConfig.metricsLoggingInterval is a string but must be "
     "an integer number of nanoseconds (Go time.Duration)."),
    ("speculative-ttl-not-a-duration", lambda c: producer_params(c).update(speculativeTTL="two seconds", speculativeIndexing=True),
     "Plugin precise-prefix-cache-producer parameter speculativeTTL is 'two seconds', not a Go duration such as \"2s\"; with "
     "speculativeIndexing on the EPP refuses it (invalid speculativeTTL) and does not start."),
    ("negative-concurrency", lambda c: producer_params(c)["kvEventsConfig"].update(concurrency=-2),
     "Producer precise-prefix-cache-producer sets kvEventsConfig.concurrency to -2; the EPP panics while creating the KV-event pool "
     "(make with a negative length in kvevents.NewPool) and does not start."),
]

# The entries of BAD with which the EPP starts and is broken; every other one it refuses (epp_starts false).
BROKEN_ONES = {"no-token-producer", "token-producer-estimates", "topic-filter-mismatch", "socket-port-mismatch",
               "no-notification-source", "discovery-config-null", "orphan-producer", "zero-concurrency", "port-out-of-range"}


@pytest.mark.parametrize("name,fn,sentence", BAD, ids=[b[0] for b in BAD])
def test_each_bad_config_is_rejected_with_its_sentence(name, fn, sentence):
    result = check_epp_config(mutate(PRECISE, fn), engine=ENGINE)
    if sentence is None:
        assert result.ok, result.problems
        return
    assert not result.ok, name
    assert sentence in result.problems, result.problems
    kind = "broken" if name in BROKEN_ONES else "refused"
    assert result.kind_of(sentence) == kind, (name, result.findings)
    assert result.epp_starts is (kind == "broken"), (name, result.findings)


def test_the_scorer_must_name_a_prefix_producer_and_nothing_else():
    """Every declared plugin that is not a prefix producer is refused as prefixMatchInfoProducerName (catches a check weakened
    to "references anything"); the two producer types are accepted."""
    for ptype in plugin_types():
        config = mutate(PRECISE, lambda c: c["plugins"].append({"type": ptype, "name": "target"}))
        plugin(config, "prefix-cache-scorer")["parameters"]["prefixMatchInfoProducerName"] = "target"
        problems = check_epp_config(config, engine=ENGINE).problems
        refused = "Scorer prefix-cache-scorer reads prefixMatchInfoProducerName target, which is a %s, not a prefix-cache producer." % ptype
        if ptype in ("precise-prefix-cache-producer", "approx-prefix-cache-producer", "precise-prefix-cache-scorer"):
            assert refused not in problems
        else:
            assert refused in problems, (ptype, problems)


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
    single = mutate(APPROXIMATE, lambda c: c["schedulingProfiles"].append({"name": "prefill", "plugins": []}))
    assert "single-profile-handler cannot serve several scheduling profiles; use disagg-profile-handler." in check_epp_config(single).problems


@pytest.mark.parametrize("fn,sentence", [
    (lambda c: c["plugins"].reverse(),
     "Plugin disagg-profile-handler names deciders.prefill prefix-based-pd-decider, which is declared after it; the EPP instantiates "
     "plugins in order, so declare the decider first."),
    (lambda c: plugin(c, "disagg-profile-handler")["parameters"]["deciders"].update(prefill="queue-scorer"),
     "Plugin disagg-profile-handler names deciders.prefill queue-scorer, which is a queue-scorer, not a decider."),
    (lambda c: plugin(c, "disagg-profile-handler")["parameters"]["deciders"].update(encode="nope"),
     "Plugin disagg-profile-handler names deciders.encode nope, which is not declared in plugins."),
    (lambda c: plugin(c, "prefix-based-pd-decider")["parameters"].update(nonCachedTokens=-1),
     "Plugin prefix-based-pd-decider parameter nonCachedTokens must be at least 0 (got -1)."),
    (lambda c: plugin(c, "disagg-profile-handler")["parameters"]["profiles"].update(prefil="prefill"),
     "Plugin disagg-profile-handler parameter profiles.prefil is not a field of disagg-profile-handler " + UNKNOWN_TAIL),
    (lambda c: (plugin(c, "disagg-profile-handler").update(type="pd-profile-handler", parameters={}), c["plugins"].reverse()),
     "Plugin pd-profile-handler names deciderPluginName prefix-based-pd-decider, which is declared after it; "
     "the EPP instantiates plugins in order, so declare the decider first."),
], ids=["decider-after-handler", "decider-not-a-decider", "decider-undeclared", "negative-tokens", "unknown-nested", "pd-default-decider"])
def test_disaggregation_references(fn, sentence):
    assert sentence in check_epp_config(mutate(DISAGG, fn)).problems


def test_disagg_flat_parameters_are_a_deprecation():
    config = mutate(DISAGG, lambda c: plugin(c, "disagg-profile-handler").update(
        parameters={"decodeProfile": "decode", "prefillProfile": "prefill", "prefillDeciderPluginName": "prefix-based-pd-decider"}))
    result = check_epp_config(config)
    assert result.ok, result.problems
    assert result.deprecations == ["Plugin disagg-profile-handler uses the deprecated flat parameters; use profiles and deciders."]
    mixed = mutate(config, lambda c: plugin(c, "disagg-profile-handler")["parameters"].update(profiles={"decode": "decode"}))
    assert "Plugin disagg-profile-handler parameter decodeProfile is not a field of disagg-profile-handler " + UNKNOWN_TAIL \
        in check_epp_config(mixed).problems


@pytest.mark.parametrize("fn,sentence", [
    (lambda c: c.update(apiVersion="inference.networking.x-k8s.io/v1alpha1"),
     "apiVersion inference.networking.x-k8s.io/v1alpha1 is deprecated; use llm-d.ai/v1alpha1."),
    (lambda c: plugin(c, "token-producer").update(type="tokenizer"), "Plugin type tokenizer is deprecated; use token-producer."),
    (lambda c: producer_params(c)["tokenProcessorConfig"].update(blockSize=32),
     "Plugin precise-prefix-cache-producer parameter tokenProcessorConfig.blockSize is deprecated in favour of blockSizeTokens."),
    (lambda c: c["plugins"].append({"type": "precise-prefix-cache-scorer"}),
     "Plugin type precise-prefix-cache-scorer is deprecated; use precise-prefix-cache-producer plus prefix-cache-scorer with "
     "prefixMatchInfoProducerName."),
    (lambda c: c.update(saturationDetector={"pluginRef": "utilization-detector"}),
     "EndpointPickerConfig field saturationDetector is deprecated; use flowControl.saturationDetector."),
], ids=["old-api-version", "tokenizer", "blockSize", "precise-prefix-cache-scorer", "top-level-saturation-detector"])
def test_deprecated_names_are_flagged_not_failed(fn, sentence):
    result = check_epp_config(mutate(PRECISE, fn), engine=ENGINE)
    assert sentence in result.deprecations
    assert result.ok, result.problems


# --- v0.9.0 semantics: what differs from the engines but is no error -------------------------------------------------

README = "llm-d/llm-d-router@v0.9.0:pkg/epp/framework/plugins/requestcontrol/dataproducer/preciseprefixcache/README.md"


@pytest.mark.parametrize("fn,engine,sentence", [
    (lambda c: producer_params(c)["tokenProcessorConfig"].update(hashSeed="0"), ENGINE,
     "Producer precise-prefix-cache-producer uses hashSeed '0' while the engines run with PYTHONHASHSEED '42'; llm-d-router v0.9.0 "
     "recomputes block keys from the events' token ids (%s), so the seeds need not match." % README),
    (lambda c: producer_params(c)["tokenProcessorConfig"].update(blockSizeTokens=16), ENGINE,
     "Producer precise-prefix-cache-producer hashes blocks of 16 tokens while the engines use --block-size 32; llm-d-router v0.9.0 "
     "recomputes block keys from the events' token ids with its own block size (%s), so this is not an error, but prefix matches "
     "are counted in blocks of 16 tokens." % README),
    (lambda c: producer_params(c)["tokenProcessorConfig"].pop("blockSizeTokens"), ENGINE,
     "Producer precise-prefix-cache-producer hashes blocks of 16 tokens while the engines use --block-size 32; llm-d-router v0.9.0 "
     "recomputes block keys from the events' token ids with its own block size (%s), so this is not an error, but prefix matches "
     "are counted in blocks of 16 tokens." % README),
    (lambda c: producer_params(c)["kvEventsConfig"].update(engineType="sglang"), dict(ENGINE, engine_type="sglang"),
     "Producer precise-prefix-cache-producer sets engineType sglang, but llm-d-router v0.9.0 ignores kvEventsConfig.engineType and "
     "always decodes KV events with its vLLM adapter (llm-d/llm-d-router@v0.9.0:pkg/epp/framework/plugins/requestcontrol/dataproducer/"
     "preciseprefixcache/producer.go): SGLang events are read only while they keep vLLM's positional-array layout, and SGLang emits "
     "no extra_keys, so salted or multimodal requests never match."),
    (lambda c: producer_params(c)["kvEventsConfig"].pop("engineType"), dict(ENGINE, engine_type="sglang"),
     "Producer precise-prefix-cache-producer routes to SGLang engines, but llm-d-router v0.9.0 ignores kvEventsConfig.engineType and "
     "always decodes KV events with its vLLM adapter (llm-d/llm-d-router@v0.9.0:pkg/epp/framework/plugins/requestcontrol/dataproducer/"
     "preciseprefixcache/producer.go): SGLang events are read only while they keep vLLM's positional-array layout, and SGLang emits "
     "no extra_keys, so salted or multimodal requests never match."),
    (lambda c: None, dict(ENGINE, enable_scale_out=False),
     "Plugin token-producer renders prompts at http://engine:8000/v1/completions/render, which vLLM 0.32 serves only when started "
     "with --enable-scale-out (403 otherwise), and the engines run without it, so the EPP gets no tokens and precise scoring silently "
     "scores every endpoint 0."),
    (lambda c: plugin(c, "decode-filter").update(parameters={"label": "x"}), ENGINE,
     "Plugin decode-filter takes no parameters in llm-d-router v0.9.0; the EPP ignores the ones given."),
    (lambda c: producer_params(c)["kvEventsConfig"].update(TopicFilter=producer_params(c)["kvEventsConfig"].pop("topicFilter")), ENGINE,
     "Plugin precise-prefix-cache-producer parameter kvEventsConfig.TopicFilter is accepted as topicFilter only because Go matches "
     "JSON keys case-insensitively; write it that way."),
], ids=["hash-seed", "block-size", "block-size-default", "engine-type-sglang", "sglang-engines", "render-without-scale-out",
        "ignored-parameters", "case-insensitive-key"])
def test_differences_the_epp_tolerates_are_warnings(fn, engine, sentence):
    result = check_epp_config(mutate(PRECISE, fn), engine=engine)
    assert result.ok, result.problems
    assert result.deprecations == []
    assert result.warnings == [sentence]


def test_the_render_sidecar_is_not_warned_about():
    sidecar = mutate(PRECISE, lambda c: plugin(c, "token-producer")["parameters"]["vllm"].update(url="http://localhost:8000"))
    assert check_epp_config(sidecar, engine=dict(ENGINE, enable_scale_out=False)).warnings == []
    assert check_epp_config(PRECISE, engine=dict(ENGINE, enable_scale_out=True)).warnings == []


# --- the table, enforced: every type, every field -----------------------------------------------------------------------

def _example(node):
    """A value of the right type for a schema node (for the 'every field accepted' test)."""
    kind = node["t"]
    if kind == "obj":
        return dict((name, _example(sub)) for name, sub in node["fields"].items())
    if kind == "list":
        return [_example(node["of"])]
    if kind == "map":
        return {"key": _example(node["of"])}
    if kind == "int":
        return max(node["min"] or 0, 1) if node["max"] is None or node["max"] >= 1 else node["max"]
    if kind == "float":
        return 0.5 if node["max"] is not None else max(node["min"] or 0, 1.5)
    values = {"str": "", "bool": True, "ns": 1000000000, "duration": "2s", "quantity": "1Gi", "any": None}
    if kind == "enum":
        return node["values"][-1]
    return values[kind]


def _wrong(node):
    """A value of the wrong JSON type for a schema node, and the expected-type phrase the sentence must carry."""
    kind = node["t"]
    if kind in ("obj", "map"):
        return "text", "is a string but must be a mapping"
    if kind == "list":
        return {"a": 1}, "is a mapping but must be a list"
    if kind in ("str", "enum", "duration"):
        return 7, "is an integer but must be a string"
    if kind == "bool":
        return "yes", "is a string but must be a boolean (true or false)"
    if kind == "int":
        return "7", "is a string but must be an integer"
    if kind == "ns":
        return "30s", "is a string but must be an integer number of nanoseconds (Go time.Duration)"
    if kind == "float":
        return [1], "is a list but must be a number"
    return [1], "is 1 but must be"  # quantity


def _leaves(node, path=()):
    """Every field path of a struct schema, nested ones included, with its node."""
    for name, sub in sorted(node["fields"].items()):
        yield path + (name,), sub
        inner = sub
        while inner["t"] in ("list", "map"):
            inner = inner["of"]
        if inner["t"] == "obj" and inner is sub:
            yield from _leaves(sub, path + (name,))


def _set(params, path, value):
    for key in path[:-1]:
        params = params[key]
    params[path[-1]] = value


def _alone(ptype, params):
    """A config whose only plugin under test is ``ptype`` (named 'p'), with the pieces the EPP needs around it."""
    return {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig",
            "plugins": [{"name": "p", "type": ptype, "parameters": params}, {"type": "max-score-picker", "name": "picker"}],
            "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": "picker"}]}]}


def _parameter_problems(result):
    return [p for p in result.problems if p.startswith("Plugin p ") and " parameter" in p]


TYPES_WITH_PARAMS = [t for t in plugin_types() if PLUGINS["v0.9.0"][t]["params"] is not None]


@pytest.mark.parametrize("ptype", plugin_types())
def test_every_v090_type_is_accepted_with_all_its_fields(ptype):
    spec = PLUGINS["v0.9.0"][ptype]
    params = _example(spec["params"]) if spec["params"] else None
    result = check_epp_config(_alone(ptype, params))
    assert not [p for p in result.problems if "not registered" in p]
    assert _parameter_problems(result) == []


@pytest.mark.parametrize("ptype", TYPES_WITH_PARAMS)
def test_every_v090_type_refuses_an_unknown_field_at_every_depth(ptype):
    schema = PLUGINS["v0.9.0"][ptype]["params"]
    paths = [()] + [path for path, node in _leaves(schema) if node["t"] == "obj"]
    for path in paths:
        params = _example(schema)
        target = params
        for key in path:
            target = target[key]
        target["notAField"] = 1
        sentence = "Plugin p (%s) parameter %s is not a field of %s %s" % (
            ptype, ".".join(path + ("notAField",)), ptype, UNKNOWN_TAIL)
        assert sentence in check_epp_config(_alone(ptype, params)).problems, (ptype, path)


@pytest.mark.parametrize("ptype", TYPES_WITH_PARAMS)
def test_every_v090_field_refuses_a_wrong_json_type(ptype):
    schema = PLUGINS["v0.9.0"][ptype]["params"]
    for path, node in _leaves(schema):
        params = _example(schema)
        wrong, phrase = _wrong(node)
        _set(params, path, wrong)
        problems = _parameter_problems(check_epp_config(_alone(ptype, params)))
        prefix = "Plugin p (%s) parameter %s %s" % (ptype, ".".join(path), phrase)
        assert [p for p in problems if p.startswith(prefix)], (ptype, path, problems)


def test_a_plugin_that_needs_parameters_says_so():
    result = check_epp_config(_alone("k8s-notification-source", None))
    assert "Plugin p (k8s-notification-source) needs parameters; its factory fails without them." in result.problems


# --- bad input: one sentence each, never an exception --------------------------------------------------------------------

WRONG_SHAPES = [
    ("parameters-list", lambda c: producer_params(c) and plugin(c, "precise-prefix-cache-producer").update(parameters=[1, 2]),
     "Plugin precise-prefix-cache-producer has parameters that are a list, not a mapping; the EPP cannot decode them."),
    ("token-processor-string", lambda c: producer_params(c).update(tokenProcessorConfig="32"),
     "Plugin precise-prefix-cache-producer parameter tokenProcessorConfig is a string but must be a mapping."),
    ("kv-events-list", lambda c: producer_params(c).update(kvEventsConfig=["kv@"]),
     "Plugin precise-prefix-cache-producer parameter kvEventsConfig is a list but must be a mapping."),
    ("sources-int", lambda c: c["dataLayer"].update(sources=3),
     "EndpointPickerConfig field dataLayer.sources is an integer but must be a list."),
    ("plugin-ref-list", lambda c: c["schedulingProfiles"][0]["plugins"][0].update(pluginRef=["decode-filter"]),
     "EndpointPickerConfig field schedulingProfiles[0].plugins[0].pluginRef is a list but must be a string."),
    ("profile-string", lambda c: c["schedulingProfiles"].append("default"),
     "EndpointPickerConfig field schedulingProfiles[1] is a string but must be a mapping."),
    ("plugins-mapping", lambda c: c.update(plugins={"type": "queue-scorer"}),
     "EndpointPickerConfig field plugins is a mapping but must be a list."),
    ("plugin-none", lambda c: c["plugins"].append(None), "plugins[9] has no type."),
    ("data-layer-list", lambda c: c.update(dataLayer=["x"]), "EndpointPickerConfig field dataLayer is a list but must be a mapping."),
    ("type-int", lambda c: c["plugins"].append({"type": 7}), "EndpointPickerConfig field plugins[9].type is an integer but must be a string."),
    ("extractors-string", lambda c: c["dataLayer"]["sources"][0].update(extractors="precise-prefix-cache-producer"),
     "EndpointPickerConfig field dataLayer.sources[0].extractors is a string but must be a list."),
    ("feature-gates-string", lambda c: c.update(featureGates="dataLayer"),
     "EndpointPickerConfig field featureGates is a string but must be a list."),
]


@pytest.mark.parametrize("name,fn,sentence", WRONG_SHAPES, ids=[w[0] for w in WRONG_SHAPES])
def test_wrong_shapes_are_one_sentence_each(name, fn, sentence):
    result = check_epp_config(mutate(PRECISE, fn), engine=ENGINE)
    assert sentence in result.problems, (name, result.problems)
    for problem in result.problems:
        assert "\n" not in problem and problem.endswith("."), problem


@pytest.mark.parametrize("config,sentence", [
    (["x"], "The EndpointPickerConfig is not a mapping (got list)."),
    (None, "The EndpointPickerConfig is not a mapping (got NoneType)."),
    ("plugins: []", "The EndpointPickerConfig is not a mapping (got str)."),
])
def test_not_a_config(config, sentence):
    assert sentence in check_epp_config(config).problems


NO_PLUGINS = ("plugins is empty; llm-d-router v0.9.0 does not then use its default configuration (only an empty file does), so "
              "no scorer runs: a scheduling profile without plugins gets only the max-score-picker the EPP adds, and every request "
              "goes to a random endpoint.")


@pytest.mark.parametrize("config", [
    {},
    {"plugins": None, "schedulingProfiles": None, "dataLayer": None, "apiVersion": None, "kind": None},
    {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig", "plugins": []},
    {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig", "plugins": [], "schedulingProfiles": []},
], ids=["empty-mapping", "all-null", "empty-plugins", "empty-plugins-and-profiles"])
def test_no_plugins_is_not_the_default_configuration(config):
    """plugins: [] (or none) with no schedulingProfiles: llm-d-router v0.9.0 decodes it as it is (only zero bytes are
    the default configuration, pkg/epp/config/loader/configloader.go LoadRawConfig), and ensureSchedulingLayer
    (pkg/epp/config/loader/defaults.go) builds profile default of the max-score-picker it adds; one warning says so."""
    result = check_epp_config(config)
    assert result.kind_of(NO_PLUGINS) == "warning" and NO_PLUGINS in result.warnings
    assert not [s for s in result.warnings if s.startswith("schedulingProfiles is empty")]
    assert not [s for s in result.problems if "plugins" in s]
    # With no apiVersion and kind the decoder takes llm-d.ai/v1alpha1 EndpointPickerConfig: it starts all the same.
    assert result.epp_starts is True and result.ok
    if config.get("apiVersion"):
        assert result.findings == [{"kind": "warning", "sentence": NO_PLUGINS}]


@pytest.mark.parametrize("header,missing", [
    ({}, "apiVersion and kind are"),
    ({"apiVersion": "llm-d.ai/v1alpha1"}, "kind is"),
    ({"kind": "EndpointPickerConfig", "apiVersion": ""}, "apiVersion is"),
])
def test_a_missing_header_is_a_warning_not_a_refusal(header, missing):
    """llm-d-router v0.9.0 decodes into an EndpointPickerConfig (pkg/epp/config/loader/configloader.go decodeRawConfig):
    a missing or empty apiVersion or kind takes the first group version its scheme registers it under (llm-d.ai/v1alpha1);
    run with its apimachinery (v0.35.6), such a config decodes. A wrong one does not."""
    config = copy.deepcopy(PRECISE)
    config.pop("apiVersion")
    config.pop("kind")
    config.update(header)
    result = check_epp_config(config, engine=ENGINE)
    assert result.epp_starts is True and result.rules == ["defaulted-header"], result.findings
    assert result.findings[0]["sentence"].startswith(missing + " not set: ")
    config.update(apiVersion="llm-d.ai/v1", kind="EndpointPickerConfig")
    assert check_epp_config(config, engine=ENGINE).epp_starts is False


@pytest.mark.parametrize("engine,sentence", [
    ({"block_size": "32"}, "engine.block_size is a string but must be an integer."),
    ({"block_size": 0}, "engine.block_size must be between 1 and 1048576 (got 0)."),
    ({"kv_events_port": 70000}, "engine.kv_events_port must be between 1 and 65535 (got 70000)."),
    ({"kv_events_port": True}, "engine.kv_events_port is a boolean but must be an integer."),
    ({"engine_type": "trtllm"}, "engine.engine_type is 'trtllm' but must be vllm or sglang."),
    ({"kv_events_enabled": "no"}, "engine.kv_events_enabled is a string but must be a boolean."),
    ({"colour": 1}, "engine.colour is not an engine setting this check knows (block_size, enable_scale_out, engine_type, hash_seed, "
                    "kv_events_enabled, kv_events_port, topic)."),
    (["x"], "engine must be a mapping of the engines' settings (got a list)."),
])
def test_engine_facts_are_checked(engine, sentence):
    assert sentence in check_epp_config(PRECISE, engine=engine).problems


def test_unknown_router_version_and_mode():
    assert check_epp_config(PRECISE, router_version="v0.8.0").problems == [
        "router_version 'v0.8.0' is not one this collection encodes (v0.9.0)."]
    assert "mode is 'fast' but must be precise or approximate." in check_epp_config(PRECISE, mode="fast").problems


@pytest.mark.parametrize("ptype,params,sentence", [
    # Config.validate in llm-d/llm-d-router@v0.9.0:pkg/epp/framework/plugins/scheduling/filter/prefixcacheaffinity/plugin.go
    ("prefix-cache-affinity-filter", {"explorationProbability": 1.5},
     "Plugin p (prefix-cache-affinity-filter) parameter explorationProbability must be at most 1 (got 1.5)."),
    ("prefix-cache-affinity-filter", {"ttftSource": "guess"},
     "Plugin p (prefix-cache-affinity-filter) parameter ttftSource is 'guess' but must be one of latencyPredictor, prefillThroughput."),
    # Config.validate in llm-d/llm-d-router@v0.9.0:pkg/epp/framework/plugins/flowcontrol/fairness/program-aware/plugin.go
    ("program-aware-fairness", {"lasDecayFactor": 0}, "Plugin p (program-aware-fairness) parameter lasDecayFactor must be greater than 0 (got 0)."),
    ("program-aware-fairness", {"evictionSweepSeconds": -1},
     "Plugin p (program-aware-fairness) parameter evictionSweepSeconds must be greater than 0 (got -1)."),
    # NewDataProducer in .../requestcontrol/dataproducer/approximateprefix/plugin.go
    ("approx-prefix-cache-producer", {"maxPrefixTokensToMatch": -1},
     "Plugin p (approx-prefix-cache-producer) parameter maxPrefixTokensToMatch must be at least 0 (got -1)."),
    # PdProfileHandlerFactory: primaryPort 0 means unset, else 1..65535
    ("data-parallel-profile-handler", {"primaryPort": -8000},
     "Plugin p (data-parallel-profile-handler) parameter primaryPort must be at least 0 (got -8000)."),
])
def test_ranges_the_factories_enforce(ptype, params, sentence):
    assert sentence in check_epp_config(_alone(ptype, params)).problems


@pytest.mark.parametrize("ptype,params", [
    ("no-hit-lru-scorer", {"lruSize": -1}),              # NewNoHitLRU falls back to its default
    ("load-aware-scorer", {"threshold": -3}),            # NewLoadAware falls back to its default
    ("max-score-picker", {"maxNumOfEndpoints": 0}),      # NewMaxScorePicker falls back to its default
    ("static-usage-limit-policy", {"threshold": -1.0}),  # used as given
])
def test_values_the_epp_accepts_are_not_refused(ptype, params):
    assert _parameter_problems(check_epp_config(_alone(ptype, params))) == []


# --- what the real EPP v0.9.0 does: epp_starts and the kind of each finding ----------------------------------------------
# Measured with the EPP built at llm-d/llm-d-router@v0.9.0 (REFERENCE.md part R4, issue 22) and read at the sources that
# the BEHAVIOUR table of _epp_plugins cites. Each case: the config, epp_starts, the finding's kind, its key words, and
# whether the check fails.

FACTS = [
    # LoadRawConfig: no bytes -> the default configuration (pkg/epp/config/loader/configloader.go).
    ("empty-file", None, "", True, "warning", ("is empty", "default configuration", "starts"), False),
    # buildSchedulerConfig uses the weight as given (pkg/epp/config/loader/configloader.go).
    ("negative-weight", lambda c: c["schedulingProfiles"][0]["plugins"][2].update(weight=-1), None, True, "warning",
     ("kv-cache-utilization-scorer the weight -1", "accepts a negative weight as it is"), False),
    # kvevents.(*Pool).AddTask: h.Sum32() % uint32(p.concurrency) (github.com/llm-d/llm-d-kv-cache@v0.9.0:pkg/kvevents/pool.go).
    ("zero-concurrency", lambda c: producer_params(c)["kvEventsConfig"].update(concurrency=0), None, True, "broken",
     ("starts, then panics", "integer divide by zero", "KV-event pool", "on the first KV event"), True),
    # CreateMissingDataProducers builds the default token-producer with nil parameters: the estimate backend.
    ("no-token-producer", lambda c: c["plugins"].pop(0), None, True, "broken",
     ("creates one itself", "estimating backend", "never matches an engine block"), True),
    ("estimating-token-producer", lambda c: plugin(c, "token-producer").update(parameters={"estimate": {}}), None, True, "broken",
     ("only estimates pseudo-tokens", "the EPP starts but never matches an engine block"), True),
    # Subscribers are created only by Extract, which only a listing endpoint-notification-source calls (extractor.go).
    ("no-extractor-listing", lambda c: c["dataLayer"]["sources"][0].update(extractors=[]), None, True, "broken",
     ("discovers pods", "no endpoint-notification-source", "never subscribes to an engine"), True),
    # buildSpeculativeCache parses speculativeTTL only with speculativeIndexing on (prerequest.go).
    ("speculative-ttl-while-off", lambda c: producer_params(c).update(speculativeTTL="soon"), None, True, "warning",
     ("speculativeTTL is 'soon'", "speculativeIndexing is off", "never parses it"), False),
    ("speculative-ttl-while-on", lambda c: producer_params(c).update(speculativeTTL="soon", speculativeIndexing=True), None, False,
     "refused", ("speculativeTTL is 'soon'", "refuses it (invalid speculativeTTL)", "does not start"), True),
    # Refused today, refused still: strict decoding, registration, factories and the start-up panics.
    ("unknown-field", lambda c: producer_params(c)["kvEventsConfig"]["podDiscoveryConfig"].update(replaySocketPort=5558), None,
     False, "refused", ("replaySocketPort is not a field", "DisallowUnknownFields", "does not start"), True),
    ("unregistered-type", lambda c: c["plugins"].append({"type": "burst-prefix-cache-producer"}), None, False, "refused",
     ("is not registered in llm-d-router v0.9.0", "does not start"), True),
    ("unknown-feature-gate", lambda c: c.update(featureGates=["prefixCache"]), None, False, "refused",
     ("Feature gate prefixCache", "does not start"), True),
    ("negative-concurrency", lambda c: producer_params(c)["kvEventsConfig"].update(concurrency=-1), None, False, "refused",
     ("concurrency to -1", "panics while creating the KV-event pool", "does not start"), True),
    ("kv-events-config-null", lambda c: producer_params(c).update(kvEventsConfig=None), None, False, "refused",
     ("kvEventsConfig to null", "crashes"), True),
    ("tokenizers-pool", lambda c: producer_params(c).update(indexerConfig={"tokenizersPoolConfig": {}}), None, False, "refused",
     ("tokenizersPoolConfig", "rejects"), True),
    ("comment-only-file", None, "# nothing here\n", False, "refused", ("is not a mapping",), True),
]


def _fact_result(fn, text):
    if fn is None:
        import yaml
        return check_epp_config(yaml.safe_load(text), engine=ENGINE, raw_text=text)
    return check_epp_config(mutate(PRECISE, fn), engine=ENGINE)


@pytest.mark.parametrize("name,fn,text,starts,kind,words,fails", FACTS, ids=[f[0] for f in FACTS])
def test_what_the_epp_does(name, fn, text, starts, kind, words, fails):
    result = _fact_result(fn, text)
    assert result.epp_starts is starts, (name, result.findings)
    found = [f for f in result.findings if all(word in f["sentence"] for word in words)]
    assert len(found) == 1, (name, result.findings)
    assert found[0]["kind"] == kind, (name, found)
    assert (not result.ok) is fails, (name, result.problems)
    assert (found[0]["sentence"] in result.warnings) is (kind == "warning")
    assert result.as_dict()["epp_starts"] is starts and found[0] in result.as_dict()["findings"]


def test_an_empty_config_is_the_default_one_checked():
    result = check_epp_config(None, raw_text="")
    assert result.epp_starts is True and result.ok
    assert [f["kind"] for f in result.findings] == ["warning"]
    assert result.summary["plugins"] == ["core-metrics-extractor", "kv-cache-utilization-scorer", "metrics-data-source",
                                         "prefix-cache-scorer", "queue-scorer"]
    # The default configuration is no precise router: asking for one fails, as broken (the EPP starts).
    precise = check_epp_config(None, mode="precise", raw_text="")
    assert precise.epp_starts is True and not precise.ok
    assert precise.kind_of("Mode precise needs a precise-prefix-cache-producer plugin, and none is declared.") == "broken"
    # Only zero bytes are the empty file: whitespace is decoded (and refused), as len(configBytes) != 0 in LoadRawConfig.
    assert check_epp_config(None, raw_text=" \n").epp_starts is False


def test_every_good_config_starts_with_no_finding():
    for config in (PRECISE, APPROXIMATE, CENTRAL, DISAGG):
        result = check_epp_config(config, engine=ENGINE)
        assert result.epp_starts is True and result.findings == []


def test_deprecations_are_warnings_and_engine_arguments_are_input():
    result = check_epp_config(mutate(PRECISE, lambda c: plugin(c, "token-producer").update(type="tokenizer")), engine=ENGINE)
    assert result.findings == [{"kind": "warning", "sentence": "Plugin type tokenizer is deprecated; use token-producer."}]
    assert result.epp_starts is True and result.ok
    bad_engine = check_epp_config(PRECISE, engine={"block_size": 0})
    assert [f["kind"] for f in bad_engine.findings] == ["input"] and bad_engine.epp_starts is True and not bad_engine.ok
    unknown = check_epp_config(PRECISE, router_version="v0.8.0")
    assert unknown.epp_starts is None and [f["kind"] for f in unknown.findings] == ["input"]


def test_every_behaviour_rule_is_a_known_kind_with_a_pinned_source():
    from ansible_collections.inference_cache.substrate.plugins.module_utils.epp.llm_d import BEHAVIOUR, KINDS
    for rule, (kind, sentence, source) in BEHAVIOUR["v0.9.0"].items():
        assert kind in KINDS, rule
        assert sentence.endswith("."), rule
        assert source.startswith(("llm-d/llm-d-router@v0.9.0:", "github.com/llm-d/llm-d-kv-cache@v0.9.0:")), rule


# --- the rule table: every rule fires on a config made for it, with the kind the table gives ---------------------------
def _append(key, value):
    return lambda c: c[key].append(value)


def _entry(config, profile=0):
    return config["schedulingProfiles"][profile]["plugins"]


def _pd_handler(c):
    c["plugins"].append({"type": "pd-profile-handler", "parameters": {"deciderPluginName": "queue-scorer"}})


def _later_decider(c):
    c["plugins"].insert(0, {"type": "pd-profile-handler"})
    c["plugins"].append({"type": "prefix-based-pd-decider"})


# rule name -> (base config, mutation, engine, mode)
RULE_CASES = {
    "top-level-unknown-field": (PRECISE, lambda c: c.update(bogus=1), ENGINE, None),
    "top-level-deprecated-field": (PRECISE, lambda c: c.update(parser={"pluginRef": "openai-parser"}), ENGINE, None),
    "top-level-field": (PRECISE, lambda c: c.update(featureGates="dataLayer"), ENGINE, None),
    "deprecated-api-version": (PRECISE, lambda c: c.update(apiVersion="inference.networking.x-k8s.io/v1alpha1"), ENGINE, None),
    "api-version": (PRECISE, lambda c: c.update(apiVersion="v2"), ENGINE, None),
    "kind": (PRECISE, lambda c: c.update(kind="Config"), ENGINE, None),
    "defaulted-header": (PRECISE, lambda c: c.pop("apiVersion"), ENGINE, None),
    "unknown-feature-gate": (PRECISE, lambda c: c.update(featureGates=["prefixCache"]), ENGINE, None),
    "no-plugins": (PRECISE, lambda c: c.update(plugins=[]), ENGINE, None),
    "plugin-without-type": (PRECISE, _append("plugins", {"name": "x"}), ENGINE, None),
    "duplicate-plugin-name": (PRECISE, _append("plugins", {"type": "queue-scorer"}), ENGINE, None),
    "unregistered-plugin-type": (PRECISE, _append("plugins", {"type": "burst-prefix-cache-producer"}), ENGINE, None),
    "deprecated-plugin-type": (PRECISE, lambda c: plugin(c, "token-producer").update(type="tokenizer"), ENGINE, None),
    "ignored-parameters": (PRECISE, lambda c: plugin(c, "queue-scorer").update(parameters={"a": 1}), ENGINE, None),
    "missing-parameters": (PRECISE, _append("plugins", {"type": "k8s-notification-source"}), ENGINE, None),
    "parameters-not-a-mapping": (PRECISE, lambda c: plugin(c, "prefix-cache-scorer").update(parameters=[1]), ENGINE, None),
    "flat-parameters": (DISAGG, lambda c: plugin(c, "disagg-profile-handler").update(parameters={"decodeProfile": "decode"}), None, None),
    "unknown-parameter": (PRECISE, lambda c: producer_params(c).update(bogus=1), ENGINE, None),
    "deprecated-parameter": (PRECISE, lambda c: producer_params(c)["tokenProcessorConfig"].update(blockSize=32), ENGINE, None),
    "parameter-case": (PRECISE, lambda c: producer_params(c).update(speculativeindexing=False), ENGINE, None),
    "socket-port-range": (PRECISE, lambda c: producer_params(c)["kvEventsConfig"]["podDiscoveryConfig"].update(socketPort=0), None, None),
    "speculative-ttl-invalid": (PRECISE, lambda c: producer_params(c).update(speculativeTTL="x", speculativeIndexing=True), ENGINE, None),
    "speculative-ttl-unused": (PRECISE, lambda c: producer_params(c).update(speculativeTTL="x"), ENGINE, None),
    "parameter": (PRECISE, lambda c: producer_params(c).update(speculativeIndexing="yes"), ENGINE, None),
    "no-scheduling-profiles": (PRECISE, lambda c: c.update(schedulingProfiles=[]), ENGINE, None),
    "profile-not-a-mapping": (PRECISE, _append("schedulingProfiles", "x"), ENGINE, None),
    "profile-without-name": (PRECISE, _append("schedulingProfiles", {"plugins": []}), ENGINE, None),
    "duplicate-profile": (PRECISE, _append("schedulingProfiles", {"name": "default", "plugins": []}), ENGINE, None),
    "profile-entry-without-ref": (PRECISE, lambda c: _entry(c).append({"weight": 1}), ENGINE, None),
    "undeclared-profile-plugin": (PRECISE, lambda c: _entry(c).append({"pluginRef": "nope"}), ENGINE, None),
    "weight-not-a-number": (PRECISE, lambda c: _entry(c)[1].update(weight="2"), ENGINE, None),
    "negative-weight": (PRECISE, lambda c: _entry(c)[1].update(weight=-1), ENGINE, None),
    "several-pickers": (PRECISE, lambda c: [c["plugins"].append({"type": "random-picker"}),
                                            _entry(c).append({"pluginRef": "random-picker"})], ENGINE, None),
    "several-profile-handlers": (PRECISE, _append("plugins", {"type": "disagg-profile-handler"}), ENGINE, None),
    "no-profile-handler": (DISAGG, lambda c: c["plugins"].remove(plugin(c, "disagg-profile-handler")), None, None),
    "single-handler-several-profiles": (DISAGG, lambda c: plugin(c, "disagg-profile-handler").update(
        type="single-profile-handler", parameters=None), None, None),
    "source-without-ref": (PRECISE, lambda c: c["dataLayer"]["sources"].append({}), ENGINE, None),
    "undeclared-source": (PRECISE, lambda c: c["dataLayer"]["sources"].append({"pluginRef": "nope"}), ENGINE, None),
    "not-a-data-source": (PRECISE, lambda c: c["dataLayer"]["sources"].append({"pluginRef": "queue-scorer"}), ENGINE, None),
    "extractor-without-ref": (PRECISE, lambda c: c["dataLayer"]["sources"][0]["extractors"].append({}), ENGINE, None),
    "undeclared-extractor": (PRECISE, lambda c: c["dataLayer"]["sources"][0]["extractors"].append({"pluginRef": "nope"}), ENGINE, None),
    "undeclared-discovery": (PRECISE, lambda c: c["dataLayer"].update(discovery={"pluginRef": "nope"}), ENGINE, None),
    "not-a-discovery-plugin": (PRECISE, lambda c: c["dataLayer"].update(discovery={"pluginRef": "queue-scorer"}), ENGINE, None),
    "not-a-parser": (PRECISE, lambda c: c.update(requestHandler={"parsers": [{"pluginRef": "queue-scorer"}]}), ENGINE, None),
    "unknown-parser": (PRECISE, lambda c: c.update(requestHandler={"parsers": [{"pluginRef": "nope-parser"}]}), ENGINE, None),
    "undeclared-saturation-detector": (PRECISE, lambda c: c.update(flowControl={"saturationDetector": {"pluginRef": "nope"}}), ENGINE, None),
    "not-a-saturation-detector": (PRECISE, lambda c: c.update(flowControl={"saturationDetector": {"pluginRef": "queue-scorer"}}),
                                  ENGINE, None),
    "undeclared-flow-control-policy": (PRECISE, lambda c: c.update(featureGates=["flowControl"],
                                                                   flowControl={"usageLimitPolicyPluginRef": "nope"}), ENGINE, None),
    "undeclared-producer": (PRECISE, lambda c: plugin(c, "prefix-cache-scorer")["parameters"].update(prefixMatchInfoProducerName="nope"),
                            ENGINE, None),
    "producer-of-another-kind": (PRECISE, lambda c: plugin(c, "prefix-cache-scorer")["parameters"].update(
        prefixMatchInfoProducerName="queue-scorer"), ENGINE, None),
    "undeclared-decider": (DISAGG, lambda c: plugin(c, "disagg-profile-handler")["parameters"]["deciders"].update(prefill="nope"), None, None),
    "not-a-decider": (PRECISE, _pd_handler, ENGINE, None),
    "decider-declared-later": (PRECISE, _later_decider, ENGINE, None),
    "default-token-producer": (PRECISE, lambda c: c["plugins"].remove(plugin(c, "token-producer")), ENGINE, None),
    "unread-producer": (PRECISE, lambda c: plugin(c, "prefix-cache-scorer").pop("parameters"), ENGINE, None),
    "no-kv-events": (PRECISE, lambda c: None, dict(ENGINE, kv_events_enabled=False), None),
    "null-indexer-config": (PRECISE, lambda c: producer_params(c).update(indexerConfig=None), ENGINE, None),
    "kv-events-config-null": (PRECISE, lambda c: producer_params(c).update(kvEventsConfig=None), ENGINE, None),
    "zero-concurrency": (PRECISE, lambda c: producer_params(c)["kvEventsConfig"].update(concurrency=0), ENGINE, None),
    "negative-concurrency": (PRECISE, lambda c: producer_params(c)["kvEventsConfig"].update(concurrency=-1), ENGINE, None),
    "tokenizers-pool": (PRECISE, lambda c: producer_params(c).update(indexerConfig={"tokenizersPoolConfig": {}}), ENGINE, None),
    "block-size-differs": (PRECISE, lambda c: None, dict(ENGINE, block_size=16), None),
    "hash-seed-differs": (PRECISE, lambda c: None, dict(ENGINE, hash_seed="7"), None),
    "topic-filter": (PRECISE, lambda c: None, dict(ENGINE, topic="other@x"), None),
    "engine-type-ignored": (PRECISE, lambda c: None, dict(ENGINE, engine_type="sglang"), None),
    "pod-discovery-null": (PRECISE, lambda c: producer_params(c)["kvEventsConfig"].update(podDiscoveryConfig=None), ENGINE, None),
    "socket-port": (PRECISE, lambda c: None, dict(ENGINE, kv_events_port=5558), None),
    "no-notification-source": (PRECISE, lambda c: c.pop("dataLayer"), ENGINE, None),
    "estimating-token-producer": (PRECISE, lambda c: plugin(c, "token-producer").update(parameters={}), ENGINE, None),
    "token-producer-without-model": (PRECISE, lambda c: plugin(c, "token-producer")["parameters"].pop("modelName"), ENGINE, None),
    "several-token-backends": (PRECISE, lambda c: plugin(c, "token-producer")["parameters"].update(estimate={}), ENGINE, None),
    "render-needs-scale-out": (PRECISE, lambda c: None, dict(ENGINE, enable_scale_out=False), None),
    "precise-without-producer": (APPROXIMATE, lambda c: None, None, "precise"),
    "precise-without-scorer": (APPROXIMATE, lambda c: None, None, "precise"),
    "approximate-with-producer": (PRECISE, lambda c: None, ENGINE, "approximate"),
    "approximate-without-load-aware": (PRECISE, lambda c: None, ENGINE, "approximate"),
}
# Rules no config can fire at the pinned version: engine-type needs a router that honours engineType (SEMANTICS).
UNREACHABLE = {"engine-type"}


def test_every_rule_has_a_case_and_every_case_a_rule():
    from ansible_collections.inference_cache.substrate.plugins.module_utils.epp.config import RULES
    from ansible_collections.inference_cache.substrate.plugins.module_utils.epp.llm_d import SEMANTICS
    names = [rule.name for rule in RULES]
    assert len(names) == len(set(names)), "rule names are unique"
    assert set(names) == set(RULE_CASES) | UNREACHABLE
    assert SEMANTICS["v0.9.0"]["engine_type_honoured"] is False


@pytest.mark.parametrize("name", sorted(RULE_CASES))
def test_each_rule_fires_with_its_kind(name):
    from ansible_collections.inference_cache.substrate.plugins.module_utils.epp.config import RULES
    from ansible_collections.inference_cache.substrate.plugins.module_utils.epp.llm_d import BEHAVIOUR
    base, fn, engine, mode = RULE_CASES[name]
    result = check_epp_config(mutate(base, fn), engine=engine, mode=mode)
    assert name in result.rules, (name, result.findings)
    rule = [r for r in RULES if r.name == name][0]
    kind = BEHAVIOUR["v0.9.0"][rule.behaviour][0] if rule.behaviour else rule.kind
    finding = result.findings[result.rules.index(name)]
    assert finding["kind"] == kind and finding["sentence"].endswith("."), finding
    assert (finding["sentence"] in result.deprecations) is rule.deprecation
    assert name not in check_epp_config(copy.deepcopy(base), engine=ENGINE if base is PRECISE else None).rules


def test_every_behaviour_entry_is_a_rule_or_the_empty_config():
    from ansible_collections.inference_cache.substrate.plugins.module_utils.epp.config import RULES
    from ansible_collections.inference_cache.substrate.plugins.module_utils.epp.llm_d import BEHAVIOUR
    used = set(rule.behaviour for rule in RULES if rule.behaviour)
    assert used | {"empty-config"} == set(BEHAVIOUR["v0.9.0"])


def test_rule_sources_cite_the_pinned_releases():
    from ansible_collections.inference_cache.substrate.plugins.module_utils.epp.config import RULES
    for rule in RULES:
        assert rule.source is None or rule.source.startswith("llm-d/llm-d-router@v0.9.0:"), rule.name


@pytest.mark.parametrize("profiles", [None, []])
def test_no_scheduling_profiles_is_the_epps_default_profile(profiles):
    """The EPP v0.9.0 starts without schedulingProfiles (run here: it built profile default of every scorer, weight 1,
    with the picker declared and a single-profile-handler; pkg/epp/config/loader/defaults.go ensureSchedulingLayer)."""
    config = {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig",
              "plugins": [{"type": "load-aware-scorer"}, {"type": "random-picker"}]}
    if profiles is not None:
        config["schedulingProfiles"] = profiles
    result = check_epp_config(config)
    assert result.epp_starts is True and result.problems == []
    assert [f["kind"] for f in result.findings] == ["warning"]
    assert result.findings[0]["sentence"].startswith("schedulingProfiles is empty: the EPP builds one profile, default,")


def test_scheduling_profiles_of_another_type_are_refused():
    config = {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig", "plugins": [{"type": "load-aware-scorer"}],
              "schedulingProfiles": "default"}
    result = check_epp_config(config)
    assert result.epp_starts is False
    assert "EndpointPickerConfig field schedulingProfiles is a string but must be a list." in result.problems
