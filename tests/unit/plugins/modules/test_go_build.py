# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The go_build module: its options, check mode, a build that exists, and bad input in one sentence (go/build.py's own
behaviour against a fake go command: tests/unit/plugins/module_utils/go/test_build.py)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import os

import pytest

from ansible_collections.inference_cache.substrate.plugins.modules import go_build as module
from ansible_collections.inference_cache.substrate.tests.unit.plugins.modules.utils import run_module
from ansible_collections.inference_cache.substrate.tests.unit.plugins.sentences import assert_one_sentence


def _args(tmp_path, **extra):
    args = {"module": "example.com/tool", "version": "v1.0.0", "packages": {"tool": "example.com/tool/cmd/tool"},
            "dest": str(tmp_path / "bin" / "tool-v1.0.0"), "src": str(tmp_path / "src" / "tool-v1.0.0"),
            "go_binary": str(tmp_path / "no-go-here")}
    args.update(extra)
    return args


def test_check_mode_says_it_would_build_and_touches_nothing(tmp_path):
    exited, result = run_module(module, _args(tmp_path), check_mode=True)
    assert exited and result["changed"] is True
    assert not (tmp_path / "bin").exists() and not (tmp_path / "src").exists()


def test_a_build_that_exists_is_not_redone_nor_is_go_asked(tmp_path):
    dest = tmp_path / "bin" / "tool-v1.0.0"
    dest.mkdir(parents=True)
    (dest / "tool").write_text("#!/bin/sh\n")
    os.chmod(str(dest / "tool"), 0o755)
    exited, result = run_module(module, _args(tmp_path))
    assert exited and result["changed"] is False and result["binaries"] == {"tool": str(dest / "tool")}


def test_a_missing_go_command_is_one_sentence(tmp_path):
    exited, result = run_module(module, _args(tmp_path))
    assert not exited and result["changed"] is False
    assert_one_sentence(result["msg"])
    assert result["msg"] == ("Building example.com/tool@v1.0.0 needs Go 1.24 or later as %s (No such file or directory): install Go "
                             "(https://go.dev/dl) or set the Go binary to use." % (tmp_path / "no-go-here"))
    assert not (tmp_path / "bin" / "tool-v1.0.0").exists()


@pytest.mark.parametrize("extra, words", [
    ({"packages": {}}, "names no binary (packages) and no generated file (outputs): name at least one."),
    ({"packages": {"a/b": "example.com/x"}}, "packages maps binary names (no /) to package paths; fix a/b."),
    ({"timeout": 0}, "timeout"),
])
def test_bad_options_are_refused_before_anything_is_built(tmp_path, extra, words):
    exited, result = run_module(module, _args(tmp_path, **extra))
    assert not exited and words in result["msg"]
    assert not (tmp_path / "bin").exists() and not (tmp_path / "src").exists()
