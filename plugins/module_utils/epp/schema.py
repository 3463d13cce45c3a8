# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""A small declarative shape checker that decodes the way the llm-d router (Go) decodes.

Plain Python without any Ansible import. A schema is a tree of plain dicts built with the
constructors below (:func:`obj`, :func:`list_of`, :func:`map_of`, :data:`STR`, :func:`integer`, ...).
:func:`validate` walks a value against a schema and returns one finding per mismatch; it never raises
on any input (any mix of dict, list, str, int, float, bool and None).

Go's ``encoding/json`` rules it follows (the EPP decodes plugin ``parameters`` with a strict
``json.Decoder``, ``DisallowUnknownFields``):

- a JSON ``null`` leaves a field at its default, whatever the field's type;
- an int field takes only integral numbers (``1.5``, ``"1"`` and ``true`` are errors);
- a float field takes any number, a string field only strings, a bool field only booleans;
- a ``time.Duration`` field is a number of nanoseconds, not a string such as ``"30s"``;
- an unknown key is an error; plugin parameters match keys case-insensitively (Go's
  ``encoding/json``), the top level of the EndpointPickerConfig case-sensitively (the Kubernetes
  strict serializer).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import math
import re

# Go's time.ParseDuration: an optional sign, then one or more <number><unit>; "0" alone is also valid.
_GO_DURATION = re.compile(r"^[-+]?(?:0|(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|\u00b5s|\u03bcs|ms|s|m|h))+)$")
# Kubernetes resource.Quantity (integers, decimals, exponents, binary and decimal SI suffixes).
_QUANTITY = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")

STR = {"t": "str"}
BOOL = {"t": "bool"}
ANY = {"t": "any"}
NANOSECONDS = {"t": "ns"}
GO_DURATION = {"t": "duration"}
QUANTITY = {"t": "quantity"}

EXPECTED = {
    "str": "a string", "bool": "a boolean (true or false)", "int": "an integer", "float": "a number",
    "ns": "an integer number of nanoseconds (Go time.Duration)", "duration": "a Go duration string such as \"30s\"",
    "quantity": "a Kubernetes quantity such as \"100\" or \"1Gi\"", "list": "a list", "map": "a mapping",
    "obj": "a mapping", "enum": "one of the listed strings",
}


def integer(minimum=None, maximum=None):
    """An int field, optionally range-checked (the EPP factory refuses values outside the range)."""
    return {"t": "int", "min": minimum, "max": maximum}


def number(minimum=None, maximum=None, above=None):
    """A float field, optionally range-checked: ``minimum``/``maximum`` inclusive, ``above`` exclusive."""
    return {"t": "float", "min": minimum, "max": maximum, "above": above}


def enum(*values):
    """A string field with a closed set of values."""
    return {"t": "enum", "values": tuple(values)}


def list_of(item):
    return {"t": "list", "of": item}


def map_of(item):
    """A mapping with free keys (Go ``map[string]T``)."""
    return {"t": "map", "of": item}


def obj(fields, source=None, deprecated=None):
    """A Go struct: ``fields`` maps each JSON key to its schema; ``source`` is ``repo@ref:path``.

    ``deprecated`` maps a field name to the sentence tail that says what replaces it.
    """
    return {"t": "obj", "fields": dict(fields), "source": source, "deprecated": dict(deprecated or {})}


def type_name(value):
    """The JSON-ish name of a Python value, for sentences."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number" if math.isfinite(value) else "%s (not a JSON number)" % value
    if isinstance(value, str):
        return "a string"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return "a %s" % type(value).__name__


def show(value, limit=60):
    """A short one-line rendering of a value for a sentence."""
    text = repr(value)
    if len(text) > limit:
        text = text[:limit - 3] + "..."
    return text


_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_$@/:+-]{1,60}$")


def join_path(path, key):
    """``path.key`` (or ``path[3]`` for an index); a key that is empty, long or has spaces or dots is shown quoted."""
    key = str(key) if isinstance(key, str) else show(key)
    if key.startswith("[") and key.endswith("]") and key[1:-1].isdigit():
        return (path or "") + key
    if not _PLAIN_KEY.match(key):
        key = show(key, 40)
    return key if not path else "%s.%s" % (path, key)


class Finding(object):
    """One mismatch: ``kind`` is ``unknown``, ``type``, ``range``, ``value``, ``case`` or ``deprecated``."""

    __slots__ = ("kind", "path", "message")

    def __init__(self, kind, path, message):
        self.kind, self.path, self.message = kind, path, message

    def __repr__(self):
        return "Finding(%r, %r, %r)" % (self.kind, self.path, self.message)


def _is_int(value):
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and math.isfinite(value) and value == int(value)


def _is_number(value):
    """A JSON number: NaN and the infinities are not JSON and the EPP never sees them."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def _range(node, value, path, out):
    low, high, above = node.get("min"), node.get("max"), node.get("above")
    if above is not None and value <= above:
        out.append(Finding("range", path, "must be greater than %s (got %s)" % (above, show(value))))
    elif low is not None and value < low:
        out.append(Finding("range", path, "must be at least %s (got %s)" % (low, show(value))))
    elif high is not None and value > high:
        out.append(Finding("range", path, "must be at most %s (got %s)" % (high, show(value))))


