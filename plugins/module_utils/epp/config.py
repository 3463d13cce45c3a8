# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""Static checks of an EndpointPickerConfig: what one router (implementation and version) does with it, and the engines.

Plain Python without any Ansible import: the ``epp_config_check`` module, the router role (through that module)
and the tests all use :func:`check_epp_config` (or :func:`check_epp_text` for YAML text).

Two router implementations (``router_impl``, ``common/wiring.ROUTER_IMPLS``): ``llm-d`` (the llm-d router's EPP) and
``gie`` (the Gateway API Inference Extension's own EPP, which llm-d's extends). The shapes (plugin types, each type's
parameter fields, their JSON types) come from each implementation's per-version tables, :mod:`.plugins` and
:mod:`.gie` (``rules.IMPLS``), and are checked declaratively by :mod:`.schema`; what relates one part of the config to
another (plugin references, the precise producer and its token producer, data-layer wiring) and to the engines is the
table of rules in :mod:`.rules` (``ALL_RULES``, ``RULES``, ``GIE_RULES``, importable from here too).

The result a check returns, and the sentence guards, are :mod:`.findings`'s. This file is the engine that applies them:
:class:`_Config` walks a config and yields the subjects in the order the EPP
meets them (a kind of subject and its fields, read as the EPP reads them: :mod:`.values`); :func:`_evaluate` applies
every rule of the implementation to each subject; :func:`check_epp_config` checks the caller's arguments first.

Every finding is one sentence that names the plugin or field path at fault, with its kind: refused (the EPP does not
start), broken (it starts, then crashes or never does what the config asks) or a warning. No input, however malformed,
raises.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import copy

try:
    import yaml
except ImportError:  # pragma: no cover - check_epp_text needs it; check_epp_config does not
    yaml = None

from . import gie
from .llm_d import INPUT, REFUSED, SEMANTICS
from .rules import (
    API_VERSION, DEFAULT_ENGINE_TYPE, DEFAULT_ROUTER_IMPL, GIE, IMPLS, KIND, LLM_D, PRECISE_LEGACY_SCORER, PRECISE_PRODUCER,
    PRECISE_TYPES, PREFIX_SCORER, RULES_BY_IMPL, TOKEN_PRODUCER)
# The rule tables, importable from here as before they had a file of their own.
from .rules import ALL_RULES, GIE_RULES, RULES  # pylint: disable=unused-import
from .findings import EppConfigResult, serious as _serious, text as _text
from .schema import show, type_name, validate
from .values import as_list, as_mapping, is_int, is_mapping, is_named, is_number, param
from ..common import wiring

# Defaults of the precise producer when a field is absent (kvevents.DefaultConfig, kvblock.DefaultTokenProcessorConfig).
DEFAULT_BLOCK_SIZE = 16
DEFAULT_TOPIC_FILTER = wiring.topic_filter("")  # the EPP's default topicFilter: the prefix of the topic form
DEFAULT_SOCKET_PORT = 5557
DEFAULT_RENDER_URL = "http://localhost:8000"

# Parameter fields that name another plugin, the role that plugin must have, and how a sentence names that role.
PRODUCER_REFERENCES = (
    ("prefixMatchInfoProducerName", "prefix-producer", "a prefix-cache producer"),
    ("inFlightLoadProducerName", "inflight-load-producer", "an inflight-load-producer"),
    ("latencyPredictionInfoProducerName", "latency-producer", "a predicted-latency-producer"),
)
MM_PRODUCER_REFERENCE = ("producerName", "mm-producer", "an mm-embeddings-cache-producer")

# The engine facts a caller may give, as an option table (common/options.py): the epp_config_check module's engine
# suboptions are built from it, and _check_engine reads types, ranges and choices from it.
ENGINE_OPTIONS = {
    "block_size": {"type": "int", "range": (1, 1 << 20)},
    "hash_seed": {"type": "str", "no_log": False},
    "topic": {"type": "str"},
    "kv_events_port": {"type": "int", "range": (1, 65535)},
    "engine_type": {"type": "str", "choices": ["vllm", "sglang"]},
    "kv_events_enabled": {"type": "bool", "default": True},
    "enable_scale_out": {"type": "bool"},
}
NUMERIC_TEXT = ("hash_seed",)  # settings read as text when given as a number (PYTHONHASHSEED: 42)
ENGINE_WORDS = {"int": "an integer", "bool": "a boolean", "str": "a string"}


def _evaluate(config, rules_by_subject=None):
    """Apply the rules to every subject ``config.walk()`` yields, in order; record each finding in ``config.res``."""
    rules_by_subject = RULES_BY_IMPL[config.impl] if rules_by_subject is None else rules_by_subject
    for looks_at, subject in config.walk():
        for rule in rules_by_subject.get(looks_at, ()):
            if not rule.when(config, subject):
                continue
            kind, sentence = rule.finding(config, subject)
            config.res.add(kind, sentence, deprecation=rule.deprecation, rule=rule.name)
            if rule.halt:
                return config.res
            if rule.final:
                break
    return config.res


# --- the walk: what the rules look at, in the order the EPP meets it ----------------------------------------------

class _Subject(object):
    """What one rule looks at: its fields are the template's fields too."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


def _unregistered_note(removed, ptype):
    """``(why, hint)`` of the sentence for a plugin type the version does not register (``removed``: its notes)."""
    why = removed.get(ptype) if is_named(ptype) else None
    return (" (%s)" % why, "") if why else ("", "; check its spelling")


def _decider_refs(ptype, params):
    """``(field, plugin name)`` of the deciders a profile handler names (pd-profile-handler has a default one)."""
    if ptype == "pd-profile-handler":
        ref = param(params, "deciderPluginName")
        return [("deciderPluginName", ref if is_named(ref) else "prefix-based-pd-decider")]
    if ptype != "disagg-profile-handler":
        return []
    deciders = as_mapping(param(params, "deciders"))
    pairs = [("deciders.prefill", param(deciders, "prefill")), ("deciders.encode", param(deciders, "encode"))]
    pairs += [(field, param(params, field)) for field in ("prefillDeciderPluginName", "deciderPluginName", "encodeDeciderPluginName")]
    return [(field, ref) for field, ref in pairs if is_named(ref)]


def _block_size(tpc):
    tokens, old = param(tpc, "blockSizeTokens"), param(tpc, "blockSize")
    for size in (tokens, old):
        if is_int(size) and size > 0:
            return size
    return DEFAULT_BLOCK_SIZE


def _text_or(value, default):
    return value if isinstance(value, str) and value else default


def _nested_raw(params, *path):
    """The value at ``path`` with the EPP's defaults: absent -> the default mapping, null -> None."""
    value = params
    for key in path:
        if not is_mapping(value):
            return {}
        found = [k for k in value if isinstance(k, str) and k.lower() == key.lower()]
        if not found:
            return {}
        value = value[key] if key in value else value[found[0]]
    return value


class _Config(object):
    """One config as the EPP reads it (plugins by name, their roles, the engines' facts) and the walk over it."""

    def __init__(self, config, engine, mode, version, res, impl=LLM_D):
        self.config, self.engine, self.mode, self.version, self.res, self.impl = config, engine, mode, version, res, impl
        tables = IMPLS[impl]
        self.table = tables["plugins"][version]
        self.schema = tables["schema"][version]
        self.gates = tables["gates"][version]
        self.removed = tables["removed"].get(version, {})
        self.behaviour = tables["behaviour"][version]
        self.router, self.data_key, self.top_level_notes = tables["name"], tables["data_key"], tables["top_level_notes"]
        self.source_word = tables["source_word"]
        self.semantics = SEMANTICS.get(version, {}) if impl == LLM_D else {}
        self.by_name = {}      # name -> (type, parameters mapping, index)
        self.order = []        # names in declaration order
        self.duplicates = set()  # indexes of entries whose name an earlier entry has
        self.extracting = {}   # plugin name -> the types of the data sources that list it as an extractor
        plugins = config.get("plugins")
        for index, plugin in enumerate(plugins if isinstance(plugins, list) else []):
            ptype = plugin.get("type") if is_mapping(plugin) else None
            if not is_named(ptype):
                continue
            name = plugin.get("name") if is_named(plugin.get("name")) else ptype
            if name in self.by_name:
                self.duplicates.add(index)
                continue
            params = plugin.get("parameters")
            self.by_name[name] = (ptype, params if is_mapping(params) else {}, index)
            self.order.append(name)
        self.token_producers = [name for name in self.order if TOKEN_PRODUCER in self.roles(name)]

    # -- what the rules ask ----------------------------------------------------------------------------------------
    def declared(self, name):
        return isinstance(name, str) and name in self.by_name

    def type_of(self, name):
        return self.by_name[name][0] if self.declared(name) else None

    def params_of(self, name):
        return self.by_name[name][1] if self.declared(name) else {}

    def index_of(self, name):
        return self.by_name[name][2]

    def types(self):
        return [self.by_name[name][0] for name in self.order]

    def roles(self, name):
        spec = self.table.get(self.type_of(name)) if self.declared(name) else None
        return spec["roles"] if spec else frozenset()

    def label(self, name):
        ptype = self.type_of(name)
        return "Plugin %s" % _text(name) if ptype in (None, name) else "Plugin %s (%s)" % (_text(name), _text(ptype))

    def prefix_scorer_sources(self):
        """The prefixMatchInfoProducerName of every prefix-cache-scorer, in declaration order."""
        return [param(self.params_of(name), "prefixMatchInfoProducerName") for name in self.order
                if self.type_of(name) == PREFIX_SCORER]

    def weighted_prefix_scorer(self):
        """Whether a declared prefix-cache-scorer scores in a scheduling profile with a weight above 0 (without profiles
        the EPP's profile default holds every declared scorer at weight 1; an absent weight is 1)."""
        scorers = [name for name in self.order if self.type_of(name) == PREFIX_SCORER]
        profiles = self.config.get("schedulingProfiles")
        if not profiles:
            return bool(scorers)
        for profile in as_list(profiles):
            for entry in map(as_mapping, as_list(as_mapping(profile).get("plugins"))):
                weight = 1 if entry.get("weight") is None else entry.get("weight")
                if entry.get("pluginRef") in scorers and is_number(weight) and weight > 0:
                    return True
        return False

    def pod_discovery_port(self, name):
        kv_events = as_mapping(param(self.params_of(name), "kvEventsConfig"))
        return param(as_mapping(param(kv_events, "podDiscoveryConfig")), "socketPort")

    def token_backend(self, name):
        params = self.params_of(name)
        if is_mapping(param(params, "udsTokenizerConfig")) and param(param(params, "udsTokenizerConfig"), "socketFile"):
            return "uds"
        if param(params, "vllm") is not None or param(params, "modelName"):
            return "vllm"
        return "estimate"

    def raw_params(self, name):
        """The ``parameters`` mapping of a declared plugin as written, nulls included."""
        return as_mapping(self.config["plugins"][self.index_of(name)].get("parameters"))

    # -- the walk ----------------------------------------------------------------------------------------------------
    def walk(self):
        """``(looks_at, subject)`` for everything a rule looks at, in the order the checks report it."""
        parts = (self._top_level, self._plugins, self._profiles, self._data_layer, self._request_handling)
        if self.impl == LLM_D:
            parts += (self._references, self._precise_producers, self._token_producers)
        else:
            parts += (self._gie_layers,)
        for part in parts:
            yield from part()
        yield "mode", _Subject()
        self.res.summary["plugins"] = sorted(self.by_name)

    def _top_level(self):
        api_version, kind = self.config.get("apiVersion"), self.config.get("kind")
        header = _Subject(api_version=api_version, api_version_shown=show(api_version), api=API_VERSION, kind=kind,
                          kind_shown=show(kind), wanted_kind=KIND, gie_api=gie.API_VERSION)
        if self.impl == GIE:
            yield "header", header  # GIE's decoder refuses another apiVersion before it reads any field
        for finding in validate(self.config, self.schema):
            where = "EndpointPickerConfig field %s" % finding.path if finding.path else "The EndpointPickerConfig"
            yield "top-level field", _Subject(finding=finding.kind, where=where, message=finding.message, path=finding.path)
        if self.impl == LLM_D:
            yield "header", header
        for gate in as_list(self.config.get("featureGates")):
            yield "feature gate", _Subject(gate=gate, known=", ".join(sorted(self.gates)))

    def _plugins(self):
        plugins = self.config.get("plugins")
        yield "plugin list", _Subject(plugins=plugins)
        for index, plugin in enumerate(plugins if isinstance(plugins, list) and plugins else []):
            subject = self._plugin(index, plugin)
            findings = self._parameter_findings(subject)
            yield "plugin", subject
            for finding in findings:
                yield "parameter", _Subject(finding=finding.kind, path=finding.path, message=finding.message, name=subject.name,
                                            ptype=subject.ptype, label=subject.label, where="%s parameter %s" % (subject.label, finding.path))

    def _plugin(self, index, plugin):
        """One entry of ``plugins`` as the EPP registers it (``typed``: it has a type; ``duplicate``: its name is taken)."""
        plugin = as_mapping(plugin)
        ptype = plugin.get("type")
        typed = is_named(ptype)
        name = (plugin.get("name") if is_named(plugin.get("name")) else ptype) if typed else None
        spec = self.table.get(ptype) if typed else None
        why, hint = _unregistered_note(self.removed, ptype)
        return _Subject(index=index, typed=typed, duplicate=index in self.duplicates, name=name, name_text=_text(name),
                        ptype=ptype, ptype_text=_text(ptype), why=why, hint=hint, spec=spec, replacement=spec and spec["deprecated"],
                        params=plugin.get("parameters"), params_type=type_name(plugin.get("parameters")),
                        label=self.label(name) if typed else None, legacy=False)

    @staticmethod
    def _parameter_findings(subject):
        """The schema findings of a plugin's parameters (the legacy shape's when only that fits: ``subject.legacy``)."""
        spec, params = subject.spec, subject.params
        if not subject.typed or subject.duplicate or spec is None or spec["params"] is None or not is_mapping(params):
            return []
        findings = validate(params, spec["params"], case_insensitive=True)
        if spec["legacy_params"] is not None and _serious(findings):
            legacy = validate(params, spec["legacy_params"], case_insensitive=True)
            if not _serious(legacy):
                subject.legacy = True
                return legacy
        return findings

    def _profiles(self):
        profiles = self.config.get("schedulingProfiles")
        yield "profile list", _Subject(profiles=profiles)
        seen = set()
        for index, profile in enumerate(profiles if isinstance(profiles, list) else []):
            if not is_mapping(profile):
                yield "profile", _Subject(index=index, mapping=False, value_type=type_name(profile))
                continue
            named = is_named(profile.get("name"))
            name = profile.get("name") if named else "schedulingProfiles[%d]" % index
            yield "profile", _Subject(index=index, mapping=True, named=named, profile=name, duplicate=named and name in seen)
            seen.add(name)
            entries = [self._profile_entry(name, entry) for entry in as_list(profile.get("plugins"))]
            for entry in entries:
                yield "profile entry", entry
            yield "profile pickers", self._pickers(name, entries)
        handlers = [name for name in self.order if "profile-handler" in self.roles(name)]
        yield "profile handlers", _Subject(names=handlers, handlers=", ".join(handlers), profiles=len(seen))

    def _pickers(self, profile, entries):
        pickers = [entry.ref for entry in entries if self.declared(entry.ref) and "picker" in self.roles(entry.ref)]
        return _Subject(profile=profile, count=len(pickers), pickers=", ".join(pickers))

    @staticmethod
    def _profile_entry(profile, entry):
        ref = as_mapping(entry).get("pluginRef")
        weight = as_mapping(entry).get("weight") if is_named(ref) else None
        return _Subject(profile=profile, where="Scheduling profile %s" % profile, has_ref=is_named(ref), ref=ref, plugin=_text(ref),
                        weight=weight, weight_shown=show(weight))

    def _data_layer(self):
        data_layer = as_mapping(self.config.get(self.data_key))
        for source in as_list(data_layer.get("sources")):
            ref = source.get("pluginRef") if is_mapping(source) else None
            yield "data source", _Subject(has_ref=is_named(ref), ref=ref, plugin=_text(ref), where=self.source_word,
                                          ref_type=self.type_of(ref))
            if not is_named(ref):
                continue
            for extractor in as_list(source.get("extractors")):
                extractor_ref = extractor.get("pluginRef") if is_mapping(extractor) else None
                yield "extractor", _Subject(source=ref, has_ref=is_named(extractor_ref), ref=extractor_ref, plugin=_text(extractor_ref),
                                            where="%s %s extractor" % (self.source_word, ref), ref_type=self.type_of(extractor_ref))
                if is_named(extractor_ref) and self.declared(extractor_ref):
                    self.extracting.setdefault(extractor_ref, []).append(self.type_of(ref) or "")
        discovery = as_mapping(data_layer.get("discovery")).get("pluginRef")
        yield "discovery", _Subject(has_ref=is_named(discovery), ref=discovery, plugin=_text(discovery), where="dataLayer discovery",
                                    ref_type=self.type_of(discovery))

    def _gie_layers(self):
        """GIE's feature-gated layers: the data layer (data.sources and its metrics extractor) and flow control."""
        gates = as_list(self.config.get("featureGates"))
        sources = as_list(as_mapping(self.config.get("data")).get("sources"))
        extractors = [(as_mapping(source).get("pluginRef"), as_mapping(extractor).get("pluginRef")) for source in sources
                      for extractor in as_list(as_mapping(source).get("extractors"))]
        metrics = [(_text(src), _text(ref)) for src, ref in extractors if self.type_of(ref) == gie.METRICS_EXTRACTOR]
        yield "data layer", _Subject(gated="dataLayer" in gates, sources=sources, metrics_extractors=metrics,
                                     flow_gated="flowControl" in gates)

    def _request_handling(self):
        config = self.config
        parsers = [p.get("pluginRef") for p in as_list(as_mapping(config.get("requestHandler")).get("parsers")) if is_mapping(p)]
        parsers.append(as_mapping(config.get("parser")).get("pluginRef"))
        for ref in filter(is_named, parsers):
            yield "parser", _Subject(ref=ref, ref_type=self.type_of(ref))
        flow = as_mapping(config.get("flowControl"))
        for holder in (flow, config):
            ref = as_mapping(holder.get("saturationDetector")).get("pluginRef")
            if is_named(ref):
                yield "saturation detector", _Subject(ref=ref, plugin=_text(ref), where="saturationDetector", ref_type=self.type_of(ref))
        gated = "flowControl" in as_list(config.get("featureGates"))
        bands = [flow.get("defaultPriorityBand"), flow.get("defaultNegativePriorityBand")] + as_list(flow.get("priorityBands"))
        refs = [("flowControl.usageLimitPolicyPluginRef", flow.get("usageLimitPolicyPluginRef"))]
        for band in map(as_mapping, bands):
            refs += [("A priority band's fairnessPolicyRef", band.get("fairnessPolicyRef")),
                     ("A priority band's orderingPolicyRef", band.get("orderingPolicyRef"))]
        for where, ref in refs:
            if is_named(ref):
                yield "flow-control policy", _Subject(gated=gated, ref=ref, plugin=_text(ref), where=where)

    def _references(self):
        for name in self.order:
            ptype, params, index = self.by_name[name]
            refs = PRODUCER_REFERENCES + ((MM_PRODUCER_REFERENCE,) if "scorer" in self.roles(name) else ())
            reader = "Scorer %s" % name if ptype == PREFIX_SCORER else self.label(name)
            for field, role, what in refs:
                ref = param(params, field)
                if is_named(ref):
                    yield "producer reference", _Subject(reader=reader, verb="reads", field=field, role=role, what=what, ref=ref,
                                                         ref_type=self.type_of(ref))
        for name in self.order:
            ptype, params, index = self.by_name[name]
            for field, ref in _decider_refs(ptype, params):
                yield "decider reference", _Subject(reader=self.label(name), reader_index=index, verb="names", field=field, ref=ref,
                                                    ref_type=self.type_of(ref))

    def _defers(self, name):
        """The legacy scorer defers to a producer declared before it and ignores its own parameters."""
        return self.type_of(name) == PRECISE_LEGACY_SCORER and any(
            self.type_of(other) == PRECISE_PRODUCER and self.index_of(other) < self.index_of(name) for other in self.order)

    def _precise_producers(self):
        for name in self.order:
            if self.type_of(name) not in PRECISE_TYPES or self._defers(name):
                continue
            subject = self._producer(name)
            yield "precise producer", subject
            for other in self.token_producers:
                yield "precise producer's token producer", _Subject(name=name, token_producer=other)
            self.res.summary[name] = {"block_size": subject.block_size, "hash_seed": subject.hash_seed,
                                      "topic_filter": subject.topic_filter, "engine_type": subject.engine_type,
                                      "discover_pods": bool(subject.discovers)}

    def _producer(self, name):
        """A precise producer with what it subscribes to, as the EPP reads its parameters (defaults filled in)."""
        params, raw, engine = self.params_of(name), self.raw_params(name), self.engine
        kv_events = as_mapping(param(params, "kvEventsConfig"))
        tokens = as_mapping(param(params, "tokenProcessorConfig"))
        discover = param(kv_events, "discoverPods")
        pod_discovery = _nested_raw(raw, "kvEventsConfig", "podDiscoveryConfig")
        port = param(as_mapping(pod_discovery), "socketPort")
        engine_seed = engine.get("hash_seed")
        subject = _Subject(
            name=name, ptype=self.type_of(name), raw=raw, concurrency=param(kv_events, "concurrency"),
            tokenizers_pool=param(as_mapping(param(params, "indexerConfig")), "tokenizersPoolConfig"),
            block_size=_block_size(tokens), engine_block_size=engine.get("block_size"),
            hash_seed=_text_or(param(tokens, "hashSeed"), ""), engine_hash_seed=None if engine_seed is None else str(engine_seed),
            topic_filter=param(kv_events, "topicFilter"), topic=engine.get("topic"),
            engine_type=_text_or(param(kv_events, "engineType"), DEFAULT_ENGINE_TYPE), engine_kind=engine.get("engine_type"),
            discover_pods=discover if isinstance(discover, bool) else True, pod_discovery=pod_discovery,
            zmq_endpoint=param(kv_events, "zmqEndpoint"), port=port if is_int(port) and port else DEFAULT_SOCKET_PORT,
            engine_port=engine.get("kv_events_port"), block_keys_source=self.semantics["block_keys_source"],
            engine_type_source=self.semantics["engine_type_source"])
        subject.topic_filter = subject.topic_filter if isinstance(subject.topic_filter, str) else DEFAULT_TOPIC_FILTER
        subject.discovers = subject.discover_pods and pod_discovery is not None
        return subject

    def _token_producers(self):
        for name in self.token_producers:
            params = self.params_of(name)
            backend = self.token_backend(name)
            url = _text_or(param(as_mapping(param(params, "vllm")), "url"), DEFAULT_RENDER_URL)
            backends = [param(params, "estimate") is not None, backend == "uds",
                        param(params, "vllm") is not None or bool(param(params, "modelName"))]
            yield "token producer", _Subject(label=self.label(name), params=params, backend=backend, backends=sum(backends),
                                             url=url.rstrip("/"), render_path=self.semantics["render_path"],
                                             host=url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0])


