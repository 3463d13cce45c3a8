# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The wiring filters the roles use (plugins/filter/wiring.py), as the roles call them, through Jinja and directly."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import jinja2
import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.inference_cache.substrate.plugins.filter import wiring as F
from ansible_collections.inference_cache.substrate.plugins.module_utils.common import wiring

PREFIX = "inference_cache.substrate."


def render(template, **variables):
    """Render ``template`` with the collection's filters under their full names, as a role does (Jinja reads dotted names)."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters.update(dict((PREFIX + name, fn) for name, fn in F.FilterModule().filters().items()))
    return env.from_string(template).render(**variables)


def test_the_plugin_offers_the_five_filters():
    assert sorted(F.FilterModule().filters()) == ["kv_engine_binds", "kv_subscriber", "kv_topic", "kv_topic_filter", "router_version"]


def test_kv_topic_builds_the_form():
    assert render("{{ model | inference_cache.substrate.kv_topic(host, port) }}", model="tiny", host="127.0.0.1", port=8000) \
        == "kv@127.0.0.1:8000@tiny"
    assert render("{{ 'm' | inference_cache.substrate.kv_topic('$(POD_IP)', 8000, 'engines') }}") == "engines@$(POD_IP):8000@m"
    assert F.kv_topic("m", "h", 1, "") == "kv@h:1@m", "an empty prefix is the default one"


@pytest.mark.parametrize("model, host, port", [("", "h", 1), ("m", "", 1), ("m", "h", ""), (None, "h", 1)])
def test_kv_topic_refuses_a_missing_part_with_one_sentence(model, host, port):
    with pytest.raises(AnsibleFilterError, match="^kv_topic needs a model, a host and a port, got "):
        F.kv_topic(model, host, port)


def test_kv_topic_filter():
    assert render("{{ 'kv@10.0.0.1:8000@m' | inference_cache.substrate.kv_topic_filter }}") == "kv@"
    assert render("{{ '' | inference_cache.substrate.kv_topic_filter }}") == "kv@"
    assert F.kv_topic_filter("engines@a:1@m") == "engines@"


@pytest.mark.parametrize("endpoint, binds", [("tcp://*:5557", True), ("tcp://[::]:5557", True), ("ipc:///tmp/kv", True),
                                             ("tcp://0.0.0.0:5557", False), ("tcp://127.0.0.1:5557", False)])
def test_kv_engine_binds_is_vllms_rule(endpoint, binds):
    assert F.kv_engine_binds(endpoint) is binds
    assert render("{{ e | inference_cache.substrate.kv_engine_binds }}", e=endpoint) == str(binds)


def test_kv_subscriber_as_the_local_engine_calls_it():
    sub = F.kv_subscriber("tcp://127.0.0.1:5557", "kv@127.0.0.1:8000@tiny", "tcp://127.0.0.1:5558", 32, "127.0.0.1")
    assert sub == {"endpoint": "tcp://127.0.0.1:5557", "socket_mode": "bind", "topic": "kv@127.0.0.1:8000@tiny",
                   "replay_endpoint": "tcp://127.0.0.1:5558", "block_size": 32}


def test_kv_subscriber_as_model_server_calls_it():
    sub = F.kv_subscriber("tcp://*:5557", "kv@$(POD_IP):8000@m", None, "32", "model-server-kv-events.ns.svc.cluster.local")
    assert sub == {"endpoint": "tcp://model-server-kv-events.ns.svc.cluster.local:5557", "socket_mode": "connect",
                   "topic": "kv@$(POD_IP):8000@m", "replay_endpoint": None, "block_size": 32}


def test_kv_subscriber_empty_replay_and_host():
    sub = F.kv_subscriber("tcp://[::]:5557", "t", "", None, "")
    assert sub["endpoint"] == "tcp://127.0.0.1:5557" and sub["socket_mode"] == "connect"
    assert sub["replay_endpoint"] is None and sub["block_size"] is None


@pytest.mark.parametrize("endpoint", ["", None, "127.0.0.1:5557", 5557])
def test_kv_subscriber_refuses_what_is_no_endpoint(endpoint):
    with pytest.raises(AnsibleFilterError, match=r"^kv_subscriber needs the engine's KV-event endpoint \(such as tcp://\*:5557\), got "):
        F.kv_subscriber(endpoint)


def test_router_version_is_the_pinned_one():
    assert F.router_version() == F.router_version("anything") == wiring.ROUTER_VERSION == "v0.9.0"
    assert render("{{ '' | inference_cache.substrate.router_version }}") == wiring.ROUTER_VERSION
