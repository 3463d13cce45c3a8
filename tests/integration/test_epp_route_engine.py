# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""epp_route_check against the real llm-d EPP (pinned version) over two real vLLM CPU engines.

Two engines through ``playbooks/kv_index.yml`` (instances ``eppr-a`` on 127.0.0.1:8310 and ``eppr-b`` on
127.0.0.2:8311, with ``--enable-scale-out`` so the EPP's token producer gets the engines' own tokens from
``/v1/completions/render``). Each engine connects to its KV-event endpoint; a relay (tools/_epp_local.py)
binds it and republishes at ``tcp://<engine address>:<one common port>``, the endpoint the EPP's precise producer dials
(``podDiscoveryConfig.socketPort``) and the check subscribes to. The EPP runs with ``file-discovery`` over the two
engines and the scheduling of what the router role renders (roles/router/vars/main.yml ``_router_precise_config`` and
``_router_approximate_config``, with the role's default weights).

The EPP binary: ``SUBSTRATE_EPP_BINARY``, else ``go install`` of the pinned version (skipped with the reason when the
Go module proxy refuses it). The engines need the installation (``make site``, or ``LOCAL_ENGINE_START=1`` installs it);
without it the tests skip, or fail under ``LOCAL_ENGINE_REQUIRED=1``.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import fcntl
import json
import os
import re
import sys
import tempfile
import urllib.request

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.errors import CheckError
from ansible_collections.inference_cache.substrate.plugins.module_utils.common.wiring import kv_topic, topic_filter
from ansible_collections.inference_cache.substrate.plugins.module_utils.epp.extproc import ask_pick
from ansible_collections.inference_cache.substrate.plugins.module_utils.epp.route_check import RouteCheck

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _engine_lane import ENGINE_PYTHON, STATE_DIR, playbook, skip_or_fail  # noqa: E402  pylint: disable=wrong-import-position
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools"))
from _epp_local import EPP, Relay, free_port, resolve_binary, wait_subscribed  # noqa: E402  pylint: disable=wrong-import-position

MODEL, BLOCK_SIZE, HASH_SEED = "tiny", 32, "0"   # the local_engine role's defaults
ENGINES = [
    {"instance": "eppr-a", "host": "127.0.0.1", "port": 8310, "kv_events_port": 5710, "replay_port": 5711},
    {"instance": "eppr-b", "host": "127.0.0.2", "port": 8311, "kv_events_port": 5712, "replay_port": 5713},
]
_RESOLVED = {}


def epp_binary():
    """The EPP binary to test with (tools/_epp_local.resolve_binary), or skip with its reason in one sentence."""
    if "path" not in _RESOLVED:
        _RESOLVED["path"], _RESOLVED["why"] = resolve_binary()
    if not _RESOLVED["path"]:
        pytest.skip(_RESOLVED["why"])
    return _RESOLVED["path"]


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


class Lane:
    """The two engines, their relays and the common KV-event port; EPPs are started per test."""

    def __init__(self, folder):
        self.folder = folder
        self.port = free_port(*[e["host"] for e in ENGINES])
        self.relays = [Relay("tcp://127.0.0.1:%d" % e["kv_events_port"], "tcp://%s:%d" % (e["host"], self.port)) for e in ENGINES]
        self.epps = []

    def epp(self, config, secure=False):
        for plugin in config["plugins"]:
            discovery = plugin.get("parameters", {}).get("kvEventsConfig", {}).get("podDiscoveryConfig")
            if discovery is not None:
                discovery["socketPort"] = self.port
        before = [len(r.subscriptions) for r in self.relays]
        epp = EPP(epp_binary(), config, [(e["instance"], e["host"], e["port"]) for e in ENGINES], self.folder, secure=secure,
                  name="epp-%d" % len(self.epps))
        self.epps.append(epp)
        epp.start()
        epp.subscriptions_before = before
        return epp

    def params(self, server, requests, **extra):
        params = {"epp": {"address": server.address}, "model": MODEL, "settle": 2.0, "timeout": 300.0, "requests": requests,
                  "engines": [{"name": e["instance"], "url": "http://%s" % _address(e), "endpoint": "tcp://%s:%d" % (e["host"], self.port),
                               "topic": kv_topic(e["host"], e["port"], MODEL), "replay_endpoint": "tcp://127.0.0.1:%d" % e["replay_port"]}
                              for e in ENGINES]}
        params.update(extra)
        return params

    def warm(self, epp, engine, prompt):
        """A callable for ``run(warm=...)``: once the EPP and the check subscribe, the engine computes the prompt."""
        def warm():
            precise = any(p.get("type") == "precise-prefix-cache-producer" for p in epp.config["plugins"])
            # The check's subscription, and the EPP's when it reads KV events, reached every relay.
            wait_subscribed(self.relays, [before + (2 if precise else 1) for before in epp.subscriptions_before])
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
def lane():
    epp_binary()   # skip first when there is no EPP: nothing is started
    if not os.path.exists(ENGINE_PYTHON) and os.environ.get("LOCAL_ENGINE_START") != "1":
        skip_or_fail("No engine installation at %s (run `make site`, or set LOCAL_ENGINE_START=1): these tests need it." % ENGINE_PYTHON)
    os.makedirs(STATE_DIR, exist_ok=True)
    with open(os.path.join(STATE_DIR, ".pytest.lock"), "w") as lock:  # the lock of the other engine test modules
        fcntl.flock(lock, fcntl.LOCK_EX)
        folder = tempfile.mkdtemp(prefix="epp-route-")
        here = None
        try:
            here = Lane(folder)
            start = playbook("playbooks/kv_index.yml", "-e", "kv_index_run_check=false", *ENGINE_VARS)
            assert start.returncode == 0, start.stdout[-3000:]
            yield here
        finally:
            if here is not None:
                here.close()
            stop = playbook("playbooks/kv_index.yml", "-e", "kv_index_state=absent", *ENGINE_VARS)
            fcntl.flock(lock, fcntl.LOCK_UN)
            assert stop.returncode == 0, stop.stdout[-3000:]


def _route(lane_, server, warmed, tag, **extra):
    """Warm ``warmed`` with the prefix, then ask the EPP about the same prefix (another question) and a cold prompt."""
    check = RouteCheck(lane_.params(server, [{"name": "warm", "prompt": prefix(tag) + "Second question: why?"},
                                             {"name": "cold", "prompt": "Cold %s: two plus two?" % tag}], **extra))
    return check.run(warm=lane_.warm(server, warmed, prefix(tag) + "First question: what?"))


def _assert_pick(facts, engine):
    warm, cold = facts["picks"]
    assert warm["engine"] == engine["instance"] and warm["picked"] == _address(engine), facts["picks"]
    assert warm["longest"] == [engine["instance"]] and warm["longest_tokens"] >= 8 * BLOCK_SIZE, facts["picks"]
    assert cold["longest_tokens"] == 0 and cold["holds_longest"], facts["picks"]
    assert (facts["requests"], facts["holds_longest"], facts["warm_requests"], facts["warm_holds_longest"]) == (2, 2, 1, 1), facts


@pytest.mark.parametrize("warmed", [0, 1], ids=["engine-a", "engine-b"])
def test_precise_epp_picks_the_engine_holding_the_prefix(lane, warmed):  # pylint: disable=redefined-outer-name
    engine = ENGINES[warmed]
    epp = lane.epp(_precise_config("http://%s" % _address(ENGINES[0])))
    try:
        facts = _route(lane, epp, engine, "precise%d" % warmed)
    finally:
        epp.stop()
    _assert_pick(facts, engine)


def test_approximate_epp_misses_a_prefix_cached_behind_its_back(lane):  # pylint: disable=redefined-outer-name
    """The approximate producer learns from its own picks only: it sends the prefix where it routed it before."""
    epp = lane.epp(_approximate_config())
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


def test_precise_epp_over_tls(lane):  # pylint: disable=redefined-outer-name
    """The EPP's default, --secure-serving=true (its self-signed certificate): the check speaks TLS without verifying it."""
    engine = ENGINES[0]
    epp = lane.epp(_precise_config("http://%s" % _address(ENGINES[1])), secure=True)
    try:
        with pytest.raises(CheckError, match=r"Cannot reach the EPP's ext_proc service at .*\(the EPP's default, --secure-serving=true: set tls true\)\.$"):
            ask_pick(epp.address, b"{}", timeout=10)   # plain gRPC to the TLS port: the sentence says to set tls true
        facts = _route(lane, epp, engine, "tls", epp={"address": epp.address, "tls": True, "validate_certs": False})
    finally:
        epp.stop()
    _assert_pick(facts, engine)
