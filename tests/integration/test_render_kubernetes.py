# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Render every Kubernetes profile and mode (no cluster), validate the manifests offline, check the policies.

One ansible-playbook run renders all cases in parallel (playbooks/render.yml, one inventory host per case,
run with -v so the secret test sees the verbose output); one more run renders the cases that must fail.

Schema validation: kubernetes-validate (strict: unknown fields are errors) for every Kubernetes minor version
in K8S_VERSIONS (1.29-1.37; the pinned kind node is 1.33). Kinds without an upstream schema are checked
structurally here instead, for these reasons:
* kind ``Cluster`` (kind.x-k8s.io/v1alpha4): a kind CLI config, never sent to an API server;
* ``EndpointPickerConfig`` (llm-d.ai/v1alpha1): a file the EPP reads, checked by the collection's own
  epp_config_check logic against the engines it routes to;
* Helm values of the llm-d-router-gateway and nvidia-device-plugin charts: checked for the keys the charts read;
* ``InferencePool`` objects are created by the router chart at install time and are not rendered here.
"""

from __future__ import absolute_import, division, print_function

import json
import os
import re
import sys

import pytest
import yaml

kubernetes_validate = pytest.importorskip("kubernetes_validate")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _k8s_render as R  # noqa: E402  pylint: disable=wrong-import-position

from ansible_collections.inference_cache.substrate.plugins.module_utils.epp import config as _epp_config  # noqa: E402  pylint: disable=wrong-import-position

K8S_VERSIONS = ["1.%d.0" % minor for minor in range(29, 38)]
DIGEST_RE = re.compile(r"^[^\s@]+@sha256:[0-9a-f]{64}$")


@pytest.fixture(scope="module")
def rendered(rendered_cases):
    return rendered_cases   # conftest.py: every case rendered once per session, with -v


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("refused"))
    cases = dict((name, host) for name, (host, _msg) in R.NEGATIVE.items())
    returncode, output, out = R.run_render(tmp, cases, callback="oneline")
    assert returncode != 0, output[-4000:]
    return {"output": output, "out": out}


def all_cases():
    return sorted(R.CASES)


# -- schema validation -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_manifests_validate_against_kubernetes_schemas(rendered, version):
    checked = 0
    for name, case in sorted(rendered["cases"].items()):
        for doc in case["docs"]:
            if doc["kind"] == "PodMonitor":
                # No upstream schema here: the kwok cluster's API server validates it against the CRD generated from the
                # Prometheus Operator's API types (test_kwok_roles.py, molecule scenario kwok).
                continue
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail("%s: %s/%s is invalid for Kubernetes %s: %s" % (name, doc["kind"], doc["metadata"]["name"], version, exc))
            checked += 1
    assert checked >= 6 * len(rendered["cases"])


@pytest.mark.parametrize("name", all_cases())
def test_every_case_renders_every_role(rendered, name):
    case = rendered["cases"][name]
    kinds = sorted(set(d["kind"] for d in case["docs"]))
    for kind in ("Namespace", "Deployment", "Service", "NetworkPolicy", "ConfigMap", "Job"):
        assert kind in kinds, "%s rendered no %s (got %s)" % (name, kind, kinds)
    assert case["epp_config"]["kind"] == "EndpointPickerConfig"
    gpu = case["engine"]["profile"] != "vllm_cpu"
    assert ("nvdp_values" in case) == gpu, "the device plugin is rendered exactly for the GPU profiles"


@pytest.mark.parametrize("name", all_cases())
def test_kind_config_structure(rendered, name):
    config = rendered["cases"][name]["kind_config"]
    assert config["kind"] == "Cluster" and config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    assert config["name"] == "inference-cache-substrate"
    plane = config["nodes"][0]
    assert plane["role"] == "control-plane" and DIGEST_RE.match(plane["image"])
    ports = [m["containerPort"] for m in plane["extraPortMappings"]]
    assert 30080 in ports
    assert (30557 in ports) == bool(R.CASES[name].get("kind_cluster_zmq_node_port_enabled")), \
        "the ZMQ NodePort is mapped only when explicitly enabled"
    for mapping in plane["extraPortMappings"]:
        assert mapping["listenAddress"] == "127.0.0.1"


@pytest.mark.parametrize("name", all_cases())
def test_epp_config_matches_the_engines(rendered, name):
    case = rendered["cases"][name]
    kv = case["engine"]["kv_events_config"]
    mode = R.CASES[name]["router_scoring_mode"]
    env = engine_env(case)
    engine = {"block_size": int(arg_after(case["engine"]["args"], "--block-size" if case["engine"]["engine_type"] == "vllm" else "--page-size")),
              "hash_seed": env["PYTHONHASHSEED"], "topic": kv.get("topic"), "engine_type": case["engine"]["engine_type"],
              "kv_events_port": int(kv.get("endpoint", "tcp://*:5557").rsplit(":", 1)[1])}
    result = _epp_config.check_epp_config(case["epp_config"], engine=engine, mode=mode)
    assert result.ok, result.problems
    assert not result.deprecations, result.deprecations
    # The chart gets exactly this config.
    epp = case["router_values"]["router"]["epp"]
    assert yaml.safe_load(epp["pluginsCustomConfig"][epp["pluginsConfigFile"]]) == case["epp_config"]


@pytest.mark.parametrize("name", all_cases())
def test_router_values_use_the_pinned_chart_and_new_keys(rendered, name):
    case = rendered["cases"][name]
    values, release = case["router_values"], case["router_release"]
    pins = yaml.safe_load(open(R.PINS))
    chart = R.CASES[name].get("router_chart", "standalone")
    assert release["chart_ref"] == pins["charts"]["llm_d_router_" + chart]["ref"]
    assert release["chart_version"] == pins["charts"]["llm_d_router_" + chart]["version"] == "v0.9.0"
    assert not set(values) & {"inferenceExtension", "inferencePool", "experimentalHttpRoute", "inferenceObjectives"}, \
        "legacy top-level keys make the chart refuse to install"
    epp = values["router"]["epp"]
    assert epp["flags"]["secure-serving"] is True, "secure serving is stated explicitly"
    assert epp["resources"]["requests"]["cpu"] and epp["resources"]["requests"]["memory"]
    image = "%s/%s:%s" % (epp["image"]["registry"], epp["image"]["repository"], epp["image"]["tag"])
    expected = R.CASES[name]["router_epp_image"] or "%s/%s:%s@%s" % (
        R.CASES[name].get("router_epp_image_registry") or R.pinned("epp")["registry"], R.pinned("epp")["repository"],
        R.pinned("epp")["tag"], R.CASES[name].get("router_epp_image_digest"))
    assert image == expected
    assert values["router"]["modelServers"]["matchLabels"], "the InferencePool needs a selector"
    assert values["router"]["modelServers"]["type"] == case["engine"]["engine_type"]


@pytest.mark.parametrize("name", all_cases())
def test_requests_pass_through_the_router(rendered, name):
    """Issue 9 point 8: the EPP is in a request path, and the verifier sends its requests through it."""
    case = rendered["cases"][name]
    values = case["router_values"]
    chart = R.CASES[name].get("router_chart", "standalone")
    if chart == "standalone":
        proxy = values["router"]["proxy"]
        assert proxy["enabled"] is True and proxy["proxyType"] == "envoy" and proxy["mode"] == "sidecar"
        http = [p for p in values["router"]["extraServicePorts"] if p["name"] == "http"]
        assert http and http[0]["port"] == 8081, "the proxy's listener is the EPP Service port named http"
        assert "provider" not in values and "httpRoute" not in values
        router_url = "http://inference-cache-router-epp.inference-cache.svc.cluster.local:8081"
    else:
        assert values["provider"]["name"] in ("istio", "gke"), "the gateway chart without a provider routes nothing"
        assert values["httpRoute"]["create"] is True and values["httpRoute"]["inferenceGatewayName"]
        router_url = R.CASES[name]["cluster_verify_router"]["request_url"]
    args = job_args(case)
    assert "routed_prefix" in arg_after(args, "--checks").split(",")
    assert arg_after(args, "--router-url") == router_url
    assert arg_after(args, "--scoring-mode") == R.CASES[name]["router_scoring_mode"]
    if chart == "standalone":
        assert arg_after(args, "--epp-metrics-url") == "http://inference-cache-router-epp.inference-cache.svc.cluster.local:9090/metrics"
        assert values["router"]["monitoring"]["prometheus"]["auth"]["enabled"] is False, "the verifier reads the EPP's metrics"
    node_ports = [d for d in case["manifests"].get("router", []) if d["kind"] == "Service"]
    if R.CASES[name].get("router_service_type") == "NodePort":
        assert node_ports and node_ports[0]["spec"]["selector"] == {"llm-d-router-gateway": "inference-cache-router-epp"}
        assert node_ports[0]["spec"]["ports"][0]["targetPort"] == 8081
    else:
        assert not node_ports


def test_kind_inventory_sends_host_requests_through_the_router(rendered):
    case = rendered["cases"]["kind-inventory"]
    engine_services = [d for d in case["manifests"]["model_server"] if d["kind"] == "Service"]
    assert all(s["spec"].get("type", "ClusterIP") == "ClusterIP" for s in engine_services), "the engines bypass the router on kind"
    router = [d for d in case["manifests"]["router"] if d["kind"] == "Service"][0]
    mapped = [m["containerPort"] for m in case["kind_config"]["nodes"][0]["extraPortMappings"]]
    assert router["spec"]["ports"][0]["nodePort"] in mapped


@pytest.mark.parametrize("name", all_cases())
def test_scoring_modes(rendered, name):
    config = rendered["cases"][name]["epp_config"]
    types = dict((p.get("name", p["type"]), p) for p in config["plugins"])
    weights = dict((p["pluginRef"], p.get("weight")) for p in config["schedulingProfiles"][0]["plugins"])
    if R.CASES[name]["router_scoring_mode"] == "approximate":
        assert "precise-prefix-cache-producer" not in types
        profiles = config["schedulingProfiles"]
        for profile in profiles:  # issue 12: KAITO's default weights in every profile, queue depth first
            weights = dict((p["pluginRef"], p.get("weight")) for p in profile["plugins"])
            assert weights["load-aware-scorer"] == 10.0 and weights["kv-cache-utilization-scorer"] == 5.0, weights
            assert "prefix-cache-scorer" in weights and "prefixMatchInfoProducerName" not in json.dumps(types["prefix-cache-scorer"])
            assert [p["pluginRef"] for p in profile["plugins"]][-1] == "max-score-picker"
        if R.CASES[name].get("router_disaggregation"):
            assert [p["name"] for p in profiles] == ["prefill", "decode"]
            assert [p["plugins"][0]["pluginRef"] for p in profiles] == ["prefill-filter", "decode-filter"]
            handler = types["disagg-profile-handler"]["parameters"]
            assert handler["deciders"]["prefill"] == "prefix-based-pd-decider"
            assert handler["profiles"] == {"prefill": "prefill", "decode": "decode"}
            assert types["prefix-based-pd-decider"]["parameters"]["nonCachedTokens"] == R.CASES[name].get("router_pd_non_cached_tokens", 16)
            assert "single-profile-handler" not in types
        else:
            assert [p["name"] for p in profiles] == ["default"] and "single-profile-handler" in types
    else:
        params = types["precise-prefix-cache-producer"]["parameters"]
        assert params["speculativeIndexing"] is bool(R.CASES[name].get("router_speculative_indexing", True))
        assert params["speculativeTTL"] == R.CASES[name].get("router_speculative_ttl", "2s")
        assert set(["token-producer", "precise-prefix-cache-producer", "prefix-cache-scorer", "decode-filter", "max-score-picker",
                    "single-profile-handler", "endpoint-notification-source"]) <= set(types)
        assert types["prefix-cache-scorer"]["parameters"]["prefixMatchInfoProducerName"] == "precise-prefix-cache-producer"
        assert config["dataLayer"]["sources"][0]["extractors"][0]["pluginRef"] == "precise-prefix-cache-producer"
        kvc = types["precise-prefix-cache-producer"]["parameters"]["kvEventsConfig"]
        assert kvc["discoverPods"] is True and "zmqEndpoint" not in kvc


@pytest.mark.parametrize("name", all_cases())
def test_no_replay_socket_port_at_v0_9_0(rendered, name):
    """Issue 9 point 1: v0.9.0's podDiscoveryConfig has no replaySocketPort; the EPP refuses unknown fields."""
    config = rendered["cases"][name]["epp_config"]
    assert "replaySocketPort" not in json.dumps(config)
    if R.CASES[name].get("model_server_kv_events_replay_port"):
        # the engines keep their replay endpoint for other consumers (the verifier, a newer router)
        assert rendered["cases"][name]["engine"]["kv_events_config"]["replay_endpoint"] == "tcp://*:5558"


