# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The supervisor of service/supervisor.py with throwaway ``sleep`` processes: it starts and stops a process group,
restarts on new settings, names the owner of a taken port, waits within a bound, and never signals a pid that is not
the process it started (a pid reused after a reboot or after the process died)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import hashlib
import json
import os
import signal
import socket
import subprocess
import time

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.service import process as P
from ansible_collections.inference_cache.substrate.plugins.module_utils.service import supervisor as S


@pytest.fixture(autouse=True)
def no_service_left(tmp_path):
    """Whatever a test asserted, stop the process it started in ``tmp_path`` (never a pid that is not that process)."""
    yield
    files = S.ServiceFiles(str(tmp_path / "engine.pid"), str(tmp_path / "engine.run"))
    status = S.status(files)
    if status["running"] or status["leftovers"]:
        S.stop_group(status["recorded_pid"], status["pids"], 5)


def _service(tmp_path, script, healthy=lambda url: True, check_mode=False, **kwargs):
    """A Supervisor of an engine whose launcher runs ``script`` (sh) in ``tmp_path``."""
    launcher = tmp_path / "engine.sh"
    launcher.write_text("#!/bin/sh\n" + script)
    launcher.chmod(0o700)
    files = S.ServiceFiles(str(tmp_path / "engine.pid"), str(tmp_path / "engine.run"), log=str(tmp_path / "engine.log"),
                           launcher=str(launcher))
    return S.Supervisor(files, healthy, check_mode=check_mode, **dict(dict(name="engine"), **kwargs))


def _start(service, checksum="abc", ports=(), timeout=20):
    return service.ensure_started(checksum, "http://127.0.0.1:9/health", "127.0.0.1", list(ports), timeout, 5)


def _alive(pid):
    return P.start_ticks(pid) is not None


def _wait_for(predicate, what, bound=60.0):
    """Poll within a bound: the shell forks its children in milliseconds, later on a loaded machine."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("not within %.0f s: %s" % (bound, what))


# The bound of a stop whose test asserts that SIGTERM was enough (nothing SIGKILLed). A stop ends as soon as the group
# is gone, in about a second here; the bound only has to outlast a loaded machine's stalls: a whole `make test` with
# cold caches once had a process of these tests outlive a 20 s bound (core-newest stage, 2026-12-06).
GRACEFUL_BOUND = 120


@pytest.fixture
def sigkilled(monkeypatch):
    """What each stop had to SIGKILL, seen just before the signal: one line per process of the group and of the stop's
    handles (pid, parent, group, session, state, seconds alive, command), for a failure's message."""
    seen = []
    signal_all = S.signal_all

    def witness(leader, handles, signum):
        if signum == signal.SIGKILL:
            pids = sorted(set(P.members(leader)) | set(h.pid for h in handles))
            seen.append([_describe(pid) for pid in pids])
        return signal_all(leader, handles, signum)

    monkeypatch.setattr(S, "signal_all", witness)
    return seen


def _describe(pid):
    try:
        proc = P.psutil.Process(pid)
        facts = (pid, proc.ppid(), os.getpgid(pid), os.getsid(pid), proc.status(), time.time() - proc.create_time(),
                 " ".join(proc.cmdline())[:120])
        return "%d ppid %d pgid %d sid %d %s %.1f s: %s" % facts
    except (P.psutil.Error, OSError) as exc:
        return "%d: %s" % (pid, type(exc).__name__)


@pytest.fixture
def unrelated():
    """A live process that has nothing to do with any service."""
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
    _wait_for(lambda: len(S.status(service.files)["pids"]) >= 2, "the child")
    status = S.status(service.files)
    assert status["running"] and status["pid"] == started["pid"] and status["checksum"] == "abc"
    assert len(status["pids"]) == 2
    record = json.loads((tmp_path / "engine.run").read_text())
    assert record["pid"] == started["pid"] and record["start_ticks"] == P.start_ticks(started["pid"])
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


def test_a_child_and_its_memory_are_reported(tmp_path):
    service = _service(tmp_path, "sleep 300 &\nexec sleep 301\n")
    started = _start(service)

    def children():
        return [pid for pid in S.status(service.files)["pids"] if pid != started["pid"]]

    # The child is the shell's fork until it has exec'd sleep: wait for that, not only for a second process.
    _wait_for(lambda: [P.cmdline(pid) for pid in children()] == ["sleep 300"], "the child")
    status = S.status(service.files)
    assert len(status["pids"]) == 2 and status["rss_kib"] > 0
    again = _start(service)
    assert again["pids"] == status["pids"] and again["rss_kib"] > 0


