# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""Static checks of an llm-d router EndpointPickerConfig against what the engines run.

Plain Python without any Ansible import: the ``epp_config_check`` module, the router role
(through that module) and the unit tests all use :func:`check_epp_config`.

Plugin names follow ``llm-d/llm-d-router`` at the v0.9 line (``pkg/epp/framework/plugins``).
Every problem is one sentence that names the plugin or field at fault.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

API_VERSION = "llm-d.ai/v1alpha1"
DEPRECATED_API_VERSIONS = ("inference.networking.x-k8s.io/v1alpha1",)
KIND = "EndpointPickerConfig"

PRECISE_PRODUCER = "precise-prefix-cache-producer"
TOKEN_PRODUCER = "token-producer"
PREFIX_SCORER = "prefix-cache-scorer"
NOTIFICATION_SOURCE = "endpoint-notification-source"
PREFIX_PRODUCERS = (PRECISE_PRODUCER, "approx-prefix-cache-producer", "burst-prefix-cache-producer")

# Deprecated plugin types and what replaces them.
DEPRECATED_TYPES = {
    "precise-prefix-cache-scorer": "precise-prefix-cache-producer plus prefix-cache-scorer with prefixMatchInfoProducerName",
    "tokenizer": "token-producer",
}

KNOWN_TYPES = frozenset([
    PRECISE_PRODUCER, "approx-prefix-cache-producer", "burst-prefix-cache-producer", TOKEN_PRODUCER,
    PREFIX_SCORER, "kv-cache-utilization-scorer", "queue-scorer", "load-aware-scorer", "active-request-scorer",
    "no-hit-lru-scorer", "lora-affinity-scorer", "session-affinity-scorer", "running-requests-size-scorer",
    "token-load-scorer", "context-length-aware", "latency-scorer", "endpoint-attribute-scorer",
    "max-score-picker", "random-picker", "weighted-random-picker",
    "decode-filter", "prefill-filter", "encode-filter", "by-label", "label-selector-filter",
    "prefix-cache-affinity-filter",
    "single-profile-handler", "pd-profile-handler", "disagg-profile-handler", "data-parallel-profile-handler",
    NOTIFICATION_SOURCE, "metrics-data-source", "core-metrics-extractor",
]) | frozenset(DEPRECATED_TYPES)

PICKERS = frozenset(["max-score-picker", "random-picker", "weighted-random-picker"])
PROFILE_HANDLERS = frozenset(["single-profile-handler", "pd-profile-handler", "disagg-profile-handler",
                              "data-parallel-profile-handler"])

# Defaults of the precise producer when a field is absent (llm-d-router pkg/kvevents/pool.go, kvblock).
DEFAULT_BLOCK_SIZE = 16
DEFAULT_TOPIC_FILTER = "kv@"
DEFAULT_SOCKET_PORT = 5557
DEFAULT_ENGINE_TYPE = "vllm"


class EppConfigResult(object):
    """Outcome of a check: ``problems`` make it fail, ``deprecations`` are warnings."""

    def __init__(self):
        self.problems = []
        self.deprecations = []
        self.summary = {}

    @property
    def ok(self):
        return not self.problems

    def as_dict(self):
        return {"ok": self.ok, "problems": list(self.problems), "deprecations": list(self.deprecations),
                "summary": dict(self.summary)}


def _is_mapping(value):
    return isinstance(value, dict)


def _plugin_name(plugin):
    return plugin.get("name") or plugin.get("type")


def _topic_matches(topic_filter, topic):
    """ZMQ SUB filters are byte-prefix matches; an engine topic may hold ``$(POD_IP)`` placeholders."""
    if topic is None:
        return True
    return str(topic).startswith(str(topic_filter))


