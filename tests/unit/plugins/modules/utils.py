# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Run a module's main() in-process: the set_module_args / AnsibleExitJson pattern, shared by the module tests.

The fixture ``module_exits`` (tests/unit/plugins/modules/conftest.py) turns exit_json and fail_json into exceptions;
``run_module`` feeds the arguments and returns what the module would have printed.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import contextlib
import json

import pytest
from ansible.module_utils import basic

try:
    from ansible.module_utils.testing import patch_module_args
except ImportError:  # ansible-core before 2.19 (the floor, 2.16): the arguments go where AnsibleModule reads them
    @contextlib.contextmanager
    def patch_module_args(args=None):
        previous = basic._ANSIBLE_ARGS  # pylint: disable=protected-access
        basic._ANSIBLE_ARGS = json.dumps({"ANSIBLE_MODULE_ARGS": args or {}}).encode("utf-8")  # pylint: disable=protected-access
        try:
            yield
        finally:
            basic._ANSIBLE_ARGS = previous  # pylint: disable=protected-access


def _validator_raises_on_infinity():
    from ansible.module_utils.common.validation import check_type_int  # pylint: disable=import-outside-toplevel
    try:
        check_type_int(float("inf"))
    except OverflowError:
        return True
    except TypeError:
        return False
    return False


# ansible-core 2.19 and later raise (OverflowError) on an infinite number for an int option, and the module base answers
# with a sentence of its own; 2.16 to 2.18 refuse it with a sentence of their own, which reaches the user as it is.
VALIDATOR_RAISES_ON_INFINITY = _validator_raises_on_infinity()


def infinite_int_sentence(name, ours):
    """What a module answers for an infinite number given to its int option ``name``: ``ours`` where ansible-core's
    validator raises, else ansible-core's own sentence."""
    if VALIDATOR_RAISES_ON_INFINITY:
        return ours
    return "argument '%s' is of type <class 'float'> and we were unable to convert to int: <class 'float'> cannot be converted to an int" % name


class AnsibleExitJson(Exception):
    """The module called exit_json; args[0] is its result."""


class AnsibleFailJson(Exception):
    """The module called fail_json; args[0] is its result."""


def exit_json(self, **kwargs):  # pylint: disable=unused-argument
    kwargs.setdefault("changed", False)  # as Ansible reads a result without "changed"
    raise AnsibleExitJson(kwargs)


def fail_json(self, **kwargs):  # pylint: disable=unused-argument
    kwargs["failed"] = True
    raise AnsibleFailJson(kwargs)


def patch_exits(monkeypatch):
    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)


def run_module(module, args, check_mode=False):
    """Run ``module.main()`` with ``args``; return (exited, result): exited is False when it called fail_json."""
    if check_mode:
        args = dict(args, _ansible_check_mode=True)
    with patch_module_args(args):
        with pytest.raises((AnsibleExitJson, AnsibleFailJson)) as info:
            module.main()
    return info.type is AnsibleExitJson, info.value.args[0]
