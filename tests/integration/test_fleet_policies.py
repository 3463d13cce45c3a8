# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""benchmarks/fleet/policies.py: each stand-in picks, for a fixed fleet state, what the cited arithmetic gives (GIE v1.4.0's
queue, kv-cache-utilization and prefix-cache scorers and max-score picker; llm-d v0.9.0's precise configuration; the
oracle's estimate), ties are broken at random, and a fleet with more prefix groups than engines leaves no engine idle.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import collections
import os
import random
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from fleet import module_utils, policies, workload  # noqa: E402  pylint: disable=wrong-import-position

kv_index = module_utils("kv.index")

NAMES = ["a", "b", "c"]
ENGINES = {"a": (16, 100), "b": (16, 100), "c": (16, 100)}


def _prompt(words, rng_seed=0):
    return workload.words(random.Random(rng_seed), words)


def test_queue_scores_are_gies_min_max_of_the_waiting_requests():
    assert policies.queue_scores({"a": 3, "b": 3}) == {"a": 1.0, "b": 1.0}
    assert policies.queue_scores({"a": 0, "b": 4, "c": 2}) == {"a": 1.0, "b": 0.0, "c": 0.5}
    assert policies.queue_scores({"a": 1, "b": 0}) == {"a": 0.0, "b": 1.0}   # one waiting request costs the whole weight


def test_kv_utilization_and_the_weighted_sum_clamp_each_score():
    assert policies.kv_utilization_scores({"a": 0.25, "b": 1.0}) == {"a": 0.75, "b": 0.0}
    parts = {"queue": {"a": 1.0, "b": 0.0}, "kv": {"a": 1.5, "b": -0.5}}
    assert policies.weighted(parts, {"queue": 2.0, "kv": 1.0}) == {"a": 3.0, "b": 0.0}


def test_the_max_score_picker_breaks_ties_at_random_and_never_picks_a_lower_score():
    rng = random.Random(1)
    picks = collections.Counter(policies.max_score_pick({"a": 2.0, "b": 2.0, "c": 1.0, "d": 2.0}, rng) for _i in range(300))
    assert set(picks) == {"a", "b", "d"} and min(picks.values()) > 60
    picks = collections.Counter(policies.random_pick(["a", "b", "c"], rng) for _i in range(300))
    assert set(picks) == {"a", "b", "c"}


def test_gie_hashes_blocks_of_four_characters_per_token_full_blocks_only_and_truncates():
    prompt = _prompt(40)                       # 40 tokens of 4 characters: 160 bytes
    hashes = policies.gie_block_hashes(prompt, "tiny", 16, 256)
    assert len(hashes) == 2                   # 160 // 64; the partial third block is dropped
    assert policies.gie_block_hashes(prompt, "tiny", 16, 1) == hashes[:1]
    assert policies.gie_block_hashes(prompt[:63], "tiny", 16, 256) == []
    assert policies.gie_block_hashes(prompt, "other", 16, 256)[0] != hashes[0]   # the model is hashed in
    longer = policies.gie_block_hashes(prompt + _prompt(40, 9), "tiny", 16, 256)
    assert longer[:2] == hashes and len(longer) == 5


def _request(prompt):
    from fleet.engines import module_utils as _mu  # noqa: F401  pylint: disable=unused-import,import-outside-toplevel
    from _routing import simkeys  # pylint: disable=import-outside-toplevel,import-error
    return policies.Request(prompt, simkeys.tokenize(prompt), "tiny")


def test_approximate_and_gie_default_pick_the_weighted_arithmetic():
    prompt = _prompt(64)
    view = policies.View({"a": 2, "b": 0, "c": 1}, {"a": 0.5, "b": 0.2, "c": 0.1})
    for name, expected in (("approximate", "b"), ("gie-default", "a")):
        policy = policies.Policy(name, random.Random(0), engines=ENGINES, model="tiny", block_size=16,
                                 approx={"lru_capacity": 100, "max_blocks": 256})
        request = _request(prompt)
        policy.picked("a", request)            # the prompt went to a once: a is believed to hold all of it
        scores = policy.scores(_request(prompt), view, NAMES)
        assert scores["prefix"] == {"a": 1.0, "b": 0.0, "c": 0.0}
        assert scores["queue"] == {"a": 0.0, "b": 1.0, "c": 0.5}
        weights = policies.CONFIGS[name]["weights"]
        for engine in NAMES:   # queue + kv-cache-utilization + prefix, each times its weight
            assert scores["total"][engine] == pytest.approx(
                weights["queue"] * scores["queue"][engine] + weights["kv"] * (1 - view.usage[engine]) + weights["prefix"] * scores["prefix"][engine])
        # approximate (1/1/1): a 0 + 0.5 + 1 = 1.5, b 1 + 0.8 + 0 = 1.8, c 0.5 + 0.9 = 1.4; gie-default (2/2/3): a 4.0, b 3.6, c 2.8
        assert policy.pick(_request(prompt), view, NAMES) == expected


def test_the_blog_lru_forgets_what_the_engine_may_still_hold():
    small = policies.GIEPrefix(ENGINES, "tiny", block_size_tokens=16, max_blocks=256, lru_capacity=4, auto_tune=False)
    first, second = _prompt(64, 1), _prompt(64, 2)
    small.picked("a", small.hashes(first))
    small.picked("a", small.hashes(second))   # 4 blocks each: the LRU of 4 forgets the first prompt
    assert small.scores(small.hashes(first), NAMES)["a"] == 0.0 and small.scores(small.hashes(second), NAMES)["a"] == 1.0
    tuned = policies.GIEPrefix({"a": (16, 8), "b": (16, 8)}, "tiny")   # autoTune: each engine's num_gpu_blocks
    tuned.picked("a", tuned.hashes(first))
    tuned.picked("a", tuned.hashes(second))
    assert tuned.scores(tuned.hashes(first), ["a"])["a"] == 1.0


