# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""The Kubernetes side of a GIE EPP on this machine (``epp/local.py``): its API server's address and its ServiceAccount's
kubeconfig (pure Python, no Ansible; the kubernetes client and PyYAML are imported where used).

The InferencePool it reconciles is the router role's (``roles/router``, router_impl gie), applied in the cluster by that
role (``playbooks/kwok_traffic.yml``); the tests and benchmarks apply it over local engines with their harness
(``tests/harness/epp_lab.GIEPool``).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import os
from urllib.parse import urlsplit

from ..common.errors import CheckError


def kube_server(kubeconfig):
    """``(host, port)`` of the API server of ``kubeconfig``'s current context."""
    import yaml  # pylint: disable=import-outside-toplevel
    with open(kubeconfig, encoding="utf-8") as handle:
        doc = yaml.safe_load(handle) or {}
    current = doc.get("current-context")
    contexts = dict((c["name"], c.get("context") or {}) for c in doc.get("contexts") or [])
    cluster_name = contexts.get(current, {}).get("cluster") or ((doc.get("clusters") or [{}])[0].get("name"))
    clusters = dict((c["name"], c.get("cluster") or {}) for c in doc.get("clusters") or [])
    url = urlsplit(clusters.get(cluster_name, {}).get("server") or "")
    if not url.hostname:
        raise CheckError("The kubeconfig %s names no API server for its current context." % kubeconfig)
    return url.hostname, url.port or (443 if url.scheme == "https" else 80)


def service_account_kubeconfig(kubeconfig, namespace, account, path, seconds=86400):
    """A kubeconfig for ``account`` of ``namespace`` (a TokenRequest through ``kubeconfig``): the EPP then runs with exactly
    the rights its ServiceAccount has in the cluster, so what the router role's RBAC lacks shows here too."""
    import yaml  # pylint: disable=import-outside-toplevel
    from kubernetes import client, config  # pylint: disable=import-outside-toplevel
    api = config.new_client_from_config(kubeconfig)
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": int(seconds)}}
    try:
        token = client.CoreV1Api(api).create_namespaced_service_account_token(account, namespace, request).status.token
    except client.exceptions.ApiException as exc:
        raise CheckError("Cannot get a token for ServiceAccount %s/%s (%s %s); is the router installed in that namespace?" % (
            namespace, account, exc.status, exc.reason))
    with open(kubeconfig, encoding="utf-8") as handle:
        doc = yaml.safe_load(handle)
    current = doc.get("current-context")
    context = [c for c in doc["contexts"] if c["name"] == current][0]["context"]
    cluster = [c for c in doc["clusters"] if c["name"] == context["cluster"]][0]
    out = {"apiVersion": "v1", "kind": "Config", "clusters": [cluster], "current-context": "epp",
           "contexts": [{"name": "epp", "context": {"cluster": cluster["name"], "user": "epp", "namespace": namespace}}],
           "users": [{"name": "epp", "user": {"token": token}}]}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        yaml.safe_dump(out, handle)
    return path
