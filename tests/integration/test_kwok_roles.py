# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""model_server and cluster_verify against a real API server: a kwok cluster of roles/kwok_cluster (issue 28).

* model_server and ``.spec.replicas`` owned by another field manager (an autoscaler, ``kubectl scale``; here the scale
  subresource patched with field manager ``hpa-test``, as both do): with ``model_server_replicas_managed_externally`` the
  role leaves the field alone (changed=0, no error, the other manager's count kept); without it the role stops with one
  sentence naming that manager and the variable, and never forces the field back. Leaving a count the role's own apply
  held keeps it (no reset to the API's default of 1), and a Deployment the role creates gets its first size once.
* cluster_verify: after a run the verifier Job (with its pod) and ConfigMap are gone unless ``cluster_verify_keep_job``;
  a second run reports changed=0. (kwok runs no container, so the Job's pod leaves no report: ``cluster_verify_simulated_nodes``
  warn.)

The cluster has a name and ports of its own (``SUBSTRATE_KWOK_ROLES_NAME``, ``SUBSTRATE_KWOK_ROLES_API_PORT``: the other
five ports follow the API port) and the binaries of the same state folder as test_kwok_cluster.py (built once per
version; a run that finds a build in progress waits on its lock, as make test's go-build stage and test_kwok_cluster.py
may both be building them). Without Go and without the binaries, the tests that need the cluster skip with that reason.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAME = os.environ.get("SUBSTRATE_KWOK_ROLES_NAME", "substrate-kwok-roles")
API_PORT = int(os.environ.get("SUBSTRATE_KWOK_ROLES_API_PORT", "18443"))
PORTS = {"kwok_cluster_api_port": API_PORT, "kwok_cluster_etcd_port": API_PORT - 64, "kwok_cluster_etcd_peer_port": API_PORT - 63,
         "kwok_cluster_controller_manager_port": API_PORT - 186, "kwok_cluster_scheduler_port": API_PORT - 184,
         "kwok_cluster_kwok_port": API_PORT - 196}
STATE_DIR = os.path.join(os.environ.get("HOME", "/root"), ".cache", "inference_cache", "kwok_cluster")
with open(os.path.join(ROOT, "vars", "pinned_versions.yml")) as _handle:
    TOOLS = yaml.safe_load(_handle)["tools"]
# The builds a running cluster needs (roles/kwok_cluster: bin/<build>-<version>/).
BUILDS = {"kubernetes": ["kube-apiserver", "kube-controller-manager", "kube-scheduler"], "etcd": ["etcd"], "kwok": ["kwok"]}
# Built with them for the production objects' test: the InferencePool CRDs (gie) and the Prometheus Operator's monitoring
# CRDs, which kwok_cluster applies (make test's go-build stage builds both beside the tests).
CRD_BUILDS = ["gie", "prometheus-operator-crds"]
GIE_CRDS = os.path.join(STATE_DIR, "bin", "gie-%s" % TOOLS["gateway_api_inference_extension"], "inferencepool-crds.yaml")
OTHER_MANAGER = "hpa-test"
PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: The role under test
      ansible.builtin.include_role:
        name: "inference_cache.substrate.{{ _test_role_name }}"
      loop: "{{ _test_roles | default([_test_role]) }}"
      loop_control:
        loop_var: _test_role_name
"""


def _missing_binaries():
    return ["%s-%s/%s" % (build, TOOLS[build], binary) for build, binaries in sorted(BUILDS.items()) for binary in binaries
            if not os.path.isfile(os.path.join(STATE_DIR, "bin", "%s-%s" % (build, TOOLS[build]), binary))]


def _go_version():
    go = shutil.which("go")
    if not go:
        return None
    out = subprocess.run([go, "env", "GOVERSION"], stdout=subprocess.PIPE, universal_newlines=True, check=False).stdout
    match = re.match(r"go(\d+)\.(\d+)", out.strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


def _env():
    return dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1",
                ANSIBLE_DEPRECATION_WARNINGS="0")


def run_role(tmp_path, role, *extra_args, **variables):
    """One ansible-playbook run of one role on localhost: (returncode, output, PLAY RECAP counts)."""
    playbook = tmp_path / "role.yml"
    playbook.write_text(PLAYBOOK)
    variables = dict(variables, _test_role=role, ansible_python_interpreter=sys.executable)
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook),
           "-e", json.dumps(variables)] + list(extra_args)
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                          check=False)
    recap = re.search(r"localhost\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", proc.stdout)
    counts = dict(zip(("ok", "changed", "unreachable", "failed"), map(int, recap.groups()))) if recap else {}
    return proc.returncode, proc.stdout, counts


def _kwok(tmp_path, **extra):
    variables = dict(PORTS, kwok_cluster_name=NAME, kwok_cluster_builds=sorted(BUILDS) + CRD_BUILDS, kwok_cluster_build_helm=False)
    variables.update(extra)
    return run_role(tmp_path, "kwok_cluster", **variables)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    missing = _missing_binaries()
    if missing and not _go_version():
        pytest.skip("the kwok cluster's binaries are not built (missing under %s/bin: %s) and there is no go on PATH to build "
                    "them from the Go module proxy (Go 1.24+; make go-build)" % (STATE_DIR, ", ".join(missing)))
    tmp = tmp_path_factory.mktemp("kwok-roles")
    code, output, unused_counts = _kwok(tmp)
    assert code == 0, output[-6000:]
    kubeconfig = os.path.join(STATE_DIR, "clusters", NAME, "kubeconfig")
    assert os.path.isfile(kubeconfig), output[-4000:]
    from kubernetes import config  # pylint: disable=import-outside-toplevel
    try:
        yield {"tmp": tmp, "kubeconfig": kubeconfig, "context": "kwok-" + NAME, "api": config.new_client_from_config(kubeconfig)}
    finally:
        code, output, unused_counts = _kwok(tmp, kwok_cluster_state="absent")
        assert code == 0, output[-4000:]


def engines(cluster, namespace, name, **extra):
    """model_server variables for an engine Deployment of its own on the kwok cluster (one namespace per test)."""
    variables = {"model_server_kubeconfig": cluster["kubeconfig"], "model_server_kube_context": cluster["context"],
                 "model_server_allow_unpinned_images": True, "model_server_namespace": namespace, "model_server_name": name,
                 "model_server_replicas": 2, "model_server_max_model_len": 2048, "model_server_wait_timeout": 180}
    variables.update(extra)
    return variables


def _apps(cluster):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    return client.AppsV1Api(cluster["api"])


def deployment(cluster, namespace, name):
    return _apps(cluster).read_namespaced_deployment(name, namespace)


def scale_as_another_manager(cluster, namespace, name, replicas):
    """What an HPA or kubectl scale does: an update of the scale subresource, under a field manager of its own."""
    _apps(cluster).patch_namespaced_deployment_scale(name, namespace, {"spec": {"replicas": replicas}}, field_manager=OTHER_MANAGER)


def replicas_owners(dep):
    """The field managers whose managed fields hold .spec.replicas."""
    return sorted({entry.manager for entry in dep.metadata.managed_fields or []
                   if "f:replicas" in ((entry.fields_v1 or {}).get("f:spec") or {})})


def _sentence(output):
    return " ".join(output.split())


# No cluster needed: what render mode writes.
@pytest.mark.parametrize("external", [False, True])
def test_the_rendered_deployment_carries_replicas_unless_managed_externally(tmp_path, external):
    code, output, unused_counts = run_role(tmp_path, "model_server", model_server_render_dir=str(tmp_path / "out"),
                                           model_server_allow_unpinned_images=True, model_server_replicas=3,
                                           model_server_replicas_managed_externally=external)
    assert code == 0, output[-4000:]
    with open(str(tmp_path / "out" / "model_server" / "manifests.yaml")) as handle:
        (dep,) = [doc for doc in yaml.safe_load_all(handle) if doc and doc["kind"] == "Deployment"]
    if external:
        assert "replicas" not in dep["spec"], "server-side apply must not claim .spec.replicas"
    else:
        assert dep["spec"]["replicas"] == 3


def test_replicas_set_by_another_manager_stop_the_role_in_one_sentence_or_are_left_alone(cluster):
    tmp, ns, name = cluster["tmp"], "kwok-replicas", "engines"
    code, output, counts = run_role(tmp, "model_server", **engines(cluster, ns, name))
    assert code == 0 and counts["changed"] > 0, output[-4000:]
    code, output, counts = run_role(tmp, "model_server", **engines(cluster, ns, name))
    assert code == 0 and counts["changed"] == 0, output[-4000:]
    scale_as_another_manager(cluster, ns, name, 3)
    assert OTHER_MANAGER in replicas_owners(deployment(cluster, ns, name))

    # Not asked: the role stops with one sentence (no traceback) and forces nothing back.
    code, output, counts = run_role(tmp, "model_server", **engines(cluster, ns, name))
    assert code != 0 and "Traceback" not in output, output[-4000:]
    said = _sentence(output)
    assert ('Deployment kwok-replicas/engines: .spec.replicas belongs to field manager "hpa-test" (such as an autoscaler or kubectl '
            'scale; it set 3), and server-side apply does not take it back for model_server_replicas=2; set '
            'model_server_replicas_managed_externally=true to leave the replicas to it, or model_server_replicas=3 to agree with '
            'it.') in said, output[-4000:]
    assert deployment(cluster, ns, name).spec.replicas == 3

    # Asked: no error, no change, the other manager's count kept, and the role claims nothing of it.
    for attempt in (1, 2):
        code, output, counts = run_role(tmp, "model_server", **engines(cluster, ns, name, model_server_replicas_managed_externally=True))
        assert code == 0, output[-4000:]
        assert counts["changed"] == 0, "run %d: %s\n%s" % (attempt, counts, output[-4000:])
        dep = deployment(cluster, ns, name)
        assert dep.spec.replicas == 3 and dep.status.ready_replicas == 3, "the rollout wait expects the autoscaler's 3"
        assert replicas_owners(dep) == [OTHER_MANAGER]
    # And scaled again while the role is not looking: still nothing to change.
    scale_as_another_manager(cluster, ns, name, 1)
    code, output, counts = run_role(tmp, "model_server", **engines(cluster, ns, name, model_server_replicas_managed_externally=True))
    assert code == 0 and counts["changed"] == 0, output[-4000:]
    assert deployment(cluster, ns, name).spec.replicas == 1


def test_leaving_a_count_the_role_held_keeps_it(cluster):
    """The role's apply owned .spec.replicas: dropping the field alone would reset it to 1. It is handed over first."""
    tmp, ns, name = cluster["tmp"], "kwok-handover", "engines"
    code, output, counts = run_role(tmp, "model_server", **engines(cluster, ns, name))
    assert code == 0, output[-4000:]
    assert replicas_owners(deployment(cluster, ns, name)) == ["inference-cache-substrate"]
    code, output, counts = run_role(tmp, "model_server", **engines(cluster, ns, name, model_server_replicas_managed_externally=True))
    assert code == 0 and counts["changed"] > 0, output[-4000:]
    dep = deployment(cluster, ns, name)
    assert dep.spec.replicas == 2, "never reset to the API's default"
    assert replicas_owners(dep) == ["inference-cache-substrate-replicas"]
    code, output, counts = run_role(tmp, "model_server", **engines(cluster, ns, name, model_server_replicas_managed_externally=True))
    assert code == 0 and counts["changed"] == 0, output[-4000:]
    scale_as_another_manager(cluster, ns, name, 4)
    code, output, counts = run_role(tmp, "model_server", **engines(cluster, ns, name, model_server_replicas_managed_externally=True))
    assert code == 0 and counts["changed"] == 0, output[-4000:]
    assert deployment(cluster, ns, name).spec.replicas == 4
    # Back to the role owning the count, at a value the other manager's agrees with: no conflict, the role's count.
    code, output, counts = run_role(tmp, "model_server", **engines(cluster, ns, name, model_server_replicas=4))
    assert code == 0, output[-4000:]
    assert "inference-cache-substrate" in replicas_owners(deployment(cluster, ns, name))


def test_a_deployment_created_with_external_replicas_gets_its_first_size_once(cluster):
    tmp, ns, name = cluster["tmp"], "kwok-new", "engines"
    variables = engines(cluster, ns, name, model_server_replicas=2, model_server_replicas_managed_externally=True)
    code, output, counts = run_role(tmp, "model_server", **variables)
    assert code == 0 and counts["changed"] > 0, output[-4000:]
    dep = deployment(cluster, ns, name)
    assert dep.spec.replicas == 2 and replicas_owners(dep) == ["inference-cache-substrate-replicas"]
    code, output, counts = run_role(tmp, "model_server", **variables)
    assert code == 0 and counts["changed"] == 0, output[-4000:]
    scale_as_another_manager(cluster, ns, name, 3)
    code, output, counts = run_role(tmp, "model_server", **variables)
    assert code == 0 and counts["changed"] == 0, output[-4000:]
    assert deployment(cluster, ns, name).spec.replicas == 3


def test_status_written_while_the_role_runs_is_not_a_change(cluster):
    """A controller writes .status (and its managed-fields entry) whenever it likes: kubernetes.core compares the object
    it read with the one its apply returns, so an update landing between the two used to count as the role's change
    (a second run reported changed=1 in CI). Here another writer updates the status without a pause for the whole run."""
    tmp, ns, name = cluster["tmp"], "kwok-status", "engines"
    variables = engines(cluster, ns, name)
    code, output, counts = run_role(tmp, "model_server", **variables)
    assert code == 0 and counts["changed"] > 0, output[-4000:]
    apps, stop, writes = _apps(cluster), threading.Event(), []

    def write_status():
        while not stop.is_set():
            condition = {"type": "SubstrateStatusWriter", "status": "True", "message": str(len(writes))}
            apps.patch_namespaced_deployment_status(name, ns, {"status": {"conditions": [condition]}}, field_manager="status-test")
            writes.append(1)

    writer = threading.Thread(target=write_status, daemon=True)
    writer.start()
    try:
        code, output, counts = run_role(tmp, "model_server", **variables)
    finally:
        stop.set()
        writer.join(30)
    assert len(writes) > 10, "the status writer made %d writes" % len(writes)
    assert code == 0 and counts["changed"] == 0, output[-4000:]


def _verifier_objects(cluster, namespace):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    batch, core = client.BatchV1Api(cluster["api"]), client.CoreV1Api(cluster["api"])
    jobs = [j.metadata.name for j in batch.list_namespaced_job(namespace).items]
    maps = [c.metadata.name for c in core.list_namespaced_config_map(namespace).items if c.metadata.name == "kv-events-verifier"]
    pods = [p.metadata.name for p in core.list_namespaced_pod(namespace, label_selector="job-name=kv-events-verifier").items]
    return jobs, maps, pods


def test_the_verifier_leaves_no_job_configmap_or_pod_unless_kept(cluster):
    tmp, ns = cluster["tmp"], "kwok-verify"
    code, output, unused_counts = run_role(tmp, "model_server", **engines(cluster, ns, "engines", model_server_replicas=1))
    assert code == 0, output[-4000:]
    verify = {"cluster_verify_kubeconfig": cluster["kubeconfig"], "cluster_verify_kube_context": cluster["context"],
              "cluster_verify_allow_unpinned_images": True, "cluster_verify_simulated_nodes": "warn",
              "cluster_verify_checks": ["kv_events", "prefix_cache"], "cluster_verify_timeout": 120,
              "cluster_verify_engine": {"namespace": ns, "kv_events_service": "engines-kv-events", "kv_events_enabled": True,
                                        "replicas": 1, "image": "docker.io/vllm/vllm-openai-cpu:v0.32.0"}}
    for attempt in (1, 2):
        code, output, counts = run_role(tmp, "cluster_verify", **verify)
        assert code == 0, output[-4000:]
        assert counts["changed"] == 0, "run %d: %s\n%s" % (attempt, counts, output[-4000:])
        assert _verifier_objects(cluster, ns) == ([], [], []), "the Job (with its pod) and the ConfigMap are removed"
        said = _sentence(output)
        assert ("Job kwok-verify/kv-events-verifier (with its pod) and ConfigMap kwok-verify/kv-events-verifier were removed "
                "(cluster_verify_keep_job=false); the report is the fact cluster_verify_report") in said, output[-4000:]
    code, output, counts = run_role(tmp, "cluster_verify", **dict(verify, cluster_verify_keep_job=True))
    assert code == 0 and counts["changed"] == 0, output[-4000:]
    jobs, maps, pods = _verifier_objects(cluster, ns)
    assert (jobs, maps, len(pods)) == (["kv-events-verifier"], ["kv-events-verifier"], 1), "kept for kubectl logs"
    assert "are kept (cluster_verify_keep_job=true): kubectl logs -n kwok-verify job/kv-events-verifier" in _sentence(output)
    # The next run without keep_job replaces them and removes them again.
    code, output, counts = run_role(tmp, "cluster_verify", **verify)
    assert code == 0 and counts["changed"] == 0, output[-4000:]
    assert _verifier_objects(cluster, ns) == ([], [], [])


# The GPU memory plan of model_server (roles/model_server/tasks/sizing.yml): what it plans for, from what.
LLAMA31_8B = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
              "intermediate_size": 14336, "vocab_size": 128256, "torch_dtype": "bfloat16"}


def _sizing(**sizing):
    return {"model_server_profile": "vllm_lmcache", "model_server_allow_unpinned_images": True, "model_server_max_model_len": 131072,
            "model_server_sizing": dict({"parameters": "8.03B", "model_config": LLAMA31_8B}, **sizing)}


def _planned(output):
    # the YAML callback quotes the message in single quotes, doubling the quotes inside it
    found = re.findall(r"msg: '((?:[^']|'')*tokens fit per\s+replica(?:[^']|'')*)'", output)
    return " ".join(found[-1].replace("''", "'").split()) if found else ""


# No cluster needed: render mode plans from model_server_sizing and the engine's flags only.
def test_the_plan_reads_the_engine_flags_and_tells_a_datasheet_figure(tmp_path):
    code, output, unused_counts = run_role(tmp_path, "model_server", model_server_render_dir=str(tmp_path / "out"),
                                           model_server_extra_args=["--max-num-batched-tokens", "4096", "--max-num-seqs=64"],
                                           **_sizing(gpu_memory="141GB"))
    assert code == 0, output[-4000:]
    assert ("gpu_memory 141GB (131.32 GiB) is the datasheet figure of an H200, but CUDA reports 139.80 GiB on that card"
            in _sentence(output)), output[-4000:]
    planned = _planned(output)
    assert planned.startswith("H200: 139.8 GiB per GPU as CUDA reports it (from model_server_sizing).") and "a 4096-token batch" in planned
    # No GPU named: render mode reads no nodes, so it plans nothing and says so (the settings check of kubernetes.yml renders).
    code, output, unused_counts = run_role(tmp_path, "model_server", model_server_render_dir=str(tmp_path / "out"), **_sizing())
    assert code == 0 and not _planned(output), output[-4000:]
    assert ("No GPU memory plan: model_server_sizing names no gpu (a product such as H100-80GB) and no gpu_memory, and render "
            "mode reads no cluster") in _sentence(output), output[-4000:]


def test_the_plan_reads_gpu_feature_discoverys_memory_label(cluster):
    """Without a GPU in model_server_sizing, the smallest nvidia.com/gpu.memory of the nodes the engines may run on."""
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    nodes = client.CoreV1Api(cluster["api"])
    labels = {"gpu-plan-test": "h200", "nvidia.com/gpu.memory": "143771", "nvidia.com/gpu.product": "NVIDIA-H200"}
    others = {"gpu-plan-test": "other", "nvidia.com/gpu.memory": "81559"}  # not selected by model_server_node_selector
    created = []
    try:
        for name, node_labels in (("gpu-plan-h200", labels), ("gpu-plan-h100", others)):
            nodes.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": node_labels}})
            created.append(name)
        variables = engines(cluster, "kwok-gpu-plan", "engines", model_server_node_selector={"gpu-plan-test": "h200"})
        variables.update(_sizing())
        code, output, counts = run_role(cluster["tmp"], "model_server", "--skip-tags", "model_server_render,model_server_deploy",
                                        **variables)
        assert code == 0 and counts["changed"] == 0, output[-4000:]
        planned = _planned(output)
        assert planned.startswith("H200: 139.8 GiB per GPU as CUDA reports it (from the nodes' nvidia.com/gpu.memory label, 143771 "
                                  "MiB)."), output[-4000:]
        assert "CUDA reports" not in output.split("Sizing | report the plan")[0].split("Sizing | plan GPU memory")[-1]
        # No node of that selection carries the label: one sentence, before anything is applied.
        variables["model_server_node_selector"] = {"gpu-plan-test": "absent"}
        code, output, counts = run_role(cluster["tmp"], "model_server", "--skip-tags", "model_server_render,model_server_deploy",
                                        **variables)
        assert code != 0 and ("model_server_sizing names no gpu (a product such as H100-80GB) and no gpu_memory, and no node the "
                              "engines may run on carries GPU feature discovery's nvidia.com/gpu.memory label") in _sentence(output)
    finally:
        for name in created:
            nodes.delete_node(name)


# The Kubernetes path as a team runs it in production (issue 46), on the API server: every object and field the roles
# render, applied, admitted (Pod Security restricted enforced, the PriorityClass, the claim bound, the PodMonitors'
# CRDs served) and the Deployments Ready, placed by the scheduler on the node of the GPU product planned for.
H100_NODE = {"name": "kwok-h100-0", "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.present": "true"},
             "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8", "ephemeral-storage": "1Ti"}}
