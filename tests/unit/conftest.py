# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Shared fixtures for the KV-event unit tests: a ZMQ context and an in-process synthetic publisher."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import itertools
import threading

import pytest
import zmq

_COUNTER = itertools.count()


@pytest.fixture
def zctx():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture
def inproc():
    """Unique inproc endpoint names: (pub, replay)."""
    num = next(_COUNTER)
    return "inproc://kv-%d" % num, "inproc://kv-replay-%d" % num


class PublisherThread(object):
    def __init__(self, pub, run_kwargs):
        self.pub = pub
        self.stop = threading.Event()
        self.sent = None
        kwargs = dict(run_kwargs, stop=self.stop)
        self.thread = threading.Thread(target=self._run, args=(kwargs,), daemon=True)

    def _run(self, kwargs):
        try:
            self.sent = self.pub.run(**kwargs)
        finally:
            self.pub.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)


@pytest.fixture
def publisher(zctx):
    """publisher(endpoint, bind=..., replay_endpoint=..., count=..., **run kwargs) -> context manager running it in a thread."""

    from ansible_collections.inference_cache.substrate.tools import _kv_synthetic as synth  # pylint: disable=import-outside-toplevel

    def make(endpoint, bind=True, replay_endpoint=None, topic="", wire_format="vllm-map", replay_topic=True, rank=0,
             hash_kind="int", **run_kwargs):
        pub = synth.SyntheticPublisher(endpoint, bind=bind, replay_endpoint=replay_endpoint, topic=topic, wire_format=wire_format,
                                       replay_topic=replay_topic, rank=rank, hash_kind=hash_kind, ctx=zctx)
        run_kwargs.setdefault("count", 6)
        run_kwargs.setdefault("interval", 0.02)
        run_kwargs.setdefault("wait_subscriber", 5.0)
        run_kwargs.setdefault("linger", 5.0)
        return PublisherThread(pub, run_kwargs)

    return make
