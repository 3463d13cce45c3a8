# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Issue 20 defects 1, 4, 5, 7b and 8, in the roles' real task files, without a cluster.

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
           "kv_events_allowed_peers": [{"labels": {"llm-d-router-gateway": "inference-cache-router-epp"}}], "replicas": 1,
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
            "cluster_verify_checks": ["kv_events", "prefix_cache"], "cluster_verify_keep_job": False,
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
    "verify-report": verify(responses={VERIFY_LOG: {"log": 'checking\n{"ok": true, "msg": "2 engine pods passed"}\n',
                                                    "log_lines": ["checking", '{"ok": true, "msg": "2 engine pods passed"}', ""]}}),
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
    assert result(run, "verify-kwok-fail")["_case_failed"] == KWOK_SENTENCE


def test_verifier_on_kwok_warns_and_claims_no_success(run):
    res = result(run, "verify-kwok-warn")
    assert res["_case_failed"] == ""
    assert res["cluster_verify_report"] == {"ok": False, "simulated": True, "msg": KWOK_SENTENCE}
    assert json.dumps(KWOK_SENTENCE) in task_output(run, "Run | say that no check ran")
    assert "skipping: [verify-kwok-warn]" in task_output(run, "Run | every engine pod must pass"), "no success message"


def test_verifier_without_logs_on_a_real_node_names_pod_node_phase_and_reason(run):
    msg = result(run, "verify-real-no-logs")["_case_failed"]
    assert msg == ("The verifier Job's pod kv-events-verifier-x7k2p on node worker-1 is Failed and left no logs, so there is no "
                   "report (the API: 400 Bad Request: no logs found for container \"verify\")."), msg


def test_verifier_report_passes_and_the_probe_reports_no_change(run):
    res = result(run, "verify-report")
    assert res["_case_failed"] == "" and res["cluster_verify_report"] == {"ok": True, "msg": "2 engine pods passed"}
    tasks = [c["task"] for c in calls(run, "verify-report")]
    assert tasks[0] == "Run | remove the previous Job" and tasks[-1] == "Run | remove the Job", tasks
    # The stand-in answers changed=true for every create and delete: changed_when false keeps the run at changed=0.
    for name in ("verify-report", "verify-kwok-warn"):
        assert recap(run, name)["changed"] == 0, recap(run, name)


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
    sys.path.insert(0, os.path.join(ROOT, "plugins", "filter"))
    try:
        import import_closure  # pylint: disable=import-error,import-outside-toplevel
    finally:
        sys.path.pop(0)
    files = import_closure.import_closure(["tools/cluster_verify.py"], ROOT)
    _args, config, job = _verifier(run, "verify-report")
    assert sorted(config["data"]) == sorted(f.replace("/", ".") for f in files)
    items = [v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "code"][0]["configMap"]["items"]
    assert [i["path"] for i in items] == files
    assert "tools/_loader.py" in files and "plugins/module_utils/engine/process.py" not in files
