# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""epp_route_check against a real EPP over two real vLLM CPU engines: llm-d's (pinned v0.9.0) or the GIE's (v1.4.0).

Two engines through ``playbooks/kv_index.yml`` (instances ``eppr-a`` on 127.0.0.1:8310 and ``eppr-b`` on
127.0.0.2:8310, one port on two addresses as an InferencePool's target port requires, with ``--enable-scale-out`` so the
llm-d EPP's token producer gets the engines' own tokens from ``/v1/completions/render``).

Which EPP (``plugins/module_utils/epp/local.resolve_epp``, said at the start of the run): llm-d's where it can be had
(``SUBSTRATE_EPP_BINARY``, else the build of ``vars/go_builds.yml`` llm-d-router, which the Go module proxy here
refuses), else the Gateway API Inference Extension's EPP, built from its Go module (``make gie-epp``).

* llm-d: file discovery over the engines. Each engine connects to its KV-event endpoint; a relay binds it and
  republishes at ``tcp://<engine address>:<one common port>``, the endpoint the precise producer dials and the check
  subscribes to. Configs: what the router role renders (precise and approximate, its default weights).
* gie: it discovers its endpoints through the Kubernetes API only, so the tests start a kwok cluster of their own (a
  real kube-apiserver, roles/kwok_cluster) holding the router role's InferencePool (rendered for router_impl gie,
  ``tests/harness/epp_lab.GIEPool``) over one simulated pod per engine, each pod's IP the address of its real engine
  (kwok_cluster's pod-IP stage); the EPP reconciles the pool as in a cluster and routes to the real engines. Config:
  the GIE chart's default scorers (queue 2, KV-cache utilization 2, prefix 3), which the
  router role renders for router_impl gie. Approximate only: it learns a prefix from its own picks, so it is warmed
  through itself (the pick asked, then the request sent to the picked engine, as the Gateway would).

The engines need the installation (``make site``, or ``LOCAL_ENGINE_START=1`` installs it); without it the tests skip,
or fail under ``LOCAL_ENGINE_REQUIRED=1``, as does an EPP that cannot be had.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.errors import CheckError
from ansible_collections.inference_cache.substrate.plugins.module_utils.common.wiring import kv_topic, topic_filter
from ansible_collections.inference_cache.substrate.plugins.module_utils.epp.extproc import ask_pick
from ansible_collections.inference_cache.substrate.plugins.module_utils.epp.local import (
    EPP, GIE_VERSION, ROUTER_VERSION, free_port, gie_crds, resolve_binary, resolve_epp)
from ansible_collections.inference_cache.substrate.tests.harness.epp_lab import GIEPool, Relay, file_discovery, rendered_pool, wait_subscribed
from ansible_collections.inference_cache.substrate.plugins.module_utils.epp.route_check import RouteCheck

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _engine_lane import ENGINE_PYTHON, STATE_DIR, playbook, skip_or_fail  # noqa: E402  pylint: disable=wrong-import-position

MODEL, BLOCK_SIZE, HASH_SEED = "tiny", 32, "0"   # the local_engine role's defaults
ENGINES = [
    {"instance": "eppr-a", "host": "127.0.0.1", "port": 8310, "kv_events_port": 5710, "replay_port": 5711},
    {"instance": "eppr-b", "host": "127.0.0.2", "port": 8310, "kv_events_port": 5712, "replay_port": 5713},
]
# The GIE EPP's kwok cluster: a name and ports of its own (make kwok: 16xxx, test_kwok_cluster: 17xxx, test_kwok_roles: 18xxx, the bench: 19xxx).
KWOK = {"kwok_cluster_name": "substrate-epp-test", "kwok_cluster_api_port": 20443, "kwok_cluster_etcd_port": 20379,
        "kwok_cluster_etcd_peer_port": 20380, "kwok_cluster_controller_manager_port": 20257, "kwok_cluster_scheduler_port": 20259,
        "kwok_cluster_kwok_port": 20247}
KWOK_PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  roles:
    - role: inference_cache.substrate.kwok_cluster
"""
# The router role's objects for router_impl gie (as benchmarks/epp_configs.yml renders them): its InferencePool, whose
# selector the pool's simulated pods carry.
ROUTER_PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  roles:
    - role: inference_cache.substrate.router
      vars:
        router_impl: gie
        router_scoring_mode: approximate
        router_allow_unpinned_images: true
"""
POOL, NAMESPACE = "eppr-pool", "epp-route-test"
# What the GIE EPP runs on here: its build (with controller-gen, which generates its CRDs) and the kwok cluster's.
GIE_BUILDS = ["kubernetes", "etcd", "kwok", "gie"]
# A cold build of them all takes up to 40 minutes on 2 cores (vars/go_builds.yml): the wait on another run's lock included.
GO_BUILD_TIMEOUT = 2 * 3600
_RESOLVED = {}


def go_builds(names, env=None):
    """The catalog's builds ``names`` through playbooks/go_build.yml (inference_cache.substrate.go_build), as every test
    that needs a Go build gets it: what is built is left alone, what is missing is built once, and a build another run
    holds the lock of (make test's builds lane, `make go-build`) is waited on, not looked for too early."""
    env = env or dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    return playbook("playbooks/go_build.yml", "-e", json.dumps({"go_builds_names": names}), timeout=GO_BUILD_TIMEOUT, env=env)


def epp_under_test():
    """``(binary, impl)`` of the EPP these tests run (epp/local.resolve_epp); the reason, failing, when none can be had.

    Without llm-d's EPP the GIE EPP runs, over a kwok cluster: their builds come through go_build first (a no-op where
    they are built; on a fresh machine, the wait for make test's builds lane)."""
    if "path" not in _RESOLVED:
        path, impl, why = resolve_epp()
        if impl == "gie" or (path is None and not os.environ.get("SUBSTRATE_EPP_BINARY")):
            built = go_builds(GIE_BUILDS)
            if built.returncode != 0:
                skip_or_fail("The GIE EPP and the kwok cluster it needs could not be built (playbooks/go_build.yml): %s"
                             % " ".join(built.stdout.split())[-1500:])
            path, impl, why = resolve_epp()
        _RESOLVED["path"], _RESOLVED["impl"], _RESOLVED["why"] = path, impl, why
        if not _RESOLVED["path"]:
            skip_or_fail(_RESOLVED["why"])
    if not _RESOLVED["path"]:
        skip_or_fail(_RESOLVED["why"])
    return _RESOLVED["path"], _RESOLVED["impl"]


def epp_binary():
    return epp_under_test()[0]


def _which_epp(impl, binary):
    if impl == "gie":
        _path, why = resolve_binary()
        return "the Gateway API Inference Extension's EPP %s (%s), llm-d's EPP %s being absent (%s)" % (GIE_VERSION, binary, ROUTER_VERSION, why)
    return "the llm-d EPP %s (%s)" % (ROUTER_VERSION, binary)


ENGINE_VARS = ["-e", json.dumps({"kv_index_engines": ENGINES, "local_engine_extra_args": ["--enable-scale-out"]})]


def _address(engine):
    return "%s:%d" % (engine["host"], engine["port"])


def _precise_config(render_url):
    """The router role's precise config (weights: its defaults), its token producer on an engine's render endpoint."""
    return {
        "apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig",
        "plugins": [
            {"type": "token-producer", "parameters": {"modelName": MODEL, "vllm": {"url": render_url}}},
            {"type": "precise-prefix-cache-producer", "parameters": {
                "tokenProcessorConfig": {"blockSizeTokens": BLOCK_SIZE, "hashSeed": HASH_SEED},
                "kvEventsConfig": {"topicFilter": topic_filter(kv_topic("x", 1, MODEL)), "concurrency": 4, "discoverPods": True,
                                   "podDiscoveryConfig": {"socketPort": None}},
                "indexerConfig": {"kvBlockIndexConfig": {"enableMetrics": True}}}},
            {"type": "prefix-cache-scorer", "parameters": {"prefixMatchInfoProducerName": "precise-prefix-cache-producer"}},
            {"type": "decode-filter"}, {"type": "kv-cache-utilization-scorer"}, {"type": "queue-scorer"},
            {"type": "max-score-picker"}, {"type": "single-profile-handler"}, {"type": "endpoint-notification-source"},
            {"name": "metrics-source", "type": "metrics-data-source"}, {"name": "metrics-extractor", "type": "core-metrics-extractor"},
        ],
        "dataLayer": {"injectDefaults": False, "discovery": {"pluginRef": "file-discovery"}, "sources": [
            {"pluginRef": "endpoint-notification-source", "extractors": [{"pluginRef": "precise-prefix-cache-producer"}]},
            {"pluginRef": "metrics-source", "extractors": [{"pluginRef": "metrics-extractor"}]}]},
        "schedulingProfiles": [{"name": "default", "plugins": [
            {"pluginRef": "decode-filter"}, {"pluginRef": "prefix-cache-scorer", "weight": 2.0},
            {"pluginRef": "kv-cache-utilization-scorer", "weight": 1.0}, {"pluginRef": "queue-scorer", "weight": 1.0},
            {"pluginRef": "max-score-picker"}]}],
    }


def _gie_config():
    """What the router role renders for router_impl gie: the GIE chart's default scorers and weights
    (kubernetes-sigs/gateway-api-inference-extension@v1.4.0:config/charts/epplib/templates/_config.yaml)."""
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1", "kind": "EndpointPickerConfig",
        "plugins": [{"type": "queue-scorer"}, {"type": "kv-cache-utilization-scorer"}, {"type": "prefix-cache-scorer"}],
        "schedulingProfiles": [{"name": "default", "plugins": [
            {"pluginRef": "queue-scorer", "weight": 2}, {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
            {"pluginRef": "prefix-cache-scorer", "weight": 3}]}],
    }


def _approximate_config():
    """The router role's approximate config (prefix-cache-scorer on its approximate producer, which reads no KV event)."""
    return {
        "apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig",
        "plugins": [
            {"type": "decode-filter"}, {"type": "prefix-cache-scorer"}, {"type": "load-aware-scorer"},
            {"type": "kv-cache-utilization-scorer"}, {"type": "max-score-picker"}, {"type": "single-profile-handler"},
            {"name": "metrics-source", "type": "metrics-data-source"}, {"name": "metrics-extractor", "type": "core-metrics-extractor"},
        ],
        "dataLayer": {"injectDefaults": False, "discovery": {"pluginRef": "file-discovery"}, "sources": [
            {"pluginRef": "metrics-source", "extractors": [{"pluginRef": "metrics-extractor"}]}]},
        "schedulingProfiles": [{"name": "default", "plugins": [
            {"pluginRef": "decode-filter"}, {"pluginRef": "load-aware-scorer", "weight": 10.0},
            {"pluginRef": "kv-cache-utilization-scorer", "weight": 5.0}, {"pluginRef": "prefix-cache-scorer", "weight": 2.0},
            {"pluginRef": "max-score-picker"}]}],
    }


def _kwok(folder, *extra):
    """One run of roles/kwok_cluster with the tests' cluster settings (state present unless told)."""
    path = os.path.join(folder, "kwok.yml")
    with open(path, "w", encoding="utf-8") as out:
        out.write(KWOK_PLAYBOOK)
    variables = dict(KWOK, ansible_python_interpreter=sys.executable)
    return playbook("-i", "localhost,", "-c", "local", path, "-e", json.dumps(variables), *extra)


def _router_pool(folder):
    """The InferencePool the router role renders for router_impl gie over the tests' engines (selector app=eppr)."""
    path = os.path.join(folder, "router.yml")
    with open(path, "w", encoding="utf-8") as out:
        out.write(ROUTER_PLAYBOOK)
    variables = {"router_render_dir": os.path.join(folder, "render"), "router_engine": {
        "served_model_name": MODEL, "block_size": BLOCK_SIZE, "hash_seed": HASH_SEED, "engine_type": "vllm",
        "topic": kv_topic(ENGINES[0]["host"], ENGINES[0]["port"], MODEL), "kv_events_port": ENGINES[0]["kv_events_port"],
        "selector": {"app": "eppr"}, "http_port": ENGINES[0]["port"]}, "ansible_python_interpreter": sys.executable}
    rendered = playbook("-i", "localhost,", "-c", "local", path, "-e", json.dumps(variables))
    assert rendered.returncode == 0, rendered.stdout[-4000:]
    return rendered_pool(os.path.join(folder, "render", "router", "manifests.yaml"))


class Lane:
    """The two engines, their relays and the common KV-event port; for the GIE EPP, the kwok cluster and its pool. EPPs
    are started per test."""

    def __init__(self, folder, impl):
        self.folder = folder
        self.impl = impl
        self.port = free_port(*[e["host"] for e in ENGINES])
        self.relays = [Relay("tcp://127.0.0.1:%d" % e["kv_events_port"], "tcp://%s:%d" % (e["host"], self.port)) for e in ENGINES]
        self.epps = []
        self.pool = None
        self.kubeconfig = None

    def start_pool(self):
        """The GIE EPP's side of Kubernetes: the kwok cluster, the CRDs, the pool's pods on the engines' addresses."""
        pool = _router_pool(self.folder)
        started = _kwok(self.folder)
        assert started.returncode == 0, started.stdout[-4000:]
        self.kubeconfig = os.path.expanduser("~/.cache/inference_cache/kwok_cluster/clusters/%s/kubeconfig" % KWOK["kwok_cluster_name"])
        self.pool = GIEPool(self.kubeconfig, pool, [(e["instance"], e["host"]) for e in ENGINES], name=POOL, namespace=NAMESPACE,
                            port=ENGINES[0]["port"])
        self.pool.apply(crds=gie_crds())

    def config(self, mode):
        """The config of the EPP under test: llm-d's precise or approximate one, or the GIE's."""
        if self.impl == "gie":
            return _gie_config()
        return _precise_config("http://%s" % _address(ENGINES[0])) if mode == "precise" else _approximate_config()

    def epp(self, config, secure=False):
        for plugin in config.get("plugins") or []:
            discovery = plugin.get("parameters", {}).get("kvEventsConfig", {}).get("podDiscoveryConfig")
            if discovery is not None:
                discovery["socketPort"] = self.port
        before = [len(r.subscriptions) for r in self.relays]
        binary, impl = epp_under_test()
        endpoints = [(e["instance"], e["host"], e["port"]) for e in ENGINES]
        name = "epp-%d" % len(self.epps)
        if impl != "gie":
            config = file_discovery(config, endpoints, self.folder, name)
        epp = EPP(binary, config, endpoints, self.folder, secure=secure, name=name, impl=impl, pool=POOL, kubeconfig=self.kubeconfig,
                  namespace=NAMESPACE)
        self.epps.append(epp)
        epp.start()
        if impl == "gie":
            epp.wait_ready_pods(len(ENGINES), POOL)   # it reconciled the InferencePool and both pods
        epp.subscriptions_before = before
        return epp

    def params(self, server, requests, **extra):
        params = {"epp": {"address": server.address}, "model": MODEL, "settle": 2.0, "timeout": 300.0, "requests": requests,
                  "engines": [{"name": e["instance"], "url": "http://%s" % _address(e), "endpoint": "tcp://%s:%d" % (e["host"], self.port),
                               "topic": kv_topic(e["host"], e["port"], MODEL), "replay_endpoint": "tcp://127.0.0.1:%d" % e["replay_port"]}
                              for e in ENGINES]}
        params.update(extra)
        return params

    def warm(self, epp, engine, prompt, through_epp=False, tls=None):
        """A callable for ``run(warm=...)``: once the EPP and the check subscribe, the engine computes the prompt; with
        ``through_epp`` the EPP routes it there first (a gateway's subset hint of that one endpoint), as it learns a prefix
        from its own picks only."""
        def warm():
            precise = any(p.get("type") == "precise-prefix-cache-producer" for p in epp.config.get("plugins") or [])
            # The check's subscription, and the EPP's when it reads KV events, reached every relay.
            wait_subscribed(self.relays, [before + (2 if precise else 1) for before in epp.subscriptions_before])
            if through_epp:
                body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 1}).encode()
                picked = ask_pick(epp.address, body, subset=[_address(engine)], **(tls or {}))["picked"]
                assert picked == _address(engine), (picked, _address(engine))
            complete(engine, prompt)
        return warm

    def close(self):
        for epp in self.epps:
            epp.stop()
        for relay in self.relays:
            relay.stop()


