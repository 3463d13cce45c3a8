# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The v0.9.0 table pinned by hand: the registered plugin types and the parameter fields, as read at the tag.

These lists are written out here, not derived from the table, so a change to ``_epp_plugins`` that drifts from
llm-d/llm-d-router@v0.9.0 fails a test. Sources: the registrations in cmd/epp/runner/runner.go (registerInTreePlugins)
and each factory's parameter struct (the path in the table entry's ``source``).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.epp.llm_d import (
    CONFIG_SCHEMA, DEFAULT_ROUTER_VERSION, KV_CACHE_REF, PLUGINS, ROUTER_VERSIONS, allowed_fields, plugin_types)
from ansible_collections.inference_cache.substrate.plugins.module_utils.epp.schema import fields_at

# llm-d/llm-d-router@v0.9.0:cmd/epp/runner/runner.go, registerInTreePlugins (fwkplugin.Register / RegisterAsDefaultProducer).
V090_TYPES = sorted("""
label-selector-filter by-label-selector by-label encode-filter decode-filter prefill-filter session-affinity-filter
data-parallel-profile-handler load-aware-scorer session-affinity-scorer context-length-aware models-data-source
models-data-extractor prefix-cache-scorer max-score-picker random-picker weighted-random-picker single-profile-handler
disagg-headers-handler prefill-header-handler pd-profile-handler disagg-profile-handler always-disagg-pd-decider
prefix-based-pd-decider always-disagg-multimodal-decider kv-cache-utilization-scorer queue-scorer
running-requests-size-scorer lora-affinity-scorer token-load-scorer no-hit-lru-scorer active-request-scorer
precise-prefix-cache-scorer mm-embeddings-cache-scorer precise-prefix-cache-producer global-strict-fairness-policy
round-robin-fairness-policy program-aware-fairness fcfs-ordering-policy edf-ordering-policy slo-deadline-ordering-policy
static-usage-limit-policy approx-prefix-cache-producer inflight-load-producer mm-embeddings-cache-producer
predicted-latency-producer token-producer tokenizer session-id-producer latency-slo-admitter probabilistic-admitter
prefix-cache-affinity-filter slo-headroom-tier-filter latency-scorer header-based-testing-filter
destination-endpoint-served-verifier metrics-data-source core-metrics-extractor k8s-notification-source
endpoint-notification-source request-attribute-reporter anthropic-parser openai-parser vllmgrpc-parser vllmhttp-parser
passthrough-parser vertexai-parser concurrency-detector utilization-detector file-discovery agent-identity
""".split())