QWEN3_8B = {"num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 4096,
            "intermediate_size": 12288, "vocab_size": 151936, "torch_dtype": "bfloat16"}


def _production(cluster, ns):
    variables = engines(cluster, ns, "engines", model_server_profile="vllm_lmcache", model_server_tensor_parallel_size=2,
                        model_server_lmcache_mode="in_process", model_server_lmcache_max_local_cpu_size=8,
                        model_server_sizing={"parameters": "8.2B", "gpu": "H100-80GB", "model_config": QWEN3_8B},
                        model_server_model_cache_type="pvc", model_server_model_cache_storage_class="kwok-static",
                        model_server_image_pull_secrets=["regcred"], model_server_priority_class_name="substrate-engines",
                        model_server_priority_class_value=100000, model_server_pod_monitor=True)
    variables.update({"router_kubeconfig": cluster["kubeconfig"], "router_kube_context": cluster["context"], "router_impl": "gie",
                      "router_scoring_mode": "approximate", "router_allow_unpinned_images": True, "router_crds_src": GIE_CRDS,
                      "router_epp_leader_election": False, "router_pod_monitor": True, "router_image_pull_secrets": ["regcred"],
                      "router_wait_timeout": 180,
                      # The verifier's Job with the engines' pull secret, admitted by their NetworkPolicy (its pod is simulated).
                      "cluster_verify_kubeconfig": cluster["kubeconfig"], "cluster_verify_kube_context": cluster["context"],
                      "cluster_verify_allow_unpinned_images": True, "cluster_verify_simulated_nodes": "warn",
                      "cluster_verify_checks": ["kv_events", "prefix_cache"], "cluster_verify_timeout": 120, "cluster_verify_keep_job": True,
                      "_test_roles": ["model_server", "router", "cluster_verify"]})
    return variables


