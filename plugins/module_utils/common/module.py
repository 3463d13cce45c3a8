# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""The collection's one module base: an option table in, facts or one sentence out.

``run_module(table, run, requirements=...)`` builds ``AnsibleModule`` from the table's argument spec, fails with
``missing_required_lib`` for an absent library, validates the options with the same table (``common/options.py``:
ranges, shapes, nested tables), calls ``run(params, module)`` and exits with what it returns, ``changed`` false
unless the facts say otherwise; a ``CheckError`` becomes ``fail_json`` with its sentence and its facts.

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


def _raw_module(spec, module_kwargs):
    raw = dict((name, {"type": "raw", "no_log": bool(entry.get("no_log"))}) for name, entry in spec.items())
    kwargs = dict((k, v) for k, v in module_kwargs.items() if k in ("supports_check_mode",))
    return AnsibleModule(argument_spec=raw, **kwargs)


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
        module = _raw_module(spec, module_kwargs)
        module.fail_json(msg=_crash_sentence(table, module.params), changed=False)
    return None  # not reached: fail_json exits


def run_module(table, run, requirements=(), **module_kwargs):
    """Run one check module: ``run(params, module)`` returns its facts or raises ``CheckError``.

    ``requirements``: ``(library name, present?, import traceback)`` triples, checked before anything runs.
    """
    module_kwargs.setdefault("supports_check_mode", True)
    module = ansible_module(table, **module_kwargs)
    for name, present, error in requirements:
        if not present:
            module.fail_json(msg=missing_required_lib(name), exception=error)
    try:
        params = validate(table, module.params)
        facts = run(params, module)
    except CheckError as exc:
        module.fail_json(msg=exc.msg, **dict(exc.facts, changed=False))
    module.exit_json(**dict({"changed": False}, **facts))
