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
:mod:`.gie` (:data:`IMPLS`), and are checked declaratively by :mod:`.schema`; this file holds what relates one part of
the config to another (plugin references, the precise producer and its token producer, data-layer wiring) and to the
engines.

The checks are data: :data:`ALL_RULES` is a table of rules, each naming what it looks at (a kind of subject: the top
level, a declared plugin, a scheduling-profile entry, a precise producer, ...), the condition under which it fires,
the kind of its finding and its sentence (a ``str.format`` template over the subject's fields, ``version`` always
given), the upstream code it was read at where known, and the implementations it applies to (:data:`RULES` holds the
llm-d ones, :data:`GIE_RULES` the GIE ones, each with its GIE citation). A rule whose kind and sentence are facts the
router version was measured to have names its entry of the implementation's ``BEHAVIOUR`` instead. :class:`_Config`
walks a config and yields the subjects in the order the EPP meets them; :func:`_evaluate` applies every rule of the
implementation to each subject. Adding a check is adding one entry to :data:`ALL_RULES` (and, for a new kind of
subject, one ``yield`` in the walk).

Every finding is one sentence that names the plugin or field path at fault, with its kind: refused (the EPP does not
start), broken (it starts, then crashes or never does what the config asks) or a warning. No input, however malformed,
raises.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import copy
import re

try:
    import yaml
except ImportError:  # pragma: no cover - check_epp_text needs it; check_epp_config does not
    yaml = None

from . import gie
from .plugins import (
    BEHAVIOUR, BROKEN, CONFIG_SCHEMA, DEFAULT_CONFIG, DEFAULT_ROUTER_VERSION, FEATURE_GATES, INPUT, PLUGINS, REFUSED,
    REMOVED_OR_LATER, ROUTER_SOURCE, ROUTER_VERSIONS, SEMANTICS, WARNING)
from .schema import show, type_name, validate
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

# Defaults of the precise producer when a field is absent (kvevents.DefaultConfig, kvblock.DefaultTokenProcessorConfig).
DEFAULT_BLOCK_SIZE = 16
DEFAULT_TOPIC_FILTER = wiring.topic_filter("")  # the EPP's default topicFilter: the prefix of the topic form
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


class EppConfigResult(object):
    """Outcome of a check: ``problems`` make it fail; ``deprecations`` and ``warnings`` do not.

    ``findings`` lists every sentence with its kind (``plugins.KINDS``): ``refused`` (the EPP does not start),
    ``broken`` (it starts, then crashes or never does what the config asks), ``warning`` (deprecations included) and
    ``input`` (the check's own arguments are wrong). ``problems`` holds the refused, broken and input sentences.
    ``epp_starts`` is whether the EPP starts with the config: no refused finding (``None`` when the config could not
    be checked against a router version). ``rules`` names the rule of :data:`ALL_RULES` behind each finding, in the same
    order (None for the checks of the arguments); it is not part of :meth:`as_dict`. ``decoded`` is False when the
    text could not be decoded at all (then its one finding says so).
    """

    def __init__(self, router_version=DEFAULT_ROUTER_VERSION, router_impl=DEFAULT_ROUTER_IMPL):
        self.router_version = router_version
        self.router_impl = router_impl
        self.decoded = True
        self.problems = []
        self.deprecations = []
        self.warnings = []
        self.findings = []
        self.rules = []
        self.summary = {}
        self.checked = True

    def add(self, kind, sentence, deprecation=False, rule=None):
        """Record one finding of ``kind`` and file its sentence in problems, deprecations or warnings."""
        self.findings.append({"kind": kind, "sentence": sentence})
        self.rules.append(rule)
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
                "router_impl": self.router_impl, "epp_starts": self.epp_starts, "findings": [dict(finding) for finding in self.findings]}


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


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _speculative_ttl(subject):
    """A parameter finding about the precise producer's speculativeTTL value (a string that is no Go duration)."""
    return subject.finding == "value" and subject.path == "speculativeTTL" and subject.ptype in PRECISE_TYPES


# --- the rules ----------------------------------------------------------------------------------------------------

