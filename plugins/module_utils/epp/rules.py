# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""The rules of ``epp_config_check``: what one router (implementation and version) does with an EndpointPickerConfig.

Data, evaluated by the walk of :mod:`.config`. :data:`ALL_RULES` is a table of rules, each naming what it looks at (a
kind of subject: the top level, a declared plugin, a scheduling-profile entry, a precise producer, ...), the condition
under which it fires, the kind of its finding and its sentence (a ``str.format`` template over the subject's fields,
``version`` always given), the upstream code it was read at where known, and the implementations it applies to
(:data:`RULES` holds the llm-d ones, :data:`GIE_RULES` the GIE ones, each with its GIE citation). A rule whose kind and
sentence are facts the router version was measured to have names its entry of the implementation's ``BEHAVIOUR``
instead. :data:`IMPLS` names each implementation's per-version tables (:mod:`.plugins`, :mod:`.gie`).

Adding a check is adding one entry to :data:`ALL_RULES` (and, for a new kind of subject, one ``yield`` in the walk of
:mod:`.config`). Plain Python, no Ansible import.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

from . import gie
from .llm_d import (
    BEHAVIOUR, BROKEN, CONFIG_SCHEMA, DEFAULT_CONFIG, DEFAULT_ROUTER_VERSION, FEATURE_GATES, PLUGINS, REFUSED, REMOVED_OR_LATER,
    ROUTER_SOURCE, ROUTER_VERSIONS, SEMANTICS, WARNING)
from .schema import show
from .values import as_mapping, is_int, is_mapping, is_number, param
from ..common import wiring

LLM_D, GIE = "llm-d", "gie"
DEFAULT_ROUTER_IMPL = wiring.DEFAULT_ROUTER_IMPL
# Per implementation: how sentences name it, its tables (each keyed by version), the versions encoded, its data-layer
# field, and what a sentence adds about a top-level field of the other implementation's config.
IMPLS = {
    LLM_D: {"name": "llm-d-router", "versions": ROUTER_VERSIONS, "plugins": PLUGINS, "schema": CONFIG_SCHEMA,
            "gates": FEATURE_GATES, "removed": REMOVED_OR_LATER, "behaviour": BEHAVIOUR, "default_config": DEFAULT_CONFIG,
            "data_key": "dataLayer", "source_word": "dataLayer source",
            "top_level_notes": {"data": "GIE's name for what llm-d-router calls dataLayer"}},
    GIE: {"name": gie.NAME, "versions": gie.GIE_VERSIONS, "plugins": gie.PLUGINS, "schema": gie.CONFIG_SCHEMA,
          "gates": gie.FEATURE_GATES, "removed": gie.REMOVED_OR_LATER, "behaviour": gie.BEHAVIOUR,
          "default_config": gie.DEFAULT_CONFIG, "data_key": "data", "source_word": "data.sources entry",
          "top_level_notes": gie.TOP_LEVEL_NOTES},
}

API_VERSION = "llm-d.ai/v1alpha1"
DEPRECATED_API_VERSIONS = ("inference.networking.x-k8s.io/v1alpha1",)
KIND = "EndpointPickerConfig"

PRECISE_PRODUCER = "precise-prefix-cache-producer"
PRECISE_LEGACY_SCORER = "precise-prefix-cache-scorer"
PRECISE_TYPES = (PRECISE_PRODUCER, PRECISE_LEGACY_SCORER)
TOKEN_PRODUCER = "token-producer"
PREFIX_SCORER = "prefix-cache-scorer"
NOTIFICATION_SOURCE = "endpoint-notification-source"
SOCKET_PORT_PATH = "kvEventsConfig.podDiscoveryConfig.socketPort"

# The engine type the precise producer decodes when kvEventsConfig.engineType is absent.
DEFAULT_ENGINE_TYPE = "vllm"

# Names the EPP instantiates by itself when a reference names them without a declared plugin (loader/defaults.go).
AUTO_SATURATION_DETECTOR = "utilization-detector"
AUTO_FLOW_CONTROL = ("fcfs-ordering-policy", "global-strict-fairness-policy", "static-usage-limit-policy")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]", "::1")


