# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""plugins/filter/refs.py: the image_ref, image_parts and chart_ref filters say what common/refs.py says, and refuse bad input."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import pytest

from ansible_collections.inference_cache.substrate.plugins.filter import refs as F
from ansible_collections.inference_cache.substrate.plugins.module_utils.common import refs

PIN = {"registry": "ghcr.io/llm-d", "repository": "llm-d-router-epp", "tag": "v0.9.0", "digest": "sha256:abc"}


def test_the_filters_are_the_functions_of_common_refs():
    assert F.image_ref(PIN, tag="v1") == refs.image_ref(PIN, tag="v1") == "ghcr.io/llm-d/llm-d-router-epp:v1@sha256:abc"
    assert F.image_parts("ghcr.io/llm-d/epp:v0.9.0") == refs.image_parts("ghcr.io/llm-d/epp:v0.9.0")
    assert F.chart_ref("name", "1.0", "https://mirror") == refs.chart_ref("name", "1.0", "https://mirror")


def test_the_filters_are_offered_under_their_names():
    assert set(F.FilterModule().filters()) == {"image_ref", "image_parts", "chart_ref"}


def test_the_filters_refuse_what_they_cannot_read():
    with pytest.raises(Exception, match=r"^image_ref needs an image, or a pin with a repository and a tag"):
        F.image_ref({})
    with pytest.raises(Exception, match=r"^image_parts needs an image reference"):
        F.image_parts("")
    with pytest.raises(Exception, match=r"^chart_ref needs a chart reference"):
        F.chart_ref(None)
