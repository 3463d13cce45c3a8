# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""common/errors.py: the collection's one error type, a sentence and the facts to return with it."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.errors import CheckError


def test_a_check_error_is_its_sentence_and_a_copy_of_its_facts():
    facts = {"requests": 3}
    error = CheckError("Engine a cannot be queried.", facts)
    facts["requests"] = 4
    assert error.msg == str(error) == "Engine a cannot be queried." and error.facts == {"requests": 3}
    assert CheckError("x").facts == {} and isinstance(error, Exception)