def test_production_objects_run_on_the_api_server(cluster):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    from kubernetes.client.rest import ApiException  # pylint: disable=import-outside-toplevel
    core, apps, policy = client.CoreV1Api(cluster["api"]), _apps(cluster), client.PolicyV1Api(cluster["api"])
    custom, scheduling = client.CustomObjectsApi(cluster["api"]), client.SchedulingV1Api(cluster["api"])
    ns = "kwok-production"
    metadata = {"name": H100_NODE["name"], "labels": H100_NODE["labels"], "annotations": {"kwok.x-k8s.io/node": "fake"}}
    node = {"apiVersion": "v1", "kind": "Node", "metadata": metadata,
            "status": {"capacity": H100_NODE["capacity"], "allocatable": H100_NODE["capacity"]}}
    # What a cluster's provisioner would give the claim the role creates: a volume of the claim's class to bind.
    volume = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "kwok-static-models"},
              "spec": {"capacity": {"storage": "100Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "kwok-static",
                       "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": "/var/lib/kwok-models"}}}
    created = []
    try:
        core.create_node(node)
        created.append(("node", H100_NODE["name"]))
        core.create_persistent_volume(volume)
        created.append(("pv", "kwok-static-models"))
        variables = _production(cluster, ns)   # model_server, then router (router_impl gie, its CRDs generated)
        code, output, counts = run_role(cluster["tmp"], "model_server", **variables)
        assert code == 0 and counts["changed"] > 0, output[-6000:]
        code, output, counts = run_role(cluster["tmp"], "model_server", **variables)
        assert code == 0 and counts["changed"] == 0, "a second run changes nothing: %s\n%s" % (counts, output[-4000:])

        # Pod Security: the namespace enforces restricted (router_impl gie), and every pod the roles run passed it.
        labels = core.read_namespace(ns).metadata.labels
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted", labels
        bare = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "not-restricted"},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
        with pytest.raises(ApiException) as refused:
            core.create_namespaced_pod(ns, bare)
        reason = json.loads(refused.value.body)["message"]
        assert refused.value.status == 403 and 'violates PodSecurity "restricted:' in reason, reason

        # The engines: Ready, on the H100 node (the GPU product affinity), the claim bound, preStop, grace, sizing.
        dep = deployment(cluster, ns, "engines")
        assert dep.status.ready_replicas == 2, dep.status
        pods = core.list_namespaced_pod(ns, label_selector="app.kubernetes.io/name=engines").items
        assert sorted(p.spec.node_name for p in pods) == [H100_NODE["name"]] * 2 and all(p.status.phase == "Running" for p in pods)
        spec = pods[0].spec
        engine = [c for c in spec.containers if c.name == "engine"][0]
        assert spec.termination_grace_period_seconds == 75 and engine.lifecycle.pre_stop.sleep.seconds == 15
        assert engine.args[engine.args.index("--shutdown-timeout") + 1] == "45"
        assert engine.resources.requests == {"cpu": "8", "memory": "40Gi", "nvidia.com/gpu": "2"}
        assert engine.resources.limits == {"memory": "92Gi", "nvidia.com/gpu": "2"}
        assert spec.priority_class_name == "substrate-engines" and spec.priority == 100000
        assert [s.name for s in spec.image_pull_secrets] == ["regcred"]
        assert spec.topology_spread_constraints[0].topology_key == "kubernetes.io/hostname"
        claim = core.read_namespaced_persistent_volume_claim("engines-model-cache", ns)
        assert claim.status.phase == "Bound" and claim.spec.access_modes == ["ReadWriteMany"], claim.status
        assert [v.persistent_volume_claim.claim_name for v in spec.volumes if v.name == "data"] == ["engines-model-cache"]
        assert scheduling.read_priority_class("substrate-engines").value == 100000
        # The disruption controller counts the budget's pods (asynchronously, within seconds).
        deadline = time.monotonic() + 60
        while True:
            budget = policy.read_namespaced_pod_disruption_budget("engines", ns)
            if (budget.status.expected_pods, budget.status.current_healthy) == (2, 2) or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert budget.spec.max_unavailable == 1 and budget.status.expected_pods == 2 and budget.status.disruptions_allowed == 1, budget.status

        # The router: two active-active GIE EPP replicas Ready, their PDB, the restricted securityContext admitted.
        epp = deployment(cluster, ns, "inference-cache-router-epp")
        assert epp.spec.replicas == 2 and epp.status.ready_replicas == 2, epp.status
        assert "--ha-enable-leader-election" not in epp.spec.template.spec.containers[0].args
        assert epp.spec.template.spec.security_context.run_as_non_root is True
        assert policy.read_namespaced_pod_disruption_budget("inference-cache-router-epp", ns).spec.max_unavailable == 1

        # Monitoring: both PodMonitors applied where the Prometheus Operator's CRDs (generated from its module) are served.
        monitors = custom.list_namespaced_custom_object("monitoring.coreos.com", "v1", ns, "podmonitors")["items"]
        assert sorted(m["metadata"]["name"] for m in monitors) == ["engines", "inference-cache-router-epp"], monitors
        # The verifier's Job ran (simulated) with the engines' pull secret, under Pod Security restricted.
        (job_pod,) = core.list_namespaced_pod(ns, label_selector="job-name=kv-events-verifier").items
        assert [secret.name for secret in job_pod.spec.image_pull_secrets] == ["regcred"], job_pod.spec.image_pull_secrets
    finally:
        for kind, name in reversed(created):
            try:
                (core.delete_node if kind == "node" else core.delete_persistent_volume)(name)
            except ApiException:
                pass


def test_a_hostpath_model_cache_runs_at_pod_security_privileged(cluster):
    """A node's folder for the weights: admitted where the namespace enforces privileged (baseline and restricted refuse
    hostPath volumes: the role refuses it there in one sentence, test_render_k8s_production.py)."""
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    ns = "kwok-hostpath"
    variables = engines(cluster, ns, "engines", model_server_replicas=1, model_server_model_cache_type="hostPath",
                        model_server_model_cache_host_path="/var/lib/substrate-models", model_server_pod_security_level="privileged",
                        model_server_pod_monitor=False)
    code, output, counts = run_role(cluster["tmp"], "model_server", **variables)
    assert code == 0 and counts["changed"] > 0, output[-4000:]
    assert client.CoreV1Api(cluster["api"]).read_namespace(ns).metadata.labels["pod-security.kubernetes.io/enforce"] == "privileged"
    dep = deployment(cluster, ns, "engines")
    assert dep.status.ready_replicas == 1
    (data,) = [v for v in dep.spec.template.spec.volumes if v.name == "data"]
    assert data.host_path.path == "/var/lib/substrate-models" and data.host_path.type == "DirectoryOrCreate"
