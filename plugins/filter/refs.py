# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Filters that hand the roles image and chart references read one way (``plugins/module_utils/common/refs.py``)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

from ansible.errors import AnsibleFilterError

from ansible_collections.inference_cache.substrate.plugins.module_utils.common import refs


def image_ref(pin, image="", registry="", repository="", tag="", digest=None):
    """``pin | inference_cache.substrate.image_ref(image, registry, repository, tag, digest)`` -> the image reference."""
    if not image and not (isinstance(pin, dict) and pin.get("repository") and pin.get("tag")):
        raise AnsibleFilterError("image_ref needs an image, or a pin with a repository and a tag, got %r." % (pin,))
    return refs.image_ref(pin, image or "", registry or "", repository or "", tag or "", digest)


def image_parts(ref):
    """``ref | inference_cache.substrate.image_parts`` -> ``{name, tag, hub, leaf, host, path}``."""
    if not isinstance(ref, str) or not ref:
        raise AnsibleFilterError("image_parts needs an image reference, got %r." % (ref,))
    return refs.image_parts(ref)


def chart_ref(ref, version="", repo_url="", default_repo_url=""):
    """``ref | inference_cache.substrate.chart_ref(version, repo_url, default_repo_url)`` -> how Helm takes the chart."""
    if not isinstance(ref, str):
        raise AnsibleFilterError("chart_ref needs a chart reference (a name, an oci:// reference or a path), got %r." % (ref,))
    return refs.chart_ref(ref, version or "", repo_url or "", default_repo_url or "")


class FilterModule(object):
    def filters(self):
        return {"image_ref": image_ref, "image_parts": image_parts, "chart_ref": chart_ref}
