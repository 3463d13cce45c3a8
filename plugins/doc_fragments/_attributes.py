# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.


class ModuleDocFragment(object):

    # Shared attribute declarations, used as inference_cache.substrate._attributes.
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
  idempotent:
    description:
      - When run twice in a row outside check mode, with the same arguments, the second invocation indicates no change.
      - This assumes that the system controlled/queried by the module has not changed in a relevant way.
"""

    # Read-only check modules: they never change anything.
    CHECK = r"""
options: {}
attributes:
  check_mode:
    support: full
    details: The module only reads; it runs the same checks in check mode.
  diff_mode:
    support: none
  idempotent:
    support: full
"""
