# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""vars/go_builds.yml, the one catalog of Go builds: its shape, its pins, and that the Python side finds the builds where
go_build puts them (kwok_cluster's bin/<name>-<version>/) without building anything itself."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import os
import re
import subprocess
import sys

import pytest
import yaml

from ansible_collections.inference_cache.substrate.plugins.module_utils.common import wiring
from ansible_collections.inference_cache.substrate.plugins.module_utils.epp import local

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEYS = {"name", "module", "version", "packages", "ldflags", "cgo", "staging_version", "needs", "generate", "remedy", "source", "outputs"}


def _load(name):
    with open(os.path.join(ROOT, "vars", name)) as handle:
        return yaml.safe_load(handle)


def test_every_entry_is_pinned_and_needs_only_what_comes_before_it():
    builds, pins = _load("go_builds.yml")["builds"], _load("pinned_versions.yml")
    names = [b["name"] for b in builds]
    assert len(set(names)) == len(names), names
    for i, build in enumerate(builds):
        assert set(build) <= KEYS and {"name", "module", "version", "packages"} <= set(build), build
        pin = re.match(r"^\{\{ _substrate_pins\.(tools|software)\.(\w+) \}\}$", build["version"])
        assert pin and pin.group(2) in pins[pin.group(1)], build["version"]
        # A build names binaries, or generated files only (outputs, written by its generate commands).
        assert (build["packages"] or (build.get("outputs") and build.get("generate"))), build
        assert all("/" not in binary for binary in build["packages"]), build["packages"]
        assert all(not os.path.isabs(path) and ".." not in path.split("/") for path in build.get("outputs", [])), build
        if "source" in build:   # a program of the collection's own, built in its folder (its go.mod names its module)
            assert os.path.isfile(os.path.join(ROOT, build["source"], "go.mod")), build["source"]
        else:
            assert all(package.startswith(build["module"]) for package in build["packages"].values()), build["packages"]
        assert set(build.get("needs", [])) <= set(names[:i]), (build["name"], build.get("needs"))


def test_the_epp_builds_are_the_versions_the_python_side_knows():
    tools = _load("pinned_versions.yml")["tools"]
    assert tools["llm_d_router"] == wiring.ROUTER_VERSION and tools["gateway_api_inference_extension"] == wiring.GIE_VERSION
    builds = dict((b["name"], b) for b in _load("go_builds.yml")["builds"])
    assert builds[local.LLM_D_BUILD]["module"] == local.LLM_D_MODULE and "epp" in builds[local.LLM_D_BUILD]["packages"]
    assert "epp" in builds[local.GIE_BUILD]["packages"] and "SUBSTRATE_EPP_BINARY" in builds[local.LLM_D_BUILD]["remedy"]


def test_the_python_side_finds_a_build_where_go_build_puts_it_and_builds_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SUBSTRATE_EPP_BINARY", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))   # no go and no ansible-playbook to run, were anything to try
    path, why = local.resolve_binary()
    built = tmp_path / ".cache" / "inference_cache" / "kwok_cluster" / "bin" / ("llm-d-router-%s" % wiring.ROUTER_VERSION) / "epp"
    assert path is None and why.startswith("No EPP binary given and none at %s; set SUBSTRATE_EPP_BINARY" % built)
    built.parent.mkdir(parents=True)
    built.write_text("#!/bin/sh\n")
    built.chmod(0o755)
    assert local.resolve_binary() == (str(built), None)
    assert local.resolve_epp() == (str(built), "llm-d", None)


@pytest.mark.parametrize("entry, says", [("roles/local_router/files/epp_serve.py", "--service-account"),
                                         ("roles/simulated_engine/files/confined.py", "usage: confined.py SPEC -- COMMAND")])
def test_the_roles_daemons_run_from_the_collection_alone(entry, says):
    """What the local_router and simulated_engine roles' launchers run: a thin entry of the role, which finds the collection's
    Python through its one loader (no PYTHONPATH, no collections path)."""
    run = subprocess.run([sys.executable, os.path.join(ROOT, entry), "--help"], env=dict(os.environ, PYTHONPATH=""),
                         capture_output=True, text=True, timeout=60, check=False, cwd="/")
    assert says in run.stdout + run.stderr, run.stderr[-2000:]
