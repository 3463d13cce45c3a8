# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Helpers of the Kubernetes render tests: the cases, one parallel ansible-playbook run, loading the output.

Each case is an inventory host of its own (connection local) whose host variables are role variables, so
one ``ansible-playbook playbooks/render.yml`` run renders every case in parallel (forks).
"""

from __future__ import absolute_import, division, print_function

import hashlib
import json
import os
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAYBOOK = os.path.join(ROOT, "playbooks", "render.yml")
PINS = os.path.join(ROOT, "vars", "pinned_versions.yml")
HF_TOKEN = "hf_RenderTestTokenDoNotLeak_7f3c9a"


def fake_digest(name):
    """A well-formed digest for the tests (not a real image): the roles only check the reference's shape."""
    return "sha256:" + hashlib.sha256(name.encode()).hexdigest()


def pinned(name):
    with open(PINS) as handle:
        return yaml.safe_load(handle)["images"][name]


def image(name):
    pin = pinned(name)
    repo = pin["repository"] if "registry" not in pin else pin["registry"] + "/" + pin["repository"]
    return "%s:%s@%s" % (repo, pin["tag"], fake_digest(name))


DIGESTS = {
    "model_server_image": None,  # per profile, below
    "router_epp_image": image("epp"),
    "router_tokenizer_image": image("vllm_cpu"),
    "router_proxy_image": image("envoy"),
    "nvidia_device_plugin_image": image("nvidia_device_plugin"),
    "nvidia_device_plugin_smoke_image": image("cuda_sample"),
    "model_server_pd_sidecar_image": image("pd_sidecar"),
}
# sglang_lmcache needs an image built from the SGLang one with LMCache added (the upstream image is refused); P/D on the
# vLLM CPU profile needs an image built with nixl (the upstream CPU image is refused).
SGLANG_LMCACHE_IMAGE = "registry.example.com/inference-cache/sglang-lmcache:v0.5.12-lmcache0.3.15@" + fake_digest("sglang-lmcache")
VLLM_CPU_NIXL_IMAGE = "registry.example.com/inference-cache/vllm-cpu-nixl:v0.32.0@" + fake_digest("vllm-cpu-nixl")
PROFILE_IMAGE = {"vllm_cpu": image("vllm_cpu"), "vllm_lmcache": image("vllm_lmcache"), "sglang_lmcache": SGLANG_LMCACHE_IMAGE}
USER_KV_CONFIG = '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","topic":"kv@user-topic"}'


def case(profile, mode, service_type, **extra):
    host = {
        "model_server_profile": profile,
        "model_server_image": PROFILE_IMAGE[profile],
        "model_server_service_type": service_type,
        "router_scoring_mode": mode,
        "router_epp_image": DIGESTS["router_epp_image"],
        "router_tokenizer_image": DIGESTS["router_tokenizer_image"],
        "router_proxy_image": DIGESTS["router_proxy_image"],
        "nvidia_device_plugin_image": DIGESTS["nvidia_device_plugin_image"],
        "nvidia_device_plugin_smoke_image": DIGESTS["nvidia_device_plugin_smoke_image"],
        "model_server_pd_sidecar_image": DIGESTS["model_server_pd_sidecar_image"],
    }
    host.update(extra)
    return host


# What prefill and decode engine groups would publish (model_server deploys one group only; issue 12).
PD_ENGINES = {"namespace": "inference-cache", "engine_type": "vllm", "served_model_name": "Qwen/Qwen3-0.6B", "http_port": 8000,
              "service": "model-server", "selector": {"app.kubernetes.io/name": "model-server"}, "topic": "kv@$(POD_IP):8000@Qwen/Qwen3-0.6B",
              "block_size": 32, "hash_seed": "42", "kv_events_enabled": True, "kv_events_binds": True, "kv_events_port": 5557,
              "kv_events_allowed_peers": [{"labels": {"llm-d-router-gateway": "inference-cache-router-epp"}}], "network_policy": True,
              "pd_roles": True}


