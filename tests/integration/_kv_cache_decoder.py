# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Would the EPP's vLLM event decoder (llm-d-kv-cache v0.9.0) take this payload? Held against the facts only.

The facts (``kv_cache_vllm_decoder`` in tests/integration/k8s_conformance.yml) say what that decoder reads: the outer
batch as a positional array, each event as a positional array or a map tagged under ``type`` whose fields it reads by
name, and the kind of value each position must hold. ``problems`` returns one sentence per thing it would refuse;
an empty list means every event of the batch would be indexed. No Go code runs here and none was copied.
"""

from __future__ import absolute_import, division, print_function

import msgspec


def _int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _hash(value):
    return (_int(value) and -(2 ** 63) <= value < 2 ** 64) or (isinstance(value, bytes) and len(value) > 0)


KINDS = {
    "number": lambda v: _int(v) or isinstance(v, float),
    "array": lambda v: isinstance(v, list),
    "int": _int,
    "hashes": lambda v: isinstance(v, list) and all(_hash(h) for h in v),
    "ints": lambda v: isinstance(v, list) and all(_int(t) for t in v),
    "extra_keys": lambda v: isinstance(v, list) and all(k is None or isinstance(k, list) for k in v),
    "group": lambda v: _int(v) and v >= 0,
    "hash": _hash,
    "str": lambda v: isinstance(v, str),
}


def _fits(kind, value):
    if kind.endswith("_or_nil"):
        return value is None or KINDS[kind[:-len("_or_nil")]](value)
    return KINDS[kind](value)


def _positions(fields, values, where):
    """Problems of positional values against the ordered field list (trailing optional fields may be absent)."""
    problems = []
    for index, field in enumerate(fields):
        if index >= len(values):
            if not field.get("optional"):
                problems.append("%s has no %s (position %d)" % (where, field["name"], index))
            continue
        if not _fits(field["kind"], values[index]):
            problems.append("%s: %s is %r, not %s" % (where, field["name"], values[index], field["kind"]))
    return problems


def event_problems(event, facts, where="event"):
    """Problems of one decoded event (list or dict)."""
    tag_key, known = facts["tag_key"], facts["events"]
    if isinstance(event, dict):
        tag = event.get(tag_key)
        if not isinstance(tag, str):
            return ["%s is a map without a string %r tag" % (where, tag_key)]
        if tag not in known:
            return ["%s has the unknown tag %r" % (where, tag)]
        # Read by name: an absent field is nil, so a required field must be present and of its kind.
        values = [event.get(field["name"]) for field in known[tag]]
        return _positions(known[tag], values, "%s %s" % (where, tag))
    if isinstance(event, list):
        if not event or not isinstance(event[0], str):
            return ["%s is an array without a string tag first" % where]
        if event[0] not in known:
            return ["%s has the unknown tag %r" % (where, event[0])]
        return _positions(known[event[0]], event[1:], "%s %s" % (where, event[0]))
    return ["%s is neither an array nor a map" % where]


def problems(payload, facts):
    """Problems of one ZMQ payload (the third frame) for the decoder; [] when every event would be indexed."""
    try:
        batch = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        return ["the payload is not msgpack: %s" % exc]
    if not isinstance(batch, list):
        return ["the batch is a %s, not a positional array" % type(batch).__name__]
    found = _positions(facts["batch"], batch, "the batch")
    if found:
        return found
    for index, event in enumerate(batch[1]):
        found.extend(event_problems(event, facts, "event %d" % index))
    return found


def tags(payload, facts):
    """The event tags of one payload, in order (for tests that must see a kind of event)."""
    batch = msgspec.msgpack.decode(payload)
    return [ev.get(facts["tag_key"]) if isinstance(ev, dict) else ev[0] for ev in batch[1]]
