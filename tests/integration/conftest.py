# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Environment shared by the integration tests, which run ansible, ansible-playbook and molecule as subprocesses.

pytest-ansible points ANSIBLE_COLLECTIONS_PATH at a ./collections folder that holds only this collection; the
playbooks also need kubernetes.core, which ``make setup`` puts in .cache/collections. Put that folder first, after
pytest-ansible has set the variable and before the test modules build their subprocess environments from os.environ.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import os

import pytest

_CACHE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), ".cache", "collections")


@pytest.hookimpl(trylast=True)
def pytest_configure(config):  # pylint: disable=unused-argument
    if os.path.isdir(_CACHE):
        paths = [_CACHE] + [p for p in os.environ.get("ANSIBLE_COLLECTIONS_PATH", "").split(os.pathsep) if p and p != _CACHE]
        os.environ["ANSIBLE_COLLECTIONS_PATH"] = os.pathsep.join(paths)
