# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""What each pinned EPP takes on its command line (pure Python, no Ansible).

The flag tables live beside each EPP's other tables, with their citations (``epp/llm_d.py`` FLAGS and REMOVED_FLAGS for
the llm-d EPP v0.9.0, ``epp/gie.py`` for the GIE EPP v1.4.0). ``flag_problems(impl, given, owned)`` sorts the flags a user
gives into those the EPP does not define (an unknown flag stops it at start), those it refuses (the removed metric flags),
and those the caller sets itself (``owned``: flag -> who sets it; a second value would silently win); ``flag_refusal``
says it in one sentence. The router role reaches them through the ``epp_flag_refusal`` filter.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

from ..common.wiring import GIE_VERSION, ROUTER_VERSION
from . import gie, llm_d

EPPS = {
    "llm-d": {"name": "llm-d EPP %s" % ROUTER_VERSION, "flags": llm_d.FLAGS, "removed_flags": llm_d.REMOVED_FLAGS},
    "gie": {"name": "GIE EPP %s" % GIE_VERSION, "flags": gie.FLAGS, "removed_flags": gie.REMOVED_FLAGS},
}


def flag_problems(impl, given, owned=None):
    """``{"unknown": [...], "removed": [...], "owned": [...]}`` of the flags ``given`` (names, in their order) to ``impl``'s EPP."""
    epp = EPPS[impl]
    owned = owned or {}
    found = {"unknown": [], "removed": [], "owned": []}
    for name in given:
        name = str(name)
        if name in owned:
            found["owned"].append(name)
        elif name in epp["removed_flags"]:
            found["removed"].append(name)
        elif name not in epp["flags"]:
            found["unknown"].append(name)
    return found


def _verb(names, one, many):
    return one if len(names) == 1 else many


def flag_refusal(impl, given, owned=None, what="the flags given"):
    """The one sentence refusing what ``flag_problems`` found (``what``: how the caller names where the flags come from), or
    an empty string when every flag given may pass."""
    owned = owned or {}
    found = flag_problems(impl, given, owned)
    parts = []
    if found["unknown"]:
        parts.append("%s %s of it (an unknown flag stops it at start)" % (
            ", ".join(found["unknown"]), _verb(found["unknown"], "is not a flag", "are not flags")))
    if found["removed"]:
        parts.append("%s %s removed (it refuses %s at start: name the metrics in the engineConfigs of the EndpointPickerConfig's "
                     "metrics extractor instead)" % (", ".join(found["removed"]), _verb(found["removed"], "was", "were"),
                                                     _verb(found["removed"], "it", "them")))
    if found["owned"]:
        parts.append("the role sets %s itself, and a second value would silently win over the role's or contradict what it "
                     "built around it" % ", ".join("%s (from %s)" % (name, owned[name]) for name in found["owned"]))
    if not parts:
        return ""
    refused = found["unknown"] + found["removed"] + found["owned"]
    return "%s cannot pass %s to the %s: %s." % (what, ", ".join(refused), EPPS[impl]["name"], "; ".join(parts))
