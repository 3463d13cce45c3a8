# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""plugins/filter/go_builds.py: where the Go builds live, as go/build.py says once, and the refusals of bad input."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import pytest

from ansible_collections.inference_cache.substrate.plugins.filter import go_builds as F
from ansible_collections.inference_cache.substrate.plugins.module_utils.go import build


def test_the_state_dir_and_the_build_dirs():
    state = F.go_build_state_dir("/home/u")
    assert state == build.state_dir("/home/u") and state.startswith("/home/u/")
    assert F.go_build_dirs([{"name": "kwok", "version": "v0.7.0"}], state) == {"kwok": state + "/bin/kwok-v0.7.0"}


@pytest.mark.parametrize("call, match", [
    (lambda: F.go_build_state_dir("relative"), r"^go_build_state_dir needs the target's HOME \(an absolute path\), got 'relative'\.$"),
    (lambda: F.go_build_state_dir(None), r"^go_build_state_dir needs the target's HOME"),
    (lambda: F.go_build_dirs([{"name": "kwok"}], "/s"), r"^go_build_dirs takes the builds of vars/go_builds.yml"),
    (lambda: F.go_build_dirs("kwok", "/s"), r"^go_build_dirs takes the builds of vars/go_builds.yml"),
])
def test_bad_input_is_refused_in_one_sentence(call, match):
    with pytest.raises(Exception, match=match):
        call()


def test_the_filters_are_offered_under_their_names():
    assert set(F.FilterModule().filters()) == {"go_build_state_dir", "go_build_dirs"}
