# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""epp/rules.py: epp_config_check's rules as data, each marked with the EPPs it applies to (the walk that applies them is
epp/config.py's, test_config.py)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.epp import rules as R

KINDS = {"broken", "refused", "warning"}


def test_every_rule_has_a_unique_name_a_kind_and_a_subject_the_walk_yields():
    names = [rule.name for rule in R.ALL_RULES]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    for rule in R.ALL_RULES:
        assert rule.behaviour or rule.kind in KINDS, rule.name
        assert rule.looks_at and callable(rule.when), rule.name
        assert set(rule.impls) <= {R.LLM_D, R.GIE} and rule.impls, rule.name


def test_each_epp_gets_its_own_rules_and_a_gie_rule_cites_gie():
    assert set(R.RULES) == set(r for r in R.ALL_RULES if R.LLM_D in r.impls)
    assert set(R.GIE_RULES) == set(r for r in R.ALL_RULES if R.GIE in r.impls)
    for rule in R.GIE_RULES:
        assert rule.gie and rule.gie.startswith("kubernetes-sigs/gateway-api-inference-extension@"), rule.name
    grouped = R.RULES_BY_IMPL[R.GIE]
    assert sum(len(v) for v in grouped.values()) == len(R.GIE_RULES)


def test_a_rule_fills_its_sentence_from_the_subject_and_the_config():
    class Config(object):
        version, router, source_word, behaviour = "v0.9.0", "llm-d-router", "dataLayer source", {}

    class Subject(object):
        def __init__(self):
            self.name = "x"

    rule = R.Rule("named", "plugin", "warning", "{name} on {router} {version}", lambda config, subject: True)
    assert rule.finding(Config(), Subject()) == ("warning", "x on llm-d-router v0.9.0")
    assert rule.impls == (R.LLM_D,) and R.Rule("g", "plugin", "warning", "", None, gie="cite").impls == (R.LLM_D, R.GIE)


@pytest.mark.parametrize("impl", sorted(R.IMPLS))
def test_each_implementation_names_its_tables(impl):
    tables = R.IMPLS[impl]
    assert {"plugins", "schema", "behaviour", "versions", "data_key"} <= set(tables) and tables["versions"]
