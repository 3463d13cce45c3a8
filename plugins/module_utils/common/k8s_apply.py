# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What a refused server-side apply says: the field managers that own the fields it wanted, and the one sentence a role stops with.

The filters ``apply_conflicts`` and ``apply_refusal`` (``plugins/filter/k8s_apply.py``) offer these. kubernetes.core.k8s reports a refused apply as
``Failed to apply object: <the API's body>``, the body being the Kubernetes Status as bytes
(``b'{"kind":"Status",...,"reason":"Conflict","details":{"causes":[...]}}'``). For a server-side apply conflict each
cause is ``{"reason": "FieldManagerConflict", "message": "conflict with \\"<manager>\\" [with subresource \\"<name>\\"]
[using <apiVersion>]", "field": ".spec.replicas"}`` (k8s.io/apiserver pkg/endpoints/handlers/fieldmanager/internal/conflict.go).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import ast
import json
import re

_PREFIX = re.compile(r"^\s*Failed to \w+ object:\s*", re.S)
_MANAGER = re.compile(r'conflicts? with "((?:[^"\\]|\\.)*)"(?: with subresource "((?:[^"\\]|\\.)*)")?(?: using (\S+))?')
# A message whose body is not JSON: "conflict with "m" using apps/v1: .spec.replicas" (one) or "conflicts with "m":\n- .a\n- .b".
_ONE = re.compile(r'conflict with "((?:[^"\\]|\\.)*)"[^:\n]*: (\.[^\s"\']+)')


def _status(message):
    """The Kubernetes Status in a kubernetes.core error message, or None."""
    text = _PREFIX.sub("", message).strip()
    if text[:2] in ("b'", 'b"'):
        try:
            text = ast.literal_eval(text).decode("utf-8", "replace")
        except (ValueError, SyntaxError, UnicodeError):
            pass
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        return None
    try:
        status = json.loads(text[start:end + 1])
    except ValueError:
        return None
    return status if isinstance(status, dict) else None


def conflicts(message):
    """A refused apply's error (its ``msg``, or the ``error`` mapping) -> [{manager, field, subresource, api_version}], [] when none."""
    if isinstance(message, dict):
        message = message.get("msg", "")
    message = message if isinstance(message, str) else str(message or "")
    status = _status(message)
    found = []
    if status is not None:
        for cause in (status.get("details") or {}).get("causes") or []:
            if not isinstance(cause, dict) or cause.get("reason") != "FieldManagerConflict":
                continue
            match = _MANAGER.search(cause.get("message") or "")
            found.append({"manager": match.group(1) if match else "", "field": cause.get("field") or "",
                          "subresource": (match.group(2) if match else None) or "",
                          "api_version": (match.group(3) if match else None) or ""})
        if found or status.get("reason") != "Conflict":
            return found
        message = status.get("message") or ""
    for manager, field in _ONE.findall(message.replace('\\"', '"')):
        found.append({"manager": manager, "field": field, "subresource": "", "api_version": ""})
    return found


def _get(data, *path):
    for key in path:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _unique(values):
    seen = []
    for value in values:
        if value not in seen:
            seen.append(value)
    return seen


def refusal(results, namespace, groups=(), live=(), field_manager="", replicas_vars=None, externally=""):
    """The sentence for the first of ``results`` (a ``kubernetes.core.k8s`` loop's, with ``continue_on_error``) the API refused;
    '' when it refused none.

    ``groups``: the Deployments the role sizes ({name, role, replicas}); ``live``: the results of reading them before the apply
    (``item.name``, ``resources``); ``field_manager``: the role's; ``replicas_vars``: {group role: the variable sizing it}
    (key '' for the default); ``externally``: the variable that leaves ``.spec.replicas`` to another manager.
    """
    refused = [r for r in results or [] if isinstance(r, dict) and "error" in r]
    if not refused:
        return ""
    first = refused[0]
    name = _get(first, "item", "metadata", "name") or _get(first, "item", "item", "name") or "?"
    what = "%s %s/%s" % (_get(first, "item", "kind") or "Deployment", namespace, name)
    error = first.get("error") or {}
    found = conflicts(error)
    managers = '"%s"' % '", "'.join(_unique(c["manager"] for c in found))
    fields = _unique(c["field"] for c in found)
    if found and fields == [".spec.replicas"]:
        group = next((g for g in groups or [] if isinstance(g, dict) and g.get("name") == name), {})
        variables = replicas_vars or {}
        variable = variables.get(group.get("role") or "", variables.get("", "replicas"))
        read = next((r for r in live or [] if _get(r, "item", "name") == name), {})
        deployment = (read.get("resources") or [{}])[0] or {}
        current = _get(deployment, "spec", "replicas")
        current = "?" if current is None else current
        return ("%s: .spec.replicas belongs to field manager %s (such as an autoscaler or kubectl scale; it set %s), and server-side "
                "apply does not take it back for %s=%s; set %s=true to leave the replicas to it, or %s=%s to agree with it."
                % (what, managers, current, variable, group.get("replicas", "?"), externally, variable, current))
    if found:
        return ("%s: field manager %s owns %s, which this role applies too, and server-side apply does not take fields from another "
                "manager; set them through the variables of this role, or release them from that manager (kubectl apply "
                "--server-side --force-conflicts --field-manager=%s)." % (what, managers, ", ".join(fields), field_manager))
    message = error.get("msg") if isinstance(error, dict) else error
    message = re.sub(r"\s+", " ", str(message or "no message")).strip()
    return "The API server refused %s: %s." % (what, re.sub(r"[.]$", "", message))
