# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""service/confine.py: a program confined to a loopback-only network namespace, bridged through Unix sockets (the bridge
in this process; the confined EPP and simulator run for real in tests/integration/test_epp_local.py)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import os
import random
import socket
import subprocess
import sys
import threading
import time

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.service import confine as C
from ansible_collections.inference_cache.substrate.tests.unit.plugins.sentences import assert_one_sentence


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.0.1.7", True), ("localhost", True), ("10.0.0.1", False),
                                            ("not-an-address", False)])
def test_is_loopback(host, loopback):
    assert C.is_loopback(host) is loopback


def test_a_forward_joins_a_unix_socket_to_a_tcp_listener_bytes_both_ways(tmp_path):
    echo = C.tcp_listener("127.0.0.1", 0)
    port = echo.getsockname()[1]

    def serve():
        conn, _peer = echo.accept()
        conn.sendall(conn.recv(64).upper())
        conn.close()
    threading.Thread(target=serve, daemon=True).start()
    path = str(tmp_path / "reach.sock")
    forward = C.Forward(C.unix_listener(path), C.dial_tcp("127.0.0.1", port))
    try:
        client = C.dial_unix(path)()
        client.sendall(b"hello")
        assert client.recv(64) == b"HELLO"
        client.close()
    finally:
        forward.stop()
        echo.close()


def test_a_confined_program_reaches_loopback_only_in_one_sentence(tmp_path, monkeypatch):
    monkeypatch.setattr(C.shutil, "which", lambda name: "/usr/bin/unshare")
    with pytest.raises(C.ConfinementError) as info:
        C.Confined(["true"], [("10.1.2.3", 80)], [], str(tmp_path), None, label="EPP")
    assert assert_one_sentence(info.value.msg) == ("A confined EPP reaches loopback addresses only, not 10.1.2.3; run the engines on "
                                                   "127.0.0.0/8, or ask for an unconfined EPP.")
    monkeypatch.setattr(C.shutil, "which", lambda name: None)
    with pytest.raises(C.ConfinementError, match=r"^Cannot confine the EPP to loopback: no unshare command"):
        C.Confined(["true"], [], [], str(tmp_path), None, label="EPP")


def test_the_bridge_is_built_before_the_program_and_removed_by_stop(tmp_path, monkeypatch):
    monkeypatch.setattr(C.shutil, "which", lambda name: "/usr/bin/unshare")
    confined = C.Confined(["prog", "--x"], [("127.0.0.1", 1)], [9002], str(tmp_path), None, host_ports={9002: 0}, label="EPP")
    try:
        assert confined.cmd[:3] == ["/usr/bin/unshare", "--net", "--map-root-user"]
        assert confined.cmd[4:6] == [C._LOADER, "service.confine"] and confined.cmd[-2:] == ["prog", "--x"]  # pylint: disable=protected-access
        assert os.path.isfile(C._LOADER) and 9002 in confined.ports  # pylint: disable=protected-access
        assert sorted(os.listdir(confined.sockets)) == ["reach-0.sock"]   # the served ones are the namespace side's
        probe = socket.create_connection(("127.0.0.1", confined.ports[9002]), timeout=5)
        probe.close()
    finally:
        confined.stop()
    assert not os.path.exists(confined.sockets)


def test_the_namespace_side_wants_its_spec_and_command():
    assert C.main(["--run", "{}", "--", "true"]) == 2 and C.main([]) == 2


def test_a_stop_request_is_a_flag_that_wait_reports(monkeypatch):
    installed = {}
    monkeypatch.setattr(C.signal, "signal", installed.__setitem__)
    stopping = C.StopRequest()
    assert set(installed) == {C.signal.SIGTERM, C.signal.SIGINT} and not stopping.asked
    assert stopping.wait(0.01) is False
    installed[C.signal.SIGTERM](C.signal.SIGTERM, None)
    assert stopping.asked and stopping.wait(3600) is True   # asked: no sleep at all


# The loop of confine.run and epp/local.serve, stopped by SIGTERM at any moment; with threading.Event's set() as the
# handler, about 1 stop in 300 deadlocked (the handler waits for the lock Event.wait holds in the same thread). The
# program reaches the collection through its one loader (argv[1]), as the confined programs do.
_LOOP = """import importlib.util, sys
spec = importlib.util.spec_from_file_location("inference_cache_substrate_loader", sys.argv[1])
loader = importlib.util.module_from_spec(spec)
spec.loader.exec_module(loader)
stopping = loader.module_utils("service.confine").StopRequest()
sys.stdout.write("ready\\n")
sys.stdout.flush()
while not stopping.wait(0.0005):
    pass
"""


def test_a_stop_request_ends_the_loop_whenever_the_signal_lands():
    hung = []
    for attempt in range(100):
        proc = subprocess.Popen([sys.executable, "-c", _LOOP, C._LOADER], stdout=subprocess.PIPE)  # pylint: disable=consider-using-with,protected-access
        assert proc.stdout.readline() == b"ready\n"
        time.sleep(random.random() * 0.003)
        proc.terminate()
        try:
            assert proc.wait(5) == 0
        except subprocess.TimeoutExpired:
            hung.append(attempt)
            proc.kill()
            proc.wait()
        proc.stdout.close()
    assert hung == []
