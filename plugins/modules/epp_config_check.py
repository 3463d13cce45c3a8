#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

DOCUMENTATION = r"""
module: epp_config_check
short_description: Check an EndpointPickerConfig (llm-d router or Gateway API Inference Extension EPP) against the engines
version_added: 0.1.0
description:
  - Checks an C(EndpointPickerConfig) without a cluster and says what the EPP it is meant for (O(router_impl), the llm-d
    router's EPP with C(llm-d.ai/v1alpha1) or the Gateway API Inference Extension's own EPP with
    C(inference.networking.x-k8s.io/v1alpha1)) at the pinned version (O(router_version)) will do with it.
    RV(epp_starts) says whether that EPP starts with the config, and each finding in RV(findings) has one of three kinds.
  - C(refused) - the EPP does not start (it returns an error or panics while loading the config); the sentence gives the
    EPP's own reason. C(broken) - the EPP starts, then crashes or never does what the config asks; the sentence says what
    happens and when (for example it panics with an integer divide by zero in the KV-event pool on the first event, never
    matches an engine block, or never subscribes to an engine). C(warning) - the EPP starts and works, but the finding is
    worth knowing (deprecations are warnings too). The module fails on C(refused) and C(broken) findings only.
  - Findings about the module's own arguments (O(engine), O(mode), O(router_version)) have the kind C(input) and fail the
    module too.
  - With O(router_impl=gie) the config is judged by the Gateway API Inference Extension EPP v1.4.0, read at
    kubernetes-sigs/gateway-api-inference-extension v1.4.0 and run here on each behaviour. It knows its 20 plugin types (no
    KV-event consumer, no tokenizer; C(precise-prefix-cache-producer), C(token-producer), C(load-aware-scorer),
    C(decode-filter) and the other llm-d-router types are not registered, so the EPP does not start), its one apiVersion
    (a config with apiVersion C(llm-d.ai/v1alpha1) is refused in one sentence), the top level decoded strictly (C(data),
    not C(dataLayer)) but plugin C(parameters) decoded leniently (an unknown field is ignored, a warning), its feature
    gates (C(dataLayer) needs data sources; its metrics extractor needs that gate) and the defaults it injects (profile,
    picker, profile handler). O(mode=precise) is an input error with GIE; O(mode=approximate) needs a
    C(prefix-cache-scorer) with a weight above 0 in a profile.
  - What the EPP does with configs it decodes was read at llm-d-router v0.9.0 and github.com/llm-d/llm-d-kv-cache v0.9.0
    and measured with the real EPP v0.9.0, for example an empty file (the EPP logs that it uses its default
    configuration and starts; a warning), a negative scorer weight (used as it is; a warning),
    C(kvEventsConfig.concurrency=0) (starts, then panics on the first KV event; broken), a precise producer without a
    C(token-producer) (the EPP adds the estimating one itself, which never matches an engine block; broken) and an
    unparseable C(speculativeTTL) while C(speculativeIndexing) is off (never parsed; a warning).
  - Every plugin type must be one that router version registers, and every field of its C(parameters), nested ones
    included, one that its Go structs define with the right JSON type; the EPP decodes parameters strictly
    (C(DisallowUnknownFields)), so an unknown field (for example C(kvEventsConfig.podDiscoveryConfig.replaySocketPort),
    which first appears in llm-d-router v0.10.0) stops the EPP from starting and is reported as C(refused), naming
    the plugin and the field path.
  - Every C(pluginRef) in scheduling profiles and data-layer sources must name a declared plugin; a C(prefix-cache-scorer)
    that names a C(prefixMatchInfoProducerName) must reference a declared prefix-cache producer; deciders named by a
    profile handler must be declared before it.
  - A C(precise-prefix-cache-producer) needs a C(token-producer) with a real tokenizer backend; its topic filter and
    pod-discovery port must match the engines (O(engine)); in pod-discovery mode an C(endpoint-notification-source) data
    source must list it as an extractor. Each of these is C(broken) when wrong, as the EPP starts but never matches an
    engine block or never receives an engine's events.
  - At llm-d-router v0.9.0 a block size or hash seed that differs from the engines' is a warning, not a problem (the EPP
    recomputes block keys from the token ids in the events, C(preciseprefixcache/README.md)), and
    C(kvEventsConfig.engineType) is accepted but ignored (the producer always decodes with the vLLM adapter), which the
    module warns about for SGLang.
  - The C(token-producer)'s vLLM backend calls C(/v1/completions/render), which vLLM 0.32 serves only when started with
    C(--enable-scale-out); with O(engine.enable_scale_out=false) and a render URL that is not the EPP pod's own sidecar
    the module warns.
  - Deprecated plugin names and fields (C(precise-prefix-cache-scorer), C(tokenizer), C(blockSize), the old apiVersion)
    are reported as deprecations, or as failures with O(fail_on_deprecations=true).
  - Text that is not valid YAML is what the EPP cannot decode; it is reported as C(refused) (RV(epp_starts=false)).
  - Each problem is one sentence; wrongly typed input of any shape is reported, never raised. The module never changes
    anything.
author:
  - inference_cache.substrate contributors (@inference-cache)
extends_documentation_fragment:
  - inference_cache.substrate._attributes
  - inference_cache.substrate._attributes.CHECK
options:
  config:
    description:
      - The EndpointPickerConfig as a mapping, or as YAML text. An empty text is what the EPP replaces with its default
        configuration (a warning).
      - Exactly one of O(config) and O(path) is required.
    type: raw
  path:
    description:
      - A file holding the EndpointPickerConfig as YAML (for example one the user wrote). An empty file is what the EPP
        replaces with its default configuration (a warning).
      - The file is read on the host the task runs on (the target), with PyYAML there. For a file on the controller, pass
        its text in O(config) instead (an P(ansible.builtin.file#lookup) lookup), or run the task with C(delegate_to)
        localhost.
    type: path
  engine:
    description:
      - What the engines run. Checks whose engine value is omitted are skipped.
    type: dict
    default: {}
    suboptions:
      block_size:
        description: The engines' C(--block-size) (SGLang C(--page-size)), 1 to 1048576.
        type: int
      hash_seed:
        description: The engines' C(PYTHONHASHSEED).
        type: str
      topic:
        description:
          - The engines' KV-event topic, placeholders allowed (for example kv@$(POD_IP):8000@Qwen/Qwen3-0.6B, where the pod's IP replaces $(POD_IP)).
          - The producer's C(topicFilter) must be a prefix of it (ZMQ subscriptions match byte prefixes).
        type: str
      kv_events_port:
        description: The port the engines bind their KV-event publisher on, 1 to 65535.
        type: int
      engine_type:
        description: The engine kind, which selects the router's event decoder.
        type: str
        choices: [vllm, sglang]
      kv_events_enabled:
        description: Whether the engines publish KV events at all.
        type: bool
        default: true
      enable_scale_out:
        description:
          - Whether the vLLM engines run with C(--enable-scale-out), without which vLLM 0.32 answers
            C(/v1/completions/render) with 403. Omitted means unknown, and that check is skipped.
        type: bool
  mode:
    description:
      - When set, also check that the config implements this scoring mode.
      - C(precise) needs O(router_impl=llm-d) (the Gateway API Inference Extension EPP reads no KV events).
    type: str
    choices: [precise, approximate]
  fail_on_deprecations:
    description: Treat deprecated names as problems.
    type: bool
    default: false
  router_impl:
    description:
      - The EPP the config is meant for. C(llm-d) is the llm-d router's EPP (precise or approximate prefix-cache scoring);
        C(gie) is the Gateway API Inference Extension's own EPP (C(sigs.k8s.io/gateway-api-inference-extension) C(cmd/epp),
        approximate prefix-cache scoring only).
    type: str
    default: llm-d
    choices: [llm-d, gie]
  router_version:
    description:
      - The version of O(router_impl) whose plugin types and parameter fields the config must match.
      - Defaults to the version the collection pins for O(router_impl), C(v0.9.0) for C(llm-d) and C(v1.4.0) for C(gie);
        a version of the other implementation is an input error.
    type: str
    choices: [v0.9.0, v1.4.0]
requirements:
  - PyYAML on the host the task runs on (only for O(path) or YAML text)
seealso:
  - module: inference_cache.substrate.kv_events_check
  - name: llm-d router EndpointPickerConfig types (v0.9.0)
    description: apix/config/v1alpha1/endpointpickerconfig_types.go and the plugin factories in pkg/epp/framework/plugins
    link: https://github.com/llm-d/llm-d-router/tree/v0.9.0
  - name: Gateway API Inference Extension EPP (v1.4.0)
    description: cmd/epp/runner/runner.go, apix/config/v1alpha1 and pkg/epp/config/loader
    link: https://github.com/kubernetes-sigs/gateway-api-inference-extension/tree/v1.4.0
"""

