# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The apply_conflicts filter (plugins/filter/k8s_apply.py): who owns the fields a refused server-side apply wanted."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json

import pytest

from ansible_collections.inference_cache.substrate.plugins.filter.k8s_apply import FilterModule, apply_conflicts


def _status(causes, message="Apply failed with 1 conflict: conflict with \"hpa-test\" using apps/v1: .spec.replicas"):
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": "Conflict",
            "details": {"causes": causes}, "code": 409}


def _as_kubernetes_core_says(status):
    """kubernetes.core.k8s: "Failed to apply object: {0}".format(ApiException.body), the body being bytes."""
    return "Failed to apply object: {0}".format(json.dumps(status).encode("utf-8"))


SCALE = {"reason": "FieldManagerConflict", "message": "conflict with \"hpa-test\" with subresource \"scale\" using apps/v1",
         "field": ".spec.replicas"}
APPLY = {"reason": "FieldManagerConflict", "message": "conflict with \"argocd\"", "field": ".spec.template.spec.containers[name=\"engine\"].image"}


@pytest.mark.parametrize("causes, expected", [
    ([SCALE], [{"manager": "hpa-test", "field": ".spec.replicas", "subresource": "scale", "api_version": "apps/v1"}]),
    ([SCALE, APPLY], [{"manager": "hpa-test", "field": ".spec.replicas", "subresource": "scale", "api_version": "apps/v1"},
                      {"manager": "argocd", "field": ".spec.template.spec.containers[name=\"engine\"].image", "subresource": "",
                       "api_version": ""}]),
    ([{"reason": "FieldManagerConflict", "message": "conflict with \"kubectl\" using apps/v1 at 2026-12-03T08:00:00Z",
       "field": ".spec.replicas"}], [{"manager": "kubectl", "field": ".spec.replicas", "subresource": "", "api_version": "apps/v1"}]),
], ids=["scale-subresource", "two-managers", "update-with-time"])
def test_conflicts_come_from_the_status_causes(causes, expected):
    assert apply_conflicts(_as_kubernetes_core_says(_status(causes))) == expected
    assert apply_conflicts({"msg": _as_kubernetes_core_says(_status(causes)), "reason": "Conflict"}) == expected, "the error mapping"


def test_a_conflict_without_causes_is_read_from_its_message():
    assert apply_conflicts(_as_kubernetes_core_says(_status([]))) == [
        {"manager": "hpa-test", "field": ".spec.replicas", "subresource": "", "api_version": ""}]


@pytest.mark.parametrize("message", [
    _as_kubernetes_core_says({"kind": "Status", "reason": "Invalid", "message": "Deployment.apps \"x\" is invalid", "code": 422}),
    "Failed to apply object: (403) Reason: Forbidden",
    "Failed to apply object: b'not json'",
    "",
    None,
])
def test_anything_else_is_no_conflict(message):
    assert apply_conflicts(message) == []


def test_the_filter_is_registered():
    assert FilterModule().filters() == {"apply_conflicts": apply_conflicts}