def inventory_case(inventory, **extra):
    """The group variables of inventories/<inventory> (what `make kubernetes` uses), with test digests."""
    with open(os.path.join(ROOT, "inventories", inventory, "group_vars", "k8s_controller", "main.yml")) as handle:
        host = yaml.safe_load(handle)
    profile = host.get("model_server_profile", "vllm_cpu")
    host.update(case(profile, host.get("router_scoring_mode", "precise"), host.get("model_server_service_type", "ClusterIP")))
    host.update(extra)
    return host


# Every profile x scoring mode x Service type x router chart the issues name, the inventories as shipped, and the
# policy corner cases.
CASES = {
    "kind-inventory": inventory_case("kind"),
    "gpu-inventory-nvkind": inventory_case("gpu", kind_cluster_mode="nvkind"),
    "cpu-precise-clusterip": case("vllm_cpu", "precise", "ClusterIP", model_server_hf_token=HF_TOKEN, router_hf_token=HF_TOKEN),
    "cpu-approximate-nodeport": case("vllm_cpu", "approximate", "NodePort"),
    "cpu-precise-loadbalancer": case("vllm_cpu", "precise", "LoadBalancer", router_speculative_indexing=False),
    "cpu-precise-kv-nodeport": case("vllm_cpu", "precise", "NodePort", model_server_kv_events_node_port_enabled=True,
                                    model_server_kv_events_node_port_source_cidrs=["172.18.0.0/16"],
                                    kind_cluster_zmq_node_port_enabled=True),
    "cpu-user-kv-config": case("vllm_cpu", "approximate", "ClusterIP",
                               model_server_extra_args=["--kv-events-config", USER_KV_CONFIG, "--enable-prompt-tokens-details"]),
    "cpu-replay": case("vllm_cpu", "precise", "ClusterIP", model_server_kv_events_replay_port=5558),
    "cpu-precise-engine-tokens": case("vllm_cpu", "precise", "ClusterIP", router_tokenizer_sidecar=False,
                                      model_server_enable_scale_out=True, router_hf_token_secret="my-hf-secret"),
    "cpu-precise-gateway-istio": case("vllm_cpu", "precise", "ClusterIP", router_chart="gateway", router_gateway_provider="istio",
                                      cluster_verify_router={"request_url": "http://inference-gateway-istio.inference-cache.svc:80"}),
    "gpu-lmcache-precise-loadbalancer": case("vllm_lmcache", "precise", "LoadBalancer", kind_cluster_mode="nvkind"),
    "gpu-lmcache-approximate-clusterip": case("vllm_lmcache", "approximate", "ClusterIP"),
    # vLLM's in-process LMCache connector (LMCacheConnectorV1, LMCACHE_* variables) instead of the LMCache server beside it
    "gpu-lmcache-in-process": case("vllm_lmcache", "precise", "ClusterIP", model_server_lmcache_mode="in_process"),
    "sglang-precise-clusterip": case("sglang_lmcache", "precise", "ClusterIP", model_server_tensor_parallel_size=2),
    "sglang-approximate-loadbalancer": case("sglang_lmcache", "approximate", "LoadBalancer", kind_cluster_mode="nvkind"),
    "cpu-precise-speculative": case("vllm_cpu", "precise", "ClusterIP", router_speculative_indexing=True, router_speculative_ttl="5s"),
    "gpu-pd-disaggregation": case("vllm_lmcache", "approximate", "ClusterIP", router_disaggregation=True, router_pd_non_cached_tokens=32,
                                  router_engine=PD_ENGINES),
    # issue 12: model_server deploys the prefill and decode groups and publishes pd_roles to the router.
    "cpu-pd-engines": case("vllm_cpu", "approximate", "ClusterIP", router_disaggregation=True, model_server_disaggregation=True,
                           model_server_prefill_replicas=1, model_server_decode_replicas=2,
                           model_server_image=VLLM_CPU_NIXL_IMAGE, model_server_pd_image_has_nixl=True),
    "gpu-pd-engines-lmcache": case("vllm_lmcache", "approximate", "ClusterIP", router_disaggregation=True,
                                   model_server_disaggregation=True),
    "cpu-epp-mirror": case("vllm_cpu", "approximate", "ClusterIP", router_epp_image="", router_epp_image_registry="mirror.example.com/llm-d",
                           router_epp_image_digest=fake_digest("epp-mirror")),
}

