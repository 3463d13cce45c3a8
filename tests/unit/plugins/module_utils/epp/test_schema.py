# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""epp/schema.py: the schema nodes of the EPP tables and the walk that holds a value against them, as Go's decoder does."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.epp import schema as S

NODE = S.obj({"blockSizeTokens": S.integer(1), "hashSeed": S.STR, "weights": S.list_of(S.number(0)), "mode": S.enum("a", "b"),
              "ttl": S.GO_DURATION, "memory": S.QUANTITY, "labels": S.map_of(S.STR), "on": S.BOOL},
             deprecated={"hashSeed": "is read but ignored"})


def findings(value, case_insensitive=False):
    return [(f.kind, f.path, f.message) for f in S.validate(value, NODE, "p", case_insensitive)]


def test_a_value_that_fits_has_no_finding_and_null_is_the_default():
    assert findings({"blockSizeTokens": 16, "weights": [1, 2.5], "mode": "a", "ttl": "1m30s", "memory": "8Gi", "labels": {"k": "v"},
                     "on": True}) == []
    assert findings({"blockSizeTokens": None}) == [] and S.validate(None, NODE) == []


@pytest.mark.parametrize("value, expected", [
    ({"blockSizeTokens": 0}, [("range", "p.blockSizeTokens", "must be at least 1 (got 0)")]),
    ({"blockSizeTokens": 1.5}, [("type", "p.blockSizeTokens", "is 1.5 but must be an integer")]),
    ({"nope": 1}, [("unknown", "p.nope", "is not a known field")]),
    ({"mode": "c"}, [("value", "p.mode", "is 'c' but must be one of a, b")]),
    ({"on": "yes"}, [("type", "p.on", "is a string but must be a boolean")]),
    ({"weights": [1, -1]}, [("range", "p.weights[1]", "must be at least 0 (got -1)")]),
    ({"hashSeed": "0"}, [("deprecated", "p.hashSeed", "is read but ignored")]),
])
def test_each_mismatch_is_a_finding_at_its_path(value, expected):
    got = findings(value)
    assert [(k, p) for k, p, _m in got] == [(k, p) for k, p, _m in expected]
    assert all(e[2] in g[2] or g[2].startswith(e[2].split(" (")[0]) for g, e in zip(got, expected)), got


def test_keys_match_case_insensitively_only_where_go_does():
    assert findings({"BLOCKSIZETOKENS": 16})[0][0] == "unknown"
    assert findings({"BLOCKSIZETOKENS": 16}, case_insensitive=True) == [
        ("case", "p.BLOCKSIZETOKENS", "is accepted as blockSizeTokens only because Go matches JSON keys case-insensitively")]


def test_names_and_paths_for_sentences():
    assert [S.type_name(v) for v in (None, True, 1, 1.5, "s", {}, [])] == [
        "null", "a boolean", "an integer", "a number", "a string", "a mapping", "a list"]
    assert S.join_path("a", "b") == "a.b" and S.join_path("a", "[3]") == "a[3]" and S.join_path("", "b") == "b"
    assert S.join_path("a", "has space") == "a.'has space'" and S.show("x" * 100).endswith("...")
    assert S.fields_at(NODE) == sorted(["blockSizeTokens", "hashSeed", "weights", "mode", "ttl", "memory", "labels", "on"])
