# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Kubernetes resource quantities in bytes, and back (documented in ``plugins/filter/quantity_bytes.yml``).

The roles size memory limits, ``/dev/shm`` and the weights' volume from each other (the LMCache CPU tier inside the
engine's memory limit, the model's weights against the volume that holds them); the sizes a user gives are Kubernetes
quantities (``48Gi``, ``100G``, ``51200Mi``, ``1.5Ti``, ``1e9``): the suffixes of
k8s.io/apimachinery@v0.33.13:pkg/api/resource/suffix.go (binary Ki..Ei, decimal k..E, and exponents).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import math
import re

from ansible.errors import AnsibleFilterError

_SUFFIX = {"": 1, "Ki": 1024, "Mi": 1024 ** 2, "Gi": 1024 ** 3, "Ti": 1024 ** 4, "Pi": 1024 ** 5, "Ei": 1024 ** 6,
           "k": 1000, "M": 1000 ** 2, "G": 1000 ** 3, "T": 1000 ** 4, "P": 1000 ** 5, "E": 1000 ** 6, "m": 0.001}
_QUANTITY = re.compile(r"^\s*([+]?(?:\d+(?:\.\d*)?|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?)\s*$")


def quantity_bytes(value):
    """``"48Gi"`` -> 51539607552; a number is taken as bytes. One sentence (AnsibleFilterError) for anything else."""
    if isinstance(value, bool):
        raise AnsibleFilterError("%r is not a Kubernetes quantity (write e.g. 48Gi, 100G or 51200Mi)." % (value,))
    if isinstance(value, (int, float)):
        return int(math.ceil(value))
    match = _QUANTITY.match(str(value))
    if not match:
        raise AnsibleFilterError("%r is not a Kubernetes quantity (write e.g. 48Gi, 100G or 51200Mi)." % (value,))
    number, exponent, suffix = match.groups()
    scale = 10 ** int(exponent[1:]) if exponent else _SUFFIX[suffix or ""]
    return int(math.ceil(float(number) * scale))


def gib_quantity(value):
    """Bytes (or a quantity) -> the smallest whole number of GiB that holds them, as a quantity: 20000000000 -> ``"19Gi"``."""
    return "%dGi" % int(math.ceil(quantity_bytes(value) / float(1024 ** 3)))


class FilterModule(object):  # pylint: disable=too-few-public-methods
    def filters(self):
        return {"quantity_bytes": quantity_bytes, "gib_quantity": gib_quantity}