@pytest.mark.parametrize("name", all_cases())
def test_precise_token_source_answers(rendered, name):
    """Issue 9 point 5: vLLM 0.32.0 serves /v1/completions/render only with --enable-scale-out; else the render sidecar."""
    case = rendered["cases"][name]
    if R.CASES[name]["router_scoring_mode"] != "precise":
        assert case["router_values"]["router"]["tokenizer"]["enabled"] is False
        return
    producer = [p for p in case["epp_config"]["plugins"] if p["type"] == "token-producer"][0]
    url = producer["parameters"]["vllm"]["url"]
    tokenizer = case["router_values"]["router"]["tokenizer"]
    if tokenizer["enabled"]:
        assert url == "http://localhost:8000", "the token-producer calls the render sidecar in its own pod"
        # The sidecar loads the engines' model and answers to the served name the token-producer sends.
        model = R.CASES[name].get("model_server_model", "Qwen/Qwen3-0.6B")  # the role's default model id
        assert tokenizer["args"][0] == tokenizer["modelName"] == model
        assert "--served-model-name=%s" % producer["parameters"]["modelName"] in tokenizer["args"]
    else:
        assert case["engine"]["engine_type"] == "vllm", "SGLang engines serve no render endpoint: the sidecar is required"
        assert url.startswith("http://model-server.inference-cache.svc.cluster.local:8000")
        assert "--enable-scale-out" in case["engine"]["args"]


