# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The Kubernetes roles' real task files without a cluster: the GPU wait and node labels, charts and CRDs from a path or a
mirror, the verifier Job's lifecycle and the wiring contract (first written for issue 20's defects 1, 4, 5, 7b and 8).

The roles run unchanged through ``ansible-playbook``; only the cluster calls are answered by a stand-in
``kubernetes.core`` collection put first on the collections path (tests only: its action plugins return the responses
each case gives per task name and record every call), and ``helm`` is a script that knows the charts a case makes
available. What runs for real: the roles' variables and Jinja expressions, their task order, ``when``, ``until``,
``changed_when``, ``failed_when``, ``ansible.builtin.get_url`` (file:// mirrors), ``stat``, ``fail`` and ``assert``.

* 1: the GPU wait counts nodes whose ``status.allocatable`` has ``nvidia.com/gpu`` other than "0" (the dotted resource
  name read as a key) and publishes ``nvidia_device_plugin_gpu_nodes``;
* 4: with ``nvidia_device_plugin_nodes`` empty only nodes that show a GPU are labelled (every node with nvkind), and a
  cluster where no node shows one fails with one sentence;
* 5: charts and the CRD manifest from a local path or a mirror, checked before installing; unavailable: one sentence
  and a failure, or (``*_skip_unavailable_chart``) the release left out, said so, never reported installed;
* 7b: the verifier Job's create/wait/read/delete report no change;
* issue 28: the verifier's Job (with its pod) and ConfigMap are removed after every run, passed or failed, unless
  ``cluster_verify_keep_job`` (then kept, on failure too); the run says where the report is and what was removed;
* 8: a verifier pod without logs on a kwok node: one sentence, ``cluster_verify_simulated_nodes`` fail or warn.

And issue 21's wiring contract: what model_server publishes for subscribers (``model_server_contract.kv_subscriber``),
the one variable through which the engines learn the router (``model_server_router``), and the verifier Job built from
the published subscriber and carrying its tool's import closure.
"""

from __future__ import absolute_import, division, print_function

import hashlib
import json
import os
import re
import stat
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PINS = yaml.safe_load(open(os.path.join(ROOT, "vars", "pinned_versions.yml")))

# The stand-in kubernetes.core: one action plugin per module the roles call. Responses come from the host variable
# _fake_k8s_responses (task name -> result, or a list of results for successive calls); every call is appended to
# the file _fake_k8s_calls as one JSON line.
FAKE_ACTION = '''
from __future__ import absolute_import, division, print_function
import copy
import json
import os

from ansible.plugins.action import ActionBase

DEFAULTS = {"k8s": {"changed": True}, "k8s_info": {"resources": []}, "k8s_log": {"log": "", "log_lines": []},
            "helm": {"changed": True, "status": {}}, "k8s_cluster_info": {"connection": {}, "version": {}}}


class ActionModule(ActionBase):
    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        action = self._task.action.split(".")[-1]
        name = self._task.name
        log = task_vars["_fake_k8s_calls"]
        calls = 0
        if os.path.exists(log):
            with open(log) as handle:
                calls = sum(1 for line in handle if json.loads(line)["task"] == name)
        with open(log, "a") as handle:
            handle.write(json.dumps({"task": name, "action": action, "args": self._task.args,
                                     "check_mode": self._task.check_mode}, default=str) + "\\n")
        response = dict(task_vars.get("_fake_k8s_responses") or {}).get(name, DEFAULTS[action])
        if isinstance(response, list):
            response = response[min(calls, len(response) - 1)]
        result.update(copy.deepcopy(response))
        return result
'''
FAKE_MODULE = '''#!/usr/bin/python
DOCUMENTATION = r"""
module: {name}
short_description: test stand-in
"""
'''
FAKE_HELM = '''#!/bin/sh
# helm show chart <ref> [--repo URL] [--version V]: succeeds for the refs listed in $FAKE_HELM_CHARTS (one per line).
echo "$*" >> "$FAKE_HELM_LOG"
ref=$3
if grep -qxF -- "$ref" "$FAKE_HELM_CHARTS" 2>/dev/null; then
  printf 'apiVersion: v2\\nname: %s\\nversion: 0.0.0\\n' "$(basename "$ref")"
  exit 0
fi
echo "Error: failed to download \\"$ref\\" (hint: running \\`helm repo update\\` may help)" >&2
exit 1
'''

PLAYBOOK = """
- name: Run one role per case against the stand-in cluster
  hosts: cases
  connection: local
  gather_facts: false
  tasks:
    - name: The role, its failure kept
      block:
        - name: The role
          ansible.builtin.include_role:
            name: "inference_cache.substrate.{{ _case_role }}"
      rescue:
        - name: Keep the failure
          ansible.builtin.set_fact:
            _case_failed: "{{ ansible_failed_result.msg | default('failed without a message') }}"
    - name: Write what the case looks at
      changed_when: false
      ansible.builtin.copy:
        dest: "{{ _case_out }}"
        mode: "0644"
        content: >-
          {{ dict(_case_dump | zip(query('ansible.builtin.vars', *_case_dump, default='(undefined)')))
             | combine({'_case_failed': _case_failed | default('')}) | to_json }}
"""

NODE_GPU = {"metadata": {"name": "gpu-1"}, "status": {"allocatable": {"nvidia.com/gpu": "1", "cpu": "8"},
                                                      "capacity": {"nvidia.com/gpu": "1"}}}
NODE_ZERO = {"metadata": {"name": "gpu-0"}, "status": {"allocatable": {"nvidia.com/gpu": "0", "cpu": "8"}}}
NODE_CPU = {"metadata": {"name": "cpu-1", "labels": {"kubernetes.io/os": "linux"}}, "status": {"allocatable": {"cpu": "8"}}}
# Nodes before the device plugin runs: GPUs shown only by a label (GFD, GKE, EKS, NFD) or by capacity.
NODES_UNLABELLED = [
    {"metadata": {"name": "cpu-a", "labels": {"kubernetes.io/os": "linux"}}, "status": {"capacity": {"cpu": "8"}}},
    {"metadata": {"name": "cap-2"}, "status": {"capacity": {"nvidia.com/gpu": "2"}}},
    {"metadata": {"name": "cap-0"}, "status": {"capacity": {"nvidia.com/gpu": "0"}, "allocatable": {"nvidia.com/gpu": "0"}}},
    {"metadata": {"name": "gke", "labels": {"cloud.google.com/gke-accelerator": "nvidia-l4"}}},
    {"metadata": {"name": "eks", "labels": {"k8s.amazonaws.com/accelerator": "nvidia-tesla-t4"}}},
    {"metadata": {"name": "gfd", "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}}},
    {"metadata": {"name": "present", "labels": {"nvidia.com/gpu.present": "true"}}},
    {"metadata": {"name": "present-false", "labels": {"nvidia.com/gpu.present": "false"}}},
    {"metadata": {"name": "nfd", "labels": {"feature.node.kubernetes.io/pci-10de.present": "true"}}},
]
NODES_CPU_ONLY = [NODES_UNLABELLED[0], NODES_UNLABELLED[2], NODES_UNLABELLED[7]]
LIVE_NODES = [NODE_GPU, NODE_ZERO, NODE_CPU]

NVDP_LIST = "Apply | list the nodes"
NVDP_WAIT = "Apply | wait until nodes advertise nvidia.com/gpu (bounded)"
NVDP_HELM = "Apply | install or remove the chart (bounded wait)"
NVDP_CHART = PINS["charts"]["nvidia_device_plugin"]
ROUTER_CHART = PINS["charts"]["llm_d_router_standalone"]
ROUTER_HELM = "Apply | install or remove the Helm release (bounded wait)"
ROUTER_CRDS = "Apply | install the InferencePool CRDs"
ROUTER_OWN = "Apply | the router's own objects (NodePort Service in front of the proxy, the EPP pod's NetworkPolicy)"
ENGINES = {"namespace": "inference-cache", "engine_type": "vllm", "model": "Qwen/Qwen3-0.6B", "served_model_name": "Qwen/Qwen3-0.6B",
           "http_port": 8000, "service": "model-server", "kv_events_service": "model-server-kv",
           "selector": {"app.kubernetes.io/name": "model-server"}, "topic": "kv@$(POD_IP):8000@Qwen/Qwen3-0.6B", "block_size": 32,
           "hash_seed": "42", "kv_events_enabled": True, "kv_events_binds": True, "kv_events_port": 5557, "network_policy": True,
           "kv_events_allowed_peers": [{"labels": {"llm-d-router-gateway": "inference-cache-router-epp"}},
                                       {"labels": {"app.kubernetes.io/component": "kv-events-verifier"}}], "replicas": 1,
           "image": "docker.io/vllm/vllm-openai-cpu:v0.32.0"}
# A kv_subscriber unlike the contract's own kv_events_port, topic and block_size: the Job must follow it.
SUBSCRIBER = {"endpoint": "tcp://model-server-kv.inference-cache.svc.cluster.local:6000", "socket_mode": "connect",
              "topic": "kv@$(POD_IP):8000@published", "replay_endpoint": None, "block_size": 64}
# A user --kv-events-config vLLM connects with (0.0.0.0 holds no wildcard) and a replay socket it binds ([::]).
USER_CONNECTS = ('{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://0.0.0.0:5557",'
                 '"replay_endpoint":"tcp://[::]:5558","topic":"kv@user"}')
KV_HOST = "model-server-kv-events.inference-cache.svc.cluster.local"
VERIFY_JOB = "Run | create the ConfigMap and the Job (server-side apply)"
VERIFY_LOG = "Run | read the verifier's report"
VERIFY_POD = "Run | the Job's pod"
VERIFY_NODE = "Run | the node the pod ran on"
VERIFY_WAIT = "Run | wait for the Job to finish (bounded)"
VERIFY_REMOVE = "Run | remove the Job and the ConfigMap"
VERIFY_WHERE = "Run | the report, and where it is"
REPORT_OK = {"log": 'checking\n{"ok": true, "msg": "2 engine pods passed"}\n',
             "log_lines": ["checking", '{"ok": true, "msg": "2 engine pods passed"}', ""]}
REPORT_BAD = {"log": '{"ok": false, "msg": "pod 10.0.0.7: no KV event within 60 s."}\n',
              "log_lines": ['{"ok": false, "msg": "pod 10.0.0.7: no KV event within 60 s."}', ""]}
# What the run says of the Job and the ConfigMap (namespace inference-cache, name kv-events-verifier).
REMOVED = ("Job inference-cache/kv-events-verifier (with its pod) and ConfigMap inference-cache/kv-events-verifier were removed "
           "(cluster_verify_keep_job=false); the report is the fact cluster_verify_report, printed by the task 'Run | the report, "
           "and where it is' (set cluster_verify_keep_job=true to keep them and the verifier's log).")
KEPT = ("Job inference-cache/kv-events-verifier and ConfigMap inference-cache/kv-events-verifier are kept (cluster_verify_keep_job=true): "
        "kubectl logs -n inference-cache job/kv-events-verifier shows the verifier's log, kubectl delete -n inference-cache "
        "job/kv-events-verifier configmap/kv-events-verifier removes them; the report is the fact cluster_verify_report, printed by "
        "the task 'Run | the report, and where it is'.")
# What kubernetes.core.k8s_log says where the kubelet (kwok's) has no logs: the ApiException as text.
NO_LOGS = {"failed": True, "msg": "Unable to retrieve log from Pod due to: (400)\nReason: Bad Request\nHTTP response headers: "
                                  "HTTPHeaderDict({'Content-Type': 'text/plain; charset=utf-8', 'Content-Length': '38'})\n"
                                  'HTTP response body: no logs found for container "verify"\n\n'}
VERIFIER_POD = {"metadata": {"name": "kv-events-verifier-x7k2p"}, "spec": {"nodeName": "kwok-gpu-0"},
                "status": {"phase": "Succeeded"}}
KWOK_NODE = {"metadata": {"name": "kwok-gpu-0", "annotations": {"kwok.x-k8s.io/node": "fake"}}}
REAL_NODE = {"metadata": {"name": "worker-1", "annotations": {"node.alpha.kubernetes.io/ttl": "0"}}}
KWOK_SENTENCE = ("The verifier Job's pod ran on kwok node kwok-gpu-0, which simulates pods and runs no containers, so no check ran "
                 "and there is no report; the in-cluster checks need real nodes (kind or a GPU cluster).")


# Issue 28: model_server's apply where another field manager owns .spec.replicas.
MS_LIVE = "Apply | read the live Deployments"
MS_HANDOVER = "Apply | hand .spec.replicas over to the replicas manager, or bring it in step"
MS_APPLY = "Apply | apply the manifests"
MS_FIRST = "Apply | give each new Deployment its first size (replicas managed externally)"
MS_WAIT = "Apply | wait until every engine replica is ready (bounded)"
MS_SETTLE = "Apply | apply the new Deployments once more (managed fields settle)"


def live_deployment(replicas, *owners):
    """A Deployment as the API returns it, .spec.replicas held by these (manager, operation) pairs."""
    return {"metadata": {"name": "model-server", "namespace": "inference-cache",
                         "managedFields": [{"manager": "inference-cache-substrate", "operation": "Apply", "fieldsType": "FieldsV1",
                                            "fieldsV1": {"f:spec": {"f:template": {}}}}]
                         + [{"manager": manager, "operation": operation, "fieldsType": "FieldsV1",
                             "fieldsV1": {"f:spec": {"f:replicas": {}}}} for manager, operation in owners]},
            "spec": {"replicas": replicas}}


def refused(status):
    """kubernetes.core.k8s with continue_on_error: the API's body as bytes in the error's msg."""
    return {"changed": False, "result": {}, "error": {"msg": "Failed to apply object: {0}".format(json.dumps(status).encode()),
                                                      "reason": status.get("reason")}}


CONFLICT_REPLICAS = refused({"kind": "Status", "status": "Failure", "reason": "Conflict", "code": 409,
                             "message": "Apply failed with 1 conflict: conflict with \"hpa-test\" with subresource \"scale\" using apps/v1: "
                                        ".spec.replicas",
                             "details": {"causes": [{"reason": "FieldManagerConflict", "field": ".spec.replicas",
                                                     "message": "conflict with \"hpa-test\" with subresource \"scale\" using apps/v1"}]}})
CONFLICT_IMAGE = refused({"kind": "Status", "status": "Failure", "reason": "Conflict", "code": 409,
                          "message": "Apply failed with 1 conflict: conflict with \"argocd\": .spec.template.spec.containers[name=\"engine\"].image",
                          "details": {"causes": [{"reason": "FieldManagerConflict", "message": "conflict with \"argocd\"",
                                                  "field": ".spec.template.spec.containers[name=\"engine\"].image"}]}})
INVALID = refused({"kind": "Status", "status": "Failure", "reason": "Invalid", "code": 422,
                   "message": "Deployment.apps \"model-server\" is invalid: spec.template.spec.containers[0].image: Required value"})


def engines_applied(**extra):
    """model_server applying to the stand-in cluster (no render folder), the rollout wait off unless a case asks."""
    responses = extra.pop("responses", {})
    host = {"_case_role": "model_server", "model_server_allow_unpinned_images": True, "model_server_wait": False,
            "_fake_k8s_responses": responses, "_case_dump": ["model_server_contract"]}
    host.update(extra)
    return host


# A mirror that exists, given beside router_crds_src: get_url must not fetch it.
UNUSED_MIRROR = "file://@TMP@/mirror/unused.yaml"


def nvdp(**extra):
    host = {"_case_role": "nvidia_device_plugin", "nvidia_device_plugin_allow_unpinned_images": True,
            "nvidia_device_plugin_smoke_test": False, "nvidia_device_plugin_wait_timeout": 1,
            "_case_dump": ["nvidia_device_plugin_gpu_nodes", "nvidia_device_plugin_release_installed"]}
    host.update(extra)
    return host


def router(**extra):
    host = {"_case_role": "router", "router_allow_unpinned_images": True, "router_engine": ENGINES, "router_scoring_mode": "approximate",
            "router_service_type": "NodePort", "router_epp_config_check": False,
            "_case_dump": ["router_release_installed", "router_crds_installed"]}
    host.update(extra)
    return host


def verify(**extra):
    host = {"_case_role": "cluster_verify", "cluster_verify_allow_unpinned_images": True, "cluster_verify_engine": ENGINES,
            "cluster_verify_checks": ["kv_events", "prefix_cache"],
            "_fake_k8s_responses": {"Run | wait for the Job to finish (bounded)": {"resources": [{"status": {"succeeded": 1}}]}},
            "_case_dump": ["cluster_verify_report"]}
    responses = extra.pop("responses", {})
    host.update(extra)
    host["_fake_k8s_responses"] = dict(host["_fake_k8s_responses"], **responses)
    return host


def engines(name, **extra):
    """model_server in render mode (nothing reaches a cluster), its published facts dumped."""
    host = {"_case_role": "model_server", "model_server_allow_unpinned_images": True, "model_server_render_dir": "@TMP@/render-" + name,
            "_case_dump": ["model_server_contract"]}
    host.update(extra)
    return host


def responses(nodes_listed, nodes_live=None):
    return {NVDP_LIST: {"resources": nodes_listed}, NVDP_WAIT: {"resources": nodes_live if nodes_live is not None else nodes_listed}}


CASES = {
    # 1: a GPU node ("1"), a node with "0" and one without the resource: one node advertises GPUs.
    "nvdp-wait": nvdp(_fake_k8s_responses=responses(LIVE_NODES), nvidia_device_plugin_nodes=["gpu-1"], _charts=[NVDP_CHART["name"]]),
    # 1: two GPU nodes wanted, one advertised: the wait ends (bounded) with a sentence.
    "nvdp-wait-short": nvdp(_fake_k8s_responses=responses(LIVE_NODES), nvidia_device_plugin_nodes=["gpu-1"],
                            nvidia_device_plugin_min_gpu_nodes=2, _charts=[NVDP_CHART["name"]]),
    # 4: no nodes named, not nvkind: only the nodes that show a GPU.
    "nvdp-labels-shown": nvdp(_fake_k8s_responses=responses(NODES_UNLABELLED, LIVE_NODES), kind_cluster_mode="existing",
                              _charts=[NVDP_CHART["name"]]),
    # 4: nvkind: every node (they share the host's GPUs).
    "nvdp-labels-nvkind": nvdp(_fake_k8s_responses=responses(NODES_UNLABELLED, LIVE_NODES), kind_cluster_mode="nvkind",
                               _charts=[NVDP_CHART["name"]]),
    # 4: named nodes win.
    "nvdp-labels-named": nvdp(_fake_k8s_responses=responses(NODES_UNLABELLED, LIVE_NODES), nvidia_device_plugin_nodes=["cpu-a"],
                              _charts=[NVDP_CHART["name"]]),
    # 4: no node shows a GPU: one sentence.
    "nvdp-labels-none": nvdp(_fake_k8s_responses=responses(NODES_CPU_ONLY, LIVE_NODES), _charts=[NVDP_CHART["name"]]),
    # 5: a local chart .tgz: helm gets the path, no --repo, no --version.
    "nvdp-chart-local": nvdp(_fake_k8s_responses=responses(LIVE_NODES), nvidia_device_plugin_nodes=["gpu-1"],
                             nvidia_device_plugin_chart_ref="/srv/charts/nvidia-device-plugin-0.17.1.tgz",
                             _charts=["/srv/charts/nvidia-device-plugin-0.17.1.tgz"]),
    # 5: a repository mirror for the pinned chart name.
    "nvdp-chart-mirror": nvdp(_fake_k8s_responses=responses(LIVE_NODES), nvidia_device_plugin_nodes=["gpu-1"],
                              nvidia_device_plugin_chart_repo_url="https://charts.example.com/nvidia", _charts=[NVDP_CHART["name"]]),
    # 5: an OCI mirror: no --repo.
    "nvdp-chart-oci": nvdp(_fake_k8s_responses=responses(LIVE_NODES), nvidia_device_plugin_nodes=["gpu-1"],
                           nvidia_device_plugin_chart_repo_url="https://ignored.example.com",
                           nvidia_device_plugin_chart_ref="oci://registry.example.com/charts/nvidia-device-plugin",
                           _charts=["oci://registry.example.com/charts/nvidia-device-plugin"]),
    # 5: the chart cannot be had: fail with one sentence.
    "nvdp-chart-missing": nvdp(_fake_k8s_responses=responses(LIVE_NODES), nvidia_device_plugin_nodes=["gpu-1"], _charts=[]),
    # 5: ... or leave the release out; labels and the wait still run against the live nodes.
    "nvdp-chart-skipped": nvdp(_fake_k8s_responses=responses(LIVE_NODES), nvidia_device_plugin_nodes=["gpu-1"], _charts=[],
                               nvidia_device_plugin_skip_unavailable_chart=True),
    # 5: skipped and no node advertises GPUs: the wait fails as it should.
    "nvdp-chart-skipped-no-gpu": nvdp(_fake_k8s_responses=responses([NODE_CPU]), nvidia_device_plugin_nodes=["cpu-1"], _charts=[],
                                      nvidia_device_plugin_skip_unavailable_chart=True),
    # 5: the router from the pinned OCI chart and a CRD mirror (file://), downloaded and applied.
    "router-mirror": router(_charts=[ROUTER_CHART["ref"]], router_crds_url="file://@TMP@/mirror/manifests.yaml"),
    # 5: a local chart directory and a local CRD manifest: get_url does not run.
    "router-local": router(_charts=["./charts/llm-d-router-standalone"], router_chart_ref="./charts/llm-d-router-standalone",
                           router_crds_src="@TMP@/mirror/manifests.yaml", router_crds_url=UNUSED_MIRROR),
    # 5: a classic repository mirror for a chart name.
    "router-repo-mirror": router(_charts=["llm-d-router-standalone"], router_chart_ref="llm-d-router-standalone",
                                 router_chart_repo_url="https://charts.example.com/llm-d", router_crds_src="@TMP@/mirror/manifests.yaml"),
    # 5: the chart cannot be had: fail.
    "router-chart-missing": router(_charts=[], router_crds_src="@TMP@/mirror/manifests.yaml"),
    # 5: the CRD manifest cannot be had: fail.
    "router-crds-missing": router(_charts=[ROUTER_CHART["ref"]], router_crds_src="@TMP@/no-such/manifests.yaml"),
    # 5: neither, skipped: the router's own objects only.
    "router-skipped": router(_charts=[], router_crds_url="file://@TMP@/no-such/manifests.yaml", router_skip_unavailable_chart=True),
    # 5: the chart is missing, the CRDs can be had: CRDs installed, release left out.
    "router-skipped-chart": router(_charts=[], router_crds_src="@TMP@/mirror/manifests.yaml", router_skip_unavailable_chart=True),
    # 8: the verifier pod ran on a kwok node: fail (default) or warn.
    "verify-kwok-fail": verify(responses={VERIFY_LOG: NO_LOGS, VERIFY_POD: {"resources": [VERIFIER_POD]},
                                          VERIFY_NODE: {"resources": [KWOK_NODE]}}),
    "verify-kwok-warn": verify(cluster_verify_simulated_nodes="warn",
                               responses={VERIFY_LOG: NO_LOGS, VERIFY_POD: {"resources": [VERIFIER_POD]},
                                          VERIFY_NODE: {"resources": [KWOK_NODE]}}),
    # 8: no logs on a real node: pod, node, phase and the API's reason, whatever cluster_verify_simulated_nodes says.
    "verify-real-no-logs": verify(cluster_verify_simulated_nodes="warn",
                                  responses={VERIFY_LOG: NO_LOGS,
                                             VERIFY_POD: {"resources": [dict(VERIFIER_POD, spec={"nodeName": "worker-1"},
                                                                             status={"phase": "Failed"})]},
                                             VERIFY_NODE: {"resources": [REAL_NODE]}}),
    # 7b and the report path: a report in the logs passes; the Job tasks report no change.
    "verify-report": verify(responses={VERIFY_LOG: REPORT_OK}),
    # Issue 28: kept when asked, passed or failed; removed by default also when the verification fails, or a step of it.
    "verify-keep": verify(cluster_verify_keep_job=True, responses={VERIFY_LOG: REPORT_OK}),
    "verify-keep-failed": verify(cluster_verify_keep_job=True, responses={VERIFY_LOG: REPORT_BAD}),
    "verify-failed": verify(responses={VERIFY_LOG: REPORT_BAD}),
    "verify-timeout": verify(cluster_verify_timeout=1, responses={VERIFY_WAIT: {"resources": [{"status": {"active": 1}}]}}),
    "verify-no-json": verify(responses={VERIFY_LOG: {"log": "Traceback (most recent call last):\nImportError: no module named zmq\n",
                                                     "log_lines": ["Traceback (most recent call last):",
                                                                   "ImportError: no module named zmq", ""]}}),
    # Issue 21: the verifier subscribes as the engines' published kv_subscriber says (here unlike the contract's other fields).
    "verify-subscriber": verify(cluster_verify_engine=dict(ENGINES, kv_subscriber=SUBSCRIBER),
                                responses={VERIFY_LOG: {"log": '{"ok": true, "msg": "1 engine pod passed"}\n'}}),
    # Issue 21: what model_server publishes for subscribers, and what it knows of the router.
    "engines-contract": engines("engines-contract"),
    "engines-user-connects": engines("engines-user-connects", router_scoring_mode="approximate",
                                     model_server_extra_args=["--kv-events-config", USER_CONNECTS]),
    "engines-kv-off": engines("engines-kv-off", model_server_kv_events_enabled=False),
    "engines-router-defaults": engines("engines-router-defaults", model_server_service_type="NodePort", model_server_http_node_port=30080),
    "engines-router-type-only": engines("engines-router-type-only", router_service_type="NodePort", model_server_service_type="NodePort",
                                        model_server_http_node_port=30080),
    "engines-router-vars": engines("engines-router-vars", router_scoring_mode="approximate", router_service_type="NodePort",
                                   router_http_node_port=30081, model_server_service_type="NodePort"),
    "engines-router-given": engines("engines-router-given", model_server_service_type="NodePort",
                                    model_server_router={"scoring_mode": "approximate", "service_type": "NodePort", "http_node_port": 30557},
                                    model_server_kv_events_node_port_enabled=True, model_server_kv_events_node_port_source_cidrs=["10.0.0.0/8"]),
    "engines-router-partial": engines("engines-router-partial", model_server_router={"scoring_mode": "approximate"}),
    "engines-router-legacy": engines("engines-router-legacy", model_server_router_scoring_mode="bogus"),
    # Issue 28: .spec.replicas and other field managers.
    "replicas-conflict": engines_applied(responses={MS_LIVE: {"resources": [live_deployment(3, ("hpa-test", "Update"))]},
                                                    MS_APPLY: CONFLICT_REPLICAS}),
    "replicas-external": engines_applied(model_server_replicas_managed_externally=True, model_server_wait=True,
                                         responses={MS_LIVE: {"resources": [live_deployment(3, ("hpa-test", "Update"))]},
                                                    MS_WAIT: {"resources": [{"spec": {"replicas": 3},
                                                                             "status": {"readyReplicas": 3, "updatedReplicas": 3}}]}}),
    "replicas-handover": engines_applied(model_server_replicas_managed_externally=True,
                                         responses={MS_LIVE: {"resources": [live_deployment(2, ("inference-cache-substrate", "Apply"))]}}),
    "replicas-new": engines_applied(model_server_replicas_managed_externally=True, model_server_replicas=4),
    "replicas-back": engines_applied(responses={MS_LIVE: {"resources": [live_deployment(3, ("inference-cache-substrate-replicas", "Apply"))]}}),
    "replicas-owned": engines_applied(responses={MS_LIVE: {"resources": [live_deployment(2, ("inference-cache-substrate", "Apply"))]}}),
    "conflict-image": engines_applied(responses={MS_APPLY: CONFLICT_IMAGE}),
    "refused-invalid": engines_applied(responses={MS_APPLY: INVALID}),
}


def _fill(value, tmp):
    if isinstance(value, str):
        return value.replace("@TMP@", tmp)
    if isinstance(value, list):
        return [_fill(v, tmp) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, tmp) for k, v in value.items()}
    return value


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("k8s-defects"))
    fake = os.path.join(tmp, "collections", "ansible_collections", "kubernetes", "core")
    for sub in ("plugins/action", "plugins/modules", "meta"):
        os.makedirs(os.path.join(fake, sub))
    with open(os.path.join(fake, "meta", "runtime.yml"), "w") as handle:
        handle.write('---\nrequires_ansible: ">=2.16.0"\n')
    for name in ("k8s", "k8s_info", "k8s_log", "helm", "k8s_cluster_info"):
        with open(os.path.join(fake, "plugins", "action", name + ".py"), "w") as handle:
            handle.write(FAKE_ACTION)
        with open(os.path.join(fake, "plugins", "modules", name + ".py"), "w") as handle:
            handle.write(FAKE_MODULE.format(name=name))
    os.makedirs(os.path.join(tmp, "mirror"))
    for manifest in ("manifests.yaml", "unused.yaml"):
        with open(os.path.join(tmp, "mirror", manifest), "w") as handle:
            handle.write("apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n"
                         "  name: inferencepools.inference.networking.k8s.io\n")
    helm = os.path.join(tmp, "helm")
    with open(helm, "w") as handle:
        handle.write(FAKE_HELM)
    os.chmod(helm, os.stat(helm).st_mode | stat.S_IEXEC)
    hosts = {}
    for name, case in CASES.items():
        case = _fill(case, tmp)
        charts = os.path.join(tmp, name + ".charts")
        with open(charts, "w") as handle:
            handle.write("".join(c + "\n" for c in case.pop("_charts", [])))
        # Each case's helm: the stand-in script with the charts this case can have.
        wrapper = os.path.join(tmp, name + ".helm.sh")
        with open(wrapper, "w") as handle:
            handle.write('#!/bin/sh\nFAKE_HELM_CHARTS=%s FAKE_HELM_LOG=%s exec %s "$@"\n' % (charts, os.path.join(tmp, name + ".helm"), helm))
        os.chmod(wrapper, 0o755)
        case.update({"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                     "_case_out": os.path.join(tmp, name + ".json"), "_fake_k8s_calls": os.path.join(tmp, name + ".calls"),
                     "nvidia_device_plugin_helm_binary": wrapper, "router_helm_binary": wrapper})
        hosts[name] = case
    inventory = os.path.join(tmp, "inventory.yml")
    with open(inventory, "w") as handle:
        yaml.safe_dump({"all": {"children": {"cases": {"hosts": hosts}}}}, handle)
    playbook = os.path.join(tmp, "cases.yml")
    with open(playbook, "w") as handle:
        handle.write(PLAYBOOK)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1",
               ANSIBLE_DEPRECATION_WARNINGS="0", ANSIBLE_CALLBACK_RESULT_FORMAT="json", TMPDIR=tmp)
    env["ANSIBLE_COLLECTIONS_PATH"] = os.pathsep.join(
        [os.path.join(tmp, "collections"), os.path.join(ROOT, ".cache", "collections")]
        + [p for p in os.environ.get("ANSIBLE_COLLECTIONS_PATH", "").split(os.pathsep) if p])
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", inventory, playbook,
                           "--forks", "8"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, check=False)
    with open(os.path.join(tmp, "ansible.out"), "w") as handle:
        handle.write(proc.stdout)
    # A case that fails (on purpose) is rescued, which ansible-playbook still counts as failed (exit code 2).
    stats = dict((host, _stats(line)) for host, line in re.findall(r"^(\S+)\s+: (ok=.*)$", proc.stdout, re.M))
    assert sorted(stats) == sorted(CASES), proc.stdout[-6000:]
    assert all(s["unreachable"] == 0 and s["failed"] <= s["rescued"] for s in stats.values()), proc.stdout[-6000:]
    return tmp, proc.stdout, stats


def _stats(line):
    return dict((k, int(v)) for k, v in re.findall(r"(\w+)=(\d+)", line))


def result(run, name):
    tmp = run[0]
    with open(os.path.join(tmp, name + ".json")) as handle:
        return json.load(handle)


def calls(run, name, task=None):
    tmp = run[0]
    path = os.path.join(tmp, name + ".calls")
    if not os.path.exists(path):
        return []
    with open(path) as handle:
        entries = [json.loads(line) for line in handle]
    return [e for e in entries if task is None or e["task"] == task]


def helm_calls(run, name):
    tmp = run[0]
    path = os.path.join(tmp, name + ".helm")
    return open(path).read().splitlines() if os.path.exists(path) else []


def recap(run, name):
    return run[2][name]


def task_output(run, task):
    """What the run printed under the banner(s) of one task (any role)."""
    sections = re.split(r"^TASK \[", run[1], flags=re.M)
    return "".join(sec for sec in sections if sec.split("]", 1)[0].split(" : ")[-1] == task)


# 1. The GPU wait.
def test_gpu_wait_counts_nodes_whose_allocatable_has_nvidia_gpu(run):
    res = result(run, "nvdp-wait")
    assert res["_case_failed"] == ""
    assert res["nvidia_device_plugin_gpu_nodes"] == ["gpu-1"], "the node with nvidia.com/gpu: '1' only (not '0', not absent)"
    assert len(calls(run, "nvdp-wait", NVDP_WAIT)) == 1, "the wait passed at its first look"


def test_gpu_wait_too_few_nodes_says_so_in_one_sentence(run):
    msg = result(run, "nvdp-wait-short")["_case_failed"]
    assert msg.startswith("1 node(s) advertise nvidia.com/gpu in status.allocatable after 1 s (gpu-1), fewer than "
                          "nvidia_device_plugin_min_gpu_nodes=2"), msg
    assert len(calls(run, "nvdp-wait-short", NVDP_WAIT)) == 2, "bounded: one retry for a 1 s timeout"


# 4. Which nodes are labelled.
def _labelled(run, name):
    """The nodes patched (kubernetes.core.k8s state patched, kind Node), whichever task did it."""
    return [c["args"]["name"] for c in calls(run, name)
            if c["action"] == "k8s" and c["args"].get("state") == "patched" and c["args"].get("kind") == "Node"]


def test_labels_only_nodes_that_show_a_gpu(run):
    # present already carries the label, nfd is matched by the chart's affinity through NFD's label.
    assert _labelled(run, "nvdp-labels-shown") == ["cap-2", "gke", "eks", "gfd"]
    assert result(run, "nvdp-labels-shown")["_case_failed"] == ""


def test_labels_every_node_with_nvkind(run):
    assert _labelled(run, "nvdp-labels-nvkind") == ["cpu-a", "cap-2", "cap-0", "gke", "eks", "gfd", "present-false"]


def test_labels_the_named_nodes(run):
    assert _labelled(run, "nvdp-labels-named") == ["cpu-a"]


def test_no_node_shows_a_gpu_fails_with_one_sentence(run):
    msg = result(run, "nvdp-labels-none")["_case_failed"]
    assert msg.startswith("No node shows a GPU (nvidia.com/gpu in its capacity"), msg
    assert "name the GPU nodes in nvidia_device_plugin_nodes (nodes: cpu-a, cap-0, present-false)." in msg
    assert _labelled(run, "nvdp-labels-none") == [] and calls(run, "nvdp-labels-none", NVDP_HELM) == []


# 5. Charts and the CRD manifest from a local path or a mirror; unavailable ones.
def test_device_plugin_chart_from_the_pinned_repository(run):
    expected = "show chart %s --repo %s --version %s" % (NVDP_CHART["name"], NVDP_CHART["repo_url"], NVDP_CHART["version"])
    assert helm_calls(run, "nvdp-wait") == [expected]
    (helm,) = calls(run, "nvdp-wait", NVDP_HELM)
    assert (helm["args"]["chart_ref"], helm["args"]["chart_repo_url"]) == (NVDP_CHART["name"], NVDP_CHART["repo_url"])
    assert result(run, "nvdp-wait")["nvidia_device_plugin_release_installed"] is True


@pytest.mark.parametrize("name, show, ref, repo, version", [
    ("nvdp-chart-local", "show chart /srv/charts/nvidia-device-plugin-0.17.1.tgz", "/srv/charts/nvidia-device-plugin-0.17.1.tgz",
     None, None),
    ("nvdp-chart-mirror", "show chart nvidia-device-plugin --repo https://charts.example.com/nvidia --version " + NVDP_CHART["version"],
     "nvidia-device-plugin", "https://charts.example.com/nvidia", NVDP_CHART["version"]),
    ("nvdp-chart-oci", "show chart oci://registry.example.com/charts/nvidia-device-plugin --version " + NVDP_CHART["version"],
     "oci://registry.example.com/charts/nvidia-device-plugin", None, NVDP_CHART["version"]),
])
def test_device_plugin_chart_from_a_path_or_a_mirror(run, name, show, ref, repo, version):
    assert helm_calls(run, name) == [show]
    (helm,) = calls(run, name, NVDP_HELM)
    assert helm["args"]["chart_ref"] == ref
    assert helm["args"].get("chart_repo_url") == repo and helm["args"].get("chart_version") == version
    assert result(run, name)["nvidia_device_plugin_release_installed"] is True


def test_device_plugin_chart_unavailable_fails_naming_chart_error_and_variables(run):
    msg = result(run, "nvdp-chart-missing")["_case_failed"]
    assert msg == ("The NVIDIA device plugin chart nvidia-device-plugin version %s from %s cannot be had (Error: failed to download "
                   "\"nvidia-device-plugin\" (hint: running `helm repo update` may help)): point nvidia_device_plugin_chart_ref at a "
                   "local chart directory or .tgz or an oci:// mirror, or nvidia_device_plugin_chart_repo_url at a mirror of the chart "
                   "repository, or set nvidia_device_plugin_skip_unavailable_chart=true to leave the release out."
                   % (NVDP_CHART["version"], NVDP_CHART["repo_url"])), msg
    assert calls(run, "nvdp-chart-missing", NVDP_HELM) == []


def test_device_plugin_chart_unavailable_skipped_leaves_the_release_out(run):
    res = result(run, "nvdp-chart-skipped")
    assert res["_case_failed"] == "" and res["nvidia_device_plugin_release_installed"] is False
    assert calls(run, "nvdp-chart-skipped", NVDP_HELM) == [], "never installed"
    assert res["nvidia_device_plugin_gpu_nodes"] == ["gpu-1"], "the wait still looks at the live nodes"
    assert ("so release nvidia-device-plugin was left out (nvidia_device_plugin_skip_unavailable_chart=true)"
            in task_output(run, "Apply | say that the release is left out"))
    msg = result(run, "nvdp-chart-skipped-no-gpu")["_case_failed"]
    assert "the device plugin release was left out, so nothing registers the GPUs" in msg, msg
    assert _labelled(run, "nvdp-chart-skipped-no-gpu") == ["cpu-1"], "labels still applied"


def test_router_chart_pinned_and_crds_from_a_mirror(run):
    tmp = run[0]
    assert helm_calls(run, "router-mirror") == ["show chart %s --version %s" % (ROUTER_CHART["ref"], ROUTER_CHART["version"])]
    (crds,) = calls(run, "router-mirror", ROUTER_CRDS)
    assert crds["args"]["src"].startswith(os.path.join(tmp, "inference-cache-substrate-inferencepool-crds-"))
    assert "inferencepools.inference.networking.k8s.io" in open(crds["args"]["src"]).read(), "downloaded from the mirror"
    (helm,) = calls(run, "router-mirror", ROUTER_HELM)
    assert helm["args"]["chart_ref"] == ROUTER_CHART["ref"] and helm["args"]["chart_version"] == ROUTER_CHART["version"]
    assert "chart_repo_url" not in helm["args"]
    res = result(run, "router-mirror")
    assert (res["router_release_installed"], res["router_crds_installed"]) == (True, True)


def test_router_local_chart_and_crds_src_download_nothing(run):
    tmp = run[0]
    assert helm_calls(run, "router-local") == ["show chart ./charts/llm-d-router-standalone"]
    (crds,) = calls(run, "router-local", ROUTER_CRDS)
    assert crds["args"]["src"] == os.path.join(tmp, "mirror", "manifests.yaml")
    (helm,) = calls(run, "router-local", ROUTER_HELM)
    assert helm["args"]["chart_ref"] == "./charts/llm-d-router-standalone" and "chart_version" not in helm["args"]
    assert result(run, "router-local")["_case_failed"] == ""
    # router_crds_url names a mirror that exists: get_url did not fetch it (no scratch file for that URL).
    url = UNUSED_MIRROR.replace("@TMP@", tmp)
    assert not os.path.exists(os.path.join(tmp, "inference-cache-substrate-inferencepool-crds-%s.yaml"
                                           % hashlib.sha256(url.encode()).hexdigest()[:12]))


def test_router_chart_from_a_repository_mirror(run):
    assert helm_calls(run, "router-repo-mirror") == ["show chart llm-d-router-standalone --repo https://charts.example.com/llm-d "
                                                     "--version " + ROUTER_CHART["version"]]
    (helm,) = calls(run, "router-repo-mirror", ROUTER_HELM)
    assert helm["args"]["chart_repo_url"] == "https://charts.example.com/llm-d"


def test_router_unavailable_chart_or_crds_fail_with_one_sentence(run):
    tmp = run[0]
    msg = result(run, "router-chart-missing")["_case_failed"]
    assert msg.startswith("The router chart %s version %s cannot be had (Error: failed to download" % (ROUTER_CHART["ref"],
                                                                                                       ROUTER_CHART["version"])), msg
    assert msg.endswith("point router_chart_ref at a local chart directory or .tgz or an oci:// mirror (or a chart name with "
                        "router_chart_repo_url at a mirror of its repository), or set router_skip_unavailable_chart=true to leave "
                        "the release out."), msg
    msg = result(run, "router-crds-missing")["_case_failed"]
    assert msg == ("The InferencePool CRD manifest %s/no-such/manifests.yaml cannot be had (no such file): set router_crds_src to a "
                   "local copy of it or router_crds_url to a mirror (router_install_crds=false when the cluster has the CRDs), or set "
                   "router_skip_unavailable_chart=true to leave the CRDs and the release out." % tmp), msg
    for name in ("router-chart-missing", "router-crds-missing"):
        assert calls(run, name, ROUTER_HELM) == [] and calls(run, name, ROUTER_CRDS) == []


def test_router_skip_unavailable_leaves_out_what_cannot_be_had(run):
    res = result(run, "router-skipped")
    assert res["_case_failed"] == ""
    assert (res["router_release_installed"], res["router_crds_installed"]) == (False, False)
    assert calls(run, "router-skipped", ROUTER_HELM) == [] and calls(run, "router-skipped", ROUTER_CRDS) == []
    own = [c["args"]["definition"]["kind"] for c in calls(run, "router-skipped", ROUTER_OWN)]
    assert sorted(own) == ["NetworkPolicy", "Service"], "the NodePort Service and the EPP's NetworkPolicy do not depend on the chart"
    said = task_output(run, "Apply | say what is left out")
    assert ("so the InferencePool CRDs and release inference-cache-router were left out: router_chart_ref (a local chart directory, "
            ".tgz or oci:// mirror) or router_chart_repo_url (a repository mirror), and router_crds_src (a local copy of the "
            "manifest) or router_crds_url (a mirror) would supply them.") in said, said
    res = result(run, "router-skipped-chart")
    assert (res["router_release_installed"], res["router_crds_installed"]) == (False, True)
    assert len(calls(run, "router-skipped-chart", ROUTER_CRDS)) == 1 and calls(run, "router-skipped-chart", ROUTER_HELM) == []


# 8. The verifier's report where the pod has no logs.
def test_verifier_on_kwok_fails_with_one_sentence(run):
    assert result(run, "verify-kwok-fail")["_case_failed"] == KWOK_SENTENCE + " " + REMOVED


def test_verifier_on_kwok_warns_and_claims_no_success(run):
    res = result(run, "verify-kwok-warn")
    assert res["_case_failed"] == ""
    assert res["cluster_verify_report"] == {"ok": False, "simulated": True, "msg": KWOK_SENTENCE}
    assert json.dumps(KWOK_SENTENCE) in task_output(run, "Run | say that no check ran")
    assert "skipping: [verify-kwok-warn]" in task_output(run, "Run | every engine pod must pass"), "no success message"


def test_verifier_without_logs_on_a_real_node_names_pod_node_phase_and_reason(run):
    msg = result(run, "verify-real-no-logs")["_case_failed"]
    assert msg == ("The verifier Job's pod kv-events-verifier-x7k2p on node worker-1 is Failed and left no logs, so there is no "
                   "report (the API: 400 Bad Request: no logs found for container \"verify\"). " + REMOVED), msg


def test_verifier_report_passes_and_the_probe_reports_no_change(run):
    res = result(run, "verify-report")
    assert res["_case_failed"] == "" and res["cluster_verify_report"] == {"ok": True, "msg": "2 engine pods passed"}
    tasks = [c["task"] for c in calls(run, "verify-report")]
    assert tasks[0] == "Run | remove the previous Job" and tasks[-2:] == [VERIFY_REMOVE] * 2, tasks
    # The stand-in answers changed=true for every create and delete: changed_when false keeps the run at changed=0.
    for name in ("verify-report", "verify-kwok-warn", "verify-keep", "verify-failed", "verify-timeout"):
        assert recap(run, name)["changed"] == 0, recap(run, name)


# Issue 28: the verifier's objects after the run.
def _removed(run, name):
    """(kind, name, propagation, wait) of each object the run deleted after the verification."""
    return [(c["args"]["definition"]["kind"], c["args"]["definition"]["metadata"]["name"],
             c["args"].get("delete_options", {}).get("propagationPolicy"), c["args"].get("wait"))
            for c in calls(run, name, VERIFY_REMOVE)]


def test_by_default_the_job_with_its_pod_and_the_configmap_are_removed_and_the_run_says_where_the_report_is(run):
    with open(os.path.join(ROOT, "roles", "cluster_verify", "defaults", "main.yml")) as handle:
        assert yaml.safe_load(handle)["cluster_verify_keep_job"] is False
    assert _removed(run, "verify-report") == [("Job", "kv-events-verifier", "Foreground", True),
                                              ("ConfigMap", "kv-events-verifier", "Foreground", True)]
    applied = sorted(c["args"]["definition"]["kind"] for c in calls(run, "verify-report", VERIFY_JOB))
    assert applied == ["ConfigMap", "Job"], "what was created is what is removed"
    said = task_output(run, "Run | every engine pod must pass")
    assert "2 engine pods passed. " + REMOVED in said, said
    where = task_output(run, VERIFY_WHERE)
    assert json.dumps(REMOVED) in where and '"2 engine pods passed"' in where, where


def test_keep_job_keeps_them_passed_or_failed(run):
    for name in ("verify-keep", "verify-keep-failed"):
        assert calls(run, name, VERIFY_REMOVE) == [], name
        assert [c["task"] for c in calls(run, name)][-1] == VERIFY_LOG, "nothing deleted after the report was read"
    assert "2 engine pods passed. " + KEPT in task_output(run, "Run | every engine pod must pass")
    assert result(run, "verify-keep")["_case_failed"] == ""
    assert result(run, "verify-keep-failed")["_case_failed"] == "pod 10.0.0.7: no KV event within 60 s. " + KEPT


def test_a_failed_verification_removes_them_and_says_so_and_where_the_report_is(run):
    res = result(run, "verify-failed")
    assert res["_case_failed"] == "pod 10.0.0.7: no KV event within 60 s. " + REMOVED
    assert res["cluster_verify_report"] == {"ok": False, "msg": "pod 10.0.0.7: no KV event within 60 s."}
    assert _removed(run, "verify-failed") == _removed(run, "verify-report")


def test_a_failed_step_is_the_report_and_the_objects_are_still_removed(run):
    """The bounded wait runs out: no report can be read; the failure is the report, the Job and ConfigMap go anyway."""
    res = result(run, "verify-timeout")
    msg = ("The verifier Job inference-cache/kv-events-verifier did not finish within 1 s (its status: {\"active\": 1}).")
    assert res["cluster_verify_report"] == {"ok": False, "msg": msg}
    assert res["_case_failed"] == msg + " " + REMOVED
    assert _removed(run, "verify-timeout") == _removed(run, "verify-report")
    assert calls(run, "verify-timeout", VERIFY_LOG) == [], "no report was read"


def test_a_log_without_a_report_keeps_its_last_lines(run):
    """The log goes with the Job: a verifier that crashed leaves its last lines in the report."""
    res = result(run, "verify-no-json")
    assert res["cluster_verify_report"]["log_tail"] == ["Traceback (most recent call last):", "ImportError: no module named zmq"]
    assert res["_case_failed"].startswith("The verifier Job's pod printed no report (no JSON line in its log)"), res["_case_failed"]
    assert res["_case_failed"].endswith(REMOVED)


# Issue 21: the wiring contract in the roles.
def test_model_server_publishes_what_a_subscriber_needs(run):
    contract = result(run, "engines-contract")["model_server_contract"]
    assert contract["kv_subscriber"] == {"endpoint": "tcp://%s:5557" % KV_HOST, "socket_mode": "connect",
                                         "topic": "kv@$(POD_IP):8000@Qwen/Qwen3-0.6B", "replay_endpoint": None, "block_size": 32}
    assert contract["topic"] == contract["kv_subscriber"]["topic"] and contract["kv_events_binds"] is True


def test_model_server_subscriber_follows_vllms_bind_rule_for_a_user_config(run):
    """tcp://0.0.0.0 has no wildcard: vLLM connects, so a subscriber binds; the replay socket on [::] is dialled."""
    contract = result(run, "engines-user-connects")["model_server_contract"]
    assert contract["kv_events_binds"] is False
    assert contract["kv_subscriber"] == {"endpoint": "tcp://0.0.0.0:5557", "socket_mode": "bind", "topic": "kv@user",
                                         "replay_endpoint": "tcp://%s:5558" % KV_HOST, "block_size": 32}
    assert "The KV-event endpoint tcp://0.0.0.0:5557 has no '*'" in task_output(
        run, "Preflight | warn when the user's KV-event endpoint connects instead of binding")
    assert result(run, "engines-kv-off")["model_server_contract"]["kv_subscriber"] == {}


def test_model_server_router_defaults_to_the_router_roles_variables(run):
    """Unset, the router's own defaults (its Service a ClusterIP, so 30080 is free); set, the router role's variables."""
    with open(os.path.join(ROOT, "roles", "router", "defaults", "main.yml")) as handle:
        router_defaults = yaml.safe_load(handle)
    assert router_defaults["router_service_type"] == "ClusterIP"
    assert result(run, "engines-router-defaults")["_case_failed"] == ""
    msg = result(run, "engines-router-type-only")["_case_failed"]
    assert ("Two Services ask for the same NodePort (model_server_http_node_port=30080, router_http_node_port=%d)"
            % router_defaults["router_http_node_port"]) in msg, msg
    msg = result(run, "engines-router-vars")["_case_failed"]
    assert "Two Services ask for the same NodePort (model_server_http_node_port=30081, router_http_node_port=30081)" in msg, msg


def test_model_server_router_given_whole_is_what_the_engines_know(run):
    msg = result(run, "engines-router-given")["_case_failed"]
    assert ("Two Services ask for the same NodePort (model_server_http_node_port=30081, model_server_kv_events_node_port=30557, "
            "router_http_node_port=30557)") in msg, msg
    msg = result(run, "engines-router-partial")["_case_failed"]
    assert "missing required arguments: http_node_port, service_type found in model_server_router" in msg, msg


def test_model_server_router_scoring_mode_still_sets_the_scoring_mode(run):
    res = result(run, "engines-router-legacy")
    assert res["_case_failed"] == "model_server_router.scoring_mode (router_scoring_mode) must be precise or approximate, not bogus."


def _verifier(run, name):
    docs = [c["args"]["definition"] for c in calls(run, name, VERIFY_JOB)]
    job = [d for d in docs if d["kind"] == "Job"][0]
    config = [d for d in docs if d["kind"] == "ConfigMap"][0]
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    return dict(zip(args[::2], args[1::2])), config, job


def test_verifier_job_subscribes_as_the_published_subscriber_says(run):
    args, _config, _job = _verifier(run, "verify-subscriber")
    assert (args["--kv-port"], args["--topic-template"], args["--block-size"]) == ("6000", "kv@$$(POD_IP):8000@published", "64")
    assert args["--service"] == "model-server-kv.inference-cache.svc.cluster.local", "pods are found through the KV-event Service"
    # A contract without kv_subscriber (a cluster_verify_engine written by hand): its own fields, as before.
    args, _config, _job = _verifier(run, "verify-report")
    assert (args["--kv-port"], args["--topic-template"], args["--block-size"]) == ("5557", "kv@$$(POD_IP):8000@Qwen/Qwen3-0.6B", "32")


def test_verifier_configmap_carries_the_tools_import_closure(run):
    from ansible_collections.inference_cache.substrate.plugins.filter import import_closure  # pylint: disable=import-outside-toplevel
    files = import_closure.import_closure(["roles/cluster_verify/files/cluster_verify.py"], ROOT)
    _args, config, job = _verifier(run, "verify-report")
    assert sorted(config["data"]) == sorted(f.replace("/", ".") for f in files)
    items = [v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "code"][0]["configMap"]["items"]
    assert [i["path"] for i in items] == files
    assert not [f for f in files if f.startswith("tools/")] and "plugins/module_utils/service/supervisor.py" not in files


# Issue 28: model_server and another field manager's .spec.replicas (the same on a real API server: test_kwok_roles.py).
def _deployments_applied(run, name):
    return [c["args"]["definition"] for c in calls(run, name, MS_APPLY) if c["args"]["definition"]["kind"] == "Deployment"]


def test_replicas_another_manager_set_stop_the_role_in_one_sentence_naming_it_and_the_variable(run):
    assert result(run, "replicas-conflict")["_case_failed"] == (
        'Deployment inference-cache/model-server: .spec.replicas belongs to field manager "hpa-test" (such as an autoscaler or kubectl '
        "scale; it set 3), and server-side apply does not take it back for model_server_replicas=2; set "
        "model_server_replicas_managed_externally=true to leave the replicas to it, or model_server_replicas=3 to agree with it.")
    applied = calls(run, "replicas-conflict", MS_APPLY)
    assert applied and all(c["args"]["continue_on_error"] is True for c in applied)
    assert all("force_conflicts" not in c["args"]["server_side_apply"] for c in applied), "the role never forces another's field"
    assert calls(run, "replicas-conflict", MS_HANDOVER) == [] and calls(run, "replicas-conflict", MS_FIRST) == []


def test_other_refusals_are_one_sentence_too(run):
    assert result(run, "conflict-image")["_case_failed"] == (
        'Deployment inference-cache/model-server: field manager "argocd" owns .spec.template.spec.containers[name="engine"].image, '
        "which this role applies too, and server-side apply does not take fields from another manager; set them through the "
        "variables of this role, or release them from that manager (kubectl apply --server-side --force-conflicts "
        "--field-manager=inference-cache-substrate).")
    msg = result(run, "refused-invalid")["_case_failed"]
    assert msg.startswith("The API server refused Deployment inference-cache/model-server: Failed to apply object: b'"), msg
    assert "spec.template.spec.containers[0].image: Required value" in msg


def test_replicas_managed_externally_leave_the_field_out_and_wait_for_the_live_count(run):
    res = result(run, "replicas-external")
    assert res["_case_failed"] == ""
    (dep,) = _deployments_applied(run, "replicas-external")
    assert "replicas" not in dep["spec"], "server-side apply must not claim .spec.replicas"
    assert calls(run, "replicas-external", MS_HANDOVER) == [] and calls(run, "replicas-external", MS_FIRST) == []
    assert res["model_server_contract"]["replicas"] == 3, "the verifier expects the autoscaler's count"
    assert res["model_server_contract"]["replicas_managed_externally"] is True
    assert recap(run, "replicas-external")["failed"] == 0


def test_leaving_a_count_the_role_held_hands_it_over_first(run):
    """Dropping a field the role's apply alone owns would reset it to 1: the replicas manager takes it at its live value."""
    tasks = [c["task"] for c in calls(run, "replicas-handover")]
    assert tasks.index(MS_HANDOVER) < tasks.index(MS_APPLY), tasks
    (handover,) = calls(run, "replicas-handover", MS_HANDOVER)
    assert handover["args"]["server_side_apply"] == {"field_manager": "inference-cache-substrate-replicas"}
    assert handover["args"]["definition"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                              "metadata": {"name": "model-server", "namespace": "inference-cache"},
                                              "spec": {"replicas": 2}}
    assert "replicas" not in _deployments_applied(run, "replicas-handover")[0]["spec"]
    assert result(run, "replicas-handover")["_case_failed"] == ""


def test_a_new_deployment_gets_its_first_size_once_through_the_replicas_manager(run):
    tasks = [c["task"] for c in calls(run, "replicas-new")]
    assert tasks.index(MS_APPLY) < tasks.index(MS_FIRST), tasks
    (first,) = calls(run, "replicas-new", MS_FIRST)
    assert first["args"]["server_side_apply"] == {"field_manager": "inference-cache-substrate-replicas"}
    assert first["args"]["definition"]["spec"] == {"replicas": 4}
    assert "replicas" not in _deployments_applied(run, "replicas-new")[0]["spec"]
    # Then the role's manager applies the Deployment once more: the API server rewrites that manager's managed-fields entry
    # once after another applier's write (seen on kube-apiserver v1.33), so the next run is a no-op (test_kwok_roles.py).
    (settle,) = calls(run, "replicas-new", MS_SETTLE)
    assert tasks.index(MS_FIRST) < tasks.index(MS_SETTLE)
    assert settle["args"]["server_side_apply"] == {"field_manager": "inference-cache-substrate"}
    assert settle["args"]["definition"] == _deployments_applied(run, "replicas-new")[0]
    assert calls(run, "replicas-external", MS_SETTLE) == [], "only for a Deployment this run created"


def test_owning_the_count_again_brings_the_replicas_manager_in_step(run):
    (step,) = calls(run, "replicas-back", MS_HANDOVER)
    assert step["args"]["definition"]["spec"] == {"replicas": 2}, "model_server_replicas, so the role's apply meets its own value"
    assert _deployments_applied(run, "replicas-back")[0]["spec"]["replicas"] == 2
    assert calls(run, "replicas-owned", MS_HANDOVER) == [], "the role owns the count and keeps it: nothing to hand over"
    assert result(run, "replicas-owned")["_case_failed"] == ""
