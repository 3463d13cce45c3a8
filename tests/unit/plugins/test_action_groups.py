# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""meta/runtime.yml's action groups: every member takes every option its group shares, with the same type and default,
so module_defaults for the group works for each member (a member without one fails with "Unsupported parameters").
tests/integration/test_action_groups.py runs module_defaults for the group against each member."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import importlib
import os

import pytest
import yaml

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.options import argument_spec
from ansible_collections.inference_cache.substrate.plugins.module_utils.http.args import HTTP_ARG_SPEC

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")
# What each group's members share: the options module_defaults may set for the whole group.
SHARED = {
    "http": dict(HTTP_ARG_SPEC, url={"type": "str", "default": "http://127.0.0.1:8000"}, model={"type": "str"},
                 timeout={"type": "float", "default": 60}),
}


def groups():
    with open(os.path.join(ROOT, "meta", "runtime.yml")) as handle:
        return yaml.safe_load(handle).get("action_groups") or {}


def test_every_group_says_what_its_members_share():
    assert sorted(groups()) == sorted(SHARED)


@pytest.mark.parametrize("group, member", [(g, m) for g, members in sorted(groups().items()) for m in members])
def test_each_member_takes_every_shared_option(group, member):
    table = argument_spec(importlib.import_module("ansible_collections.inference_cache.substrate.plugins.modules." + member).OPTIONS)
    for name, shared in argument_spec(SHARED[group]).items():
        assert name in table, "%s is in the action group %s but has no option %s" % (member, group, name)
        for key in ("type", "default", "no_log", "choices"):
            assert table[name].get(key) == shared.get(key), "%s.%s: %s %r, the group's %r" % (member, name, key, table[name].get(key), shared.get(key))