@pytest.mark.parametrize("name", all_cases())
def test_render_sidecar_needs_no_secret_nothing_creates(rendered, name):
    """Issue 9 point 2: no HF_TOKEN from llm-d-hf-token; a token Secret only when one is given; sized by variables."""
    case = rendered["cases"][name]
    tokenizer = case["router_values"]["router"]["tokenizer"]
    if not tokenizer["enabled"]:
        return
    assert "llm-d-hf-token" not in json.dumps(tokenizer)
    refs = [e["valueFrom"]["secretKeyRef"]["name"] for e in tokenizer["env"] if "valueFrom" in e]
    secrets = [d["metadata"]["name"] for d in case["manifests"].get("router", []) if d["kind"] == "Secret"]
    if R.CASES[name].get("router_hf_token"):
        assert refs == ["inference-cache-router-hf-token"] and secrets == refs
    elif R.CASES[name].get("router_hf_token_secret"):
        assert refs == [R.CASES[name]["router_hf_token_secret"]] and not secrets
    else:
        assert tokenizer["env"] == [] and not secrets, "the chart default env would read a Secret nothing creates"
    expected = R.CASES[name].get("router_tokenizer_resources") or {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}
    assert tokenizer["resources"] == expected
    image = "%s/%s:%s" % (tokenizer["image"]["registry"], tokenizer["image"]["repository"], tokenizer["image"]["tag"])
    assert image == R.CASES[name]["router_tokenizer_image"]


