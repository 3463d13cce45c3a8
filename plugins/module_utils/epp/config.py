# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""Static checks of an llm-d router EndpointPickerConfig: what one router version does with it, and the engines.

Plain Python without any Ansible import: the ``epp_config_check`` module, the router role (through that module)
and the tests all use :func:`check_epp_config`.

The shapes (plugin types, each type's parameter fields, their JSON types) come from the per-version table in
:mod:`._epp_plugins` and are checked declaratively by :mod:`._epp_schema`; this file holds only what relates one
part of the config to another (plugin references, the precise producer and its token producer, data-layer
wiring) and to the engines. Every finding is one sentence that names the plugin or field path at fault, with its
kind: refused (the EPP does not start), broken (it starts, then crashes or never does what the config asks) or a
warning; what the EPP does with configs it decodes is the BEHAVIOUR table of :mod:`._epp_plugins`. No input, however
malformed, raises.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import copy
import re

from .plugins import (
    BEHAVIOUR, BROKEN, CONFIG_SCHEMA, DEFAULT_CONFIG, DEFAULT_ROUTER_VERSION, FEATURE_GATES, INPUT, PLUGINS, REFUSED,
    REMOVED_OR_LATER, ROUTER_VERSIONS, SEMANTICS, WARNING)
from .schema import show, type_name, validate

API_VERSION = "llm-d.ai/v1alpha1"
DEPRECATED_API_VERSIONS = ("inference.networking.x-k8s.io/v1alpha1",)
KIND = "EndpointPickerConfig"

PRECISE_PRODUCER = "precise-prefix-cache-producer"
PRECISE_LEGACY_SCORER = "precise-prefix-cache-scorer"
TOKEN_PRODUCER = "token-producer"
PREFIX_SCORER = "prefix-cache-scorer"
NOTIFICATION_SOURCE = "endpoint-notification-source"

# Defaults of the precise producer when a field is absent (kvevents.DefaultConfig, kvblock.DefaultTokenProcessorConfig).
DEFAULT_BLOCK_SIZE = 16
DEFAULT_TOPIC_FILTER = "kv@"
DEFAULT_SOCKET_PORT = 5557
DEFAULT_ENGINE_TYPE = "vllm"
DEFAULT_RENDER_URL = "http://localhost:8000"

# Parameter fields that name another plugin, the role that plugin must have, and how a sentence names that role.
PRODUCER_REFERENCES = (
    ("prefixMatchInfoProducerName", "prefix-producer", "a prefix-cache producer"),
    ("inFlightLoadProducerName", "inflight-load-producer", "an inflight-load-producer"),
    ("latencyPredictionInfoProducerName", "latency-producer", "a predicted-latency-producer"),
)
MM_PRODUCER_REFERENCE = ("producerName", "mm-producer", "an mm-embeddings-cache-producer")
# Names the EPP instantiates by itself when a reference names them without a declared plugin (loader/defaults.go).
AUTO_SATURATION_DETECTOR = "utilization-detector"
AUTO_FLOW_CONTROL = ("fcfs-ordering-policy", "global-strict-fairness-policy", "static-usage-limit-policy")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]", "::1")

ENGINE_KEYS = {
    "block_size": "int", "hash_seed": "str", "topic": "str", "kv_events_port": "int", "engine_type": "str",
    "kv_events_enabled": "bool", "enable_scale_out": "bool",
}


class EppConfigResult(object):
    """Outcome of a check: ``problems`` make it fail; ``deprecations`` and ``warnings`` do not.

    ``findings`` lists every sentence with its kind (``_epp_plugins.KINDS``): ``refused`` (the EPP does not start),
    ``broken`` (it starts, then crashes or never does what the config asks), ``warning`` (deprecations included) and
    ``input`` (the check's own arguments are wrong). ``problems`` holds the refused, broken and input sentences.
    ``epp_starts`` is whether the EPP starts with the config: no refused finding (``None`` when the config could not
    be checked against a router version).
    """

    def __init__(self, router_version=DEFAULT_ROUTER_VERSION):
        self.router_version = router_version
        self.problems = []
        self.deprecations = []
        self.warnings = []
        self.findings = []
        self.summary = {}
        self.checked = True

    def add(self, kind, sentence, deprecation=False):
        """Record one finding of ``kind`` and file its sentence in problems, deprecations or warnings."""
        self.findings.append({"kind": kind, "sentence": sentence})
        if kind == WARNING:
            (self.deprecations if deprecation else self.warnings).append(sentence)
        else:
            self.problems.append(sentence)

    @property
    def ok(self):
        return not self.problems

    @property
    def epp_starts(self):
        if not self.checked:
            return None
        return not any(finding["kind"] == REFUSED for finding in self.findings)

    def kind_of(self, sentence):
        """The kind of a finding, by its sentence (None if there is no such finding)."""
        for finding in self.findings:
            if finding["sentence"] == sentence:
                return finding["kind"]
        return None

    def finish(self):
        """Make every sentence one line, whatever the input held."""
        for found in (self.problems, self.deprecations, self.warnings):
            found[:] = [_one_line(sentence) for sentence in found]
        for finding in self.findings:
            finding["sentence"] = _one_line(finding["sentence"])
        return self

    def as_dict(self):
        return {"ok": self.ok, "problems": list(self.problems), "deprecations": list(self.deprecations),
                "warnings": list(self.warnings), "summary": dict(self.summary), "router_version": self.router_version,
                "epp_starts": self.epp_starts, "findings": [dict(finding) for finding in self.findings]}


