# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""What each llm-d router version accepts in an EndpointPickerConfig: plugin types and their parameter fields.

Plain data (plus two small look-up helpers), no Ansible import. Read from the router's Go structs and their
``json`` tags at the tag named in each entry's ``source``; the nested kv-cache structs of the precise producer come
from ``llm-d/llm-d-kv-cache`` (see :data:`KV_CACHE_REF`).

Public names (the collection's tests import them, e.g. the render tests):

- ``ROUTER_VERSIONS``: the router versions encoded here, oldest first; ``DEFAULT_ROUTER_VERSION`` is the pinned one.
- ``PLUGINS[version][plugin_type]``: a dict with ``source`` (``repo@tag:path`` of the factory), ``roles`` (a frozenset
  of role names, see ``ROLES``), ``params`` (the schema of ``parameters``, or ``None`` when the factory ignores them),
  ``legacy_params`` (a second, deprecated parameter shape the factory also accepts, or ``None``), ``requires_params``
  (the factory fails without ``parameters``) and ``deprecated`` (what replaces the type, or ``None``).
- ``CONFIG_SCHEMA[version]``: the schema of the EndpointPickerConfig top level (``apix/config/v1alpha1``).
- ``FEATURE_GATES[version]``: the feature gate names the EPP registers.
- ``REMOVED_OR_LATER[version]``: plugin types a user may expect that this version does not register, with a note.
- ``allowed_fields(plugin_type, path=(), version=DEFAULT_ROUTER_VERSION)``: the sorted field names accepted at
  ``path`` inside that plugin's ``parameters`` (``path`` is a tuple of field names, e.g.
  ``("kvEventsConfig", "podDiscoveryConfig")``); raises ``KeyError`` for an unknown type or path.
- ``plugin_types(version=DEFAULT_ROUTER_VERSION, role=None)``: the sorted registered type names, optionally of a role.

Schemas are built with :mod:`.schema` (``obj``, ``list_of``, ...); ``schema.validate`` checks a value. The same tables
for the Gateway API Inference Extension's own EPP (``router_impl: gie``) are in :mod:`.gie`.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

from ..common import wiring
from ..kv.router_decoder import KV_CACHE_VERSION
from .schema import ANY, BOOL, GO_DURATION, NANOSECONDS, QUANTITY, STR, enum, fields_at, integer, list_of, map_of, number, obj

# The router version is the collection's one (common/wiring.py); every table below is keyed by it and was read at it.
ROUTER_VERSION = wiring.ROUTER_VERSION
ROUTER_VERSIONS = wiring.ROUTER_VERSIONS
DEFAULT_ROUTER_VERSION = ROUTER_VERSION

# llm-d-router's go.mod at ROUTER_VERSION requires github.com/llm-d/llm-d-kv-cache KV_CACHE_VERSION (no replace, no
# vendor directory). The Go module proxy serves that module at exactly that tag (origin refs/tags/v0.9.0, commit
# 7bfda47); every path, struct and json tag the kv-cache entries below cite was checked there.
KV_CACHE_REF = "llm-d/llm-d-kv-cache@%s" % KV_CACHE_VERSION

ROLES = frozenset([
    "filter", "scorer", "picker", "profile-handler", "decider", "pre-request", "producer", "prefix-producer",
    "token-producer", "inflight-load-producer", "latency-producer", "mm-producer", "data-source", "extractor",
    "endpoint-extractor", "parser", "saturation-detector", "fairness-policy", "ordering-policy",
    "usage-limit-policy", "admitter", "discovery", "test",
])

_R9 = "llm-d/llm-d-router@%s:" % ROUTER_VERSION
ROUTER_SOURCE = _R9  # the prefix of every citation of the router's code (``ROUTER_SOURCE + path``)
_P9 = _R9 + "pkg/epp/framework/plugins/"
_KV = KV_CACHE_REF + ":"
_APIMACHINERY = "k8s.io/apimachinery/pkg/apis/meta/v1:LabelSelector"

# --- nested structs shared by several plugin types ---------------------------------------------------------

LABEL_SELECTOR = obj({
    "matchLabels": map_of(STR),
    "matchExpressions": list_of(obj({"key": STR, "operator": STR, "values": list_of(STR)}, _APIMACHINERY)),
}, _APIMACHINERY)

TOKEN_PROCESSOR_CONFIG = obj({
    # NewChunkedTokenDatabase (same file): 0 means the default 16, a negative size is refused.
    "blockSize": integer(0),
    "blockSizeTokens": integer(0),
    "hashSeed": STR,
}, _KV + "pkg/kvcache/kvblock/token_processor.go",
    deprecated={"blockSize": "is deprecated in favour of blockSizeTokens"})

_REDIS = obj({"address": STR, "backendType": STR, "enableRDMA": BOOL}, _KV + "pkg/kvcache/kvblock/redis.go")
_BACKEND = obj({"name": STR, "weight": number()}, _KV + "pkg/kvcache/backend.go")
_UDS_TOKENIZER = obj({"socketFile": STR, "useTCP": BOOL, "modelTokenizerMap": map_of(STR)},
                     _KV + "pkg/tokenization/uds_tokenizer.go")