@pytest.mark.parametrize("name", all_cases())
def test_nvkind_runtime_class(rendered, name):
    """Issue 9 point 4: on nvkind the device plugin, the CUDA smoke pod and the GPU engines use RuntimeClass nvidia."""
    case = rendered["cases"][name]
    nvkind = R.CASES[name].get("kind_cluster_mode") == "nvkind"
    gpu = case["engine"]["profile"] != "vllm_cpu"
    pod = engine_pod(case)
    assert pod.get("runtimeClassName") == ("nvidia" if nvkind and gpu else None)
    if gpu:
        assert case["nvdp_values"].get("runtimeClassName") == ("nvidia" if nvkind else None)
        smoke = [d for d in case["manifests"]["nvidia_device_plugin"] if d["kind"] == "Pod"][0]
        assert smoke["spec"].get("runtimeClassName") == ("nvidia" if nvkind else None)


# -- policies --------------------------------------------------------------------------------------------------

def services(case):
    return [d for d in case["docs"] if d["kind"] == "Service"]


def engine_pod(case):
    deployment = [d for d in case["manifests"]["model_server"] if d["kind"] == "Deployment"][0]
    return deployment["spec"]["template"]["spec"]


def engine_container(case):
    return engine_pod(case)["containers"][0]


def job_args(case):
    job = [d for d in case["docs"] if d["kind"] == "Job"][0]
    return job["spec"]["template"]["spec"]["containers"][0]["args"]


def engine_env(case):
    return dict((e["name"], e.get("value")) for e in engine_container(case)["env"])


def arg_after(args, flag):
    return args[args.index(flag) + 1]


@pytest.mark.parametrize("name", all_cases())
def test_kv_events_port_never_on_a_load_balancer_or_unrequested_node_port(rendered, name):
    case = rendered["cases"][name]
    kv_port = 5557
    found_cluster_ip = False
    for svc in services(case):
        kv_ports = [p for p in svc["spec"]["ports"] if p["port"] == kv_port or p.get("targetPort") == "kv-events"]
        kind = svc["spec"].get("type", "ClusterIP")
        if kind == "LoadBalancer":
            assert not kv_ports, "%s: the KV-event port is on LoadBalancer %s" % (name, svc["metadata"]["name"])
        elif kind == "NodePort" and kv_ports:
            assert R.CASES[name].get("model_server_kv_events_node_port_enabled"), \
                "%s: the KV-event port is on NodePort %s without being asked for" % (name, svc["metadata"]["name"])
        elif kind == "ClusterIP" and kv_ports:
            found_cluster_ip = True
    assert found_cluster_ip, "%s: no ClusterIP Service carries the KV-event port" % name


