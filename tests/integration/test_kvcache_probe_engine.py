# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The llm-d router's own KV-event code, executed on the real engine's events (issue 17, point 8).

The llm-d router (EPP) v0.9.0 reads KV events through github.com/llm-d/llm-d-kv-cache v0.9.0 (its go.sum pins
h1:6hLLJGrP91A28LYH2Gd5i81e5sreSSHizdlSnB9NXqc=, the hash tools/kvcache_probe/go.sum pins too). The EPP cannot be
built here, that module can: tools/kvcache_probe wires kv-cache's SubscriberManager (its ZMQ SUB socket, bound),
event pool, vLLM adapter, in-memory index, token processor and longest-prefix scorer together and answers lookups.

A vLLM 0.32 instance of its own (``pytest-kvcache``, HTTP port 8520, KV events to tcp://127.0.0.1:5920 which the probe
binds, no replay endpoint, topic ``kv@127.0.0.1:8520@tiny``) is started through the local_engine role, sharing the
default engine's installation and model, and stopped whatever happens; it takes the lock of
tests/integration/test_local_engine_e2e.py, so two engine test modules never run at once. Then kv-cache must decode
every batch (0 parse failures), index the prompt's full blocks under the engine's pod identity (the topic's
127.0.0.1:8520), predict a hit on exactly the shared blocks of a second prompt before it is sent, and find nothing for
another model name or another hash seed (what kv-cache keys its blocks by besides the tokens).

The probe is built once per session with ``make kvcache-probe`` (Go; the first build fetches the modules through the
Go module proxy). Without the engine's installation (``make site``) or without Go the test is skipped with that
reason; ``LOCAL_ENGINE_REQUIRED=1`` turns the skip into a failure.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import fcntl
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _engine_lane import ROOT, STATE_DIR  # noqa: E402  pylint: disable=wrong-import-position
from _engine_lane import engine_installed as _engine_installed  # noqa: E402  pylint: disable=wrong-import-position
from _engine_lane import port_free as _port_free, playbook as _playbook, skip_or_fail as _skip_or_fail  # noqa: E402  pylint: disable=wrong-import-position
from ansible_collections.inference_cache.substrate.plugins.module_utils.go import build as _go_build  # noqa: E402  pylint: disable=wrong-import-position,wrong-import-order


def _probe_path():
    """Where the catalog's kvcache-probe build is (vars/go_builds.yml, its version llm-d-kv-cache's pin)."""
    import yaml  # pylint: disable=import-outside-toplevel
    with open(os.path.join(ROOT, "vars", "pinned_versions.yml")) as handle:
        version = yaml.safe_load(handle)["software"]["llm_d_kv_cache"]
    return os.path.join(_go_build.build_dir(_go_build.state_dir(), "kvcache-probe", version), "kvcache_probe")


PROBE = _probe_path()

# Ports no other run uses (make test: 8000, 5557-5558, 8100-8110, 8200, 5610-5611, 8300-8301, 5700-5703;
# bench-routing: 8400-8401, 5800-5803).
INSTANCE, PORT, KV_PORT = "pytest-kvcache", 8520, 5920
KV_ENDPOINT = "tcp://127.0.0.1:%d" % KV_PORT
POD = "127.0.0.1:%d" % PORT
MODEL = "tiny"
TOPIC = "kv@%s@%s" % (POD, MODEL)
URL = "http://127.0.0.1:%d" % PORT
BLOCK = 32
INSTANCE_VARS = ["-e", json.dumps({"local_engine_instance": INSTANCE, "local_engine_port": PORT,
                                   "local_engine_kv_events_endpoint": KV_ENDPOINT,
                                   "local_engine_kv_events_replay_endpoint": "", "local_engine_kv_events_topic": TOPIC}),
                 "--tags", "local_engine"]


