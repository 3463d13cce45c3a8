# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Property tests: check_epp_config answers any value of any shape with sentences, never with an exception.

Generated values are recursive mixes of dict, list, str, int, float (NaN and infinities too), bool and None, fed as the
whole config, as the engine facts, and planted at any depth of a good config (where they meet the typed fields).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import copy
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.inference_cache.substrate.plugins.module_utils.epp.config import check_epp_config
from ansible_collections.inference_cache.substrate.tests.unit.plugins.module_utils.epp.test_config import DISAGG, ENGINE, PRECISE

# Text that means a raw Python error reached the sentence.
NOISE = re.compile(r"Traceback|object has no attribute|object is not (?:subscriptable|iterable|callable)|unsupported operand|"
                   r"\b(?:Value|Type|Key|Index|Attribute|ZeroDivision|Recursion)Error\b|<(?:function|bound method|built-in)")

KEYS = st.sampled_from(["type", "name", "parameters", "pluginRef", "weight", "plugins", "kvEventsConfig", "tokenProcessorConfig",
                        "podDiscoveryConfig", "socketPort", "sources", "extractors", "deciders", "profiles", "x"]) | st.text(max_size=8)
SCALARS = (st.none() | st.booleans() | st.integers(min_value=-2 ** 70, max_value=2 ** 70) | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(max_size=12))
JUNK = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4), max_leaves=20)


def assert_sentences(result):
    for sentence in result.problems + result.deprecations + result.warnings:
        assert isinstance(sentence, str) and sentence.strip(), sentence
        assert "\n" not in sentence and "\r" not in sentence, sentence
        assert sentence.endswith("."), sentence
        assert not NOISE.search(sentence), sentence


def paths(value, prefix=()):
    """Every path (tuple of keys and indexes) into a nested dict/list value."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths(item, prefix + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from paths(item, prefix + (index,))


PRECISE_PATHS = [p for p in paths(PRECISE) if p]
DISAGG_PATHS = [p for p in paths(DISAGG) if p]


def plant(base, path, junk):
    config = copy.deepcopy(base)
    target = config
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = junk
    return config


@settings(max_examples=300, deadline=None)
@given(JUNK)
def test_any_value_as_the_whole_config(junk):
    result = check_epp_config(junk, engine=ENGINE, mode="precise")
    assert_sentences(result)
    assert result.problems  # nothing generated here is a valid config


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(PRECISE_PATHS), JUNK)
def test_any_value_at_any_depth_of_a_precise_config(path, junk):
    result = check_epp_config(plant(PRECISE, path, junk), engine=ENGINE, mode="precise")
    assert_sentences(result)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(DISAGG_PATHS), JUNK)
def test_any_value_at_any_depth_of_a_disagg_config(path, junk):
    assert_sentences(check_epp_config(plant(DISAGG, path, junk)))


@settings(max_examples=200, deadline=None)
@given(JUNK, JUNK, JUNK)
def test_any_engine_mode_and_version(engine, mode, version):
    result = check_epp_config(PRECISE, engine=engine, mode=mode, router_version=version)
    assert_sentences(result)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["block_size", "hash_seed", "topic", "kv_events_port", "engine_type", "kv_events_enabled",
                                        "enable_scale_out"]), SCALARS, max_size=7))
def test_any_engine_fact_values(engine):
    assert_sentences(check_epp_config(PRECISE, engine=engine))


# router_impl gie: the same promise for the Gateway API Inference Extension EPP's rules (its role-shaped config).
def _gie_role():
    from ansible_collections.inference_cache.substrate.tests.unit.plugins.module_utils.epp.test_gie import ROLE
    return ROLE


GIE_PATHS = [p for p in paths(_gie_role()) if p]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(GIE_PATHS), JUNK, st.sampled_from([None, "approximate", "precise"]))
def test_any_value_at_any_depth_of_a_gie_config(path, junk, mode):
    assert_sentences(check_epp_config(plant(_gie_role(), path, junk), router_impl="gie", mode=mode))


@settings(max_examples=200, deadline=None)
@given(JUNK, JUNK)
def test_any_value_as_a_gie_config_or_router_impl(junk, impl):
    assert_sentences(check_epp_config(junk, router_impl="gie"))
    assert_sentences(check_epp_config(PRECISE, router_impl=impl))