# Cases that must fail, with the sentence each must print. Each stops in a preflight, before anything is rendered
# or applied (test_refusals_stop_before_anything_is_written).
NEGATIVE = {
    "neg-bare-tag": (case("vllm_cpu", "precise", "ClusterIP", model_server_image="docker.io/vllm/vllm-openai-cpu:v0.32.0"),
                     "is not pinned by digest"),
    "neg-placeholder-digest": (case("vllm_cpu", "precise", "ClusterIP",
                                    model_server_image="docker.io/vllm/vllm-openai-cpu:v0.32.0@sha256:" + "0" * 64),
                               "is not pinned by digest"),
    "neg-pinned-defaults": ({"router_scoring_mode": "precise"}, "is not pinned by digest"),
    "neg-epp-bare-tag": (case("vllm_cpu", "precise", "ClusterIP", router_epp_image="ghcr.io/llm-d/llm-d-router-endpoint-picker:v0.9.0"),
                         "The EPP image ghcr.io/llm-d/llm-d-router-endpoint-picker:v0.9.0 is not pinned by digest"),
    "neg-proxy-bare-tag": (case("vllm_cpu", "precise", "ClusterIP", router_proxy_image="docker.io/envoyproxy/envoy:distroless-v1.33.2"),
                           "The router image docker.io/envoyproxy/envoy:distroless-v1.33.2 is not pinned by digest"),
    "neg-kv-on-loadbalancer": (case("vllm_cpu", "precise", "LoadBalancer", model_server_kv_events_node_port_enabled=True),
                               "cannot be combined with a LoadBalancer"),
    "neg-empty-peers": (case("vllm_cpu", "precise", "ClusterIP", model_server_kv_events_allowed_peers=[]),
                        "would be open to every pod"),
    "neg-empty-peer-labels": (case("vllm_cpu", "approximate", "ClusterIP", model_server_kv_events_allowed_peers=[{"labels": {}}]),
                              "would be open to every pod"),
    "neg-no-network-policy": (case("vllm_cpu", "approximate", "ClusterIP", model_server_network_policy_enabled=False),
                              "would be open to every pod"),
    "neg-node-port-no-cidrs": (case("vllm_cpu", "precise", "NodePort", model_server_kv_events_node_port_enabled=True,
                                    model_server_kv_events_node_port_source_cidrs=[]),
                               "name the networks allowed to reach it in model_server_kv_events_node_port_source_cidrs"),
    "neg-sglang-lmcache-too-new": (case("sglang_lmcache", "precise", "ClusterIP", model_server_lmcache_version="0.5.6"),
                                   "SGLang 0.5.12 builds its LMCache connector without config_file"),
    "neg-gateway-without-provider": (case("vllm_cpu", "precise", "ClusterIP", router_chart="gateway"),
                                     "no request reaches the EPP"),
    "neg-engine-tokens-without-scale-out": (case("vllm_cpu", "precise", "ClusterIP", router_tokenizer_sidecar=False),
                                            "answers with 403 unless it was"),
    "neg-pd-engines-sglang": (case("sglang_lmcache", "approximate", "ClusterIP", model_server_disaggregation=True),
                              "model_server_disaggregation needs a vLLM profile"),
    "neg-pd-without-role-groups": (case("vllm_cpu", "approximate", "ClusterIP", router_disaggregation=True),
                                   "router_disaggregation needs router_scoring_mode=approximate and engines running as prefill"),
}


