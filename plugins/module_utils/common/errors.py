# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""The collection's one error type (pure Python, no Ansible).

Every check, planner and option table raises ``CheckError(msg, facts)``: ``msg`` is one sentence that says what is
wrong and what to do; ``facts`` are what the module returns beside it (the same keys as on success, as far as they
are known). ``common/module.py`` turns it into ``fail_json``; the CLI tools print ``msg`` and exit non-zero.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name


class CheckError(Exception):
    """A check failed, or its input is wrong: one sentence and the facts to return with it."""

    def __init__(self, msg, facts=None):
        super(CheckError, self).__init__(msg)
        self.msg = msg
        self.facts = dict(facts or {})
