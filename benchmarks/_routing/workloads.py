# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The named workloads of the routing bench: prompt families behind a per-configuration tag, built per seed.

Tenants (prompt families) with a long shared prefix each, picked with a Zipf skew, each request a new question or a
follow-up that extends the tenant's conversation; a share of one-shot cold prompts; bursts of same-tenant requests sent
together; concurrent workers; a working set stated as a multiple of the engines' KV caches together (the prefix length
fitted to it with the engines' tokenizer); a reset or a restart part way; two routers sharing the engines.
"""

from __future__ import absolute_import, division, print_function

import random

from . import module_utils

errors = module_utils("common.errors")
workload_mod = module_utils("kv.workload")


def words(rng, count):
    return " ".join("".join(rng.choice(workload_mod.SYLLABLES) for _i in range(rng.randint(1, 3))) for _j in range(count))


# Named workloads (--workload NAME, or "all"): what each sets over DEFAULTS. working_set: the prefixes' words are
# fitted so that the distinct full blocks of the prompts are that multiple of the engines' KV caches together.
DEFAULTS = {"tenants": 16, "prefix_words": 48, "zipf": 1.0, "follow_up": 0.3, "max_turns": 4, "cold": 0.0, "burst": 1,
            "workers": 1, "routers": 1, "reset_at": None, "restart_at": None, "working_set": None}
WORKLOADS = {
    "bench": {},
    "pressure": {"tenants": 12, "working_set": 1.9},
    "hot-cold": {"tenants": 2, "cold": 0.5},
    "bursts": {"burst": 4},
    "pressure-concurrent": {"tenants": 12, "working_set": 1.9, "workers": 4},
    "reset": {"tenants": 12, "working_set": 1.9, "reset_at": 0.5},
    "restart": {"tenants": 12, "working_set": 1.9, "restart_at": 0.5},
    "two-routers": {"tenants": 12, "working_set": 1.9, "routers": 2},
}
WORKLOAD_NOTES = {
    "bench": "16 tenants (Zipf 1.0), 48-word prefixes, 30% follow-ups, one request at a time",
    "pressure": "12 tenants (Zipf 1.0), prefixes fitted to a working set of 1.9x both KV caches, one at a time",
    "hot-cold": "2 hot tenants, half of the requests one-shot cold prompts of their own, one at a time",
    "bursts": "bursts of 4 concurrent requests of one tenant (new questions on its prefix), a burst at a time",
    "pressure-concurrent": "the pressure sequence from 4 concurrent workers",
    "reset": "the pressure sequence; every engine's prefix cache reset half way (vLLM sends AllBlocksCleared)",
    "restart": "the pressure sequence; the last engine stopped and started again half way (its cache starts empty)",
    "two-routers": "the pressure sequence, requests alternating between two routers sharing the engines",
}


def sequential(spec):
    """Whether a workload sends one request at a time (no concurrent workers, no bursts)."""
    return int(spec["workers"]) <= 1 and int(spec["burst"]) <= 1


def workload_spec(name, **overrides):
    spec = dict(DEFAULTS, **WORKLOADS[name]) if name in WORKLOADS else dict(DEFAULTS)
    spec.update(dict((k, v) for k, v in overrides.items() if v is not None))
    return spec


class Request:
    __slots__ = ("index", "tenant", "kind", "prompt", "group")

    def __init__(self, index, tenant, kind, prompt, group=None):
        self.index = index
        self.tenant = tenant
        self.kind = kind
        self.prompt = prompt
        self.group = group


def build_workload(tag, requests, spec, seed):
    """The requests of one configuration, from ``seed``; every prompt starts with ``tag``.

    Configurations get the same prompts after a tag of the same token length ("r12345:"): the tag is in every
    prompt's first block, and block hashes chain, so no block of one configuration matches another's, while token
    counts, tenants, follow-ups and lengths are the same for one seed.
    """
    rng = random.Random(seed)
    tenants = int(spec["tenants"])
    prefixes = ["%s tenant %d: %s" % (tag, t, words(rng, int(spec["prefix_words"]))) for t in range(tenants)]
    weights = [1.0 / (t + 1) ** float(spec["zipf"]) for t in range(tenants)]
    conversations = {}
    out = []
    group = 0
    while len(out) < requests:
        group += 1
        if spec["cold"] and rng.random() < float(spec["cold"]):
            prompt = "%s cold %d: %s\nQ: %s?" % (tag, group, words(rng, int(spec["prefix_words"])), words(rng, rng.randint(4, 14)))
            out.append(Request(len(out) + 1, "cold-%d" % group, "cold", prompt, group))
            continue
        tenant = rng.choices(range(tenants), weights)[0]
        for _i in range(max(1, int(spec["burst"]))):
            if len(out) >= requests:
                break
            idx = len(out)
            turns, convo = conversations.get(tenant, (0, ""))
            follow = spec["burst"] <= 1 and 0 < turns < int(spec["max_turns"]) and rng.random() < float(spec["follow_up"])
            question = "\nQ%d: %s?" % (idx, words(rng, rng.randint(4, 14)))
            turns, convo = (turns + 1, convo + question) if follow else (1, question)
            conversations[tenant] = (turns, convo)
            out.append(Request(idx + 1, tenant, "follow-up" if follow else "new", prefixes[tenant] + convo, group))
    return out


def fit_prefix_words(bench, spec, requests, seed):
    """Prefix words for which the prompts' distinct full blocks are ``working_set`` times the engines' caches together."""
    target = float(spec["working_set"]) * bench.cache_blocks()
    low, high = 24, 144
    counts = [bench.distinct_blocks(build_workload("r00000:", requests, dict(spec, prefix_words=w), seed)) for w in (low, high)]
    slope = (counts[1] - counts[0]) / float(high - low)
    words_ = int(round(low + (target - counts[0]) / slope)) if slope > 0 else low
    return max(8, min(400, words_))


def draw_tag(rng, tokens_of, want=None, attempts=500):
    """``(tag, its token count)``: a tag "r12345:" whose tokens, followed by " tenant", number ``want`` (any for None).

    Every configuration's prompts start with their own tag; with tags of one token count the prompts of one workload and
    seed have the same token counts whatever the engines' tokenizer makes of the digits (drawn freely, the tags of one run here differed by a token)."""
    for _attempt in range(attempts):
        tag = "r%05d:" % rng.randrange(10000, 100000)
        count = tokens_of(tag + " tenant")
        if want is None or count == want:
            return tag, count
    raise errors.CheckError("No tag r10000: to r99999: of %s tokens came up in %d draws; the engines' tokenizer splits them "
                            "unlike any seen before." % (want, attempts))


def plan(args, names, policies, seeds):
    """A callable for RoutingBench: the configurations, built once the engines' tokenizer and cache sizes are known."""
    overrides = {"tenants": args.tenants, "prefix_words": args.prefix_words, "zipf": args.zipf, "follow_up": args.follow_up}

    def build(bench):
        configs = []
        tags = random.SystemRandom()
        want = None
        for seed in seeds:
            for name in names:
                spec = workload_spec(name, **overrides)
                if spec["working_set"] and args.prefix_words is None:
                    spec["prefix_words"] = fit_prefix_words(bench, spec, args.requests, seed)
                spec.update(name=name, seed=seed)
                for policy in policies:
                    tag, want = draw_tag(tags, lambda text: len(bench.tokenize(bench.engines[0], text)), want)
                    configs.append(("%s %s seed %d" % (name, policy, seed), policy, spec, build_workload(tag, args.requests, spec, seed)))
        return configs
    return build
