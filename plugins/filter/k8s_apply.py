# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What a refused server-side apply says: the field managers that own the fields it wanted.

Documented in ``plugins/filter/apply_conflicts.yml``. kubernetes.core.k8s reports a refused apply as
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


def apply_conflicts(message):
    """``error.msg | inference_cache.substrate.apply_conflicts`` -> [{manager, field, subresource, api_version}], [] when none."""
    if isinstance(message, dict):
        message = message.get("msg", "")
    message = message if isinstance(message, str) else str(message or "")
    status = _status(message)
    conflicts = []
    if status is not None:
        for cause in (status.get("details") or {}).get("causes") or []:
            if not isinstance(cause, dict) or cause.get("reason") != "FieldManagerConflict":
                continue
            match = _MANAGER.search(cause.get("message") or "")
            conflicts.append({"manager": match.group(1) if match else "", "field": cause.get("field") or "",
                              "subresource": (match.group(2) if match else None) or "",
                              "api_version": (match.group(3) if match else None) or ""})
        if conflicts or status.get("reason") != "Conflict":
            return conflicts
        message = status.get("message") or ""
    for manager, field in _ONE.findall(message.replace('\\"', '"')):
        conflicts.append({"manager": manager, "field": field, "subresource": "", "api_version": ""})
    return conflicts


class FilterModule(object):
    def filters(self):
        return {"apply_conflicts": apply_conflicts}
