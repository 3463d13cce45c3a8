# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""Range checks of numeric options, declared as a table (plain Python, no Ansible).

``RANGES = {"timeout": (0, 3600, "open-low")}`` reads: ``timeout`` must be above 0 and at most 3600.
``range_problems(params, RANGES)`` returns one sentence per option out of range; unset options (None) pass.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import math


def _fmt(number):
    return ("%d" % number) if float(number).is_integer() else ("%g" % number)


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
            continue
        too_low = value <= low if open_low else value < low
        if too_low or (high is not None and value > high):
            if high is None:
                wanted = "above %s" % _fmt(low) if open_low else "at least %s" % _fmt(low)
            elif open_low:
                wanted = "above %s and at most %s" % (_fmt(low), _fmt(high))
            else:
                wanted = "between %s and %s" % (_fmt(low), _fmt(high))
            problems.append("%s must be %s, got %s." % (name, wanted, _fmt(value) if not math.isinf(value) else value))
    return problems