EXAMPLES = r"""
- name: Check the EPP config the router role rendered
  inference_cache.substrate.epp_config_check:
    path: /tmp/render/router/epp-config.yaml
    mode: precise
    engine:
      block_size: 32
      hash_seed: "42"
      topic: "kv@$(POD_IP):8000@Qwen/Qwen3-0.6B"
      kv_events_port: 5557
      engine_type: vllm

- name: Check a hand-written config against the pinned router and the engines' render endpoint
  inference_cache.substrate.epp_config_check:
    path: files/my-epp.yaml
    router_version: v0.9.0
    engine:
      engine_type: vllm
      enable_scale_out: false

- name: Check the config the router role rendered for the Gateway API Inference Extension EPP
  inference_cache.substrate.epp_config_check:
    path: /tmp/render/router/epp-config.yaml
    router_impl: gie
    mode: approximate

- name: Check an inline config and keep going when it is wrong
  inference_cache.substrate.epp_config_check:
    config: "{{ lookup('ansible.builtin.file', 'my-epp.yaml') }}"
  register: epp
  ignore_errors: true
"""

RETURN = r"""
epp_starts:
  description:
    - Whether the pinned EPP (O(router_version)) starts with this config, that is, no finding is C(refused).
    - A config can start and still be C(broken); the module fails then too.
  returned: always
  type: bool
  sample: true
findings:
  description:
    - Every finding, in the order found, with its kind.
    - C(refused) (the EPP does not start, with its own reason), C(broken) (it starts, then crashes or never does what
      the config asks, and when), C(warning) (it starts and works; deprecations included) or C(input) (this module's
      own arguments are wrong).
  returned: always
  type: list
  elements: dict
  contains:
    kind:
      description: C(refused), C(broken), C(warning) or C(input).
      type: str
    sentence:
      description: The finding, one sentence.
      type: str
  sample:
    - kind: broken
      sentence: >-
        Producer precise-prefix-cache-producer sets kvEventsConfig.concurrency to 0; llm-d-router v0.9.0 starts, then panics
        with an integer divide by zero in the KV-event pool (kvevents.(*Pool).AddTask) on the first KV event.
problems:
  description:
    - One sentence per C(refused), C(broken) or C(input) finding (and per deprecation with O(fail_on_deprecations=true));
      the module fails when this is not empty.
  returned: always
  type: list
  elements: str
  sample:
    - >-
      Plugin precise-prefix-cache-producer parameter kvEventsConfig.podDiscoveryConfig.replaySocketPort is not a field of
      precise-prefix-cache-producer in llm-d-router v0.9.0; the EPP decodes parameters strictly (DisallowUnknownFields),
      so the plugin fails and the EPP does not start.
deprecations_found:
  description:
    - One sentence per deprecated name or field found; each is also emitted as an Ansible warning unless
      O(fail_on_deprecations=true) makes it a problem.
    - Named so because ansible-core reserves C(deprecations) in a module result.
  returned: always
  type: list
  elements: str
warnings_found:
  description:
    - One sentence per finding that does not stop the EPP but is worth knowing (a block size or hash seed unlike the
      engines', an ignored C(engineType), parameters a plugin ignores, a render endpoint the engines do not serve).
    - Each is also emitted as an Ansible warning.
  returned: always
  type: list
  elements: str
  sample:
    - >-
      Producer precise-prefix-cache-producer uses hashSeed '7' while the engines run with PYTHONHASHSEED '42'; llm-d-router
      v0.9.0 recomputes block keys from the events' token ids (...), so the seeds need not match.
router_version:
  description: The router version the config was checked against.
  returned: always
  type: str
  sample: v0.9.0
router_impl:
  description: The router implementation the config was checked against, C(llm-d) or C(gie).
  returned: always
  type: str
  sample: llm-d
summary:
  description: The declared plugin names and, per precise producer, the values it was checked with.
  returned: always
  type: dict
"""

