# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""go/build.py (inference_cache.substrate.go_build) against a fake go command that records what it was asked."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json
import os
import threading

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.errors import CheckError
from ansible_collections.inference_cache.substrate.plugins.module_utils.go import build as gobuild
from ansible_collections.inference_cache.substrate.plugins.module_utils.go.build import GoBuild

UPSTREAM_GOMOD = """module k8s.io/kubernetes

go 1.24.0

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/apimachinery => ./staging/src/k8s.io/apimachinery
)
"""


class FakeGo:
    """Answers ``go env``, ``go mod download -json``, ``go get`` and ``go build -o OUT`` (writes an executable)."""

    def __init__(self, tmp_path, version="go1.26.8", download_error=None, build_error=None):
        self.calls = []
        self.version = version
        self.download_error = download_error
        self.build_error = build_error
        self.gomod = tmp_path / "upstream.mod"
        self.gomod.write_text(UPSTREAM_GOMOD)

    def __call__(self, argv, cwd):
        self.calls.append((list(argv), cwd))
        if argv[1:] == ["env", "GOVERSION"]:
            return 0, self.version + "\n", ""
        if argv[1:3] == ["mod", "download"]:
            if self.download_error:
                return 1, json.dumps({"Path": "x", "Error": self.download_error}), ""
            return 0, json.dumps({"Path": "x", "GoMod": str(self.gomod), "Dir": "/nowhere"}), ""
        if argv[1] == "get":
            return 0, "", ""
        if argv[1] == "build":
            if self.build_error:
                return 1, "", self.build_error
            out = argv[argv.index("-o") + 1]
            with open(out, "w") as handle:
                handle.write("#!/bin/sh\n")
            os.chmod(out, 0o755)
            return 0, "", ""
        if argv[0] == "gen":
            target = argv[1].split("=", 1)[1]
            os.makedirs(target)
            for name in argv[2:]:   # the files a generator writes into its folder
                with open(os.path.join(target, name), "w"):
                    pass
            return 0, "", ""
        return 127, "", "unexpected %s" % argv


def params(tmp_path, **extra):
    base = {"module": "k8s.io/kubernetes", "version": "v1.33.13", "packages": {"kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver"},
            "dest": str(tmp_path / "bin" / "kubernetes-v1.33.13"), "src": str(tmp_path / "src" / "kubernetes-v1.33.13"),
            "ldflags": "-s -w", "cgo": True, "staging_version": "", "generate": [], "go_binary": "go", "min_go_version": "1.24",
            "environment": {}, "timeout": 60}
    base.update(extra)
    return base


def test_builds_once_then_reports_no_change(tmp_path):
    go = FakeGo(tmp_path)
    first = GoBuild(params(tmp_path, staging_version="v0.33.13"), runner=go).ensure()
    assert first["changed"] and os.access(first["binaries"]["kube-apiserver"], os.X_OK)
    assert first["staging_replaced"] == 2 and first["go_version"] == "go1.26.8"
    gomod = (tmp_path / "src" / "kubernetes-v1.33.13" / "go.mod").read_text()
    assert "require k8s.io/kubernetes v1.33.13" in gomod and "\tk8s.io/api => k8s.io/api v0.33.13" in gomod and "go 1.24.0" in gomod
    assert not (tmp_path / "bin" / "kubernetes-v1.33.13.partial").exists()
    again = GoBuild(params(tmp_path), runner=go).ensure()
    assert not again["changed"] and again["msg"] == "k8s.io/kubernetes@v1.33.13 is built in %s." % params(tmp_path)["dest"]
    assert [c[0][1] for c in go.calls] == ["env", "mod", "get", "build"]


def test_check_mode_builds_nothing(tmp_path):
    go = FakeGo(tmp_path)
    result = GoBuild(params(tmp_path), check_mode=True, runner=go).ensure()
    assert result["changed"] and not go.calls and not (tmp_path / "bin").exists()


def test_generate_runs_in_the_folder_being_built(tmp_path):
    go = FakeGo(tmp_path)
    result = GoBuild(params(tmp_path, generate=[["gen", "output:dir={out}/crds"]]), runner=go).ensure()
    assert os.path.isdir(os.path.join(result["dest"], "crds"))
    assert go.calls[-1][0] == ["gen", "output:dir=%s.partial/crds" % result["dest"]]


