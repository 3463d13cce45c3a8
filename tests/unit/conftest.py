# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Shared fixtures for the KV-event unit tests: a ZMQ context and an in-process synthetic publisher."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import itertools
import os
import threading

import pytest
import zmq

_COUNTER = itertools.count()

# ansible-test units loads its plugin ansible_pytest_collections in every pytest process, the xdist workers included; the
# plugin reads ANSIBLE_COLLECTIONS_PATH once, at import, as the one folder that holds ansible_collections/. pytest-ansible
# (installed beside it for molecule and the integration tests) rewrites that variable in pytest_configure, where it finds
# galaxy.yml, to its own ./collections tree and ~/.ansible/collections. The workers start after configure and inherit the
# rewritten value, so ansible-test's plugin there places no file of this collection, no worker starts, and ansible-test
# reports "no tests ran" with exit 0. This conftest loads before pytest_configure (it is an initial conftest), keeps
# ansible-test's value, and gives it back after every other pytest_configure, before xdist starts the workers.
_ANSIBLE_TEST_COLLECTIONS_PATH = (os.environ.get("ANSIBLE_COLLECTIONS_PATH")
                                  if "ansible_pytest_collections" in os.environ.get("PYTEST_PLUGINS", "") else None)


@pytest.hookimpl(trylast=True)
def pytest_configure(config):  # pylint: disable=unused-argument
    if _ANSIBLE_TEST_COLLECTIONS_PATH is not None:
        os.environ["ANSIBLE_COLLECTIONS_PATH"] = _ANSIBLE_TEST_COLLECTIONS_PATH


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

    from ansible_collections.inference_cache.substrate.tests.harness import kv_synthetic as synth  # pylint: disable=import-outside-toplevel

    def make(endpoint, bind=True, replay_endpoint=None, topic="", wire_format="vllm-map", replay_topic=True, rank=0,
             hash_kind="int", **run_kwargs):
        pub = synth.SyntheticPublisher(endpoint, bind=bind, replay_endpoint=replay_endpoint, topic=topic, wire_format=wire_format,
                                       replay_topic=replay_topic, rank=rank, hash_kind=hash_kind, ctx=zctx)
        run_kwargs.setdefault("count", 6)
        run_kwargs.setdefault("interval", 0.02)
        # Bounds, not delays: the publisher starts once a subscription arrived, and serves replay until the test is done.
        run_kwargs.setdefault("wait_subscriber", 60.0)
        run_kwargs.setdefault("linger", 60.0)
        return PublisherThread(pub, run_kwargs)

    return make