@pytest.mark.parametrize("name", all_cases())
def test_network_policy_admits_kv_events_only_from_router_and_verifier(rendered, name):
    case = rendered["cases"][name]
    policy = [d for d in case["manifests"]["model_server"] if d["kind"] == "NetworkPolicy"][0]
    epp_label = {"llm-d-router-gateway": "inference-cache-router-epp"}
    verifier = [d for d in case["docs"] if d["kind"] == "Job"][0]["spec"]["template"]["metadata"]["labels"]
    kv_rules = 0
    for rule in policy["spec"]["ingress"]:
        if "ports" not in rule:  # every port: only prefill/decode engines reaching each other (NIXL, UCX)
            assert R.CASES[name].get("model_server_disaggregation"), "%s: a rule opens every port" % name
            assert rule["from"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "model-server",
                                                                     "app.kubernetes.io/component": "model-server"}}}], rule
            continue
        ports = [p["port"] for p in rule["ports"]]
        if 5557 not in ports:
            continue
        kv_rules += 1
        peers = rule.get("from")
        assert peers, "%s: the KV-event port is open to every pod (a rule without from)" % name
        for peer in peers:
            if "ipBlock" in peer:
                assert R.CASES[name].get("model_server_kv_events_node_port_enabled"), "%s: an ipBlock opens the KV-event port" % name
                continue
            labels = peer["podSelector"]["matchLabels"]
            assert labels, "%s: an empty podSelector admits every pod to the KV-event port" % name
            assert labels == epp_label or all(verifier.get(k) == v for k, v in labels.items()), labels
    assert kv_rules >= 1, "%s: no rule names who may reach the KV-event port" % name


@pytest.mark.parametrize("name", all_cases())
def test_the_epps_ext_proc_and_metrics_ports_only_from_the_verifier_and_the_gateway(rendered, name):
    """The EPP has no bind address and no authentication on ext_proc or metrics: its pod's NetworkPolicy names who may come."""
    case = rendered["cases"][name]
    policies = [d for d in case["manifests"]["router"] if d["kind"] == "NetworkPolicy"]
    assert len(policies) == 1, "%s: the router renders no NetworkPolicy for the EPP pod" % name
    spec = policies[0]["spec"]
    assert spec["podSelector"] == {"matchLabels": {"llm-d-router-gateway": "inference-cache-router-epp"}}
    assert spec["policyTypes"] == ["Ingress"]
    verifier = [d for d in case["docs"] if d["kind"] == "Job"][0]["spec"]["template"]["metadata"]["labels"]
    gateway = R.CASES[name].get("router_chart") == "gateway"
    seen = {}
    for rule in spec["ingress"]:
        ports = [p["port"] for p in rule["ports"]]
        if "from" not in rule:
            assert ports == [8081] and not gateway, "%s: a rule without peers opens %s to every pod" % (name, ports)
            continue
        for port in ports:
            seen[port] = rule["from"]
        for peer in rule["from"]:
            labels = peer["podSelector"]["matchLabels"]
            assert labels, "%s: an empty podSelector admits every pod" % name
            is_gateway = labels == {"gateway.networking.k8s.io/gateway-name": "inference-gateway"}
            # The Prometheus that scrapes the EPP's PodMonitor, in its own namespace: the metrics port only.
            is_scraper = labels == {"app.kubernetes.io/name": "prometheus"} and ports == [9090] and \
                peer.get("namespaceSelector") == {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
            assert all(verifier.get(k) == v for k, v in labels.items()) or (gateway and is_gateway and 9002 in ports) or is_scraper, \
                (name, labels)
    assert set(seen) == {9002, 9090}, "%s: ext_proc and metrics each need their rule, got %s" % (name, sorted(seen))
    if gateway:
        assert any(p["podSelector"]["matchLabels"].get("gateway.networking.k8s.io/gateway-name") for p in seen[9002]), \
            "%s: the Gateway's pods cannot reach ext_proc" % name


@pytest.mark.parametrize("name", all_cases())
def test_engine_pod_contract(rendered, name):
    case = rendered["cases"][name]
    container = engine_container(case)
    ports = dict((p["name"], p["containerPort"]) for p in container["ports"])
    assert ports["http"] == 8000 and ports["kv-events"] == 5557
    env = engine_env(case)
    assert env["PYTHONHASHSEED"] == "42"
    pod_ip = [e for e in container["env"] if e["name"] == "POD_IP"][0]
    assert pod_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == "http"
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["resources"]["requests"]
    kv = case["engine"]["kv_events_config"]
    if not case["engine"]["user_kv_events_config"]:
        assert kv["endpoint"] == "tcp://*:5557", "the engines bind so the EPP and the verifier can both connect"
        model = R.CASES[name].get("model_server_model", "Qwen/Qwen3-0.6B")
        assert kv["topic"] == "kv@$(POD_IP):8000@" + model
        assert kv["publisher"] == "zmq"
    if case["engine"]["profile"] != "vllm_cpu":
        assert container["resources"]["limits"]["nvidia.com/gpu"] == str(R.CASES[name].get("model_server_tensor_parallel_size", 1))
    if case["engine"]["profile"] == "vllm_lmcache":
        # multiprocess mode (the default): LMCache's connector dials the LMCache server beside vLLM in the pod
        connector = {"multiprocess": "LMCacheMPConnector", "in_process": "LMCacheConnectorV1"}[case["engine"]["lmcache"]["mode"]]
        transfer = json.loads(arg_after(container["args"], "--kv-transfer-config"))
        named = [transfer["kv_connector"]] + [c["kv_connector"] for c in transfer.get("kv_connector_extra_config", {}).get("connectors", [])]
        assert connector in named, transfer


def conformance_facts():
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "k8s_conformance.yml")) as handle:
        return yaml.safe_load(handle)