import traceback

from ansible.module_utils.basic import missing_required_lib

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.errors import CheckError
from ansible_collections.inference_cache.substrate.plugins.module_utils.common.module import run_module
from ansible_collections.inference_cache.substrate.plugins.module_utils.common.options import argument_spec
from ansible_collections.inference_cache.substrate.plugins.module_utils.epp.config import (
    DEFAULT_ROUTER_IMPL, ENGINE_OPTIONS, IMPLS, check_epp_config, check_epp_text)

try:
    import yaml
    YAML_IMPORT_ERROR = None
except ImportError:  # pragma: no cover
    yaml = None
    YAML_IMPORT_ERROR = traceback.format_exc()

# The option table (common/options.py). The engine facts are checked by check_epp_config itself (as findings of the
# kind input), so their suboptions are the plain argument spec of its ENGINE_OPTIONS table.
OPTIONS = dict(
    config=dict(type="raw"),
    path=dict(type="path"),
    engine=dict(type="dict", default={}, options=argument_spec(ENGINE_OPTIONS)),
    mode=dict(type="str", choices=["precise", "approximate"]),
    fail_on_deprecations=dict(type="bool", default=False),
    router_impl=dict(type="str", default=DEFAULT_ROUTER_IMPL, choices=sorted(IMPLS, reverse=True)),
    # The union of the implementations' versions; check_epp_config refuses one of the other implementation.
    router_version=dict(type="str", choices=[v for impl in sorted(IMPLS, reverse=True) for v in IMPLS[impl]["versions"]]),
)


