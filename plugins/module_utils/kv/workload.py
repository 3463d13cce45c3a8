# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""Generated prompt families for the KV-block index check (pure Python, no Ansible, no user data).

Every prompt is a family's base (one short preamble shared by all families, so the engines' block chains
branch, and a long prefix of the family) followed by a tail that is new, repeated (the whole prompt cached)
or empty. The check pads each base to a whole number of blocks: when a base alone comes again, vLLM
recomputes its last block although it is cached (it always computes the last prompt token) and then holds two
cached blocks with the same hash; the longer prompts of the family then show whether an index lost track of it.
Each family has a home engine; some steps go to every engine (so the check learns every engine's real cached
tokens for the same prompt) and some to another engine (a router that moved the family). Same parameters, same
workload.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import random

from ..common.options import validate as validate_options

SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "be", "do", "fu", "gi", "ha", "ju", "ze", "po",
             "qua", "rex", "sol", "tan", "vel", "wix", "yor", "zul", "mar", "nor", "pel", "tor")

# The workload's option table (``common/options.py``); ``kv_index_check`` nests it under ``workload``.
WORKLOAD_SPEC = {
    "families": {"type": "int", "default": 8, "range": (1, None)},
    "rounds": {"type": "int", "default": 6, "range": (1, None)},
    "preamble_words": {"type": "int", "default": 10, "range": (0, None)},
    "prefix_words": {"type": "int", "default": 70, "range": (1, None)},
    "suffix_words": {"type": "int", "default": 12, "range": (0, None)},
    "fan_out_every": {"type": "int", "default": 4, "range": (0, None)},
    "move_every": {"type": "int", "default": 7, "range": (0, None)},
    "repeat_every": {"type": "int", "default": 5, "range": (0, None)},
    "prefix_every": {"type": "int", "default": 3, "range": (0, None)},
    "seed": {"type": "int", "default": 0},
}


def _words(rng, count):
    return " ".join("".join(rng.choice(SYLLABLES) for _i in range(rng.randint(1, 3))) for _j in range(count))


class Step:
    """One workload step: a prompt of a family sent to one engine or to several, one after the other.

    The prompt is the family's ``base`` (preamble and family prefix; the check pads it to a whole number of
    blocks) followed by ``tail`` (empty for a ``prefix`` step).
    """

    __slots__ = ("index", "family", "kind", "base", "tail", "targets")

    def __init__(self, index, family, kind, base, tail, targets):
        self.index = index
        self.family = family
        self.kind = kind
        self.base = base
        self.tail = tail
        self.targets = targets


def unknown_keys(params, name="workload"):
    """The sentence naming keys of ``params`` that are no workload option (None when there are none)."""
    unknown = sorted(set(params) - set(WORKLOAD_SPEC))
    if unknown:
        return "%s has unknown keys %s; known: %s." % (name, ", ".join(unknown), ", ".join(sorted(WORKLOAD_SPEC)))
    return None


# The ``workload`` entry of an option table: a mapping of the options above, unknown keys refused.
WORKLOAD_OPTION = {"type": "dict", "default": {}, "options": WORKLOAD_SPEC, "check": unknown_keys}


def validate(params):
    """``params`` completed with the defaults; raises ``CheckError`` with one sentence on a bad or unknown key."""
    return validate_options({"workload": WORKLOAD_OPTION}, {"workload": params})["workload"]


def build(engines, params=None):
    """The steps of the workload over ``engines`` (names, in order)."""
    if not engines:
        raise ValueError("the workload needs at least one engine")
    values = validate(params)
    rng = random.Random(values["seed"])
    preamble = _words(rng, values["preamble_words"])
    prefixes = ["family %d: %s" % (fam, _words(rng, values["prefix_words"])) for fam in range(values["families"])]
    last = {}
    steps = []
    order = list(range(values["families"]))
    for rnd in range(values["rounds"]):
        rng.shuffle(order)
        for fam in order:
            idx = len(steps) + 1
            home = engines[fam % len(engines)]
            if values["repeat_every"] and idx % values["repeat_every"] == 0 and fam in last:
                kind, tail = "repeat", last[fam]
            elif rnd == 0 or not values["suffix_words"] or (values["prefix_every"] and idx % values["prefix_every"] == 0):
                kind, tail = "prefix", ""
            else:
                kind, tail = "suffix", "\nround %d: %s." % (rnd, _words(rng, rng.randint(1, values["suffix_words"])))
            if values["fan_out_every"] and len(engines) > 1 and idx % values["fan_out_every"] == 0:
                targets = list(engines)
            elif values["move_every"] and len(engines) > 1 and idx % values["move_every"] == 0:
                targets = [engines[(fam + 1) % len(engines)]]
            else:
                targets = [home]
            last[fam] = tail
            steps.append(Step(idx, "family-%d" % fam, kind, "%s\n%s" % (preamble, prefixes[fam]), tail, targets))
    return steps