def _is_mapping(value):
    return isinstance(value, dict)


_PLAIN_NAME = re.compile(r"^[A-Za-z0-9_.$@/:+()-]{1,80}$")


def _text(value):
    """A config value used as a name in a sentence: plain names as they are, anything else quoted and shortened."""
    return value if isinstance(value, str) and _PLAIN_NAME.match(value) else show(value)


def _one_line(sentence):
    """The last guard of 'one sentence on one line': control characters from the input are escaped."""
    return "".join(ch if ch >= " " or ch == "\t" else repr(ch)[1:-1] for ch in sentence).replace("\t", " ")


def _param(params, name):
    """A parameter as the EPP reads it: Go's encoding/json matches keys case-insensitively."""
    if not _is_mapping(params):
        return None
    if name in params:
        return params[name]
    for key, value in params.items():
        if isinstance(key, str) and key.lower() == name.lower():
            return value
    return None


def _mapping(value):
    return value if _is_mapping(value) else {}


def _list(value):
    return value if isinstance(value, list) else []


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _topic_matches(topic_filter, topic):
    """ZMQ SUB filters are byte-prefix matches; an engine topic may hold ``$(POD_IP)`` placeholders."""
    if topic is None:
        return True
    return str(topic).startswith(str(topic_filter))


class _Checker(object):
    """One run of the checks over one config; the methods add sentences to ``self.res``."""

    def __init__(self, config, engine, mode, version):
        self.config, self.engine, self.mode, self.version = config, engine, mode, version
        self.res = EppConfigResult(version)
        self.table = PLUGINS[version]
        self.by_name = {}      # name -> (type, parameters mapping, index)
        self.order = []        # names in declaration order

    # -- sentences -------------------------------------------------------------------------------------------
    def label(self, name):
        ptype = self.by_name[name][0] if name in self.by_name else None
        return "Plugin %s" % _text(name) if ptype in (None, name) else "Plugin %s (%s)" % (_text(name), _text(ptype))

    def top_finding(self, finding):
        where = "EndpointPickerConfig field %s" % finding.path if finding.path else "The EndpointPickerConfig"
        if finding.kind == "unknown":
            self.res.add(REFUSED, "%s is not a field of llm-d-router %s's EndpointPickerConfig; the EPP decodes the "
                         "config strictly and does not start." % (where, self.version))
        elif finding.kind == "deprecated":
            self.res.add(WARNING, deprecation=True, sentence="%s %s." % (where, finding.message))
        else:
            self.res.add(REFUSED, "%s %s." % (where, finding.message))

    def param_finding(self, name, finding):
        ptype = self.by_name[name][0]
        where = "%s parameter %s" % (self.label(name), finding.path)
        if finding.kind == "unknown":
            self.res.add(REFUSED, "%s is not a field of %s in llm-d-router %s; the EPP decodes parameters strictly "
                         "(DisallowUnknownFields), so the plugin fails and the EPP does not start."
                         % (where, ptype, self.version))
        elif finding.kind == "deprecated":
            self.res.add(WARNING, deprecation=True, sentence="%s %s." % (where, finding.message))
        elif finding.kind == "case":
            self.res.add(WARNING, "%s %s; write it that way." % (where, finding.message))
        elif finding.kind == "range" and finding.path == "kvEventsConfig.podDiscoveryConfig.socketPort":
            self.rule("socket-port-range", plugin=self.label(name), value=show(self.pod_discovery_port(name)))
        elif finding.kind == "value" and finding.path == "speculativeTTL" and ptype in (PRECISE_PRODUCER, PRECISE_LEGACY_SCORER):
            params = self.by_name[name][1]
            self.rule("speculative-ttl-invalid" if _param(params, "speculativeIndexing") is True else "speculative-ttl-unused",
                      plugin=self.label(name), value=show(_param(params, "speculativeTTL")))
        else:
            self.res.add(REFUSED, "%s %s." % (where, finding.message))

    def rule(self, rule, **fields):
        """A finding whose kind and sentence come from the version's BEHAVIOUR table (_epp_plugins)."""
        kind, template, _source = BEHAVIOUR[self.version][rule]
        self.res.add(kind, template.format(version=self.version, **fields))

    def pod_discovery_port(self, name):
        kvc = _mapping(_param(self.by_name[name][1], "kvEventsConfig"))
        return _param(_mapping(_param(kvc, "podDiscoveryConfig")), "socketPort")

    # -- the passes ------------------------------------------------------------------------------------------
    def run(self):
        config = self.config
        for finding in validate(config, CONFIG_SCHEMA[self.version]):
            self.top_finding(finding)
        self.check_header()
        self.collect_plugins()
        self.check_profiles()
        self.check_data_layer()
        self.check_request_handling()
        self.check_references()
        self.check_disaggregation()
        for name in self.order:
            if self.by_name[name][0] in (PRECISE_PRODUCER, PRECISE_LEGACY_SCORER):
                self.check_precise(name)
        self.check_token_producers()
        self.check_mode()
        self.res.summary["plugins"] = sorted(self.by_name)
        return self.res

    def check_header(self):
        config = self.config
        api_version = config.get("apiVersion")
        if api_version in DEPRECATED_API_VERSIONS:
            self.res.add(WARNING, deprecation=True, sentence="apiVersion %s is deprecated; use %s." % (api_version, API_VERSION))
        elif api_version != API_VERSION:
            self.res.add(REFUSED, "apiVersion is %s but the router accepts %s." % (show(api_version), API_VERSION))
        if config.get("kind") != KIND:
            self.res.add(REFUSED, "kind is %s but must be %s." % (show(config.get("kind")), KIND))
        for gate in _list(config.get("featureGates")):
            if isinstance(gate, str) and gate not in FEATURE_GATES[self.version]:
                self.res.add(REFUSED, "Feature gate %s is not registered in llm-d-router %s (known: %s); the EPP does not start."
                             % (gate, self.version, ", ".join(sorted(FEATURE_GATES[self.version]))))

    def collect_plugins(self):
        plugins = self.config.get("plugins")
        if not isinstance(plugins, list) or not plugins:
            self.res.add(REFUSED, "plugins must be a non-empty list.")
            return
        for index, plugin in enumerate(plugins):
            if not _is_mapping(plugin) or not plugin.get("type") or not isinstance(plugin.get("type"), str):
                self.res.add(REFUSED, "plugins[%d] has no type." % index)
                continue
            ptype = plugin["type"]
            name = plugin.get("name") if isinstance(plugin.get("name"), str) and plugin.get("name") else ptype
            if name in self.by_name:
                self.res.add(REFUSED, "Plugin name %s is declared twice; give one of them another name." % _text(name))
                continue
            params = plugin.get("parameters")
            self.by_name[name] = (ptype, params if _is_mapping(params) else {}, index)
            self.order.append(name)
            self.check_plugin(name, ptype, params)

    def check_plugin(self, name, ptype, params):
        spec = self.table.get(ptype)
        if spec is None:
            why = REMOVED_OR_LATER.get(self.version, {}).get(ptype)
            self.res.add(REFUSED, "Plugin type %s is not registered in llm-d-router %s%s, so the EPP does not start%s."
                         % (_text(ptype), self.version, " (%s)" % why if why else "",
                            "" if why else "; check its spelling"))
            return
        if spec["deprecated"]:
            self.res.add(WARNING, deprecation=True, sentence="Plugin type %s is deprecated; use %s." % (ptype, spec["deprecated"]))
        if spec["params"] is None:
            if params not in (None, {}, []):
                self.res.add(WARNING, "%s takes no parameters in llm-d-router %s; the EPP ignores the ones given."
                             % (self.label(name), self.version))
            return
        if params is None:
            if spec["requires_params"]:
                self.res.add(REFUSED, "%s needs parameters; its factory fails without them." % self.label(name))
            return
        if not _is_mapping(params):
            self.res.add(REFUSED, "%s has parameters that are %s, not a mapping; the EPP cannot decode them."
                         % (self.label(name), type_name(params)))
            return
        findings = validate(params, spec["params"], case_insensitive=True)
        if spec["legacy_params"] is not None and any(f.kind not in ("deprecated", "case") for f in findings):
            legacy = validate(params, spec["legacy_params"], case_insensitive=True)
            if not any(f.kind not in ("deprecated", "case") for f in legacy):
                self.res.add(WARNING, deprecation=True, sentence="%s uses the deprecated flat parameters; use profiles and deciders." % self.label(name))
                findings = legacy
        for finding in findings:
            self.param_finding(name, finding)

    def ref_exists(self, ref, where):
        if ref not in self.by_name:
            self.res.add(REFUSED, "%s references plugin %s, which is not declared in plugins." % (where, _text(ref)))
            return False
        return True

    def roles(self, name):
        spec = self.table.get(self.by_name[name][0]) if name in self.by_name else None
        return spec["roles"] if spec else frozenset()

    def check_profiles(self):
        profiles = self.config.get("schedulingProfiles")
        if not isinstance(profiles, list) or not profiles:
            self.res.add(REFUSED, "schedulingProfiles must be a non-empty list.")
            profiles = []
        seen = set()
        for index, profile in enumerate(profiles):
            if not _is_mapping(profile):
                self.res.add(REFUSED, "schedulingProfiles[%d] is %s, not a mapping." % (index, type_name(profile)))
                continue
            pname = profile.get("name")
            if not pname or not isinstance(pname, str):
                self.res.add(REFUSED, "schedulingProfiles[%d] has no name." % index)
                pname = "schedulingProfiles[%d]" % index
            elif pname in seen:
                self.res.add(REFUSED, "Scheduling profile %s is declared twice." % pname)
            seen.add(pname)
            pickers = []
            for entry in _list(profile.get("plugins")):
                ref = entry.get("pluginRef") if _is_mapping(entry) else None
                if not ref or not isinstance(ref, str):
                    self.res.add(REFUSED, "Scheduling profile %s has an entry without pluginRef." % pname)
                    continue
                if self.ref_exists(ref, "Scheduling profile %s" % pname) and "picker" in self.roles(ref):
                    pickers.append(ref)
                weight = entry.get("weight")
                if weight is not None and (not isinstance(weight, (int, float)) or isinstance(weight, bool)):
                    self.res.add(REFUSED, "Scheduling profile %s gives %s the weight %s; weights are numbers."
                                 % (pname, ref, show(weight)))
                elif weight is not None and weight < 0:
                    self.rule("negative-weight", profile=pname, plugin=_text(ref), weight=show(weight))
            if len(pickers) > 1:
                self.res.add(REFUSED, "Scheduling profile %s references %d pickers (%s); the EPP allows one."
                             % (pname, len(pickers), ", ".join(pickers)))
        handlers = [name for name in self.order if "profile-handler" in self.roles(name)]
        if len(handlers) > 1:
            self.res.add(REFUSED, "Several profile handlers are declared (%s); the EPP allows one." % ", ".join(handlers))
        if len(seen) > 1:
            if not handlers:
                self.res.add(REFUSED, "Several scheduling profiles are declared but no profile handler plugin is.")
            elif any(self.by_name[name][0] == "single-profile-handler" for name in handlers):
                self.res.add(REFUSED, "single-profile-handler cannot serve several scheduling profiles; use disagg-profile-handler.")

    def check_data_layer(self):
        data_layer = _mapping(self.config.get("dataLayer"))
        self.extracting = {}
        for source in _list(data_layer.get("sources")):
            ref = source.get("pluginRef") if _is_mapping(source) else None
            if not ref or not isinstance(ref, str):
                self.res.add(REFUSED, "A dataLayer source has no pluginRef.")
                continue
            if self.ref_exists(ref, "dataLayer source") and "data-source" not in self.roles(ref):
                self.res.add(REFUSED, "dataLayer source %s is a %s, not a data source." % (ref, self.by_name[ref][0]))
            for extractor in _list(source.get("extractors")):
                eref = extractor.get("pluginRef") if _is_mapping(extractor) else None
                if not eref or not isinstance(eref, str):
                    self.res.add(REFUSED, "dataLayer source %s has an extractor without pluginRef." % ref)
                    continue
                if self.ref_exists(eref, "dataLayer source %s extractor" % ref):
                    self.extracting.setdefault(eref, []).append(self.by_name.get(ref, ("",))[0])
        discovery = _mapping(data_layer.get("discovery")).get("pluginRef")
        if isinstance(discovery, str) and discovery and self.ref_exists(discovery, "dataLayer discovery") \
                and "discovery" not in self.roles(discovery):
            self.res.add(REFUSED, "dataLayer discovery %s is a %s, not a discovery plugin." % (discovery, self.by_name[discovery][0]))

    def check_request_handling(self):
        config = self.config
        parsers = [p.get("pluginRef") for p in _list(_mapping(config.get("requestHandler")).get("parsers")) if _is_mapping(p)]
        parsers.append(_mapping(config.get("parser")).get("pluginRef"))
        for ref in parsers:
            if not isinstance(ref, str) or not ref:
                continue
            if ref in self.by_name:
                if "parser" not in self.roles(ref):
                    self.res.add(REFUSED, "Parser %s is a %s, not a parser plugin." % (ref, self.by_name[ref][0]))
            elif "parser" not in _mapping(self.table.get(ref)).get("roles", ()):
                self.res.add(REFUSED, "Parser %s is neither a declared plugin nor a parser type the EPP can add by itself." % ref)
        flow = _mapping(config.get("flowControl"))
        for holder in (flow, config):
            ref = _mapping(holder.get("saturationDetector")).get("pluginRef")
            if not isinstance(ref, str) or not ref or (ref == AUTO_SATURATION_DETECTOR and ref not in self.by_name):
                continue
            if self.ref_exists(ref, "saturationDetector") and "saturation-detector" not in self.roles(ref):
                self.res.add(REFUSED, "saturationDetector %s is a %s, not a saturation detector." % (ref, self.by_name[ref][0]))
        if "flowControl" in _list(config.get("featureGates")):
            bands = [flow.get("defaultPriorityBand"), flow.get("defaultNegativePriorityBand")] + _list(flow.get("priorityBands"))
            refs = [("flowControl.usageLimitPolicyPluginRef", flow.get("usageLimitPolicyPluginRef"))]
            for band in bands:
                band = _mapping(band)
                refs += [("A priority band's fairnessPolicyRef", band.get("fairnessPolicyRef")),
                         ("A priority band's orderingPolicyRef", band.get("orderingPolicyRef"))]
            for where, ref in refs:
                if isinstance(ref, str) and ref and ref not in AUTO_FLOW_CONTROL:
                    self.ref_exists(ref, where)

    def check_references(self):
        """Parameters that name another plugin must name a declared plugin of the right kind."""
        for name in self.order:
            ptype, params, _index = self.by_name[name]
            refs = PRODUCER_REFERENCES + ((MM_PRODUCER_REFERENCE,) if "scorer" in self.roles(name) else ())
            subject = "Scorer %s" % name if ptype == PREFIX_SCORER else self.label(name)
            for field, role, what in refs:
                ref = _param(params, field)
                if not isinstance(ref, str) or not ref:
                    continue
                if ref not in self.by_name:
                    self.res.add(REFUSED, "%s reads %s %s, which is not declared in plugins." % (subject, field, ref))
                elif role not in self.roles(ref):
                    self.res.add(REFUSED, "%s reads %s %s, which is a %s, not %s." % (
                        subject, field, ref, self.by_name[ref][0], what))

    def decider(self, handler, field, ref):
        """A decider named by a profile handler: declared, a decider, and declared before the handler."""
        if ref not in self.by_name:
            self.res.add(REFUSED, "%s names %s %s, which is not declared in plugins." % (self.label(handler), field, ref))
        elif "decider" not in self.roles(ref):
            self.res.add(REFUSED, "%s names %s %s, which is a %s, not a decider." % (self.label(handler), field, ref, self.by_name[ref][0]))
        elif self.by_name[ref][2] > self.by_name[handler][2]:
            self.res.add(REFUSED, "%s names %s %s, which is declared after it; the EPP instantiates plugins in order, "
                         "so declare the decider first." % (self.label(handler), field, ref))

    def check_disaggregation(self):
        for name in self.order:
            ptype, params, _index = self.by_name[name]
            if ptype == "pd-profile-handler":
                ref = _param(params, "deciderPluginName")
                self.decider(name, "deciderPluginName", ref if isinstance(ref, str) and ref else "prefix-based-pd-decider")
            elif ptype == "disagg-profile-handler":
                deciders = _mapping(_param(params, "deciders"))
                pairs = [("deciders.prefill", _param(deciders, "prefill")), ("deciders.encode", _param(deciders, "encode"))]
                pairs += [(field, _param(params, field)) for field in
                          ("prefillDeciderPluginName", "deciderPluginName", "encodeDeciderPluginName")]
                for field, ref in pairs:
                    if isinstance(ref, str) and ref:
                        self.decider(name, field, ref)

    def check_precise(self, name):
        ptype, params, _index = self.by_name[name]
        res, engine, semantics = self.res, self.engine, SEMANTICS[self.version]
        if ptype == PRECISE_LEGACY_SCORER and any(self.by_name[other][0] == PRECISE_PRODUCER and self.by_name[other][2] < _index
                                                  for other in self.order):
            return  # the legacy scorer defers to the producer declared before it and ignores its own parameters
        token_producers = [other for other in self.order if "token-producer" in self.roles(other)]
        if not token_producers:
            self.rule("default-token-producer", name=name)
        if ptype == PRECISE_PRODUCER and not any(
                self.by_name[other][0] == PREFIX_SCORER and _param(self.by_name[other][1], "prefixMatchInfoProducerName") == name
                for other in self.order):
            res.add(BROKEN, "Producer %s is declared but no prefix-cache-scorer references it by prefixMatchInfoProducerName." % name)
        if not engine.get("kv_events_enabled", True):
            res.add(BROKEN, "Producer %s subscribes to KV events, but the engines do not publish them." % name)
        raw = self.config_params(name)
        for field in ("indexerConfig", "kvEventsConfig"):
            if field in raw and raw[field] is None and field == "indexerConfig":
                res.add(REFUSED, "Producer %s sets indexerConfig to null; the EPP then refuses it (indexerConfig is required)." % name)
            elif field in raw and raw[field] is None:
                self.rule("kv-events-config-null", name=name)
        concurrency = _param(_mapping(_param(params, "kvEventsConfig")), "concurrency")
        if _is_int(concurrency) and concurrency == 0:
            self.rule("zero-concurrency", name=name)
        elif _is_int(concurrency) and concurrency < 0:
            self.rule("negative-concurrency", name=name, value=concurrency)
        indexer = _mapping(_param(params, "indexerConfig"))
        if _param(indexer, "tokenizersPoolConfig") is not None and ptype == PRECISE_PRODUCER:
            res.add(REFUSED, "Producer %s sets indexerConfig.tokenizersPoolConfig, which the router rejects; "
                    "configure a token-producer plugin instead." % name)
        tpc = _mapping(_param(params, "tokenProcessorConfig"))
        tokens, old = _param(tpc, "blockSizeTokens"), _param(tpc, "blockSize")
        block_size = tokens if _is_int(tokens) and tokens > 0 else (old if _is_int(old) and old > 0 else DEFAULT_BLOCK_SIZE)
        want_block = engine.get("block_size")
        if want_block is not None and block_size != want_block:
            res.add(WARNING, "Producer %s hashes blocks of %s tokens while the engines use --block-size %s; llm-d-router %s "
                    "recomputes block keys from the events' token ids with its own block size (%s), so this is "
                    "not an error, but prefix matches are counted in blocks of %s tokens."
                    % (name, block_size, want_block, self.version, semantics["block_keys_source"], block_size))
        seed = _param(tpc, "hashSeed")
        seed = seed if isinstance(seed, str) else ""
        want_seed = engine.get("hash_seed")
        if want_seed is not None and seed != str(want_seed):
            res.add(WARNING, "Producer %s uses hashSeed %r while the engines run with PYTHONHASHSEED %r; llm-d-router %s "
                    "recomputes block keys from the events' token ids (%s), so the seeds need not match."
                    % (name, seed, str(want_seed), self.version, semantics["block_keys_source"]))
        kvc = _mapping(_param(params, "kvEventsConfig"))
        topic_filter = _param(kvc, "topicFilter")
        topic_filter = topic_filter if isinstance(topic_filter, str) else DEFAULT_TOPIC_FILTER
        topic = engine.get("topic")
        if not _topic_matches(topic_filter, topic):
            res.add(BROKEN, "Producer %s subscribes with topicFilter %r, which is not a prefix of the engines' topic %r."
                    % (name, topic_filter, topic))
        engine_type = _param(kvc, "engineType")
        engine_type = engine_type if isinstance(engine_type, str) and engine_type else DEFAULT_ENGINE_TYPE
        want_type = engine.get("engine_type")
        if semantics["engine_type_honoured"]:
            if want_type is not None and engine_type != want_type:
                res.add(BROKEN, "Producer %s decodes events as engineType %s but the engines are %s." % (name, engine_type, want_type))
        elif engine_type != DEFAULT_ENGINE_TYPE or want_type == "sglang":
            res.add(WARNING, "Producer %s %s, but llm-d-router %s ignores kvEventsConfig.engineType and always decodes KV "
                    "events with its vLLM adapter (%s): SGLang events are read only while they keep vLLM's "
                    "positional-array layout, and SGLang emits no extra_keys, so salted or multimodal "
                    "requests never match."
                    % (name, "sets engineType %s" % engine_type if engine_type != DEFAULT_ENGINE_TYPE
                       else "routes to SGLang engines", self.version, semantics["engine_type_source"]))
        discover_flag = _param(kvc, "discoverPods")
        pdc_raw = self.nested_raw(raw, "kvEventsConfig", "podDiscoveryConfig")
        discover = (discover_flag if isinstance(discover_flag, bool) else True) and pdc_raw is not None
        zmq_endpoint = _param(kvc, "zmqEndpoint")
        if (discover_flag if isinstance(discover_flag, bool) else True) and pdc_raw is None and not zmq_endpoint:
            self.rule("pod-discovery-null", name=name)
        if discover:
            port = _param(_mapping(pdc_raw), "socketPort")
            port = port if _is_int(port) and port else DEFAULT_SOCKET_PORT
            want_port = engine.get("kv_events_port")
            if want_port is not None and port != want_port:
                res.add(BROKEN, "Producer %s dials KV events on port %s but the engines publish on port %s." % (name, port, want_port))
            if not zmq_endpoint and NOTIFICATION_SOURCE not in self.extracting.get(name, []):
                self.rule("no-notification-source", name=name)
        for other in token_producers:
            if self.token_backend(other) == "estimate":
                self.rule("estimating-token-producer", name=name, label=self.label(other))
        res.summary[name] = {"block_size": block_size, "hash_seed": seed, "topic_filter": topic_filter,
                             "engine_type": engine_type, "discover_pods": bool(discover)}

    def config_params(self, name):
        """The raw ``parameters`` mapping of a declared plugin, nulls included."""
        index = self.by_name[name][2]
        plugin = self.config["plugins"][index]
        return _mapping(plugin.get("parameters"))

    @staticmethod
    def nested_raw(params, *path):
        """The value at ``path`` with the EPP's defaults: absent -> the default mapping, null -> None."""
        value = params
        for key in path:
            if not _is_mapping(value):
                return {}
            found = [k for k in value if isinstance(k, str) and k.lower() == key.lower()]
            if not found:
                return {}
            value = value[key] if key in value else value[found[0]]
        return value

    def token_backend(self, name):
        params = self.by_name[name][1]
        if _is_mapping(_param(params, "udsTokenizerConfig")) and _param(_param(params, "udsTokenizerConfig"), "socketFile"):
            return "uds"
        if _param(params, "vllm") is not None or _param(params, "modelName"):
            return "vllm"
        return "estimate"

    def check_token_producers(self):
        semantics = SEMANTICS[self.version]
        for name in self.order:
            if "token-producer" not in self.roles(name):
                continue
            params = self.by_name[name][1]
            backend = self.token_backend(name)
            if backend in ("uds", "vllm") and not _param(params, "modelName"):
                self.res.add(REFUSED, "%s needs modelName with the %s backend; its factory fails without it." % (self.label(name), backend))
            if sum(1 for on in (_param(params, "estimate") is not None, backend == "uds",
                                _param(params, "vllm") is not None or bool(_param(params, "modelName"))) if on) > 1:
                self.res.add(REFUSED, "%s sets more than one of estimate, vllm and udsTokenizerConfig; its factory accepts one."
                             % self.label(name))
            if backend != "vllm":
                continue
            url = _param(_mapping(_param(params, "vllm")), "url")
            url = url if isinstance(url, str) and url else DEFAULT_RENDER_URL
            host = url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0]
            if self.engine.get("enable_scale_out") is False and host not in LOCAL_HOSTS:
                self.res.add(WARNING, "%s renders prompts at %s%s, which vLLM 0.32 serves only when started with "
                             "--enable-scale-out (403 otherwise), and the engines run without it, so the EPP "
                             "gets no tokens and precise scoring silently scores every endpoint 0."
                             % (self.label(name), url.rstrip("/"), semantics["render_path"]))

    def check_mode(self):
        mode, res, types = self.mode, self.res, [self.by_name[name][0] for name in self.order]
        precise = [name for name in self.order if self.by_name[name][0] == PRECISE_PRODUCER]
        if mode == "precise":
            if not precise:
                res.add(BROKEN, "Mode precise needs a precise-prefix-cache-producer plugin, and none is declared.")
            if PRECISE_LEGACY_SCORER not in types and not any(
                    self.by_name[name][0] == PREFIX_SCORER and _param(self.by_name[name][1], "prefixMatchInfoProducerName")
                    for name in self.order):
                res.add(BROKEN, "Mode precise needs a prefix-cache-scorer with prefixMatchInfoProducerName.")
        elif mode == "approximate":
            if precise:
                res.add(BROKEN, "Mode approximate must not declare a precise-prefix-cache-producer.")
            if "load-aware-scorer" not in types:
                res.add(BROKEN, "Mode approximate needs a load-aware-scorer plugin, and none is declared.")