# --- the check's own arguments -------------------------------------------------------------------------------------

def _engine_problem(key, value):
    """The sentence for one engine setting that does not fit ENGINE_OPTIONS (None when it does)."""
    entry = ENGINE_OPTIONS[key]
    kind = entry["type"]
    fits = {"int": is_int(value), "bool": isinstance(value, bool), "str": isinstance(value, str)}[kind]
    if not fits:
        return "engine.%s is %s but must be %s." % (key, type_name(value), ENGINE_WORDS[kind])
    if "range" in entry and not entry["range"][0] <= value <= entry["range"][1]:
        return "engine.%s must be between %d and %d (got %d)." % (key, entry["range"][0], entry["range"][1], value)
    if entry.get("choices") and value not in entry["choices"]:
        return "engine.%s is %s but must be %s." % (key, show(value), " or ".join(entry["choices"]))
    return None


def _check_engine(engine, res):
    """The engine facts the caller gives: keep the well-typed ones, one INPUT finding per bad one."""
    if engine is None:
        return {}
    if not is_mapping(engine):
        res.add(INPUT, "engine must be a mapping of the engines' settings (got %s)." % type_name(engine))
        return {}
    clean = {}
    for key, value in engine.items():
        if key not in ENGINE_OPTIONS:
            res.add(INPUT, "engine.%s is not an engine setting this check knows (%s)." % (_text(key), ", ".join(sorted(ENGINE_OPTIONS))))
            continue
        if key in NUMERIC_TEXT and is_number(value):
            value = str(value)
        problem = None if value is None else _engine_problem(key, value)
        if problem:
            res.add(INPUT, problem)
        elif value is not None:
            clean[key] = value
    return clean


