# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""benchmarks/fleet/workload.py: the blog's workload scaled to the fleet (its ratios kept), exact token counts of 4
characters each, a unique suffix per request, the schedule the same for every policy of a seed, and the compulsory-miss
bound of each request."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import collections
import os
import random
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from fleet import workload  # noqa: E402  pylint: disable=wrong-import-position
from _routing import simkeys  # noqa: E402  pylint: disable=wrong-import-position,wrong-import-order


def test_the_scaled_shape_keeps_the_blogs_ratios():
    spec = workload.spec_of()
    blog = workload.BLOG
    assert spec["groups"] == blog["groups"] == 150
    assert workload.demand(spec) == pytest.approx(blog["demand"], abs=0.005)          # 73.2% of the fleet's KV capacity
    assert spec["prefix_tokens"] * workload.SCALE == blog["prefix_tokens"]
    assert spec["question_tokens"] * workload.SCALE == blog["question_tokens"]
    assert spec["suffix_tokens"] * workload.SCALE == blog["output_tokens"]
    assert spec["capacity_blocks"] * spec["block_size"] == pytest.approx(blog["kv_tokens_per_pod"] / workload.SCALE, rel=0.001)
    with pytest.raises(ValueError, match="whole number of blocks"):
        workload.spec_of(question_tokens=90)


def test_every_token_is_four_characters_and_one_token_of_the_dummy_tokenizer():
    spec = workload.spec_of(warmup_requests=20, ramp=(5.0,), step_seconds=4.0)
    arrivals = workload.build(spec, 0)
    for arrival in arrivals[:10]:
        assert len(arrival.prompt) == 4 * arrival.tokens == 4 * workload.prompt_tokens(spec)
        assert len(simkeys.tokenize(arrival.prompt)) == arrival.tokens
    first = [a for a in arrivals if (a.group, a.user) == (arrivals[0].group, arrivals[0].user)]
    shared = 4 * arrivals[0].shared_tokens
    assert all(a.prompt[:shared] == arrivals[0].prompt[:shared] for a in first)
    assert len(set(a.prompt[shared:] for a in arrivals)) == len(arrivals)   # the suffix is each request's own
    assert workload.unique_words(0) == "aaa aaa " and workload.unique_words(1) == "aaa aab "
    assert workload.unique_words(26 ** 3) == "aab aaa "


def test_the_schedule_is_the_seeds_with_a_warmup_and_poisson_steps():
    spec = workload.spec_of(warmup_requests=50, warmup_rate=10.0, ramp=(4.0, 20.0), step_seconds=30.0)
    arrivals = workload.build(spec, 3)
    assert [a.prompt for a in workload.build(spec, 3)] == [a.prompt for a in arrivals]
    assert [a.prompt for a in workload.build(spec, 4)] != [a.prompt for a in arrivals]
    steps = collections.Counter(a.step for a in arrivals)
    assert steps[-1] == 50 and 80 < steps[0] < 160 and 480 < steps[1] < 720
    end = workload.warmup_end(arrivals)
    assert all(a.at <= end for a in arrivals if a.step < 0) and all(end < a.at < end + 60 for a in arrivals if a.step >= 0)
    assert all(end + 30 * a.step <= a.at < end + 30 * (a.step + 1) for a in arrivals if a.step >= 0)
    times = [a.at for a in arrivals]
    assert times == sorted(times)


def test_the_bound_is_what_earlier_requests_sent():
    spec = workload.spec_of(groups=3, users=2, warmup_requests=40, ramp=(1.0,), step_seconds=1.0)
    seen_groups, seen_users = set(), set()
    for arrival in workload.build(spec, 7):
        expected = (spec["prefix_tokens"] if arrival.group in seen_groups else 0) + (
            spec["question_tokens"] if (arrival.group, arrival.user) in seen_users else 0)
        assert arrival.bound_tokens == expected
        seen_groups.add(arrival.group)
        seen_users.add((arrival.group, arrival.user))
    assert workload.words(random.Random(1), 3).count(" ") == 3
