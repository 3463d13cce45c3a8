# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The tests' and benchmarks' side of a real EPP on this machine (``plugins/module_utils/epp/local.py`` runs the EPP): what
only they need, kept out of the collection's payload.

* ``with_file_discovery(config, endpoints_path)`` and ``file_discovery(config, endpoints, folder, name)``: an
  EndpointPickerConfig (the router role's, or any) with its endpoints read from a file instead of Kubernetes: the
  ``file-discovery`` plugin, ``dataLayer.discovery`` on it, no injected defaults (they discover pods through the API
  server) and the metrics data source the defaults would have brought; the llm-d EPP then routes over local engines.
* ``Relay(engine_endpoint, public_endpoint)``: the precise producer dials ``tcp://<endpoint address>:<socketPort>`` for
  every endpoint, but vLLM connects (does not bind) to an endpoint without ``*``. The relay binds an XSUB at the engine's
  own endpoint (the engine connects to it) and an XPUB at ``tcp://<engine address>:<common port>``, and forwards both
  ways (events down, subscriptions up), as ``zmq.proxy`` does, counting the subscriptions it saw; ``wait_subscribed``.
* ``GIEPool``: in a kwok cluster, the router role's InferencePool (``rendered_pool(path)`` reads it from what the role
  rendered: ``<router_render_dir>/router/manifests.yaml``) moved to the caller's namespace and name, its target port the
  engines', with one simulated pod per local engine, labelled as the pool selects, annotated with the engine's address
  (kwok_cluster's pod-IP stage makes it the pod's IP): the GIE EPP reconciles it as in a cluster and routes to the real
  engines. ``dynamic_client``: kubernetes.dynamic's client without its discovery cache file.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import copy
import json
import os
import threading
import time

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.errors import CheckError
from ansible_collections.inference_cache.substrate.plugins.module_utils.epp.local import EPPError, free_port  # noqa: F401  pylint: disable=unused-import

# kwok_cluster's default pod-IP annotation (roles/kwok_cluster/defaults/main.yml kwok_cluster_pod_ip_annotation).
POD_IP_ANNOTATION = "inference-cache.substrate/pod-ip"
FIELD_MANAGER = "inference-cache-substrate"


def with_file_discovery(config, endpoints_path):
    """``config`` with its endpoints read from ``endpoints_path`` (file-discovery) instead of Kubernetes."""
    config = copy.deepcopy(config) if config else {"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig"}
    plugins = [p for p in config.get("plugins") or [] if p.get("type") != "file-discovery"]
    names = set(p.get("name") or p.get("type") for p in plugins)
    plugins.insert(0, {"name": "file-discovery", "type": "file-discovery", "parameters": {"path": endpoints_path, "watchFile": False}})
    layer = config.setdefault("dataLayer", {})
    layer["injectDefaults"] = False
    layer["discovery"] = {"pluginRef": "file-discovery"}
    sources = layer.setdefault("sources", [])
    if "metrics-source" not in names:
        plugins += [{"name": "metrics-source", "type": "metrics-data-source"}, {"name": "metrics-extractor", "type": "core-metrics-extractor"}]
        sources.append({"pluginRef": "metrics-source", "extractors": [{"pluginRef": "metrics-extractor"}]})
    config["plugins"] = plugins
    return config


def file_discovery(config, endpoints, folder, name="epp"):
    """``config`` discovering ``endpoints`` (``[(name, address, port)]``) from a file written into ``folder``."""
    path = os.path.join(folder, "%s-endpoints.yaml" % name)
    with open(path, "w", encoding="utf-8") as out:
        json.dump({"endpoints": [{"name": n, "address": a, "port": str(p)} for n, a, p in endpoints]}, out)
    return with_file_discovery(config, path)


class Relay:
    """XSUB bound at the engine's endpoint, XPUB bound at the public one; events down, subscriptions up."""

    def __init__(self, engine_endpoint, public_endpoint):
        import zmq  # pylint: disable=import-outside-toplevel
        self.zmq = zmq
        self.ctx = zmq.Context()
        self.xsub = self.ctx.socket(zmq.XSUB)
        self.xpub = self.ctx.socket(zmq.XPUB)
        self.xpub.setsockopt(zmq.XPUB_VERBOSE, 1)   # every subscriber's subscription comes up (and is counted)
        for sock in (self.xsub, self.xpub):
            sock.setsockopt(zmq.LINGER, 0)
        self.xsub.bind(engine_endpoint)
        self.xpub.bind(public_endpoint)
        self.public_endpoint = public_endpoint
        self.subscriptions = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        poller = self.zmq.Poller()
        poller.register(self.xsub, self.zmq.POLLIN)
        poller.register(self.xpub, self.zmq.POLLIN)
        while not self.stopping.is_set():
            for sock, _event in poller.poll(100):
                frames = sock.recv_multipart()
                if sock is self.xsub:
                    self.xpub.send_multipart(frames)
                else:
                    if frames and frames[0][:1] == b"\x01":
                        self.subscriptions.append(frames[0][1:])
                    self.xsub.send_multipart(frames)
        self.xsub.close(0)
        self.xpub.close(0)

    def stop(self):
        self.stopping.set()
        self.thread.join(5)
        self.ctx.term()


def wait_subscribed(relays, counts, timeout=30.0):
    """Until each relay saw its count of subscriptions: the streams reach their subscribers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(len(r.subscriptions) >= count for r, count in zip(relays, counts)):
            return
        time.sleep(0.1)
    raise EPPError("The KV-event relays saw these subscriptions only: %s." % [(r.public_endpoint, r.subscriptions) for r in relays])


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