INDEXER_CONFIG = obj({
    "kvBlockIndexConfig": obj({
        "inMemoryConfig": obj({"size": integer(), "podCacheSize": integer()}, _KV + "pkg/kvcache/kvblock/in_memory.go"),
        "redisConfig": _REDIS,
        "valkeyConfig": _REDIS,
        "costAwareMemoryConfig": obj({"size": STR}, _KV + "pkg/kvcache/kvblock/cost_aware_memory.go"),
        "enableMetrics": BOOL,
        "metricsLoggingInterval": NANOSECONDS,
    }, _KV + "pkg/kvcache/kvblock/index.go"),
    # An exported field without a json tag: Go matches it by its field name (case-insensitively).
    "KVBlockScorerConfig": obj({"ScoringStrategy": STR, "backendConfigs": list_of(_BACKEND)},
                               _KV + "pkg/kvcache/kvblock_scorer.go"),
    "kvCacheBackendConfigs": list_of(_BACKEND),
    "tokenizersPoolConfig": obj({"modelName": STR, "workersCount": integer(), "uds": _UDS_TOKENIZER},
                                _KV + "pkg/tokenization/pool_uds.go"),
}, _KV + "pkg/kvcache/indexer.go")

KV_EVENTS_CONFIG = obj({
    "zmqEndpoint": STR,
    "topicFilter": STR,
    # No range here: 0 and negative values decode, and what the EPP then does is in BEHAVIOUR (zero-concurrency,
    # negative-concurrency).
    "concurrency": integer(),
    "engineType": STR,
    "discoverPods": BOOL,
    "podDiscoveryConfig": obj({
        "podLabelSelector": STR,
        "podNamespace": STR,
        # Not validated by the EPP, which dials tcp://<pod IP>:<socketPort + rank> (preciseprefixcache/extractor.go):
        # outside 1..65535 no engine is ever reached.
        "socketPort": integer(1, 65535),
    }, _KV + "pkg/kvevents/pool.go"),
}, _KV + "pkg/kvevents/pool.go")

PRECISE_PARAMS = obj({
    "tokenProcessorConfig": TOKEN_PROCESSOR_CONFIG,
    "indexerConfig": INDEXER_CONFIG,
    "kvEventsConfig": KV_EVENTS_CONFIG,
    "speculativeIndexing": BOOL,
    "speculativeTTL": GO_DURATION,
}, _P9 + "requestcontrol/dataproducer/preciseprefixcache/producer.go")

_TOKENIZER_SRC = _P9 + "requestcontrol/dataproducer/tokenizer/tokenizer.go"
TOKEN_PRODUCER_PARAMS = obj({
    "udsTokenizerConfig": _UDS_TOKENIZER,
    "vllm": obj({"url": STR, "timeout": GO_DURATION, "mmTimeout": GO_DURATION},
                _P9 + "requestcontrol/dataproducer/tokenizer/vllm_http.go"),
    "estimate": obj({"image": obj({
        "mode": enum("", "dynamic", "static"),
        "defaultResolution": obj({"width": integer(), "height": integer()}, _TOKENIZER_SRC),
        "static": obj({"staticToken": integer()}, _TOKENIZER_SRC),
        "dynamic": obj({"factor": integer()}, _TOKENIZER_SRC),
    }, _TOKENIZER_SRC)}, _TOKENIZER_SRC),
    "modelName": STR,
}, _TOKENIZER_SRC, deprecated={"udsTokenizerConfig": "is deprecated (the gRPC-over-UDS backend); use vllm"})

_PICKER = obj({"maxNumOfEndpoints": integer()}, _P9 + "scheduling/picker/common.go")
_HTTP_SOURCE = {"scheme": STR, "path": STR, "insecureSkipVerify": BOOL}
_SESSION = {"headerName": STR, "profileName": STR}

_METRICS_ENGINE = obj({
    "name": STR, "queuedRequestsSpec": STR, "runningRequestsSpec": STR, "kvUsageSpec": STR, "loraSpec": STR,
    "cacheInfoSpec": STR, "cacheBlockSizeLabelName": STR, "cacheNumBlocksLabelName": STR, "cacheBlockSizeSpec": STR,
    "cacheNumBlocksSpec": STR,
    "customMetrics": list_of(obj({"attributeKey": STR, "metricSpec": STR}, _P9 + "datalayer/extractor/metrics/factories.go")),
}, _P9 + "datalayer/extractor/metrics/factories.go")

_DISAGG_SRC = _P9 + "scheduling/profilehandler/disagg/disagg_profile_handler.go"


def _plugin(source, roles, params=None, deprecated=None, legacy_params=None, requires_params=False):
    return {"source": source, "roles": frozenset(roles.split()), "params": params, "legacy_params": legacy_params,
            "deprecated": deprecated, "requires_params": requires_params}


