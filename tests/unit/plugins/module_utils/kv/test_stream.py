# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""kv/stream.py: the sequence tracker (gaps, restarts, duplicates, tails) per topic and data-parallel rank."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import stream


def test_sequence_gaps_restarts_duplicates():
    tr = stream.SequenceTracker()
    assert tr.observe("t", 0, 5)[0] == "first"  # joined late: not a gap
    assert tr.observe("t", 0, 6)[0] == "next"
    state, gap = tr.observe("t", 0, 9)
    assert state == "gap" and (gap["start"], gap["end"], gap["missing"]) == (7, 8, 2)
    assert tr.observe("t", 0, 9)[0] == "duplicate"
    assert tr.observe("t", 0, 0) == ("restart", None)
    state, gap = tr.observe("t", 1, 3)  # another rank is another stream
    assert state == "first" and gap is None
    state, gap = tr.observe("t", 0, 2)  # 0 -> 2 after the restart: seq 1 missing
    assert state == "gap" and (gap["start"], gap["end"]) == (1, 1)
    facts = tr.facts()
    assert facts["gaps"]["found"] == 2 and facts["gaps"]["unrepaired"] == 2
    assert facts["seq"]["t#0"] == {"first": 5, "last": 2, "batches": 5}  # the duplicate is not a batch
    assert facts["restarts"] == [{"stream": "t#0", "topic": "t", "rank": 0, "from": 9, "to": 0}]


def test_restart_with_missed_start_is_a_gap():
    tr = stream.SequenceTracker()
    tr.observe("t", 0, 10)
    state, gap = tr.observe("t", 0, 3)
    assert state == "restart" and (gap["start"], gap["end"]) == (0, 2)


def test_tail_recorded_and_late_live_copies_are_duplicates():
    tr = stream.SequenceTracker()
    tr.observe("t", 0, 0)
    tr.observe("t", 0, 1)
    assert tr.tail_start("t#0") == 2
    gap = tr.record_tail("t#0", [2, 3, 5])  # 4 never came back
    assert (gap["start"], gap["end"], gap["repaired"], gap["still_missing"], gap["tail"]) == (2, 5, False, 1, True)
    assert tr.observe("t", 0, 3) == ("duplicate", None)  # a live copy still on its way
    assert tr.observe("t", 0, 6)[0] == "next"
    assert tr.record_tail("t#0", []) is None
    facts = tr.facts()
    assert facts["gaps"]["tail"] == {"found": 1, "batches": 3} and facts["seq"]["t#0"] == {"first": 0, "last": 6, "batches": 3}  # live ones