PPC = "precise-prefix-cache-producer"
FIELDS = [
    # requestcontrol/dataproducer/preciseprefixcache/producer.go PluginConfig
    (PPC, (), ["indexerConfig", "kvEventsConfig", "speculativeIndexing", "speculativeTTL", "tokenProcessorConfig"]),
    # llm-d-kv-cache pkg/kvcache/kvblock/token_processor.go TokenProcessorConfig
    (PPC, ("tokenProcessorConfig",), ["blockSize", "blockSizeTokens", "hashSeed"]),
    # llm-d-kv-cache pkg/kvevents/pool.go Config and PodDiscoveryConfig (no replaySocketPort before router v0.10.0)
    (PPC, ("kvEventsConfig",), ["concurrency", "discoverPods", "engineType", "podDiscoveryConfig", "topicFilter", "zmqEndpoint"]),
    (PPC, ("kvEventsConfig", "podDiscoveryConfig"), ["podLabelSelector", "podNamespace", "socketPort"]),
    # llm-d-kv-cache pkg/kvcache/indexer.go Config (KVBlockScorerConfig has no json tag) and kvblock/index.go IndexConfig
    (PPC, ("indexerConfig",), ["KVBlockScorerConfig", "kvBlockIndexConfig", "kvCacheBackendConfigs", "tokenizersPoolConfig"]),
    (PPC, ("indexerConfig", "kvBlockIndexConfig"),
     ["costAwareMemoryConfig", "enableMetrics", "inMemoryConfig", "metricsLoggingInterval", "redisConfig", "valkeyConfig"]),
    (PPC, ("indexerConfig", "kvBlockIndexConfig", "inMemoryConfig"), ["podCacheSize", "size"]),
    ("precise-prefix-cache-scorer", (), ["indexerConfig", "kvEventsConfig", "speculativeIndexing", "speculativeTTL", "tokenProcessorConfig"]),
    # requestcontrol/dataproducer/tokenizer/tokenizer.go tokenizerPluginConfig, vllm_http.go vllmConfig
    ("token-producer", (), ["estimate", "modelName", "udsTokenizerConfig", "vllm"]),
    ("token-producer", ("vllm",), ["mmTimeout", "timeout", "url"]),
    ("token-producer", ("estimate", "image"), ["defaultResolution", "dynamic", "mode", "static"]),
    # scheduling/scorer/prefix/plugin.go Config
    ("prefix-cache-scorer", (), ["prefixMatchInfoProducerName"]),
    # requestcontrol/dataproducer/approximateprefix/types.go config
    ("approx-prefix-cache-producer", (),
     ["autoTune", "blockSize", "blockSizeTokens", "lruCapacityPerServer", "maxPrefixBlocksToMatch", "maxPrefixTokensToMatch"]),
    # scheduling/scorer/loadaware/load_aware.go loadAwareParameters
    ("load-aware-scorer", (), ["threshold"]),
    ("kv-cache-utilization-scorer", (), []),
    ("queue-scorer", (), []),
    ("decode-filter", (), []),
    ("prefill-filter", (), []),
    # scheduling/profilehandler/disagg/pd_profile_handler.go pdProfileHandlerParameters
    ("pd-profile-handler", (), ["deciderPluginName", "decodeProfile", "prefillProfile", "prefixMatchInfoProducerName",
                                "prefixPluginName", "prefixPluginType", "primaryPort"]),
    # scheduling/profilehandler/disagg/disagg_profile_handler.go disaggProfileHandlerParameters
    ("disagg-profile-handler", (), ["deciders", "profiles"]),
    ("disagg-profile-handler", ("profiles",), ["decode", "encode", "prefill"]),
    ("disagg-profile-handler", ("deciders",), ["encode", "prefill"]),
    ("prefix-based-pd-decider", (), ["nonCachedTokens"]),
    ("always-disagg-pd-decider", (), []),
    # scheduling/picker/common.go PickerParameters
    ("max-score-picker", (), ["maxNumOfEndpoints"]),
    ("endpoint-notification-source", (), []),
    # datalayer/source/metrics/datasource.go metricsDatasourceParams
    ("metrics-data-source", (), ["insecureSkipVerify", "path", "scheme"]),
    # datalayer/extractor/metrics/factories.go modelServerExtractorParams
    ("core-metrics-extractor", (), ["defaultEngine", "engineConfigs", "engineLabelKey"]),
    ("single-profile-handler", (), []),
]


def test_the_pinned_version_is_the_default():
    assert DEFAULT_ROUTER_VERSION == "v0.9.0" and DEFAULT_ROUTER_VERSION in ROUTER_VERSIONS


def test_v090_registers_exactly_these_types():
    assert len(V090_TYPES) == 71
    assert plugin_types("v0.9.0") == V090_TYPES
    for later in ("burst-prefix-cache-producer", "endpoint-attribute-scorer"):
        assert later not in plugin_types("v0.9.0")


@pytest.mark.parametrize("ptype,path,fields", FIELDS, ids=["%s:%s" % (f[0], ".".join(f[1]) or "-") for f in FIELDS])
def test_v090_parameter_fields(ptype, path, fields):
    assert allowed_fields(ptype, path) == fields


def test_top_level_fields():
    # llm-d/llm-d-router@v0.9.0:apix/config/v1alpha1/endpointpickerconfig_types.go EndpointPickerConfig (+ inline TypeMeta)
    assert fields_at(CONFIG_SCHEMA["v0.9.0"]) == ["apiVersion", "dataLayer", "featureGates", "flowControl", "kind", "parser", "plugins",
                                                  "requestHandler", "saturationDetector", "schedulingProfiles"]
    assert fields_at(CONFIG_SCHEMA["v0.9.0"], ("dataLayer",)) == ["discovery", "injectDefaults", "sources"]


def test_allowed_fields_refuses_what_does_not_exist():
    with pytest.raises(KeyError):
        allowed_fields("burst-prefix-cache-producer")
    with pytest.raises(KeyError):
        allowed_fields(PPC, ("kvEventsConfig", "replay"))
    with pytest.raises(KeyError):
        allowed_fields("queue-scorer", ("x",))


def _structs(node):
    if node["t"] in ("list", "map"):
        yield from _structs(node["of"])
    elif node["t"] == "obj":
        yield node
        for sub in node["fields"].values():
            yield from _structs(sub)


@pytest.mark.parametrize("ptype", V090_TYPES)
def test_every_entry_cites_the_tag(ptype):
    spec = PLUGINS["v0.9.0"][ptype]
    assert spec["source"].startswith("llm-d/llm-d-router@v0.9.0:pkg/epp/framework/plugins/")
    for schema in (spec["params"], spec["legacy_params"]):
        for struct in _structs(schema) if schema else ():
            assert struct["source"].startswith(("llm-d/llm-d-router@v0.9.0:", KV_CACHE_REF + ":", "k8s.io/apimachinery")), struct["source"]