class Rule(object):
    """One check: what it looks at, when it fires, the kind and sentence of its finding, where that was read.

    ``when(config, subject)`` is the condition (``config`` is the :class:`_Config` being walked, ``subject`` what the
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
          lambda c, s: s.api_version not in DEPRECATED_API_VERSIONS and s.api_version != API_VERSION),
    _rule("kind", "header", REFUSED, "kind is {kind_shown} but must be {wanted_kind}.", lambda c, s: s.kind != KIND),
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
          lambda c, s: s.spec["params"] is not None and s.params is not None and not _is_mapping(s.params), gie=_G_LOADER),
    _rule("flat-parameters", "plugin", WARNING, "{label} uses the deprecated flat parameters; use profiles and deciders.",
          lambda c, s: s.legacy, deprecation=True),
    _behaviour("prefix-block-size", "plugin", lambda c, s: s.ptype == gie.PREFIX_SCORER and _gie_block_size_only(s.params)),
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
               lambda c, s: _speculative_ttl(s) and _param(c.params_of(s.name), "speculativeIndexing") is True,
               fields=lambda c, s: {"plugin": s.label, "value": show(_param(c.params_of(s.name), "speculativeTTL"))}, final=True),
    _behaviour("speculative-ttl-unused", "parameter", lambda c, s: _speculative_ttl(s),
               fields=lambda c, s: {"plugin": s.label, "value": show(_param(c.params_of(s.name), "speculativeTTL"))}, final=True),
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
          "weights are numbers.", lambda c, s: s.weight is not None and not _is_number(s.weight), gie=_G_LOADER),
    _behaviour("negative-weight", "profile entry", lambda c, s: _is_number(s.weight) and s.weight < 0,
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
    _behaviour("flow-control-ungated", "data layer", lambda c, s: not s.flow_gated and _is_mapping(c.config.get("flowControl"))),
    # -- request handling: parsers, saturation detectors, flow-control policies ---------------------------------------
    _rule("not-a-parser", "parser", REFUSED, "Parser {ref} is a {ref_type}, not a parser plugin.",
          lambda c, s: c.declared(s.ref) and "parser" not in c.roles(s.ref)),
    _rule("unknown-parser", "parser", REFUSED,
          "Parser {ref} is neither a declared plugin nor a parser type the EPP can add by itself.",
          lambda c, s: not c.declared(s.ref) and "parser" not in _mapping(c.table.get(s.ref)).get("roles", ())),
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
    _behaviour("zero-concurrency", "precise producer", lambda c, s: _is_int(s.concurrency) and s.concurrency == 0),
    _behaviour("negative-concurrency", "precise producer", lambda c, s: _is_int(s.concurrency) and s.concurrency < 0,
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
          lambda c, s: s.backend in ("uds", "vllm") and not _param(s.params, "modelName")),
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


def _named(value):
    """A reference or name as the EPP uses it: a non-empty string."""
    return isinstance(value, str) and bool(value)


def _gie_block_size_only(params):
    """GIE's prefix-cache-scorer refuses blockSize (characters) set without blockSizeTokens (prefix/plugin.go New)."""
    size, tokens = _param(params, "blockSize"), _param(params, "blockSizeTokens")
    return _is_number(size) and size > 0 and not (_is_number(tokens) and tokens > 0)


def _serious(findings):
    """Schema findings that make a parameter shape wrong (deprecations and case differences do not)."""
    return any(finding.kind not in ("deprecated", "case") for finding in findings)


def _unregistered_note(removed, ptype):
    """``(why, hint)`` of the sentence for a plugin type the version does not register (``removed``: its notes)."""
    why = removed.get(ptype) if _named(ptype) else None
    return (" (%s)" % why, "") if why else ("", "; check its spelling")


def _decider_refs(ptype, params):
    """``(field, plugin name)`` of the deciders a profile handler names (pd-profile-handler has a default one)."""
    if ptype == "pd-profile-handler":
        ref = _param(params, "deciderPluginName")
        return [("deciderPluginName", ref if _named(ref) else "prefix-based-pd-decider")]
    if ptype != "disagg-profile-handler":
        return []
    deciders = _mapping(_param(params, "deciders"))
    pairs = [("deciders.prefill", _param(deciders, "prefill")), ("deciders.encode", _param(deciders, "encode"))]
    pairs += [(field, _param(params, field)) for field in ("prefillDeciderPluginName", "deciderPluginName", "encodeDeciderPluginName")]
    return [(field, ref) for field, ref in pairs if _named(ref)]


def _block_size(tpc):
    tokens, old = _param(tpc, "blockSizeTokens"), _param(tpc, "blockSize")
    for size in (tokens, old):
        if _is_int(size) and size > 0:
            return size
    return DEFAULT_BLOCK_SIZE


def _text_or(value, default):
    return value if isinstance(value, str) and value else default


