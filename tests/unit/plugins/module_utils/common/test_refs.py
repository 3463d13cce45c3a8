# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""common/refs.py: image and chart references, one way (the filters over it: tests/unit/plugins/filter/test_refs.py)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.common import refs

PIN = {"registry": "ghcr.io/llm-d", "repository": "llm-d-router-epp", "tag": "v0.9.0", "digest": "sha256:abc"}


@pytest.mark.parametrize("pin, kwargs, ref", [
    (PIN, {}, "ghcr.io/llm-d/llm-d-router-epp:v0.9.0@sha256:abc"),
    (PIN, {"tag": "v0.9.1", "digest": "sha256:def"}, "ghcr.io/llm-d/llm-d-router-epp:v0.9.1@sha256:def"),
    (PIN, {"registry": "mirror.example/llm-d"}, "mirror.example/llm-d/llm-d-router-epp:v0.9.0@sha256:abc"),
    (PIN, {"image": "mine:1"}, "mine:1"),
    ({"repository": "docker.io/vllm/vllm-openai", "tag": "v0.32.0", "digest": ""}, {}, "docker.io/vllm/vllm-openai:v0.32.0"),
])
def test_image_ref(pin, kwargs, ref):
    assert refs.image_ref(pin, **kwargs) == ref


@pytest.mark.parametrize("ref, name, tag, hub, leaf, host, path", [
    ("ghcr.io/llm-d/epp:v0.9.0@sha256:abc", "ghcr.io/llm-d/epp", "v0.9.0@sha256:abc", "ghcr.io/llm-d", "epp", "ghcr.io", "llm-d/epp"),
    ("localhost:5000/a/b:1", "localhost:5000/a/b", "1", "localhost:5000/a", "b", "localhost:5000", "a/b"),
    ("busybox", "busybox", "", "", "busybox", "busybox", ""),
])
def test_image_parts(ref, name, tag, hub, leaf, host, path):
    assert refs.image_parts(ref) == {"name": name, "tag": tag, "hub": hub, "leaf": leaf, "host": host, "path": path}


@pytest.mark.parametrize("ref, version, repo, default, want", [
    ("nvidia-device-plugin", "0.17.1", "", "https://nvidia.github.io/k8s-device-plugin",
     {"path": False, "version": "0.17.1", "repo_url": "https://nvidia.github.io/k8s-device-plugin",
      "helm_args": ["--repo", "https://nvidia.github.io/k8s-device-plugin", "--version", "0.17.1"]}),
    ("nvdp/nvidia-device-plugin", "0.17.1", "", "https://nvidia.github.io/k8s-device-plugin",
     {"path": False, "version": "0.17.1", "repo_url": "", "helm_args": ["--version", "0.17.1"]}),
    ("oci://ghcr.io/llm-d/charts/x", "v0.9.0", "https://mirror", "",
     {"path": False, "url": True, "repo_url": "", "helm_args": ["--version", "v0.9.0"], "desc": "oci://ghcr.io/llm-d/charts/x version v0.9.0"}),
    ("/charts/x.tgz", "v0.9.0", "https://mirror", "", {"path": True, "version": "", "repo_url": "", "helm_args": [], "desc": "/charts/x.tgz"}),
    ("./x", "", "", "", {"path": True, "helm_args": []}),
    ("name", "1.0", "https://mirror", "", {"repo_url": "https://mirror", "desc": "name version 1.0 from https://mirror"}),
])
def test_chart_ref(ref, version, repo, default, want):
    got = refs.chart_ref(ref, version, repo, default)
    assert dict((k, got[k]) for k in want) == want