def test_a_build_of_generated_files_only_gets_the_module_and_is_known_by_its_outputs(tmp_path):
    """The catalog's prometheus-operator-crds: no binary, controller-gen writes the CRDs; they tell that it exists."""
    go = FakeGo(tmp_path)
    module = "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring"
    gen = ["gen", "output:dir={out}/crds", "monitoring.coreos.com_podmonitors.yaml"]
    build = params(tmp_path, module=module, version="v0.95.2", packages={}, generate=[gen],
                   outputs=["crds/monitoring.coreos.com_podmonitors.yaml"],
                   dest=str(tmp_path / "bin" / "prometheus-operator-crds-v0.95.2"))
    first = GoBuild(build, runner=go).ensure()
    assert first["changed"] and first["binaries"] == {}
    assert [c[0][1] for c in go.calls][:3] == ["env", "mod", "get"] and go.calls[2][0] == ["go", "get", module + "@v0.95.2"]
    assert go.calls[3][0][0] == "gen" and len(go.calls) == 4, "no go build without a binary"
    # A missing output: the build is not there; one that the generate commands do not write: one sentence.
    assert not GoBuild(dict(build, outputs=["crds/missing.yaml"]), runner=go).built()
    with pytest.raises(CheckError, match=r"^The generate commands of .*monitoring@v0\.95\.2 wrote no crds/missing\.yaml\.$"):
        GoBuild(dict(build, outputs=["crds/missing.yaml"], dest=str(tmp_path / "bin" / "other")), runner=FakeGo(tmp_path)).ensure()
    with pytest.raises(CheckError, match=r"names no binary \(packages\) and no generated file \(outputs\)"):
        GoBuild(dict(build, outputs=[]), runner=go).ensure()


def test_no_cgo_and_the_environment_reach_the_go_command(tmp_path):
    build = GoBuild(params(tmp_path, cgo=False, environment={"GOPROXY": "https://proxy.example"}))
    assert build.env["CGO_ENABLED"] == "0" and build.env["GOPROXY"] == "https://proxy.example" and build.env["GOTOOLCHAIN"] == "local"


@pytest.mark.parametrize("version, expected", [
    ("go1.22.5", r"^Building k8s\.io/kubernetes@v1\.33\.13 needs Go 1\.24 or later; go is go1\.22\.5: install a newer Go"),
    ("", r"^Building k8s\.io/kubernetes@v1\.33\.13 needs Go 1\.24 or later as go \(no output\): install Go"),
])
def test_an_old_or_missing_go_is_one_sentence(tmp_path, version, expected):
    with pytest.raises(CheckError, match=expected):
        GoBuild(params(tmp_path), runner=FakeGo(tmp_path, version=version)).ensure()
    assert not (tmp_path / "bin" / "kubernetes-v1.33.13").exists()


def test_a_proxy_that_refuses_the_module_is_one_sentence(tmp_path):
    go = FakeGo(tmp_path, download_error="reading https://proxy.golang.org/k8s.io/kubernetes/@v/v1.33.13.info: 403 Forbidden")
    with pytest.raises(CheckError) as caught:
        GoBuild(params(tmp_path), runner=go).ensure()
    proxy = os.environ.get("GOPROXY") or "the default, https://proxy.golang.org"
    assert caught.value.msg == ("Cannot fetch k8s.io/kubernetes@v1.33.13 through the Go module proxy (GOPROXY %s): reading "
                                "https://proxy.golang.org/k8s.io/kubernetes/@v/v1.33.13.info: 403 Forbidden; set GOPROXY in the "
                                "build's environment to a proxy that serves it." % proxy)
    assert not (tmp_path / "bin" / "kubernetes-v1.33.13").exists()


def test_a_refused_module_says_its_remedy_instead(tmp_path):
    """The catalog's llm-d-router entry: the proxy refuses the module (403), the sentence says how to give a binary."""
    go = FakeGo(tmp_path, download_error="reading https://proxy.golang.org/github.com/llm-d/llm-d-router/@v/v0.9.0.info: 403 Forbidden")
    remedy = "give an llm-d EPP v0.9.0 binary instead (SUBSTRATE_EPP_BINARY), or set GOPROXY to a proxy that serves it."
    with pytest.raises(CheckError) as caught:
        GoBuild(params(tmp_path, module="github.com/llm-d/llm-d-router", version="v0.9.0", remedy=remedy,
                       packages={"epp": "github.com/llm-d/llm-d-router/cmd/epp"}), runner=go).ensure()
    assert caught.value.msg.startswith("Cannot fetch github.com/llm-d/llm-d-router@v0.9.0 through the Go module proxy (GOPROXY ")
    assert caught.value.msg.endswith("/@v/v0.9.0.info: 403 Forbidden; give an llm-d EPP v0.9.0 binary instead (SUBSTRATE_EPP_BINARY), "
                                     "or set GOPROXY to a proxy that serves it.")