# router_impl gie: the Gateway API Inference Extension v1.4.0's EPP (approximate only), the objects of its inferencepool chart
# rendered by the router role's templates (tests/integration/test_render_router_gie.py). Every case sends the verifier through
# a Gateway (the EPP has no proxy of its own). "@USER_CONFIG@" is replaced by a config file the test writes.
GIE_EPP_IMAGE = image("gie_epp")
GATEWAY_URL = {"request_url": "http://inference-gateway-istio.inference-cache.svc:80"}


def gie_case(profile="vllm_cpu", **extra):
    host = case(profile, "approximate", "ClusterIP", router_impl="gie", router_epp_image=GIE_EPP_IMAGE, cluster_verify_router=GATEWAY_URL)
    host.update(extra)
    return host


GIE_CASES = {
    # The defaults: InferencePool and EPP only (a Gateway's HTTPRoute names the pool), vLLM CPU engines.
    "gie-cpu": gie_case(),
    # SGLang engines (metrics through the data layer), the chart's HTTPRoute to an Istio Gateway in another namespace, two
    # replicas (leader election).
    "gie-sglang-istio-ha": gie_case("sglang_lmcache", model_server_tensor_parallel_size=2, router_chart="gateway",
                                    router_gateway_provider="istio", router_gateway_namespace="gateways", router_epp_replicas=2),
    # GKE Inference Gateway: its policies; plain gRPC ext_proc and the EPP's /metrics behind a token (with the ClusterRole
    # that lets the EPP check tokens); its proxies, outside the cluster, admitted to ext_proc by their address range.
    "gie-gpu-gke": gie_case("vllm_lmcache", router_chart="gateway", router_gateway_provider="gke", router_epp_secure_serving=False,
                            router_epp_metrics_auth=True, kind_cluster_mode="nvkind", router_ext_proc_source_cidrs=["10.129.0.0/23"],
                            model_server_http_source_cidrs=["10.129.0.0/23"]),
    # kgateway (or any Gateway that needs no provider objects): the HTTPRoute only.
    "gie-kgateway": gie_case(router_chart="gateway"),
    # A mirror of the pinned image (parts), other weights, extra values that reach the templates.
    "gie-mirror-extra-values": gie_case(router_epp_image="", router_epp_image_registry="mirror.example.com/gie",
                                        router_epp_image_digest=fake_digest("gie-epp-mirror"), router_gie_prefix_scorer_weight=5.0,
                                        router_extra_values={"inferenceExtension": {
                                            "env": [{"name": "GODEBUG", "value": "madvdontneed=1"}],
                                            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "router",
                                                             "effect": "NoSchedule"}]}}),
    # A user-written EndpointPickerConfig replaces the generated one.
    "gie-user-config": gie_case(router_epp_config_file="@USER_CONFIG@"),
}

