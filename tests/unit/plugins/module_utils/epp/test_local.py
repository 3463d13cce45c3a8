# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""epp/local.py: which EPP runs on this machine and where its build is, what it dials, its refusals (no EPP process here:
tests/integration/test_epp_local.py runs a stand-in confined, test_epp_route_engine.py the real ones)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.epp import local as L
from ansible_collections.inference_cache.substrate.plugins.module_utils.go import build as gobuild


def _executable(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return str(path)


def test_the_builds_are_where_the_go_builds_owner_puts_them(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert L.build_dir("gie", "v1.4.0") == gobuild.build_dir(gobuild.state_dir(str(tmp_path)), "gie", "v1.4.0")
    assert L.gie_crds() == L.gie_build_dir() + "/inferencepool-crds.yaml"


def test_which_epp_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("SUBSTRATE_EPP_BINARY", "SUBSTRATE_EPP_IMPL"):
        monkeypatch.delenv(name, raising=False)
    path, impl, why = L.resolve_epp()
    assert path is None and impl is None and "No EPP binary given" in why and "No GIE EPP" in why
    gie = _executable(tmp_path / "gie" / "epp")
    monkeypatch.setattr(L, "gie_build_dir", lambda: str(tmp_path / "gie"))
    (tmp_path / "gie" / "inferencepool-crds.yaml").write_text("")
    assert L.resolve_epp() == (gie, "gie", None) and L.resolve_epp(impl="llm-d")[0] is None
    given = _executable(tmp_path / "my-epp")
    monkeypatch.setenv("SUBSTRATE_EPP_BINARY", given)
    assert L.resolve_epp() == (given, "llm-d", None) and L.resolve_binary() == (given, None)
    assert L.resolve_epp(impl="nope")[2] == "EPP nope is none this collection knows (gie, llm-d)."
    assert L.resolve_epp(str(tmp_path / "missing"))[2].startswith("%s is no executable file" % (tmp_path / "missing"))


def test_what_the_epp_dials():
    config = {"plugins": [{"type": "token-producer", "parameters": {"vllm": {"url": "http://127.0.0.1:8400"}}},
                          {"type": "precise-prefix-cache-producer",
                           "parameters": {"kvEventsConfig": {"discoverPods": True, "podDiscoveryConfig": {"socketPort": 5810}}}}]}
    assert L.reached_addresses(config, [("a", "127.0.0.1", 8400), ("b", "127.0.0.2", 8400)]) == [
        ("127.0.0.1", 5810), ("127.0.0.1", 8400), ("127.0.0.2", 5810), ("127.0.0.2", 8400)]


def test_a_gie_epp_without_a_kubeconfig_is_refused_in_one_sentence(tmp_path):
    with pytest.raises(L.EPPError, match=r"^The GIE EPP discovers its endpoints through the Kubernetes API only; give the kubeconfig"):
        L.EPP("/bin/true", {}, [], str(tmp_path), impl="gie")


def test_free_port_is_free_on_every_address():
    port = L.free_port("127.0.0.1", "127.0.0.2")
    assert 0 < port < 65536


def test_serve_says_why_it_cannot_start_in_one_line(tmp_path):
    class Out(object):
        def __init__(self):
            self.text = ""

        def write(self, text):
            self.text += text

        def flush(self):
            pass
    err = Out()
    code = L.serve("/bin/true", "gie", str(tmp_path / "missing.yaml"), str(tmp_path / "f"), 9002, 9090, out=Out(), err=err)
    assert code == 1 and err.text.startswith("The EPP could not be started: ") and err.text.count("\n") == 1