def test_a_changed_checksum_restarts_and_the_same_does_not(tmp_path):
    service = _service(tmp_path, "exec sleep 300\n")
    first = _start(service, checksum="one")
    assert first["changed"] and not first["restarted"]
    same = _start(service, checksum="one")
    assert not same["changed"] and same["pid"] == first["pid"] and _alive(first["pid"])
    other = _start(service, checksum="two")
    assert other["changed"] and other["restarted"] and other["pid"] != first["pid"] and not _alive(first["pid"])
    assert json.loads((tmp_path / "engine.run").read_text())["checksum"] == "two"
    assert S.status(service.files)["checksum"] == "two"


@pytest.mark.parametrize("scope", S.STOP_SCOPES)
def test_a_stop_kills_the_whole_group(tmp_path, scope):
    """A child that ignores SIGTERM is killed after the bounded wait; a descendant that left the group (setsid) and
    a child that the leader outlives are stopped too; whoever got the first SIGTERM."""
    service = _service(tmp_path, "sh -c \"trap '' TERM; while :; do sleep 1; done\" &\nsetsid sleep 302 &\nexec sleep 301\n",
                       stop_scope=scope)
    started = _start(service)

    def lasting():
        """The service's processes but the loop's passing `sleep 1` (one ends by itself between the look and the stop)."""
        return dict((pid, P.cmdline(pid)) for pid in S.status(service.files)["pids"] if P.cmdline(pid) != "sleep 1")

    # Each has exec'd (the leader is the shell until its exec): the leader, the setsid child, and the loop, past its trap
    # (one of its `sleep 1` seen), so that only SIGKILL ends it.
    def ready():
        everyone = [P.cmdline(pid) for pid in S.status(service.files)["pids"]]
        return "sleep 1" in everyone and sorted(lasting().values()) == [
            "sh -c trap '' TERM; while :; do sleep 1; done", "sleep 301", "sleep 302"]

    _wait_for(ready, "the children")
    pids = list(lasting())
    assert started["pid"] in pids
    begun = time.monotonic()
    stopped = service.ensure_stopped(1)
    assert time.monotonic() - begun < 15
    assert stopped["changed"] and set(pids) <= set(stopped["stopped_pids"]) and stopped["killed"]
    assert not any(_alive(pid) for pid in pids), [(pid, P.cmdline(pid)) for pid in pids if _alive(pid)]
    assert P.members(started["pid"]) == []


# A leader that stops its child itself on SIGTERM, as vLLM's API server stops its EngineCore: it notes the signal, takes
# 0.5 s, sends its child a SIGTERM, then a SIGKILL 0.3 s later, and exits. The child notes each SIGTERM it gets.
_STOPS_ITS_CHILD = """\
sh -c 'trap "echo child TERM >> signals" TERM; echo child ready >> signals; while :; do sleep 0.05; done' &
child=$!
trap 'echo leader TERM >> signals; sleep 0.5; kill -TERM $child; sleep 0.3; kill -KILL $child; echo leader exit >> signals; exit 0' TERM
while :; do sleep 0.05; done
"""


def _signals(tmp_path):
    path = tmp_path / "signals"
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("scope", S.STOP_SCOPES)
def test_a_leader_that_stops_its_children_gets_the_first_sigterm_alone(tmp_path, monkeypatch, sigkilled, scope):  # pylint: disable=redefined-outer-name
    monkeypatch.chdir(tmp_path)
    service = _service(tmp_path, _STOPS_ITS_CHILD, stop_scope=scope)
    started = _start(service)
    _wait_for(lambda: _signals(tmp_path) == ["child ready"], "the child's trap")
    stopped = service.ensure_stopped(GRACEFUL_BOUND)
    got = _signals(tmp_path)
    assert got[0] == "child ready" and got[-1] == "leader exit" and got.count("leader TERM") == 1, (got, sigkilled)
    if scope == "leader":
        # The leader alone: the child gets one SIGTERM, the leader's own, after the leader got its own.
        assert got == ["child ready", "leader TERM", "child TERM", "leader exit"], got
    else:
        # The whole group: the child gets the group's SIGTERM at once, and the leader's too.
        assert got.count("child TERM") == 2, got
    assert stopped["changed"] and stopped["killed"] == [] and not _alive(started["pid"]), (stopped, started["pid"], sigkilled)
    assert P.members(started["pid"]) == []