PD_CASES = sorted(n for n in R.CASES if R.CASES[n].get("model_server_disaggregation"))


@pytest.mark.parametrize("name", PD_CASES)
def test_prefill_decode_engine_groups(rendered, name):
    """issue 12: the engine side of P/D as llm-d-router v0.9.0 and vLLM 0.32.0 expect it (tests/integration/k8s_conformance.yml)."""
    case = rendered["cases"][name]
    facts = conformance_facts()
    deployments = dict((d["metadata"]["name"], d) for d in case["manifests"]["model_server"] if d["kind"] == "Deployment")
    assert sorted(deployments) == ["model-server-decode", "model-server-prefill"], sorted(deployments)
    label = facts["pd_role_label"]["value"]
    replicas = {"prefill": R.CASES[name].get("model_server_prefill_replicas", 1), "decode": R.CASES[name].get("model_server_decode_replicas", 1)}
    for role in ("prefill", "decode"):
        dep = deployments["model-server-" + role]
        pod = dep["spec"]["template"]
        # the v0.9.0 filters select on this label and value; the Deployment selectors keep the groups apart
        assert pod["metadata"]["labels"][label] == facts["pd_role_values"]["value"][role], pod["metadata"]["labels"]
        assert dep["spec"]["selector"]["matchLabels"][label] == role
        assert pod["metadata"]["labels"]["llm-d.ai/inference-serving"] == "true"
        assert dep["spec"]["replicas"] == replicas[role]
        engine = pod["spec"]["containers"][0]
        transfer = json.loads(arg_after(engine["args"], "--kv-transfer-config"))
        connectors = transfer["kv_connector_extra_config"]["connectors"] if transfer["kv_connector"] == "MultiConnector" else [transfer]
        nixl = [c for c in connectors if c["kv_connector"] == facts["vllm_nixl_connector"]["value"]]
        assert nixl and nixl[0]["kv_role"] in facts["vllm_kv_roles"]["value"], transfer
        lmcache = [c for c in connectors if c["kv_connector"] in ("LMCacheConnectorV1", "LMCacheMPConnector")]
        assert bool(lmcache) == (case["engine"]["profile"] == "vllm_lmcache"), transfer
        if case["engine"]["profile"] == "vllm_cpu":
            assert nixl[0]["kv_buffer_device"] == "cpu"
        env = dict((e["name"], e) for e in engine["env"])
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"]["value"] == "5600"
        # the LMCache server (multiprocess mode) is a native sidecar of both groups; the routing sidecar of decode only
        sidecars = [c for c in pod["spec"].get("initContainers", []) if c["name"] != "lmcache-server"]
        if role == "prefill":
            assert not sidecars and arg_after(engine["args"], "--port") == "8000"
            continue
        # decode: the routing sidecar owns the pod's HTTP port, vLLM listens behind it
        assert len(sidecars) == 1, sidecars
        sidecar = sidecars[0]
        assert sidecar["restartPolicy"] == "Always", "a native sidecar starts before vLLM and lives as long as the pod"
        assert DIGEST_RE.match(sidecar["image"]) and facts["pd_sidecar_image"]["value"] in sidecar["image"]
        flags = dict(a.lstrip("-").split("=", 1) for a in sidecar["args"])
        assert set(flags) <= set(facts["pd_sidecar_flags"]["value"]), flags
        assert flags["port"] == "8000" and flags["vllm-port"] == "8200", flags
        assert flags["kv-connector"] == facts["pd_sidecar_nixl_connector"]["value"]
        assert flags["secure-proxy"] == "false"
        assert [p["containerPort"] for p in sidecar["ports"] if p["name"] == "http"] == [8000]
        assert arg_after(engine["args"], "--port") == "8200"
        assert "http" not in [p["name"] for p in engine["ports"]]
        assert engine["readinessProbe"]["httpGet"]["port"] == "engine"
    # the router gets the roles from the contract (no router_engine), and its decode profile filters on them
    assert "router_engine" not in R.CASES[name]
    assert [p["name"] for p in case["epp_config"]["schedulingProfiles"]] == ["prefill", "decode"]


def test_make_render_shows_the_kaito_approximate_default():
    """issue 12: `make render` renders inventories/kind in approximate mode (the inventory itself stays precise)."""
    with open(os.path.join(R.ROOT, "Makefile")) as handle:
        target = handle.read().split("\nrender:", 1)[1].split("\n\n", 1)[0]
    assert "-e router_scoring_mode=approximate" in target and "inventories/kind" in target, target


