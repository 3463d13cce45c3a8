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

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args


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