def test_a_leader_that_leaves_its_child_behind_has_it_stopped_after_it(tmp_path, monkeypatch, sigkilled):  # pylint: disable=redefined-outer-name
    """Scope leader: the leader exits without stopping its child; the child then gets SIGTERM (not only the SIGKILL)."""
    monkeypatch.chdir(tmp_path)
    script = ("sh -c 'trap \"echo child TERM >> signals; exit 0\" TERM; echo child ready >> signals; while :; do sleep 0.05; done' &\n"
              "trap 'echo leader TERM >> signals; exit 0' TERM\nwhile :; do sleep 0.05; done\n")
    service = _service(tmp_path, script, stop_scope="leader")
    started = _start(service)
    _wait_for(lambda: _signals(tmp_path) == ["child ready"], "the child's trap")
    stopped = service.ensure_stopped(GRACEFUL_BOUND)
    assert _signals(tmp_path) == ["child ready", "leader TERM", "child TERM"], sigkilled
    assert stopped["killed"] == [] and P.members(started["pid"]) == [], (stopped, started["pid"], sigkilled)


def test_an_unknown_stop_scope_is_one_sentence(tmp_path):
    with pytest.raises(S.ServiceError) as info:
        _service(tmp_path, "exec sleep 300\n", stop_scope="session")
    assert str(info.value) == "stop_scope must be one of group, leader, not 'session'."


@pytest.mark.parametrize("scope", S.STOP_SCOPES)
def test_leftovers_of_a_dead_leader_are_stopped(tmp_path, sigkilled, scope):  # pylint: disable=redefined-outer-name
    """The leader died, its child lives on in its session: status names it, a stop ends it (with SIGTERM, at once)."""
    service = _service(tmp_path, "sleep 300 &\nexec sleep 301\n", stop_scope=scope)
    started = _start(service)
    _wait_for(lambda: len(S.status(service.files)["pids"]) == 2, "the child")
    child = [pid for pid in S.status(service.files)["pids"] if pid != started["pid"]][0]
    os.kill(started["pid"], 9)
    _wait_for(lambda: not _alive(started["pid"]), "the leader's end")
    status = S.status(service.files)
    assert not status["running"] and status["leftovers"] == [child] and status["foreign"] is None
    stopped = service.ensure_stopped(GRACEFUL_BOUND)
    assert stopped["changed"] and child in stopped["stopped_pids"] and not _alive(child) and stopped["killed"] == [], (
        stopped, child, sigkilled)


def test_check_mode_changes_nothing(tmp_path):
    service = _service(tmp_path, "exec sleep 300\n")
    checking = _service(tmp_path, "exec sleep 300\n", check_mode=True)
    assert _start(checking)["changed"] and not os.path.exists(service.files.pidfile)
    pid = _start(service)["pid"]
    try:
        assert _start(checking, checksum="new")["restarted"] and S.status(service.files)["pid"] == pid
        assert checking.ensure_stopped(5)["changed"] and _alive(pid)
    finally:
        service.ensure_stopped(5)


def test_a_reused_pid_is_never_signalled(tmp_path, unrelated):
    """The pid file names a live process that is not the service: status says so, stop and start leave it alone."""
    service = _service(tmp_path, "exec sleep 300\n")
    for record in (
        {"checksum": "abc", "pid": unrelated, "start_ticks": P.start_ticks(unrelated) - 1, "boot_id": P.boot_id()},
        {"checksum": "abc", "pid": unrelated, "start_ticks": P.start_ticks(unrelated), "boot_id": "another-boot"},
        "abc",  # a run file from before identities were recorded, and a pid file older than the process
    ):
        (tmp_path / "engine.pid").write_text("%d\n" % unrelated)
        (tmp_path / "engine.run").write_text(record if isinstance(record, str) else json.dumps(record))
        if isinstance(record, str):
            os.utime(str(tmp_path / "engine.pid"), (time.time() - 3600, time.time() - 3600))
        status = S.status(service.files)
        assert not status["running"] and status["pids"] == [] and status["foreign"]["pid"] == unrelated, record
        stopped = service.ensure_stopped(5)
        assert stopped["changed"] is False and stopped["foreign"]["pid"] == unrelated and _alive(unrelated), record
        assert not os.path.exists(service.files.pidfile)
    # A start goes ahead with a new process and leaves the unrelated one alone too.
    (tmp_path / "engine.pid").write_text("%d\n" % unrelated)
    started = _start(service)
    assert started["changed"] and started["pid"] != unrelated and started["foreign"]["pid"] == unrelated
    service.ensure_stopped(5)
    assert _alive(unrelated) and not _alive(started["pid"])


