# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Filters over ``plugins/module_utils/common/k8s_apply.py``: what a refused server-side apply says.

Documented in ``plugins/filter/apply_conflicts.yml`` and ``plugins/filter/apply_refusal.yml``.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

from ansible.errors import AnsibleFilterError

from ansible_collections.inference_cache.substrate.plugins.module_utils.common import k8s_apply


def apply_conflicts(message):
    """``error.msg | inference_cache.substrate.apply_conflicts`` -> [{manager, field, subresource, api_version}], [] when none."""
    return k8s_apply.conflicts(message)


def apply_refusal(results, namespace, groups=None, live=None, field_manager="", replicas_vars=None, externally=""):
    """``results | inference_cache.substrate.apply_refusal(namespace, ...)`` -> the sentence for the first refused object, or ''."""
    if not isinstance(results, list):
        raise AnsibleFilterError("apply_refusal takes the results of a kubernetes.core.k8s loop (a list), got %r." % (results,))
    return k8s_apply.refusal(results, namespace, groups or [], live or [], field_manager, replicas_vars or {}, externally)


class FilterModule(object):
    def filters(self):
        return {"apply_conflicts": apply_conflicts, "apply_refusal": apply_refusal}
