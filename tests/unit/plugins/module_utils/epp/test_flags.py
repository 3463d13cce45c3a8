# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""epp/flags.py: the flags a user gives held against each pinned EPP's own table, and the one sentence refusing them."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.epp import flags, gie, llm_d
from ansible_collections.inference_cache.substrate.tests.unit.plugins.sentences import assert_one_sentence

OWNED = {"pool-name": "router_release_name", "v": "router_epp_log_verbosity"}


def test_the_tables_are_each_epps_own():
    assert flags.EPPS["gie"]["flags"] is gie.FLAGS and flags.EPPS["llm-d"]["flags"] is llm_d.FLAGS
    assert set(llm_d.FLAGS) - set(gie.FLAGS) == {"grpc-max-recv-msg-size", "grpc-max-send-msg-size", "enable-grpc-stream-metrics"}
    assert set(gie.REMOVED_FLAGS) <= set(gie.FLAGS) and llm_d.REMOVED_FLAGS == gie.REMOVED_FLAGS
    assert len(set(llm_d.FLAGS)) == len(llm_d.FLAGS) and len(set(gie.FLAGS)) == len(gie.FLAGS)


@pytest.mark.parametrize("impl, given, found", [
    ("gie", ["zap-log-level", "refresh-metrics-interval"], {"unknown": [], "removed": [], "owned": []}),
    ("gie", ["grpc-max-recv-msg-size"], {"unknown": ["grpc-max-recv-msg-size"], "removed": [], "owned": []}),
    ("llm-d", ["grpc-max-recv-msg-size"], {"unknown": [], "removed": [], "owned": []}),
    ("llm-d", ["lora-info-metric", "bogus", "pool-name"], {"unknown": ["bogus"], "removed": ["lora-info-metric"], "owned": ["pool-name"]}),
])
def test_flag_problems(impl, given, found):
    assert flags.flag_problems(impl, given, OWNED) == found


def test_the_refusal_is_one_sentence_naming_each_kind():
    assert flags.flag_refusal("gie", ["zap-log-level"], OWNED) == ""
    sentence = flags.flag_refusal("llm-d", ["bogus", "cache-info-metric", "v"], OWNED, "router_epp_extra_flags")
    assert assert_one_sentence(sentence) == (
        "router_epp_extra_flags cannot pass bogus, cache-info-metric, v to the llm-d EPP v0.9.0: bogus is not a flag of it (an "
        "unknown flag stops it at start); cache-info-metric was removed (it refuses it at start: name the metrics in the "
        "engineConfigs of the EndpointPickerConfig's metrics extractor instead); the role sets v (from router_epp_log_verbosity) "
        "itself, and a second value would silently win over the role's or contradict what it built around it.")
    assert "a, b are not flags of it" in flags.flag_refusal("gie", ["a", "b"])
