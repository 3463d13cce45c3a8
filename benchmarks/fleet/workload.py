# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The fleet study's workload: the llm-d blog's B2B workload scaled to simulated engines, open loop.

The blog ("KV-Cache Wins You Can See", llm-d.ai, 2025-09-24, appendix A.1-A.2) and the benchmark report behind it
(llm-d/llm-d-kv-cache-manager ``benchmarking/73-capacity/README.md``, ``BLOG`` below): 8 vLLM pods of 307,328 KV tokens
each; 150 groups, each a 6,000-token shared prefix and 5 users whose 1,200-token question is cached per user; 1,000
output tokens per request; the residents of every group 73.2% of the fleet's KV capacity; a warm-up of one full set (15
QPS for 50 s), then a Poisson ramp from 3 to 60 QPS.

Scaled here by ``SCALE`` (12.5) in tokens, so that the ratios stay the blog's: blocks of 16 tokens, 1,536 blocks per engine
(24,576 tokens, the blog's 307,328 / 12.5), a 480-token prefix and a 96-token question per user (one group's residents 960
tokens, 60 blocks), 150 groups at 73.2% of 8 engines, and in place of the 1,000 output tokens (80 scaled), whose KV a running
request holds and which the engine keeps cached once it is done, a unique 80-token suffix per request: the simulator caches
prompt blocks only, so the suffix is what a request holds while it runs and leaves behind as blocks no later request
reuses. The simulator computes it as prefill, where the blog's engines decode; the latency model (the playbook's engine
settings) is chosen so that a miss of the whole prompt stays under the 1 s TTFT target at no load.

Every token is one word of exactly 4 characters (three letters and a blank: one token of the simulator's dummy tokenizer,
``--force-dummy-tokenizer``), so the 4 characters per token the GIE EPP's approximate prefix scorer assumes
(``averageCharactersPerToken``) hold exactly and its character blocks fall on the engine's token blocks.

