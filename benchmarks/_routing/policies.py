# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The stand-in router's policies: what each scores, and the one pick they share.

* precise: the engine with the most predicted cached tokens in the KV-block index built from the engines' KV events
  (``kv/index_check.KVIndexCheck``: copies counted, what ``kv_index_check`` proves exact);
* precise-speculative: precise, plus, for ``SPECULATIVE_TTL`` seconds after each pick, the picked engine counted as
  holding the prompt's blocks (the EPP's ``speculativeIndexing``);
* approximate: the engine with the most matched blocks in ``kv/index_approx.ApproxPrefixPredictor``, the model of
  llm-d's approx-prefix-cache-producer, fed with its own routing decisions;
* load-only: the engine with the fewest requests sent so far (round robin);
* random: a seeded random engine.

Ties are broken the same way in every stand-in policy: fewest requests sent so far in this configuration, then name.
"""

from __future__ import absolute_import, division, print_function

POLICIES = ("precise", "precise-speculative", "approximate", "load-only", "random")
SPECULATIVE_TTL = 2.0   # seconds: the router role's router_speculative_ttl default (2s)


def speculative_blocks(held, keys, now):
    """Leading ``keys`` still held speculatively at ``now`` (``held``: key -> expiry)."""
    count = 0
    for key in keys:
        if held.get(key, 0) <= now:
            break
        count += 1
    return count


def scores(policy, precise, approximate=None, speculative=None):
    """Per engine, what ``policy`` maximises: predicted cached tokens (precise; at least the speculative ones with
    precise-speculative), the approximate producer's matched blocks, or nothing (load-only, random)."""
    if policy == "approximate":
        return approximate or {}
    if policy == "precise-speculative":
        return dict((name, max(value, (speculative or {}).get(name, 0))) for name, value in precise.items())
    if policy == "precise":
        return precise
    return {}


def pick(policy, scored, sent, rng):
    """ONE engine: random (seeded), else the highest score; ties: fewest requests sent so far, then name."""
    names = sorted(sent)
    if policy == "random":
        return rng.choice(names)
    return min(names, key=lambda n: (-scored.get(n, 0), sent[n], n))