# Registered in cmd/epp/runner/runner.go (registerInTreePlugins) at ROUTER_VERSION, 71 types. The two eviction plugins that
# register themselves in init() (sheddable-eviction-filter, priority-then-time-eviction-order-policy) are in no
# package the EPP binary imports, so the EPP does not know them.
_V090 = {
    # scheduling filters
    "label-selector-filter": _plugin(_P9 + "scheduling/filter/bylabel/selector.go", "filter", LABEL_SELECTOR),
    "by-label-selector": _plugin(_P9 + "scheduling/filter/bylabel/selector.go", "filter", LABEL_SELECTOR,
                                 deprecated="label-selector-filter"),
    "by-label": _plugin(_P9 + "scheduling/filter/bylabel/filter.go", "filter",
                        obj({"label": STR, "validValues": list_of(STR), "allowsNoLabel": BOOL}, _P9 + "scheduling/filter/bylabel/filter.go"),
                        deprecated="label-selector-filter, or decode-filter/prefill-filter/encode-filter for roles"),
    "encode-filter": _plugin(_P9 + "scheduling/filter/bylabel/roles.go", "filter"),
    "decode-filter": _plugin(_P9 + "scheduling/filter/bylabel/roles.go", "filter"),
    "prefill-filter": _plugin(_P9 + "scheduling/filter/bylabel/roles.go", "filter"),
    "session-affinity-filter": _plugin(_P9 + "scheduling/filter/sessionaffinity/session_affinity.go", "filter",
                                       obj(_SESSION, _P9 + "scheduling/filter/sessionaffinity/session_affinity.go")),
    # Ranges and ttftSource values: Config.validate in the same file.
    "prefix-cache-affinity-filter": _plugin(_P9 + "scheduling/filter/prefixcacheaffinity/plugin.go", "filter", obj({
        "affinityThreshold": number(maximum=1), "explorationProbability": number(0, 1), "maxTTFTPenaltyMs": number(0),
        "ttftSource": enum("latencyPredictor", "prefillThroughput"), "peakPrefillThroughput": number(0),
        "prefixMatchInfoProducerName": STR,
        "latencyPredictionInfoProducerName": STR, "inFlightLoadProducerName": STR,
    }, _P9 + "scheduling/filter/prefixcacheaffinity/plugin.go")),
    "slo-headroom-tier-filter": _plugin(_P9 + "scheduling/filter/sloheadroomtier/plugin.go", "filter", obj({
        "epsilonExploreNeg": number(), "latencyPredictionInfoProducerName": STR,
    }, _P9 + "scheduling/filter/sloheadroomtier/plugin.go")),
    "header-based-testing-filter": _plugin(_P9 + "scheduling/test/filter/request_header_based_filter.go", "filter test"),
    "context-length-aware": _plugin(_P9 + "scheduling/scorer/contextlengthaware/context_length_aware.go", "filter scorer", obj({
        "label": STR, "enableFiltering": BOOL,
    }, _P9 + "scheduling/scorer/contextlengthaware/context_length_aware.go")),
    # scorers
    "load-aware-scorer": _plugin(_P9 + "scheduling/scorer/loadaware/load_aware.go", "scorer",
                                 obj({"threshold": integer()}, _P9 + "scheduling/scorer/loadaware/load_aware.go")),
    "session-affinity-scorer": _plugin(_P9 + "scheduling/scorer/sessionaffinity/session_affinity.go", "scorer",
                                       obj(_SESSION, _P9 + "scheduling/scorer/sessionaffinity/session_affinity.go")),
    "prefix-cache-scorer": _plugin(_P9 + "scheduling/scorer/prefix/plugin.go", "scorer",
                                   obj({"prefixMatchInfoProducerName": STR}, _P9 + "scheduling/scorer/prefix/plugin.go")),
    "kv-cache-utilization-scorer": _plugin(_P9 + "scheduling/scorer/kvcacheutilization/kvcache_utilization.go", "scorer"),
    "queue-scorer": _plugin(_P9 + "scheduling/scorer/queuedepth/queue.go", "scorer"),
    "running-requests-size-scorer": _plugin(_P9 + "scheduling/scorer/runningrequests/runningrequest.go", "scorer"),
    "lora-affinity-scorer": _plugin(_P9 + "scheduling/scorer/loraaffinity/lora_affinity.go", "scorer"),
    "token-load-scorer": _plugin(_P9 + "scheduling/scorer/tokenload/token_load.go", "scorer", obj({
        "queueThresholdTokens": integer(), "inFlightLoadProducerName": STR,
    }, _P9 + "scheduling/scorer/tokenload/token_load.go")),
    "no-hit-lru-scorer": _plugin(_P9 + "scheduling/scorer/nohitlru/no_hit_lru.go", "scorer", obj({
        "prefixPluginType": STR, "prefixPluginName": STR, "lruSize": integer(), "prefixMatchInfoProducerName": STR,
    }, _P9 + "scheduling/scorer/nohitlru/no_hit_lru.go")),
    "active-request-scorer": _plugin(_P9 + "scheduling/scorer/activerequest/active_request.go", "scorer", obj({
        "requestTimeout": STR, "idleThreshold": integer(), "maxBusyScore": number(), "inFlightLoadProducerName": STR,
    }, _P9 + "scheduling/scorer/activerequest/active_request.go",
        deprecated={"requestTimeout": "is deprecated and ignored (inflight-load-producer tracks requests)"})),
    "precise-prefix-cache-scorer": _plugin(_P9 + "scheduling/scorer/preciseprefixcache/precise_prefix_cache.go",
                                           "scorer producer prefix-producer endpoint-extractor", PRECISE_PARAMS,
                                           deprecated="precise-prefix-cache-producer plus prefix-cache-scorer with "
                                                      "prefixMatchInfoProducerName"),
    "mm-embeddings-cache-scorer": _plugin(_P9 + "scheduling/scorer/mmcacheaffinity/scorer.go", "scorer",
                                          obj({"producerName": STR}, _P9 + "scheduling/scorer/mmcacheaffinity/scorer.go")),
    "latency-scorer": _plugin(_P9 + "scheduling/scorer/latency/plugin.go", "scorer", obj({
        "ttftWeight": number(), "tpotWeight": number(), "headroomSelectionStrategy": STR, "compositeKVWeight": number(),
        "compositeQueueWeight": number(), "compositePrefixWeight": number(), "latencyPredictionInfoProducerName": STR,
        "prefixMatchInfoProducerName": STR,
    }, _P9 + "scheduling/scorer/latency/plugin.go")),
    # pickers
    "max-score-picker": _plugin(_P9 + "scheduling/picker/maxscore/picker.go", "picker", _PICKER),
    "random-picker": _plugin(_P9 + "scheduling/picker/random/picker.go", "picker", _PICKER),
    "weighted-random-picker": _plugin(_P9 + "scheduling/picker/weightedrandom/picker.go", "picker", _PICKER),
    # profile handlers, deciders and the disaggregation headers
    "single-profile-handler": _plugin(_P9 + "scheduling/profilehandler/single/single_profile_handler.go", "profile-handler"),
    "data-parallel-profile-handler": _plugin(
        _P9 + "scheduling/profilehandler/dataparallel/dp_profile_handler.go", "profile-handler",
        obj({"primaryPort": integer(0, 65535)}, _P9 + "scheduling/profilehandler/dataparallel/dp_profile_handler.go")),
    "pd-profile-handler": _plugin(_P9 + "scheduling/profilehandler/disagg/pd_profile_handler.go", "profile-handler", obj({
        "decodeProfile": STR, "prefillProfile": STR, "prefixPluginType": STR, "prefixPluginName": STR,
        "primaryPort": integer(0, 65535), "deciderPluginName": STR, "prefixMatchInfoProducerName": STR,
    }, _P9 + "scheduling/profilehandler/disagg/pd_profile_handler.go"), deprecated="disagg-profile-handler"),
    "disagg-profile-handler": _plugin(_DISAGG_SRC, "profile-handler pre-request", obj({
        "profiles": obj({"decode": STR, "prefill": STR, "encode": STR}, _DISAGG_SRC),
        "deciders": obj({"prefill": STR, "encode": STR}, _DISAGG_SRC),
    }, _DISAGG_SRC), legacy_params=obj({
        "decodeProfile": STR, "prefillProfile": STR, "encodeProfile": STR, "prefillDeciderPluginName": STR,
        "encodeDeciderPluginName": STR, "deciderPluginName": STR,
    }, _DISAGG_SRC)),
    "always-disagg-pd-decider": _plugin(_P9 + "scheduling/profilehandler/disagg/always_disagg_pd_decider.go", "decider"),
    "prefix-based-pd-decider": _plugin(_P9 + "scheduling/profilehandler/disagg/prefix_based_pd_decider.go", "decider",
                                       obj({"nonCachedTokens": integer(0)},  # PrefixBasedPDDeciderConfig.validate
                                           _P9 + "scheduling/profilehandler/disagg/prefix_based_pd_decider.go")),
    "always-disagg-multimodal-decider": _plugin(_P9 + "scheduling/profilehandler/disagg/always_disagg_mm_decider.go", "decider"),
    "disagg-headers-handler": _plugin(_P9 + "scheduling/profilehandler/disagg/disagg_headers_handler.go", "pre-request",
                                      obj({"prefillProfile": STR, "encodeProfile": STR},
                                          _P9 + "scheduling/profilehandler/disagg/disagg_headers_handler.go"),
                                      deprecated="disagg-profile-handler"),
    "prefill-header-handler": _plugin(_P9 + "scheduling/profilehandler/disagg/disagg_headers_handler.go", "pre-request",
                                      obj({"prefillProfile": STR, "encodeProfile": STR},
                                          _P9 + "scheduling/profilehandler/disagg/disagg_headers_handler.go"),
                                      deprecated="disagg-profile-handler"),
    # request-level data producers
    "approx-prefix-cache-producer": _plugin(_P9 + "requestcontrol/dataproducer/approximateprefix/plugin.go",
                                            "producer prefix-producer", obj({
                                                "autoTune": BOOL, "blockSizeTokens": integer(), "blockSize": integer(),
                                                # newDataProducer (plugin.go): maxPrefixTokensToMatch >= 0
                                                "maxPrefixBlocksToMatch": integer(), "maxPrefixTokensToMatch": integer(0),
                                                "lruCapacityPerServer": integer(),
                                            }, _P9 + "requestcontrol/dataproducer/approximateprefix/types.go", deprecated={
                                                "blockSize": "is deprecated (characters); use blockSizeTokens",
                                                "maxPrefixBlocksToMatch": "is deprecated; use maxPrefixTokensToMatch"})),
    "precise-prefix-cache-producer": _plugin(_P9 + "requestcontrol/dataproducer/preciseprefixcache/producer.go",
                                             "producer prefix-producer endpoint-extractor", PRECISE_PARAMS),
    "inflight-load-producer": _plugin(_P9 + "requestcontrol/dataproducer/inflightload/producer.go",
                                      "producer inflight-load-producer", obj({
                                          "addEstimatedOutputTokens": BOOL, "prefixMatchInfoProducerName": STR,
                                      }, _P9 + "requestcontrol/dataproducer/inflightload/producer.go")),
    "mm-embeddings-cache-producer": _plugin(_P9 + "requestcontrol/dataproducer/multimodal/producer.go", "producer mm-producer",
                                            obj({"cacheSizeInMBPerServer": integer()},
                                                _P9 + "requestcontrol/dataproducer/multimodal/producer.go")),
    "predicted-latency-producer": _plugin(_P9 + "requestcontrol/dataproducer/predictedlatency/plugin.go",
                                          "producer latency-producer", obj({
                                              "samplingMean": number(), "maxDecodeTokenSamplesForPrediction": integer(),
                                              "sloBufferFactor": number(), "contextTTL": NANOSECONDS, "streamingMode": BOOL,
                                              "endpointRoleLabel": STR, "predictInProduce": BOOL,
                                              "prefixMatchInfoProducerName": STR,
                                          }, _P9 + "requestcontrol/dataproducer/predictedlatency/plugin.go")),
    "token-producer": _plugin(_TOKENIZER_SRC, "producer token-producer", TOKEN_PRODUCER_PARAMS),
    "tokenizer": _plugin(_TOKENIZER_SRC, "producer token-producer", TOKEN_PRODUCER_PARAMS, deprecated="token-producer"),
    "session-id-producer": _plugin(_P9 + "requestcontrol/dataproducer/sessionid/producer.go", "producer",
                                   obj({"headerName": STR, "cookieName": STR},
                                       _P9 + "requestcontrol/dataproducer/sessionid/producer.go")),
    # flow control
    "global-strict-fairness-policy": _plugin(_P9 + "flowcontrol/fairness/globalstrict/global_strict.go", "fairness-policy"),
    "round-robin-fairness-policy": _plugin(_P9 + "flowcontrol/fairness/roundrobin/roundrobin.go", "fairness-policy"),
    # Ranges: Config.validate in the same file (0 written out is a value, not "unset": validate sees it).
    "program-aware-fairness": _plugin(_P9 + "flowcontrol/fairness/program-aware/plugin.go", "fairness-policy", obj({
        "strategy": STR, "evictionTtlSeconds": number(0), "evictionSweepSeconds": number(above=0), "lasWeightService": number(0),
        "lasWeightHeadWait": number(0), "lasDecayFactor": number(maximum=1, above=0), "lasHalfLifeSeconds": number(0),
    }, _P9 + "flowcontrol/fairness/program-aware/plugin.go")),
    "fcfs-ordering-policy": _plugin(_P9 + "flowcontrol/ordering/fcfs/fcfs.go", "ordering-policy"),
    "edf-ordering-policy": _plugin(_P9 + "flowcontrol/ordering/edf/edf.go", "ordering-policy"),
    "slo-deadline-ordering-policy": _plugin(_P9 + "flowcontrol/ordering/slodeadline/slo_deadline.go", "ordering-policy"),
    "static-usage-limit-policy": _plugin(_P9 + "flowcontrol/usagelimits/usagelimitpolicy.go", "usage-limit-policy",
                                         obj({"threshold": number()}, _P9 + "flowcontrol/usagelimits/usagelimitpolicy.go")),
    "concurrency-detector": _plugin(_P9 + "flowcontrol/saturationdetector/concurrency/detector.go", "saturation-detector", obj({
        "maxConcurrency": integer(), "headroom": number(), "concurrencyMode": enum("requests", "tokens"),
        "maxTokenConcurrency": integer(), "inFlightLoadProducerName": STR,
    }, _P9 + "flowcontrol/saturationdetector/concurrency/config.go")),
    "utilization-detector": _plugin(_P9 + "flowcontrol/saturationdetector/utilization/detector.go", "saturation-detector", obj({
        "queueDepthThreshold": integer(), "kvCacheUtilThreshold": number(), "metricsStalenessThreshold": GO_DURATION,
        "headroom": number(),
    }, _P9 + "flowcontrol/saturationdetector/utilization/config.go")),
    # admission and other request-control plugins
    "latency-slo-admitter": _plugin(_P9 + "requestcontrol/admitter/latencyslo/plugin.go", "admitter",
                                    obj({"latencyPredictionInfoProducerName": STR}, _P9 + "requestcontrol/admitter/latencyslo/plugin.go")),
    "probabilistic-admitter": _plugin(_P9 + "requestcontrol/admitter/probabilisticadmitter/plugin.go", "admitter", obj({
        "queueDepthThreshold": integer(), "kvCacheUtilThreshold": number(), "power": number(), "k": number(),
    }, _P9 + "requestcontrol/admitter/probabilisticadmitter/plugin.go")),
    "agent-identity": _plugin(_P9 + "requestcontrol/preadmitter/agentidentity/agent_identity.go", "pre-request",
                              obj({"additionalSessionHeaders": list_of(STR)}, _P9 + "requestcontrol/preadmitter/agentidentity/agent_identity.go")),
    "request-attribute-reporter": _plugin(_P9 + "requestcontrol/requestattributereporter/plugin.go", "pre-request", obj({
        "attributes": list_of(obj({
            "key": obj({"namespace": STR, "name": STR}, _P9 + "requestcontrol/requestattributereporter/plugin.go"),
            "expression": STR, "condition": STR,
        }, _P9 + "requestcontrol/requestattributereporter/plugin.go")),
    }, _P9 + "requestcontrol/requestattributereporter/plugin.go"), requires_params=True),
    "destination-endpoint-served-verifier": _plugin(
        _P9 + "requestcontrol/test/responsereceived/destination_endpoint_served_verifier.go", "test"),
    # data layer
    "metrics-data-source": _plugin(_P9 + "datalayer/source/metrics/datasource.go", "data-source",
                                   obj(_HTTP_SOURCE, _P9 + "datalayer/source/metrics/datasource.go")),
    "models-data-source": _plugin(_P9 + "datalayer/source/models/datasource.go", "data-source",
                                  obj(_HTTP_SOURCE, _P9 + "datalayer/source/models/datasource.go")),
    "k8s-notification-source": _plugin(_P9 + "datalayer/source/notifications/factory.go", "data-source",
                                       obj({"group": STR, "version": STR, "kind": STR}, _P9 + "datalayer/source/notifications/factory.go"),
                                       requires_params=True),
    "endpoint-notification-source": _plugin(_P9 + "datalayer/source/notifications/factory.go", "data-source"),
    "core-metrics-extractor": _plugin(_P9 + "datalayer/extractor/metrics/factories.go", "extractor", obj({
        "engineLabelKey": STR, "defaultEngine": STR, "engineConfigs": list_of(_METRICS_ENGINE),
    }, _P9 + "datalayer/extractor/metrics/factories.go")),
    "models-data-extractor": _plugin(_P9 + "datalayer/extractor/models/extractor.go", "extractor"),
    "file-discovery": _plugin(_P9 + "datalayer/discovery/file/plugin.go", "discovery",
                              obj({"path": STR, "watchFile": BOOL}, _P9 + "datalayer/discovery/file/plugin.go")),
    # request parsers
    "anthropic-parser": _plugin(_P9 + "requesthandling/parsers/anthropic/anthropic.go", "parser"),
    "openai-parser": _plugin(_P9 + "requesthandling/parsers/openai/openai.go", "parser"),
    "vllmgrpc-parser": _plugin(_P9 + "requesthandling/parsers/vllmgrpc/vllmgrpc.go", "parser"),
    "vllmhttp-parser": _plugin(_P9 + "requesthandling/parsers/vllmhttp/vllmhttp.go", "parser"),
    "passthrough-parser": _plugin(_P9 + "requesthandling/parsers/passthrough/passthrough.go", "parser"),
    "vertexai-parser": _plugin(_P9 + "requesthandling/parsers/vertexai/vertexai.go", "parser"),
}