``build(spec, seed)``: the schedule of one configuration (the same for every policy with that seed): an unmeasured warm-up of
``warmup_requests`` Poisson arrivals at ``warmup_rate``, then one step per rate of ``ramp``, ``step_seconds`` each; groups and
users uniform. Each arrival carries its compulsory-miss bound: the blocks of its prompt some earlier request of the
configuration already sent (the group's prefix once the group came, the question once its user came): no router can make a
request hit more than that, since a block that never came cannot be cached.
"""

from __future__ import absolute_import, division, print_function

import random
import string

# The blog's setup (appendix A.1-A.2 and the workload profile of llm-d-kv-cache-manager benchmarking/73-capacity/README.md).
BLOG = {"pods": 8, "kv_tokens_per_pod": 307328, "groups": 150, "users": 5, "prefix_tokens": 6000, "question_tokens": 1200,
        "output_tokens": 1000, "demand": 1800000 / float(8 * 307328), "warmup_rate": 15, "warmup_seconds": 50,
        "ramp": (3, 10, 15, 20, 22, 25, 30, 35, 40, 43, 46, 49, 52, 55, 57, 60),
        # its approximate setup ("estimated-scheduling"): GIE's prefix-cache-scorer with hashBlockSize 64 characters,
        # maxPrefixBlocksToMatch 256, lruCapacityPerServer 31250; kv-cache, queue and prefix scorers at weight 1 each
        "approx": {"hash_block_chars": 64, "max_prefix_blocks": 256, "lru_capacity_per_server": 31250}}
SCALE = 12.5
CHARS_PER_TOKEN = 4
_LETTERS = string.ascii_lowercase

DEFAULTS = {
    "engines": 8, "block_size": 16, "capacity_blocks": 1536,
    "prefix_tokens": 480, "question_tokens": 96, "users": 5, "suffix_tokens": 80, "demand": BLOG["demand"], "groups": None,
    "warmup_requests": 200, "warmup_rate": 16.0, "ramp": (4.0, 8.0, 16.0, 24.0, 32.0, 40.0, 48.0), "step_seconds": 5.0,
}


def spec_of(**overrides):
    """The workload's parameters: ``DEFAULTS`` with ``overrides`` (None leaves a default) and the fitted group count."""
    spec = dict(DEFAULTS)
    spec.update(dict((k, v) for k, v in overrides.items() if v is not None))
    spec["ramp"] = tuple(float(r) for r in spec["ramp"])
    for name in ("prefix_tokens", "question_tokens", "suffix_tokens"):
        if int(spec[name]) % int(spec["block_size"]):
            raise ValueError("%s (%s) must be a whole number of blocks of %s tokens" % (name, spec[name], spec["block_size"]))
    if not spec.get("groups"):
        spec["groups"] = fit_groups(spec)
    return spec


def group_tokens(spec):
    """One group's residents: its prefix and each user's question."""
    return int(spec["prefix_tokens"]) + int(spec["users"]) * int(spec["question_tokens"])


def fit_groups(spec):
    """The groups whose residents are ``demand`` times the fleet's KV capacity (at least 2)."""
    fleet_tokens = int(spec["engines"]) * int(spec["capacity_blocks"]) * int(spec["block_size"])
    return max(2, int(round(float(spec["demand"]) * fleet_tokens / float(group_tokens(spec)))))


def demand(spec):
    """The residents of every group as a share of the fleet's KV capacity."""
    fleet_tokens = int(spec["engines"]) * int(spec["capacity_blocks"]) * int(spec["block_size"])
    return int(spec["groups"]) * group_tokens(spec) / float(fleet_tokens)


def prompt_tokens(spec):
    return int(spec["prefix_tokens"]) + int(spec["question_tokens"]) + int(spec["suffix_tokens"])


def word(rng):
    """One token of the dummy tokenizer, 4 characters: three letters and a blank."""
    return "".join(rng.choice(_LETTERS) for _i in range(3)) + " "


def words(rng, count):
    """``count`` tokens of 4 characters each."""
    return "".join(word(rng) for _i in range(count))


def unique_words(number, count=2):
    """``count`` words that spell ``number`` (base 26 per letter): the first words of a request's unique suffix."""
    out = []
    for _i in range(count):
        letters = ""
        for _j in range(3):
            letters = _LETTERS[number % 26] + letters
            number //= 26
        out.append(letters + " ")
    return "".join(reversed(out))


class Arrival:
    """One request of the schedule."""
    __slots__ = ("index", "at", "step", "group", "user", "prompt", "tokens", "shared_tokens", "bound_tokens")

    def __init__(self, index, at, step, group, user, prompt, tokens, shared_tokens, bound_tokens):
        self.index = index
        self.at = at                        # seconds from the start of the configuration
        self.step = step                    # -1: the warm-up; else the index of the ramp's rate
        self.group = group
        self.user = user
        self.prompt = prompt
        self.tokens = tokens                # prompt tokens (one per word)
        self.shared_tokens = shared_tokens  # the group's prefix and the user's question
        self.bound_tokens = bound_tokens    # the compulsory-miss bound: tokens of blocks some earlier request sent


def build(spec, seed):
    """The arrivals of one configuration: the warm-up, then every step of the ramp (same seed, same schedule)."""
    rng = random.Random(seed)
    groups, users = int(spec["groups"]), int(spec["users"])
    prefixes = [words(rng, int(spec["prefix_tokens"])) for _g in range(groups)]
    questions = [[words(rng, int(spec["question_tokens"])) for _u in range(users)] for _g in range(groups)]
    suffix_rest = int(spec["suffix_tokens"]) - 2
    seen_groups, seen_users = set(), set()
    arrivals = []

    def add(at, step):
        group, user = rng.randrange(groups), rng.randrange(users)
        bound = 0
        if group in seen_groups:
            bound += int(spec["prefix_tokens"])
            if (group, user) in seen_users:
                bound += int(spec["question_tokens"])
        seen_groups.add(group)
        seen_users.add((group, user))
        index = len(arrivals)
        prompt = prefixes[group] + questions[group][user] + unique_words(index) + words(rng, suffix_rest)
        arrivals.append(Arrival(index, at, step, group, user, prompt, prompt_tokens(spec),
                                int(spec["prefix_tokens"]) + int(spec["question_tokens"]), bound))

    at = 0.0
    for _i in range(int(spec["warmup_requests"])):
        at += rng.expovariate(float(spec["warmup_rate"]))
        add(at, -1)
    start = at
    for step, rate in enumerate(spec["ramp"]):
        at = start
        while True:
            at += rng.expovariate(float(rate))
            if at >= start + float(spec["step_seconds"]):
                break
            add(at, step)
        start += float(spec["step_seconds"])
    return arrivals


def warmup_end(arrivals):
    """When the ramp begins: the time of the first arrival of step 0 less its gap, i.e. the warm-up's last arrival."""
    warm = [a.at for a in arrivals if a.step < 0]
    return max(warm) if warm else 0.0
