# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""What the Gateway API Inference Extension's own EPP (``router_impl: gie``) accepts in an EndpointPickerConfig.

Plain data, no Ansible import; the same shape as the llm-d tables in :mod:`.plugins` (``PLUGINS``, ``CONFIG_SCHEMA``,
``FEATURE_GATES``, ``REMOVED_OR_LATER``, ``BEHAVIOUR``, ``DEFAULT_CONFIG``), keyed by the GIE version, read at
``kubernetes-sigs/gateway-api-inference-extension@v1.4.0`` (module ``sigs.k8s.io/gateway-api-inference-extension``,
``cmd/epp``). What differs from llm-d-router v0.9.0:

- 20 plugin types (``cmd/epp/runner/runner.go`` registerInTreePlugins); no KV-event consumer, no tokenizer, no
  filters but a test one, one profile handler (``single-profile-handler``); the metrics extractor is
  ``model-server-protocol-metrics``. ``concurrency-detector`` registers itself in ``init()`` of a package the EPP
  binary does not import.
- The whole config is decoded strictly (``serializer.EnableStrict``, ``pkg/epp/config/loader/configloader.go``), but
  each factory decodes its ``parameters`` with a plain ``json.Unmarshal``: an unknown parameter field is ignored, a
  wrongly typed one fails the plugin.
- One apiVersion, ``inference.networking.x-k8s.io/v1alpha1`` (``apix/config/v1alpha1/zz_generated.register.go``);
  a missing apiVersion or kind takes that one. The data layer is ``data`` (not ``dataLayer``), there is no
  ``requestHandler``/``parser``, ``saturationDetector`` holds thresholds (not a plugin reference), and
  ``flowControl`` is read only with the ``flowControl`` feature gate.
- The same loader defaults as llm-d-router v0.9.0 (``pkg/epp/config/loader/defaults.go``): an empty file is the
  default configuration; no ``schedulingProfiles`` is one profile ``default`` of every filter, scorer and picker
  (scorers at weight 1); a ``single-profile-handler`` and a ``max-score-picker`` are added when none is declared.

