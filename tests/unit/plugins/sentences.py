# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What a failure message must look like: one sentence on one line, never a Python error leaking through."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import re

# Exception class names and interpreter phrases that mean a raw Python error reached the user.
NOISE = re.compile(
    r"Traceback|object has no attribute|object is not (?:subscriptable|iterable|callable)|unsupported operand|"
    r"\b(?:Value|Type|Key|Index|Attribute|ZeroDivision|Overflow|Name|Unicode\w*|JSONDecode|Runtime|OS|IO|Assertion)Error\b|"
    r"\bException\b|\[Errno|<(?:function|bound method|built-in)"
)


def assert_one_sentence(message):
    """Fail the test unless ``message`` is one non-empty line with no Python error text; return the message."""
    assert isinstance(message, str) and message.strip(), "no message: %r" % (message,)
    assert "\n" not in message and "\r" not in message, "more than one line: %r" % (message,)
    found = NOISE.search(message)
    assert not found, "Python error text %r in: %s" % (found.group(0), message)
    return message