def test_the_blog_approximate_setup_scales_its_lru_and_match_limit():
    spec = workload.spec_of()
    got = policies.blog_approx(spec)
    assert got["lru_ratio"] == pytest.approx(31250 * 16 / 307328.0, abs=1e-3)       # 1.627 times each pod's KV tokens
    assert got["lru_capacity"] == round(got["lru_ratio"] * 1536)
    assert got["max_blocks"] == int(4096 / 7200.0 * 576 / 16)                       # 20 of the prompt's 36 shared blocks


def _stored(index, engine, tokens, block_size=16):
    """What the engine's BlockStored says once it cached ``tokens`` (its own hashes: any distinct numbers)."""
    count = len(tokens) // block_size
    index.stored(engine, [hash((engine, tuple(tokens[:(i + 1) * block_size]))) & 0xFFFFFFFF for i in range(count)], None,
                 tokens[:count * block_size], block_size)


def test_precise_scores_the_leading_blocks_of_the_kv_block_index_at_llm_ds_weights():
    index = kv_index.KVBlockIndex(16, "tiny", seed="", count_copies=False)
    request = _request(_prompt(64))            # 4 blocks
    _stored(index, "b", request.tokens[:32])    # b holds the first 2 blocks
    _stored(index, "c", request.tokens)         # c holds all 4
    policy = policies.Policy("precise", random.Random(0), index=index, block_size=16)
    view = policies.View({"a": 0, "b": 0, "c": 2}, {"a": 0.0, "b": 0.0, "c": 0.5})
    scores = policy.scores(request, view, NAMES)
    assert scores["prefix"] == {"a": 0.0, "b": 0.5, "c": 1.0}
    # prefix 2, kv-cache-utilization 1, queue 1: a 0 + 1 + 1 = 2, b 1 + 1 + 1 = 3, c 2 + 0.5 + 0 = 2.5
    assert scores["total"] == {"a": 2.0, "b": 3.0, "c": 2.5} and policy.pick(request, view, NAMES) == "b"


def test_load_sees_queue_and_usage_only_and_random_ignores_everything():
    policy = policies.Policy("load", random.Random(0))
    view = policies.View({"a": 0, "b": 0, "c": 3}, {"a": 0.3, "b": 0.1, "c": 0.0})
    assert policy.pick(_request(_prompt(32)), view, NAMES) == "b"   # a 1.7, b 1.9, c 1.0
    chooser = policies.Policy("random", random.Random(3))
    picks = set(chooser.pick(None, view, NAMES) for _i in range(50))
    assert picks == set(NAMES)


def test_the_oracle_weighs_queued_work_against_the_cache():
    latency = policies.Latency(0.010, 0.001, 4, 4.0)
    assert latency.factor(1) == 1.0 and latency.factor(4) == 4.0 and latency.drain_rate() == 1.0
    policy = policies.Policy("oracle", random.Random(0), latency=latency, block_size=16)
    request = _request(_prompt(656))
    # a holds 36 of 41 blocks but is full with 2 s of work queued; b holds nothing and is idle
    view = policies.View({"a": 3, "b": 0}, {"a": 0.5, "b": 0.0}, running={"a": 4, "b": 0}, queued_work={"a": 2.0, "b": 0.0},
                         cached_blocks={"a": 36, "b": 0})
    assert policy.estimate(request, view, "a") == pytest.approx(2.0 + (0.010 + 80 * 0.001) * 4.0)
    assert policy.estimate(request, view, "b") == pytest.approx(0.010 + 656 * 0.001)
    assert policy.pick(request, view, ["a", "b"]) == "b"
    view.queued_work["a"] = 0.1
    assert policy.pick(request, view, ["a", "b"]) == "a"


@pytest.mark.parametrize("name", ["approximate", "gie-default", "precise", "load"])
def test_more_prefix_groups_than_engines_leave_no_engine_idle(name):
    """16 engines, 60 groups, one request at a time on an idle fleet: every prefix a group has not sent yet scores 0 on
    every engine, so the pick among equal scores is random (a name-sorted tie-break sent them all to the first engines)."""
    engines = dict(("e%02d" % i, (16, 1000)) for i in range(16))
    names = sorted(engines)
    index = kv_index.KVBlockIndex(16, "tiny", seed="", count_copies=False)
    policy = policies.Policy(name, random.Random(5), engines=engines, model="tiny", index=index, block_size=16,
                             approx={"lru_capacity": 1000, "max_blocks": 256})
    rng = random.Random(2)
    prefixes = [_prompt(48, 100 + g) for g in range(60)]
    counts = collections.Counter()
    idle = policies.View(dict((n, 0) for n in names), dict((n, 0.0) for n in names))
    for _i in range(300):
        request = _request(rng.choice(prefixes) + _prompt(16, rng.randrange(10 ** 6)))
        picked = policy.pick(request, idle, names)
        policy.picked(picked, request)
        _stored(index, picked, request.tokens)
        counts[picked] += 1
    assert set(counts) == set(names), counts
    if name != "load":   # the groups spread too: no engine holds most of them
        assert max(counts.values()) < 300 / 4.0, counts
