# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""epp/local_kube.py: the Kubernetes side of a GIE EPP on this machine: its API server's address from a kubeconfig."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import pytest
import yaml

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.errors import CheckError
from ansible_collections.inference_cache.substrate.plugins.module_utils.epp import local_kube as K


def _kubeconfig(tmp_path, server, current="kwok"):
    doc = {"current-context": current, "contexts": [{"name": "kwok", "context": {"cluster": "c"}}],
           "clusters": [{"name": "c", "cluster": {"server": server}}]}
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


@pytest.mark.parametrize("server, address", [("https://127.0.0.1:19443", ("127.0.0.1", 19443)), ("https://127.0.0.1", ("127.0.0.1", 443)),
                                             ("http://localhost", ("localhost", 80))])
def test_the_api_server_of_the_current_context(tmp_path, server, address):
    assert K.kube_server(_kubeconfig(tmp_path, server)) == address


def test_a_kubeconfig_naming_no_server_is_one_sentence(tmp_path):
    with pytest.raises(CheckError, match=r"^The kubeconfig .* names no API server for its current context\.$"):
        K.kube_server(_kubeconfig(tmp_path, ""))