PLUGINS = {ROUTER_VERSION: _V090}

REMOVED_OR_LATER = {
    ROUTER_VERSION: {
        "burst-prefix-cache-producer": "first registered in llm-d-router v0.10.0",
        "endpoint-attribute-scorer": "first registered in llm-d-router v0.10.0",
        "sheddable-eviction-filter": "in a package the %s EPP binary does not import" % ROUTER_VERSION,
        "priority-then-time-eviction-order-policy": "in a package the %s EPP binary does not import" % ROUTER_VERSION,
        # Types of the Gateway API Inference Extension's own EPP (router_impl gie, epp/gie.py).
        "model-server-protocol-metrics": "GIE's name; llm-d-router %s calls its metrics extractor core-metrics-extractor"
                                         % ROUTER_VERSION,
        "predicted-latency-scorer": "a GIE plugin type; llm-d-router %s has predicted-latency-producer and latency-scorer"
                                    % ROUTER_VERSION,
    },
}

FEATURE_GATES = {
    # cmd/epp/runner/runner.go: loader.RegisterFeatureGate(datalayer.ExperimentalDatalayerFeatureGate / flowcontrol.FeatureGate)
    ROUTER_VERSION: frozenset(["dataLayer", "flowControl"]),
}

_API9 = _R9 + "apix/config/v1alpha1/endpointpickerconfig_types.go"
_PLUGIN_REF = obj({"pluginRef": STR}, _API9)
_PRIORITY_BAND = obj({"priority": integer(), "maxBytes": QUANTITY, "maxRequests": QUANTITY, "fairnessPolicyRef": STR,
                      "orderingPolicyRef": STR}, _API9)

