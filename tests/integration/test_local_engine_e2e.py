# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""End to end against the real local vLLM engine (REFERENCE part L).

Assumes the engine that ``playbooks/site.yml`` starts is running at the default address (http://127.0.0.1:8000,
KV events to tcp://127.0.0.1:5557, replay on 5558): run ``ansible-playbook playbooks/site.yml`` first, or set
``LOCAL_ENGINE_START=1`` and this module runs it (and stops it again with ``playbooks/teardown.yml`` at the end). Without a running
engine every test here is skipped with that reason; ``LOCAL_ENGINE_REQUIRED=1`` turns the skip into a failure (CI).
``LOCAL_ENGINE_OWNED=1`` says that a running default engine belongs to this test run (``make test`` hands over the one its
molecule scenario converged): the module then treats it as one it started.

LMCache (the default engine runs one beside it when playbooks/site.yml started it, HTTP API 51 above the engine's port):
the LMCache check passes on the default engine (about 5 s), fails with its sentence on a stopped server, which site.yml
then starts again with the engine after it (about 40 s, only on an engine this module owns), and on an instance of vLLM's
in-process connector on CPU (``pytest-lmc-inproc``, port 8120, about 60 s).

The bad-input tests start extra engine instances (instance names ``pytest-*``, ports 8100-8102, replay ports 1000 higher) next to
the default one, sharing its installation and model, and stop them again. The restart test, the module's last, restarts and stops
the default engine when this module started it (that stop is the module's teardown); an engine it did not start is left alone,
and the test then uses an instance of its own (``pytest-restart``, port 8110).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.http import openai as http
from ansible_collections.inference_cache.substrate.plugins.module_utils.http import prefix_cache as pc
from ansible_collections.inference_cache.substrate.plugins.module_utils.service import process, supervisor

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
URL = os.environ.get("LOCAL_ENGINE_URL", "http://127.0.0.1:8000")
PLAYBOOK = os.path.join(os.path.dirname(os.path.join(ROOT, ".venv", "bin", "python")), "ansible-playbook")
STATE_DIR = os.path.expanduser("~/.cache/inference_cache/local_engine")


ENV = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", ANSIBLE_CALLBACK_RESULT_FORMAT="json")
# Set by the module fixture: whether this module started the default engine (and so may restart and stop it).
STARTED_HERE = {"default": False}


def _playbook(*args, timeout=900):
    cmd = [PLAYBOOK if os.path.exists(PLAYBOOK) else "ansible-playbook"] + list(args)
    return subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout, check=False)


def _check(args):
    adhoc = os.path.join(os.path.dirname(PLAYBOOK), "ansible")
    return subprocess.run([adhoc, "localhost", "-m", "inference_cache.substrate.prefix_cache_check", "-a", args],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300, check=False)


def _recap(output):
    match = re.search(r"localhost\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", output)
    assert match, output[-2000:]
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, match.groups())))


def _engine_up():
    try:
        http.OpenAIClient(URL, timeout=3).get_text("/health")
        return True
    except http.OpenAIHTTPError:
        return False