def _start(engine, mode, router_version, router_impl):
    """``(result, engine, mode)`` with the check's own arguments checked; ``result.checked`` is False when there is no
    router (implementation and version) to check against."""
    impl = DEFAULT_ROUTER_IMPL if router_impl is None else router_impl
    if not isinstance(impl, str) or impl not in IMPLS:
        res = EppConfigResult(wiring.ROUTER_IMPLS[DEFAULT_ROUTER_IMPL], DEFAULT_ROUTER_IMPL)
        res.checked = False
        res.add(INPUT, "router_impl is %s but must be %s." % (show(impl), " or ".join(sorted(IMPLS))))
        return res, None, None
    versions = IMPLS[impl]["versions"]
    version = router_version or wiring.ROUTER_IMPLS[impl]
    if not isinstance(version, str) or version not in versions:
        res = EppConfigResult(wiring.ROUTER_IMPLS[impl], impl)
        res.checked = False
        elsewhere = impl != DEFAULT_ROUTER_IMPL or any(version in IMPLS[other]["versions"] for other in IMPLS if other != impl)
        res.add(INPUT, "router_version %s is not one this collection encodes%s (%s)." % (
            show(version), " for router_impl %s" % impl if elsewhere else "", ", ".join(versions)))
        return res, None, None
    res = EppConfigResult(version, impl)
    engine = _check_engine(engine, res)
    if mode not in (None, "precise", "approximate"):
        res.add(INPUT, "mode is %s but must be precise or approximate." % show(mode))
        mode = None
    if mode == "precise" and impl == GIE:
        res.add(INPUT, gie.PRECISE_MODE[0].format(version=version))
        mode = None
    return res, engine, mode