CONFIG_SCHEMA = {
    ROUTER_VERSION: obj({
        "apiVersion": STR,
        "kind": STR,
        "featureGates": list_of(STR),
        "plugins": list_of(obj({"name": STR, "type": STR, "parameters": ANY}, _API9)),
        "schedulingProfiles": list_of(obj({
            "name": STR,
            "plugins": list_of(obj({"pluginRef": STR, "weight": number()}, _API9)),
        }, _API9)),
        "dataLayer": obj({
            "injectDefaults": BOOL,
            "sources": list_of(obj({"pluginRef": STR, "extractors": list_of(_PLUGIN_REF)}, _API9)),
            "discovery": _PLUGIN_REF,
        }, _API9),
        "flowControl": obj({
            "maxBytes": QUANTITY, "maxRequests": QUANTITY, "defaultRequestTTL": GO_DURATION,
            "defaultPriorityBand": _PRIORITY_BAND, "defaultNegativePriorityBand": _PRIORITY_BAND,
            "priorityBands": list_of(_PRIORITY_BAND), "usageLimitPolicyPluginRef": STR, "saturationDetector": _PLUGIN_REF,
        }, _API9),
        "requestHandler": obj({"parsers": list_of(_PLUGIN_REF)}, _API9),
        "saturationDetector": _PLUGIN_REF,
        "parser": _PLUGIN_REF,
    }, _API9, deprecated={"saturationDetector": "is deprecated; use flowControl.saturationDetector",
                          "parser": "is deprecated; use requestHandler.parsers"}),
}