def _check_engine(engine, res):
    """The engine facts the caller gives: keep the well-typed ones, one sentence per bad one."""
    if engine is None:
        return {}
    if not _is_mapping(engine):
        res.add(INPUT, "engine must be a mapping of the engines' settings (got %s)." % type_name(engine))
        return {}
    clean = {}
    for key, value in engine.items():
        kind = ENGINE_KEYS.get(key)
        if kind is None:
            res.add(INPUT, "engine.%s is not an engine setting this check knows (%s)." % (_text(key), ", ".join(sorted(ENGINE_KEYS))))
            continue
        if value is None:
            continue
        if kind == "int":
            if not _is_int(value):
                res.add(INPUT, "engine.%s is %s but must be an integer." % (key, type_name(value)))
                continue
            low, high = (1, 65535) if key == "kv_events_port" else (1, 1 << 20)
            if not low <= value <= high:
                res.add(INPUT, "engine.%s must be between %d and %d (got %d)." % (key, low, high, value))
                continue
        elif kind == "bool" and not isinstance(value, bool):
            res.add(INPUT, "engine.%s is %s but must be a boolean." % (key, type_name(value)))
            continue
        elif kind == "str":
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key == "hash_seed":
                value = str(value)
            if not isinstance(value, str):
                res.add(INPUT, "engine.%s is %s but must be a string." % (key, type_name(value)))
                continue
            if key == "engine_type" and value not in ("vllm", "sglang"):
                res.add(INPUT, "engine.engine_type is %s but must be vllm or sglang." % show(value))
                continue
        clean[key] = value
    return clean


