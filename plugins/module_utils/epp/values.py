# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""How the EPP reads the values of an EndpointPickerConfig, for the rules (:mod:`.rules`) and the walk (:mod:`.config`).

Go's ``encoding/json`` matches keys case-insensitively; a plugin name or reference is a non-empty string; a mapping or
list of the wrong type reads as empty. Plain Python, no Ansible import; no function raises on any input.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name


def is_mapping(value):
    return isinstance(value, dict)


def param(params, name):
    """A parameter as the EPP reads it: Go's encoding/json matches keys case-insensitively."""
    if not is_mapping(params):
        return None
    if name in params:
        return params[name]
    for key, value in params.items():
        if isinstance(key, str) and key.lower() == name.lower():
            return value
    return None


def as_mapping(value):
    return value if is_mapping(value) else {}


def as_list(value):
    return value if isinstance(value, list) else []


def is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_named(value):
    """A reference or name as the EPP uses it: a non-empty string."""
    return isinstance(value, str) and bool(value)