def check_epp_config(config, engine=None, mode=None):
    """Check an EndpointPickerConfig (a dict) against the engine contract.

    ``engine`` keys (all optional): ``block_size`` (int), ``hash_seed`` (str), ``topic`` (the engines'
    topic, placeholders allowed), ``kv_events_port`` (int), ``engine_type`` (``vllm``|``sglang``),
    ``kv_events_enabled`` (bool). ``mode`` (optional): ``precise`` or ``approximate`` to also check
    that the config implements that mode.
    """
    engine = engine or {}
    res = EppConfigResult()
    if not _is_mapping(config):
        res.problems.append("The EndpointPickerConfig is not a mapping (got %s)." % type(config).__name__)
        return res

    api_version = config.get("apiVersion")
    if api_version in DEPRECATED_API_VERSIONS:
        res.deprecations.append("apiVersion %s is deprecated; use %s." % (api_version, API_VERSION))
    elif api_version != API_VERSION:
        res.problems.append("apiVersion is %r but the router accepts %s." % (api_version, API_VERSION))
    if config.get("kind") != KIND:
        res.problems.append("kind is %r but must be %s." % (config.get("kind"), KIND))
    for old in ("saturationDetector", "parser"):
        if old in config:
            res.deprecations.append("Top-level %s is deprecated in the EndpointPickerConfig." % old)

    plugins = config.get("plugins")
    if not isinstance(plugins, list) or not plugins:
        res.problems.append("plugins must be a non-empty list.")
        plugins = []

    by_name = {}
    for index, plugin in enumerate(plugins):
        if not _is_mapping(plugin) or not plugin.get("type"):
            res.problems.append("plugins[%d] has no type." % index)
            continue
        name = _plugin_name(plugin)
        ptype = plugin["type"]
        if name in by_name:
            res.problems.append("Plugin name %s is declared twice; give one of them another name." % name)
        by_name[name] = plugin
        if ptype in DEPRECATED_TYPES:
            res.deprecations.append("Plugin type %s is deprecated; use %s." % (ptype, DEPRECATED_TYPES[ptype]))
        elif ptype not in KNOWN_TYPES:
            res.deprecations.append("Plugin type %s is not a plugin this collection knows; check its spelling." % ptype)
        params = plugin.get("parameters") or {}
        if params and not _is_mapping(params):
            res.problems.append("Plugin %s has parameters that are not a mapping." % name)

    def ref_exists(ref, where):
        if ref not in by_name:
            res.problems.append("%s references plugin %s, which is not declared in plugins." % (where, ref))
            return False
        return True

    profiles = config.get("schedulingProfiles")
    if not isinstance(profiles, list) or not profiles:
        res.problems.append("schedulingProfiles must be a non-empty list.")
        profiles = []
    for profile in profiles:
        if not _is_mapping(profile):
            res.problems.append("A scheduling profile is not a mapping.")
            continue
        pname = profile.get("name") or "<unnamed>"
        refs = profile.get("plugins") or []
        has_picker = False
        for entry in refs:
            ref = entry.get("pluginRef") if _is_mapping(entry) else None
            if not ref:
                res.problems.append("Scheduling profile %s has an entry without pluginRef." % pname)
                continue
            if ref_exists(ref, "Scheduling profile %s" % pname):
                if by_name[ref]["type"] in PICKERS:
                    has_picker = True
            weight = entry.get("weight")
            if weight is not None and (not isinstance(weight, (int, float)) or isinstance(weight, bool) or weight < 0):
                res.problems.append("Scheduling profile %s gives %s the weight %r; weights are numbers >= 0." % (pname, ref, weight))
        if refs and not has_picker:
            res.deprecations.append("Scheduling profile %s references no picker; the router adds max-score-picker." % pname)
    if len(profiles) > 1 and not any(p["type"] in PROFILE_HANDLERS for p in by_name.values()):
        res.problems.append("Several scheduling profiles are declared but no profile handler plugin is.")

    data_layer = config.get("dataLayer") or {}
    extracting_sources = {}
    for source in (data_layer.get("sources") or []) if _is_mapping(data_layer) else []:
        ref = source.get("pluginRef") if _is_mapping(source) else None
        if not ref:
            res.problems.append("A dataLayer source has no pluginRef.")
            continue
        ref_exists(ref, "dataLayer source")
        for extractor in source.get("extractors") or []:
            eref = extractor.get("pluginRef") if _is_mapping(extractor) else None
            if eref and ref_exists(eref, "dataLayer source %s extractor" % ref):
                extracting_sources.setdefault(eref, []).append(by_name.get(ref, {}).get("type"))

    # Prefix-cache scorers and the producers they read.
    precise = [p for p in by_name.values() if p["type"] == PRECISE_PRODUCER]
    for name, plugin in by_name.items():
        if plugin["type"] != PREFIX_SCORER:
            continue
        producer = (plugin.get("parameters") or {}).get("prefixMatchInfoProducerName")
        if producer is None:
            continue
        if producer not in by_name:
            res.problems.append("Scorer %s reads prefixMatchInfoProducerName %s, which is not declared in plugins." % (name, producer))
        elif by_name[producer]["type"] not in PREFIX_PRODUCERS:
            res.problems.append("Scorer %s reads prefixMatchInfoProducerName %s, which is a %s, not a prefix-cache producer."
                                % (name, producer, by_name[producer]["type"]))

    token_producers = [p for p in by_name.values() if p["type"] in (TOKEN_PRODUCER, "tokenizer")]
    kv_enabled = engine.get("kv_events_enabled", True)
    for plugin in precise:
        name = _plugin_name(plugin)
        params = plugin.get("parameters") or {}
        if not token_producers:
            res.problems.append("Producer %s needs a token-producer plugin, and none is declared." % name)
        if not any(p["type"] == PREFIX_SCORER and (p.get("parameters") or {}).get("prefixMatchInfoProducerName") == name
                   for p in by_name.values()):
            res.problems.append("Producer %s is declared but no prefix-cache-scorer references it by prefixMatchInfoProducerName." % name)
        if not kv_enabled:
            res.problems.append("Producer %s subscribes to KV events, but the engines do not publish them." % name)
        indexer = params.get("indexerConfig") or {}
        if _is_mapping(indexer) and "tokenizersPoolConfig" in indexer:
            res.problems.append("Producer %s sets indexerConfig.tokenizersPoolConfig, which the router rejects; "
                                "configure a token-producer plugin instead." % name)
        tpc = params.get("tokenProcessorConfig") or {}
        if "blockSize" in tpc:
            res.deprecations.append("Producer %s uses tokenProcessorConfig.blockSize, deprecated in favour of blockSizeTokens." % name)
        block_size = tpc.get("blockSizeTokens", tpc.get("blockSize", DEFAULT_BLOCK_SIZE))
        want_block = engine.get("block_size")
        if want_block is not None and str(block_size) != str(want_block):
            res.problems.append("Producer %s uses block size %s but the engines use --block-size %s." % (name, block_size, want_block))
        seed = tpc.get("hashSeed", "")
        want_seed = engine.get("hash_seed")
        if want_seed is not None and str(seed) != str(want_seed):
            res.problems.append("Producer %s uses hashSeed %r but the engines run with PYTHONHASHSEED %r." % (name, str(seed), str(want_seed)))
        kvc = params.get("kvEventsConfig") or {}
        topic_filter = kvc.get("topicFilter", DEFAULT_TOPIC_FILTER)
        topic = engine.get("topic")
        if not _topic_matches(topic_filter, topic):
            res.problems.append("Producer %s subscribes with topicFilter %r, which is not a prefix of the engines' topic %r."
                                % (name, topic_filter, topic))
        engine_type = kvc.get("engineType", DEFAULT_ENGINE_TYPE)
        want_type = engine.get("engine_type")
        if want_type is not None and engine_type != want_type:
            res.problems.append("Producer %s decodes events as engineType %s but the engines are %s." % (name, engine_type, want_type))
        discover = kvc.get("discoverPods", True) and not kvc.get("zmqEndpoint")
        if discover:
            port = (kvc.get("podDiscoveryConfig") or {}).get("socketPort", DEFAULT_SOCKET_PORT)
            want_port = engine.get("kv_events_port")
            if want_port is not None and str(port) != str(want_port):
                res.problems.append("Producer %s dials KV events on port %s but the engines publish on port %s." % (name, port, want_port))
            if NOTIFICATION_SOURCE not in extracting_sources.get(name, []):
                res.problems.append("Producer %s discovers pods, but no %s data source lists it as an extractor." % (name, NOTIFICATION_SOURCE))
        res.summary[name] = {"block_size": block_size, "hash_seed": str(seed), "topic_filter": topic_filter,
                             "engine_type": engine_type, "discover_pods": bool(discover)}

    if mode == "precise":
        if not precise:
            res.problems.append("Mode precise needs a precise-prefix-cache-producer plugin, and none is declared.")
        if not any(p["type"] == "precise-prefix-cache-scorer" for p in by_name.values()) and not any(
                p["type"] == PREFIX_SCORER and (p.get("parameters") or {}).get("prefixMatchInfoProducerName") for p in by_name.values()):
            res.problems.append("Mode precise needs a prefix-cache-scorer with prefixMatchInfoProducerName.")
    elif mode == "approximate":
        if precise:
            res.problems.append("Mode approximate must not declare a precise-prefix-cache-producer.")
        if not any(p["type"] == "load-aware-scorer" for p in by_name.values()):
            res.problems.append("Mode approximate needs a load-aware-scorer plugin, and none is declared.")

    res.summary["plugins"] = sorted(by_name)
    return res
