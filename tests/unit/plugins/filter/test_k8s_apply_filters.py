# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""plugins/filter/k8s_apply.py: apply_conflicts and apply_refusal say what common/k8s_apply.py says."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import pytest

from ansible_collections.inference_cache.substrate.plugins.filter import k8s_apply as F
from ansible_collections.inference_cache.substrate.plugins.module_utils.common import k8s_apply

MESSAGE = 'Failed to apply object: b\'{"kind": "Status", "reason": "Conflict", "message": "conflict with \\\\"hpa\\\\" using apps/v1: .spec.replicas"}\''


def test_the_filters_are_the_functions_of_common_k8s_apply():
    assert F.apply_conflicts(MESSAGE) == k8s_apply.conflicts(MESSAGE) == [
        {"manager": "hpa", "field": ".spec.replicas", "subresource": "", "api_version": ""}]
    results = [{"error": {"msg": MESSAGE}, "item": {"kind": "Deployment", "metadata": {"name": "d"}}}]
    assert F.apply_refusal(results, "ns") == k8s_apply.refusal(results, "ns") != ""
    assert F.apply_refusal([], "ns") == ""


def test_apply_refusal_takes_a_list_of_results():
    with pytest.raises(Exception, match=r"^apply_refusal takes the results of a kubernetes.core.k8s loop \(a list\), got "):
        F.apply_refusal({"results": []}, "ns")


def test_the_filters_are_registered():
    assert F.FilterModule().filters() == {"apply_conflicts": F.apply_conflicts, "apply_refusal": F.apply_refusal}
