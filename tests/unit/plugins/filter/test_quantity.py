# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The quantity filters (plugins/filter/quantity.py): Kubernetes quantities in bytes, as the roles size memory with them."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import jinja2
import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.inference_cache.substrate.plugins.filter import quantity as Q


@pytest.mark.parametrize("value, expected", [
    ("48Gi", 48 * 1024 ** 3), ("100G", 100 * 1000 ** 3), ("51200Mi", 50 * 1024 ** 3), ("1.5Ti", int(1.5 * 1024 ** 4)),
    ("1e9", 10 ** 9), ("512", 512), (" 2Gi ", 2 * 1024 ** 3), ("500m", 1), (0, 0), (3.2, 4), ("0.5Ki", 512),
])
def test_quantities_in_bytes(value, expected):
    assert Q.quantity_bytes(value) == expected


@pytest.mark.parametrize("value", ["", "Gi", "48 GB", "-1Gi", "1.2.3", "ten", True, None, "2gi"])
def test_anything_else_is_one_sentence(value):
    with pytest.raises(AnsibleFilterError, match=r"is not a Kubernetes quantity \(write e\.g\. 48Gi, 100G or 51200Mi\)\.$"):
        Q.quantity_bytes(value)


@pytest.mark.parametrize("value, expected", [(20 * 10 ** 9, "19Gi"), ("2Gi", "2Gi"), (1, "1Gi"), ("100G", "94Gi")])
def test_gib_quantity_rounds_up(value, expected):
    assert Q.gib_quantity(value) == expected


def test_through_jinja_under_the_collections_names():
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters.update(dict(("inference_cache.substrate." + name, fn) for name, fn in Q.FilterModule().filters().items()))
    assert env.from_string("{{ '32Gi' | inference_cache.substrate.quantity_bytes > 30 * 1073741824 }}").render() == "True"
    assert sorted(Q.FilterModule().filters()) == ["gib_quantity", "quantity_bytes"]
