# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""tools/cluster_verify.py (the in-cluster CLI over the module_utils): per-pod fan-out, pod-count check, report and exit status (checks faked)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import importlib.util
import json
import os
import socket

import pytest

TOOL = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "tools", "cluster_verify.py")


@pytest.fixture
def cli():
    spec = importlib.util.spec_from_file_location("cluster_verify_cli", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_lookup(ips):
    def lookup(host, port, family, kind):  # pylint: disable=unused-argument
        if not ips:
            raise socket.gaierror("no such host")
        return [(socket.AF_INET, kind, 6, "", (ip, port)) for ip in ips]
    return lookup


def test_resolve_waits_boundedly_for_the_expected_pods(cli):
    now = [0.0]
    answers = [["10.0.0.1"], ["10.0.0.1", "10.0.0.2"]]

    def lookup(*args):
        return fake_lookup(answers.pop(0) if len(answers) > 1 else answers[0])(*args)

    ips = cli.resolve_pods("svc", 8000, 2, 10, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s), lookup=lookup)
    assert ips == ["10.0.0.1", "10.0.0.2"]
    assert cli.resolve_pods("svc", 8000, 3, 4, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s),
                            lookup=fake_lookup(["10.0.0.1"])) == ["10.0.0.1"]


def run_main(cli, monkeypatch, capsys, ips, results, argv=()):
    monkeypatch.setattr(cli, "resolve_pods", lambda service, port, expect, timeout: ips)
    seen = []

    def check(name):
        def run(ip, args):
            seen.append((name, ip, args.topic_template.replace("$(POD_IP)", ip)))
            return results.get((name, ip), {"ok": True, "msg": "fine"})
        return run
    monkeypatch.setattr(cli, "CHECKS", {"kv_events": check("kv_events"), "prefix_cache": check("prefix_cache")})
    code = cli.main(["--service", "engines-kv-events.ns.svc.cluster.local", "--expect-pods", "2",
                     "--topic-template", "kv@$(POD_IP):8000@tiny"] + list(argv))
    return code, json.loads(capsys.readouterr().out), seen


def test_every_pod_is_checked_individually(cli, monkeypatch, capsys):
    code, report, seen = run_main(cli, monkeypatch, capsys, ["10.0.0.1", "10.0.0.2"], {})
    assert code == 0 and report["ok"]
    assert report["msg"] == "All 2 pod(s) passed kv_events and prefix_cache."
    assert ("kv_events", "10.0.0.2", "kv@10.0.0.2:8000@tiny") in seen
    assert len(seen) == 4


def test_one_failing_pod_fails_the_run_with_its_sentence(cli, monkeypatch, capsys):
    bad = {("prefix_cache", "10.0.0.2"): {"ok": False, "msg": "The warm request hit no cached tokens."}}
    code, report, _seen = run_main(cli, monkeypatch, capsys, ["10.0.0.1", "10.0.0.2"], bad)
    assert code == 1 and not report["ok"]
    assert report["msg"] == "1 of 2 pod(s) failed; first: pod 10.0.0.2, prefix_cache: The warm request hit no cached tokens."


def test_missing_pods_fail(cli, monkeypatch, capsys):
    code, report, _seen = run_main(cli, monkeypatch, capsys, ["10.0.0.1"], {})
    assert code == 1
    assert report["msg"] == "engines-kv-events.ns.svc.cluster.local resolved to 1 pod(s), fewer than the 2 expected."


def test_unknown_check_is_a_usage_error(cli, monkeypatch, capsys):
    monkeypatch.setattr(cli, "resolve_pods", lambda *a: [])
    assert cli.main(["--service", "x", "--checks", "bogus"]) == 2
    assert "--checks takes kv_events, prefix_cache" in capsys.readouterr().err
