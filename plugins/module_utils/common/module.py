# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""``AnsibleModule`` that answers an infinite number given to an ``int`` option with one sentence.

ansible-core's ``check_type_int`` (2.19) converts through ``decimal`` and lets ``OverflowError`` escape for an
infinite float (YAML ``.inf``): the module would die with "cannot convert Infinity to integer" and a traceback.
This wrapper catches that one case and fails the way every other wrong type fails.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import math

from ansible.module_utils.basic import AnsibleModule


def ansible_module(argument_spec, **kwargs):
    """``AnsibleModule(argument_spec, **kwargs)``, failing with one sentence where ansible-core would raise."""
    try:
        return AnsibleModule(argument_spec=argument_spec, **kwargs)
    except OverflowError:
        raw = dict((name, {"type": "raw", "no_log": bool(spec.get("no_log"))}) for name, spec in argument_spec.items())
        module = AnsibleModule(argument_spec=raw, supports_check_mode=True)
        bad = sorted(name for name, value in module.params.items()
                     if isinstance(value, float) and math.isinf(value) and argument_spec[name].get("type") == "int")
        module.fail_json(msg="%s must be a whole number, got an infinite number." % (" and ".join(bad) or "An option"), changed=False)
    return None  # not reached: fail_json exits