# How a version treats the precise producer (each fact read at that tag, see the entries' sources):
# engineType is decoded but the producer at ROUTER_VERSION always builds engineadapter.NewVLLMAdapter() (producer.go),
# and the EPP recomputes block keys from the token ids of BlockStored with its own tokenProcessorConfig
# (requestcontrol/dataproducer/preciseprefixcache/README.md, "Engine compatibility").
SEMANTICS = {
    ROUTER_VERSION: {
        "engine_type_honoured": False,
        "engine_type_source": _P9 + "requestcontrol/dataproducer/preciseprefixcache/producer.go",
        "block_keys_recomputed": True,
        "block_keys_source": _P9 + "requestcontrol/dataproducer/preciseprefixcache/README.md",
        "render_path": "/v1/completions/render",
        "render_source": _P9 + "requestcontrol/dataproducer/tokenizer/vllm_http.go",
    },
}


# --- what the EPP does with a config it decodes -----------------------------------------------------------------
# Each finding has a kind: REFUSED (the EPP does not start: it returns an error or panics while loading the config),
# BROKEN (it starts, then crashes or silently never does what the config asks: the sentence says what and when) or
# WARNING (it starts and works, but worth knowing). Findings about the check's own arguments are INPUT.
REFUSED, BROKEN, WARNING, INPUT = "refused", "broken", "warning", "input"
KINDS = (REFUSED, BROKEN, WARNING, INPUT)
_KV9 = "github.com/llm-d/llm-d-kv-cache@%s:" % KV_CACHE_VERSION  # the version the router's go.mod requires
_PPC9 = _P9 + "requestcontrol/dataproducer/preciseprefixcache/"

