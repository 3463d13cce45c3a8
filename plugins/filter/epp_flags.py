# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The filter that hands the router role what the pinned EPPs take on their command line (``plugins/module_utils/epp/flags.py``)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

from ansible.errors import AnsibleFilterError

from ansible_collections.inference_cache.substrate.plugins.module_utils.epp import flags


def epp_flag_refusal(given, impl, owned=None, what="the flags given"):
    """``flags | inference_cache.substrate.epp_flag_refusal(impl, owned, what)`` -> the sentence refusing them, or ''."""
    if impl not in flags.EPPS:
        raise AnsibleFilterError("epp_flag_refusal knows the EPPs %s, not %r." % (", ".join(sorted(flags.EPPS)), impl))
    if not isinstance(given, (dict, list)):
        raise AnsibleFilterError("epp_flag_refusal takes the flags given (a mapping of flag to value, or a list of names), got %r."
                                 % (given,))
    return flags.flag_refusal(impl, list(given), owned or {}, what)


class FilterModule(object):
    def filters(self):
        return {"epp_flag_refusal": epp_flag_refusal}
