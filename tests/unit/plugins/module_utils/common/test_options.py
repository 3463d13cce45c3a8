# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Option tables (common/options.py): one declaration gives the argument spec and the plain-Python validation."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.errors import CheckError
from ansible_collections.inference_cache.substrate.plugins.module_utils.common.options import argument_spec, range_problems, validate


def problem(table, params, where=""):
    """The sentence validate raises (None when it accepts the params)."""
    try:
        validate(table, params, where)
    except CheckError as exc:
        assert exc.facts == {}
        return exc.msg
    return None


@pytest.mark.parametrize("kind, good, bad, sentence", [
    ("str", "x", 5, "o must be a string, got 5."),
    ("path", "/tmp/x", ["/tmp"], "o must be a path, got ['/tmp']."),
    ("int", 3, True, "o must be an integer, got True."),
    ("int", -7, 1.5, "o must be an integer, got 1.5."),
    ("float", 2, float("nan"), "o must be a number, got nan."),
    ("float", float("inf"), "1.5", "o must be a number, got '1.5'."),
    ("bool", False, 1, "o must be true or false, got 1."),
    ("dict", {}, [], "o must be a mapping, got []."),
    ("list", (1, 2), "a,b", "o must be a list, got 'a,b'."),
])
def test_types(kind, good, bad, sentence):
    table = {"o": {"type": kind}}
    assert problem(table, {"o": good}) is None
    assert problem(table, {"o": bad}) == sentence


def test_raw_takes_anything_and_str_is_the_default_type():
    assert problem({"o": {"type": "raw"}}, {"o": [1, {"a": None}]}) is None
    assert problem({"o": {}}, {"o": 1}) == "o must be a string, got 1."


def test_choices_of_a_value_and_of_list_elements():
    table = {"mode": {"type": "str", "choices": ["connect", "bind"]}, "tags": {"type": "list", "elements": "str", "choices": ["a", "b"]}}
    assert problem(table, {"mode": "bind", "tags": ["b", "a"]}) is None
    assert problem(table, {"mode": "both"}) == "mode must be one of connect, bind, got 'both'."
    assert problem(table, {"tags": ["a", "c"]}) == "tags must be one of a, b, got 'c'."


@pytest.mark.parametrize("bounds, value, sentence", [
    ((1, 4096), 0, "o must be between 1 and 4096, got 0."),
    ((1, 4096), 4097, "o must be between 1 and 4096, got 4097."),
    ((0, 3600, "open-low"), 0, "o must be above 0 and at most 3600, got 0."),
    ((0, 3600, "open-low"), float("inf"), "o must be above 0 and at most 3600, got inf."),
    ((0, None), -1, "o must be at least 0, got -1."),
    ((0, None, "open-low"), 0, "o must be above 0, got 0."),
    ((None, 10), 10.5, "o must be at most 10, got 10.5."),
    ((0.5, 1.5), 0.25, "o must be between 0.5 and 1.5, got 0.25."),
])
def test_ranges(bounds, value, sentence):
    table = {"o": {"type": "float", "range": bounds}}
    assert problem(table, {"o": value}) == sentence


@pytest.mark.parametrize("bounds, value", [((1, 4096), 1), ((1, 4096), 4096), ((0, 3600, "open-low"), 3600), ((0, 3600, "open-low"), 0.001),
                                           ((0, None), 10 ** 12), ((None, 10), -10 ** 12)])
def test_range_edges_that_pass(bounds, value):
    assert problem({"o": {"type": "float", "range": bounds}}, {"o": value}) is None


def test_must_be_words_the_type_and_range_sentences():
    table = {"max_gpus": {"type": "int", "range": (1, 4096), "must_be": "a whole number between 1 and 4096"}}
    assert problem(table, {"max_gpus": 0}) == "max_gpus must be a whole number between 1 and 4096, got 0."
    assert problem(table, {"max_gpus": "8"}) == "max_gpus must be a whole number between 1 and 4096, got '8'."
    assert problem(table, {"max_gpus": 8}) is None


def test_shapes():
    table = {"endpoint": {"type": "str", "shape": (r"^(tcp|ipc)://\S+$", "a ZMQ endpoint such as tcp://HOST:PORT")},
             "any": {"type": "raw", "shape": (r"^x$", "the letter x")}}
    assert problem(table, {"endpoint": "tcp://h:1", "any": "x"}) is None
    assert problem(table, {"endpoint": "h:1"}) == "endpoint must be a ZMQ endpoint such as tcp://HOST:PORT, got 'h:1'."
    assert problem(table, {"any": 5}) == "any must be the letter x, got 5."  # a shape on a raw option: no regex on a non-string


