# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""kv/workload.py: kv_index_check's generated workload (prompt families, rounds, targets) and its validation."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.errors import CheckError
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import workload


def test_workload_is_deterministic_and_mixed():
    steps = workload.build(["a", "b"])
    again = workload.build(["a", "b"])
    assert [(s.family, s.kind, s.base, s.tail, s.targets) for s in steps] == [(s.family, s.kind, s.base, s.tail, s.targets) for s in again]
    assert len(steps) == 48
    kinds = set(s.kind for s in steps)
    assert kinds == {"prefix", "suffix", "repeat"}
    assert sum(len(s.targets) for s in steps) >= 50
    assert any(len(s.targets) == 2 for s in steps)
    assert len(set(s.base for s in steps)) == 8
    assert all(s.base.split("\n")[0] == steps[0].base.split("\n")[0] for s in steps)   # one shared preamble
    assert workload.build(["a", "b"], {"seed": 1})[0].base != steps[0].base


def test_workload_one_engine():
    steps = workload.build(["a"], {"families": 2, "rounds": 2})
    assert all(s.targets == ["a"] for s in steps)


@pytest.mark.parametrize("params, message", [
    ({"families": 0}, "workload.families must be at least 1, got 0."),
    ({"fan_out_every": -1}, "workload.fan_out_every must be at least 0, got -1."),
    ({"rounds": "x"}, "workload.rounds must be an integer, got 'x'."),
    ({"other": 1}, "workload has unknown keys other; known: families, fan_out_every, move_every, "),
    ("3", "workload must be a mapping, got '3'."),
])
def test_workload_validation(params, message):
    with pytest.raises(CheckError) as info:
        workload.build(["a"], params)
    assert info.value.msg.startswith(message), info.value.msg
    with pytest.raises(ValueError, match="at least one engine"):
        workload.build([])
