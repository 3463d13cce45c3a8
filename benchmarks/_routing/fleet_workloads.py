# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The open-loop workloads of the fleet study: prefix groups, users, a Poisson load ramp, a KV demand against the fleet.

In the shape of llm-d's blog "KV-Cache Wins You Can See" (2025-09-24: 150 prefix groups x a 6k-token shared prefix, 5
users per group with a 1.2k-token context each, Poisson load from 3 to 60 QPS, the KV demand about 73% of the fleet's
KV capacity), scaled to simulated engines: each request is its group's prefix, then its user's context, then a short
question of its own. The group count is fitted so that the distinct blocks of every prefix and every user context (the
KV demand) are ``demand`` times the fleet's blocks together; groups are picked uniformly (``zipf`` 0) or with a Zipf
skew; each ramp step sends Poisson arrivals at its rate for ``step_seconds``.

The prompts are words of the simulator's dummy tokenizer (one token per word with its blank), so prefix and context
lengths are exact token counts; a tag of one word, different per configuration, starts every prompt, so no block of
one configuration matches another's. ``WORKLOADS`` also carries open-loop forms of the closed-loop bench's workloads
(``bench``: Zipf tenants; ``hot-cold``: two hot tenants beside one-shot cold prompts).
"""

from __future__ import absolute_import, division, print_function

import random

from . import module_utils

workload_mod = module_utils("kv.workload")

DEFAULTS = {"demand": 0.75, "groups": None, "prefix_tokens": 1024, "users": 5, "user_tokens": 192, "question_tokens": 8,
            "zipf": 0.0, "cold": 0.0, "ramp": (4, 8, 12, 16, 20, 24, 28), "step_seconds": 10.0}
WORKLOADS = {
    "blog": {},
    "blog-light": {"demand": 0.3},
    "bench": {"demand": None, "groups": 16, "prefix_tokens": 384, "users": 4, "user_tokens": 64, "zipf": 1.0, "ramp": (8, 16),
              "step_seconds": 20.0},
    "hot-cold": {"demand": None, "groups": 2, "prefix_tokens": 512, "users": 5, "user_tokens": 64, "cold": 0.5, "ramp": (8, 16),
                 "step_seconds": 20.0},
}
NOTES = {
    "blog": "the llm-d blog's shape: prefix groups x a 1024-token prefix, 5 users per group with a 192-token context each, "
            "an 8-token question per request, groups uniform, KV demand 75% of the fleet's blocks, Poisson ramp from 4 to 28 "
            "requests/s (10 s a step)",
    "blog-light": "the blog's shape at a KV demand of 30% of the fleet's blocks (no cache pressure): the control",
    "bench": "16 tenants (Zipf 1.0), 384-token prefixes, 4 users each with a 64-token context, Poisson at 8 then 16 QPS",
    "hot-cold": "2 hot tenants, half of the requests one-shot cold prompts of their own, Poisson at 8 then 16 QPS",
}


def spec_of(name, **overrides):
    spec = dict(DEFAULTS, **WORKLOADS.get(name, {}))
    spec.update(dict((k, v) for k, v in overrides.items() if v is not None))
    spec["name"] = name
    return spec


def blocks_per_group(spec, block_size):
    return (int(spec["prefix_tokens"]) + int(spec["users"]) * int(spec["user_tokens"])) // block_size


def fit_groups(spec, block_size, fleet_blocks):
    """The groups whose prefixes and user contexts together are ``demand`` times the fleet's blocks (at least 2)."""
    if spec.get("groups"):
        return int(spec["groups"])
    return max(2, int(round(float(spec["demand"]) * fleet_blocks / float(blocks_per_group(spec, block_size)))))


def words(rng, count):
    """``count`` words, each one token of the dummy tokenizer, each followed by a blank."""
    return "".join("".join(rng.choice(workload_mod.SYLLABLES) for _i in range(rng.randint(1, 3))) + " " for _j in range(count))


class Arrival:
    """One request: when (seconds from the start), its ramp step, group, user, prompt, the token count of its shared part."""
    __slots__ = ("at", "step", "group", "user", "prompt", "shared_tokens", "kind", "index")

    def __init__(self, at, step, group, user, prompt, shared_tokens, kind, index):
        self.at = at
        self.step = step
        self.group = group
        self.user = user
        self.prompt = prompt
        self.shared_tokens = shared_tokens
        self.kind = kind
        self.index = index


def build(spec, tag, seed, block_size, fleet_blocks):
    """``(arrivals, groups)``: the schedule of one configuration (the same for one seed, whatever the tag)."""
    rng = random.Random(seed)
    groups = fit_groups(spec, block_size, fleet_blocks)
    prefixes = ["%s g%d %s" % (tag, g, words(rng, int(spec["prefix_tokens"]) - 2)) for g in range(groups)]
    contexts = [[words(rng, int(spec["user_tokens"])) for _u in range(int(spec["users"]))] for _g in range(groups)]
    weights = [1.0 / (g + 1) ** float(spec["zipf"]) for g in range(groups)]
    arrivals = []
    start = 0.0
    for step, rate in enumerate(spec["ramp"]):
        at = start
        while True:
            at += rng.expovariate(float(rate))
            if at >= start + float(spec["step_seconds"]):
                break
            question = words(rng, int(spec["question_tokens"])).rstrip()
            if spec["cold"] and rng.random() < float(spec["cold"]):
                prompt = "%s cold%d %s%s" % (tag, len(arrivals), words(rng, int(spec["prefix_tokens"]) - 2), question)
                arrivals.append(Arrival(at, step, None, None, prompt, 0, "cold", len(arrivals)))
                continue
            group = rng.choices(range(groups), weights)[0]
            user = rng.randrange(int(spec["users"]))
            shared = prefixes[group] + contexts[group][user]
            arrivals.append(Arrival(at, step, group, user, shared + question, int(spec["prefix_tokens"]) + int(spec["user_tokens"]),
                                    "group", len(arrivals)))
        start += float(spec["step_seconds"])
    return arrivals, groups
