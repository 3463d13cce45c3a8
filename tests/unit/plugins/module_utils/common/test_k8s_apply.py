# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""common/k8s_apply.py: who owns the fields a refused server-side apply wanted, and the one sentence a role stops with."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.k8s_apply import conflicts, refusal


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
    assert conflicts(_as_kubernetes_core_says(_status(causes))) == expected
    assert conflicts({"msg": _as_kubernetes_core_says(_status(causes)), "reason": "Conflict"}) == expected, "the error mapping"


def test_a_conflict_without_causes_is_read_from_its_message():
    assert conflicts(_as_kubernetes_core_says(_status([]))) == [
        {"manager": "hpa-test", "field": ".spec.replicas", "subresource": "", "api_version": ""}]


@pytest.mark.parametrize("message", [
    _as_kubernetes_core_says({"kind": "Status", "reason": "Invalid", "message": "Deployment.apps \"x\" is invalid", "code": 422}),
    "Failed to apply object: (403) Reason: Forbidden",
    "Failed to apply object: b'not json'",
    "",
    None,
])
def test_anything_else_is_no_conflict(message):
    assert conflicts(message) == []


GROUPS = [{"name": "ms-prefill", "role": "prefill", "replicas": 1}, {"name": "ms-decode", "role": "decode", "replicas": 2}]
VARS = {"": "model_server_replicas", "prefill": "model_server_prefill_replicas", "decode": "model_server_decode_replicas"}


def _refused(causes, item):
    return {"error": {"msg": _as_kubernetes_core_says(_status(causes)), "reason": "Conflict"}, "item": item}


def _say(results, live=()):
    return refusal(results, "ns", GROUPS, list(live), "inference-cache-substrate", VARS, "model_server_replicas_managed_externally")


def test_nothing_refused_is_no_sentence():
    assert _say([]) == _say([{"changed": True, "item": {"kind": "Service"}}, {"skipped": True}]) == ""


def test_the_replicas_another_manager_holds_name_it_its_count_and_the_variables():
    """A hand-over result: its item is the read of the Deployment, whose item is the group."""
    read = {"item": {"name": "ms-decode"}, "resources": [{"spec": {"replicas": 5}}]}
    assert _say([{"changed": False}, _refused([SCALE], read)], live=[read]) == (
        'Deployment ns/ms-decode: .spec.replicas belongs to field manager "hpa-test" (such as an autoscaler or kubectl scale; it set '
        "5), and server-side apply does not take it back for model_server_decode_replicas=2; set "
        "model_server_replicas_managed_externally=true to leave the replicas to it, or model_server_decode_replicas=5 to agree with it.")
    unknown = refusal([_refused([SCALE], {"kind": "Deployment", "metadata": {"name": "other"}})], "ns")
    assert "it set ?" in unknown and "for replicas=?" in unknown


def test_other_fields_name_their_manager_and_how_to_release_them():
    said = _say([_refused([SCALE, APPLY], {"kind": "Deployment", "metadata": {"name": "ms-prefill"}})])
    assert said == (
        'Deployment ns/ms-prefill: field manager "hpa-test", "argocd" owns .spec.replicas, .spec.template.spec.containers[name="engine"]'
        ".image, which this role applies too, and server-side apply does not take fields from another manager; set them through the "
        "variables of this role, or release them from that manager (kubectl apply --server-side --force-conflicts "
        "--field-manager=inference-cache-substrate).")


def test_any_other_refusal_repeats_the_api_in_one_sentence():
    result = {"error": {"msg": "Failed to apply object:\n  (422) Invalid value.\n"}, "item": {"kind": "Service", "metadata": {"name": "s"}}}
    assert _say([result]) == "The API server refused Service ns/s: Failed to apply object: (422) Invalid value."
    assert _say([{"error": {}, "item": {}}]) == "The API server refused Deployment ns/?: no message."
