# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""The Kubernetes side of a GIE EPP on this machine (``epp/local.py``): its InferencePool over local engines, its
ServiceAccount's kubeconfig, its API server's address (pure Python, no Ansible; the kubernetes client and PyYAML are
imported where used).

One InferencePool definition: the router role's (``roles/router``, router_impl gie). ``rendered_pool(path)`` reads it
from what the role rendered (``<router_render_dir>/router/manifests.yaml``: ``benchmarks/epp_configs.yml`` renders it
for ``make bench-routing``); ``playbooks/kwok_traffic.yml`` finds it applied in its cluster. ``GIEPool`` applies that
object in a kwok cluster (moved to the caller's namespace and name, its target port the engines') with one simulated pod
per local engine, labelled as the pool selects, annotated with the engine's address (kwok_cluster's pod-IP stage makes
it the pod's IP): the EPP reconciles it as in a cluster and routes to the real engines.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import copy
import os
import time
from urllib.parse import urlsplit

from ..common.errors import CheckError

# kwok_cluster's default pod-IP annotation (roles/kwok_cluster/defaults/main.yml kwok_cluster_pod_ip_annotation).
POD_IP_ANNOTATION = "inference-cache.substrate/pod-ip"
FIELD_MANAGER = "inference-cache-substrate"


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


def rendered_pool(path):
    """The InferencePool of the router role's rendered manifests at ``path`` (router_impl gie)."""
    import yaml  # pylint: disable=import-outside-toplevel
    try:
        with open(path, encoding="utf-8") as handle:
            docs = [doc for doc in yaml.safe_load_all(handle) if isinstance(doc, dict)]
    except (OSError, yaml.YAMLError) as exc:
        raise CheckError("Cannot read the router role's rendered manifests %s (%s); render the router role with router_impl gie "
                         "(benchmarks/epp_configs.yml)." % (path, exc))
    pools = [doc for doc in docs if doc.get("kind") == "InferencePool"]
    if len(pools) != 1:
        raise CheckError("The router role's rendered manifests %s hold %d InferencePools, not one; render the router role with "
                         "router_impl gie (benchmarks/epp_configs.yml)." % (path, len(pools)))
    return pools[0]


def dynamic_client(api_client):
    """kubernetes.dynamic's client without its discovery cache file: by default it writes ``osrcp-<hash>.json`` into the
    temporary folder on every first use and never removes it; here discovery is kept in memory for the process."""
    from kubernetes import dynamic  # pylint: disable=import-outside-toplevel

    class InMemoryDiscoverer(dynamic.LazyDiscoverer):
        def _write_cache(self):
            pass

    return dynamic.DynamicClient(api_client, discoverer=InMemoryDiscoverer)


class GIEPool:
    """In a kwok cluster: ``pool`` (the router role's InferencePool), in ``namespace`` as ``name`` on the engines' ``port``,
    and one simulated pod per local engine, labelled as the pool selects and annotated with the engine's address (kwok_cluster's
    pod-IP stage makes it the pod's IP); what a GIE EPP on this machine discovers, as it would the engine pods of a cluster.

    ``engines``: ``[(name, address)]``. Needs the InferencePool CRDs (``apply(crds=...)``)."""

    def __init__(self, kubeconfig, pool, engines, name=None, namespace=None, port=None, annotation=POD_IP_ANNOTATION):
        from kubernetes import config  # pylint: disable=import-outside-toplevel
        self.client = dynamic_client(config.new_client_from_config(kubeconfig))
        self.kubeconfig = kubeconfig
        self.pool = copy.deepcopy(pool)
        meta = self.pool.setdefault("metadata", {})
        self.name = meta["name"] = name or meta.get("name")
        self.namespace = meta["namespace"] = namespace or meta.get("namespace") or "default"
        spec = self.pool.setdefault("spec", {})
        if port is not None:
            spec["targetPorts"] = [{"number": int(port)}]
        self.port = int(spec["targetPorts"][0]["number"])
        self.labels = dict((key, str(value)) for key, value in ((spec.get("selector") or {}).get("matchLabels") or {}).items())
        if not self.labels:
            raise CheckError("InferencePool %s selects no pods by label (spec.selector.matchLabels); render it from the router role "
                             "with an engine selector." % self.name)
        self.engines = list(engines)
        self.annotation = annotation

    def _resource(self, api_version, kind):
        return self.client.resources.get(api_version=api_version, kind=kind)

    def objects(self):
        pods = [{"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": engine, "namespace": self.namespace, "labels": self.labels, "annotations": {self.annotation: address}},
                 "spec": {"containers": [{"name": "engine", "image": "vllm-on-this-machine:%s" % address,
                                          "ports": [{"name": "http", "containerPort": self.port}]}]}}
                for engine, address in self.engines]
        return [self.pool] + pods

    def apply(self, timeout=120.0, crds=None):
        """The CRDs (when given), the namespace, the pool and the pods; then until every pod is Ready with its engine's IP."""
        import yaml  # pylint: disable=import-outside-toplevel
        if crds:
            crd = self._resource("apiextensions.k8s.io/v1", "CustomResourceDefinition")
            with open(crds, encoding="utf-8") as handle:
                for doc in yaml.safe_load_all(handle):
                    if doc:
                        crd.server_side_apply(body=doc, name=doc["metadata"]["name"], field_manager=FIELD_MANAGER, force_conflicts=True)
            self._wait(lambda: self._crd_established(crd), timeout, "the InferencePool CRDs to be established")
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}}
        self._resource("v1", "Namespace").server_side_apply(body=namespace, name=self.namespace, field_manager=FIELD_MANAGER)
        for doc in self.objects():
            self._resource(doc["apiVersion"], doc["kind"]).server_side_apply(
                body=doc, name=doc["metadata"]["name"], namespace=self.namespace, field_manager=FIELD_MANAGER)
        want = dict(self.engines)
        self._wait(lambda: self.pod_ips() == want, timeout, "pods %s to run with the IPs %s" % (", ".join(want), want))

    @staticmethod
    def _crd_established(crd):
        for item in crd.get().items:
            if item.metadata.name.endswith(".inference.networking.k8s.io") or "inference.networking" in item.metadata.name:
                conditions = dict((c.type, c.status) for c in item.status.conditions or [])
                if conditions.get("Established") != "True":
                    return False
        return True

    def pod_ips(self):
        """``{pod: IP}`` of the pool's Ready pods."""
        selector = ",".join("%s=%s" % kv for kv in sorted(self.labels.items()))
        out = {}
        for pod in self._resource("v1", "Pod").get(namespace=self.namespace, label_selector=selector).items:
            ready = any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))
            if ready and pod.status.podIP:
                out[pod.metadata.name] = pod.status.podIP
        return out

    def _wait(self, done, timeout, what):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if done():
                return
            time.sleep(0.5)
        raise CheckError("Waited %ss for %s in the kwok cluster of %s; look at kwok's log in its cluster folder." % (
            timeout, what, self.kubeconfig))

    def delete(self, timeout=120.0):
        """The namespace (pool and pods with it), until it is gone."""
        from kubernetes.dynamic.exceptions import NotFoundError  # pylint: disable=import-outside-toplevel
        namespaces = self._resource("v1", "Namespace")
        try:
            namespaces.delete(name=self.namespace)
        except NotFoundError:
            return

        def gone():
            try:
                namespaces.get(name=self.namespace)
                return False
            except NotFoundError:
                return True
        self._wait(gone, timeout, "namespace %s to go" % self.namespace)


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