def check_epp_config(config, engine=None, mode=None, router_version=None, raw_text=None, router_impl=None):
    """Check an EndpointPickerConfig (a dict) against what a router does with it: ``router_impl`` (``llm-d``, the default,
    or ``gie``) at ``router_version`` (default: the version the collection pins for that implementation).

    ``engine`` keys (all optional, ENGINE_OPTIONS): ``block_size`` (int), ``hash_seed`` (str), ``topic`` (the engines'
    topic, placeholders allowed), ``kv_events_port`` (int), ``engine_type`` (``vllm``|``sglang``), ``kv_events_enabled``
    (bool), ``enable_scale_out`` (bool: whether vLLM runs with ``--enable-scale-out``, which serves the render
    endpoint the token producer calls). ``mode`` (optional): ``precise`` or ``approximate`` to also check that the
    config implements that mode (GIE has no precise mode: an input finding). ``raw_text`` (optional): the text the EPP
    would read, when known; an empty text (zero bytes) is what the EPP replaces with its default configuration, which
    is then checked in place of ``config``. Returns an :class:`EppConfigResult` whose ``epp_starts`` and ``findings``
    say what the EPP does; never raises on any input.
    """
    res, engine, mode = _start(engine, mode, router_version, router_impl)
    if not res.checked:
        return res.finish()
    version, impl = res.router_version, res.router_impl
    if isinstance(raw_text, str) and not raw_text:
        # LoadRawConfig (pkg/epp/config/loader/configloader.go, both routers): len(configBytes) == 0.
        kind, template, _source = IMPLS[impl]["behaviour"][version]["empty-config"]
        res.add(kind, template.format(version=version))
        config = copy.deepcopy(IMPLS[impl]["default_config"][version])
    if not is_mapping(config):
        res.add(REFUSED, "The EndpointPickerConfig is not a mapping (got %s)." % type(config).__name__)
        return res.finish()
    return _evaluate(_Config(config, engine, mode, version, res, impl)).finish()


def check_epp_text(text, engine=None, mode=None, router_version=None, router_impl=None):
    """Check an EndpointPickerConfig given as the YAML text the EPP reads (a file, ``--config-text``); PyYAML needed.

    Text that is not YAML is what the EPP cannot decode: the result has one refused finding saying so (``epp_starts``
    False, ``decoded`` False). Otherwise as :func:`check_epp_config` with ``raw_text=text``.
    """
    if yaml is None:
        raise ImportError("check_epp_text needs PyYAML")
    try:
        config = yaml.safe_load(text)
    except (yaml.YAMLError, ValueError) as exc:
        res, engine, mode = _start(engine, mode, router_version, router_impl)
        if res.checked:
            res.decoded = False
            # decodeRawConfig (pkg/epp/config/loader/configloader.go, both routers): "failed to decode configuration
            # JSON/YAML" (run with GIE v1.4.0).
            res.add(REFUSED, "The EndpointPickerConfig is not valid YAML, so %s %s cannot decode it and does not start: %s." % (
                IMPLS[res.router_impl]["name"], res.router_version, " ".join(str(exc).split()).rstrip(".")))
        return res.finish()
    return check_epp_config(config, engine=engine, mode=mode, router_version=router_version, raw_text=text, router_impl=router_impl)