@pytest.fixture(scope="module", autouse=True)
def engine():
    # One session at a time: the tests share the engine, the KV-event port the checker binds and the pytest-* instances.
    os.makedirs(STATE_DIR, exist_ok=True)
    with open(os.path.join(STATE_DIR, ".pytest.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        starts_engine = os.environ.get("LOCAL_ENGINE_START") == "1" and not _engine_up()
        STARTED_HERE["default"] = starts_engine or os.environ.get("LOCAL_ENGINE_OWNED") == "1"
        try:
            _start_or_skip()
            yield URL
        finally:
            if STARTED_HERE["default"]:  # leave nothing running that this module started (or owns)
                _playbook("playbooks/teardown.yml")
            fcntl.flock(lock, fcntl.LOCK_UN)


def _start_or_skip():
    if not _engine_up() and os.environ.get("LOCAL_ENGINE_START") == "1":
        result = _playbook("playbooks/site.yml")
        assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    if not _engine_up():
        if os.environ.get("LOCAL_ENGINE_REQUIRED") == "1":
            pytest.fail("No engine at %s: run ansible-playbook playbooks/site.yml first." % URL)
        pytest.skip("No engine at %s: run ansible-playbook playbooks/site.yml first (or set LOCAL_ENGINE_START=1)." % URL)


def test_probe_hits_on_the_real_engine():
    client = http.OpenAIClient(URL, timeout=60)
    result = pc.PrefixCacheProbe(client, URL + "/metrics", model="tiny", prefix_tokens=200).run()
    assert result["engine"] == "vllm" and result["block_size"] == 32 and result["block_size_source"] == "metrics"
    assert result["cold"]["hit_tokens"] == 0 and result["cold"]["cached_tokens"] == 0
    assert result["hit_tokens"] == result["expected_hit_tokens"] >= 192
    assert result["cached_tokens"] == result["hit_tokens"]
    assert pc.evaluate(result) == []


def test_prefix_cache_check_module_passes_and_fails():
    args = "url=%s model=tiny prefix_tokens=128" % URL
    run = _check(args)
    assert run.returncode == 0, run.stdout[-2000:]
    result = json.loads(run.stdout.split("=>", 1)[1])
    # The prefix is at least 128 tokens; how far past that depends on how its random nonce tokenizes: every full block hits.
    assert result["changed"] is False and result["prefix_tokens"] >= 128
    # The cold and warm suffixes may begin with the same tokens, so a block past the prefix can hit too (a CI run: 160, not 128).
    assert result["hit_tokens"] == result["expected_hit_tokens"] >= result["prefix_tokens"] // 32 * 32
    # An expectation that cannot hold fails with one sentence.
    run = _check(args + " min_hit_tokens=4096")
    assert run.returncode != 0
    assert re.search(r"The warm request hit \d+ cached tokens, fewer than min_hit_tokens=4096\.", run.stdout), run.stdout[-2000:]
    # A prefix shorter than one block is refused before anything is sent.
    run = _check("url=%s model=tiny prefix_tokens=8" % URL)
    assert run.returncode != 0 and "prefix_tokens=8 is shorter than one block (32 tokens)" in run.stdout
    # A metrics page that is not there.
    run = _check(args + " metrics_url=%s/nometrics" % URL)
    assert run.returncode != 0 and "The metrics endpoint %s/nometrics is missing (HTTP 404)." % URL in run.stdout
    # Nothing listening.
    run = _check("url=http://127.0.0.1:9 model=tiny timeout=3")
    assert run.returncode != 0 and "Cannot reach http://127.0.0.1:9/metrics" in run.stdout


def test_verify_playbook_passes_and_writes_a_report(tmp_path):
    result = _playbook("playbooks/verify.yml", "-e", "verify_report_dir=%s" % tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["passed"] is True and report["failure"] is None
    # The engine's own tier (medium GPU; on a CPU engine too): with LMCache beside it, the stream also carries the host
    # tier's chunks (medium CPU, block size 64), counted apart.
    cold = report["kv_events_cold"]
    engine_tier = (cold.get("media") or {}).get("GPU", cold)
    assert engine_tier["block_size"] == 32
    if _lmcache_up():
        assert cold["block_size"] == [32, 64] and cold["media"]["CPU"]["block_size"] == 64
    assert engine_tier["stored_tokens"] >= report["kv_events_warm"]["trigger"]["cached_tokens"] >= 32
    # Only the cold request's own blocks count (an earlier request's backlog is set aside): its prompt's full blocks,
    # plus at most one block filled while decoding (verify_max_tokens is 4).
    assert cold["trigger"]["prompt_tokens"] // 32 * 32 <= engine_tier["stored_tokens"] <= (cold["trigger"]["prompt_tokens"] + 4) // 32 * 32
    assert report["prefix_cache"]["hit_tokens"] >= 32
    # One module run checked all three: its windows and its tier are reported apart, not twice.
    assert "kv_events" not in report["prefix_cache"] and "lmcache" not in report["prefix_cache"]
    # Every batch the real engine published is one the llm-d router v0.9.0's decoder takes (verify requires it).
    router = cold["router_decoder"]
    assert router["checked_batches"] >= 1 and router["refused_batches"] == 0 and router["first_problem"] is None
    summary = (tmp_path / "summary.txt").read_text()
    assert "PASSED" in summary
    assert "llm-d router v0.9.0 (llm-d-kv-cache v0.9.0 vLLM adapter): takes %d of the %d batches checked" % (
        router["checked_batches"], router["checked_batches"]) in summary
    assert "Verification of http://127.0.0.1:8000" in result.stdout
    # verify.yml finds the LMCache server beside the engine (51 above its port) and checks that tier too, last.
    lmcache = report["lmcache"]
    if not _lmcache_up():
        assert lmcache == {}
        return
    assert lmcache["external_hit_tokens"] == lmcache["expected_hit_tokens"] > 0 and lmcache["same_text"] is True
    assert "LMCache (multiprocess connector, server %s, chunk 64 tokens): LMCache hit %d tokens" % (
        LMCACHE_URL, lmcache["external_hit_tokens"]) in summary
    # The engine's own tier and LMCache's side by side: the CPU events of LMCache's connector let the index see the hit.
    assert "KV-event index predicted %d" % lmcache["events"]["predicted_tokens"] in summary
    assert "0 tokens of reuse a precise router could not see" in summary


# The min-hit assert's message comes from prefix_cache_check, failed above against this engine.
@pytest.mark.parametrize("extra, message", [
    ("verify_block_size=64", "The KV events announce block size 32, but the engine's block size is 64"),
    ("verify_kv_events_topic=nosuchtopic", "but messages arrived under topic 'kv@127.0.0.1:8000@tiny'"),
])
def test_verify_asserts_can_fail(tmp_path, extra, message):
    result = _playbook("playbooks/verify.yml", "-e", "verify_report_dir=%s" % tmp_path, "-e", extra, "-e", "verify_kv_events_timeout=10")
    assert result.returncode != 0
    assert "Verification of http://127.0.0.1:8000 failed:" in result.stdout
    assert message in result.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["passed"] is False and report["failure"]
    assert "FAILED" in (tmp_path / "summary.txt").read_text()


def test_verify_playbook_over_tls_trusts_only_the_given_authority(tmp_path):
    """verify_ca_path reaches the completions, the metrics and the KV-event trigger; an unknown certificate is refused."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _tls_proxy import TLSProxy  # pylint: disable=import-error,import-outside-toplevel
    proxy = TLSProxy(int(URL.rsplit(":", 1)[1]), tmp_path).start()
    try:
        trusted = _playbook("playbooks/verify.yml", "-e", "verify_report_dir=%s" % (tmp_path / "ok"), "-e", "verify_url=%s" % proxy.url,
                            "-e", "verify_ca_path=%s" % proxy.cert)
        assert trusted.returncode == 0, trusted.stdout[-3000:]
        report = json.loads((tmp_path / "ok" / "report.json").read_text())
        assert report["passed"] is True and report["kv_events_cold"]["trigger"]["url"].startswith(proxy.url)
        assert proxy.refused == 0, proxy.refusals
        unknown = _playbook("playbooks/verify.yml", "-e", "verify_report_dir=%s" % (tmp_path / "bad"), "-e", "verify_url=%s" % proxy.url,
                            "-e", "verify_kv_events_timeout=10")
        assert unknown.returncode != 0 and "certificate verify failed" in unknown.stdout, unknown.stdout[-3000:]
        assert proxy.refused >= 1
    finally:
        proxy.stop()


# -- LMCache beside the default engine (playbooks/site.yml runs it for the instance "default") --------------------------
# The local_engine role puts the LMCache server's HTTP API 51 above the engine's port (8051 beside the default engine).
LMCACHE_URL = "http://127.0.0.1:%d" % (int(URL.rsplit(":", 1)[1]) + 51)
KV_ENDPOINT = os.environ.get("LOCAL_ENGINE_KV_ENDPOINT", "tcp://127.0.0.1:5557")


def _lmcache_up():
    try:
        http.OpenAIClient(LMCACHE_URL, timeout=3).get_text("/healthcheck")
        return True
    except http.OpenAIHTTPError:
        return False


def _lmcache_check(args, lmcache_url=LMCACHE_URL):
    adhoc = os.path.join(os.path.dirname(PLAYBOOK), "ansible")
    params = dict({"url": URL, "model": "tiny", "chunk_size": 64, "hash_algorithm": "blake3"}, **args)
    if lmcache_url:
        params["lmcache_url"] = lmcache_url
    run = subprocess.run([adhoc, "localhost", "-m", "inference_cache.substrate.lmcache_check", "-a", json.dumps(params)],
                         cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300, check=False)
    return run.returncode, json.loads(run.stdout.split("=>", 1)[1])


def _need_lmcache():
    if not _lmcache_up():
        if os.environ.get("LOCAL_ENGINE_REQUIRED") == "1":
            pytest.fail("No LMCache server at %s beside the default engine: playbooks/site.yml runs one." % LMCACHE_URL)
        pytest.skip("No LMCache server at %s beside the default engine (an engine started without playbooks/site.yml)." % LMCACHE_URL)


def test_lmcache_gives_a_stored_prompt_back_with_the_same_answer():
    """About 5 s: a 600-token prompt stored, the engine's prefix cache reset, the prompt back from LMCache."""
    _need_lmcache()
    rc, result = _lmcache_check({"kv_events": {"endpoint": KV_ENDPOINT, "socket_mode": "bind",
                                               "topic": "kv@%s@tiny" % URL.split("://", 1)[1]}})
    assert rc == 0, result.get("msg")
    assert result["changed"] is False and result["connector"] == "multiprocess" and result["miss_method"] == "reset"
    # Only full chunks of 64 come back, short of the last token: 600 prompt tokens give 576.
    assert result["external_hit_tokens"] == result["expected_hit_tokens"] == (result["prompt_tokens"] - 1) // 64 * 64 >= 512
    assert result["lmcache_hit_tokens"] >= result["external_hit_tokens"] and result["device_hit_tokens"] == 0
    assert result["stored_tokens"] == result["prompt_tokens"] // 64 * 64
    assert result["same_text"] is True and result["logprob_max_difference"] <= 1e-4 and result["compared_tokens"] == 8
    # LMCache's connector announces its chunks as BlockStored of medium CPU (the role runs the server with
    # --kv-event-log-size 0), so an index built from the events predicts the hit; no host-tier removal is announced.
    events = result["events"]
    assert events["host_events"] is True and events["media"]["CPU"]["block_sizes"] == [64]
    assert events["after_clear"] is True and events["device_tokens"] == 0
    assert events["predicted_tokens"] == events["host_tokens"] == result["external_hit_tokens"]
    assert events["invisible_tokens"] == 0 and events["host_removed_blocks"] == 0


def _kill_group(pidfile):
    """SIGKILL to the process group a pid file names (a crash: nothing of it is told)."""
    with open(pidfile) as handle:
        pid = int(handle.read().strip())
    os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _lmcache_up():
        time.sleep(0.2)
    return pid


def test_a_dead_lmcache_server_is_a_degraded_tier_and_site_brings_it_back(tmp_path):
    """About 60 s: the default engine's LMCache server killed (SIGKILL). While it is away, lmcache_check and the verify
    report name a degraded tier in one sentence; `site.yml` starts the server again and leaves the engine running (its
    connector re-registers on its own, LMCache 0.5.6: the role waits for that), and the tier serves hits again."""
    _need_lmcache()
    if not STARTED_HERE["default"]:
        pytest.skip("The default engine was not started by this test run: its LMCache server is left alone.")
    run_dir = os.path.join(STATE_DIR, "run", "default")
    engine_pid = open(os.path.join(run_dir, "engine.pid")).read().strip()
    engine_log = os.path.join(run_dir, "engine.log")

    def degraded_lines():
        with open(engine_log, errors="replace") as handle:
            return handle.read().count("entering degraded mode")

    before = degraded_lines()
    _kill_group(os.path.join(run_dir, "lmcache.pid"))
    assert not _lmcache_up()
    # Until the connector's heartbeat (every 10 s) finds the server gone, a request's store to it stalls (13 s measured
    # by benchmarks/bench_lmcache_faults.py): wait for its "entering degraded mode", as the verification below would.
    deadline = time.monotonic() + 60
    while degraded_lines() == before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert degraded_lines() > before, "the connector never entered degraded mode after its server was killed"
    rc, result = _lmcache_check({})
    assert rc != 0 and result["changed"] is False and result["degraded"] is True, result
    assert result["msg"].startswith("The LMCache tier is degraded: the LMCache server at %s does not answer (Cannot reach "
                                    "%s/config: Connection refused: stopped, paused or overloaded; make site starts a stopped "
                                    "one" % (LMCACHE_URL, LMCACHE_URL)), result["msg"]
    # playbooks/verify.yml finds the multiprocess connector on the engine's page and names the degraded tier in its report.
    report_dir = tmp_path / "report"
    verified = _playbook("playbooks/verify.yml", "-e", "verify_report_dir=%s" % report_dir)
    assert verified.returncode != 0, verified.stdout[-3000:]
    report = json.loads((report_dir / "report.json").read_text())
    assert report["passed"] is False and report["failure"].startswith("The LMCache tier is degraded: the LMCache server at %s" % LMCACHE_URL)
    assert report["outcome"]["lmcache"]["degraded"] is True
    assert "LMCache tier DEGRADED" in (report_dir / "summary.txt").read_text()
    # The role starts the server again, waits for the running engine's connector to register with it, and restarts nothing else.
    again = _playbook("playbooks/site.yml", "--tags", "local_engine")
    assert again.returncode == 0, again.stdout[-3000:]
    assert open(os.path.join(run_dir, "engine.pid")).read().strip() == engine_pid, "the engine was restarted"
    assert _recap(again.stdout)["changed"] == 1, again.stdout[-3000:]
    rc, result = _lmcache_check({})
    assert rc == 0 and result["external_hit_tokens"] == result["expected_hit_tokens"] > 0, result.get("msg")
    # The engine registered again, under the name of its weights (the link the role gave vLLM as its model).
    assert result["lmcache_registered"] and result["lmcache_model_names"] == [
        os.path.join(run_dir, name) for name in os.listdir(run_dir) if name.startswith("weights-")], result


def test_a_server_restarted_at_once_through_its_launcher_is_found_again():
    """About 40 s: the default engine's LMCache server killed and started again at once, as local_service starts it (its
    launcher, its settings checksum), under the running engine. A server back within one heartbeat would never be
    registered with and the engine's stores would hang (lmcache@0.5.6, docs/local-default.md); the launcher waits for the
    engine's connector to enter degraded mode first, so the requests are answered meanwhile and the connector registers
    with the new server on its own: the engine is not restarted."""
    _need_lmcache()
    if not STARTED_HERE["default"]:
        pytest.skip("The default engine was not started by this test run: its LMCache server is left alone.")
    run_dir = os.path.join(STATE_DIR, "run", "default")
    engine_pid = open(os.path.join(run_dir, "engine.pid")).read().strip()
    files = supervisor.ServiceFiles(os.path.join(run_dir, "lmcache.pid"), os.path.join(run_dir, "lmcache.settings.sha1"),
                                    log=os.path.join(run_dir, "lmcache.log"), launcher=os.path.join(run_dir, "lmcache.sh"))
    server = http.OpenAIClient(LMCACHE_URL, timeout=3)

    def healthy(url):
        try:
            server.get_text(url)
            return True
        except http.OpenAIHTTPError:
            return False

    _kill_group(files.pidfile)
    ports = [int(LMCACHE_URL.rsplit(":", 1)[1]) - 1, int(LMCACHE_URL.rsplit(":", 1)[1])]
    deadline = time.monotonic() + 30
    while process.busy_ports("127.0.0.1", ports)[0] and time.monotonic() < deadline:
        time.sleep(0.2)
    started = supervisor.Supervisor(files, healthy, name="LMCache server").ensure_started(
        supervisor.file_checksum(files.launcher), LMCACHE_URL + "/healthcheck", "127.0.0.1", ports, 300, 30)
    assert started["started"], started
    with open(files.log, errors="replace") as handle:
        assert "waited" in handle.read(), "the launcher did not wait for the connector to find the old server gone"
    # Requests are answered (a hung engine would not answer this one within the minute), the connector registers again.
    request = {"model": "tiny", "prompt": "after the restart", "max_tokens": 2}
    answer = http.OpenAIClient(URL, timeout=60).post_json("/v1/completions", request)
    assert answer["choices"], answer
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not server.get_json("/status").get("registered_non_cuda_instance_ids"):
        time.sleep(1)
    assert server.get_json("/status").get("registered_non_cuda_instance_ids"), "the engine never registered again"
    rc, result = _lmcache_check({})
    assert rc == 0 and result["external_hit_tokens"] == result["expected_hit_tokens"] > 0, result.get("msg")
    assert open(os.path.join(run_dir, "engine.pid")).read().strip() == engine_pid, "the engine was restarted"


def test_the_rendered_poststart_hook_clears_the_sidecar(tmp_path):
    """model_server's engine container hook (the role's own definition, on this server's port) run against the real
    LMCache server: a prompt stored, the hook run, the prompt's chunks gone (the next request after a reset gets nothing
    from LMCache and stores them again)."""
    _need_lmcache()
    playbook = tmp_path / "hook.yml"
    playbook.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False,
                                     "vars": {"model_server_lmcache_server_http_port": int(LMCACHE_URL.rsplit(":", 1)[1])},
                                     "vars_files": [os.path.join(ROOT, "roles", "model_server", "vars", "main.yml")],
                                     "tasks": [{"ansible.builtin.copy": {"content": "{{ _model_server_lmcache_clear | to_json }}",
                                                                         "dest": str(tmp_path / "hook.json")}}]}]))
    rendered = _playbook("-i", "localhost,", "-c", "local", "-e", "ansible_python_interpreter=%s" % sys.executable, str(playbook))
    assert rendered.returncode == 0, rendered.stdout[-2000:]
    hook = json.loads((tmp_path / "hook.json").read_text())
    client = http.OpenAIClient(URL, timeout=120)
    prompt = "[hook %s] " % time.time() + " ".join("word%d" % (i % 50) for i in range(400))

    def external_hits():
        return pc.parse_metrics(client.get_text("/metrics"))["samples"].get("vllm:external_prefix_cache_hits_total", 0.0)

    def complete():
        client.post_json("/reset_prefix_cache", {})
        before = external_hits()
        client.post_json("/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0})
        return external_hits() - before
    complete()                      # stored
    assert complete() > 0           # served from LMCache
    run = subprocess.run([sys.executable if c == "python3" else c for c in hook], capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    assert complete() == 0          # the hook cleared it


def test_lmcache_in_process_connector_and_no_connector_are_two_sentences(tmp_path):
    """About 2 minutes: an instance (port 8120) with vLLM's in-process LMCacheConnectorV1, which on CPU recomputes
    everything, then the same instance with no KV connector at all: each cause has its own sentence (they shared one)."""
    _need_lmcache()   # the installation has LMCache once site.yml ran it
    config = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    env = {"LMCACHE_CHUNK_SIZE": "64", "LMCACHE_LOCAL_CPU": "True", "LMCACHE_MAX_LOCAL_CPU_SIZE": "1", "LMCACHE_TRACK_USAGE": "false",
           # LMCache's in-process metrics then reach vLLM's page (and nothing lands in /tmp/lmcache_prometheus)
           "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prometheus")}
    (tmp_path / "prometheus").mkdir()
    base = _instance_vars("pytest-lmc-inproc", 8120)
    args = base + ["-e", json.dumps({
        "local_engine_lmcache": False, "local_engine_extra_args": ["--kv-transfer-config", json.dumps(config)], "local_engine_env": env})]
    try:
        start = _playbook("playbooks/site.yml", *args)
        assert start.returncode == 0, start.stdout[-3000:]
        rc, result = _lmcache_check({"url": "http://127.0.0.1:8120"}, lmcache_url=None)
        assert rc != 0 and result["connector"] == "in-process" and result["external_hit_tokens"] == 0
        assert "vLLM runs LMCache's in-process connector (LMCacheConnectorV1" in result["msg"]
        assert "which on a CPU engine falls back to recompute" in result["msg"] and "run LMCache in multiprocess mode" in result["msg"]
        in_process = result["msg"]
        # The same instance without a connector: the external counters are on its page all the same (vLLM exports them
        # always), but the cold request's queries do not move them.
        plain = base + ["-e", json.dumps({"local_engine_lmcache": False})]
        start = _playbook("playbooks/site.yml", *plain)
        assert start.returncode == 0, start.stdout[-3000:]
        rc, result = _lmcache_check({"url": "http://127.0.0.1:8120"}, lmcache_url=None)
        assert rc != 0 and result["connector"] == "none", result
        assert result["msg"] == ("The engine has no KV connector: vllm:external_prefix_cache_queries_total did not move over the cold "
                                 "request's %d prompt tokens (vLLM counts them only through a connector); start vLLM with "
                                 "--kv-transfer-config naming LMCacheMPConnector and the LMCache server's port." % result["prompt_tokens"])
        assert result["msg"] != in_process
    finally:
        stop = _playbook("playbooks/teardown.yml", *args)
        assert stop.returncode == 0, stop.stdout[-3000:]
    assert not _left("pytest-lmc-inproc")


# -- weights changed in place: the old chunks are never served (issue 42) ------------------------------------------------
_CHANGE_WEIGHTS = """
import sys, torch
from safetensors.torch import load_file, save_file
path = sys.argv[1]
tensors = load_file(path)
generator = torch.Generator().manual_seed(42)
for name, tensor in tensors.items():
    if tensor.is_floating_point():
        tensors[name] = tensor + torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype) * 0.05
save_file(tensors, path, metadata={"format": "pt"})   # in place: the same file, folder and config
"""


def test_weights_changed_in_place_never_meet_their_old_chunks(tmp_path):
    """About 3 minutes: an instance (port 8130) with its own LMCache server over a copy of the tiny model. A long prompt is
    answered and stored in LMCache; the weights are rewritten in place (same folder, same config) and site.yml run again:
    the engine restarts (its weights' fingerprint changed), the LMCache server keeps the old chunks, and the prompt gets
    nothing from them: its answer is the new weights' cold answer (the same request with a cache_salt of its own, which
    no cached block shares), token for token."""
    _need_lmcache()
    import shutil  # pylint: disable=import-outside-toplevel
    model = tmp_path / "model"
    shutil.copytree(os.path.join(STATE_DIR, "models", "tiny-llama"), str(model))
    port = 8130
    args = _instance_vars("pytest-weights", port) + ["-e", json.dumps({
        "local_engine_lmcache": True, "local_engine_model": str(model), "local_engine_kv_events": False})]
    url, run_dir = "http://127.0.0.1:%d" % port, os.path.join(STATE_DIR, "run", "pytest-weights")
    client = http.OpenAIClient(url, timeout=300)
    prompt = "[weights %s] " % time.time() + " ".join("word%d" % (i % 60) for i in range(300))  # under the tiny model's 2048 tokens

    def external_hits():
        return pc.parse_metrics(client.get_text("/metrics"))["samples"].get("vllm:external_prefix_cache_hits_total", 0.0)

    def answer(**extra):
        before = external_hits()
        body = dict({"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 1}, **extra)
        choice = client.post_json("/v1/completions", body)["choices"][0]
        return choice["text"], choice["logprobs"]["token_logprobs"], external_hits() - before

    try:
        start = _playbook("playbooks/site.yml", *args)
        assert start.returncode == 0, start.stdout[-3000:]
        old_text, old_logprobs, dummy = answer()
        client.post_json("/reset_prefix_cache", {})
        assert answer()[2] > 0                              # the tier serves the prompt under the old weights
        engine_pid = open(os.path.join(run_dir, "engine.pid")).read().strip()
        lmcache_pid = open(os.path.join(run_dir, "lmcache.pid")).read().strip()
        changed = subprocess.run([os.path.join(STATE_DIR, "venv", "bin", "python"), "-c", _CHANGE_WEIGHTS, str(model / "model.safetensors")],
                                 capture_output=True, text=True, timeout=300, check=False)
        assert changed.returncode == 0, changed.stderr[-2000:]
        again = _playbook("playbooks/site.yml", *args)
        assert again.returncode == 0, again.stdout[-3000:]
        assert open(os.path.join(run_dir, "engine.pid")).read().strip() != engine_pid, "the engine kept the old weights"
        assert open(os.path.join(run_dir, "lmcache.pid")).read().strip() == lmcache_pid, "the LMCache server (and its chunks) went"
        text, logprobs, served = answer()
        assert served == 0, "%d tokens of the old weights' chunks were served" % served
        cold_text, cold_logprobs, cold_served = answer(cache_salt="fresh-%s" % time.time())
        assert cold_served == 0 and text == cold_text and max(abs(a - b) for a, b in zip(logprobs, cold_logprobs)) <= 1e-4
        assert max(abs(a - b) for a, b in zip(logprobs, old_logprobs)) > 1e-3, "the new weights answer as the old ones"
        # The tier works for the new weights, under their own name.
        client.post_json("/reset_prefix_cache", {})
        assert answer()[2] > 0
        rc, result = _lmcache_check({"url": url}, lmcache_url="http://127.0.0.1:%d" % (port + 51))
        # The server still lists the old engine's registration (LMCache reaps an engine that stopped pinging only after its
        # grace period), under the old weights' name, which no engine asks for any more.
        links = [os.path.join(run_dir, name) for name in os.listdir(run_dir) if name.startswith("weights-")]
        assert rc == 0 and len(links) == 1 and links[0] in result["lmcache_model_names"], result
    finally:
        stop = _playbook("playbooks/teardown.yml", *args)
        assert stop.returncode == 0, stop.stdout[-3000:]
    assert not _left("pytest-weights")


def test_site_second_run_changes_nothing():
    pid_before = open(os.path.join(STATE_DIR, "run", "default", "engine.pid")).read()
    result = _playbook("playbooks/site.yml")
    assert result.returncode == 0, result.stdout[-3000:]
    assert _recap(result.stdout)["changed"] == 0, result.stdout[-3000:]
    assert open(os.path.join(STATE_DIR, "run", "default", "engine.pid")).read() == pid_before


def test_check_mode_changes_nothing():
    result = _playbook("playbooks/site.yml", "--check", "--tags", "local_engine")
    assert result.returncode == 0, result.stdout[-3000:]
    assert _recap(result.stdout)["changed"] == 0, result.stdout[-3000:]


# -- bad input, each one sentence and no process left behind ---------------------------------------------------
def _instance_vars(name, port):
    return ["-e", "local_engine_instance=%s" % name, "-e", "local_engine_port=%d" % port,
            "-e", "local_engine_kv_events_replay_endpoint=tcp://127.0.0.1:%d" % (port + 1000),
            "-e", "local_engine_kv_events_topic=kv@127.0.0.1:%d@tiny" % port, "--tags", "local_engine"]


def _gone(pid, wait=60.0):
    """True once the process is gone or a zombie (the container's init may reap orphans late)."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            with open("/proc/%s/stat" % pid) as handle:
                if handle.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except OSError:
            return True
        time.sleep(0.2)
    return False


def _left(name):
    pidfile = os.path.join(STATE_DIR, "run", name, "engine.pid")
    return os.path.exists(pidfile)


def test_port_in_use_is_named():
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 8100))
        sock.listen(1)
        result = _playbook("playbooks/site.yml", *_instance_vars("pytest-port", 8100))
    assert result.returncode != 0
    assert "Cannot start the engine on 127.0.0.1: port 8100 is taken by pid %d" % os.getpid() in result.stdout
    assert not _left("pytest-port")


def test_wrong_model_path():
    result = _playbook("playbooks/site.yml", "-e", "local_engine_model=/nonexistent/model", *_instance_vars("pytest-model", 8101))
    assert result.returncode != 0
    assert "local_engine_model /nonexistent/model is not a model folder: it holds no config.json." in result.stdout
    assert not _left("pytest-model")


def test_engine_dying_during_start_up():
    result = _playbook("playbooks/site.yml", "-e", '{"local_engine_extra_args": ["--no-such-flag"]}', *_instance_vars("pytest-dies", 8102))
    assert result.returncode != 0
    assert "The engine exited during start-up" in result.stdout and "no-such-flag" in result.stdout
    assert not _left("pytest-dies")


def test_changed_settings_restart_and_absent_stops():
    # Keep this test last: on the default engine it ends with the engine stopped.
    if STARTED_HERE["default"]:
        name, args = "default", ["--tags", "local_engine"]
    else:
        name, args = "pytest-restart", _instance_vars("pytest-restart", 8110)
    try:
        first = _playbook("playbooks/site.yml", *args)
        assert first.returncode == 0, first.stdout[-3000:]
        pidfile = os.path.join(STATE_DIR, "run", name, "engine.pid")
        pid = open(pidfile).read().strip()
        again = _playbook("playbooks/site.yml", *args)
        assert _recap(again.stdout)["changed"] == 0 and open(pidfile).read().strip() == pid
        changed = _playbook("playbooks/site.yml", "-e", "local_engine_max_model_len=1024", *args)
        assert changed.returncode == 0 and _recap(changed.stdout)["changed"] >= 2
        new_pid = open(pidfile).read().strip()
        assert new_pid != pid and _gone(pid)
        stop = _playbook("playbooks/teardown.yml", *args)
        # The engine, and the default instance's LMCache server after it (site.yml runs one for "default" only).
        assert stop.returncode == 0 and _recap(stop.stdout)["changed"] == (2 if name == "default" else 1)
        assert not os.path.exists(pidfile) and _gone(new_pid)
        stop = _playbook("playbooks/teardown.yml", *args)
        assert _recap(stop.stdout)["changed"] == 0
    finally:  # whatever failed above, leave no engine of this instance running
        _playbook("playbooks/teardown.yml", *args)
