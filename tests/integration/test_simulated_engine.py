# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""roles/simulated_engine: its variables, the simulator's flags it renders, and a small fleet run for real.

* defaults/main.yml and meta/argument_specs.yml list the same variables, all prefixed; the preflight refuses a bad fleet
  with one sentence;
* every flag the launcher passes is one the pinned simulator has (llm-d-inference-sim@v0.10.2:pkg/common/parser.go,
  and the built binary's ``--help`` where the build is there);
* two confined engines started through playbooks/simulated_engines.yml: published in local_engine_instances in the
  local_engine role's shape, listening on their own loopback address only, a second run changes nothing, their KV events
  reach a subscriber that binds their endpoint (kv_events_check), and state absent leaves no process, folder or file in
  the temporary folder. The simulator comes through playbooks/go_build.yml (inference_cache.substrate.go_build): built once,
  and where another run is building it (make test's other lanes, the molecule scenario kwok_fleet), waited on under its
  lock rather than looked for.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.request

import pytest
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.path.join(ROOT, ".venv", "bin")
ENV = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
ROLE = os.path.join(ROOT, "roles", "simulated_engine")
VERSION = yaml.safe_load(open(os.path.join(ROOT, "vars", "pinned_versions.yml"), encoding="utf-8"))["tools"]["llm_d_inference_sim"]
BINARY = os.path.expanduser("~/.cache/inference_cache/kwok_cluster/bin/llm-d-inference-sim-%s/llm-d-inference-sim" % VERSION)
# The flags of llm-d-inference-sim v0.10.2 the role may pass (pkg/common/parser.go ParseCommandParamsAndLoadConfig; --v is
# klog's, added there through AddGoFlagSet).
FLAGS = {"port", "model", "force-dummy-tokenizer", "max-model-len", "max-num-seqs", "max-waiting-queue-length", "enable-kvcache",
         "kv-cache-size", "block-size", "hash-seed", "zmq-endpoint", "event-batch-size", "use-vllm-map-event-format",
         "latency-calculator", "prefill-overhead", "prefill-time-per-token", "inter-token-latency", "time-factor-under-load",
         "seed", "failure-injection-rate", "failure-types", "enable-sleep-mode", "v"}


_BUILT = {}


def simulator():
    """The simulator's binary, through go_build (a no-op where it is built; otherwise built once, or waited on)."""
    if "path" not in _BUILT:
        run = subprocess.run([os.path.join(BIN, "ansible-playbook"), os.path.join(ROOT, "playbooks", "go_build.yml"), "-e",
                              json.dumps({"go_builds_names": ["llm-d-inference-sim"]})], cwd=ROOT, env=ENV, capture_output=True,
                             text=True, timeout=3600, check=False)
        assert run.returncode == 0, run.stdout[-3000:]
        _BUILT["path"] = BINARY
    assert os.access(_BUILT["path"], os.X_OK), _BUILT["path"]
    return _BUILT["path"]


def _load(*parts):
    with open(os.path.join(*parts), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def test_defaults_match_argument_specs():
    defaults = _load(ROLE, "defaults", "main.yml")
    options = _load(ROLE, "meta", "argument_specs.yml")["argument_specs"]["main"]["options"]
    assert sorted(defaults) == sorted(options)
    assert all(name.startswith("simulated_engine_") for name in defaults)
    assert all(name.startswith("_simulated_engine_") for name in _load(ROLE, "vars", "main.yml"))


def test_the_simulator_is_pinned_and_in_the_catalog_of_go_builds():
    builds = dict((b["name"], b) for b in _load(ROOT, "vars", "go_builds.yml")["builds"])
    sim = builds["llm-d-inference-sim"]
    assert sim["module"] == "github.com/llm-d/llm-d-inference-sim" and sim["cgo"] is False
    assert sim["version"] == "{{ _substrate_pins.tools.llm_d_inference_sim }}" and VERSION == "v0.10.2"
    assert sim["packages"] == {"llm-d-inference-sim": "github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim"}
    assert "simulated_engine_binary" in sim["remedy"]


def _playbook(tmp_path, *extra, check=False):
    cmd = [os.path.join(BIN, "ansible-playbook"), os.path.join(ROOT, "playbooks", "simulated_engines.yml")]
    for item in extra:
        cmd += ["-e", item if isinstance(item, str) else json.dumps(item)]
    return subprocess.run(cmd + (["--check"] if check else []), cwd=ROOT, env=dict(ENV, TMPDIR=str(tmp_path)), capture_output=True,
                          text=True, timeout=600, check=False)


@pytest.mark.parametrize("extra, words", [
    ({"simulated_engine_block_size": 24}, "value of simulated_engine_block_size must be one of: 8, 16, 32, 64, 128, got: 24"),
    ({"simulated_engine_first_address": "10.0.0.1"}, "loopback addresses from 10.0.0.1"),
    ({"simulated_engine_only": ["sim-9"]}, "simulated_engine_only naming engines of this fleet (sim-0, sim-1, sim-2, sim-3)"),
    ({"simulated_engine_kv_cache_size": 8}, "blocks (8 x 32) cover max_model_len 4096"),
])
def test_the_preflight_refuses_a_bad_fleet_in_one_sentence(tmp_path, extra, words):
    run = _playbook(tmp_path, extra)
    assert run.returncode != 0 and words in run.stdout and "Traceback" not in run.stdout, run.stdout[-3000:]


def _render(tmp_path, **extra):
    """The launcher of engine sim-1 as the role renders it (template only)."""
    playbook = tmp_path / "render.yml"
    variables = dict(_load(ROLE, "defaults", "main.yml"), **extra)
    variables["role_path"] = os.path.join(ROOT, ".cache", "collections", "ansible_collections", "inference_cache", "substrate", "roles",
                                          "simulated_engine")
    playbook.write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False, "vars": variables,
        "vars_files": [os.path.join(ROLE, "vars", "main.yml")],
        "tasks": [{"ansible.builtin.include_vars": {"file": os.path.join(ROOT, "vars", "pinned_versions.yml"), "name": "_substrate_pins"}},
                  # where the builds live (go_builds_info), as the role's dependency publishes it; builds nothing
                  {"ansible.builtin.include_role": {"name": "inference_cache.substrate.go_builds"}},
                  {"ansible.builtin.template": {"src": os.path.join(ROLE, "templates", "engine.sh.j2"), "dest": str(tmp_path / "engine.sh")},
                   "vars": {"item": "{{ _simulated_engine_all[1] }}"}}],
    }]))
    run = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local", "-e",
                          json.dumps({"ansible_python_interpreter": sys.executable}), str(playbook)], cwd=ROOT, env=ENV,
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stdout[-2000:]
    return (tmp_path / "engine.sh").read_text()


