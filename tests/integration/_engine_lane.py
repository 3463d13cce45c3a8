# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What the engine-lane tests that start their own local_engine instance share: paths, skip-or-fail, the playbook run,
the engine's decode rate, and the lines of a vLLM log that show how a stop went."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PLAYBOOK = os.path.join(ROOT, ".venv", "bin", "ansible-playbook")
STATE_DIR = os.path.expanduser("~/.cache/inference_cache/local_engine")
ENGINE_PYTHON = os.path.join(STATE_DIR, "venv", "bin", "python")
TINY_MODEL = os.path.join(STATE_DIR, "models", "tiny-llama")
ENV = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")


def skip_or_fail(reason):
    """Skip, or fail where the engine lane is required (LOCAL_ENGINE_REQUIRED=1, as `make engine` sets it)."""
    if os.environ.get("LOCAL_ENGINE_REQUIRED") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def engine_installed():
    if not os.path.exists(ENGINE_PYTHON):
        skip_or_fail("No engine installation at %s (run `make site`): the real-engine tests need it." % ENGINE_PYTHON)


def playbook(*args, timeout=900, env=None):
    cmd = [PLAYBOOK if os.path.exists(PLAYBOOK) else "ansible-playbook"] + list(args)
    return subprocess.run(cmd, cwd=ROOT, env=env or ENV, capture_output=True, text=True, timeout=timeout, check=False)


def port_free(port, host="127.0.0.1"):
    """Whether ``port`` on ``host`` can be bound now, as the engine and the probe bind it (SO_REUSEADDR: connections of
    an earlier run in TIME_WAIT do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            return True
        except OSError:
            return False


def tiny_model_copy(target, max_positions):
    """The role's tiny model at ``target`` (its files linked, not copied) with ``max_positions`` in its config.json: vLLM
    refuses a --max-model-len above the config's max_position_embeddings (2048 as the role builds it)."""
    with open(os.path.join(TINY_MODEL, "config.json")) as handle:
        config = json.load(handle)
    config["max_position_embeddings"] = max_positions
    if os.path.isdir(target):
        shutil.rmtree(target)
    os.makedirs(target)
    for item in os.listdir(TINY_MODEL):
        if item != "config.json":
            os.symlink(os.path.join(TINY_MODEL, item), os.path.join(target, item))
    with open(os.path.join(target, "config.json"), "w") as handle:
        json.dump(config, handle, indent=2)
    return target


def post_json(url, body, timeout=120):
    """HTTP status and JSON answer of a POST (an error status: its body as text)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def decode_rate(url, served):
    """Tokens per second of the engine at ``url`` for one sequence: a completion of 576 tokens over its whole time, after
    one of 64 that warms the engine up. The request's overhead and prefill count as decoding time, so the rate errs low
    (a shorter request, never a longer one). Not the difference of the two: in a cold `.ci/run` the two took about as
    long, and 512 tokens over the 0.01 s floor gave 51200 tokens/s (a request of 32690 tokens, unfinished after a 600 s
    drain)."""
    def complete(tokens):
        status, body = post_json(url + "/v1/completions", {"model": served, "prompt": "rate", "max_tokens": tokens, "temperature": 0,
                                                           "ignore_eos": True})
        assert status == 200, body

    complete(64)
    started = time.monotonic()
    complete(576)
    return 576 / (time.monotonic() - started)


# vLLM 0.32.0's engine core, when it handles SIGTERM with a request in flight and a shutdown timeout
# (vllm/v1/engine/core.py _handle_shutdown; " timeout=<s>s" follows).
ENGINE_CORE_DRAINING = "[shutdown] EngineCore: draining in-flight requests count=1"


def shutdown_lines(log):
    """vLLM's lines of a stop in the text of its log: its [shutdown] lines, its throughput every 10 s, warnings and errors
    (not the tracebacks)."""
    keep = ("[shutdown]", "throughput", "ERROR", "WARNING", "Error:")
    return "\n".join(line[:240] for line in log.splitlines() if any(k in line for k in keep))[-4000:]
