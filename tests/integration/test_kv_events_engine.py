# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Real gaps on the real engine: a test instance of vLLM with a PUB high-water mark of 1, bursts of requests, every gap repaired.

The instance (``pytest-gap``, HTTP port 8200, KV events to tcp://127.0.0.1:5610 which the check binds, replay ROUTER on
tcp://127.0.0.1:5611) is started through the local_engine role with ``local_engine_kv_events_options: {hwm: 1}``
(vllm@v0.32.0:vllm/config/kv_events.py ``KVEventsConfig.hwm``: "After queueing N events, events will start dropping"),
shares the default engine's installation and model, and is stopped whatever happens. It takes the lock of
tests/integration/test_local_engine_e2e.py, so two engine test modules never run at once.

On this CPU engine a high-water mark of 1 alone drops a batch only now and then (measured: 0 to 3 of about 70 per run),
which would make a test that proves nothing in some runs. So the check's SUB socket also bounds its frames
(``ZMQ_MAXMSGSIZE``, 1 KiB): every batch larger than that (a prefill of many blocks) breaks the connection in flight and
the batches vLLM publishes until the engine has reconnected are dropped at its PUB socket. The stream then has gaps
the next live batch reveals, and the last batch (the prefill of a final long prompt) is lost with nothing after it:
the tail. All of them must come back through the engine's replay endpoint, where the frame bound does not apply.

Without the engine's installation (``make site``) the test is skipped with that reason; ``LOCAL_ENGINE_REQUIRED=1``
turns the skip into a failure.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import fcntl
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request

import msgspec
import pytest
import zmq

from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import events_check as check
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import events as kv
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import sockets as kvz

from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import router_decoder as D

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _engine_lane import ENGINE_PYTHON, ROOT, STATE_DIR  # noqa: E402  pylint: disable=wrong-import-position
from _engine_lane import engine_installed as _engine_installed  # noqa: E402  pylint: disable=wrong-import-position
from _engine_lane import playbook as _playbook  # noqa: E402  pylint: disable=wrong-import-position

INSTANCE, PORT = "pytest-gap", 8200
KV_ENDPOINT, REPLAY_ENDPOINT = "tcp://127.0.0.1:5610", "tcp://127.0.0.1:5611"
TOPIC = "kv@127.0.0.1:%d@tiny" % PORT
URL = "http://127.0.0.1:%d" % PORT
INSTANCE_VARS = ["-e", "local_engine_instance=%s" % INSTANCE, "-e", "local_engine_port=%d" % PORT,
                 "-e", "local_engine_kv_events_endpoint=%s" % KV_ENDPOINT, "-e", "local_engine_kv_events_replay_endpoint=%s" % REPLAY_ENDPOINT,
                 "-e", "local_engine_kv_events_topic=%s" % TOPIC, "-e", json.dumps({"local_engine_kv_events_options": {"hwm": 1}}),
                 "--tags", "local_engine"]
REQUESTS, PARALLEL = 48, 12
MAX_FRAME = 1024


@pytest.fixture(scope="module")
def engine():
    _engine_installed()
    os.makedirs(STATE_DIR, exist_ok=True)
    with open(os.path.join(STATE_DIR, ".pytest.lock"), "w") as lock:  # the lock of test_local_engine_e2e.py
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            stop = _playbook("playbooks/teardown.yml", *INSTANCE_VARS)  # whatever happened, stop the instance
            fcntl.flock(lock, fcntl.LOCK_UN)
            assert stop.returncode == 0, stop.stdout[-3000:]


def _complete(index, errors, words=120, max_tokens=40):
    # Distinct prompts (no shared prefix beyond the first block); 120 words are about 600 tokens, a prefill batch of kilobytes.
    prompt = "Request %d of the burst: %s" % (index, " ".join("word%d-%d" % (index, i) for i in range(words)))
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}).encode()
    req = urllib.request.Request(URL + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            resp.read()
    except Exception as exc:  # pylint: disable=broad-except
        errors.append("%s: %s" % (index, exc))  # reported by the test


def _burst(runner, done, errors):
    # The check binds first; the engine connects to it (and retries until it can): start once the check saw the connection
    # (a condition, bounded), not after a fixed delay. Its subscription then crosses loopback ahead of the first request's
    # prefill: vLLM's PUB socket acknowledges no subscription, so that one step is ordering, not an event.
    deadline = time.monotonic() + 300
    while not (runner.streams and all(s.connected for s in runner.streams)):
        if time.monotonic() > deadline:
            errors.append("the engine never connected to the check's endpoint")
            done.set()
            return
        time.sleep(0.05)
    _complete(0, errors, words=8, max_tokens=1)  # a small first batch: the check sees the stream from seq 0
    threads = []
    for index in range(1, 1 + REQUESTS):
        while sum(1 for t in threads if t.is_alive()) >= PARALLEL:
            time.sleep(0.01)
        thread = threading.Thread(target=_complete, args=(index, errors), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(300)
    time.sleep(1.0)
    _complete(REQUESTS + 1, errors, words=300, max_tokens=1)  # the last batch: one large prefill, nothing after it
    done.set()


class BurstCheck(check.KVEventsCheck):
    """The module's check, told when the burst is over: it stops once every request answered and the stream settled."""

    def __init__(self, params, done):
        super(BurstCheck, self).__init__(params, max_frame=MAX_FRAME)  # the check's SUB socket only, not the replay DEALER
        self.done = done

    def met(self):
        return self.done.is_set() and super(BurstCheck, self).met()


def _replay_buffer():
    """Everything the engine's replay buffer holds: {seq: BlockStored count}, and what the EPP's decoder would refuse."""
    ctx = zmq.Context()
    decoder = kv.KVDecoder()
    counts, refused = {}, []
    try:
        for _topic, seq, payload in kvz.replay(ctx, REPLAY_ENDPOINT, 0, time.monotonic() + 60):
            counts[seq] = sum(1 for ev in decoder.decode_payload(payload, TOPIC, seq).events if ev.type == "BlockStored")
            refused.extend("batch %d: %s" % (seq, problem) for problem in D.problems(msgspec.msgpack.decode(payload)))
        return counts, refused
    finally:
        ctx.destroy(0)


def test_every_gap_and_the_tail_repaired_through_the_engine_replay(engine):  # pylint: disable=redefined-outer-name,unused-argument
    start = _playbook("playbooks/site.yml", *INSTANCE_VARS)
    assert start.returncode == 0, start.stdout[-3000:]

    done, errors = threading.Event(), []
    runner = BurstCheck({"endpoint": KV_ENDPOINT, "socket_mode": "bind", "topic": TOPIC, "replay_endpoint": REPLAY_ENDPOINT,
                         "timeout": 900.0, "settle": 2.0, "expect": {"BlockStored": 1}, "engine": "auto"}, done)
    bursts = threading.Thread(target=_burst, args=(runner, done, errors), daemon=True)
    bursts.start()
    facts = runner.run()
    bursts.join(10)
    assert not errors, errors[:3]
    gaps, stream = facts["gaps"], facts["seq"]["%s#0" % TOPIC]
    details = gaps["details"]
    # Batches were really lost, mid-stream (before the stream's last batch, however the check found the gap: a later
    # sequence number or a quiet stream) and at the tail (otherwise this test proves nothing) ...
    assert any(g["end"] < stream["last"] for g in details), "no mid-stream gap: %s" % gaps
    assert gaps["tail"]["found"] >= 1 and gaps["tail"]["batches"] >= 1, "no batch of the tail was lost: %s" % gaps
    # ... and every one came back through the engine's replay endpoint.
    assert gaps["unrepaired"] == 0, details[:3]
    # The check ends where the engine's replay buffer ends and counted every BlockStored in it.
    buffered, refused = _replay_buffer()
    # Every batch the real engine published is one the EPP v0.9.0's decoder takes whole (issue 9, point 6).
    assert not refused, refused[:5]
    assert stream["first"] == min(buffered) == 0, (stream, min(buffered))
    assert max(buffered) == stream["last"], (max(buffered), stream)
    assert facts["counts"]["BlockStored"] == sum(buffered.values()), (facts["counts"], len(buffered))
    print("engine batches 0..%d, %d arrived live; gaps %d (tail %s); BlockStored %d"
          % (stream["last"], stream["batches"], gaps["found"], gaps["tail"], facts["counts"]["BlockStored"]))


def test_vllm_0_32_events_are_what_the_epp_decoder_takes(tmp_path):
    """Issue 9, point 6: every field of vLLM 0.32's events, encoded by vLLM's own encoder, as the EPP v0.9.0 reads it."""
    _engine_installed()
    run = subprocess.run([ENGINE_PYTHON, os.path.join(ROOT, "tests", "integration", "_kv_vllm_encode.py")],
                         capture_output=True, text=True, timeout=300, check=False,
                         env=dict(os.environ, TMPDIR=str(tmp_path)))  # importing vllm makes torchinductor_<user> there
    assert run.returncode == 0, run.stderr[-3000:]
    batches = json.loads(run.stdout.strip().splitlines()[-1])
    seen = []
    for batch in batches:
        decoded = msgspec.msgpack.decode(bytes.fromhex(batch["payload"]))
        assert D.problems(decoded) == [], batch["name"]
        seen.extend(D.tags(decoded))
        # vLLM 0.32 sends maps (the form older kv-cache decoders could not read): the check above is about maps.
        assert all(isinstance(ev, dict) for ev in decoded[1]), batch["name"]
    assert sorted(set(seen)) == ["AllBlocksCleared", "BlockRemoved", "BlockStored"]


def test_data_parallel_endpoints_are_vllms_own(tmp_path):
    """The endpoints the check subscribes to for rank N are the ones vLLM 0.32's publisher of rank N uses."""
    _engine_installed()
    cases = [["tcp://*:5557", 0], ["tcp://*:5557", 3], ["tcp://127.0.0.1:6000", 1], ["tcp://[::1]:7000", 2],
             ["inproc://kv", 2], ["tcp://*:0", 1]]
    code = ("import json, sys; from vllm.distributed.kv_events import ZmqEventPublisher as P; "
            "print(json.dumps([P.offset_endpoint_port(e, r) for e, r in json.loads(sys.argv[1])]))")
    run = subprocess.run([ENGINE_PYTHON, "-c", code, json.dumps(cases)], capture_output=True, text=True, timeout=300, check=False,
                         env=dict(os.environ, TMPDIR=str(tmp_path)))  # importing vllm makes torchinductor_<user> there
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == [kvz.offset_endpoint(e, r) for e, r in cases]