def test_the_launcher_passes_flags_the_pinned_simulator_has(tmp_path):
    text = _render(tmp_path, simulated_engine_dev_mode=True, simulated_engine_map_event_format=True,
                   simulated_engine_failure_injection_rate=5, simulated_engine_failure_types=["rate_limit"])
    passed = set(re.findall(r"^\s+(?:\S+ )?--([a-z-]+)", text, re.M)) - {"run"}
    assert passed <= FLAGS, passed - FLAGS
    assert {"enable-kvcache", "zmq-endpoint", "force-dummy-tokenizer", "enable-sleep-mode", "failure-types"} <= passed
    assert "POD_IP=127.0.1.2:9100" in text and "VLLM_SERVER_DEV_MODE=1" in text
    assert "--zmq-endpoint ipc://" in text and "/events/sim-1.sock" in text and '"serve_host": "127.0.1.2"' in text
    unconfined = _render(tmp_path, simulated_engine_confine=False)
    assert "--port 9101" in unconfined and "--zmq-endpoint tcp://127.0.0.1:6101" in unconfined and "confine" not in unconfined
    helptext = subprocess.run([simulator(), "--help"], capture_output=True, text=True, timeout=60, check=False)
    listed = set(re.findall(r"--([a-z][a-z-]*)", helptext.stdout + helptext.stderr))
    assert passed <= listed, passed - listed