def check_epp_config(config, engine=None, mode=None, router_version=None, raw_text=None):
    """Check an EndpointPickerConfig (a dict) against what ``router_version`` (default: the pinned one) does with it.

    ``engine`` keys (all optional): ``block_size`` (int), ``hash_seed`` (str), ``topic`` (the engines' topic,
    placeholders allowed), ``kv_events_port`` (int), ``engine_type`` (``vllm``|``sglang``), ``kv_events_enabled``
    (bool), ``enable_scale_out`` (bool: whether vLLM runs with ``--enable-scale-out``, which serves the render
    endpoint the token producer calls). ``mode`` (optional): ``precise`` or ``approximate`` to also check that the
    config implements that mode. ``raw_text`` (optional): the text the EPP would read, when known; an empty text
    (zero bytes) is what the EPP replaces with its default configuration, which is then checked in place of
    ``config``. Returns an :class:`EppConfigResult` whose ``epp_starts`` and ``findings`` say what the EPP does;
    never raises on any input.
    """
    version = router_version or DEFAULT_ROUTER_VERSION
    if not isinstance(version, str) or version not in PLUGINS:
        res = EppConfigResult(DEFAULT_ROUTER_VERSION)
        res.checked = False
        res.add(INPUT, "router_version %s is not one this collection encodes (%s)." % (show(version), ", ".join(ROUTER_VERSIONS)))
        return res.finish()
    res = EppConfigResult(version)
    engine = _check_engine(engine, res)
    if mode not in (None, "precise", "approximate"):
        res.add(INPUT, "mode is %s but must be precise or approximate." % show(mode))
        mode = None
    if isinstance(raw_text, str) and not raw_text:
        # llm-d/llm-d-router@v0.9.0:pkg/epp/config/loader/configloader.go LoadRawConfig: len(configBytes) == 0.
        kind, template, _source = BEHAVIOUR[version]["empty-config"]
        res.add(kind, template.format(version=version))
        config = copy.deepcopy(DEFAULT_CONFIG[version])
    if not _is_mapping(config):
        res.add(REFUSED, "The EndpointPickerConfig is not a mapping (got %s)." % type(config).__name__)
        return res.finish()
    checker = _Checker(config, engine, mode, version)
    checker.res = res
    return checker.run().finish()
