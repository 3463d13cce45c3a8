# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""The wiring contract between an engine's KV-event publisher and its subscribers (pure Python, no Ansible).

Defined once here and handed to the roles by the ``inference_cache.substrate.kv_topic``, ``kv_subscriber``,
``kv_engine_binds`` and ``router_version`` filters (``plugins/filter/wiring.py``):

* the router version the collection pins (``ROUTER_VERSION``; ``vars/pinned_versions.yml`` pins the EPP image and
  chart of the same release, and a unit test holds the two together);
* the topic form ``<prefix>@<host>:<port>@<model>``: the llm-d router takes an engine's identity (pod id) and its
  model from the topic alone (llm-d/llm-d-kv-cache@v0.9.0:pkg/kvevents/engineadapter/common.go splits it at ``@``);
* vLLM's bind-or-connect rule: the publisher binds an endpoint holding ``*`` or ``::`` or an ipc/inproc one and
  connects to any other (vllm@v0.32.0:vllm/distributed/kv_events.py ``_is_bind_endpoint``), so a subscriber
  connects to a binding engine and binds for a connecting one;
* what a subscriber needs of an engine (``subscriber()``): the endpoint to dial or bind, the socket mode, the
  topic, the replay endpoint and the block size, the shape every role that starts an engine publishes.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

ROUTER_VERSION = "v0.9.0"
ROUTER_VERSIONS = (ROUTER_VERSION,)
# The routers the collection deploys (router_impl) and the version of each it pins: the llm-d router (its EPP reads
# KV events) and the Gateway API Inference Extension's own EPP (sigs.k8s.io/gateway-api-inference-extension cmd/epp,
# the base llm-d's extends; approximate prefix-cache scoring only, no KV events).
GIE_VERSION = "v1.4.0"
ROUTER_IMPLS = {"llm-d": ROUTER_VERSION, "gie": GIE_VERSION}
DEFAULT_ROUTER_IMPL = "llm-d"
TOPIC_PREFIX = "kv"
WILDCARDS = ("*", "::")


def kv_topic(host, port, model, prefix=TOPIC_PREFIX):
    """The topic an engine publishes under: ``<prefix>@<host>:<port>@<model>`` (the router's pod id is host:port)."""
    return "%s@%s:%s@%s" % (prefix, host, port, model)


def split_topic(topic):
    """``(prefix, pod, model)`` of a topic of the llm-d form, or None when it has another shape."""
    parts = (topic or "").split("@")
    if len(parts) != 3:
        return None
    return parts[0], parts[1], parts[2]


def topic_pod(topic):
    """The pod id of a ``<prefix>@<pod>@<model>`` topic (the whole topic when it has another shape)."""
    parts = split_topic(topic)
    return parts[1] if parts else topic


def topic_filter(topic):
    """The subscription prefix that takes every engine of a topic's form: ``kv@`` for ``kv@10.0.0.1:8000@m``."""
    return (topic or TOPIC_PREFIX).split("@")[0] + "@"


def engine_binds(endpoint):
    """Whether vLLM's publisher binds ``endpoint`` (True) or connects to it (False)."""
    endpoint = endpoint or ""
    return any(w in endpoint for w in WILDCARDS) or endpoint.startswith(("ipc://", "inproc://"))


def subscriber_mode(endpoint):
    """The subscriber's socket mode for an engine publishing on ``endpoint``: connect to a binder, bind for a connector."""
    return "connect" if engine_binds(endpoint) else "bind"


def dial_endpoint(endpoint, host="127.0.0.1"):
    """The address a subscriber dials for an engine that binds ``endpoint`` (a wildcard host becomes ``host``)."""
    endpoint = endpoint or ""
    scheme, sep, rest = endpoint.partition("://")
    if not sep or scheme != "tcp":
        return endpoint
    where, colon, port = rest.rpartition(":")
    if colon and where in ("*", "[::]", "::", ""):
        return "tcp://%s:%s" % (host, port)
    return endpoint


def subscriber(endpoint, topic="", replay_endpoint=None, block_size=None, host="127.0.0.1"):
    """What a subscriber needs of one engine: ``{endpoint, socket_mode, topic, replay_endpoint, block_size}``.

    ``endpoint`` and ``replay_endpoint`` are the engine's own (as in its --kv-events-config); ``host`` is where a
    subscriber reaches an engine that binds a wildcard address. An empty replay endpoint is None.
    """
    return {
        "endpoint": dial_endpoint(endpoint, host) if engine_binds(endpoint) else endpoint,
        "socket_mode": subscriber_mode(endpoint),
        "topic": topic or "",
        "replay_endpoint": dial_endpoint(replay_endpoint, host) if replay_endpoint else None,
        "block_size": int(block_size) if block_size not in (None, "") else None,
    }