def test_user_kv_events_config_wins(rendered):
    case = rendered["cases"]["cpu-user-kv-config"]
    args = engine_container(case)["args"]
    assert args.count("--kv-events-config") == 1, args
    assert arg_after(args, "--kv-events-config") == R.USER_KV_CONFIG
    assert case["engine"]["kv_events_config"]["topic"] == "kv@user-topic"
    # and the verifier follows the user's topic
    job = [d for d in case["docs"] if d["kind"] == "Job"][0]
    assert arg_after(job["spec"]["template"]["spec"]["containers"][0]["args"], "--topic-template") == "kv@user-topic"


def test_generated_kv_events_config_is_injected_once(rendered):
    args = engine_container(rendered["cases"]["cpu-precise-clusterip"])["args"]
    assert args.count("--kv-events-config") == 1
    assert json.loads(arg_after(args, "--kv-events-config"))["enable_kv_cache_events"] is True


@pytest.mark.parametrize("name", all_cases())
def test_every_image_is_pinned_by_digest(rendered, name):
    case = rendered["cases"][name]
    router = case["router_values"]["router"]
    images = ["%s/%s:%s" % (router["epp"]["image"]["registry"], router["epp"]["image"]["repository"], router["epp"]["image"]["tag"])]
    if router["tokenizer"]["enabled"]:
        images.append("%s/%s:%s" % (router["tokenizer"]["image"]["registry"], router["tokenizer"]["image"]["repository"],
                                    router["tokenizer"]["image"]["tag"]))
    if "proxy" in router:
        images.append(router["proxy"]["image"])
    for doc in case["docs"]:
        spec = doc.get("spec", {})
        pod = spec.get("template", {}).get("spec") or (spec if doc["kind"] == "Pod" else None)
        for container in (pod or {}).get("containers", []):
            images.append(container["image"])
    assert images
    for image in images:
        assert DIGEST_RE.match(image), "%s: %s is not pinned by digest" % (name, image)


@pytest.mark.parametrize("name", sorted(R.NEGATIVE))
def test_refusals_print_their_message(refused, name):
    expected = R.NEGATIVE[name][1]
    assert expected, "%s declares no message" % name
    lines = [line for line in refused["output"].splitlines() if line.startswith(name + " | FAILED")]
    assert lines, "%s did not fail:\n%s" % (name, refused["output"][-3000:])
    assert expected in lines[0], lines[0][:2000]


ROUTER_REFUSALS = {"neg-epp-bare-tag", "neg-proxy-bare-tag", "neg-gateway-without-provider", "neg-engine-tokens-without-scale-out",
                   "neg-pd-without-role-groups"}


@pytest.mark.parametrize("name", sorted(R.NEGATIVE))
def test_refusals_stop_before_anything_is_written(refused, name):
    """Issue 9 point 10: the refusals run in the preflights, before the role builds or renders anything.

    The engines' own refusals (the KV-event port open to every pod among them) leave no engine manifest behind;
    playbooks/kubernetes.yml renders every role into a scratch folder before it applies anything
    (test_kubernetes_playbook_checks_before_applying).
    """
    assert not os.path.exists(os.path.join(refused["out"], name, "router")), "%s rendered the router before refusing" % name
    if name not in ROUTER_REFUSALS:
        assert not os.path.exists(os.path.join(refused["out"], name, "model_server")), "%s rendered engines before refusing" % name


def test_kubernetes_playbook_checks_before_applying():
    """The first play of playbooks/kubernetes.yml renders model_server and router (every preflight and epp_config_check)
    into a scratch folder, before the kind cluster, the device plugin or any engine is created."""
    with open(os.path.join(R.ROOT, "playbooks", "kubernetes.yml")) as handle:
        plays = yaml.safe_load(handle)
    # First the hosts check (playbooks/require_hosts.yml: fails when no host would talk to the cluster), then the settings.
    assert plays[0]["ansible.builtin.import_playbook"] == "require_hosts.yml"
    plays = plays[1:]
    first = plays[0]

    def flat(tasks):
        for task in tasks:
            yield task
            for part in ("block", "rescue", "always"):
                yield from flat(task.get(part, []))
    tasks = list(flat(first.get("tasks", [])))
    roles = [t.get("ansible.builtin.include_role", {}).get("name") for t in tasks]
    assert roles.index("inference_cache.substrate.model_server") < roles.index("inference_cache.substrate.router")
    # The scratch folder goes even when a preflight fails: its removal is the renders' `always`.
    blocks = [t for t in first["tasks"] if "block" in t]
    assert [t for b in blocks for t in b.get("always", []) if t.get("ansible.builtin.file", {}).get("state") == "absent"]
    for task in tasks:
        if task.get("ansible.builtin.include_role"):
            render_vars = [k for k in task.get("vars", {}) if k.endswith("_render_dir")]
            assert render_vars, "%s must run in render mode in the check play" % task["name"]
    applied = [r if isinstance(r, str) else r["role"] for play in plays[1:] for r in play.get("roles", [])]
    assert "inference_cache.substrate.model_server" in applied and "inference_cache.substrate.kind_cluster" in applied


