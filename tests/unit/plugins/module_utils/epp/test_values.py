# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""epp/values.py: values read as the EPP's Go decoder reads them (keys case-insensitive, a wrong type reads as empty)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.epp import values as V


def test_param_keys_are_case_insensitive_as_go_decodes_them():
    params = {"blockSizeTokens": 32, "HASHSEED": "0"}
    assert V.param(params, "blocksizetokens") == 32 and V.param(params, "hashSeed") == "0" and V.param(params, "nope") is None


@pytest.mark.parametrize("value, mapping, listing", [({"a": 1}, {"a": 1}, []), ([1], {}, [1]), ("x", {}, []), (None, {}, [])])
def test_a_wrong_type_reads_as_empty(value, mapping, listing):
    assert V.as_mapping(value) == mapping and V.as_list(value) == listing


@pytest.mark.parametrize("value, is_int, is_number", [(3, True, True), (3.0, False, True), (True, False, False), ("3", False, False),
                                                      (float("nan"), False, True)])
def test_numbers_as_the_decoder_takes_them(value, is_int, is_number):
    assert (V.is_int(value), V.is_number(value)) == (is_int, is_number)


def test_a_named_plugin_has_a_non_empty_string_name():
    assert V.is_named("x") and not V.is_named("") and not V.is_named(None) and not V.is_named(3)
