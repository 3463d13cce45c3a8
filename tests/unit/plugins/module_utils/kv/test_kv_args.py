# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""kv/args.py: the option tables the KV checks share (a KV-event stream, an engine of a check over several engines)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import re

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.errors import CheckError
from ansible_collections.inference_cache.substrate.plugins.module_utils.common.options import validate
from ansible_collections.inference_cache.substrate.plugins.module_utils.http.args import HTTP_ARG_SPEC
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import args as A


@pytest.mark.parametrize("endpoint, ok", [("tcp://127.0.0.1:5557", True), ("ipc:///tmp/kv", True), ("inproc://kv", True),
                                          ("127.0.0.1:5557", False), ("http://x:1", False), ("tcp:// x", False)])
def test_the_endpoint_shape(endpoint, ok):
    assert bool(re.match(A.ENDPOINT_SHAPE[0], endpoint)) is ok


def test_an_engine_carries_the_http_options_and_a_stream():
    assert all(A.ENGINE_ARG_SPEC[name] == spec for name, spec in HTTP_ARG_SPEC.items())
    assert {"url", "endpoint", "socket_mode", "topic", "replay_endpoint"} <= set(A.ENGINE_ARG_SPEC)
    got = validate({"engines": {"type": "list", "elements": "dict", "options": A.ENGINE_ARG_SPEC}},
                   {"engines": [{"url": "http://127.0.0.1:8000", "endpoint": "tcp://127.0.0.1:5557"}]})
    assert got["engines"][0]["socket_mode"] == "connect"


def test_a_stream_with_a_wrong_endpoint_is_one_sentence():
    with pytest.raises(CheckError, match=r"^endpoint must be a ZMQ endpoint such as tcp://HOST:PORT"):
        validate(A.KV_STREAM_ARG_SPEC, {"endpoint": "127.0.0.1:5557"})
    assert validate(A.KV_STREAM_ARG_SPEC, {"endpoint": "tcp://127.0.0.1:5557"})["data_parallel_size"] == 1