def _nested_raw(params, *path):
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
            ptype = plugin.get("type") if _is_mapping(plugin) else None
            if not _named(ptype):
                continue
            name = plugin.get("name") if _named(plugin.get("name")) else ptype
            if name in self.by_name:
                self.duplicates.add(index)
                continue
            params = plugin.get("parameters")
            self.by_name[name] = (ptype, params if _is_mapping(params) else {}, index)
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
        return [_param(self.params_of(name), "prefixMatchInfoProducerName") for name in self.order
                if self.type_of(name) == PREFIX_SCORER]

    def weighted_prefix_scorer(self):
        """Whether a declared prefix-cache-scorer scores in a scheduling profile with a weight above 0 (without profiles
        the EPP's profile default holds every declared scorer at weight 1; an absent weight is 1)."""
        scorers = [name for name in self.order if self.type_of(name) == PREFIX_SCORER]
        profiles = self.config.get("schedulingProfiles")
        if not profiles:
            return bool(scorers)
        for profile in _list(profiles):
            for entry in map(_mapping, _list(_mapping(profile).get("plugins"))):
                weight = 1 if entry.get("weight") is None else entry.get("weight")
                if entry.get("pluginRef") in scorers and _is_number(weight) and weight > 0:
                    return True
        return False

    def pod_discovery_port(self, name):
        kv_events = _mapping(_param(self.params_of(name), "kvEventsConfig"))
        return _param(_mapping(_param(kv_events, "podDiscoveryConfig")), "socketPort")

    def token_backend(self, name):
        params = self.params_of(name)
        if _is_mapping(_param(params, "udsTokenizerConfig")) and _param(_param(params, "udsTokenizerConfig"), "socketFile"):
            return "uds"
        if _param(params, "vllm") is not None or _param(params, "modelName"):
            return "vllm"
        return "estimate"

    def raw_params(self, name):
        """The ``parameters`` mapping of a declared plugin as written, nulls included."""
        return _mapping(self.config["plugins"][self.index_of(name)].get("parameters"))

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
        for gate in _list(self.config.get("featureGates")):
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
        plugin = _mapping(plugin)
        ptype = plugin.get("type")
        typed = _named(ptype)
        name = (plugin.get("name") if _named(plugin.get("name")) else ptype) if typed else None
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
        if not subject.typed or subject.duplicate or spec is None or spec["params"] is None or not _is_mapping(params):
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
            if not _is_mapping(profile):
                yield "profile", _Subject(index=index, mapping=False, value_type=type_name(profile))
                continue
            named = _named(profile.get("name"))
            name = profile.get("name") if named else "schedulingProfiles[%d]" % index
            yield "profile", _Subject(index=index, mapping=True, named=named, profile=name, duplicate=named and name in seen)
            seen.add(name)
            entries = [self._profile_entry(name, entry) for entry in _list(profile.get("plugins"))]
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
        ref = _mapping(entry).get("pluginRef")
        weight = _mapping(entry).get("weight") if _named(ref) else None
        return _Subject(profile=profile, where="Scheduling profile %s" % profile, has_ref=_named(ref), ref=ref, plugin=_text(ref),
                        weight=weight, weight_shown=show(weight))

    def _data_layer(self):
        data_layer = _mapping(self.config.get(self.data_key))
        for source in _list(data_layer.get("sources")):
            ref = source.get("pluginRef") if _is_mapping(source) else None
            yield "data source", _Subject(has_ref=_named(ref), ref=ref, plugin=_text(ref), where=self.source_word,
                                          ref_type=self.type_of(ref))
            if not _named(ref):
                continue
            for extractor in _list(source.get("extractors")):
                extractor_ref = extractor.get("pluginRef") if _is_mapping(extractor) else None
                yield "extractor", _Subject(source=ref, has_ref=_named(extractor_ref), ref=extractor_ref, plugin=_text(extractor_ref),
                                            where="%s %s extractor" % (self.source_word, ref), ref_type=self.type_of(extractor_ref))
                if _named(extractor_ref) and self.declared(extractor_ref):
                    self.extracting.setdefault(extractor_ref, []).append(self.type_of(ref) or "")
        discovery = _mapping(data_layer.get("discovery")).get("pluginRef")
        yield "discovery", _Subject(has_ref=_named(discovery), ref=discovery, plugin=_text(discovery), where="dataLayer discovery",
                                    ref_type=self.type_of(discovery))

    def _gie_layers(self):
        """GIE's feature-gated layers: the data layer (data.sources and its metrics extractor) and flow control."""
        gates = _list(self.config.get("featureGates"))
        sources = _list(_mapping(self.config.get("data")).get("sources"))
        extractors = [(_mapping(source).get("pluginRef"), _mapping(extractor).get("pluginRef")) for source in sources
                      for extractor in _list(_mapping(source).get("extractors"))]
        metrics = [(_text(src), _text(ref)) for src, ref in extractors if self.type_of(ref) == gie.METRICS_EXTRACTOR]
        yield "data layer", _Subject(gated="dataLayer" in gates, sources=sources, metrics_extractors=metrics,
                                     flow_gated="flowControl" in gates)

    def _request_handling(self):
        config = self.config
        parsers = [p.get("pluginRef") for p in _list(_mapping(config.get("requestHandler")).get("parsers")) if _is_mapping(p)]
        parsers.append(_mapping(config.get("parser")).get("pluginRef"))
        for ref in filter(_named, parsers):
            yield "parser", _Subject(ref=ref, ref_type=self.type_of(ref))
        flow = _mapping(config.get("flowControl"))
        for holder in (flow, config):
            ref = _mapping(holder.get("saturationDetector")).get("pluginRef")
            if _named(ref):
                yield "saturation detector", _Subject(ref=ref, plugin=_text(ref), where="saturationDetector", ref_type=self.type_of(ref))
        gated = "flowControl" in _list(config.get("featureGates"))
        bands = [flow.get("defaultPriorityBand"), flow.get("defaultNegativePriorityBand")] + _list(flow.get("priorityBands"))
        refs = [("flowControl.usageLimitPolicyPluginRef", flow.get("usageLimitPolicyPluginRef"))]
        for band in map(_mapping, bands):
            refs += [("A priority band's fairnessPolicyRef", band.get("fairnessPolicyRef")),
                     ("A priority band's orderingPolicyRef", band.get("orderingPolicyRef"))]
        for where, ref in refs:
            if _named(ref):
                yield "flow-control policy", _Subject(gated=gated, ref=ref, plugin=_text(ref), where=where)

    def _references(self):
        for name in self.order:
            ptype, params, index = self.by_name[name]
            refs = PRODUCER_REFERENCES + ((MM_PRODUCER_REFERENCE,) if "scorer" in self.roles(name) else ())
            reader = "Scorer %s" % name if ptype == PREFIX_SCORER else self.label(name)
            for field, role, what in refs:
                ref = _param(params, field)
                if _named(ref):
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
        kv_events = _mapping(_param(params, "kvEventsConfig"))
        tokens = _mapping(_param(params, "tokenProcessorConfig"))
        discover = _param(kv_events, "discoverPods")
        pod_discovery = _nested_raw(raw, "kvEventsConfig", "podDiscoveryConfig")
        port = _param(_mapping(pod_discovery), "socketPort")
        engine_seed = engine.get("hash_seed")
        subject = _Subject(
            name=name, ptype=self.type_of(name), raw=raw, concurrency=_param(kv_events, "concurrency"),
            tokenizers_pool=_param(_mapping(_param(params, "indexerConfig")), "tokenizersPoolConfig"),
            block_size=_block_size(tokens), engine_block_size=engine.get("block_size"),
            hash_seed=_text_or(_param(tokens, "hashSeed"), ""), engine_hash_seed=None if engine_seed is None else str(engine_seed),
            topic_filter=_param(kv_events, "topicFilter"), topic=engine.get("topic"),
            engine_type=_text_or(_param(kv_events, "engineType"), DEFAULT_ENGINE_TYPE), engine_kind=engine.get("engine_type"),
            discover_pods=discover if isinstance(discover, bool) else True, pod_discovery=pod_discovery,
            zmq_endpoint=_param(kv_events, "zmqEndpoint"), port=port if _is_int(port) and port else DEFAULT_SOCKET_PORT,
            engine_port=engine.get("kv_events_port"), block_keys_source=self.semantics["block_keys_source"],
            engine_type_source=self.semantics["engine_type_source"])
        subject.topic_filter = subject.topic_filter if isinstance(subject.topic_filter, str) else DEFAULT_TOPIC_FILTER
        subject.discovers = subject.discover_pods and pod_discovery is not None
        return subject

    def _token_producers(self):
        for name in self.token_producers:
            params = self.params_of(name)
            backend = self.token_backend(name)
            url = _text_or(_param(_mapping(_param(params, "vllm")), "url"), DEFAULT_RENDER_URL)
            backends = [_param(params, "estimate") is not None, backend == "uds",
                        _param(params, "vllm") is not None or bool(_param(params, "modelName"))]
            yield "token producer", _Subject(label=self.label(name), params=params, backend=backend, backends=sum(backends),
                                             url=url.rstrip("/"), render_path=self.semantics["render_path"],
                                             host=url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0])


# --- the check's own arguments -------------------------------------------------------------------------------------

def _engine_problem(key, value):
    """The sentence for one engine setting that does not fit ENGINE_OPTIONS (None when it does)."""
    entry = ENGINE_OPTIONS[key]
    kind = entry["type"]
    fits = {"int": _is_int(value), "bool": isinstance(value, bool), "str": isinstance(value, str)}[kind]
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
    if not _is_mapping(engine):
        res.add(INPUT, "engine must be a mapping of the engines' settings (got %s)." % type_name(engine))
        return {}
    clean = {}
    for key, value in engine.items():
        if key not in ENGINE_OPTIONS:
            res.add(INPUT, "engine.%s is not an engine setting this check knows (%s)." % (_text(key), ", ".join(sorted(ENGINE_OPTIONS))))
            continue
        if key in NUMERIC_TEXT and _is_number(value):
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
    if not _is_mapping(config):
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