def test_a_failed_build_leaves_nothing_in_place(tmp_path):
    go = FakeGo(tmp_path, build_error="cmd/kube-apiserver: undefined: x\nexit status 1")
    with pytest.raises(CheckError, match=r"^go build of k8s\.io/kubernetes/cmd/kube-apiserver \(v1\.33\.13\) failed: "
                                         r"cmd/kube-apiserver: undefined: x / exit status 1\.$"):
        GoBuild(params(tmp_path), runner=go).ensure()
    assert not (tmp_path / "bin" / "kubernetes-v1.33.13").exists()


def test_two_runs_at_once_build_once(tmp_path, monkeypatch):
    """The second run waits on the lock and then finds the first one's build."""
    go = FakeGo(tmp_path)
    release = threading.Event()
    entered = threading.Event()
    waiting = threading.Event()
    sleep = gobuild.time.sleep

    def slow(argv, cwd):
        if argv[1] == "build":
            entered.set()
            release.wait(10)
        return go(argv, cwd)

    def sleep_on_the_lock(seconds):
        waiting.set()   # only _lock sleeps: the second run found the lock taken
        sleep(min(seconds, 0.05))
    monkeypatch.setattr(gobuild.time, "sleep", sleep_on_the_lock)
    results = {}
    first = threading.Thread(target=lambda: results.setdefault("first", GoBuild(params(tmp_path), runner=slow).ensure()))
    first.start()
    assert entered.wait(10)
    second = threading.Thread(target=lambda: results.setdefault("second", GoBuild(params(tmp_path), runner=go).ensure()))
    second.start()
    # Released only once the second run waits on the lock: under load it could otherwise start after the first ended.
    assert waiting.wait(10)
    release.set()
    first.join(10)
    second.join(10)
    assert results["first"]["changed"] and not results["second"]["changed"]
    assert "by another run" in results["second"]["msg"]
    assert [c[0][1] for c in go.calls].count("build") == 1


def test_a_program_of_the_collections_own_is_built_in_its_folder_and_again_when_its_sources_change(tmp_path):
    source = tmp_path / "probe"
    source.mkdir()
    (source / "go.mod").write_text("module example.local/probe\n\ngo 1.24\n")
    (source / "go.sum").write_text("")
    (source / "main.go").write_text("package main\n\nfunc main() {}\n")
    go = FakeGo(tmp_path)
    spec = params(tmp_path, module="kvcache-probe", version="v0.9.0", packages={"kvcache_probe": "."}, source=str(source),
                  dest=str(tmp_path / "bin" / "kvcache-probe-v0.9.0"), src=str(tmp_path / "src" / "kvcache-probe-v0.9.0"))
    first = GoBuild(spec, runner=go).ensure()
    assert first["changed"] and [c[0][1] for c in go.calls] == ["env", "build"] and go.calls[-1][1] == str(source)
    digest = (tmp_path / "bin" / "kvcache-probe-v0.9.0" / gobuild.SOURCE_DIGEST).read_text().strip()
    assert digest == gobuild.source_digest(str(source))
    assert not GoBuild(spec, runner=go).ensure()["changed"]
    (source / "main.go").write_text("package main\n\nfunc main() { println() }\n")
    assert GoBuild(spec, runner=go).ensure()["changed"], "a change of the sources builds it again"
    (source / "go.mod").unlink()
    with pytest.raises(CheckError, match=r"holds no go\.mod, so kvcache-probe cannot be built from it; build from a checkout"):
        GoBuild(spec, runner=go).ensure()


def test_where_the_builds_live_is_said_once():
    assert gobuild.state_dir("/home/u") == "/home/u/.cache/inference_cache/kwok_cluster"
    assert gobuild.build_dir("/s", "gie", "v1.4.0") == "/s/bin/gie-v1.4.0"