def test_a_record_of_the_proc_parsing_code_still_names_its_process(tmp_path):
    """A run file written before psutil (start ticks read by hand from /proc/<pid>/stat) names the same process, so
    an engine started by the older collection is neither restarted nor orphaned."""
    service = _service(tmp_path, "exec sleep 300\n")
    pid = _start(service)["pid"]
    with open("/proc/%d/stat" % pid) as handle:
        raw = handle.read()
    ticks = int(raw[raw.rfind(")") + 2:].split()[19])
    with open("/proc/sys/kernel/random/boot_id") as handle:
        boot = handle.read().strip()
    (tmp_path / "engine.run").write_text(json.dumps({"checksum": "abc", "pid": pid, "start_ticks": ticks, "boot_id": boot,
                                                     "cmdline": "sleep 300"}))
    assert S.status(service.files)["running"] and _start(service)["changed"] is False
    assert S.identify(pid, {"checksum": "abc", "pid": pid, "start_ticks": ticks + 1, "boot_id": boot},
                      service.files.pidfile)[0] is False


def test_a_legacy_record_of_a_live_engine_is_kept(tmp_path):
    """A run file written before identities were recorded (one line, the checksum) still names a running engine."""
    service = _service(tmp_path, "exec sleep 300\n")
    pid = _start(service)["pid"]
    try:
        (tmp_path / "engine.run").write_text("abc\n")
        os.utime(str(tmp_path / "engine.pid"), None)
        assert S.status(service.files)["running"] and _start(service)["changed"] is False
    finally:
        service.ensure_stopped(5)
    assert not _alive(pid)


def test_an_engine_dying_during_start_up_is_reported(tmp_path):
    service = _service(tmp_path, "echo 'error: unrecognized arguments: --bogus' >&2\nexit 2\n", healthy=lambda url: False)
    with pytest.raises(S.ServiceError) as info:
        _start(service)
    assert str(info.value).startswith("The engine exited during start-up (%s) and was stopped; last log lines: " % service.files.log)
    assert "unrecognized arguments: --bogus" in str(info.value)
    assert not os.path.exists(service.files.pidfile) and not os.path.exists(service.files.runfile)


def test_a_start_waits_within_its_bound(tmp_path):
    """A process that never answers: the wait ends at the bound, on the supervisor's monotonic clock, and the
    process group is stopped."""
    now = [1000.0]
    service = _service(tmp_path, "sleep 300 &\nexec sleep 301\n", healthy=lambda url: False,
                       clock=lambda: now[0], sleep=lambda seconds: now.__setitem__(0, now[0] + seconds))
    with pytest.raises(S.ServiceError) as info:
        _start(service, timeout=5)
    assert str(info.value).startswith("The engine was not ready within 5 s (%s) and was stopped" % service.files.log)
    assert info.value.facts["start_seconds"] == 5.0 and not _alive(info.value.facts["pid"])
    assert P.members(info.value.facts["pid"]) == [] and not os.path.exists(service.files.pidfile)


def test_a_running_engine_that_does_not_answer_is_one_sentence(tmp_path):
    answers = [True]
    service = _service(tmp_path, "exec sleep 300\n", healthy=lambda url: answers[0])
    pid = _start(service)["pid"]
    answers[0] = False
    with pytest.raises(S.ServiceError) as info:
        _start(service)
    assert str(info.value) == ("The engine (pid %d) runs with these settings but http://127.0.0.1:9/health does not "
                               "answer; see its log %s." % (pid, service.files.log))
    assert _alive(pid)