def _get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as answer:  # nosec - loopback
        return answer.status, answer.read().decode("utf-8")


def _post(url, body, timeout=10):
    request = urllib.request.Request(url, data=json.dumps(body).encode("utf-8"), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:  # nosec - loopback
        return json.loads(answer.read())


def test_a_confined_fleet_runs_publishes_and_stops_without_leftovers(tmp_path, request):
    simulator()
    state = tmp_path / "sim"
    report = tmp_path / "engines.json"
    fleet = {"simulated_engine_state_dir": str(state), "simulated_engine_name": "t", "simulated_engine_count": 2,
             "simulated_engine_first_address": "127.0.1.201", "simulated_engine_port": 9300, "simulated_engine_block_size": 16,
             "simulated_engine_kv_cache_size": 256, "simulated_engine_event_batch_size": 1}
    # The temporary folder the role's processes get: a short one (the confined bridge's Unix socket paths hold at most
    # 107 bytes, which pytest's tmp_path under a suite's own TMPDIR exceeds), checked empty and removed at the end.
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="sim-"))
    request.addfinalizer(lambda: shutil.rmtree(str(scratch), ignore_errors=True))
    try:
        run = _playbook(scratch, fleet, {"simulated_engine_report_path": str(report)})
        assert run.returncode == 0, run.stdout[-3000:]
        published = json.loads(report.read_text())["engines"]
        assert sorted(published) == ["t-0", "t-1"]
        engine = published["t-1"]
        assert engine["kind"] == "simulated" and engine["url"] == "http://127.0.1.202:9300" and engine["model"] == "tiny"
        assert engine["kv_subscriber"] == {"endpoint": "ipc://%s/events/t-1.sock" % state, "socket_mode": "bind",
                                           "topic": "kv@127.0.1.202:9300@tiny", "replay_endpoint": None, "block_size": 16}
        assert engine["started"] and engine["pid"] and engine["block_size"] == 16 and engine["num_gpu_blocks"] == 256
        status, metrics = _get(engine["metrics_url"])
        assert status == 200 and 'vllm:cache_config_info{block_size="16",num_gpu_blocks="256"}' in metrics
        with pytest.raises(OSError):   # its address only: nothing of it on 127.0.0.1 or the simulator's own port
            socket.create_connection(("127.0.0.1", 9300), timeout=2).close()
        again = _playbook(scratch, fleet)
        assert again.returncode == 0 and re.search(r"localhost\s+:\s+ok=\d+\s+changed=0\s", again.stdout), again.stdout[-2000:]
        # Its KV events reach a subscriber that binds its endpoint (kv_events_check's core, the request as its trigger).
        from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import events_check  # pylint: disable=import-outside-toplevel
        facts = events_check.KVEventsCheck({
            "endpoint": engine["kv_subscriber"]["endpoint"], "socket_mode": "bind", "topic": engine["kv_subscriber"]["topic"],
            "timeout": 30, "expect": {"BlockStored": 1},
            "trigger": {"url": engine["url"], "model": "tiny", "prompt": " ".join("word%d" % i for i in range(64))}}).run()
        assert facts["counts"]["BlockStored"] >= 1 and facts["malformed"]["count"] == 0
    finally:
        stop = _playbook(scratch, fleet, {"simulated_engine_state": "absent"})
    assert stop.returncode == 0, stop.stdout[-2000:]
    assert not (state / "run" / "t-0").exists() and not (state / "run" / "t-1").exists() and not (state / "events").exists()
    left = subprocess.run(["pgrep", "-f", str(state)], capture_output=True, text=True, check=False)
    assert left.returncode == 1, left.stdout
    assert sorted(os.listdir(str(scratch))) == [], os.listdir(str(scratch))
