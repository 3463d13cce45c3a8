# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""Option tables: one declaration per check gives both its argument spec and its plain-Python validation (no Ansible).

A table maps each option name to an ``argument_spec`` entry (``type``, ``default``, ``required``, ``choices``,
``no_log``, ``elements``, ``options``) plus the keys ansible-core does not know:

* ``range``: ``(low, high)`` or ``(low, high, "open-low")``; ``high`` None is unbounded. ``(0, 3600, "open-low")``
  reads: above 0 and at most 3600;
* ``shape``: ``(regex, "a ZMQ endpoint such as tcp://HOST:PORT")``: a string must match the regex, else
  "<name> must be <what>, got <value>.";
* ``must_be``: the words after "must be" in the sentence for a value of the wrong type or outside its range, where
  the derived ones would not do: ``"a whole number between 1 and 4096"`` gives
  "max_gpus must be a whole number between 1 and 4096, got 0.";
* ``check``: a function ``(value, name) -> sentence or None`` for what a table cannot say.

``argument_spec(table)`` strips those keys (for ``AnsibleModule``); ``validate(table, params)`` applies the defaults
(copies of them) and checks every option (types, choices, ranges, shapes, nested tables, list elements), raising
``CheckError`` with one sentence on the first problem, so the modules, the CLI tools and the tests share one
validation. ``range_problems(params, ranges)`` is the range rule alone, for callers that collect sentences; a range's
``low`` may be None too (no lower bound).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import copy
import math
import re

from .errors import CheckError

EXTRA_KEYS = ("range", "shape", "check", "must_be")
KINDS = {
    "str": "a string", "path": "a path", "int": "an integer", "float": "a number", "bool": "true or false",
    "dict": "a mapping", "list": "a list",
}


def _fmt(number):
    return ("%d" % number) if float(number).is_integer() else ("%g" % number)


def _bounds(low, high, open_low):
    """The words of a range after "must be": "between 1 and 10", "above 0", "at least 0", "at most 5"."""
    if low is None:
        return "at most %s" % _fmt(high)
    if high is None:
        return "above %s" % _fmt(low) if open_low else "at least %s" % _fmt(low)
    if open_low:
        return "above %s and at most %s" % (_fmt(low), _fmt(high))
    return "between %s and %s" % (_fmt(low), _fmt(high))


def _outside(value, low, high, open_low):
    if low is not None and (value <= low if open_low else value < low):
        return True
    return high is not None and value > high


def range_problems(params, ranges):
    """Sentences naming each option of ``ranges`` whose value in ``params`` lies outside its range."""
    problems = []
    for name in sorted(ranges):
        low, high = ranges[name][0], ranges[name][1]
        open_low = len(ranges[name]) > 2 and ranges[name][2] == "open-low"
        value = params.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            problems.append("%s must be a number, got %r." % (name, value))
        elif _outside(value, low, high, open_low):
            problems.append("%s must be %s, got %s." % (name, _bounds(low, high, open_low), _fmt(value) if not math.isinf(value) else value))
    return problems


def argument_spec(table):
    """The ``argument_spec`` of ``AnsibleModule`` for an option table (its own keys removed, nested tables too).

    A new spec each call, defaults copied: ansible-core fills a dict option's default in place with its suboptions, which
    would otherwise change the table for the next run in the same process.
    """
    spec = {}
    for name, entry in table.items():
        entry = copy.deepcopy(dict((k, v) for k, v in entry.items() if k not in EXTRA_KEYS))
        if "options" in entry:
            entry["options"] = argument_spec(entry["options"])
        spec[name] = entry
    return spec


def _type_ok(kind, value):
    if kind in ("str", "path"):
        return isinstance(value, str)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "dict":
        return isinstance(value, dict)
    if kind == "list":
        return isinstance(value, (list, tuple))
    return True


def _choice_problem(entry, name, value):
    choices = entry.get("choices")
    if choices is None:
        return None
    for item in (value if entry.get("type") == "list" else [value]):
        if item not in choices:
            return "%s must be one of %s, got %r." % (name, ", ".join(str(c) for c in choices), item)
    return None


def _problem(entry, name, value):
    """The first thing wrong with one set value, as a sentence (None when it is right); nested tables not included."""
    kind = entry.get("type", "str")
    must_be = entry.get("must_be")
    if not _type_ok(kind, value):
        return "%s must be %s, got %r." % (name, must_be or KINDS.get(kind, kind), value)
    problem = _choice_problem(entry, name, value)
    if problem:
        return problem
    if "range" in entry:
        problems = range_problems({name: value}, {name: entry["range"]})
        if problems:
            return "%s must be %s, got %r." % (name, must_be, value) if must_be else problems[0]
    if "shape" in entry:
        pattern, what = entry["shape"]
        if not isinstance(value, str) or not re.match(pattern, value):
            return "%s must be %s, got %r." % (name, what, value)
    if "check" in entry:
        return entry["check"](value, name)
    return None


def _nested(entry, label, value):
    """``value`` of a dict or list option with its nested table (or its list elements) checked."""
    sub = entry.get("options")
    if sub and entry.get("type") == "dict":
        return validate(sub, value, label + ".")
    if sub and entry.get("type") == "list":
        return [validate(sub, item, "%s[%d]." % (label, pos)) for pos, item in enumerate(value)]
    if entry.get("type") == "list" and entry.get("elements"):
        element = {"type": entry["elements"]}
        for pos, item in enumerate(value):
            problem = _problem(element, "%s[%d]" % (label, pos), item)
            if problem:
                raise CheckError(problem)
    return value


def validate(table, params, where=""):
    """``params`` with the table's defaults applied, every option checked; raises ``CheckError`` on the first problem.

    ``where`` prefixes option names in sentences (``trigger.`` for a nested table, ``engines[0].`` for a list item).
    Unknown options are kept as they are (``AnsibleModule`` refuses them where it runs). Options are checked in the
    order of their names, so the first problem is the same on every run.
    """
    if not isinstance(params, dict):
        raise CheckError("%s must be a mapping, got %r." % (where.rstrip(".") or "The options", params))
    out = dict(params)
    for name in sorted(table):
        entry = table[name]
        label = where + name
        value = out.get(name)
        if value is None:
            if entry.get("required"):
                raise CheckError("%s is required." % label)
            value = out[name] = copy.deepcopy(entry.get("default"))
            if value is None:
                continue
        problem = _problem(entry, label, value)
        if problem:
            raise CheckError(problem)
        out[name] = _nested(entry, label, value)
    return out