def _type_finding(value, node, path, out, expected=None, shown=None):
    out.append(Finding("type", path, "is %s but must be %s" % (shown or type_name(value), EXPECTED[expected or node["t"]])))


def _struct(value, node, path, case_insensitive, out):
    if not isinstance(value, dict):
        _type_finding(value, node, path, out)
        return
    fields = node["fields"]
    folded = dict((name.lower(), name) for name in fields)
    for key in value:
        sub = join_path(path, key)
        if not isinstance(key, str):
            out.append(Finding("type", sub, "has a key that is %s; keys must be strings" % type_name(key)))
            continue
        name = key if key in fields else (folded.get(key.lower()) if case_insensitive else None)
        if name is None:
            out.append(Finding("unknown", sub, "is not a known field"))
            continue
        if name != key:
            out.append(Finding("case", sub, "is accepted as %s only because Go matches JSON keys case-insensitively" % name))
        if name in node["deprecated"]:
            out.append(Finding("deprecated", sub, node["deprecated"][name]))
        validate(value[key], fields[name], join_path(path, name), case_insensitive, out)


def _list(value, node, path, case_insensitive, out):
    if not isinstance(value, list):
        _type_finding(value, node, path, out)
        return
    for index, item in enumerate(value):
        validate(item, node["of"], join_path(path, "[%d]" % index), case_insensitive, out)


def _map(value, node, path, case_insensitive, out):
    if not isinstance(value, dict):
        _type_finding(value, node, path, out)
        return
    for key, item in value.items():
        if not isinstance(key, str):
            out.append(Finding("type", join_path(path, show(key)), "has a key that is %s; keys must be strings" % type_name(key)))
            continue
        validate(item, node["of"], join_path(path, key), case_insensitive, out)


def _string(value, node, path, case_insensitive, out):
    del case_insensitive
    kind = node["t"]
    if not isinstance(value, str):
        _type_finding(value, node, path, out, expected="str")
    elif kind == "enum" and value not in node["values"]:
        out.append(Finding("value", path, "is %s but must be one of %s" % (show(value), ", ".join(node["values"]))))
    elif kind == "duration" and value and not _GO_DURATION.match(value):
        out.append(Finding("value", path, "is %s but must be %s" % (show(value), EXPECTED["duration"])))


def _bool(value, node, path, case_insensitive, out):
    del case_insensitive
    if not isinstance(value, bool):
        _type_finding(value, node, path, out)


def _integer(value, node, path, case_insensitive, out):
    del case_insensitive
    if not _is_int(value):
        _type_finding(value, node, path, out, shown=show(value) if _is_number(value) else None)
    elif node["t"] == "int":
        _range(node, value, path, out)


def _number(value, node, path, case_insensitive, out):
    del case_insensitive
    if not _is_number(value):
        _type_finding(value, node, path, out)
    else:
        _range(node, value, path, out)


def _quantity(value, node, path, case_insensitive, out):
    del case_insensitive
    if not _is_number(value) and (not isinstance(value, str) or not _QUANTITY.match(value)):
        _type_finding(value, node, path, out, shown=show(value))


# How each kind of schema node checks a value (every function appends its findings to ``out``).
_CHECKS = {
    "obj": _struct, "list": _list, "map": _map, "str": _string, "enum": _string, "duration": _string, "bool": _bool,
    "int": _integer, "ns": _integer, "float": _number, "quantity": _quantity,
}


def validate(value, node, path="", case_insensitive=False, out=None):
    """Check ``value`` against ``node``; return the list of :class:`Finding` (empty when it fits)."""
    out = [] if out is None else out
    kind = node["t"]
    if value is None or kind == "any":
        return out  # Go leaves the field at its default on null
    if kind not in _CHECKS:
        raise ValueError("unknown schema node %r" % (kind,))  # a bug in the table, not bad input
    _CHECKS[kind](value, node, path, case_insensitive, out)
    return out


def fields_at(node, path=()):
    """The field names of the struct at ``path`` (a sequence of field names; lists and maps are stepped into)."""
    for name in path:
        while node["t"] in ("list", "map"):
            node = node["of"]
        node = node["fields"][name]
    while node["t"] in ("list", "map"):
        node = node["of"]
    if node["t"] != "obj":
        raise KeyError("%s is not a struct" % ".".join(path))
    return sorted(node["fields"])