def complete(engine, prompt):
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0}).encode()
    req = urllib.request.Request("http://%s/v1/completions" % _address(engine), data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def prefix(tag):
    """A long shared context (about 15 blocks of 32 tokens), distinct from its first words on."""
    return "%s context. " % tag.capitalize() + " ".join("%s%d" % (tag, i) for i in range(120)) + ". "


@pytest.fixture(scope="module")
def lane(capsys_disabled_print):
    binary, impl = epp_under_test()   # fail (or skip) first when there is no EPP: nothing is started
    capsys_disabled_print("EPP under test: %s." % _which_epp(impl, binary))
    if not os.path.exists(ENGINE_PYTHON) and os.environ.get("LOCAL_ENGINE_START") != "1":
        skip_or_fail("No engine installation at %s (run `make site`, or set LOCAL_ENGINE_START=1): these tests need it." % ENGINE_PYTHON)
    os.makedirs(STATE_DIR, exist_ok=True)
    with open(os.path.join(STATE_DIR, ".pytest.lock"), "w") as lock:  # the lock of the other engine test modules
        fcntl.flock(lock, fcntl.LOCK_EX)
        folder = tempfile.mkdtemp(prefix="epp-route-")
        here = None
        try:
            here = Lane(folder, impl)
            start = playbook("playbooks/kv_index.yml", "-e", "kv_index_run_check=false", *ENGINE_VARS)
            assert start.returncode == 0, start.stdout[-3000:]
            if impl == "gie":
                here.start_pool()
            yield here
        finally:
            if here is not None:
                here.close()
                if here.pool is not None:
                    here.pool.delete()
            stop = playbook("playbooks/kv_index.yml", "-e", "kv_index_state=absent", *ENGINE_VARS)
            stopped = _kwok(folder, "-e", "kwok_cluster_state=absent") if impl == "gie" else None
            shutil.rmtree(folder, ignore_errors=True)
            fcntl.flock(lock, fcntl.LOCK_UN)
            assert stop.returncode == 0, stop.stdout[-3000:]
            assert stopped is None or stopped.returncode == 0, stopped.stdout[-3000:]


@pytest.fixture(scope="module")
def capsys_disabled_print(pytestconfig):
    """Print a line into pytest's output as it runs (not captured), e.g. which EPP the tests ran."""
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")

    def say(line):
        with capture.global_and_fixture_disabled():
            sys.stdout.write("\n%s\n" % line)
    return say


def _route(lane_, server, warmed, tag, through_epp=False, **extra):
    """Warm ``warmed`` with the prefix (through the EPP, for one that learns from its picks), then ask the EPP about the
    same prefix (another question) and a cold prompt."""
    check = RouteCheck(lane_.params(server, [{"name": "warm", "prompt": prefix(tag) + "Second question: why?"},
                                             {"name": "cold", "prompt": "Cold %s: two plus two?" % tag}], **extra))
    tls = dict((k, extra["epp"][k]) for k in ("tls", "validate_certs")) if "epp" in extra else None
    return check.run(warm=lane_.warm(server, warmed, prefix(tag) + "First question: what?", through_epp=through_epp, tls=tls))


def _assert_pick(facts, engine):
    warm, cold = facts["picks"]
    assert warm["engine"] == engine["instance"] and warm["picked"] == _address(engine), facts["picks"]
    assert warm["longest"] == [engine["instance"]] and warm["longest_tokens"] >= 8 * BLOCK_SIZE, facts["picks"]
    assert cold["longest_tokens"] == 0 and cold["holds_longest"], facts["picks"]
    assert (facts["requests"], facts["holds_longest"], facts["warm_requests"], facts["warm_holds_longest"]) == (2, 2, 1, 1), facts


@pytest.mark.parametrize("warmed", [0, 1], ids=["engine-a", "engine-b"])
def test_epp_picks_the_engine_holding_the_prefix(lane, warmed):  # pylint: disable=redefined-outer-name
    """llm-d: precise, warmed behind its back (it learns from the engine's KV events). GIE: approximate, warmed through
    itself (the request it routed there): either way its next pick for the prefix is the engine that holds it."""
    engine = ENGINES[warmed]
    epp = lane.epp(lane.config("precise"))
    try:
        facts = _route(lane, epp, engine, "%s%d" % (lane.impl.replace("-", ""), warmed), through_epp=lane.impl == "gie")
    finally:
        epp.stop()
    _assert_pick(facts, engine)


def test_approximate_epp_misses_a_prefix_cached_behind_its_back(lane):  # pylint: disable=redefined-outer-name
    """The approximate producer learns from its own picks only: it sends the prefix where it routed it before."""
    epp = lane.epp(lane.config("approximate"))
    try:
        tag = "approx"
        first = ask_pick(epp.address, json.dumps({"model": MODEL, "prompt": prefix(tag) + "Zeroth question: who?", "max_tokens": 1}).encode())
        routed = [e for e in ENGINES if _address(e) == first["picked"]]
        assert routed, first
        behind = [e for e in ENGINES if e is not routed[0]][0]   # the engine the EPP did not pick computes the prefix
        with pytest.raises(CheckError) as caught:
            _route(lane, epp, behind, tag)
    finally:
        epp.stop()
    error = caught.value
    assert re.match(r"The EPP picked %s \(%s\) for request warm, which holds 0 cached tokens of its prompt, while %s held \d+, "
                    r"the longest cached prefix by the engines' KV events \(1 of 2 picks missed it\); check that the router runs "
                    r"precise prefix-cache scoring and receives these engines' events\.$" % (
                        routed[0]["instance"], re.escape(_address(routed[0])), behind["instance"]), error.msg), error.msg
    warm = error.facts["picks"][0]
    assert warm["engine"] == routed[0]["instance"] and warm["longest"] == [behind["instance"]], error.facts["picks"]
    assert error.facts["warm_requests"] == 1 and error.facts["warm_holds_longest"] == 0, error.facts


def test_epp_over_tls(lane):  # pylint: disable=redefined-outer-name
    """The EPP's default, --secure-serving=true (its self-signed certificate): the check speaks TLS without verifying it."""
    engine = ENGINES[0]
    epp = lane.epp(lane.config("precise") if lane.impl == "gie" else _precise_config("http://%s" % _address(ENGINES[1])), secure=True)
    try:
        with pytest.raises(CheckError, match=r"Cannot reach the EPP's ext_proc service at .*\(the EPP's default, --secure-serving=true: set tls true\)\.$"):
            ask_pick(epp.address, b"{}", timeout=10)   # plain gRPC to the TLS port: the sentence says to set tls true
        facts = _route(lane, epp, engine, "tls", through_epp=lane.impl == "gie", epp={"address": epp.address, "tls": True, "validate_certs": False})
    finally:
        epp.stop()
    _assert_pick(facts, engine)


# -- the builds: waited on under their lock, never looked for too early (issue 42) ---------------------------------------
# Another run building the GIE EPP, as go_build does (vars/go_builds.yml: under the lock beside the folder, a rename into
# place at the end): it holds the lock for a while, then puts its build there.
_BUILDER = """
import fcntl, os, sys, time
dest, hold = sys.argv[1], float(sys.argv[2])
with open(dest + ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    print("locked", flush=True)
    time.sleep(hold)
    partial = dest + ".partial"
    os.makedirs(os.path.join(partial, "crds"))
    with open(os.path.join(partial, "epp"), "w") as out:
        out.write("#!/bin/sh\\n# the other run's build\\n")
    os.chmod(os.path.join(partial, "epp"), 0o755)
    with open(os.path.join(partial, "crds", "inferencepool.yaml"), "w") as out:
        out.write("kind: CustomResourceDefinition\\n")
    os.rename(partial, dest)
"""


def _stand_in(folder, *binaries):
    os.makedirs(folder, exist_ok=True)
    for name in binaries:
        path = os.path.join(folder, name)
        with open(path, "w") as out:
            out.write("#!/bin/sh\nexit 0\n")
        os.chmod(path, 0o755)


def test_a_gie_build_in_progress_is_waited_on_not_looked_for(tmp_path, monkeypatch):
    """On a fresh machine make test's builds lane may still be building the GIE EPP when the engine lane reaches these
    tests (issue 42: they errored at setup, "No EPP binary given and none at ..."). The fixture's go_builds waits on the
    build's lock and then finds the other run's build: nothing is built twice, and nothing is looked for too early."""
    import yaml  # pylint: disable=import-outside-toplevel
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "vars", "pinned_versions.yml")) as handle:
        tools = yaml.safe_load(handle)["tools"]
    home = tmp_path / "home"
    builds = home / ".cache" / "inference_cache" / "kwok_cluster" / "bin"
    # Every other build the fixture asks for is there (stand-ins): only the GIE EPP is in progress.
    _stand_in(str(builds / ("kubernetes-" + tools["kubernetes"])), "kube-apiserver", "kube-controller-manager", "kube-scheduler")
    _stand_in(str(builds / ("etcd-" + tools["etcd"])), "etcd")
    _stand_in(str(builds / ("kwok-" + tools["kwok"])), "kwok")
    _stand_in(str(builds / ("kwok-" + tools["kwok"]) / "stages"), "node-initialize.yaml", "node-heartbeat-with-lease.yaml",
              "pod-ready.yaml", "pod-complete.yaml", "pod-delete.yaml")
    _stand_in(str(builds / ("controller-gen-" + tools["controller_tools"])), "controller-gen")
    hold = 20
    gie = builds / ("gie-" + tools["gateway_api_inference_extension"])
    builder = subprocess.Popen([sys.executable, "-c", _BUILDER, str(gie), str(hold)], stdout=subprocess.PIPE, text=True)
    try:
        assert builder.stdout.readline().strip() == "locked"
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.setenv("ANSIBLE_ASYNC_DIR", str(home / ".ansible_async"))
        monkeypatch.setenv("LOCAL_ENGINE_REQUIRED", "1")   # as make engine runs it: a missing EPP fails, never skips
        monkeypatch.delenv("SUBSTRATE_EPP_BINARY", raising=False)
        monkeypatch.setattr(sys.modules[__name__], "_RESOLVED", {})
        path, impl, why = resolve_epp()
        assert path is None and "No GIE EPP" in why, (path, impl, why)   # where the fixture stopped before issue 42
        started = time.monotonic()
        path, impl = epp_under_test()
        waited = time.monotonic() - started
        assert builder.wait(timeout=60) == 0
        assert waited >= hold - 5, "the fixture did not wait on the build's lock (%.1f s)" % waited
        assert (path, impl) == (str(gie / "epp"), "gie")
        with open(path) as handle:
            assert "the other run's build" in handle.read()   # the other run's build, not one of its own
        assert (gie / "inferencepool-crds.yaml").is_file()     # and the role assembled its CRDs as for its own build
    finally:
        builder.kill()
        builder.wait()