def _load(params, module):
    """``(config, text)``: a mapping (or any other non-text value) as it is with no text, or the YAML text of the
    option or the file, which the check decodes as the EPP would."""
    config, path = params["config"], params["path"]
    if path is None and not isinstance(config, str):
        return config, None
    if yaml is None:
        module.fail_json(msg=missing_required_lib("PyYAML"), exception=YAML_IMPORT_ERROR)
    if path is None:
        return None, config
    try:
        with open(path, "r") as handle:
            return None, handle.read()
    except (IOError, OSError, ValueError) as exc:
        raise CheckError("Cannot read the EndpointPickerConfig file %s: %s." % (path, exc))


def _check(params, module):
    engine = dict((k, v) for k, v in (params["engine"] or {}).items() if v is not None)
    config, text = _load(params, module)
    options = dict(engine=engine, mode=params["mode"], router_version=params["router_version"], router_impl=params["router_impl"])
    result = check_epp_text(text, **options) if text is not None else check_epp_config(config, **options)
    problems = list(result.problems)
    if params["fail_on_deprecations"]:
        problems.extend(result.deprecations)
    else:
        for sentence in result.deprecations:
            module.warn(sentence)
    for sentence in result.warnings:
        module.warn(sentence)
    out = dict(epp_starts=result.epp_starts, findings=result.findings, problems=problems, deprecations_found=result.deprecations,
               warnings_found=result.warnings, router_version=result.router_version, router_impl=result.router_impl,
               summary=result.summary)
    if not result.decoded:
        raise CheckError(problems[0], out)  # the one thing the EPP says about text it cannot decode
    if problems:
        raise CheckError("The EndpointPickerConfig has %d problem(s): %s" % (len(problems), " ".join(problems)), out)
    return out


def main():
    run_module(OPTIONS, _check, mutually_exclusive=[("config", "path")], required_one_of=[("config", "path")])


if __name__ == "__main__":
    main()
