# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The Kubernetes path as a team runs it in production, rendered without a cluster (issue 46); the same objects run on the
kwok cluster's API server in tests/integration/test_kwok_roles.py and the molecule scenario kwok.

* graceful termination: the engine's preStop sleep, vLLM's --shutdown-timeout (SGLang 0.5.12 has none and drains with no
  bound of its own), a grace period that covers both (llm-d's graceful-shutdown component: 15 + 45 + 15);
* the weights' volume: emptyDir with a size limit and the same ephemeral-storage request, a claim created (RWX when shared)
  or given, hostPath only at Pod Security privileged; a size that cannot hold the weights refused;
* placement: a PDB per engine Deployment, topology spread over nodes, GPU feature discovery's product names of the card
  the memory plan planned for as a required node affinity, GFD on in the device plugin's values;
* sizing that follows the shape: CPU and memory per GPU of the tensor-parallel group, /dev/shm in the limit, in-process
  LMCache's CPU tier in the request and the limit (a given limit that cannot hold them refused);
* the router: two EPP replicas, active-active where the config's state comes from the engines (precise), leader election
  otherwise, a PDB only for active-active replicas, the precise index capped and the EPP's memory sized from it;
* monitoring: PodMonitors for the engines (and the LMCache server, whose HTTP port then listens on the pod's addresses) and
  the EPP, the scraper admitted by the NetworkPolicies;
* the engines' HTTP port admitted only from the router's and the Gateway's pods, the verifier and the scraper; pull
  secrets, a PriorityClass, Pod Security labels, the GIE EPP's restricted securityContext;
* each refusal one sentence, before anything is written.
"""

from __future__ import absolute_import, division, print_function

import os
import sys

import pytest

try:
    import kubernetes_validate  # pylint: disable=import-error
except ImportError:  # pragma: no cover
    kubernetes_validate = None

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _k8s_render as R  # noqa: E402  pylint: disable=wrong-import-position,import-error

GIB = 1024 ** 3
QWEN3_8B = {"num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 4096,
            "intermediate_size": 12288, "vocab_size": 151936, "torch_dtype": "bfloat16"}
SIZING_H100 = {"parameters": "8.2B", "gpu": "H100-80GB", "model_config": QWEN3_8B}
VERIFIER = {"app.kubernetes.io/component": "kv-events-verifier"}
PROMETHEUS = {"app.kubernetes.io/name": "prometheus"}
EPP_LLMD = {"llm-d-router-gateway": "inference-cache-router-epp"}
EPP_GIE = {"inferencepool": "inference-cache-router-epp"}
GATEWAY = {"gateway.networking.k8s.io/gateway-name": "inference-gateway"}

POSITIVE = {
    # The example: vLLM + LMCache in-process at TP 4 with a 100 GB CPU tier, precise routing, on H100s.
    "p-gpu-tp4-in-process": R.case("vllm_lmcache", "precise", "ClusterIP", model_server_tensor_parallel_size=4,
                                   model_server_lmcache_mode="in_process", model_server_lmcache_max_local_cpu_size=100,
                                   model_server_sizing=SIZING_H100, model_server_model_cache_type="pvc",
                                   model_server_image_pull_secrets=["regcred"], model_server_priority_class_name="inference-high",
                                   model_server_priority_class_value=1000000),
    # vLLM + the LMCache server beside it (multiprocess), an existing claim, TP 1.
    "p-gpu-mp-claim": R.case("vllm_lmcache", "approximate", "ClusterIP", model_server_model_cache_type="pvc",
                             model_server_model_cache_claim="models-rwx", model_server_model_cache_size="200Gi",
                             model_server_pod_monitor=True),
    # SGLang: no drain flag, the grace period its bound.
    "p-sglang": R.case("sglang_lmcache", "precise", "ClusterIP", model_server_tensor_parallel_size=2),
    # A node's folder, at Pod Security privileged.
    "p-cpu-hostpath": R.case("vllm_cpu", "precise", "ClusterIP", model_server_model_cache_type="hostPath",
                             model_server_model_cache_host_path="/var/lib/models", model_server_pod_security_level="privileged",
                             model_server_pod_monitor=False),
    # The GIE EPP active-active on request (its approximate prefix state then stays in each replica).
    "p-gie-active-active": R.gie_case(router_epp_leader_election=False, router_image_pull_secrets=["regcred"],
                                      router_priority_class_name="router-high"),
    # One EPP replica: no leader election, no PDB.
    "p-llmd-one-replica": R.case("vllm_cpu", "precise", "ClusterIP", router_epp_replicas=1),
    # The vllm-stack chart: its values for what it has (shmSize, pvcStorage, priorityClassName, imagePullSecret, affinity).
    "p-chart": R.case("vllm_lmcache", "precise", "ClusterIP", model_server_chart_ref="/srv/charts/vllm-stack-0.1.12.tgz",
                      model_server_hash_seed="123", model_server_tensor_parallel_size=2, model_server_sizing=SIZING_H100,
                      model_server_model_cache_type="pvc", model_server_image_pull_secrets=["regcred"],
                      model_server_priority_class_name="inference-high"),
}

NEGATIVE = {
    "n-shutdown-flag": (R.case("vllm_cpu", "precise", "ClusterIP", model_server_extra_args=["--shutdown-timeout=10"]),
                        "model_server_extra_args holds --shutdown-timeout, which the role sets from model_server_shutdown_timeout "
                        "and sizes the pods' grace period by, so set model_server_shutdown_timeout instead."),
    "n-grace-short": (R.case("vllm_cpu", "precise", "ClusterIP", model_server_termination_grace_period_seconds=30),
                      "model_server_termination_grace_period_seconds=30 must exceed the preStop sleep (15 s) plus the engine's "
                      "drain (45 s, model_server_shutdown_timeout), or the kubelet kills requests still in flight, so raise it or "
                      "leave it at 0 (derived)."),
    "n-hostpath-baseline": (R.case("vllm_cpu", "precise", "ClusterIP", model_server_model_cache_type="hostPath",
                                   model_server_model_cache_host_path="/var/lib/models"),
                            "A hostPath model cache is refused by Pod Security level baseline of namespace inference-cache "
                            "(baseline and restricted forbid hostPath volumes), so use model_server_model_cache_type=pvc, or set "
                            "model_server_pod_security_level=privileged."),
    "n-rwo-shared": (R.case("vllm_cpu", "precise", "ClusterIP", model_server_model_cache_type="pvc",
                            model_server_model_cache_access_modes=["ReadWriteOnce"]),
                     "The model cache claim model-server-model-cache would be ReadWriteOnce but 2 engine pods share it, and a "
                     "second pod on another node never starts"),
    "n-tier-over-limit": (R.case("vllm_lmcache", "precise", "ClusterIP", model_server_lmcache_mode="in_process",
                                 model_server_lmcache_max_local_cpu_size=100,
                                 model_server_resources={"requests": {"cpu": "4", "memory": "24Gi"}, "limits": {"memory": "48Gi"}}),
                          "The engine's memory limit 48Gi in model_server_resources must exceed 102Gi, what the role puts in the "
                          "engine's memory (100Gi of in-process LMCache CPU tier, model_server_lmcache_max_local_cpu_size, and 2Gi "
                          "of /dev/shm, model_server_shm_size), or the engine is OOM-killed when they fill, so raise the limit or "
                          "shrink those."),
    "n-weights-over-cache": (R.case("vllm_lmcache", "precise", "ClusterIP", model_server_sizing=SIZING_H100,
                                    model_server_model_cache_size="10Gi"),
                             "The model's weights take 15.27 GiB (8.2B parameters at bfloat16), more than the 10Gi of the model "
                             "cache (emptyDir), so the download would fail part way: set model_server_model_cache_size to at least "
                             "16Gi."),
    "n-chart-drain": (R.case("vllm_lmcache", "precise", "ClusterIP", model_server_chart_ref="/srv/charts/vllm-stack",
                             model_server_hash_seed="123", model_server_shutdown_timeout=45),
                      "The vllm-stack chart (/srv/charts/vllm-stack) sets no terminationGracePeriodSeconds and no preStop hook "
                      "(Kubernetes kills the engine 30 s after SIGTERM), mounts only a claim it creates itself and takes one pull "
                      "secret, so it needs model_server_shutdown_timeout 25 or less (got 45)"),
    "n-priority-no-name": (R.case("vllm_cpu", "precise", "ClusterIP", model_server_priority_class_value=1000),
                           "model_server_priority_class_value=1000 creates a PriorityClass, which needs a name: set "
                           "model_server_priority_class_name."),
    "n-http-no-peers": (R.case("vllm_cpu", "precise", "ClusterIP", model_server_http_allowed_peers=[], model_server_pod_monitor=False),
                        "The NetworkPolicy admits the engines' HTTP port only from the pods of model_server_http_allowed_peers (and "
                        "model_server_metrics_allowed_peers), which must name at least one non-empty label set"),
    "n-gke-engines-no-cidrs": (R.gie_case(router_chart="gateway", router_gateway_provider="gke", router_ext_proc_source_cidrs=["10.0.0.0/8"]),
                               "router_gateway_provider=gke is a managed Gateway whose proxies run outside the cluster and send the "
                               "requests to the engines' HTTP port, which the NetworkPolicy cannot admit by pod label, so name the "
                               "address ranges they connect from in model_server_http_source_cidrs."),
    "n-metrics-no-peers": (R.case("vllm_cpu", "precise", "ClusterIP", model_server_metrics_allowed_peers=[{"labels": {}}]),
                           "A PodMonitor (model_server_pod_monitor=auto) is scraped only by the pods of "
                           "model_server_metrics_allowed_peers, which must name at least one non-empty label set"),
    "n-router-pull-secret-chart": (R.case("vllm_cpu", "precise", "ClusterIP", router_image_pull_secrets=["regcred"]),
                                   "The llm-d-router-standalone chart at its pin has no value for the EPP pod's imagePullSecrets or "
                                   "priorityClassName, so router_image_pull_secrets and router_priority_class_name cannot be "
                                   "honoured with it"),
    "n-router-monitor-auth": (R.case("vllm_cpu", "precise", "ClusterIP", router_pod_monitor=True, router_epp_metrics_auth=True),
                              "router_pod_monitor=true cannot scrape the EPP with router_epp_metrics_auth=true"),
    "n-router-index-limit": (R.case("vllm_cpu", "precise", "ClusterIP",
                                    router_epp_resources={"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}}),
                             "The EPP's memory limit 4Gi (router_epp_resources) cannot hold its precise KV-block index of "
                             "router_kv_index_max_keys=1000000 keys (3400 bytes each as measured with llm-d-kv-cache v0.9.0, twice "
                             "over for Go's collector: 7Gi)"),
    "n-router-ha-value": (R.case("vllm_cpu", "precise", "ClusterIP", router_epp_leader_election="maybe"),
                          "router_epp_leader_election (got maybe) and router_pod_monitor (got auto) must be auto, true or false"),
    "n-gie-chart-active-active": (R.gie_case(router_chart_ref="/srv/charts/inferencepool-v1.4.0.tgz", router_epp_pprof=True,
                                             router_epp_leader_election=False),
                                  "so ha-enable-leader-election set to false would stay true: leave router_chart_ref empty (the "
                                  "role's templates pass --name=false) or turn it on (router_epp_leader_election=true)."),
    "n-verifier-not-admitted": (R.case("vllm_cpu", "precise", "ClusterIP", model_server_http_allowed_peers=[{"labels": EPP_LLMD}],
                                       model_server_pod_monitor=False),
                                "The engines' NetworkPolicy admits their HTTP port only from"),
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("k8s-production"))
    cases = dict(POSITIVE, **dict((name, host) for name, (host, _msg) in NEGATIVE.items()))
    returncode, output, out = R.run_render(tmp, cases, callback="oneline")
    assert returncode != 0, output[-4000:]
    loaded = {}
    for name in POSITIVE:
        failed = [line for line in output.splitlines() if line.startswith(name + " | FAILED")]
        assert not failed, failed[0][:3000]
        loaded[name] = R.load_case(out, name)
    return {"cases": loaded, "output": output, "out": out}


def _docs(case, role, kind):
    return [d for d in case["manifests"].get(role, []) if d["kind"] == kind]


def _engine(case):
    deployment = _docs(case, "model_server", "Deployment")[0]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "engine"]
    return deployment, pod, container


def _sources(policy, port):
    """The pod label sets and CIDRs a NetworkPolicy admits to a port; None where a rule has no peers (every source)."""
    found = []
    for rule in policy["spec"]["ingress"]:
        if port in [p["port"] for p in rule.get("ports", [])]:
            if "from" not in rule:
                return None
            found += [(peer.get("podSelector", {}).get("matchLabels"),
                       peer.get("namespaceSelector", {}).get("matchLabels", {}).get("kubernetes.io/metadata.name"),
                       peer.get("ipBlock", {}).get("cidr")) for peer in rule["from"]]
    return found


@pytest.mark.parametrize("name, refusal", sorted((n, m) for n, (_h, m) in NEGATIVE.items()))
def test_each_refusal_is_one_sentence_before_anything_is_written(rendered, name, refusal):
    lines = [line for line in rendered["output"].splitlines() if line.startswith(name + " | FAILED")]
    assert lines, "%s was not refused" % name
    said = " ".join(lines[0].replace("\\n", " ").split())
    assert refusal in said, said[:2000]
    assert "Traceback" not in said
    assert not os.path.exists(os.path.join(rendered["out"], name, "model_server", "manifests.yaml")) \
        or name.startswith(("n-router", "n-gie", "n-verifier")), "a model_server refusal stops before anything is written"


def test_graceful_termination_vllm(rendered):
    deployment, pod, engine = _engine(rendered["cases"]["p-gpu-tp4-in-process"])
    args = engine["args"]
    assert args[args.index("--shutdown-timeout") + 1] == "45"
    assert engine["lifecycle"] == {"preStop": {"sleep": {"seconds": 15}}}
    assert pod["terminationGracePeriodSeconds"] == 75 == 15 + 45 + 15


def test_graceful_termination_sglang_has_no_flag_and_a_longer_grace(rendered):
    _deployment, pod, engine = _engine(rendered["cases"]["p-sglang"])
    assert not [a for a in engine["args"] if a.startswith("--shutdown-timeout")], "SGLang 0.5.12 has no such flag"
    assert pod["terminationGracePeriodSeconds"] == 80, "its drain is checked every 5 s"
    assert engine["lifecycle"]["preStop"]["sleep"]["seconds"] == 15


def test_sizing_follows_the_tensor_parallel_size_with_the_tier_and_shm(rendered):
    _deployment, pod, engine = _engine(rendered["cases"]["p-gpu-tp4-in-process"])
    resources = engine["resources"]
    assert resources["requests"] == {"cpu": "16", "memory": "164Gi", "nvidia.com/gpu": "4"}
    assert resources["limits"] == {"memory": "248Gi", "nvidia.com/gpu": "4"}, "32Gi x 4 + the 100 GB tier + 20Gi of /dev/shm"
    env = dict((e["name"], e.get("value")) for e in engine["env"])
    assert env["LMCACHE_MAX_LOCAL_CPU_SIZE"] == "100" and "ephemeral-storage" not in resources["requests"], "a claim, not an emptyDir"
    shm = [v for v in pod["volumes"] if v["name"] == "dshm"][0]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "20Gi"}
    _deployment, pod, engine = _engine(rendered["cases"]["p-gpu-mp-claim"])
    assert engine["resources"]["requests"]["memory"] == "16Gi" and engine["resources"]["limits"]["memory"] == "34Gi"


def test_weights_volume_claim_created_given_or_a_node_folder(rendered):
    case = rendered["cases"]["p-gpu-tp4-in-process"]
    (claim,) = _docs(case, "model_server", "PersistentVolumeClaim")
    assert claim["metadata"]["name"] == "model-server-model-cache"
    assert claim["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "50Gi"}}}
    _deployment, pod, _engine_container = _engine(case)
    assert [v for v in pod["volumes"] if v["name"] == "data"][0] == {
        "name": "data", "persistentVolumeClaim": {"claimName": "model-server-model-cache"}}
    case = rendered["cases"]["p-gpu-mp-claim"]
    assert not _docs(case, "model_server", "PersistentVolumeClaim"), "an existing claim is not created"
    _deployment, pod, _engine_container = _engine(case)
    assert [v for v in pod["volumes"] if v["name"] == "data"][0]["persistentVolumeClaim"] == {"claimName": "models-rwx"}
    case = rendered["cases"]["p-cpu-hostpath"]
    _deployment, pod, _engine_container = _engine(case)
    assert [v for v in pod["volumes"] if v["name"] == "data"][0]["hostPath"] == {"path": "/var/lib/models", "type": "DirectoryOrCreate"}
    (namespace,) = _docs(case, "model_server", "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_weights_default_to_an_empty_dir_with_a_limit_and_its_request(rendered):
    case = rendered["cases"]["p-llmd-one-replica"]
    _deployment, pod, engine = _engine(case)
    assert [v for v in pod["volumes"] if v["name"] == "data"][0] == {"name": "data", "emptyDir": {"sizeLimit": "10Gi"}}
    assert engine["resources"]["requests"]["ephemeral-storage"] == "10Gi"
    assert engine["resources"]["limits"]["memory"] == "12Gi", "10Gi + 2Gi of /dev/shm"
    env = dict((e["name"], e.get("value")) for e in engine["env"])
    assert env["HF_HOME"] == "/data/huggingface"


def test_placement_pdb_spread_and_the_gpu_product(rendered):
    case = rendered["cases"]["p-gpu-tp4-in-process"]
    deployment, pod, _engine_container = _engine(case)
    selector = deployment["spec"]["selector"]["matchLabels"]
    (pdb,) = _docs(case, "model_server", "PodDisruptionBudget")
    assert pdb["spec"] == {"maxUnavailable": 1, "unhealthyPodEvictionPolicy": "AlwaysAllow", "selector": {"matchLabels": selector}}
    (spread,) = pod["topologySpreadConstraints"]
    assert spread == {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
                      "labelSelector": {"matchLabels": selector}, "matchLabelKeys": ["pod-template-hash"]}
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": [
        "NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-80GB-HBM3-SHARED", "NVIDIA-H100-PCIe", "NVIDIA-H100-PCIe-SHARED"]}]}]
    assert "affinity" not in _engine(rendered["cases"]["p-sglang"])[1], "no GPU named, no product required"


def test_device_plugin_runs_gpu_feature_discovery():
    (name,) = [n for n in R.CASES if n == "gpu-inventory-nvkind"]
    assert name  # the values are held in test_render_kubernetes (rendered_cases); here the role's own table
    import yaml  # pylint: disable=import-outside-toplevel
    with open(os.path.join(R.ROOT, "roles", "nvidia_device_plugin", "defaults", "main.yml")) as handle:
        defaults = yaml.safe_load(handle)
    assert defaults["nvidia_device_plugin_gfd_enabled"] is True and defaults["nvidia_device_plugin_nfd_enabled"] is True


def test_pull_secrets_priority_class_and_pod_security(rendered):
    case = rendered["cases"]["p-gpu-tp4-in-process"]
    _deployment, pod, _engine_container = _engine(case)
    assert pod["imagePullSecrets"] == [{"name": "regcred"}] and pod["priorityClassName"] == "inference-high"
    (priority,) = _docs(case, "model_server", "PriorityClass")
    assert priority["value"] == 1000000 and priority["globalDefault"] is False
    (namespace,) = _docs(case, "model_server", "Namespace")
    assert {k: v for k, v in namespace["metadata"]["labels"].items() if k.startswith("pod-security")} == {
        "pod-security.kubernetes.io/enforce": "baseline", "pod-security.kubernetes.io/audit": "restricted",
        "pod-security.kubernetes.io/warn": "restricted"}, "baseline with the llm-d charts: their EPP pod sets no securityContext"
    (job,) = _docs(case, "cluster_verify", "Job")
    assert job["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}], "the verifier runs the engines' image"
    gie = rendered["cases"]["p-gie-active-active"]
    (namespace,) = _docs(gie, "model_server", "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_the_gie_epp_meets_pod_security_restricted(rendered):
    case = rendered["cases"]["p-gie-active-active"]
    (deployment,) = _docs(case, "router", "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                      "seccompProfile": {"type": "RuntimeDefault"}}
    (container,) = pod["containers"]
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    assert pod["imagePullSecrets"] == [{"name": "regcred"}] and pod["priorityClassName"] == "router-high"


def test_router_active_active_or_leader_election(rendered):
    # GIE active-active on request: no leader election, every replica Ready, rolled one at a time, a PDB.
    case = rendered["cases"]["p-gie-active-active"]
    (deployment,) = _docs(case, "router", "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert deployment["spec"]["replicas"] == 2 and "--ha-enable-leader-election" not in args
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"]["service"] == "inference-extension"
    assert "Role" not in [d["kind"] for d in _docs(case, "router", "Role") if d["metadata"]["name"].endswith("leader-election")]
    (pdb,) = _docs(case, "router", "PodDisruptionBudget")
    assert pdb["spec"]["selector"] == {"matchLabels": EPP_GIE} and pdb["spec"]["maxUnavailable"] == 1
    anti = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["podAffinityTerm"] == {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": EPP_GIE}}
    # llm-d precise (the example): active-active through the chart's flags, after its own --ha-enable-leader-election.
    case = rendered["cases"]["p-gpu-tp4-in-process"]
    epp = case["router_values"]["router"]["epp"]
    assert epp["replicas"] == 2 and epp["flags"]["ha-enable-leader-election"] is False
    assert [d["metadata"]["name"] for d in _docs(case, "router", "PodDisruptionBudget")] == ["inference-cache-router-epp"]
    # One replica: nothing of either.
    case = rendered["cases"]["p-llmd-one-replica"]
    assert "ha-enable-leader-election" not in case["router_values"]["router"]["epp"]["flags"]
    assert not _docs(case, "router", "PodDisruptionBudget")


def test_the_precise_index_is_capped_and_sizes_the_epp(rendered):
    case = rendered["cases"]["p-gpu-tp4-in-process"]
    producer = [p for p in case["epp_config"]["plugins"] if p["type"] == "precise-prefix-cache-producer"][0]
    assert producer["parameters"]["indexerConfig"]["kvBlockIndexConfig"]["inMemoryConfig"] == {"size": 1000000, "podCacheSize": 10}
    resources = {"requests": {"cpu": "500m", "memory": "5Gi"}, "limits": {"memory": "10Gi"}}
    assert case["router_values"]["router"]["epp"]["resources"] == resources


def test_monitoring_and_the_scraper_admitted(rendered):
    case = rendered["cases"]["p-gpu-mp-claim"]
    (monitor,) = _docs(case, "model_server", "PodMonitor")
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["http", "lmcache-http"]
    _deployment, pod, _engine_container = _engine(case)
    sidecar = [c for c in pod["initContainers"] if c["name"] == "lmcache-server"][0]
    assert sidecar["args"][sidecar["args"].index("--http-host") + 1] == "0.0.0.0"
    assert sidecar["ports"] == [{"name": "lmcache-http", "containerPort": 8080, "protocol": "TCP"}]
    (policy,) = _docs(case, "model_server", "NetworkPolicy")
    assert _sources(policy, 8080) == [(PROMETHEUS, "monitoring", None)], "the LMCache admin port: the scraper only"
    assert (PROMETHEUS, "monitoring", None) in _sources(policy, 8000)
    # Off: the LMCache server back on 127.0.0.1 of the pod, no PodMonitor.
    case = rendered["cases"]["p-cpu-hostpath"]
    assert not _docs(case, "model_server", "PodMonitor")
    (monitor,) = _docs(rendered["cases"]["p-llmd-one-replica"], "router", "PodMonitor")
    assert monitor["spec"] == {"selector": {"matchLabels": EPP_LLMD},
                               "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "30s"}]}


def test_the_engines_http_port_is_open_only_to_the_router_gateway_verifier_and_scraper(rendered):
    (policy,) = _docs(rendered["cases"]["p-llmd-one-replica"], "model_server", "NetworkPolicy")
    assert _sources(policy, 8000) == [(EPP_LLMD, None, None), (VERIFIER, None, None), (PROMETHEUS, "monitoring", None)]
    (policy,) = _docs(rendered["cases"]["p-gie-active-active"], "model_server", "NetworkPolicy")
    assert _sources(policy, 8000) == [(EPP_GIE, None, None), (GATEWAY, None, None), (VERIFIER, None, None),
                                      (PROMETHEUS, "monitoring", None)]


def test_the_vllm_stack_chart_gets_what_it_has_values_for(rendered):
    values = rendered["cases"]["p-chart"]
    import yaml  # pylint: disable=import-outside-toplevel
    with open(os.path.join(rendered["out"], "p-chart", "model_server", "helm", "vllm-stack.values.yaml")) as handle:
        values = yaml.safe_load(handle)
    spec = values["servingEngineSpec"]["modelSpec"][0]
    assert spec["shmSize"] == "20Gi" and spec["pvcStorage"] == "50Gi" and spec["pvcAccessMode"] == ["ReadWriteMany"]
    assert spec["priorityClassName"] == "inference-high" and spec["imagePullSecret"] == "regcred"
    extra = spec["vllmConfig"]["extraArgs"]
    assert extra[extra.index("--shutdown-timeout") + 1] == "25", "within the chart's 30 s grace period"
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["key"] == "nvidia.com/gpu.product"


@pytest.mark.skipif(kubernetes_validate is None, reason="kubernetes-validate is not installed")
def test_every_builtin_object_validates_at_the_kwok_clusters_kubernetes(rendered):
    checked = 0
    for name, case in sorted(rendered["cases"].items()):
        for doc in case["docs"]:
            if doc["kind"] in ("PodMonitor", "InferencePool", "HTTPRoute", "DestinationRule", "HealthCheckPolicy", "GCPBackendPolicy"):
                continue
            try:
                kubernetes_validate.validate(doc, "1.33.0", strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail("%s: %s/%s is invalid for Kubernetes 1.33: %s" % (name, doc["kind"], doc["metadata"]["name"], exc))
            checked += 1
    assert checked > 50
