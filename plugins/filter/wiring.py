# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Filters that hand the roles the KV-event wiring contract of ``plugins/module_utils/common/wiring.py``."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

from ansible.errors import AnsibleFilterError

from ansible_collections.inference_cache.substrate.plugins.module_utils.common import wiring


def kv_topic(model, host, port, prefix=wiring.TOPIC_PREFIX):
    """``model | inference_cache.substrate.kv_topic(host, port)`` -> ``kv@host:port@model``."""
    if model in (None, "") or host in (None, "") or port in (None, ""):
        raise AnsibleFilterError("kv_topic needs a model, a host and a port, got %r, %r, %r." % (model, host, port))
    return wiring.kv_topic(host, port, model, prefix or wiring.TOPIC_PREFIX)


def kv_topic_filter(topic):
    """``topic | inference_cache.substrate.kv_topic_filter`` -> the subscription prefix (``kv@``)."""
    return wiring.topic_filter(topic)


def kv_engine_binds(endpoint):
    """``endpoint | inference_cache.substrate.kv_engine_binds`` -> whether vLLM binds it."""
    return wiring.engine_binds(endpoint)


def kv_subscriber(endpoint, topic="", replay_endpoint=None, block_size=None, host="127.0.0.1"):
    """``engine_endpoint | inference_cache.substrate.kv_subscriber(topic, replay, block_size, host)`` -> what a subscriber needs."""
    if not isinstance(endpoint, str) or "://" not in endpoint:
        raise AnsibleFilterError("kv_subscriber needs the engine's KV-event endpoint (such as tcp://*:5557), got %r." % (endpoint,))
    return wiring.subscriber(endpoint, topic, replay_endpoint or None, block_size, host or "127.0.0.1")


def router_version(_unused=None):
    """``'' | inference_cache.substrate.router_version`` -> the llm-d router version the collection pins."""
    return wiring.ROUTER_VERSION


class FilterModule(object):
    def filters(self):
        return {
            "kv_topic": kv_topic,
            "kv_topic_filter": kv_topic_filter,
            "kv_engine_binds": kv_engine_binds,
            "kv_subscriber": kv_subscriber,
            "router_version": router_version,
        }