def test_secrets_never_reach_the_output_or_the_files(rendered):
    assert R.HF_TOKEN not in rendered["output"], "the Hugging Face token appears in the -v output"
    for folder, _dirs, files in os.walk(rendered["out"]):
        for name in files:
            with open(os.path.join(folder, name)) as handle:
                assert R.HF_TOKEN not in handle.read(), "the token was written to %s" % name
    secrets = [d for d in rendered["cases"]["cpu-precise-clusterip"]["docs"] if d["kind"] == "Secret"]
    assert len(secrets) == 2, "the engines' and the render sidecar's token Secrets"
    assert all(s["stringData"]["HF_TOKEN"].startswith("<redacted") for s in secrets)
    secret = [s for s in secrets if s["metadata"]["name"] == "model-server-hf-token"][0]
    env = engine_container(rendered["cases"]["cpu-precise-clusterip"])["env"]
    ref = [e for e in env if e["name"] == "HF_TOKEN"][0]
    assert ref["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]


def test_render_is_idempotent(tmp_path):
    """Rendering the same case twice: the first run changes files, the second changes nothing."""
    cases = {"idempotence": R.CASES["cpu-precise-clusterip"]}
    first = R.run_render(str(tmp_path), cases)
    assert first[0] == 0, first[1][-3000:]
    second = R.run_render(str(tmp_path), cases)
    assert second[0] == 0, second[1][-3000:]
    assert re.search(r"idempotence\s+: ok=\d+\s+changed=[1-9]", first[1])
    assert re.search(r"idempotence\s+: ok=\d+\s+changed=0\s", second[1]), second[1][-1500:]


def test_docs_list_every_pin():
    with open(R.PINS) as handle:
        pins = yaml.safe_load(handle)
    with open(os.path.join(R.ROOT, "docs", "kubernetes.md")) as handle:
        docs = handle.read()
    for name, pin in pins["images"].items():
        assert pin["tag"] in docs and pin["repository"] in docs, "docs/kubernetes.md does not list the %s image" % name
        if pin["digest"]:
            assert pin["digest"] in docs
    for chart in pins["charts"].values():
        assert chart["version"] in docs
    assert pins["inference_pool_crds"]["version"] in docs


# The role applies the verifier's ConfigMap server-side (no last-applied-configuration annotation, whose 256 KiB limit
# a client-side apply would meet: test_verifier_manifests_are_applied_server_side), so what bounds it is a ConfigMap's
# own limit: 1 MiB of data (kubernetes@v1.33.13:pkg/apis/core/validation/validation.go ValidateConfigMap, MaxSecretSize).
CONFIG_MAP_LIMIT = 1024 * 1024


@pytest.mark.parametrize("name", all_cases())
def test_the_verifier_job_carries_every_file_its_tool_imports(rendered, name, tmp_path):
    """The Job mounts only the ConfigMap's files: they must hold the tool and every module_utils file it loads."""
    docs = rendered["cases"][name]["manifests"]["cluster_verify"]
    config = [d for d in docs if d["kind"] == "ConfigMap"][0]
    job = [d for d in docs if d["kind"] == "Job"][0]
    items = [v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "code"][0]["configMap"]["items"]
    for item in items:
        path = tmp_path / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(config["data"][item["key"]])
    tool = config["data"]["roles.cluster_verify.files.cluster_verify.py"]
    names = sorted(set(re.findall(r'module_utils\("([\w.]+)"\)', tool)))
    assert "kv.events_check" in names and "kv.index_check" in names
    # The tool loaded from the mounted files, then every module_utils it loads by name, through its own loader.
    code = ("import importlib.util; spec = importlib.util.spec_from_file_location('cluster_verify', "
            "'roles/cluster_verify/files/cluster_verify.py'); tool = importlib.util.module_from_spec(spec); "
            "spec.loader.exec_module(tool); [tool.module_utils(n) for n in %r]" % names)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONPATH="")
    run = __import__("subprocess").run([sys.executable, "-c", code], cwd=str(tmp_path), env=env, capture_output=True, text=True,
                                       timeout=60, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    size = sum(len(v.encode("utf-8")) for v in config["data"].values())   # the values, as ValidateConfigMap counts
    assert size < CONFIG_MAP_LIMIT, "the ConfigMap holds %d bytes, over the 1 MiB a ConfigMap may hold" % size