def test_a_check_function_says_what_a_table_cannot():
    seen = []

    def even(value, name):
        seen.append((value, name))
        return None if value % 2 == 0 else "%s must be even, got %d." % (name, value)

    table = {"n": {"type": "int", "range": (0, 10), "check": even}}
    assert problem(table, {"n": 3}) == "n must be even, got 3."
    assert problem(table, {"n": 12}) == "n must be between 0 and 10, got 12."  # the range first: no check call
    assert seen == [(3, "n")]


def test_nested_tables_name_their_path():
    table = {
        "trigger": {"type": "dict", "options": {"url": {"type": "str", "required": True}, "delay": {"type": "float", "range": (0, 60)}}},
        "engines": {"type": "list", "elements": "dict", "options": {"port": {"type": "int", "range": (1, 65535)}}},
        "ports": {"type": "list", "elements": "int"},
    }
    assert problem(table, {"trigger": {"url": "http://x", "delay": 61}}) == "trigger.delay must be between 0 and 60, got 61."
    assert problem(table, {"trigger": {"delay": 1}}) == "trigger.url is required."
    assert problem(table, {"trigger": ["x"]}) == "trigger must be a mapping, got ['x']."
    assert problem(table, {"engines": [{"port": 1}, {"port": 0}]}) == "engines[1].port must be between 1 and 65535, got 0."
    assert problem(table, {"engines": [{"port": 1}, "x"]}) == "engines[1] must be a mapping, got 'x'."
    assert problem(table, {"ports": [1, "2"]}) == "ports[1] must be an integer, got '2'."
    assert problem(table, {"trigger": {"delay": 61}}, where="check.") == "check.trigger.delay must be between 0 and 60, got 61."


def test_defaults_are_applied_as_copies_and_required_options_are_required():
    table = {"headers": {"type": "dict", "default": {}}, "n": {"type": "int", "default": 1}, "url": {"type": "str", "required": True},
             "sub": {"type": "dict", "default": {}, "options": {"on": {"type": "bool", "default": True}}}}
    out = validate(table, {"url": "u", "extra": 5})
    assert out == {"headers": {}, "n": 1, "url": "u", "extra": 5, "sub": {"on": True}}  # unknown options kept as they are
    out["headers"]["x"] = "y"
    assert table["headers"]["default"] == {} and validate(table, {"url": "u"})["headers"] == {}
    assert problem(table, {"n": 2}) == "url is required."
    assert problem(table, {"url": None}) == "url is required."


def test_not_a_mapping_and_the_first_problem_by_name():
    assert problem({}, ["x"]) == "The options must be a mapping, got ['x']."
    assert problem({}, "x", where="engines[0].") == "engines[0] must be a mapping, got 'x'."
    table = {"b": {"type": "int"}, "a": {"type": "int"}}
    assert problem(table, {"a": "x", "b": "y"}) == "a must be an integer, got 'x'."


def test_argument_spec_strips_the_table_keys_and_copies_defaults():
    nested = {"n": {"type": "int", "range": (1, 2), "must_be": "one or two", "check": len, "shape": ("x", "y")}}
    table = {"t": {"type": "dict", "default": {}, "options": nested}, "e": {"type": "str", "choices": ["a"], "no_log": False}}
    spec = argument_spec(table)
    assert spec == {"t": {"type": "dict", "default": {}, "options": {"n": {"type": "int"}}}, "e": {"type": "str", "choices": ["a"], "no_log": False}}
    spec["t"]["default"]["n"] = 1  # what ansible-core does to a dict default with suboptions
    assert table["t"]["default"] == {} and argument_spec(table)["t"]["default"] == {}
    assert "range" in table["t"]["options"]["n"]


def test_range_problems_collects_every_sentence():
    ranges = {"b": (1, 2), "a": (0, 1, "open-low"), "c": (0, None)}
    assert range_problems({"a": 0, "b": 3, "c": None}, ranges) == ["a must be above 0 and at most 1, got 0.", "b must be between 1 and 2, got 3."]
    assert range_problems({"a": True, "b": float("nan")}, ranges) == ["a must be a number, got True.", "b must be a number, got nan."]
    assert range_problems({"a": 1, "b": 2, "c": 0}, ranges) == []
