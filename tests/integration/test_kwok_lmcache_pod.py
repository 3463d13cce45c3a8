# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The local_engine role's entry point `pod` on a pod of model_server's vllm_lmcache render, without an engine.

The pod is model_server's rendered Deployment's pod template with a 127.x IP, as a kwok cluster's API server returns it;
the entry point runs with ``local_engine_state: absent`` (nothing is installed or started) and publishes what the engine
would be told. The real engine behind a kwok pod runs in the molecule scenario ``kwok`` (playbooks/kwok_lmcache.yml).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import copy
import json
import os
import subprocess

import pytest
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.path.join(ROOT, ".venv", "bin")
CASE = "gpu-lmcache-approximate-clusterip"   # _k8s_render.CASES: vllm_lmcache, LMCache's multiprocess mode (the default)
IP = "127.0.0.61"


@pytest.fixture(scope="module")
def pod(rendered_cases):
    docs = rendered_cases["cases"][CASE]["manifests"]["model_server"]
    deployment = next(d for d in docs if d["kind"] == "Deployment"
                      and any(c["name"] == "engine" for c in d["spec"]["template"]["spec"]["containers"]))
    return {"metadata": {"name": deployment["metadata"]["name"] + "-0", "namespace": deployment["metadata"]["namespace"]},
            "spec": deployment["spec"]["template"]["spec"], "status": {"phase": "Running", "podIP": IP}}


def _flags(args):
    return {a: b for a, b in zip(args, args[1:]) if a.startswith("--") and not b.startswith("--")}


def _entry_point(tmp_path, pod, **variables):
    """Run the entry point `pod` with local_engine_state=absent (and ``variables``); (returncode, output,
    local_engine_info or None)."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    out = tmp_path / "out.json"
    play = [{"name": "The entry point pod", "hosts": "localhost", "gather_facts": False, "tasks": [
        {"name": "A real engine for the pod (stopped: nothing is installed or started)",
         "ansible.builtin.include_role": {"name": "inference_cache.substrate.local_engine", "tasks_from": "pod"},
         "vars": dict(variables, local_engine_pod=pod, local_engine_instance="lmk-pod-test", local_engine_state="absent")},
        {"name": "What the engine was told", "ansible.builtin.copy": {
            "content": "{{ local_engine_info | to_json }}", "dest": str(out), "mode": "0644"}}]}]
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    env = dict(os.environ, HOME=str(home), ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"), ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_NOCOLOR="1", ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".cache", "collections"))
    run = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "inventories/local", str(playbook)], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=300, check=False)
    info = json.loads(out.read_text()) if out.exists() else None
    return run.returncode, run.stdout + run.stderr, info


def test_the_engine_is_told_what_the_pod_says(tmp_path, pod):
    engine = next(c for c in pod["spec"]["containers"] if c["name"] == "engine")
    flags = _flags(engine["args"])
    ports = {p["name"]: p["containerPort"] for p in engine["ports"]}
    rc, output, info = _entry_point(tmp_path, pod)
    assert rc == 0, output[-3000:]
    assert info["url"] == "http://%s:%d" % (IP, ports["http"])
    assert info["model"] == flags["--served-model-name"]
    assert int(info["block_size"]) == int(flags["--block-size"])
    # Blocks for the pod's model length and vLLM's null block (the role's default 128 where that is enough): 4096
    # positions of blocks of 32 need 129.
    size, length = int(flags["--block-size"]), int(flags["--max-model-len"])
    assert int(info["max_model_len"]) == length
    assert int(info["num_gpu_blocks"]) == max(128, -(-length // size) + 1)
    assert (int(info["num_gpu_blocks"]) - 1) * size >= length
    assert info["kv_events_endpoint"] == "tcp://%s:%d" % (IP, ports["kv-events"])
    # The pod's topic names its own IP through $(POD_IP); here it is the IP the API server gave the pod.
    assert info["kv_events_topic"] == json.loads(flags["--kv-events-config"])["topic"].replace("$(POD_IP)", IP)
    assert IP in info["kv_events_topic"]
    assert not (tmp_path / "home" / ".cache" / "inference_cache" / "local_engine" / "run").exists()


def _with_blocks(pod, blocks):
    engine = copy.deepcopy(pod)
    next(c for c in engine["spec"]["containers"] if c["name"] == "engine")["args"] += ["--num-gpu-blocks-override", str(blocks)]
    return engine


@pytest.mark.parametrize("blocks, variables, expected", [
    (300, {}, 300),                                             # the pod's own count
    (None, {"local_engine_num_gpu_blocks_override": 0}, 0),     # vLLM sizes the cache
    (None, {"local_engine_num_gpu_blocks_override": 400}, 400),  # more than the pod's model length needs
])
def test_the_block_count_follows_the_pod_then_the_setting(tmp_path, pod, blocks, variables, expected):
    rc, output, info = _entry_point(tmp_path, pod if blocks is None else _with_blocks(pod, blocks), **variables)
    assert rc == 0, output[-3000:]
    assert int(info["num_gpu_blocks"]) == expected


def _miswired_port(pod):
    sidecar = next(c for c in pod["spec"]["initContainers"] if c["name"] == "lmcache-server")
    index = sidecar["args"].index("--port") + 1
    sidecar["args"][index] = str(int(sidecar["args"][index]) + 1)


def _no_sidecar(pod):
    pod["spec"]["initContainers"] = [c for c in pod["spec"]["initContainers"] if c["name"] != "lmcache-server"]


def _cluster_ip(pod):
    pod["status"]["podIP"] = "10.244.0.7"


@pytest.mark.parametrize("break_it", [_miswired_port, _no_sidecar, _cluster_ip])
def test_a_pod_that_is_not_wired_within_itself_is_refused(tmp_path, pod, break_it):
    broken = copy.deepcopy(pod)
    break_it(broken)
    rc, output, info = _entry_point(tmp_path, broken)
    assert rc != 0 and info is None
    assert "is not an engine pod of the vllm_lmcache profile in multiprocess mode with a 127.x IP" in " ".join(output.split())