@pytest.fixture(scope="session")
def probe_binary():
    """tools/kvcache_probe built once per session through the catalog of Go builds (make kvcache-probe; built again only when
    its sources change)."""
    _engine_installed()  # no build for a test that cannot run
    if not shutil.which("go"):
        _skip_or_fail("No Go toolchain on PATH: tools/kvcache_probe (llm-d-kv-cache v0.9.0) cannot be built.")
    started = time.monotonic()
    build = subprocess.run(["make", "-s", "kvcache-probe"], cwd=ROOT, capture_output=True, text=True, timeout=3600, check=False)
    assert build.returncode == 0, (build.stdout + build.stderr)[-3000:]
    print("make kvcache-probe: %.1f s" % (time.monotonic() - started))
    return PROBE


class Probe:
    """The running probe: JSON lines in, JSON lines out."""

    def __init__(self, binary, *args):
        # A process group of its own, so that it is stopped whatever happens.
        self.proc = subprocess.Popen([binary] + list(args), stdin=subprocess.PIPE, stdout=subprocess.PIPE,  # pylint: disable=consider-using-with
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.lines = queue.Queue()
        self.stderr = []
        threading.Thread(target=self._read, args=(self.proc.stdout, self.lines.put), daemon=True).start()
        threading.Thread(target=self._read, args=(self.proc.stderr, self.stderr.append), daemon=True).start()
        self.ready = self._answer(30)

    @staticmethod
    def _read(stream, sink):
        for line in stream:
            sink(line)

    def _answer(self, timeout):
        try:
            return json.loads(self.lines.get(timeout=timeout))
        except queue.Empty:
            raise AssertionError("the probe did not answer within %s s; stderr: %s"
                                 % (timeout, "".join(self.stderr)[-3000:])) from None

    def ask(self, request, timeout=30):
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._answer(timeout)

    def stats(self):
        return self.ask({"stats": True})

    def lookup(self, tokens, model=MODEL, **extra):
        return self.ask(dict({"lookup": tokens, "model": model}, **extra))

    def close(self):
        """stdin EOF: the probe must exit 0 by itself."""
        self.proc.stdin.close()
        return self.proc.wait(timeout=30)

    def kill(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def _post(path, body, timeout=300):
    req = urllib.request.Request(URL + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def _tokens(prompt):
    return _post("/tokenize", {"model": MODEL, "prompt": prompt})["tokens"]


def _complete(prompt):
    return _post("/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1})


def _until(what, predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        value = what()
        if predicate(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.3)


def _holders(lookup):
    return [POD in pods for pods in lookup["blocks"]]


@pytest.fixture(scope="module")
def engine_and_probe(probe_binary):  # pylint: disable=redefined-outer-name
    _engine_installed()
    os.makedirs(STATE_DIR, exist_ok=True)
    with open(os.path.join(STATE_DIR, ".pytest.lock"), "w", encoding="utf-8") as lock:  # the lock of test_local_engine_e2e.py
        fcntl.flock(lock, fcntl.LOCK_EX)
        probe, started = None, False
        try:
            busy = [port for port in (PORT, KV_PORT) if not _port_free(port)]
            assert not busy, "ports %s are taken: another run uses them" % busy
            probe = Probe(probe_binary, "-endpoint", KV_ENDPOINT, "-mode", "bind", "-block-size", str(BLOCK), "-hash-seed", "0")
            started = True
            start = _playbook("playbooks/site.yml", *INSTANCE_VARS)
            assert start.returncode == 0, start.stdout[-3000:]
            yield probe
        finally:
            if probe is not None:
                probe.kill()
            stop = _playbook("playbooks/teardown.yml", *INSTANCE_VARS) if started else None  # whatever happened
            fcntl.flock(lock, fcntl.LOCK_UN)
            assert stop is None or stop.returncode == 0, stop.stdout[-3000:]


def test_kvcache_v0_9_0_indexes_the_real_engines_events(engine_and_probe):  # pylint: disable=redefined-outer-name
    probe = engine_and_probe
    assert probe.ready["ready"] is True and probe.ready["mode"] == "bind" and probe.ready["block_size"] == BLOCK

    # The engine connects to the probe's bound socket; batches published before the subscription arrived are lost
    # (ZMQ PUB/SUB), so distinct short prompts go out until the probe has received one.
    attempt = [0]

    def warm():
        attempt[0] += 1
        _complete("Warm-up %d: " % attempt[0] + " ".join("w%d" % i for i in range(60)))
        return probe.stats()

    warmed = _until(warm, lambda s: s["events"].get("BlockStored", 0) > 0, timeout=90)
    assert warmed["events"].get("BlockStored", 0) > 0, warmed

    words = ["alpha%d" % i for i in range(140)]
    prompt_a = "Shared system prompt. " + " ".join(words) + " Question A: " + " ".join("a%d" % i for i in range(80))
    prompt_b = "Shared system prompt. " + " ".join(words) + " Question B: " + " ".join("b%d" % i for i in range(80))
    tokens_a, tokens_b = _tokens(prompt_a), _tokens(prompt_b)
    full_a, full_b = len(tokens_a) // BLOCK, len(tokens_b) // BLOCK
    same = next((i for i, (x, y) in enumerate(zip(tokens_a, tokens_b)) if x != y), min(len(tokens_a), len(tokens_b)))
    shared = same // BLOCK
    assert full_a >= 8 and 2 <= shared < min(full_a, full_b), (len(tokens_a), len(tokens_b), same)

    # Nothing before the engine saw the prompt.
    cold = probe.lookup(tokens_a)
    assert cold["block_keys"] == full_a and not any(cold["blocks"]) and cold["scores"] == {}, cold

    _complete(prompt_a)
    hot = _until(lambda: probe.lookup(tokens_a), lambda r: all(_holders(r)))
    # Every full block of the prompt is held by the engine, under the pod identity of its topic, on the gpu tier
    # (vLLM's medium "GPU", lowercased), and the longest-prefix scorer gives it one point per block.
    assert hot["block_keys"] == full_a and all(_holders(hot)), hot
    assert all(pods == [POD] for pods in hot["blocks"]), hot["blocks"]
    assert all(entry.startswith(POD + "@gpu") for entries in hot["entries"] for entry in entries), hot["entries"]
    assert hot["prefix_blocks"] == {POD: full_a} and hot["scores"] == {POD: float(full_a)}, hot

    # Before the second prompt is sent: a hit on its shared blocks, and on nothing after them.
    predicted = probe.lookup(tokens_b)
    assert _holders(predicted) == [True] * shared + [False] * (full_b - shared), predicted["blocks"]
    assert predicted["prefix_blocks"] == {POD: shared} and predicted["scores"] == {POD: float(shared)}, predicted

    # After it: kv-cache chained its new blocks onto the shared ones (parent hash -> request key) and holds all of them.
    _complete(prompt_b)
    after = _until(lambda: probe.lookup(tokens_b), lambda r: all(_holders(r)))
    assert all(_holders(after)) and after["prefix_blocks"] == {POD: full_b}, after

    # The negatives: another model name, another hash seed -> other keys, nothing found (the test can fail).
    other_model = probe.lookup(tokens_a, model="tiny-other")
    assert other_model["block_keys"] == full_a and not any(other_model["blocks"]) and other_model["scores"] == {}, other_model
    other_seed = probe.lookup(tokens_a, hash_seed="1")
    assert other_seed["block_keys"] == full_a and not any(other_seed["blocks"]) and other_seed["scores"] == {}, other_seed

    stats = probe.stats()
    print("prompt A %d tokens (%d full blocks), B %d tokens (%d), %d shared blocks; kv-cache v0.9.0 on vLLM 0.32: %s"
          % (len(tokens_a), full_a, len(tokens_b), full_b, shared, json.dumps(stats, sort_keys=True)))
    assert stats["parse_failures"] == 0, stats["last_parse_error"]
    assert stats["messages_parsed"] == stats["messages_received"] > 0, stats
    assert stats["pods"] == {POD: stats["messages_parsed"]} and stats["models"] == {MODEL: stats["messages_parsed"]}, stats
    assert stats["events"]["BlockStored"] > 0 and stats["stored_blocks"] >= full_a + full_b - shared, stats
    assert stats["index"]["add_errors"] == 0 and stats["index"]["request_keys"] >= full_a + full_b - shared, stats
    assert stats["metrics"]["admissions_total"] == stats["index"]["request_keys"], stats  # kv-cache's own counter agrees
    # stdin EOF: the probe exits cleanly.
    assert probe.close() == 0, "".join(probe.stderr)[-3000:]
