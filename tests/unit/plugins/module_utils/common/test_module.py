# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The module base (common/module.py): an option table in, facts or one sentence out, never a traceback."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import sys

import pytest
from ansible.module_utils import basic

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.errors import CheckError
from ansible_collections.inference_cache.substrate.plugins.module_utils.common.module import ansible_module, run_module
from ansible_collections.inference_cache.substrate.tests.unit.plugins.modules import utils

TABLE = {
    "count": {"type": "int", "default": 2, "range": (1, 10)},
    "name": {"type": "str", "required": True},
    "extra": {"type": "dict", "default": {}, "options": {
        "on": {"type": "bool", "default": True},
        "token": {"type": "str", "no_log": True},
    }},
}


class Module(object):
    """A module whose main() is run_module over TABLE with ``run``; ``calls`` records what run was given."""

    def __init__(self, run, table=None, **kwargs):
        self.run, self.table, self.kwargs, self.calls = run, table or TABLE, kwargs, []

    def main(self):
        def run(params, module):
            self.calls.append((params, module.check_mode))
            return self.run(params)
        run_module(self.table, run, **self.kwargs)


@pytest.fixture(autouse=True)
def exits(monkeypatch):
    utils.patch_exits(monkeypatch)


def test_success_exits_with_the_facts_and_changed_false():
    module = Module(lambda params: {"seen": params["count"] * 10})
    exited, result = utils.run_module(module, {"name": "a"})
    assert exited and result == {"seen": 20, "changed": False}
    params, check_mode = module.calls[0]
    assert params["extra"] == {"on": True, "token": None} and check_mode is False
    assert utils.run_module(module, {"name": "a"}, check_mode=True)[1] == result and module.calls[1][1] is True


def test_run_returning_nothing_is_no_facts():
    assert utils.run_module(Module(lambda params: None), {"name": "a"}) == (True, {"changed": False})


def test_a_check_error_fails_with_its_sentence_and_facts():
    def run(params):
        raise CheckError("The engine said no.", {"changed": True, "status": 503, "msg": "not this one"})
    exited, result = utils.run_module(Module(run), {"name": "a"})
    assert not exited
    assert result == {"msg": "The engine said no.", "status": 503, "changed": False, "failed": True}


@pytest.mark.parametrize("args", [{"name": "a"}, {"name": "a", "count": 11}, {"name": "a", "count": float("inf")}])
def test_failures_are_reported_outside_any_exception_handler(monkeypatch, args):
    """fail_json called while an exception is handled takes its traceback into the result on ansible-core before 2.19
    (and on 2.19 and later where tracebacks are asked for): a failed check carries its sentence, never a traceback."""
    handled = []

    def fail_json(self, **kwargs):  # pylint: disable=unused-argument
        handled.append(sys.exc_info()[0])
        raise utils.AnsibleFailJson(kwargs)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)

    def run(params):
        raise CheckError("The engine said no.", {})
    exited, result = utils.run_module(Module(run), args)
    assert not exited and "exception" not in result and handled == [None]


def test_the_table_checks_run_before_the_work():
    module = Module(lambda params: {})
    exited, result = utils.run_module(module, {"name": "a", "count": 11})
    assert not exited and result["msg"] == "count must be between 1 and 10, got 11." and result["changed"] is False
    assert module.calls == []


def test_facts_of_every_result():
    def base(params):
        return {"who": params["name"], "changed": "never shown"}

    def run(params):
        if params["count"] == 3:
            raise CheckError("Three is wrong.", {"why": "odd"})
        return {"who": "the run wins"}
    assert utils.run_module(Module(run, facts=base), {"name": "a"})[1] == {"who": "the run wins", "changed": False}
    assert utils.run_module(Module(run, facts=base), {"name": "a", "count": 3})[1] == {
        "msg": "Three is wrong.", "who": "a", "why": "odd", "changed": False, "failed": True}
    assert utils.run_module(Module(run, facts=base), {"name": "a", "count": 0})[1] == {
        "msg": "count must be between 1 and 10, got 0.", "who": "a", "changed": False, "failed": True}


def test_a_missing_library_is_missing_required_lib():
    module = Module(lambda params: {}, requirements=[("zmq", True, None), ("msgspec", False, "Traceback: no msgspec")])
    exited, result = utils.run_module(module, {"name": "a", "count": 99})
    assert not exited and module.calls == []
    assert result["msg"] == basic.missing_required_lib("msgspec") and result["exception"] == "Traceback: no msgspec"


INFINITE_COUNT = utils.infinite_int_sentence("count", "count must be a whole number, got an infinite number.")


@pytest.mark.parametrize("args, sentence", [
    ({"name": "a", "count": float("inf")}, INFINITE_COUNT),
    ({"name": "a", "count": float("-inf")}, INFINITE_COUNT),
])
def test_an_infinite_number_for_an_int_option_is_one_sentence(args, sentence):
    module = Module(lambda params: {})
    exited, result = utils.run_module(module, args)
    assert not exited and result["msg"] == sentence and module.calls == []
    assert "\n" not in result["msg"]


def test_the_fallback_masks_nested_secrets(monkeypatch):
    """Where ansible-core's validator crashed, the options are taken raw: a nested no_log value stays masked."""
    masked = []

    def fail_json(self, **kwargs):
        masked.extend(self.no_log_values)
        raise utils.AnsibleFailJson(kwargs)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)
    exited, result = utils.run_module(Module(lambda params: {}), {"name": "a", "count": float("inf"), "extra": {"token": "s3cret"}})
    assert not exited and "s3cret" in masked and result["msg"] == INFINITE_COUNT


def test_ansible_cores_own_checks_still_speak():
    exited, result = utils.run_module(Module(lambda params: {}), {"count": 1})
    assert not exited and result["msg"] == "missing required arguments: name"


def test_a_dict_default_is_fresh_on_every_run():
    """ansible-core fills a dict default with its suboptions in place; the table's default must not keep them."""
    table = {"engine": {"type": "dict", "default": {}, "options": {"kind": {"type": "str", "choices": ["a", "b"]}}}}
    module = Module(lambda params: {"engine": params["engine"]}, table=table)
    first = utils.run_module(module, {})
    assert first == (True, {"engine": {"kind": None}, "changed": False})
    assert utils.run_module(module, {}) == first and table["engine"]["default"] == {}


def test_ansible_module_is_the_lower_level_builder():
    class Raw(object):
        @staticmethod
        def main():
            module = ansible_module(TABLE, supports_check_mode=True)
            module.exit_json(params=module.params)
    exited, result = utils.run_module(Raw, {"name": "a", "count": 50})
    assert exited and result["params"]["count"] == 50  # no table checks: the caller validates
    exited, result = utils.run_module(Raw, {"name": "a", "count": float("inf")})
    assert not exited and result["msg"] == INFINITE_COUNT
