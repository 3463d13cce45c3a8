# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The wiring contract (plugins/module_utils/common/wiring.py): topic form, vLLM's bind rule, what a subscriber needs,
and the router version the pins follow."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import os

import pytest
import yaml

from ansible_collections.inference_cache.substrate.plugins.module_utils.common import wiring

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "..")


def test_topic_form_is_prefix_pod_model():
    assert wiring.kv_topic("127.0.0.1", 8000, "tiny") == "kv@127.0.0.1:8000@tiny"
    assert wiring.kv_topic("$(POD_IP)", 8000, "Qwen/Qwen3-0.6B", "engines") == "engines@$(POD_IP):8000@Qwen/Qwen3-0.6B"


def test_split_topic_reads_back_what_kv_topic_builds():
    assert wiring.split_topic(wiring.kv_topic("10.0.0.1", 8000, "m")) == ("kv", "10.0.0.1:8000", "m")
    assert wiring.split_topic("kv@10.0.0.1") is None and wiring.split_topic("") is None and wiring.split_topic(None) is None
    assert wiring.topic_pod("kv@10.0.0.1:8000@m") == "10.0.0.1:8000"
    assert wiring.topic_pod("plain-topic") == "plain-topic"


@pytest.mark.parametrize("topic, prefix", [("kv@10.0.0.1:8000@m", "kv@"), ("engines@a:1@m", "engines@"), ("", "kv@"), (None, "kv@"),
                                           ("kv@user-topic", "kv@")])
def test_topic_filter_is_the_prefix_up_to_the_first_at(topic, prefix):
    assert wiring.topic_filter(topic) == prefix


# vllm@v0.32.0:vllm/distributed/kv_events.py _is_bind_endpoint: '*' or '::' in the endpoint, or ipc:// / inproc://.
@pytest.mark.parametrize("endpoint, binds", [
    ("tcp://*:5557", True),
    ("tcp://[::]:5557", True),
    ("ipc:///tmp/kv-events", True),
    ("inproc://kv", True),
    ("tcp://0.0.0.0:5557", False),   # all interfaces, but no wildcard: vLLM connects to it
    ("tcp://127.0.0.1:5557", False),
    ("tcp://model-server-kv.ns.svc.cluster.local:5557", False),
    ("", False),
    (None, False),
])
def test_bind_rule_is_vllms(endpoint, binds):
    assert wiring.engine_binds(endpoint) is binds
    assert wiring.subscriber_mode(endpoint) == ("connect" if binds else "bind")


@pytest.mark.parametrize("endpoint, dialled", [
    ("tcp://*:5557", "tcp://10.0.0.5:5557"),
    ("tcp://[::]:5557", "tcp://10.0.0.5:5557"),
    ("tcp://10.0.0.9:5557", "tcp://10.0.0.9:5557"),
    ("ipc:///tmp/kv", "ipc:///tmp/kv"),
])
def test_dial_endpoint_puts_the_host_in_place_of_a_wildcard(endpoint, dialled):
    assert wiring.dial_endpoint(endpoint, "10.0.0.5") == dialled


def test_subscriber_of_a_binding_engine_connects_to_its_host():
    assert wiring.subscriber("tcp://*:5557", "kv@$(POD_IP):8000@m", "tcp://*:5558", "32", "svc.ns.svc.cluster.local") == {
        "endpoint": "tcp://svc.ns.svc.cluster.local:5557", "socket_mode": "connect", "topic": "kv@$(POD_IP):8000@m",
        "replay_endpoint": "tcp://svc.ns.svc.cluster.local:5558", "block_size": 32}


def test_subscriber_of_a_connecting_engine_binds_its_endpoint():
    assert wiring.subscriber("tcp://127.0.0.1:5557", "kv@127.0.0.1:8000@tiny", "tcp://127.0.0.1:5558", 32) == {
        "endpoint": "tcp://127.0.0.1:5557", "socket_mode": "bind", "topic": "kv@127.0.0.1:8000@tiny",
        "replay_endpoint": "tcp://127.0.0.1:5558", "block_size": 32}
    # tcp://0.0.0.0 holds no wildcard: vLLM connects, so the subscriber binds (and dials nothing).
    assert wiring.subscriber("tcp://0.0.0.0:5557")["socket_mode"] == "bind"
    assert wiring.subscriber("tcp://0.0.0.0:5557")["endpoint"] == "tcp://0.0.0.0:5557"


def test_subscriber_without_replay_or_block_size_says_none():
    sub = wiring.subscriber("tcp://*:5557", "", "", "")
    assert sub["replay_endpoint"] is None and sub["block_size"] is None and sub["topic"] == ""
    assert sub["endpoint"] == "tcp://127.0.0.1:5557", "the default host is loopback"


def test_pinned_router_release_is_the_router_version():
    """The EPP image, the P/D sidecar and both router charts are pinned at the release whose behaviour the checks follow."""
    with open(os.path.join(ROOT, "vars", "pinned_versions.yml")) as handle:
        pins = yaml.safe_load(handle)
    assert wiring.ROUTER_VERSION in wiring.ROUTER_VERSIONS
    assert pins["images"]["epp"]["tag"] == wiring.ROUTER_VERSION
    assert pins["images"]["pd_sidecar"]["tag"] == wiring.ROUTER_VERSION
    assert pins["charts"]["llm_d_router_standalone"]["version"] == wiring.ROUTER_VERSION
    assert pins["charts"]["llm_d_router_gateway"]["version"] == wiring.ROUTER_VERSION
