# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import pytest


@pytest.fixture(autouse=True)
def module_exits(monkeypatch):
    """Every module test: exit_json and fail_json raise instead of printing and exiting."""
    # Imported here: this conftest may load before pytest-ansible has put the collection on sys.path.
    from ansible_collections.inference_cache.substrate.tests.unit.plugins.modules.utils import patch_exits  # pylint: disable=import-outside-toplevel

    patch_exits(monkeypatch)


@pytest.fixture
def stack():
    """A fake vLLM engine with LMCache beside it (lmcache_fake.FakeStack), started, stopped at the end."""
    from ansible_collections.inference_cache.substrate.tests.unit.plugins.lmcache_fake import FakeStack  # pylint: disable=import-outside-toplevel

    fake = FakeStack().start()
    yield fake
    fake.stop()