# BEHAVIOUR[version][rule] = (kind, sentence, source). The sentence is a str.format template; ``version`` is always
# given, the other fields by the rule (epp/rules.py RULES) that names the entry. Each fact was read at ``source``
# and measured with the real EPP of that version (REFERENCE.md part R4).
BEHAVIOUR = {
    ROUTER_VERSION: {
        # LoadRawConfig: len(configBytes) == 0 -> loadDefaultConfig() (defaults.go).
        "empty-config": (
            WARNING,
            "The EndpointPickerConfig is empty; llm-d-router {version} then logs \"A configuration wasn't specified. A default "
            "one is being used.\" and starts with its default configuration (queue-scorer, kv-cache-utilization-scorer and "
            "an approximate prefix-cache-scorer), not one written for these engines.",
            _R9 + "pkg/epp/config/loader/configloader.go"),
        # Only zero bytes are the default configuration (LoadRawConfig); an empty plugins list decodes as it is, and
        # ensureSchedulingLayer (defaults.go) then makes profile default of every filter, scorer and picker declared
        # (none) and adds a single-profile-handler and a max-score-picker. Read at the tag, not run here (no llm-d EPP
        # binary); GIE v1.4.0's identical ensureSchedulingLayer was run with plugins: [] (epp/gie.py).
        "no-plugins": (
            WARNING,
            "plugins is empty; llm-d-router {version} does not then use its default configuration (only an empty file "
            "does), so no scorer runs: a scheduling profile without plugins gets only the max-score-picker the EPP adds, "
            "and every request goes to a random endpoint.",
            _R9 + "pkg/epp/config/loader/defaults.go"),
        # buildSchedulerConfig wraps the scorer with *pluginRef.Weight as given; validateConfig checks no weight.
        "negative-weight": (
            WARNING,
            "Scheduling profile {profile} gives {plugin} the weight {weight}; llm-d-router {version} accepts a negative "
            "weight as it is, so a higher score from {plugin} makes an endpoint less likely to be picked.",
            _R9 + "pkg/epp/config/loader/configloader.go"),
        # NewPool makes cfg.Concurrency queues; AddTask computes h.Sum32() % uint32(p.concurrency).
        "zero-concurrency": (
            BROKEN,
            "Producer {name} sets kvEventsConfig.concurrency to 0; llm-d-router {version} starts, then panics with an "
            "integer divide by zero in the KV-event pool (kvevents.(*Pool).AddTask) on the first KV event.",
            _KV9 + "pkg/kvevents/pool.go"),
        "negative-concurrency": (
            REFUSED,
            "Producer {name} sets kvEventsConfig.concurrency to {value}; the EPP panics while creating the KV-event pool "
            "(make with a negative length in kvevents.NewPool) and does not start.",
            _KV9 + "pkg/kvevents/pool.go"),
        # The producer Consumes() TokenizedPromptDataKey (Required); CreateMissingDataProducers then builds the default
        # producer registered for that key (runner.go: RegisterAsDefaultProducer(token-producer)) with nil parameters,
        # and NewPlugin without vllm, modelName or udsTokenizerConfig selects estimateBackend (tokenizer.go).
        "default-token-producer": (
            BROKEN,
            "Producer {name} has no token-producer plugin; llm-d-router {version} then creates one itself with the "
            "estimating backend, which never yields an engine's block keys, so the EPP starts but never matches an "
            "engine block and precise scoring scores every endpoint 0.",
            _R9 + "pkg/epp/datalayer/data_graph.go"),
        "estimating-token-producer": (
            BROKEN,
            "Producer {name} reads tokens from {label}, which has no tokenizer backend (no vllm, modelName or "
            "udsTokenizerConfig) and only estimates pseudo-tokens; the EPP starts but never matches an engine block, "
            "so precise scoring scores every endpoint 0.",
            _P9 + "requestcontrol/dataproducer/tokenizer/tokenizer.go"),
        # Subscribers are made only in Extract, which the endpoint-notification-source calls for its extractors.
        "no-notification-source": (
            BROKEN,
            "Producer {name} discovers pods, but no endpoint-notification-source data source lists it as an extractor; "
            "the EPP starts and never subscribes to an engine.",
            _PPC9 + "extractor.go"),
        # Extract returns at once when PodDiscoveryConfig is nil.
        "pod-discovery-null": (
            BROKEN,
            "Producer {name} discovers pods but sets kvEventsConfig.podDiscoveryConfig to null, so it subscribes to no engine.",
            _PPC9 + "extractor.go"),
        # New dereferences config.KVEventsConfig.ZMQEndpoint at start.
        "kv-events-config-null": (
            REFUSED,
            "Producer {name} sets kvEventsConfig to null; the EPP then dereferences a nil kvEventsConfig at start and crashes.",
            _PPC9 + "producer.go"),
        # ensureSubscriber dials tcp://<address>:<socketPort + rank> without checking the port.
        "socket-port-range": (
            BROKEN,
            "{plugin} parameter kvEventsConfig.podDiscoveryConfig.socketPort is {value}, not a TCP port (1 to 65535); "
            "the EPP does not check it, starts, and never subscribes to an engine.",
            _PPC9 + "extractor.go"),
        # buildSpeculativeCache returns before parsing speculativeTTL unless speculativeIndexing is true.
        "speculative-ttl-unused": (
            WARNING,
            "{plugin} parameter speculativeTTL is {value}, not a Go duration such as \"2s\", but speculativeIndexing is "
            "off, so llm-d-router {version} never parses it; with speculativeIndexing on the EPP would refuse it.",
            _PPC9 + "prerequest.go"),
        "speculative-ttl-invalid": (
            REFUSED,
            "{plugin} parameter speculativeTTL is {value}, not a Go duration such as \"2s\"; with speculativeIndexing on "
            "the EPP refuses it (invalid speculativeTTL) and does not start.",
            _PPC9 + "prerequest.go"),
    },
}