def _start_on_a_taken_port(service):
    """Start ``service`` with a port this test process listens on; return (port, the ServiceError)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        with pytest.raises(S.ServiceError) as info:
            _start(service, ports=[port])
    return port, info


def test_a_taken_port_stops_the_start(tmp_path):
    service = _service(tmp_path, "exec sleep 300\n", ports_hint="local_engine_port")
    port, info = _start_on_a_taken_port(service)
    assert ("Cannot start the engine on 127.0.0.1: port %d is taken by pid %d" % (port, os.getpid())) in str(info.value)
    assert str(info.value).endswith("; stop that process or choose other ports (local_engine_port).")
    assert info.value.facts["busy"][0]["owners"][0]["pid"] == os.getpid()
    assert not os.path.exists(service.files.pidfile)


def test_a_service_by_default_names_no_variables(tmp_path):
    files = S.ServiceFiles(str(tmp_path / "engine.pid"), str(tmp_path / "engine.run"), log=str(tmp_path / "engine.log"),
                           launcher=str(tmp_path / "engine.sh"))
    port, info = _start_on_a_taken_port(S.Supervisor(files, lambda url: True))
    assert str(info.value).startswith("Cannot start the service on 127.0.0.1: port %d is taken" % port)
    assert str(info.value).endswith("; stop that process or choose other ports.")


def test_a_named_process_is_named_in_its_sentences(tmp_path):
    """kwok_cluster runs etcd and the control plane through the same service: the sentences name the process and the
    variables of its ports, not the engine's."""
    launcher = tmp_path / "etcd.sh"
    launcher.write_text("#!/bin/sh\necho 'etcdmain: listen tcp: bind: address already in use' >&2\nexit 1\n")
    launcher.chmod(0o700)
    files = S.ServiceFiles(str(tmp_path / "etcd.pid"), str(tmp_path / "etcd.run"), log=str(tmp_path / "etcd.log"),
                           launcher=str(launcher))
    service = S.Supervisor(files, lambda url: False, name="etcd", ports_hint="kwok_cluster_etcd_port")
    with pytest.raises(S.ServiceError) as info:
        _start(service)
    assert str(info.value).startswith("The etcd exited during start-up (%s)" % files.log)
    port, info = _start_on_a_taken_port(service)
    assert str(info.value).startswith("Cannot start the etcd on 127.0.0.1: port %d is taken" % port)
    assert str(info.value).endswith("(kwok_cluster_etcd_port).")


def test_an_instance_that_never_ran_stops_as_ok(tmp_path):
    """A fresh machine: the instance's folder does not exist. Stopping is a no-op and writes nothing; a check-mode
    start reports what it would do; a real start names the missing launcher."""
    run_dir = tmp_path / "state" / "run" / "never"
    files = S.ServiceFiles(str(run_dir / "engine.pid"), str(run_dir / "engine.run"), log=str(run_dir / "engine.log"),
                           launcher=str(run_dir / "engine.sh"))
    assert S.Supervisor(files, lambda url: True).ensure_stopped(5) == {
        "changed": False, "state": "stopped", "stopped_pids": [], "foreign": None}
    assert S.Supervisor(files, lambda url: True, check_mode=True).ensure_stopped(5)["changed"] is False
    checked = S.Supervisor(files, lambda url: True, check_mode=True).ensure_started("abc", "http://127.0.0.1:9/", "127.0.0.1", [], 5, 5)
    assert checked["changed"] and checked["pid"] is None
    with pytest.raises(S.ServiceError) as info:
        S.Supervisor(files, lambda url: True).ensure_started("abc", "http://127.0.0.1:9/", "127.0.0.1", [], 5, 5)
    assert str(info.value) == "The launcher %s is missing or not executable." % files.launcher
    assert not (tmp_path / "state").exists()


def test_file_checksum_and_log_tail(tmp_path):
    path = tmp_path / "launcher.sh"
    path.write_text("#!/bin/sh\n")
    assert S.file_checksum(str(path)) == hashlib.sha1(b"#!/bin/sh\n").hexdigest()  # nosec - as Ansible's checksum
    assert S.file_checksum(str(tmp_path / "absent")) is None
    log = tmp_path / "engine.log"
    log.write_text("".join("line %d\n" % n for n in range(100)))
    assert S.log_tail(str(log), 3) == ["line 97", "line 98", "line 99"] and S.log_tail(str(tmp_path / "absent")) == []


def test_restart_from_the_record_a_role_publishes_stops_and_starts_a_new_process(tmp_path):
    """What a benchmark does to restart an engine part way, without a playbook: the same launcher, a new process."""
    service = _service(tmp_path, "exec sleep 300\n")
    first = service.ensure_started(S.file_checksum(service.files.launcher), "http://127.0.0.1:9/health", "127.0.0.1", [], 20, 5)
    record = {"name": "engine", "launcher": service.files.launcher, "log": service.files.log, "pidfile": service.files.pidfile,
              "runfile": service.files.runfile, "health_url": "http://127.0.0.1:9/health", "host": "127.0.0.1", "ports": [],
              "start_timeout": 20, "stop_timeout": 5, "stop_scope": "leader"}
    assert set(record) == set(S.SERVICE_KEYS)
    again = S.restart(record, lambda url: True)
    assert again["started"] and again["pid"] != first["pid"] and not _alive(first["pid"]) and _alive(again["pid"])
    assert S.status(service.files)["checksum"] == S.file_checksum(service.files.launcher)
    with pytest.raises(S.ServiceError) as info:
        S.restart(dict(record, launcher=None, health_url=""), lambda url: True)
    assert info.value.msg == ("The service record lacks launcher, health_url; restart it through its role, whose record "
                              "(local_engine_info.service) has them.")
