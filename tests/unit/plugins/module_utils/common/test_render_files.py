# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""common/render_files.py: what writing rendered files into a folder changes (content, mode), its diff, and the write."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import os
import stat

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.common import render_files as R
from ansible_collections.inference_cache.substrate.plugins.module_utils.common.errors import CheckError


@pytest.mark.parametrize("mode, bits", [("0644", 0o644), ("644", 0o644), ("0o600", 0o600), (420, 0o644)])
def test_parse_mode(mode, bits):
    assert R.parse_mode(mode) == bits


@pytest.mark.parametrize("mode", ["rw", "", "0o9", 0o17777, None, True])
def test_a_wrong_mode_is_one_sentence(mode):
    with pytest.raises(CheckError, match=r"^mode must be "):
        R.parse_mode(mode)


def test_plan_apply_then_nothing_changes(tmp_path):
    entries = R.plan(str(tmp_path), {"a/b.yaml": "x: 1\n", "c.txt": "c\n"}, "0600")
    assert [e["name"] for e in entries] == ["a/b.yaml", "c.txt"] and all(e["content_changed"] for e in entries)
    assert R.diff(entries)[0]["before_header"].endswith("b.yaml (absent)")
    R.apply(entries)
    assert (tmp_path / "a" / "b.yaml").read_text() == "x: 1\n" and stat.S_IMODE(os.stat(str(tmp_path / "c.txt")).st_mode) == 0o600
    again = R.plan(str(tmp_path), {"a/b.yaml": "x: 1\n", "c.txt": "c\n"}, "0600")
    assert R.changed_paths(again) == [] and R.diff(again) == []
    modes = R.plan(str(tmp_path), {"c.txt": "c\n"}, "0644")
    assert R.changed_paths(modes) == [str(tmp_path / "c.txt")] and R.diff(modes)[0]["after"] == "mode: 0644\n"


@pytest.mark.parametrize("files, sentence", [
    ({"../out.txt": "x"}, r"^File name '../out.txt' leaves the folder "),
    ({"a": "x", "a/b": "y"}, r"^File names 'a' and 'a/b' conflict"),
    ({"a": {"k": 1}}, r"^The content of 'a' is a dict, and render_files writes data only into a \.json, \.yaml or \.yml file: "),
    ({}, r"^files \(paths to contents\) or documents \(paths to lists of YAML documents\) must be a non-empty mapping\.$"),
])
def test_wrong_files_are_one_sentence(tmp_path, files, sentence):
    with pytest.raises(CheckError, match=sentence):
        R.plan(str(tmp_path), files)