# loadDefaultConfig (defaults.go): what the EPP runs when its config is empty.
DEFAULT_CONFIG = {
    ROUTER_VERSION: {
        "apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig", "featureGates": [],
        "plugins": [{"type": "queue-scorer"}, {"type": "kv-cache-utilization-scorer"}, {"type": "prefix-cache-scorer"},
                    {"type": "metrics-data-source"}, {"type": "core-metrics-extractor"}],
        "schedulingProfiles": [{"name": "default", "plugins": [
            {"pluginRef": "queue-scorer", "weight": 2.0}, {"pluginRef": "kv-cache-utilization-scorer", "weight": 2.0},
            {"pluginRef": "prefix-cache-scorer", "weight": 3.0}]}],
        "dataLayer": {"sources": [{"pluginRef": "metrics-data-source", "extractors": [{"pluginRef": "core-metrics-extractor"}]}]},
    },
}


def plugin_types(version=DEFAULT_ROUTER_VERSION, role=None):
    """The sorted plugin type names ``version`` registers, optionally only those with ``role``."""
    table = PLUGINS[version]
    return sorted(name for name, spec in table.items() if role is None or role in spec["roles"])


def allowed_fields(plugin_type, path=(), version=DEFAULT_ROUTER_VERSION):
    """The sorted field names ``plugin_type`` accepts at ``path`` inside ``parameters`` (``[]`` if it takes none)."""
    params = PLUGINS[version][plugin_type]["params"]
    if params is None:
        if path:
            raise KeyError("%s takes no parameters" % plugin_type)
        return []
    return fields_at(params, tuple(path))


# The llm-d EPP's command-line flags: GIE's (epp/gie.py FLAGS: the same options.go lineage) and three of its own, the
# gRPC message sizes and stream metrics; its Validate refuses the same five metric flags (deprecatedMetricFlags). Read at
# llm-d/llm-d-router@v0.9.0:pkg/epp/server/options.go (145-222, 271-306; pkg/common/observability/logging/options.go).
# epp/flags.py refuses what a user passes.
REMOVED_FLAGS = ("total-queued-requests-metric", "total-running-requests-metric", "kv-cache-usage-percentage-metric",
                 "lora-info-metric", "cache-info-metric")
FLAGS = (
    "grpc-port", "ha-enable-leader-election", "grpc-max-recv-msg-size", "grpc-max-send-msg-size", "pool-group",
    "pool-namespace", "pool-name", "endpoint-selector", "endpoint-target-ports", "disable-endpoint-subset-filter",
    "model-server-metrics-scheme", "model-server-metrics-path", "model-server-metrics-port",
    "model-server-metrics-https-insecure-skip-verify", "refresh-metrics-interval", "refresh-prometheus-metrics-interval",
    "metrics-staleness-threshold") + REMOVED_FLAGS + (
    "v", "zap-devel", "zap-encoder", "zap-log-level", "zap-stacktrace-level", "zap-time-encoding", "tracing",
    "health-checking", "metrics-port", "grpc-health-port", "enable-pprof", "cert-path", "enable-cert-reload",
    "enable-grpc-stream-metrics", "secure-serving", "metrics-endpoint-auth", "config-file", "config-text")
