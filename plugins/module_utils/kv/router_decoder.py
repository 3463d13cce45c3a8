# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""Would the llm-d router's KV-event decoder take this batch? Facts of the pinned version (pure Python, no Ansible).

The EPP of llm-d-router v0.9.0 decodes KV events with the vLLM adapter of llm-d-kv-cache v0.9.0 (its go.mod), whatever
``engineType`` says (``preciseprefixcache/producer.go``). That decoder reads the outer batch as a positional array
``[ts, events, data_parallel_rank?]``; each event as a positional array, or as a map tagged under ``type`` whose fields
it reads by name (absent = nil) in the order below; trailing positions may be absent. One event it refuses fails the
whole batch, which the index then never sees. Read at ``llm-d/llm-d-kv-cache@53a0e08:pkg/kvevents/engineadapter/
vllm_adapter.go`` and ``common.go`` (PR #661, merged; the module is the one of ``llm-d/llm-d-router@v0.9.0:go.sum``,
``h1:6hLLJGrP91A28LYH2Gd5i81e5sreSSHizdlSnB9NXqc=``, whose map decoding ``llm-d/llm-d-inference-sim@079b792`` tests).
tests/integration/k8s_conformance.yml (``kv_cache_vllm_decoder``) holds the same facts with their citations; a test
keeps the two equal. No Go code was copied.

``problems(batch, version)`` takes a batch decoded as plain msgpack (lists, dicts, ints, bytes, str) and returns one
phrase per thing the decoder would refuse; values are named by type only, never printed.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

from ..common.wiring import ROUTER_VERSION

# The llm-d-kv-cache release whose decoder the router's go.mod requires at ROUTER_VERSION (a version of another module,
# the same number by the llm-d release train).
KV_CACHE_VERSION = "v0.9.0"


def _field(name, kind, optional=False):
    return {"name": name, "kind": kind, "optional": optional}


DECODERS = {
    ROUTER_VERSION: {
        "decoder": "llm-d-kv-cache %s vLLM adapter" % KV_CACHE_VERSION,
        "batch": [_field("ts", "number"), _field("events", "array"), _field("data_parallel_rank", "int_or_nil", True)],
        "tag_key": "type",
        "events": {
            "BlockStored": [
                _field("block_hashes", "hashes"), _field("parent_block_hash", "hash_or_nil"), _field("token_ids", "ints"),
                _field("block_size", "int"), _field("lora_id", "int_or_nil", True), _field("medium", "str_or_nil", True),
                _field("lora_name", "str_or_nil", True), _field("extra_keys", "extra_keys_or_nil", True),
                _field("group_idx", "group_or_nil", True), _field("kv_cache_spec_kind", "str_or_nil", True),
                _field("kv_cache_spec_sliding_window", "int_or_nil", True),
            ],
            "BlockRemoved": [_field("block_hashes", "hashes"), _field("medium", "str_or_nil", True),
                             _field("group_idx", "group_or_nil", True)],
            "AllBlocksCleared": [],
        },
    },
}
VERSIONS = tuple(sorted(DECODERS))


def _int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _hash(value):
    return (_int(value) and -(2 ** 63) <= value < 2 ** 64) or (isinstance(value, bytes) and len(value) > 0)


# kind -> (test, phrase)
KINDS = {
    "number": (lambda v: _int(v) or isinstance(v, float), "a number"),
    "array": (lambda v: isinstance(v, list), "an array"),
    "int": (_int, "an integer"),
    "hashes": (lambda v: isinstance(v, list) and all(_hash(h) for h in v), "an array of 64-bit integers or non-empty bytes"),
    "ints": (lambda v: isinstance(v, list) and all(_int(t) for t in v), "an array of integers"),
    "extra_keys": (lambda v: isinstance(v, list) and all(k is None or isinstance(k, list) for k in v),
                   "an array with one array (or nil) per block"),
    "group": (lambda v: _int(v) and v >= 0, "a non-negative integer"),
    "hash": (_hash, "a 64-bit integer or non-empty bytes"),
    "str": (lambda v: isinstance(v, str), "a string"),
}


def _fits(kind, value):
    if kind.endswith("_or_nil"):
        return value is None or KINDS[kind[:-len("_or_nil")]][0](value)
    return KINDS[kind][0](value)


def _phrase(kind):
    if kind.endswith("_or_nil"):
        return KINDS[kind[:-len("_or_nil")]][1] + " or nil"
    return KINDS[kind][1]


def _type_name(value):
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, dict):
        return "a map"
    if isinstance(value, bytes):
        return "bytes"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (int, float)):
        return "a number"
    return "a %s" % type(value).__name__


def _positions(fields, values, where):
    found = []
    for index, field in enumerate(fields):
        if index >= len(values):
            if not field["optional"]:
                found.append("%s has no %s" % (where, field["name"]))
            continue
        if not _fits(field["kind"], values[index]):
            found.append("%s.%s is %s, not %s" % (where, field["name"], _type_name(values[index]), _phrase(field["kind"])))
    return found


def event_problems(event, version=ROUTER_VERSION, where="event"):
    """Phrases of what the decoder would refuse in one event (a list or a dict)."""
    facts = DECODERS[version]
    tag_key, known = facts["tag_key"], facts["events"]
    if isinstance(event, dict):
        tag = event.get(tag_key)
        if not isinstance(tag, str):
            return ["%s is a map without a string %r tag" % (where, tag_key)]
        if tag not in known:
            return ["%s has the type %r, which the decoder does not know" % (where, tag)]
        return _positions(known[tag], [event.get(f["name"]) for f in known[tag]], "%s %s" % (where, tag))
    if isinstance(event, list):
        if not event or not isinstance(event[0], str):
            return ["%s is an array without a string tag first" % where]
        if event[0] not in known:
            return ["%s has the type %r, which the decoder does not know" % (where, event[0])]
        return _positions(known[event[0]], event[1:], "%s %s" % (where, event[0]))
    return ["%s is %s, neither an array nor a map" % (where, _type_name(event))]


def problems(batch, version=ROUTER_VERSION):
    """Phrases of what the decoder would refuse in one batch decoded as plain msgpack; [] when it takes every event."""
    facts = DECODERS[version]
    if not isinstance(batch, list):
        return ["the batch is %s, not a positional array" % _type_name(batch)]
    found = _positions(facts["batch"], batch, "the batch")
    if found:
        return found
    for index, event in enumerate(batch[1]):
        found.extend(event_problems(event, version, "event %d" % index))
    return found


def tags(batch, version=ROUTER_VERSION):
    """The event types of a decoded batch, in order (None for an event without one)."""
    key = DECODERS[version]["tag_key"]
    return [ev.get(key) if isinstance(ev, dict) else (ev[0] if isinstance(ev, list) and ev else None) for ev in batch[1]]