Confirmed by running the GIE EPP v1.4.0 built at the tag (``cmd/epp``) on each case, 2026-12-03, with a stand-in
Kubernetes API server that answers discovery only (without one the EPP exits at ``ctrl.GetConfig()``, before it reads
its config): it starts (reaches "Controller manager starting" and "gRPC server listening", and logs the scheduler
config it built) with an empty file (queue 2, kv-cache-utilization 2, prefix 3), the router role's shape
(queue/kv-cache-utilization/prefix-cache scorers, max-score-picker, single-profile-handler, profile ``default`` with
weights), no picker and no handler (both added), no ``schedulingProfiles`` (every scorer at weight 1),
``plugins: []`` or no ``plugins`` (profile ``default`` of only the added max-score-picker), no apiVersion and kind, a
negative weight (kept), unknown and case-folded parameter fields, ``predicted-latency-scorer`` without its sidecar,
``saturationDetector`` thresholds, ``flowControl`` without its gate (ignored), the ``dataLayer`` gate with a metrics
source and extractor. It exits with "Failed to parse configuration" (or "failed to initialize data layer") on
apiVersion ``llm-d.ai/v1alpha1`` (no kind registered for that version), a wrong kind, a top-level ``dataLayer`` or
``Plugins`` (strict decoding), an unknown feature gate, the types precise-prefix-cache-producer, token-producer,
load-aware-scorer, decode-filter, approx-prefix-cache-producer, core-metrics-extractor, concurrency-detector (not
registered), a wrongly typed parameter, parameters that are a list, ``blockSize`` without ``blockSizeTokens`` on the
prefix-cache-scorer, a duplicate name, a plugin without type, an undefined plugin reference, two pickers in one
profile, two profiles without a handler or with the single-profile-handler, a profile without name, a weight that is
a string, the ``dataLayer`` gate without data sources (missing or empty), the metrics extractor without that gate, a
data source or extractor reference to a plugin of another kind or to none, ``metrics-data-source`` scheme ``ftp``,
``request-attribute-reporter`` without parameters, an undeclared flow-control policy, invalid YAML, and llm-d-router's
precise and approximate configs (with either apiVersion). Run 2026-12-04 with the same build, in a network namespace of
its own and a kubeconfig whose server does not answer (it reads its config after discovery, whose errors it only logs):
it refuses a ``k8s-notification-source`` without ``version`` or ``kind``, and a metrics extractor with an engine config
without a name, named ``default`` or defined twice, or a ``defaultEngine`` that names no engine ("Failed to parse
configuration"), and takes the complete ones ("loaded configuration from file/text successfully").
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

from ..common import wiring
from .llm_d import PLUGINS as LLM_D_PLUGINS
from .llm_d import REFUSED, WARNING, ROUTER_VERSION as LLM_D_VERSION
from .schema import ANY, BOOL, GO_DURATION, NANOSECONDS, STR, enum, integer, list_of, number, obj
from .values import as_list, is_mapping, param

GIE_VERSION = wiring.GIE_VERSION
GIE_VERSIONS = (GIE_VERSION,)
NAME = "GIE"  # how a sentence names this router ("GIE v1.4.0")
API_VERSION = "inference.networking.x-k8s.io/v1alpha1"

GIE_SOURCE = "kubernetes-sigs/gateway-api-inference-extension@%s:" % GIE_VERSION  # the prefix of every citation
_P = GIE_SOURCE + "pkg/epp/framework/plugins/"
_LOADER = GIE_SOURCE + "pkg/epp/config/loader/configloader.go"
_DEFAULTS = GIE_SOURCE + "pkg/epp/config/loader/defaults.go"
RUNNER = GIE_SOURCE + "cmd/epp/runner/runner.go"
SCHEDULER_PROFILE = GIE_SOURCE + "pkg/epp/scheduling/scheduler_profile.go"
FLOW_REGISTRY = GIE_SOURCE + "pkg/epp/flowcontrol/registry/config.go"
REGISTER = GIE_SOURCE + "apix/config/v1alpha1/zz_generated.register.go"
_PREFIX = _P + "scheduling/scorer/prefix/plugin.go"
_LATENCY = _P + "scheduling/scorer/predictedlatency/scorer.go"
_METRICS_EXTRACTOR = _P + "datalayer/extractor/metrics/factories.go"
_REPORTER = _P + "requestcontrol/requestattributereporter/plugin.go"
_NOTIFICATIONS = _P + "datalayer/source/notifications/factory.go"
METRICS_EXTRACTOR = "model-server-protocol-metrics"
NOTIFICATION_SOURCE = "k8s-notification-source"
PREFIX_SCORER = "prefix-cache-scorer"
# The metrics extractor's engines: the two it always defines (defaultEngineConfigs in factories.go, appended unless an
# engineConfigs entry of that name replaces it) and the name its registry reserves for the default engine's mapping
# (DefaultEngineType, datalayer/extractor/metrics/mapping_registry.go).
BUILT_IN_ENGINES = ("vllm", "sglang")
RESERVED_ENGINE = "default"


def _plugin(source, roles, params=None, requires_params=False):
    return {"source": source, "roles": frozenset(roles.split()), "params": params, "legacy_params": None,
            "deprecated": None, "requires_params": requires_params}


_PICKER = obj({"maxNumOfEndpoints": integer()}, _P + "scheduling/picker/common.go")  # <= 0: the default 1

# Registered in cmd/epp/runner/runner.go (registerInTreePlugins) at GIE_VERSION, 20 types. Every factory decodes its
# parameters with json.Unmarshal (no DisallowUnknownFields); the types marked "takes no parameters" ignore them.
_V140 = {
    # The prefix scorer hashes prompts itself (approximate prefix-cache scoring); New refuses blockSize without
    # blockSizeTokens, and non-positive sizes, capacities and block counts fall back to the defaults.
    PREFIX_SCORER: _plugin(_PREFIX, "scorer pre-request", obj({
        "autoTune": BOOL, "blockSizeTokens": integer(), "blockSize": integer(), "maxPrefixBlocksToMatch": integer(),
        "lruCapacityPerServer": integer(),
    }, _PREFIX, deprecated={"blockSize": "is deprecated (characters); use blockSizeTokens"})),
    "max-score-picker": _plugin(_P + "scheduling/picker/max_score_picker.go", "picker", _PICKER),
    "random-picker": _plugin(_P + "scheduling/picker/random_picker.go", "picker", _PICKER),
    "weighted-random-picker": _plugin(_P + "scheduling/picker/weighted_random_picker.go", "picker", _PICKER),
    "single-profile-handler": _plugin(_P + "scheduling/profile/single_profile_handler.go", "profile-handler"),
    "kv-cache-utilization-scorer": _plugin(_P + "scheduling/scorer/kvcache_utilization.go", "scorer"),
    "queue-scorer": _plugin(_P + "scheduling/scorer/queue.go", "scorer"),
    "running-requests-size-scorer": _plugin(_P + "scheduling/scorer/running.go", "scorer"),
    "lora-affinity-scorer": _plugin(_P + "scheduling/scorer/lora_affinity.go", "scorer"),
    "global-strict-fairness-policy": _plugin(GIE_SOURCE + "pkg/epp/flowcontrol/framework/plugins/fairness/besthead.go",
                                             "fairness-policy"),
    "round-robin-fairness-policy": _plugin(GIE_SOURCE + "pkg/epp/flowcontrol/framework/plugins/fairness/roundrobin.go",
                                           "fairness-policy"),
    "fcfs-ordering-policy": _plugin(GIE_SOURCE + "pkg/epp/flowcontrol/framework/plugins/ordering/fcfs.go", "ordering-policy"),
    "edf-ordering-policy": _plugin(GIE_SOURCE + "pkg/epp/flowcontrol/framework/plugins/ordering/edf.go", "ordering-policy"),
    # Ranges: Config.validate in scorer.go (the factory refuses values outside them).
    "predicted-latency-scorer": _plugin(_LATENCY, "scorer pre-request", obj({
        "samplingMean": number(above=0), "maxSampledTokens": integer(0), "sloBufferFactor": number(above=0),
        "negHeadroomTTFTWeight": number(0), "negHeadroomTPOTWeight": number(0), "headroomTTFTWeight": number(0),
        "headroomTPOTWeight": number(0), "headroomSelectionStrategy": STR, "compositeKVWeight": number(0),
        "compositeQueueWeight": number(0), "compositePrefixWeight": number(0), "epsilonExploreSticky": number(0, 1),
        "epsilonExploreNeg": number(0, 1), "affinityGateTau": number(0, 1), "affinityGateTauGlobal": number(0, 1),
        "contextTTL": NANOSECONDS, "selectionMode": STR, "streamingMode": BOOL, "endpointRoleLabel": STR,
    }, _LATENCY)),
    "header-based-testing-filter": _plugin(_P + "scheduling/test/filter/request_header_based_filter.go", "filter test"),
    "destination-endpoint-served-verifier": _plugin(
        _P + "requestcontrol/test/responsereceived/destination_endpoint_served_verifier.go", "test"),
    # NewHTTPDataSource refuses any scheme but http and https (an absent one is the --model-server-metrics-scheme flag).
    "metrics-data-source": _plugin(_P + "datalayer/source/metrics/datasource.go", "data-source", obj({
        "scheme": enum("http", "https"), "path": STR, "insecureSkipVerify": BOOL,
    }, _P + "datalayer/source/metrics/datasource.go")),
    # ModelServerExtractorFactory refuses an engine config without a name or named default, a name defined twice, and a
    # defaultEngine that names no engine (behaviours metrics-engine-*, metrics-default-engine-undefined).
    METRICS_EXTRACTOR: _plugin(_METRICS_EXTRACTOR, "extractor", obj({
        "engineLabelKey": STR, "defaultEngine": STR,
        "engineConfigs": list_of(obj({"name": STR, "queuedRequestsSpec": STR, "runningRequestsSpec": STR, "kvUsageSpec": STR,
                                      "loraSpec": STR, "cacheInfoSpec": STR}, _METRICS_EXTRACTOR)),
    }, _METRICS_EXTRACTOR)),
    # NotificationSourceFactory refuses no parameters and a version or kind that is empty (behaviour
    # notification-source-without-gvk); group may be empty (the core API group).
    NOTIFICATION_SOURCE: _plugin(_NOTIFICATIONS, "data-source", obj({
        "group": STR, "version": STR, "kind": STR,
    }, _NOTIFICATIONS), requires_params=True),
    # json.Unmarshal of no parameters fails ("unexpected end of JSON input").
    "request-attribute-reporter": _plugin(_REPORTER, "pre-request", obj({
        "attributes": list_of(obj({"key": obj({"namespace": STR, "name": STR}, _REPORTER), "expression": STR, "condition": STR},
                                  _REPORTER)),
    }, _REPORTER), requires_params=True),
}

PLUGINS = {GIE_VERSION: _V140}

_KV_EVENTS = "an llm-d-router plugin type; GIE has no KV-event consumer"
_NOTES = {
    "precise-prefix-cache-producer": _KV_EVENTS,
    "precise-prefix-cache-scorer": _KV_EVENTS,
    "approx-prefix-cache-producer": "an llm-d-router plugin type; GIE's prefix-cache-scorer keeps its own approximate index",
    "token-producer": "an llm-d-router plugin type; GIE has no tokenizer",
    "tokenizer": "an llm-d-router plugin type; GIE has no tokenizer",
    "core-metrics-extractor": "llm-d-router's name; GIE %s calls its metrics extractor %s" % (GIE_VERSION, METRICS_EXTRACTOR),
    "concurrency-detector": "its package registers it in init(), but the GIE %s EPP binary does not import it" % GIE_VERSION,
}
# Types a config written for llm-d-router may hold that GIE does not register, with the reason a sentence gives.
REMOVED_OR_LATER = {
    GIE_VERSION: dict((ptype, _NOTES.get(ptype, "an llm-d-router plugin type")) for ptype in
                      set(LLM_D_PLUGINS[LLM_D_VERSION]) - set(_V140) | set(_NOTES)),
}

FEATURE_GATES = {
    # cmd/epp/runner/runner.go parseConfigurationPhaseOne: loader.RegisterFeatureGate (pkg/epp/datalayer/factory.go,
    # pkg/epp/flowcontrol/config.go).
    GIE_VERSION: frozenset(["dataLayer", "flowControl", "prepareDataPlugins"]),
}

_API = GIE_SOURCE + "apix/config/v1alpha1/endpointpickerconfig_types.go"
_REF = obj({"pluginRef": STR}, _API)
_BAND = obj({"priority": integer(), "maxBytes": integer(), "fairnessPolicyRef": STR, "orderingPolicyRef": STR}, _API)

CONFIG_SCHEMA = {
    GIE_VERSION: obj({
        "apiVersion": STR,
        "kind": STR,
        "featureGates": list_of(STR),
        "plugins": list_of(obj({"name": STR, "type": STR, "parameters": ANY}, _API)),
        "schedulingProfiles": list_of(obj({
            "name": STR,
            "plugins": list_of(obj({"pluginRef": STR, "weight": number()}, _API)),
        }, _API)),
        # metav1.Duration decodes a Go duration string; out-of-range thresholds fall back to the defaults
        # (buildSaturationConfig in configloader.go).
        "saturationDetector": obj({"queueDepthThreshold": integer(), "kvCacheUtilThreshold": number(),
                                   "metricsStalenessThreshold": GO_DURATION}, _API),
        "data": obj({"sources": list_of(obj({"pluginRef": STR, "extractors": list_of(_REF)}, _API))}, _API),
        "flowControl": obj({"maxBytes": integer(), "defaultRequestTTL": GO_DURATION, "defaultPriorityBand": _BAND,
                            "priorityBands": list_of(_BAND)}, _API),
    }, _API),
}

# Top-level fields of the other router's EndpointPickerConfig, with what a sentence says about them.
TOP_LEVEL_NOTES = {
    "dataLayer": "llm-d-router's name for what GIE calls data",
    "requestHandler": "llm-d-router only",
    "parser": "llm-d-router only",
}

# BEHAVIOUR[version][rule] = (kind, sentence, source), as in plugins.BEHAVIOUR; each one run with the GIE EPP v1.4.0
# (the module docstring).
BEHAVIOUR = {
    GIE_VERSION: {
        # LoadRawConfig: len(configBytes) == 0 -> loadDefaultConfig() (defaults.go).
        "empty-config": (
            WARNING,
            "The EndpointPickerConfig is empty; GIE {version} then logs \"A configuration wasn't specified. A default one is "
            "being used.\" and starts with its default configuration (queue-scorer, kv-cache-utilization-scorer and "
            "prefix-cache-scorer at weights 2, 2 and 3), not one written for these engines.",
            _LOADER),
        # ensureSchedulingLayer: no profile -> profile default of every filter, scorer and picker (none), then a
        # single-profile-handler and a max-score-picker; only zero bytes are the default configuration.
        "no-plugins": (
            WARNING,
            "plugins is empty; GIE {version} does not then use its default configuration (only an empty file does), so no "
            "scorer runs: a scheduling profile without plugins gets only the max-score-picker the EPP adds, and every "
            "request goes to a random endpoint.",
            _DEFAULTS),
        "negative-weight": (
            WARNING,
            "Scheduling profile {profile} gives {plugin} the weight {weight}; GIE {version} accepts a negative weight as it "
            "is, so a higher score from {plugin} makes an endpoint less likely to be picked.",
            _LOADER),
        # Every factory: json.Unmarshal(rawParameters, &parameters), no DisallowUnknownFields.
        "ignored-parameter": (
            WARNING,
            "{where} is not a field of {ptype} in GIE {version}; GIE decodes parameters with a plain json.Unmarshal, so it "
            "ignores the field and starts without it.",
            _PREFIX),
        # New: config.BlockSize > 0 && config.BlockSizeTokens <= 0 -> error.
        "prefix-block-size": (
            REFUSED,
            "{label} sets blockSize (characters, deprecated) without blockSizeTokens; GIE {version} refuses it (\"BlockSize "
            "is depricated, use BlockSizeTokens instead\") and does not start.",
            _PREFIX),
        # buildDataLayerConfig: gate on and no data.sources; runner.go setupDataLayer: gate on and no source.
        "data-layer-without-sources": (
            REFUSED,
            "Feature gate dataLayer is on but data.sources lists no data source; GIE {version} then refuses to start "
            "(\"You must specify the Data section\" or \"data layer enabled but no data sources configured\").",
            _LOADER),
        # runner.go setupDataLayer: without the gate the metrics extractor is disallowed (pkg/epp/datalayer/config.go).
        "metrics-extractor-ungated": (
            REFUSED,
            "data.sources entry {source} lists the metrics extractor {extractor} but feature gate dataLayer is off; GIE {version} "
            "then refuses it (\"disallowed Extractor\") and does not start.",
            RUNNER),
        # NotificationSourceFactory: params.Version == "" || params.Kind == "" -> error (factory.go 53-55; json.Unmarshal
        # leaves an absent field empty). Run with the GIE EPP v1.4.0: "failed to parse configuration".
        "notification-source-without-gvk": (
            REFUSED,
            "{label} sets no {missing}; GIE {version} refuses a k8s-notification-source without its version and kind "
            "(\"version and kind are required for k8s-notification-source\") and does not start.",
            _NOTIFICATIONS + "#L53-L55"),
        # ModelServerExtractorFactory, over the user's engineConfigs and the built-in vllm and sglang: engineConfig.Name ==
        # "" -> error (factories.go 123-125); == DefaultEngineType -> error (126-128).
        "metrics-engine-without-name": (
            REFUSED,
            "{label} has an engineConfigs entry without a name (entry {index}); GIE {version} refuses it (\"engine config "
            "name cannot be empty\") and does not start.",
            _METRICS_EXTRACTOR + "#L123-L125"),
        "metrics-engine-reserved-name": (
            REFUSED,
            "{label} names an engineConfigs entry default (entry {index}), the name GIE {version} reserves for the default "
            "engine's mapping, so it refuses the entry (\"engine config name cannot be ... (reserved)\") and does not start.",
            _METRICS_EXTRACTOR + "#L126-L128"),
        # registry.Register: a second mapping for one engine name -> error (factories.go 141-144, mapping_registry.go 55-57).
        "metrics-engine-twice": (
            REFUSED,
            "{label} defines engine {engine} in two engineConfigs entries; GIE {version} registers each engine once and "
            "refuses the second (\"mapping for engine type ... already exists\"), so it does not start.",
            _METRICS_EXTRACTOR + "#L141-L144"),
        # No engine config named cfg.DefaultEngine (an empty defaultEngine is vllm) -> error (factories.go 152-155).
        "metrics-default-engine-undefined": (
            REFUSED,
            "{label} sets defaultEngine {engine}, which is neither an engineConfigs entry nor a built-in engine (vllm, "
            "sglang); GIE {version} refuses it (\"defaultEngine ... not found in engineConfigs\") and does not start.",
            _METRICS_EXTRACTOR + "#L152-L155"),
        # InstantiateAndConfigure reads flowControl only when featureGates[flowcontrol.FeatureGate].
        "flow-control-ungated": (
            WARNING,
            "flowControl is set but feature gate flowControl is not, so GIE {version} ignores the section.",
            _LOADER),
    },
}


def notification_source_missing(plugin_type, params):
    """What a k8s-notification-source's parameters lack of version and kind, as a phrase (empty when nothing is missing).

    NotificationSourceFactory refuses an empty version or kind (factory.go 53-55); Go's json.Unmarshal matches the keys
    case-insensitively and leaves an absent one empty. Parameters that are absent or not a mapping are other rules'.
    """
    if plugin_type != NOTIFICATION_SOURCE or not is_mapping(params):
        return ""
    missing = [name for name in ("version", "kind") if param(params, name) in (None, "")]
    return " or ".join(missing)


def _engine_configs(params):
    """The engineConfigs entries that are mappings, with their index (an entry of another type is a schema finding)."""
    return [(index, entry) for index, entry in enumerate(as_list(param(params, "engineConfigs"))) if is_mapping(entry)]


def metrics_engine_problem(plugin_type, params):
    """The first engine of a metrics extractor's parameters that ModelServerExtractorFactory refuses, in its order, as
    ``(behaviour, fields)``, or ``None``.

    The factory appends the built-in vllm and sglang unless an entry has their name, then walks the entries: a name that
    is empty (123-125) or the reserved default (126-128) fails, and so does a second entry of one name (registry.Register,
    141-144); last, defaultEngine (empty: vllm) must name one of them (152-155). A name or defaultEngine of the wrong type
    is a parameter finding of the schema, not this.
    """
    if plugin_type != METRICS_EXTRACTOR or not is_mapping(params):
        return None
    seen = set()
    for index, entry in _engine_configs(params):
        name = param(entry, "name")
        if not isinstance(name, (str, type(None))):
            return None
        if not name:
            return "metrics-engine-without-name", {"index": index}
        if name == RESERVED_ENGINE:
            return "metrics-engine-reserved-name", {"index": index}
        if name in seen:
            return "metrics-engine-twice", {"engine": name}
        seen.add(name)
    engine = param(params, "defaultEngine")
    if isinstance(engine, str) and engine and engine not in seen | set(BUILT_IN_ENGINES):
        return "metrics-default-engine-undefined", {"engine": engine}
    return None


def engine_rule(behaviour):
    """The ``when`` and ``fields`` of the rule of one metrics-engine behaviour (:mod:`.rules`): it fires on a plugin whose
    first refused engine (:func:`metrics_engine_problem`) is of that behaviour, and says which."""
    def when(_config, subject):
        found = metrics_engine_problem(subject.ptype, subject.params)
        return found is not None and found[0] == behaviour

    def fields(_config, subject):
        return metrics_engine_problem(subject.ptype, subject.params)[1]
    return {"when": when, "fields": fields}


# loadDefaultConfig (defaults.go): what the EPP runs when its config is empty.
DEFAULT_CONFIG = {
    GIE_VERSION: {
        "apiVersion": API_VERSION, "kind": "EndpointPickerConfig",
        "plugins": [{"type": "queue-scorer"}, {"type": "kv-cache-utilization-scorer"}, {"type": PREFIX_SCORER}],
        "schedulingProfiles": [{"name": "default", "plugins": [
            {"pluginRef": "queue-scorer", "weight": 2.0}, {"pluginRef": "kv-cache-utilization-scorer", "weight": 2.0},
            {"pluginRef": PREFIX_SCORER, "weight": 3.0}]}],
    },
}

# What the module's own arguments cannot ask of GIE (kind input): precise routing needs a KV-event consumer, and
# registerInTreePlugins registers none.
PRECISE_MODE = (
    "mode precise needs a KV-event consumer, and GIE {version} has none (approximate prefix-cache scoring only); use "
    "router_impl llm-d for precise routing.", RUNNER)


# The EPP's command-line flags: every flag it defines (pkg/epp/server/options.go AddFlags, with controller-runtime's zap
# flags, pkg/log/zap BindFlags); cmd/epp/runner/runner.go parses them with pflag.CommandLine (ExitOnError), so any other
# flag stops the EPP at start. REMOVED_FLAGS: the metric flags it still defines but refuses when set (options.go Validate:
# "flag ... is deprecated and cannot be used; configure metrics via engineConfigs"). Read at
# gateway-api-inference-extension@v1.4.0:pkg/epp/server/options.go (133-197, 240-251); `epp --help` of the build agrees
# (tests/integration/test_render_router_hardening.py holds both against it). epp/flags.py refuses what a user passes.
REMOVED_FLAGS = ("total-queued-requests-metric", "total-running-requests-metric", "kv-cache-usage-percentage-metric",
                 "lora-info-metric", "cache-info-metric")
FLAGS = (
    "grpc-port", "ha-enable-leader-election", "pool-group", "pool-namespace", "pool-name", "endpoint-selector",
    "endpoint-target-ports", "disable-endpoint-subset-filter", "model-server-metrics-scheme", "model-server-metrics-path",
    "model-server-metrics-port", "model-server-metrics-https-insecure-skip-verify", "refresh-metrics-interval",
    "refresh-prometheus-metrics-interval", "metrics-staleness-threshold") + REMOVED_FLAGS + (
    "v", "zap-devel", "zap-encoder", "zap-log-level", "zap-stacktrace-level", "zap-time-encoding", "tracing",
    "health-checking", "metrics-port", "grpc-health-port", "enable-pprof", "cert-path", "enable-cert-reload", "secure-serving",
    "metrics-endpoint-auth", "config-file", "config-text")
