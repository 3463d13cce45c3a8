# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""The collection's one module base: an option table in, facts or one sentence out.

``run_module(table, run, requirements=..., facts=...)`` builds ``AnsibleModule`` from the table's argument spec, fails
with ``missing_required_lib`` for an absent library, validates the options with the same table (``common/options.py``:
ranges, shapes, nested tables), calls ``run(params, module)`` and exits with what it returns, ``changed`` false
unless the facts say otherwise; a ``CheckError`` becomes ``fail_json`` with its sentence and its facts (``changed``
false). A module that changes things, or needs more control, builds its module with ``ansible_module`` instead.

Where ansible-core's own validator raises instead of failing (an infinite float given to an ``int`` option
raises ``OverflowError`` in 2.19's ``check_type_int``; a list where a mapping with suboptions is expected raises
``TypeError``), the options are taken as they are and the table's validation names the one that is wrong.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import math

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from .errors import CheckError
from .options import argument_spec, validate

VALIDATOR_CRASHES = (TypeError, AttributeError, ValueError, OverflowError)


def _secrets(spec, params):
    """The values of ``no_log`` options at any depth of ``params`` (nested tables and lists of them included)."""
    found = []
    for name, entry in spec.items():
        value = params.get(name) if isinstance(params, dict) else None
        if value is None:
            continue
        if entry.get("no_log"):
            found.append(str(value))
        items = value if isinstance(value, list) else [value]
        for item in items if entry.get("options") else ():
            found.extend(_secrets(entry["options"], item))
    return found


def _raw_module(spec, module_kwargs):
    """``AnsibleModule`` taking every option as it is, the secrets of nested tables masked as the real spec would."""
    raw = dict((name, {"type": "raw", "no_log": bool(entry.get("no_log"))}) for name, entry in spec.items())
    kwargs = dict((k, v) for k, v in module_kwargs.items() if k in ("supports_check_mode",))
    module = AnsibleModule(argument_spec=raw, **kwargs)
    module.no_log_values.update(_secrets(spec, module.params))
    return module


def _crash_sentence(table, params):
    """One sentence for options ansible-core's validator crashed on."""
    bad = sorted(name for name, value in params.items()
                 if isinstance(value, float) and math.isinf(value) and table.get(name, {}).get("type") == "int")
    if bad:
        return "%s must be a whole number, got an infinite number." % " and ".join(bad)
    try:
        validate(table, params)
    except CheckError as exc:
        return exc.msg
    return "The options could not be validated; check their types against the module documentation."


def ansible_module(table, **module_kwargs):
    """``AnsibleModule`` for an option table, failing with one sentence where ansible-core's validator would raise."""
    spec = argument_spec(table)
    try:
        return AnsibleModule(argument_spec=spec, **module_kwargs)
    except VALIDATOR_CRASHES:
        pass
    # Outside the handler: inside it, ansible-core before 2.19 would attach the validator's traceback.
    module = _raw_module(spec, module_kwargs)
    module.fail_json(msg=_crash_sentence(table, module.params), changed=False)
    return None  # not reached: fail_json exits


def _fail(module, msg, facts):
    """``fail_json`` with the facts, ``changed`` false; a fact named like a fail_json argument cannot shadow it."""
    facts = dict((k, v) for k, v in (facts or {}).items() if k != "msg")
    module.fail_json(msg=msg, **dict(facts, changed=False))


def run_module(table, run, requirements=(), facts=None, warn_facts=(), **module_kwargs):
    """Run one check module: ``run(params, module)`` returns its facts or raises ``CheckError``.

    ``requirements``: ``(library name, present?, import traceback)`` triples, checked before anything runs.
    ``facts``: ``facts(params) -> dict``, what every result carries, failures included (a failure's own facts and a
    success's facts take precedence); it sees the options as ``AnsibleModule`` parsed them, before the table's checks.
    ``warn_facts``: names of facts that, when they hold a sentence, are also a warning of the task, on success and failure.
    """
    module_kwargs.setdefault("supports_check_mode", True)
    module = ansible_module(table, **module_kwargs)
    for name, present, error in requirements:
        if not present:
            module.fail_json(msg=missing_required_lib(name), exception=error)
    base = facts(module.params) if facts else {}

    def warn(found):
        for name in warn_facts:
            if found.get(name):
                module.warn(found[name])
    # The failure is reported outside the handler: inside it, ansible-core before 2.19 would attach the CheckError's
    # traceback to the result (2.19 and later attach it when tracebacks are asked for).
    failure = None
    try:
        params = validate(table, module.params)
        result = run(params, module) or {}
    except CheckError as exc:
        failure = exc
    if failure is not None:
        warn(failure.facts)
        _fail(module, failure.msg, dict(base, **failure.facts))
    warn(result)
    module.exit_json(**dict(dict(base, changed=False), **result))
