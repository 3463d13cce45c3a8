# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""epp/findings.py: what epp_config_check reports: its findings by kind, whether the EPP starts, one line per sentence."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

from ansible_collections.inference_cache.substrate.plugins.module_utils.epp import findings as F
from ansible_collections.inference_cache.substrate.plugins.module_utils.epp.llm_d import REFUSED, WARNING


def test_findings_are_filed_by_kind_and_refused_ones_stop_the_epp():
    result = F.EppConfigResult()
    result.add(WARNING, "old name", deprecation=True, rule="deprecated")
    result.add(WARNING, "tolerated", rule="w")
    assert result.ok and result.epp_starts and (result.deprecations, result.warnings) == (["old name"], ["tolerated"])
    result.add(REFUSED, "unknown field\nx", rule="r")
    assert not result.ok and result.epp_starts is False and result.kind_of("unknown field\nx") == REFUSED
    done = result.finish().as_dict()
    assert done["problems"] == ["unknown field\\nx"] and done["findings"][-1] == {"kind": REFUSED, "sentence": "unknown field\\nx"}
    assert result.rules == ["deprecated", "w", "r"] and "rules" not in done
    result.checked = False
    assert result.epp_starts is None


def test_names_in_sentences_are_plain_or_quoted():
    assert F.text("queue-scorer") == "queue-scorer" and F.text("has space") == "'has space'" and F.text(3) == "3"
    assert F.one_line("a\tb\x00") == "a b\\x00"