GIE_NEGATIVE = {
    "neg-gie-precise": (case("vllm_cpu", "precise", "ClusterIP", router_impl="gie", router_epp_image=GIE_EPP_IMAGE),
                        "router_impl=gie runs the Gateway API Inference Extension's EPP v1.4.0, which has no KV-event subscriber and no "
                        "token producer, so router_scoring_mode=precise cannot be honoured: set router_scoring_mode=approximate, or "
                        "router_impl=llm-d for KV-event-driven precise routing."),
    "neg-gie-bare-tag": (gie_case(router_epp_image="registry.k8s.io/gateway-api-inference-extension/epp:v1.4.0"),
                         "The EPP image registry.k8s.io/gateway-api-inference-extension/epp:v1.4.0 is not pinned by digest"),
    "neg-gie-pinned-default": (gie_case(router_epp_image=""),
                               "The EPP image registry.k8s.io/gateway-api-inference-extension/epp:v1.4.0 is not pinned by digest"),
    "neg-gie-disaggregation": (gie_case(router_disaggregation=True),
                               "router_impl=gie has no prefill/decode profile handler"),
    "neg-gie-pd-engines": (gie_case("vllm_lmcache", model_server_disaggregation=True),
                           "so engines running as prefill and decode groups (pd_roles true) cannot be served: set router_impl=llm-d"),
    "neg-gie-nodeport": (gie_case(router_service_type="NodePort"),
                         "so router_service_type must be ClusterIP (send requests to your Gateway)"),
    "neg-gie-chart-false-flag": (gie_case(router_chart_ref="/srv/charts/inferencepool-v1.4.0.tgz", router_epp_secure_serving=False,
                                          router_epp_pprof=True),
                                 "passes each EPP flag as two arguments and the EPP reads a boolean flag without '=' as true, so "
                                 "secure-serving set to false would stay true"),
    "neg-gie-chart-gateway-namespace": (gie_case(router_chart_ref="/srv/charts/inferencepool-v1.4.0.tgz", router_chart="gateway",
                                                 router_gateway_namespace="gateways", router_epp_pprof=True),
                                        "has no Gateway namespace, so router_gateway_namespace=gateways cannot be honoured"),
}


def write_inventory(path, cases):
    hosts = {}
    for name, host_vars in cases.items():
        entry = dict(host_vars)
        entry["ansible_connection"] = "local"
        entry["ansible_python_interpreter"] = sys.executable
        hosts[name] = entry
    with open(path, "w") as handle:
        yaml.safe_dump({"all": {"children": {"render_cases": {"hosts": hosts}}}}, handle, sort_keys=True)


def run_render(tmp_dir, cases, verbosity=0, callback=None):
    """One ansible-playbook run rendering every case; returns (returncode, stdout+stderr, output dir)."""
    inventory = os.path.join(tmp_dir, "inventory.yml")
    out = os.path.join(tmp_dir, "out")
    write_inventory(inventory, cases)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1",
               ANSIBLE_DEPRECATION_WARNINGS="0")
    # ANSIBLE_COLLECTIONS_PATH (with kubernetes.core) comes from tests/integration/conftest.py.
    if callback:
        env["ANSIBLE_STDOUT_CALLBACK"] = callback
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", inventory, PLAYBOOK,
           "-e", "substrate_render_dir=%s" % out, "-e", "substrate_render_hosts=render_cases", "--forks", str(min(len(cases), 10))]
    if verbosity:
        cmd.append("-" + "v" * verbosity)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, check=False)
    return proc.returncode, proc.stdout, out


def load_case(out, name):
    """Everything one case rendered: manifests per role, Helm values, the EPP config, the engine facts."""
    base = os.path.join(out, name)
    result = {"manifests": {}, "docs": []}
    for role in ("model_server", "router", "cluster_verify", "nvidia_device_plugin"):
        path = os.path.join(base, role, "manifests.yaml")
        if os.path.exists(path):
            with open(path) as handle:
                docs = [d for d in yaml.safe_load_all(handle) if d]
            result["manifests"][role] = docs
            result["docs"].extend(docs)
    for key, rel in (("kind_config", "kind_cluster/kind-config.yaml"), ("epp_config", "router/epp-config.yaml"),
                     ("router_values", "router/helm/llm-d-router-standalone.values.yaml"),
                     ("router_values", "router/helm/llm-d-router-gateway.values.yaml"),
                     ("router_values", "router/helm/inferencepool.values.yaml"), ("router_release", "router/helm/release.yaml"),
                     ("nvdp_values", "nvidia_device_plugin/helm/nvidia-device-plugin.values.yaml"),
                     ("nvdp_release", "nvidia_device_plugin/helm/release.yaml")):
        path = os.path.join(base, rel)
        if os.path.exists(path):
            with open(path) as handle:
                result[key] = yaml.safe_load(handle)
    with open(os.path.join(base, "model_server", "engine.json")) as handle:
        result["engine"] = json.load(handle)
    return result
