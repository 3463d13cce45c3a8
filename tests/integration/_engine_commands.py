# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What the tests of the rendered engine commands share: the engine installation, one render of every case of
tests/integration/_k8s_render.py per pytest run, and the containers taken from it as the kubelet would run them.

test_rendered_engine_commands.py runs the vLLM commands (vLLM's parser, config builder, a start);
test_rendered_lmcache_commands.py runs the LMCache settings and the SGLang commands through their own code at the pin.
Both modules get the same render (it is made once and kept here for the run).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import contextlib
import fcntl
import os
import re
import subprocess
import sys
import time

import pytest
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _k8s_render as R  # noqa: E402  pylint: disable=wrong-import-position,import-error
from _engine_lane import ENGINE_PYTHON, STATE_DIR, TINY_MODEL, tiny_model_copy  # noqa: E402  pylint: disable=wrong-import-position,import-error

ROOT = R.ROOT
CLI = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_vllm_cli.py")
# The folder the commands run in (the model folders) and the pods' volumes: kept between runs, so vLLM's compile cache
# (VLLM_CACHE_ROOT under the /data volume) spares the next start its torch.compile.
WORKDIR = os.path.join(STATE_DIR, "rendered-commands")
PLAYBOOK = os.path.join(ROOT, ".venv", "bin", "ansible-playbook")
VLLM_VERSION = "0.32.0"

POD_IP = "127.0.0.71"
# Ports this test never takes: the local engine and its KV events, the kv_index engines, the lead's other services.
RESERVED_PORTS = {8000, 5557, 5558, 8300, 8301, 5700, 5701, 5702, 5703}
QWEN3_MAX_POSITIONS = 40960  # max_position_embeddings of Qwen/Qwen3-0.6B and Qwen/Qwen3-8B
# The pod command has no --enforce-eager: the engine compiles its model at start (torch.compile), 180 to over 300 s
# on this machine's 2 busy cores (the pod's startupProbe allows 1800 s). The compile cache under the /data volume is
# kept between runs (WORKDIR), so later starts are shorter.
START_TIMEOUT = 600
ADDED_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
# Volumes that exist here as they are in the pod.
LOCAL_MOUNTS = ("/tmp", "/dev/shm")

# The case whose CPU engine is started (the default command plus --enable-scale-out) and the one whose sidecar is.
STARTED_ENGINE_CASE = "cpu-precise-engine-tokens"
DEFAULT_CPU_CASE = "cpu-precise-clusterip"
STARTED_SIDECAR_CASE = "kind-inventory"

UPSTREAM_CPU_IMAGE = R.pinned("vllm_cpu")["repository"]
with open(R.PINS) as _pins:
    _SOFTWARE = yaml.safe_load(_pins)["software"]
LMCACHE_VERSION = _SOFTWARE["lmcache"]
LMCACHE_FOR_SGLANG = _SOFTWARE["lmcache_for_sglang"]
SGLANG_VERSION = _SOFTWARE["sglang"]


# -- the engine installation -------------------------------------------------------------------------------------

def _missing():
    return [path for path in (ENGINE_PYTHON, os.path.join(TINY_MODEL, "config.json")) if not os.path.exists(path)]


def _install_or_skip():
    if _missing() and os.environ.get("LOCAL_ENGINE_START") == "1":
        # Install and model only: this module starts its own processes and needs no default engine.
        run = subprocess.run([PLAYBOOK if os.path.exists(PLAYBOOK) else "ansible-playbook", "-i", "inventories/local",
                              "playbooks/site.yml", "--tags", "local_engine_preflight,local_engine_install,local_engine_model"],
                             cwd=ROOT, env=dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1"),
                             capture_output=True, text=True, timeout=1800, check=False)
        assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    missing = _missing()
    if missing:
        message = "No engine installation (%s missing): run `make site` first (or set LOCAL_ENGINE_START=1)." % ", ".join(missing)
        if os.environ.get("LOCAL_ENGINE_REQUIRED") == "1":
            pytest.fail(message)
        pytest.skip(message)


@contextlib.contextmanager
def installation():
    """The engine installation (skipped, or failed under LOCAL_ENGINE_REQUIRED=1, without it), held by one test module
    at a time."""
    _install_or_skip()
    os.makedirs(STATE_DIR, exist_ok=True)
    # One engine session at a time (the lock of test_local_engine_e2e.py and test_kv_events_engine.py).
    with open(os.path.join(STATE_DIR, ".pytest.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def lmcache_missing():
    message = ("LMCache is not installed in the engine venv %s (the local engine installs it with LMCache on), so the "
               "rendered LMCache settings cannot be run through LMCache %s's own loader and parser" % (ENGINE_PYTHON, LMCACHE_VERSION))
    if os.environ.get("LOCAL_ENGINE_REQUIRED") == "1":
        pytest.fail(message)
    pytest.skip(message)


def is_sglang(argv):
    return argv[:3] == ["python3", "-m", "sglang.launch_server"]


# -- rendering and extracting the commands (once per pytest run) --------------------------------------------------

_ONCE = {}


def rendered(tmp_path_factory):
    """Every case rendered (one parallel ``playbooks/render.yml`` run), once per pytest run."""
    if "rendered" not in _ONCE:
        tmp = str(tmp_path_factory.mktemp("render"))
        started = time.monotonic()
        returncode, output, out = R.run_render(tmp, R.CASES)
        assert returncode == 0, output[-4000:]
        cases = dict((name, R.load_case(out, name)) for name in R.CASES)
        _ONCE["rendered"] = {"cases": cases, "seconds": time.monotonic() - started}
    return _ONCE["rendered"]


_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def k8s_expand(text, env):
    """Kubernetes' variable expansion in command, args and env values: $(VAR) from the env, $$ an escaped $."""
    def repl(match):
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))
    return _REF.sub(repl, text)


def pod_env(container, pod_name, namespace, data_dir):
    """The container's environment as the kubelet builds it (here), and what could not be built."""
    assert not container.get("envFrom"), "envFrom is not handled by this test: %s" % container["name"]
    local = dict((m["mountPath"], os.path.join(data_dir, m["name"])) for m in container.get("volumeMounts", [])
                 if m["mountPath"] not in LOCAL_MOUNTS)
    env, left_out = {}, []
    for entry in container.get("env", []):
        name = entry["name"]
        if "value" in entry:
            value = k8s_expand(str(entry["value"]), env)
        elif "fieldRef" in entry.get("valueFrom", {}):
            path = entry["valueFrom"]["fieldRef"]["fieldPath"]
            value = {"status.podIP": POD_IP, "metadata.name": pod_name, "metadata.namespace": namespace}.get(path)
            assert value is not None, "fieldRef %s of %s is not handled by this test" % (path, name)
        elif "secretKeyRef" in entry.get("valueFrom", {}):
            left_out.append("%s (Secret %s: no Secret here; it only authenticates hub downloads)"
                            % (name, entry["valueFrom"]["secretKeyRef"]["name"]))
            continue
        else:
            raise AssertionError("env %s of %s: %s is not handled by this test" % (name, container["name"], entry))
        for mount, path in local.items():
            if value == mount or value.startswith(mount + "/"):
                value = path + value[len(mount):]
        env[name] = value
    return env, left_out


def is_vllm(argv):
    return bool(argv) and (os.path.basename(argv[0]) == "vllm" or (len(argv) > 2 and argv[1] == "-m" and argv[2].split(".")[0] == "vllm"))


def model_ids(argv):
    """The model the command names: `--model X`, or the first positional argument after the subcommand."""
    args = list(argv)
    if "--model" in args:
        return [args[args.index("--model") + 1]]
    for flag in [a for a in args if a.startswith("--model=")]:
        return [flag.split("=", 1)[1]]
    rest = args[2:] if args[1:2] == ["serve"] else args[3:] if args[1:3] == ["launch", "render"] else []
    return [rest[0]] if rest and not rest[0].startswith("-") else []


def render_sidecar(case):
    """The render sidecar beside the EPP, as the v0.9.0 chart builds it from router.tokenizer, or None."""
    tokenizer = case["router_values"]["router"]["tokenizer"]
    if not tokenizer.get("enabled"):
        return None
    port = int(tokenizer.get("port") or 8000)
    return {"name": "vllm-render", "image": "%s/%s:%s" % (tokenizer["image"]["registry"], tokenizer["image"]["repository"],
                                                          tokenizer["image"]["tag"]),
            "command": tokenizer.get("command") or ["vllm", "launch", "render"],
            "args": tokenizer.get("args") or [tokenizer["modelName"], "--port=%d" % port],
            "env": tokenizer["env"], "port": port, "modelName": tokenizer["modelName"],
            "volumeMounts": [{"name": "model-cache", "mountPath": "/root/.cache/huggingface"}]}


def containers(name, case, data_dir):
    """Every container this module looks at: (id, role, container, argv, env, left_out, image)."""
    found = []
    for doc in case["manifests"]["model_server"]:
        if doc["kind"] != "Deployment":
            continue
        pod = doc["spec"]["template"]["spec"]
        namespace = doc["metadata"].get("namespace", "default")
        for container in pod.get("initContainers", []) + pod["containers"]:
            env, left_out = pod_env(container, doc["metadata"]["name"] + "-0", namespace, data_dir)
            argv = [k8s_expand(a, env) for a in (container.get("command") or []) + (container.get("args") or [])]
            found.append({"id": "%s/%s/%s" % (name, doc["metadata"]["name"], container["name"]), "role": "engine-pod",
                          "group": doc["metadata"]["name"], "container": container, "argv": argv, "env": env,
                          "left_out": left_out, "image": container["image"], "profile": case["engine"]["profile"]})
    sidecar = render_sidecar(case)
    if sidecar:
        env, left_out = pod_env(sidecar, "inference-cache-router-epp-0", "inference-cache", data_dir)
        argv = [k8s_expand(a, env) for a in sidecar["command"] + sidecar["args"]]
        found.append({"id": "%s/router-epp/vllm-render" % name, "role": "render-sidecar", "group": "router-epp",
                      "container": sidecar, "argv": argv, "env": env, "left_out": left_out, "image": sidecar["image"],
                      "profile": "router"})
    return found


def local_env(entry, home):
    """The environment a command runs with here: the pod's, ADDED_ENV, and a temporary folder under ``home`` with
    vLLM's ZMQ ipc sockets in the abstract namespace (vLLM names them <VLLM_RPC_BASE_PATH>/<uuid4> and leaves the files
    behind), so nothing lands in the host's temporary folder."""
    tmp = os.path.join(home, "tmp")
    os.makedirs(tmp, exist_ok=True)
    env = {"PATH": os.path.dirname(ENGINE_PYTHON) + ":/usr/local/bin:/usr/bin:/bin", "HOME": home}
    env.update(entry["env"])
    env.update(ADDED_ENV)
    env.update(TMPDIR=tmp, VLLM_RPC_BASE_PATH="@inference_cache/rendered-commands")
    return env


def make_model_dirs(workdir, ids):
    """`<workdir>/<hub id>`: the tiny model, with Qwen3's max_position_embeddings (the arguments stay as rendered)."""
    for model in ids:
        assert not os.path.isabs(model) and ".." not in model.split("/"), "the model %r is not a hub id" % model
        tiny_model_copy(os.path.join(workdir, model), QWEN3_MAX_POSITIONS)


def commands(tmp_path_factory):
    """Every case's containers (``containers``), the vLLM ones apart, the tiny model under each hub id they name."""
    if "commands" not in _ONCE:
        done = rendered(tmp_path_factory)
        workdir = WORKDIR
        data_dir = os.path.join(workdir, ".volumes")
        os.makedirs(data_dir, exist_ok=True)
        per_case = dict((name, containers(name, case, data_dir)) for name, case in done["cases"].items())
        vllm = [c for found in per_case.values() for c in found if is_vllm(c["argv"])]
        make_model_dirs(workdir, sorted(set(m for c in vllm for m in model_ids(c["argv"]))))
        _ONCE["commands"] = {"workdir": workdir, "data_dir": data_dir, "per_case": per_case, "vllm": vllm, "rendered": done}
    return _ONCE["commands"]


def arg_value(argv, flag):
    for index, arg in enumerate(argv):
        if arg == flag:
            return argv[index + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def only(entries, role, group=None):
    found = [e for e in entries if e["role"] == role and (group is None or e["group"] == group) and is_vllm(e["argv"])]
    assert len(found) == 1, [e["id"] for e in entries]
    return found[0]