def _topic_matches(topic_filter, topic):
    """ZMQ SUB filters are byte-prefix matches; an engine topic may hold ``$(POD_IP)`` placeholders."""
    if topic is None:
        return True
    return str(topic).startswith(str(topic_filter))


def _speculative_ttl(subject):
    """A parameter finding about the precise producer's speculativeTTL value (a string that is no Go duration)."""
    return subject.finding == "value" and subject.path == "speculativeTTL" and subject.ptype in PRECISE_TYPES


def _gie_block_size_only(params):
    """GIE's prefix-cache-scorer refuses blockSize (characters) set without blockSizeTokens (prefix/plugin.go New)."""
    size, tokens = param(params, "blockSize"), param(params, "blockSizeTokens")
    return is_number(size) and size > 0 and not (is_number(tokens) and tokens > 0)


class Rule(object):
    """One check: what it looks at, when it fires, the kind and sentence of its finding, where that was read.

    ``when(config, subject)`` is the condition (``config`` is the ``config._Config`` being walked, ``subject`` what the
    walk yields for ``looks_at``); ``says`` is a ``str.format`` template over the subject's fields, ``version`` and what
    ``fields(config, subject)`` adds. A rule with ``behaviour`` takes kind, sentence and source from that entry of
    ``plugins.BEHAVIOUR[version]``. ``final``: once it fires, no later rule looks at the same subject (the EPP stops
    there too). ``deprecation``: a warning filed as a deprecation. ``halt``: once it fires, the walk stops (the EPP
    cannot even decode the config, and what follows would only be noise). ``impls``: the implementations the rule
    applies to; ``source`` is the llm-d citation and ``gie`` the GIE one (a rule applies to GIE only with one).
    """

    __slots__ = ("name", "looks_at", "kind", "says", "when", "source", "fields", "final", "deprecation", "behaviour", "gie",
                 "impls", "halt")

    def __init__(self, name, looks_at, kind, says, when, source=None, fields=None, final=False, deprecation=False,
                 behaviour=None, gie=None, impls=None, halt=False):
        self.name, self.looks_at, self.kind, self.says, self.when = name, looks_at, kind, says, when
        self.source, self.fields, self.final, self.deprecation, self.behaviour = source, fields, final, deprecation, behaviour
        self.gie, self.halt = gie, halt
        self.impls = impls or ((LLM_D, GIE) if gie else (LLM_D,))

    def finding(self, config, subject):
        """``(kind, sentence)`` of this rule's finding on ``subject``."""
        kind, says = self.kind, self.says
        if self.behaviour:
            kind, says, _source = config.behaviour[self.behaviour]
        fields = dict(vars(subject), version=config.version, router=config.router, source_word=config.source_word)
        fields.update(self.fields(config, subject) if self.fields else {})
        return kind, says.format(**fields)


def _rule(name, looks_at, kind, says, when, **options):
    return Rule(name, looks_at, kind, says, when, **options)


def _gie(name, looks_at, kind, says, when, source, **options):
    """A rule of GIE only; ``source`` is its GIE citation."""
    return Rule(name, looks_at, kind, says, when, gie=source, impls=(GIE,), **options)


def _behaviour(name, looks_at, when, **options):
    """A rule whose kind, sentence and source are the implementation's ``BEHAVIOUR[version][name]``: it applies to the
    implementations whose pinned version has that entry."""
    impls = tuple(impl for impl in (LLM_D, GIE) if name in IMPLS[impl]["behaviour"][wiring.ROUTER_IMPLS[impl]])
    source = IMPLS[GIE]["behaviour"][gie.GIE_VERSION].get(name, (None, None, None))[2]
    return Rule(name, looks_at, None, None, when, behaviour=name, impls=impls, gie=source, **options)


def _missing_header(subject):
    """``apiVersion is``, ``kind is`` or ``apiVersion and kind are``: what of the header is missing or empty."""
    missing = [name for name, value in (("apiVersion", subject.api_version), ("kind", subject.kind)) if value in (None, "")]
    return " and ".join(missing) + (" are" if len(missing) > 1 else " is")


