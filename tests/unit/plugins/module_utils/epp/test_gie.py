# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""router_impl gie: the Gateway API Inference Extension EPP v1.4.0 table, its rules, and the llm-d/GIE cross cases.

The facts asserted by hand were read at kubernetes-sigs/gateway-api-inference-extension@v1.4.0 (paths in each test)
and each start or refusal in RUNS was seen with the GIE EPP v1.4.0 built at that tag (cmd/epp), started on the config
with a stand-in Kubernetes API server (epp/gie.py's docstring): "starts" is that it reached "Controller manager
starting" and "gRPC server listening"; the message is what it logged before exiting. Also here: the citations of every
table name tags, not commits, and text that is not YAML is refused.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import copy
import re

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.epp import gie
from ansible_collections.inference_cache.substrate.plugins.module_utils.epp import llm_d as llmd
from ansible_collections.inference_cache.substrate.plugins.module_utils.epp.config import (
    ALL_RULES, GIE_RULES, RULES, check_epp_config, check_epp_text)
from ansible_collections.inference_cache.substrate.plugins.module_utils.epp.schema import fields_at
from ansible_collections.inference_cache.substrate.tests.unit.plugins.module_utils.epp.test_config import (
    APPROXIMATE, PRECISE, _example, _leaves, _wrong)

V = "v1.4.0"
API = "inference.networking.x-k8s.io/v1alpha1"
TAG = "kubernetes-sigs/gateway-api-inference-extension@v1.4.0:"

# cmd/epp/runner/runner.go registerInTreePlugins at v1.4.0 (fwkplugin.Register), written out by hand.
GIE_TYPES = sorted("""
prefix-cache-scorer max-score-picker random-picker weighted-random-picker single-profile-handler kv-cache-utilization-scorer
queue-scorer running-requests-size-scorer lora-affinity-scorer global-strict-fairness-policy round-robin-fairness-policy
fcfs-ordering-policy edf-ordering-policy predicted-latency-scorer header-based-testing-filter destination-endpoint-served-verifier
metrics-data-source model-server-protocol-metrics k8s-notification-source request-attribute-reporter
""".split())

FIELDS = [
    # pkg/epp/framework/plugins/scheduling/scorer/prefix/plugin.go Config
    ("prefix-cache-scorer", (), ["autoTune", "blockSize", "blockSizeTokens", "lruCapacityPerServer", "maxPrefixBlocksToMatch"]),
    # .../scheduling/picker/common.go pickerParameters
    ("max-score-picker", (), ["maxNumOfEndpoints"]),
    ("random-picker", (), ["maxNumOfEndpoints"]),
    # .../datalayer/source/metrics/datasource.go metricsDatasourceParams
    ("metrics-data-source", (), ["insecureSkipVerify", "path", "scheme"]),
    # .../datalayer/extractor/metrics/factories.go modelServerExtractorParams, engineConfigParams
    ("model-server-protocol-metrics", (), ["defaultEngine", "engineConfigs", "engineLabelKey"]),
    ("model-server-protocol-metrics", ("engineConfigs",),
     ["cacheInfoSpec", "kvUsageSpec", "loraSpec", "name", "queuedRequestsSpec", "runningRequestsSpec"]),
    # .../datalayer/source/notifications/factory.go notificationSourceParams
    ("k8s-notification-source", (), ["group", "kind", "version"]),
    # .../requestcontrol/requestattributereporter/plugin.go Config, Attribute, AttributeKey
    ("request-attribute-reporter", (), ["attributes"]),
    ("request-attribute-reporter", ("attributes",), ["condition", "expression", "key"]),
    ("request-attribute-reporter", ("attributes", "key"), ["name", "namespace"]),
    # .../scheduling/scorer/predictedlatency/scorer.go Config
    ("predicted-latency-scorer", (), [
        "affinityGateTau", "affinityGateTauGlobal", "compositeKVWeight", "compositePrefixWeight", "compositeQueueWeight",
        "contextTTL", "endpointRoleLabel", "epsilonExploreNeg", "epsilonExploreSticky", "headroomSelectionStrategy",
        "headroomTPOTWeight", "headroomTTFTWeight", "maxSampledTokens", "negHeadroomTPOTWeight", "negHeadroomTTFTWeight",
        "samplingMean", "selectionMode", "sloBufferFactor", "streamingMode"]),
]
NO_PARAMS = ["single-profile-handler", "kv-cache-utilization-scorer", "queue-scorer", "running-requests-size-scorer",
             "lora-affinity-scorer", "global-strict-fairness-policy", "round-robin-fairness-policy", "fcfs-ordering-policy",
             "edf-ordering-policy", "header-based-testing-filter", "destination-endpoint-served-verifier"]


def test_gie_registers_exactly_these_types():
    assert len(GIE_TYPES) == 20
    assert sorted(gie.PLUGINS[V]) == GIE_TYPES
    assert gie.FEATURE_GATES[V] == frozenset(["dataLayer", "flowControl", "prepareDataPlugins"])


@pytest.mark.parametrize("ptype,path,fields", FIELDS, ids=["%s:%s" % (f[0], ".".join(f[1]) or "-") for f in FIELDS])
def test_gie_parameter_fields(ptype, path, fields):
    assert fields_at(gie.PLUGINS[V][ptype]["params"], path) == fields


@pytest.mark.parametrize("ptype", NO_PARAMS)
def test_gie_types_without_parameters(ptype):
    assert gie.PLUGINS[V][ptype]["params"] is None


def test_gie_top_level_fields():
    # apix/config/v1alpha1/endpointpickerconfig_types.go EndpointPickerConfig (+ inline TypeMeta)
    schema = gie.CONFIG_SCHEMA[V]
    assert fields_at(schema) == ["apiVersion", "data", "featureGates", "flowControl", "kind", "plugins", "saturationDetector",
                                 "schedulingProfiles"]
    assert fields_at(schema, ("saturationDetector",)) == ["kvCacheUtilThreshold", "metricsStalenessThreshold", "queueDepthThreshold"]
    assert fields_at(schema, ("flowControl",)) == ["defaultPriorityBand", "defaultRequestTTL", "maxBytes", "priorityBands"]
    assert fields_at(schema, ("flowControl", "priorityBands")) == ["fairnessPolicyRef", "maxBytes", "orderingPolicyRef", "priority"]
    assert fields_at(schema, ("data", "sources")) == ["extractors", "pluginRef"]


def _structs(node):
    if node["t"] in ("list", "map"):
        yield from _structs(node["of"])
    elif node["t"] == "obj":
        yield node
        for sub in node["fields"].values():
            yield from _structs(sub)


@pytest.mark.parametrize("ptype", GIE_TYPES)
def test_every_gie_entry_cites_the_tag(ptype):
    spec = gie.PLUGINS[V][ptype]
    assert spec["source"].startswith(TAG + "pkg/epp/"), spec["source"]
    for struct in _structs(spec["params"]) if spec["params"] else ():
        assert struct["source"].startswith(TAG), struct["source"]


# --- what the GIE EPP v1.4.0 did with each config (run at the pin) -----------------------------------------------------

def cfg(**fields):
    config = {"apiVersion": API, "kind": "EndpointPickerConfig"}
    config.update(fields)
    return config


def scorers(*names):
    return [{"type": name} for name in names]


def profile(*entries, **options):
    plugins = [dict(pluginRef=ref, **({"weight": w} if w is not None else {})) for ref, w in entries]
    return [{"name": options.get("name", "default"), "plugins": plugins}]


# The router role's render for router_impl gie (its shape: three scorers, a picker, the handler, one weighted profile).
ROLE = cfg(plugins=scorers("queue-scorer", "kv-cache-utilization-scorer") + [
    {"type": "prefix-cache-scorer", "parameters": {"blockSizeTokens": 16, "maxPrefixBlocksToMatch": 256, "lruCapacityPerServer": 31250}},
    {"type": "max-score-picker"}, {"type": "single-profile-handler"}],
    schedulingProfiles=profile(("queue-scorer", 1), ("kv-cache-utilization-scorer", 1), ("prefix-cache-scorer", 2), ("max-score-picker", None)))
METRICS = [{"type": "metrics-data-source"}, {"type": "model-server-protocol-metrics"}]
METRICS_DATA = {"sources": [{"pluginRef": "metrics-data-source", "extractors": [{"pluginRef": "model-server-protocol-metrics"}]}]}
LLMD_OLD_API = dict(copy.deepcopy(PRECISE), apiVersion=API)
del LLMD_OLD_API["dataLayer"]
LLMD_OLD_API["plugins"] = [p for p in LLMD_OLD_API["plugins"] if p["type"] != "endpoint-notification-source"]


def NOTIFY(params):  # pylint: disable=invalid-name
    return {"type": "k8s-notification-source", "parameters": params}


def ENGINES(params):  # pylint: disable=invalid-name
    """The role's config with the data layer and a metrics extractor of these parameters."""
    return dict(copy.deepcopy(ROLE), featureGates=["dataLayer"], data=METRICS_DATA,
                plugins=ROLE["plugins"] + [METRICS[0], dict(METRICS[1], parameters=params)])


# (case, config or YAML text, the EPP started, the finding (kind, words) that says why, or None for no refused/broken one).
# The log lines quoted are the binary's.
RUNS = [
    ("empty-file", "", True, ("warning", "default configuration")),   # "A configuration wasn't specified. A default one is being used."
    ("role", ROLE, True, None),
    # The role's render for SGLang engines: the dataLayer gate, a metrics source and the extractor with defaultEngine sglang.
    ("role-sglang", dict(copy.deepcopy(ROLE), featureGates=["dataLayer"], data=METRICS_DATA,
                         plugins=ROLE["plugins"] + [METRICS[0], dict(METRICS[1], parameters={"defaultEngine": "sglang"})]), True, None),
    ("no-picker-no-handler", cfg(plugins=scorers("queue-scorer", "prefix-cache-scorer"),
                                 schedulingProfiles=profile(("queue-scorer", 1), ("prefix-cache-scorer", 2))), True, None),
    ("no-profiles", cfg(plugins=scorers("queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer")), True,
     ("warning", "schedulingProfiles is empty")),
    ("empty-plugins", cfg(plugins=[]), True, ("warning", "plugins is empty; GIE v1.4.0 does not then use its default")),
    ("header-only", cfg(), True, ("warning", "plugins is empty")),
    ("no-api-version-no-kind", {"plugins": scorers("queue-scorer")}, True, None),
    # no kind "EndpointPickerConfig" is registered for version "llm-d.ai/v1alpha1" in scheme
    ("llm-d-api-version", dict(cfg(plugins=scorers("queue-scorer")), apiVersion="llm-d.ai/v1alpha1"), False,
     ("refused", "apiVersion llm-d.ai/v1alpha1 is llm-d-router's")),
    ("wrong-kind", cfg(kind="Config", plugins=scorers("queue-scorer")), False, ("refused", "kind is 'Config'")),
    # strict decoding error: unknown field "dataLayer" / "Plugins"
    ("dataLayer-field", cfg(plugins=scorers("queue-scorer"), dataLayer={"sources": []}), False,
     ("refused", "field dataLayer is not a field of GIE v1.4.0's EndpointPickerConfig (llm-d-router's name for what GIE calls data)")),
    ("key-case", cfg(Plugins=scorers("queue-scorer")), False, ("refused", "field Plugins is not a field")),
    # feature gate 'prefixCache' is unknown or unregistered
    ("unknown-gate", cfg(featureGates=["prefixCache"], plugins=scorers("queue-scorer")), False, ("refused", "Feature gate prefixCache")),
    # plugin type '...' is not registered
    ("precise-producer", cfg(plugins=scorers("precise-prefix-cache-producer", "queue-scorer")), False,
     ("refused", "precise-prefix-cache-producer is not registered in GIE v1.4.0 (an llm-d-router plugin type; GIE has no KV-event consumer)")),
    ("token-producer", cfg(plugins=scorers("token-producer", "queue-scorer")), False, ("refused", "token-producer is not registered")),
    ("load-aware-scorer", cfg(plugins=scorers("load-aware-scorer", "queue-scorer")), False, ("refused", "load-aware-scorer is not registered")),
    ("decode-filter", cfg(plugins=scorers("decode-filter", "queue-scorer")), False, ("refused", "decode-filter is not registered")),
    ("approx-producer", cfg(plugins=scorers("approx-prefix-cache-producer")), False, ("refused", "approx-prefix-cache-producer is not")),
    ("core-metrics-extractor", cfg(plugins=scorers("core-metrics-extractor")), False,
     ("refused", "calls its metrics extractor model-server-protocol-metrics")),
    ("concurrency-detector", cfg(plugins=scorers("concurrency-detector")), False, ("refused", "does not import it")),
    ("unknown-parameter", cfg(plugins=[{"type": "prefix-cache-scorer", "parameters": {"prefixMatchInfoProducerName": "x", "bogus": 1}}]),
     True, ("warning", "parameter bogus is not a field of prefix-cache-scorer in GIE v1.4.0; GIE decodes parameters with a plain")),
    # json: cannot unmarshal string into Go struct field pickerParameters.maxNumOfEndpoints of type int
    ("parameter-type", cfg(plugins=[{"type": "max-score-picker", "parameters": {"maxNumOfEndpoints": "2"}}]), False,
     ("refused", "maxNumOfEndpoints is a string but must be an integer")),
    # BlockSize is depricated, use BlockSizeTokens instead, the value should be defined in tokens
    ("prefix-block-size-only", cfg(plugins=[{"type": "prefix-cache-scorer", "parameters": {"blockSize": 64}}]), False,
     ("refused", "sets blockSize (characters, deprecated) without blockSizeTokens")),
    ("prefix-both-block-sizes",
     cfg(plugins=[{"type": "prefix-cache-scorer", "parameters": {"blockSize": 64, "blockSizeTokens": 16, "autoTune": False}}]),
     True, None),
    ("duplicate-name", cfg(plugins=scorers("queue-scorer", "queue-scorer")), False, ("refused", "declared twice")),
    ("no-type", cfg(plugins=[{"name": "x"}]), False, ("refused", "plugins[0] has no type")),
    ("undeclared-ref", cfg(plugins=scorers("queue-scorer"), schedulingProfiles=profile(("nope", None))), False,
     ("refused", "references plugin nope")),
    ("two-pickers", cfg(plugins=scorers("max-score-picker", "random-picker"),
                        schedulingProfiles=profile(("max-score-picker", None), ("random-picker", None))), False, ("refused", "2 pickers")),
    ("two-profiles-no-handler", cfg(plugins=scorers("queue-scorer"), schedulingProfiles=profile(("queue-scorer", None), name="a")
                                    + profile(("queue-scorer", None), name="b")), False, ("refused", "no profile handler")),
    ("two-profiles-single-handler", cfg(plugins=scorers("queue-scorer", "single-profile-handler"),
                                        schedulingProfiles=profile(("queue-scorer", None), name="a") + profile(("queue-scorer", None), name="b")),
     False, ("refused", "registers no other profile handler")),
    ("negative-weight", cfg(plugins=scorers("queue-scorer"), schedulingProfiles=profile(("queue-scorer", -1))), True,
     ("warning", "GIE v1.4.0 accepts a negative weight")),
    ("gate-without-data", cfg(featureGates=["dataLayer"], plugins=scorers("queue-scorer")), False,
     ("refused", "Feature gate dataLayer is on but data.sources lists no data source")),
    ("gate-empty-sources", cfg(featureGates=["dataLayer"], plugins=scorers("queue-scorer"), data={"sources": []}), False,
     ("refused", "Feature gate dataLayer is on")),
    ("gate-with-data", cfg(featureGates=["dataLayer"], plugins=scorers("queue-scorer") + METRICS, data=METRICS_DATA), True, None),
    # disallowed Extractor model-server-protocol-metrics/... is configured for source metrics-data-source/...
    ("extractor-without-gate", cfg(plugins=scorers("queue-scorer") + METRICS, data=METRICS_DATA), False,
     ("refused", "lists the metrics extractor model-server-protocol-metrics but feature gate dataLayer is off")),
    ("undeclared-source", cfg(plugins=scorers("queue-scorer"), data={"sources": [{"pluginRef": "nope"}]}), False,
     ("refused", "data.sources entry references plugin nope")),
    ("source-not-a-source", cfg(plugins=scorers("queue-scorer"), data={"sources": [{"pluginRef": "queue-scorer"}]}), False,
     ("refused", "is a queue-scorer, not a data source")),
    ("extractor-not-an-extractor", cfg(featureGates=["dataLayer"], plugins=scorers("queue-scorer", "metrics-data-source"),
                                       data={"sources": [{"pluginRef": "metrics-data-source", "extractors": [{"pluginRef": "queue-scorer"}]}]}),
     False, ("refused", "not an extractor")),
    ("invalid-yaml", "plugins: [unclosed\n", False, ("refused", "is not valid YAML, so GIE v1.4.0 cannot decode it")),
    ("weight-string", cfg(plugins=scorers("queue-scorer"), schedulingProfiles=profile(("queue-scorer", "2"))), False,
     ("refused", "weight is a string but must be a number")),
    ("predicted-latency", cfg(plugins=scorers("predicted-latency-scorer")), True, None),
    ("metrics-scheme", cfg(plugins=scorers("queue-scorer") + [{"type": "metrics-data-source", "parameters": {"scheme": "ftp"}}]), False,
     ("refused", "scheme is 'ftp' but must be one of http, https")),
    # no ordering policy registered for name "nope"
    ("flow-control-undeclared", cfg(featureGates=["flowControl"], plugins=scorers("queue-scorer"),
                                    flowControl={"defaultPriorityBand": {"orderingPolicyRef": "nope"}}), False, ("refused", "nope")),
    ("flow-control-without-gate", cfg(plugins=scorers("queue-scorer"), flowControl={"defaultPriorityBand": {"orderingPolicyRef": "nope"}}),
     True, ("warning", "GIE v1.4.0 ignores the section")),
    ("reporter-without-parameters", cfg(plugins=scorers("queue-scorer", "request-attribute-reporter")), False,
     ("refused", "needs parameters")),
    ("profile-without-name", cfg(plugins=scorers("queue-scorer"), schedulingProfiles=[{"plugins": [{"pluginRef": "queue-scorer"}]}]),
     False, ("refused", "has no name")),
    ("saturation-thresholds", cfg(plugins=scorers("queue-scorer"), saturationDetector={
        "queueDepthThreshold": 5, "kvCacheUtilThreshold": 0.9, "metricsStalenessThreshold": "300ms"}), True, None),
    ("parameters-list", cfg(plugins=[{"type": "prefix-cache-scorer", "parameters": [1]}]), False, ("refused", "not a mapping")),
    ("parameter-case", cfg(plugins=[{"type": "prefix-cache-scorer", "parameters": {"BlockSizeTokens": 32, "autotune": False}}]), True,
     ("warning", "accepted as blockSizeTokens only because Go matches JSON keys case-insensitively")),
    # Issue 38 finding 4, run 2026-12-04 with the GIE EPP v1.4.0 of the gie build in a network namespace of its own and a
    # kubeconfig whose server does not answer (the config is read after discovery, whose errors are only logged): the
    # refused ones end with "Failed to parse configuration" and the message quoted, the others log "loaded configuration
    # from file/text successfully".
    # failed to create plugin 'k8s-notification-source' (type: k8s-notification-source): version and kind are required ...
    ("notification-source-group-only", cfg(plugins=ROLE["plugins"] + [NOTIFY({"group": "apps"})], schedulingProfiles=ROLE["schedulingProfiles"]),
     False, ("refused", "Plugin k8s-notification-source sets no version or kind; GIE v1.4.0 refuses a k8s-notification-source")),
    ("notification-source-no-kind", cfg(plugins=ROLE["plugins"] + [NOTIFY({"version": "v1"})], schedulingProfiles=ROLE["schedulingProfiles"]),
     False, ("refused", "Plugin k8s-notification-source sets no kind; GIE v1.4.0 refuses")),
    ("notification-source-no-version", cfg(plugins=ROLE["plugins"] + [NOTIFY({"kind": "ConfigMap"})], schedulingProfiles=ROLE["schedulingProfiles"]),
     False, ("refused", "Plugin k8s-notification-source sets no version; GIE v1.4.0 refuses")),
    ("notification-source-complete", cfg(plugins=ROLE["plugins"] + [NOTIFY({"version": "v1", "kind": "ConfigMap"})],
                                         schedulingProfiles=ROLE["schedulingProfiles"]), True, None),
    # ... (type: model-server-protocol-metrics): engine config name cannot be empty
    ("engine-without-name", ENGINES({"engineConfigs": [{"queuedRequestsSpec": "x:queue"}]}), False,
     ("refused", "has an engineConfigs entry without a name (entry 0); GIE v1.4.0 refuses it (\"engine config name cannot be empty\")")),
    ("engine-empty-name", ENGINES({"engineConfigs": [{"name": "", "queuedRequestsSpec": "x:queue"}]}), False,
     ("refused", "has an engineConfigs entry without a name (entry 0)")),
    # ... engine config name cannot be "default" (reserved)
    ("engine-named-default", ENGINES({"engineConfigs": [{"name": "default", "queuedRequestsSpec": "x:queue"}]}), False,
     ("refused", "names an engineConfigs entry default (entry 0), the name GIE v1.4.0 reserves")),
    # ... failed to register engine mapping for "trt": mapping for engine type "trt" already exists
    ("engine-twice", ENGINES({"engineConfigs": [{"name": "trt"}, {"name": "trt"}]}), False,
     ("refused", "defines engine trt in two engineConfigs entries")),
    # ... defaultEngine "trt" not found in engineConfigs
    ("default-engine-undefined", ENGINES({"defaultEngine": "trt"}), False,
     ("refused", "sets defaultEngine trt, which is neither an engineConfigs entry nor a built-in engine (vllm, sglang)")),
    ("default-engine-defined", ENGINES({"defaultEngine": "trt", "engineConfigs": [{"name": "trt", "queuedRequestsSpec": "trt:queue"}]}),
     True, None),
    ("default-engine-built-in", ENGINES({"defaultEngine": "sglang"}), True, None),
    ("llm-d-precise", copy.deepcopy(PRECISE), False, ("refused", "apiVersion llm-d.ai/v1alpha1 is llm-d-router's")),
    ("llm-d-precise-old-api", LLMD_OLD_API, False, ("refused", "token-producer is not registered in GIE v1.4.0")),
    ("llm-d-approximate-old-api", dict(copy.deepcopy(APPROXIMATE), apiVersion=API), False, ("refused", "decode-filter is not registered")),
]


def _check(config, **options):
    options.setdefault("router_impl", "gie")
    if isinstance(config, str):
        return check_epp_text(config, **options)
    return check_epp_config(copy.deepcopy(config), **options)


@pytest.mark.parametrize("name,config,starts,finding", RUNS, ids=[r[0] for r in RUNS])
def test_what_the_gie_epp_did(name, config, starts, finding):
    result = _check(config)
    assert result.router_impl == "gie" and result.router_version == V
    assert result.epp_starts is starts, (name, result.findings)
    if finding is not None:
        kind, words = finding
        found = [f for f in result.findings if words in f["sentence"]]
        assert found and found[0]["kind"] == kind, (name, result.findings)
    stops = [f for f in result.findings if f["kind"] in ("refused", "broken")]
    assert bool(stops) is (not starts), (name, result.findings)
    for f in result.findings:
        assert "\n" not in f["sentence"] and f["sentence"].endswith("."), f


# --- the cross cases: a config written for one router checked against the other ----------------------------------------

def test_an_llm_d_config_checked_as_gie_is_refused_in_one_sentence():
    result = check_epp_config(PRECISE, router_impl="gie")
    assert result.epp_starts is False and not result.ok
    assert result.findings == [{"kind": "refused", "sentence": (
        "apiVersion llm-d.ai/v1alpha1 is llm-d-router's; GIE v1.4.0 registers EndpointPickerConfig only under "
        "inference.networking.x-k8s.io/v1alpha1, so it cannot decode this config and does not start (check it with router_impl llm-d).")}]


def test_the_precise_producer_is_refused_by_gie_with_its_reason():
    result = check_epp_config(LLMD_OLD_API, router_impl="gie")
    assert ("Plugin type precise-prefix-cache-producer is not registered in GIE v1.4.0 (an llm-d-router plugin type; GIE has no "
            "KV-event consumer), so the EPP does not start.") in result.problems


def test_the_role_render_starts_with_gie_and_is_refused_by_llm_d():
    assert check_epp_config(ROLE, router_impl="gie").findings == []
    llm_d = check_epp_config(ROLE)
    assert llm_d.router_impl == "llm-d" and llm_d.epp_starts is False
    assert ("Plugin prefix-cache-scorer parameter blockSizeTokens is not a field of prefix-cache-scorer in llm-d-router v0.9.0; the EPP "
            "decodes parameters strictly (DisallowUnknownFields), so the plugin fails and the EPP does not start.") in llm_d.problems
    assert "apiVersion inference.networking.x-k8s.io/v1alpha1 is deprecated; use llm-d.ai/v1alpha1." in llm_d.deprecations
    plain = copy.deepcopy(ROLE)
    plain["plugins"][2].pop("parameters")
    assert check_epp_config(plain).epp_starts is True  # llm-d-router v0.9.0 still reads the old apiVersion


@pytest.mark.parametrize("config,sentence", [
    (cfg(plugins=scorers("queue-scorer") + METRICS, data=METRICS_DATA),
     "EndpointPickerConfig field data is not a field of llm-d-router v0.9.0's EndpointPickerConfig (GIE's name for what llm-d-router "
     "calls dataLayer); the EPP decodes the config strictly and does not start."),
    (cfg(plugins=scorers("queue-scorer") + METRICS),
     "Plugin type model-server-protocol-metrics is not registered in llm-d-router v0.9.0 (GIE's name; llm-d-router v0.9.0 calls its "
     "metrics extractor core-metrics-extractor), so the EPP does not start."),
    (cfg(plugins=scorers("predicted-latency-scorer")),
     "Plugin type predicted-latency-scorer is not registered in llm-d-router v0.9.0 (a GIE plugin type; llm-d-router v0.9.0 has "
     "predicted-latency-producer and latency-scorer), so the EPP does not start."),
    (cfg(plugins=scorers("queue-scorer"), saturationDetector={"queueDepthThreshold": 5}),
     "EndpointPickerConfig field saturationDetector.queueDepthThreshold is not a field of llm-d-router v0.9.0's EndpointPickerConfig; "
     "the EPP decodes the config strictly and does not start."),
], ids=["data", "metrics-extractor", "predicted-latency-scorer", "saturation-thresholds"])
def test_a_gie_config_checked_as_llm_d_is_refused_with_the_reason(config, sentence):
    result = check_epp_config(config)
    assert result.epp_starts is False and sentence in result.problems


# --- mode, router_impl and router_version --------------------------------------------------------------------------

def test_precise_mode_is_an_input_error_with_gie():
    result = check_epp_config(ROLE, router_impl="gie", mode="precise")
    assert result.findings == [{"kind": "input", "sentence": (
        "mode precise needs a KV-event consumer, and GIE v1.4.0 has none (approximate prefix-cache scoring only); use router_impl "
        "llm-d for precise routing.")}]
    assert not result.ok and result.epp_starts is True


NO_PREFIX = "Mode approximate needs a prefix-cache-scorer with a weight above 0 in a scheduling profile, and no profile has one."


@pytest.mark.parametrize("config,ok", [
    (ROLE, True),
    ("", True),  # the default configuration: prefix-cache-scorer at weight 3
    (cfg(plugins=scorers("queue-scorer", "prefix-cache-scorer")), True),  # profile default: every scorer at weight 1
    (cfg(plugins=scorers("queue-scorer", "prefix-cache-scorer"), schedulingProfiles=profile(("queue-scorer", 1), ("prefix-cache-scorer", None))),
     True),  # an absent weight is 1
    (cfg(plugins=scorers("queue-scorer", "prefix-cache-scorer"), schedulingProfiles=profile(("queue-scorer", 1), ("prefix-cache-scorer", 0))),
     False),
    (cfg(plugins=scorers("queue-scorer", "prefix-cache-scorer"), schedulingProfiles=profile(("queue-scorer", 1))), False),
    (cfg(plugins=scorers("queue-scorer")), False),
], ids=["role", "empty-file", "no-profiles", "default-weight", "weight-0", "not-in-profile", "no-prefix-scorer"])
def test_approximate_mode_with_gie(config, ok):
    result = _check(config, mode="approximate")
    assert (NO_PREFIX in result.problems) is (not ok), result.findings
    if not ok:
        assert result.kind_of(NO_PREFIX) == "broken"


@pytest.mark.parametrize("impl,version,sentence", [
    ("gie", None, None),
    ("gie", "v1.4.0", None),
    ("llm-d", None, None),
    ("gie", "v0.9.0", "router_version 'v0.9.0' is not one this collection encodes for router_impl gie (v1.4.0)."),
    ("llm-d", "v1.4.0", "router_version 'v1.4.0' is not one this collection encodes for router_impl llm-d (v0.9.0)."),
    ("llm-d", "v0.8.0", "router_version 'v0.8.0' is not one this collection encodes (v0.9.0)."),
    ("envoy", None, "router_impl is 'envoy' but must be gie or llm-d."),
    (["gie"], None, "router_impl is ['gie'] but must be gie or llm-d."),
])
def test_router_impl_and_version(impl, version, sentence):
    result = check_epp_config(ROLE, router_impl=impl, router_version=version)
    if sentence is None:
        assert result.router_impl == impl and result.router_version == {"gie": V, "llm-d": "v0.9.0"}[impl]
        assert [f for f in result.findings if f["kind"] == "input"] == []
    else:
        assert result.problems == [sentence] and result.epp_starts is None
        assert result.as_dict()["router_impl"] in ("gie", "llm-d")


# --- the rule table: every GIE rule fires with its kind, and cites the GIE source at the tag -----------------------------

GIE_RULE_CASES = {
    "gie-llm-d-api-version": dict(ROLE, apiVersion="llm-d.ai/v1alpha1"),
    "top-level-unknown-field": dict(ROLE, metadata={"name": "x"}),
    "top-level-field": dict(ROLE, featureGates="dataLayer"),
    "gie-api-version": dict(ROLE, apiVersion="v2"),
    "gie-kind": dict(ROLE, kind="Config"),
    "unknown-feature-gate": dict(ROLE, featureGates=["prefixCache"]),
    "no-plugins": cfg(plugins=[]),
    "plugin-without-type": cfg(plugins=[{"name": "x"}]),
    "duplicate-plugin-name": cfg(plugins=scorers("queue-scorer", "queue-scorer")),
    "unregistered-plugin-type": cfg(plugins=scorers("decode-filter")),
    "ignored-parameters": cfg(plugins=[{"type": "queue-scorer", "parameters": {"a": 1}}]),
    "missing-parameters": cfg(plugins=scorers("k8s-notification-source")),
    "parameters-not-a-mapping": cfg(plugins=[{"type": "max-score-picker", "parameters": "1"}]),
    "prefix-block-size": cfg(plugins=[{"type": "prefix-cache-scorer", "parameters": {"blockSize": 64}}]),
    "ignored-parameter": cfg(plugins=[{"type": "max-score-picker", "parameters": {"maxEndpoints": 2}}]),
    "deprecated-parameter": cfg(plugins=[{"type": "prefix-cache-scorer", "parameters": {"blockSize": 64, "blockSizeTokens": 16}}]),
    "parameter-case": cfg(plugins=[{"type": "max-score-picker", "parameters": {"MaxNumOfEndpoints": 2}}]),
    "parameter": cfg(plugins=[{"type": "predicted-latency-scorer", "parameters": {"samplingMean": 0}}]),
    "no-scheduling-profiles": cfg(plugins=scorers("queue-scorer")),
    "profile-not-a-mapping": dict(ROLE, schedulingProfiles=["x"]),
    "profile-without-name": cfg(plugins=scorers("queue-scorer"), schedulingProfiles=[{"plugins": []}]),
    "duplicate-profile": cfg(plugins=scorers("queue-scorer", "single-profile-handler"),
                             schedulingProfiles=profile(("queue-scorer", 1)) * 2),
    "profile-entry-without-ref": cfg(plugins=scorers("queue-scorer"), schedulingProfiles=[{"name": "default", "plugins": [{"weight": 1}]}]),
    "undeclared-profile-plugin": cfg(plugins=scorers("queue-scorer"), schedulingProfiles=profile(("nope", 1))),
    "weight-not-a-number": cfg(plugins=scorers("queue-scorer"), schedulingProfiles=profile(("queue-scorer", "1"))),
    "negative-weight": cfg(plugins=scorers("queue-scorer"), schedulingProfiles=profile(("queue-scorer", -2))),
    "several-pickers": cfg(plugins=scorers("max-score-picker", "random-picker"),
                           schedulingProfiles=profile(("max-score-picker", None), ("random-picker", None))),
    "several-profile-handlers": cfg(plugins=[{"type": "single-profile-handler"}, {"type": "single-profile-handler", "name": "other"}]),
    "no-profile-handler": cfg(plugins=scorers("queue-scorer"), schedulingProfiles=profile(("queue-scorer", 1), name="a")
                              + profile(("queue-scorer", 1), name="b")),
    "gie-single-handler-several-profiles": cfg(plugins=scorers("queue-scorer", "single-profile-handler"),
                                               schedulingProfiles=profile(("queue-scorer", 1), name="a") + profile(("queue-scorer", 1), name="b")),
    "source-without-ref": cfg(plugins=scorers("queue-scorer"), data={"sources": [{}]}),
    "undeclared-source": cfg(plugins=scorers("queue-scorer"), data={"sources": [{"pluginRef": "nope"}]}),
    "not-a-data-source": cfg(plugins=scorers("queue-scorer"), data={"sources": [{"pluginRef": "queue-scorer"}]}),
    "extractor-without-ref": cfg(plugins=scorers("metrics-data-source"),
                                 data={"sources": [{"pluginRef": "metrics-data-source", "extractors": [{}]}]}),
    "undeclared-extractor": cfg(plugins=scorers("metrics-data-source"),
                                data={"sources": [{"pluginRef": "metrics-data-source", "extractors": [{"pluginRef": "nope"}]}]}),
    "gie-not-an-extractor": cfg(plugins=scorers("metrics-data-source", "queue-scorer"),
                                data={"sources": [{"pluginRef": "metrics-data-source", "extractors": [{"pluginRef": "queue-scorer"}]}]}),
    "data-layer-without-sources": cfg(featureGates=["dataLayer"], plugins=scorers("queue-scorer")),
    "metrics-extractor-ungated": cfg(plugins=scorers("queue-scorer") + METRICS, data=METRICS_DATA),
    "flow-control-ungated": dict(ROLE, flowControl={"maxBytes": 1000}),
    "undeclared-flow-control-policy": dict(ROLE, featureGates=["flowControl"], flowControl={"priorityBands": [{"fairnessPolicyRef": "nope"}]}),
    "gie-approximate-without-prefix-scorer": cfg(plugins=scorers("queue-scorer")),
    "notification-source-without-gvk": cfg(plugins=[NOTIFY({"group": ""})]),
    "metrics-engine-without-name": ENGINES({"engineConfigs": [{}]}),
    "metrics-engine-reserved-name": ENGINES({"engineConfigs": [{"name": "default"}]}),
    "metrics-engine-twice": ENGINES({"engineConfigs": [{"name": "a"}, {"name": "a"}]}),
    "metrics-default-engine-undefined": ENGINES({"defaultEngine": "a"}),
}


def test_every_gie_rule_has_a_case_and_cites_the_gie_tag():
    assert set(rule.name for rule in GIE_RULES) == set(GIE_RULE_CASES)
    for rule in GIE_RULES:
        assert rule.gie and rule.gie.startswith(TAG), rule.name
        if rule.behaviour:
            assert gie.BEHAVIOUR[V][rule.behaviour][2] == rule.gie
    assert set(gie.BEHAVIOUR[V]) == set(rule.behaviour for rule in GIE_RULES if rule.behaviour) | {"empty-config"}
    assert [rule.name for rule in ALL_RULES if "gie" not in rule.impls and "llm-d" not in rule.impls] == []
    assert not [rule for rule in RULES if rule.name.startswith("gie-")]


@pytest.mark.parametrize("name", sorted(GIE_RULE_CASES))
def test_each_gie_rule_fires_with_its_kind(name):
    rule = [r for r in GIE_RULES if r.name == name][0]
    mode = "approximate" if name.startswith("gie-approximate") else None
    result = check_epp_config(copy.deepcopy(GIE_RULE_CASES[name]), router_impl="gie", mode=mode)
    assert name in result.rules, (name, result.findings)
    kind = gie.BEHAVIOUR[V][rule.behaviour][0] if rule.behaviour else rule.kind
    finding = result.findings[result.rules.index(name)]
    assert finding["kind"] == kind and finding["sentence"].endswith("."), finding
    assert name not in check_epp_config(copy.deepcopy(ROLE), router_impl="gie", mode=mode).rules


# --- every GIE type and field, enforced ----------------------------------------------------------------------------

def _alone(ptype, params):
    return cfg(plugins=[{"name": "p", "type": ptype, "parameters": params}, {"type": "max-score-picker", "name": "picker"}],
               schedulingProfiles=[{"name": "default", "plugins": [{"pluginRef": "picker"}]}])


# Values the factories need beyond their type: a notification source's version and kind (factory.go 53-55), an engine
# config's name (factories.go 123-125); _example gives every string field "".
VALID_VALUES = {"k8s-notification-source": {"version": "v1", "kind": "ConfigMap"}}


@pytest.mark.parametrize("ptype", GIE_TYPES)
def test_every_gie_type_starts_with_all_its_fields(ptype):
    spec = gie.PLUGINS[V][ptype]
    params = _example(spec["params"]) if spec["params"] else None
    params = dict(params, **VALID_VALUES.get(ptype, {})) if params is not None else None
    if ptype == gie.METRICS_EXTRACTOR:
        params["engineConfigs"][0]["name"] = "trt"
    result = check_epp_config(_alone(ptype, params), router_impl="gie")
    assert result.epp_starts is True and list(result.problems) == [], (ptype, result.findings)


@pytest.mark.parametrize("ptype", [t for t in GIE_TYPES if gie.PLUGINS[V][t]["params"]])
def test_every_gie_type_ignores_an_unknown_field_and_refuses_a_wrong_type(ptype):
    schema = gie.PLUGINS[V][ptype]["params"]
    params = _example(schema)
    params["notAField"] = 1
    result = check_epp_config(_alone(ptype, params), router_impl="gie")
    assert ("Plugin p (%s) parameter notAField is not a field of %s in GIE v1.4.0; GIE decodes parameters with a plain "
            "json.Unmarshal, so it ignores the field and starts without it." % (ptype, ptype)) in result.warnings
    for path, node in _leaves(schema):
        params = _example(schema)
        wrong, phrase = _wrong(node)
        target = params
        for key in path[:-1]:
            target = target[key][0] if isinstance(target[key], list) else target[key]
        target[path[-1]] = wrong
        problems = check_epp_config(_alone(ptype, params), router_impl="gie").problems
        assert [p for p in problems if p.startswith("Plugin p (%s) parameter %s %s" % (ptype, ".".join(path), phrase))], (path, problems)


@pytest.mark.parametrize("params,field,bound", [
    ({"samplingMean": 0}, "samplingMean", "must be greater than 0"),
    ({"maxSampledTokens": -1}, "maxSampledTokens", "must be at least 0"),
    ({"epsilonExploreNeg": 1.5}, "epsilonExploreNeg", "must be at most 1"),
    ({"compositeKVWeight": -1}, "compositeKVWeight", "must be at least 0"),
], ids=["sampling-mean", "max-sampled-tokens", "epsilon", "composite-weight"])
def test_predicted_latency_ranges(params, field, bound):
    # Config.validate in pkg/epp/framework/plugins/scheduling/scorer/predictedlatency/scorer.go
    result = check_epp_config(_alone("predicted-latency-scorer", params), router_impl="gie")
    assert [p for p in result.problems if p.startswith("Plugin p (predicted-latency-scorer) parameter %s %s" % (field, bound))]
    assert result.epp_starts is False


# --- citations name tags, never commits ----------------------------------------------------------------------------

_CITATION = re.compile(r"^(?:github\.com/)?[\w.-]+/[\w.-]+@([^:]+):")
_TAG = re.compile(r"^v\d+\.\d+\.\d+$")


def _citations():
    for version, table in list(llmd.PLUGINS.items()) + list(gie.PLUGINS.items()):
        for ptype, spec in table.items():
            yield spec["source"]
            for schema in (spec["params"], spec["legacy_params"]):
                for struct in _structs(schema) if schema else ():
                    yield struct["source"]
    for schema in list(llmd.CONFIG_SCHEMA.values()) + list(gie.CONFIG_SCHEMA.values()):
        for struct in _structs(schema):
            yield struct["source"]
    for behaviour in list(llmd.BEHAVIOUR.values()) + list(gie.BEHAVIOUR.values()):
        for _kind, _sentence, source in behaviour.values():
            yield source
    for semantics in llmd.SEMANTICS.values():
        for key, value in semantics.items():
            if key.endswith("_source"):
                yield value
    for rule in ALL_RULES:
        for source in (rule.source, rule.gie):
            if source:
                yield source
    yield llmd.KV_CACHE_REF + ":"
    yield gie.PRECISE_MODE[1]


def test_no_citation_names_a_commit():
    seen = 0
    for source in _citations():
        if source.startswith("k8s.io/apimachinery"):
            continue  # a Go package path, no repository ref
        match = _CITATION.match(source)
        assert match, source
        assert _TAG.match(match.group(1)), "%s cites %s, not a tag" % (source, match.group(1))
        seen += 1
    assert seen > 100
    assert llmd.KV_CACHE_REF == "llm-d/llm-d-kv-cache@v0.9.0"


# --- text that is not YAML: the EPP cannot decode it and does not start ----------------------------------------------

@pytest.mark.parametrize("impl,router", [("llm-d", "llm-d-router v0.9.0"), ("gie", "GIE v1.4.0")])
def test_invalid_yaml_is_refused(impl, router):
    result = check_epp_text("plugins: [unclosed\n", router_impl=impl)
    assert result.epp_starts is False and result.decoded is False and not result.ok
    assert [f["kind"] for f in result.findings] == ["refused"]
    sentence = result.findings[0]["sentence"]
    assert sentence.startswith("The EndpointPickerConfig is not valid YAML, so %s cannot decode it and does not start: " % router)
    assert sentence.endswith(".") and "\n" not in sentence and result.problems == [sentence]
    assert result.as_dict()["epp_starts"] is False


def test_text_that_is_yaml_is_checked_as_the_epp_reads_it():
    assert check_epp_text("").findings[0]["sentence"].startswith("The EndpointPickerConfig is empty; llm-d-router v0.9.0")
    assert check_epp_text("", router_impl="gie").epp_starts is True
    assert check_epp_text("- a list\n", router_impl="gie").problems == ["The EndpointPickerConfig is not a mapping (got list)."]
    assert check_epp_text("plugins: [unclosed", router_version="v0.1.0").problems == [
        "router_version 'v0.1.0' is not one this collection encodes (v0.9.0)."]
