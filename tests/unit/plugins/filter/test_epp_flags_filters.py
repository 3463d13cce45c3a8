# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""plugins/filter/epp_flags.py: epp_flag_refusal says what epp/flags.py says, and refuses what it cannot read."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import pytest

from ansible_collections.inference_cache.substrate.plugins.filter import epp_flags as F
from ansible_collections.inference_cache.substrate.plugins.module_utils.epp import flags


def test_the_filter_is_the_same_and_refuses_what_it_cannot_read():
    assert F.epp_flag_refusal({"bogus": 1}, "gie") == flags.flag_refusal("gie", ["bogus"])
    assert F.epp_flag_refusal({}, "llm-d") == ""
    with pytest.raises(Exception, match=r"^epp_flag_refusal knows the EPPs gie, llm-d, not 'other'\.$"):
        F.epp_flag_refusal({}, "other")
    with pytest.raises(Exception, match=r"^epp_flag_refusal takes the flags given"):
        F.epp_flag_refusal("--v=3", "gie")


def test_the_filter_is_offered_under_its_name():
    assert F.FilterModule().filters() == {"epp_flag_refusal": F.epp_flag_refusal}