_R = ROUTER_SOURCE
_G = gie.GIE_SOURCE
_G_LOADER = _G + "pkg/epp/config/loader/configloader.go"
_G_DEFAULTS = _G + "pkg/epp/config/loader/defaults.go"
_G_VALIDATION = _G + "pkg/epp/config/loader/validation.go"
_G_PREFIX = _G + "pkg/epp/framework/plugins/scheduling/scorer/prefix/plugin.go"
_SEMANTICS = SEMANTICS[DEFAULT_ROUTER_VERSION]
UNDECLARED = "{where} references plugin {plugin}, which is not declared in plugins."
NOT_DECLARED_BY = "{reader} {verb} {field} {ref}, which is not declared in plugins."

ALL_RULES = (
    # -- the top level as the strict decoder reads it (a schema finding of CONFIG_SCHEMA) ------------------------------
    # GIE: apiVersion llm-d.ai/v1alpha1 is the first thing its decoder refuses; nothing else of such a config is read.
    _gie("gie-llm-d-api-version", "header", REFUSED,
         "apiVersion {api_version} is llm-d-router's; GIE {version} registers EndpointPickerConfig only under {gie_api}, so "
         "it cannot decode this config and does not start (check it with router_impl llm-d).",
         lambda c, s: s.api_version == API_VERSION, gie.REGISTER, halt=True),
    _rule("top-level-unknown-field", "top-level field", REFUSED,
          "{where} is not a field of {router} {version}'s EndpointPickerConfig{note}; the EPP decodes the config strictly "
          "and does not start.", lambda c, s: s.finding == "unknown", final=True,
          fields=lambda c, s: {"note": " (%s)" % c.top_level_notes[s.path] if s.path in c.top_level_notes else ""},
          gie=_G_LOADER),
    _rule("top-level-deprecated-field", "top-level field", WARNING, "{where} {message}.",
          lambda c, s: s.finding == "deprecated", final=True, deprecation=True),
    _rule("top-level-field", "top-level field", REFUSED, "{where} {message}.", lambda c, s: True, final=True, gie=_G_LOADER),
    # -- apiVersion, kind, feature gates -------------------------------------------------------------------------------
    _rule("deprecated-api-version", "header", WARNING, "apiVersion {api_version} is deprecated; use {api}.",
          lambda c, s: s.api_version in DEPRECATED_API_VERSIONS, deprecation=True),
    _rule("api-version", "header", REFUSED, "apiVersion is {api_version_shown} but the router accepts {api}.",
          lambda c, s: s.api_version not in DEPRECATED_API_VERSIONS + (None, "", API_VERSION)),
    _rule("kind", "header", REFUSED, "kind is {kind_shown} but must be {wanted_kind}.", lambda c, s: s.kind not in (None, "", KIND)),
    # The strict decoder decodes into an EndpointPickerConfig (runtime.DecodeInto, decodeRawConfig): a missing or empty
    # apiVersion or kind takes the first group version the scheme registers it under, llm-d.ai/v1alpha1 (configapi.Install
    # runs before the deprecated one is added, init). Run with apimachinery v0.35.6, llm-d-router v0.9.0's: it decodes.
    _rule("defaulted-header", "header", WARNING,
          "{missing} not set: {router} {version} decodes the config as {api} EndpointPickerConfig all the same and "
          "starts; set both so that every reader of the config (GIE's EPP, other tools) takes it the same way.",
          lambda c, s: s.api_version in (None, "") or s.kind in (None, ""), source=_R + "pkg/epp/config/loader/configloader.go",
          fields=lambda c, s: {"missing": _missing_header(s)}),
    # GIE: the decoder defaults an absent (or empty) apiVersion and kind to the only ones registered (run: it starts).
    _gie("gie-api-version", "header", REFUSED,
         "apiVersion is {api_version_shown} but GIE {version} registers EndpointPickerConfig only under {gie_api}, so it "
         "cannot decode the config and does not start.", lambda c, s: s.api_version not in (None, "", gie.API_VERSION), gie.REGISTER),
    _gie("gie-kind", "header", REFUSED, "kind is {kind_shown} but must be {wanted_kind}; GIE {version} does not start.",
         lambda c, s: s.kind not in (None, "", KIND), gie.REGISTER),
    _rule("unknown-feature-gate", "feature gate", REFUSED,
          "Feature gate {gate} is not registered in {router} {version} (known: {known}); the EPP does not start.",
          lambda c, s: isinstance(s.gate, str) and s.gate not in c.gates, source=_R + "cmd/epp/runner/runner.go",
          gie=_G_VALIDATION),
    # -- the declared plugins ------------------------------------------------------------------------------------------
    _behaviour("no-plugins", "plugin list", lambda c, s: s.plugins is None or s.plugins == []),
    _rule("plugin-without-type", "plugin", REFUSED, "plugins[{index}] has no type.", lambda c, s: not s.typed, final=True,
          gie=_G_LOADER),
    _rule("duplicate-plugin-name", "plugin", REFUSED, "Plugin name {name_text} is declared twice; give one of them another name.",
          lambda c, s: s.duplicate, final=True, gie=_G_LOADER),
    _rule("unregistered-plugin-type", "plugin", REFUSED,
          "Plugin type {ptype_text} is not registered in {router} {version}{why}, so the EPP does not start{hint}.",
          lambda c, s: s.spec is None, source=_R + "cmd/epp/runner/runner.go", final=True, gie=gie.RUNNER),
    _rule("deprecated-plugin-type", "plugin", WARNING, "Plugin type {ptype} is deprecated; use {replacement}.",
          lambda c, s: s.spec["deprecated"], deprecation=True),
    _rule("ignored-parameters", "plugin", WARNING,
          "{label} takes no parameters in {router} {version}; the EPP ignores the ones given.",
          lambda c, s: s.spec["params"] is None and s.params not in (None, {}, []),
          gie=_G + "pkg/epp/framework/plugins/scheduling/scorer/queue.go"),
    _rule("missing-parameters", "plugin", REFUSED, "{label} needs parameters; its factory fails without them.",
          lambda c, s: s.spec["params"] is not None and s.params is None and s.spec["requires_params"], gie=_G_LOADER),
    _rule("parameters-not-a-mapping", "plugin", REFUSED,
          "{label} has parameters that are {params_type}, not a mapping; the EPP cannot decode them.",
          lambda c, s: s.spec["params"] is not None and s.params is not None and not is_mapping(s.params), gie=_G_LOADER),
    _rule("flat-parameters", "plugin", WARNING, "{label} uses the deprecated flat parameters; use profiles and deciders.",
          lambda c, s: s.legacy, deprecation=True),
    _behaviour("prefix-block-size", "plugin", lambda c, s: s.ptype == gie.PREFIX_SCORER and _gie_block_size_only(s.params)),
    # GIE's data-layer factories (epp/gie.py): a notification source needs version and kind; the metrics extractor's engines.
    _behaviour("notification-source-without-gvk", "plugin", lambda c, s: bool(gie.notification_source_missing(s.ptype, s.params)),
               fields=lambda c, s: {"missing": gie.notification_source_missing(s.ptype, s.params)}),
    _behaviour("metrics-engine-without-name", "plugin", **gie.engine_rule("metrics-engine-without-name")),
    _behaviour("metrics-engine-reserved-name", "plugin", **gie.engine_rule("metrics-engine-reserved-name")),
    _behaviour("metrics-engine-twice", "plugin", **gie.engine_rule("metrics-engine-twice")),
    _behaviour("metrics-default-engine-undefined", "plugin", **gie.engine_rule("metrics-default-engine-undefined")),
    # -- one field of a plugin's parameters (a schema finding of its PLUGINS entry); the first that fits says it -------
    _rule("unknown-parameter", "parameter", REFUSED,
          "{where} is not a field of {ptype} in llm-d-router {version}; the EPP decodes parameters strictly "
          "(DisallowUnknownFields), so the plugin fails and the EPP does not start.",
          lambda c, s: s.finding == "unknown", final=True),
    _behaviour("ignored-parameter", "parameter", lambda c, s: s.finding == "unknown", final=True),
    _rule("deprecated-parameter", "parameter", WARNING, "{where} {message}.", lambda c, s: s.finding == "deprecated",
          final=True, deprecation=True, gie=_G_PREFIX),
    _rule("parameter-case", "parameter", WARNING, "{where} {message}; write it that way.", lambda c, s: s.finding == "case",
          final=True, gie=_G_PREFIX),
    _behaviour("socket-port-range", "parameter", lambda c, s: s.finding == "range" and s.path == SOCKET_PORT_PATH,
               fields=lambda c, s: {"plugin": s.label, "value": show(c.pod_discovery_port(s.name))}, final=True),
    _behaviour("speculative-ttl-invalid", "parameter",
               lambda c, s: _speculative_ttl(s) and param(c.params_of(s.name), "speculativeIndexing") is True,
               fields=lambda c, s: {"plugin": s.label, "value": show(param(c.params_of(s.name), "speculativeTTL"))}, final=True),
    _behaviour("speculative-ttl-unused", "parameter", lambda c, s: _speculative_ttl(s),
               fields=lambda c, s: {"plugin": s.label, "value": show(param(c.params_of(s.name), "speculativeTTL"))}, final=True),
    _rule("parameter", "parameter", REFUSED, "{where} {message}.", lambda c, s: True, final=True, gie=_G_LOADER),
    # -- scheduling profiles -------------------------------------------------------------------------------------------
    # Run with the real EPPs (llm-d-router v0.9.0, GIE v1.4.0): they start. With no plugin either, no-plugins says it.
    _rule("no-scheduling-profiles", "profile list", WARNING,
          "schedulingProfiles is empty: the EPP builds one profile, default, of every filter, scorer and picker declared "
          "(scorers at weight 1), adds a max-score-picker if none is declared and a single-profile-handler if no handler is; "
          "name the profile to choose its scorers and weights.",
          lambda c, s: not s.profiles and c.order, source=_R + "pkg/epp/config/loader/defaults.go", gie=_G_DEFAULTS),
    _rule("profile-not-a-mapping", "profile", REFUSED, "schedulingProfiles[{index}] is {value_type}, not a mapping.",
          lambda c, s: not s.mapping, final=True, gie=_G_LOADER),
    _rule("profile-without-name", "profile", REFUSED, "schedulingProfiles[{index}] has no name.", lambda c, s: not s.named,
          gie=_G_VALIDATION),
    _rule("duplicate-profile", "profile", REFUSED, "Scheduling profile {profile} is declared twice.", lambda c, s: s.duplicate,
          gie=_G_VALIDATION),
    _rule("profile-entry-without-ref", "profile entry", REFUSED, "Scheduling profile {profile} has an entry without pluginRef.",
          lambda c, s: not s.has_ref, final=True, gie=_G_VALIDATION),
    _rule("undeclared-profile-plugin", "profile entry", REFUSED, UNDECLARED, lambda c, s: not c.declared(s.ref), gie=_G_VALIDATION),
    _rule("weight-not-a-number", "profile entry", REFUSED, "Scheduling profile {profile} gives {ref} the weight {weight_shown}; "
          "weights are numbers.", lambda c, s: s.weight is not None and not is_number(s.weight), gie=_G_LOADER),
    _behaviour("negative-weight", "profile entry", lambda c, s: is_number(s.weight) and s.weight < 0,
               fields=lambda c, s: {"weight": s.weight_shown}),
    _rule("several-pickers", "profile pickers", REFUSED,
          "Scheduling profile {profile} references {count} pickers ({pickers}); the EPP allows one.", lambda c, s: s.count > 1,
          gie=gie.SCHEDULER_PROFILE),
    _rule("several-profile-handlers", "profile handlers", REFUSED,
          "Several profile handlers are declared ({handlers}); the EPP allows one.", lambda c, s: len(s.names) > 1, gie=_G_LOADER),
    _rule("no-profile-handler", "profile handlers", REFUSED,
          "Several scheduling profiles are declared but no profile handler plugin is.", lambda c, s: s.profiles > 1 and not s.names,
          gie=_G_LOADER),
    _rule("single-handler-several-profiles", "profile handlers", REFUSED,
          "single-profile-handler cannot serve several scheduling profiles; use disagg-profile-handler.",
          lambda c, s: s.profiles > 1 and "single-profile-handler" in [c.type_of(name) for name in s.names]),
    _gie("gie-single-handler-several-profiles", "profile handlers", REFUSED,
         "single-profile-handler cannot serve several scheduling profiles, and GIE {version} registers no other profile "
         "handler; declare one profile.",
         lambda c, s: s.profiles > 1 and "single-profile-handler" in [c.type_of(name) for name in s.names], _G_LOADER),
    # -- the data layer ------------------------------------------------------------------------------------------------
    _rule("source-without-ref", "data source", REFUSED, "A {source_word} has no pluginRef.", lambda c, s: not s.has_ref,
          final=True, gie=_G_LOADER),
    _rule("undeclared-source", "data source", REFUSED, UNDECLARED, lambda c, s: not c.declared(s.ref), gie=_G_LOADER),
    _rule("not-a-data-source", "data source", REFUSED, "{source_word} {ref} is a {ref_type}, not a data source.",
          lambda c, s: c.declared(s.ref) and "data-source" not in c.roles(s.ref), gie=_G_LOADER),
    _rule("extractor-without-ref", "extractor", REFUSED, "{source_word} {source} has an extractor without pluginRef.",
          lambda c, s: not s.has_ref, final=True, gie=_G_LOADER),
    _rule("undeclared-extractor", "extractor", REFUSED, UNDECLARED, lambda c, s: not c.declared(s.ref), gie=_G_LOADER),
    _gie("gie-not-an-extractor", "extractor", REFUSED,
         "{source_word} {source} lists extractor {ref}, which is a {ref_type}, not an extractor.",
         lambda c, s: c.declared(s.ref) and "extractor" not in c.roles(s.ref), _G_LOADER),
    _rule("undeclared-discovery", "discovery", REFUSED, UNDECLARED, lambda c, s: s.has_ref and not c.declared(s.ref)),
    _rule("not-a-discovery-plugin", "discovery", REFUSED, "dataLayer discovery {ref} is a {ref_type}, not a discovery plugin.",
          lambda c, s: s.has_ref and c.declared(s.ref) and "discovery" not in c.roles(s.ref)),
    _behaviour("data-layer-without-sources", "data layer", lambda c, s: s.gated and not s.sources),
    _behaviour("metrics-extractor-ungated", "data layer", lambda c, s: not s.gated and s.metrics_extractors,
               fields=lambda c, s: {"source": s.metrics_extractors[0][0], "extractor": s.metrics_extractors[0][1]}),
    _behaviour("flow-control-ungated", "data layer", lambda c, s: not s.flow_gated and is_mapping(c.config.get("flowControl"))),
    # -- request handling: parsers, saturation detectors, flow-control policies ---------------------------------------
    _rule("not-a-parser", "parser", REFUSED, "Parser {ref} is a {ref_type}, not a parser plugin.",
          lambda c, s: c.declared(s.ref) and "parser" not in c.roles(s.ref)),
    _rule("unknown-parser", "parser", REFUSED,
          "Parser {ref} is neither a declared plugin nor a parser type the EPP can add by itself.",
          lambda c, s: not c.declared(s.ref) and "parser" not in as_mapping(c.table.get(s.ref)).get("roles", ())),
    _rule("undeclared-saturation-detector", "saturation detector", REFUSED, UNDECLARED,
          lambda c, s: not c.declared(s.ref) and s.ref != AUTO_SATURATION_DETECTOR, source=_R + "pkg/epp/config/loader/defaults.go"),
    _rule("not-a-saturation-detector", "saturation detector", REFUSED,
          "saturationDetector {ref} is a {ref_type}, not a saturation detector.",
          lambda c, s: c.declared(s.ref) and "saturation-detector" not in c.roles(s.ref)),
    _rule("undeclared-flow-control-policy", "flow-control policy", REFUSED, UNDECLARED,
          lambda c, s: s.gated and s.ref not in AUTO_FLOW_CONTROL and not c.declared(s.ref),
          source=_R + "pkg/epp/config/loader/defaults.go", gie=gie.FLOW_REGISTRY),
    # -- parameters that name another plugin --------------------------------------------------------------------------
    _rule("undeclared-producer", "producer reference", REFUSED, NOT_DECLARED_BY, lambda c, s: not c.declared(s.ref), final=True),
    _rule("producer-of-another-kind", "producer reference", REFUSED, "{reader} reads {field} {ref}, which is a {ref_type}, not {what}.",
          lambda c, s: s.role not in c.roles(s.ref)),
    _rule("undeclared-decider", "decider reference", REFUSED, NOT_DECLARED_BY, lambda c, s: not c.declared(s.ref), final=True),
    _rule("not-a-decider", "decider reference", REFUSED, "{reader} names {field} {ref}, which is a {ref_type}, not a decider.",
          lambda c, s: "decider" not in c.roles(s.ref), final=True),
    _rule("decider-declared-later", "decider reference", REFUSED,
          "{reader} names {field} {ref}, which is declared after it; the EPP instantiates plugins in order, "
          "so declare the decider first.", lambda c, s: c.index_of(s.ref) > s.reader_index),
    # -- a precise producer: its token producer, its scorer, the KV events it subscribes to ---------------------------
    _behaviour("default-token-producer", "precise producer", lambda c, s: not c.token_producers),
    _rule("unread-producer", "precise producer", BROKEN,
          "Producer {name} is declared but no prefix-cache-scorer references it by prefixMatchInfoProducerName.",
          lambda c, s: s.ptype == PRECISE_PRODUCER and s.name not in c.prefix_scorer_sources()),
    _rule("no-kv-events", "precise producer", BROKEN, "Producer {name} subscribes to KV events, but the engines do not publish them.",
          lambda c, s: not c.engine.get("kv_events_enabled", True)),
    _rule("null-indexer-config", "precise producer", REFUSED,
          "Producer {name} sets indexerConfig to null; the EPP then refuses it (indexerConfig is required).",
          lambda c, s: "indexerConfig" in s.raw and s.raw["indexerConfig"] is None),
    _behaviour("kv-events-config-null", "precise producer", lambda c, s: "kvEventsConfig" in s.raw and s.raw["kvEventsConfig"] is None),
    _behaviour("zero-concurrency", "precise producer", lambda c, s: is_int(s.concurrency) and s.concurrency == 0),
    _behaviour("negative-concurrency", "precise producer", lambda c, s: is_int(s.concurrency) and s.concurrency < 0,
               fields=lambda c, s: {"value": s.concurrency}),
    _rule("tokenizers-pool", "precise producer", REFUSED,
          "Producer {name} sets indexerConfig.tokenizersPoolConfig, which the router rejects; configure a token-producer "
          "plugin instead.", lambda c, s: s.ptype == PRECISE_PRODUCER and s.tokenizers_pool is not None),
    _rule("block-size-differs", "precise producer", WARNING,
          "Producer {name} hashes blocks of {block_size} tokens while the engines use --block-size {engine_block_size}; "
          "llm-d-router {version} recomputes block keys from the events' token ids with its own block size "
          "({block_keys_source}), so this is not an error, but prefix matches are counted in blocks of {block_size} tokens.",
          lambda c, s: s.engine_block_size is not None and s.block_size != s.engine_block_size,
          source=_SEMANTICS["block_keys_source"]),
    _rule("hash-seed-differs", "precise producer", WARNING,
          "Producer {name} uses hashSeed {hash_seed!r} while the engines run with PYTHONHASHSEED {engine_hash_seed!r}; "
          "llm-d-router {version} recomputes block keys from the events' token ids ({block_keys_source}), so the seeds "
          "need not match.", lambda c, s: s.engine_hash_seed is not None and s.hash_seed != s.engine_hash_seed,
          source=_SEMANTICS["block_keys_source"]),
    _rule("topic-filter", "precise producer", BROKEN,
          "Producer {name} subscribes with topicFilter {topic_filter!r}, which is not a prefix of the engines' topic {topic!r}.",
          lambda c, s: not _topic_matches(s.topic_filter, s.topic)),
    _rule("engine-type", "precise producer", BROKEN,
          "Producer {name} decodes events as engineType {engine_type} but the engines are {engine_kind}.",
          lambda c, s: c.semantics["engine_type_honoured"] and s.engine_kind is not None and s.engine_type != s.engine_kind),
    _rule("engine-type-ignored", "precise producer", WARNING,
          "Producer {name} {engine_type_use}, but llm-d-router {version} ignores kvEventsConfig.engineType and always "
          "decodes KV events with its vLLM adapter ({engine_type_source}): SGLang events are read only while they keep "
          "vLLM's positional-array layout, and SGLang emits no extra_keys, so salted or multimodal requests never match.",
          lambda c, s: not c.semantics["engine_type_honoured"] and (s.engine_type != DEFAULT_ENGINE_TYPE or s.engine_kind == "sglang"),
          fields=lambda c, s: {"engine_type_use": "sets engineType %s" % s.engine_type if s.engine_type != DEFAULT_ENGINE_TYPE
                               else "routes to SGLang engines"},
          source=_SEMANTICS["engine_type_source"]),
    _behaviour("pod-discovery-null", "precise producer",
               lambda c, s: s.discover_pods and s.pod_discovery is None and not s.zmq_endpoint),
    _rule("socket-port", "precise producer", BROKEN,
          "Producer {name} dials KV events on port {port} but the engines publish on port {engine_port}.",
          lambda c, s: s.discovers and s.engine_port is not None and s.port != s.engine_port),
    _behaviour("no-notification-source", "precise producer",
               lambda c, s: s.discovers and not s.zmq_endpoint and NOTIFICATION_SOURCE not in c.extracting.get(s.name, [])),
    _behaviour("estimating-token-producer", "precise producer's token producer", lambda c, s: c.token_backend(s.token_producer) == "estimate",
               fields=lambda c, s: {"label": c.label(s.token_producer)}),
    # -- token producers -----------------------------------------------------------------------------------------------
    _rule("token-producer-without-model", "token producer", REFUSED,
          "{label} needs modelName with the {backend} backend; its factory fails without it.",
          lambda c, s: s.backend in ("uds", "vllm") and not param(s.params, "modelName")),
    _rule("several-token-backends", "token producer", REFUSED,
          "{label} sets more than one of estimate, vllm and udsTokenizerConfig; its factory accepts one.",
          lambda c, s: s.backends > 1),
    _rule("render-needs-scale-out", "token producer", WARNING,
          "{label} renders prompts at {url}{render_path}, which vLLM 0.32 serves only when started with --enable-scale-out "
          "(403 otherwise), and the engines run without it, so the EPP gets no tokens and precise scoring silently scores "
          "every endpoint 0.",
          lambda c, s: s.backend == "vllm" and c.engine.get("enable_scale_out") is False and s.host not in LOCAL_HOSTS,
          source=_SEMANTICS["render_source"]),
    # -- the scoring mode asked for ------------------------------------------------------------------------------------
    _rule("precise-without-producer", "mode", BROKEN,
          "Mode precise needs a precise-prefix-cache-producer plugin, and none is declared.",
          lambda c, s: c.mode == "precise" and PRECISE_PRODUCER not in c.types()),
    _rule("precise-without-scorer", "mode", BROKEN, "Mode precise needs a prefix-cache-scorer with prefixMatchInfoProducerName.",
          lambda c, s: c.mode == "precise" and PRECISE_LEGACY_SCORER not in c.types() and not any(c.prefix_scorer_sources())),
    _rule("approximate-with-producer", "mode", BROKEN, "Mode approximate must not declare a precise-prefix-cache-producer.",
          lambda c, s: c.mode == "approximate" and PRECISE_PRODUCER in c.types()),
    _rule("approximate-without-load-aware", "mode", BROKEN,
          "Mode approximate needs a load-aware-scorer plugin, and none is declared.",
          lambda c, s: c.mode == "approximate" and "load-aware-scorer" not in c.types()),
    # GIE's approximate mode is its prefix-cache-scorer (it keeps its own index of the prompts it routed).
    _gie("gie-approximate-without-prefix-scorer", "mode", BROKEN,
         "Mode approximate needs a prefix-cache-scorer with a weight above 0 in a scheduling profile, and no profile has one.",
         lambda c, s: c.mode == "approximate" and not c.weighted_prefix_scorer(), _G_PREFIX),
)
RULES = tuple(rule for rule in ALL_RULES if LLM_D in rule.impls)
GIE_RULES = tuple(rule for rule in ALL_RULES if GIE in rule.impls)


def _rules_by_subject(rules):
    grouped = {}
    for rule in rules:
        grouped.setdefault(rule.looks_at, []).append(rule)
    return grouped


RULES_BY_SUBJECT = _rules_by_subject(RULES)
RULES_BY_IMPL = {LLM_D: RULES_BY_SUBJECT, GIE: _rules_by_subject(GIE_RULES)}
