# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The kv_index_check runner against two fake engines (real HTTP and ZMQ on 127.0.0.1, vLLM-like caching)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import contextlib
import importlib.util
import json
import os
import threading
import time

import pytest
import zmq

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.errors import CheckError
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import index_check as chk
from ansible_collections.inference_cache.substrate.plugins.module_utils.http.args import HTTP_ARG_SPEC
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.index import KVBlockIndex
from ansible_collections.inference_cache.substrate.tests.unit.plugins.kv_index_fake import FakeEngine
from ansible_collections.inference_cache.substrate.tests.unit.plugins.net_utils import free_port
from ansible_collections.inference_cache.substrate.tests.unit.plugins.sentences import assert_one_sentence
from ansible_collections.inference_cache.substrate.tools import _kv_synthetic as synth

WORKLOAD = {"families": 4, "rounds": 8, "preamble_words": 6, "prefix_words": 18, "suffix_words": 6}


@contextlib.contextmanager
def two_engines(num_blocks=24, **kwargs):
    engines = []
    with contextlib.ExitStack() as stack:
        for _i in range(2):
            port = free_port()
            topic = "kv@127.0.0.1:%d@tiny" % port
            engines.append(stack.enter_context(FakeEngine(port, "tcp://127.0.0.1:%d" % free_port(), topic, num_blocks=num_blocks,
                                                          **kwargs)))
        yield engines


def params(engines, **overrides):
    specs = [{"name": "engine-%d" % idx, "url": e.url, "endpoint": e.endpoint, "socket_mode": "connect", "topic": e.topic.decode()}
             for idx, e in enumerate(engines)]
    out = {"engines": specs, "workload": dict(WORKLOAD), "expect": {"min_requests": 30, "min_evictions_per_engine": 1},
           "settle": 0.05, "event_wait": 60.0, "timeout": 300.0, "request_timeout": 60.0, "max_tokens": 1}
    out.update(overrides)
    return out


def run(p):
    try:
        return True, chk.KVIndexCheck(p).run()
    except CheckError as exc:
        return False, exc


def test_exact_through_evictions_and_copies():
    with two_engines() as engines:
        ok, facts = run(params(engines))
        removed = [e.removed for e in engines]
        copies = [e.copies for e in engines]
    assert ok, facts.msg
    assert facts["requests"] >= 30 and facts["exact"] == facts["requests"] and facts["largest_error"] == 0
    assert facts["exact_percent"] == 100.0 and facts["mismatches"] == []
    assert all(r > 0 for r in removed) and sum(copies) > 0
    for name, engine in facts["engines"].items():
        assert engine["blocks_removed"] > 0 and engine["removed_unknown"] == 0, name
        assert engine["stores_skipped"] == 0 and engine["gaps_unrepaired"] == 0
    # The same events without counting copies (llm-d's Evict) get some predictions wrong; the approximate producer too.
    assert facts["uncounted"]["wrong"] > 0 and facts["uncounted"]["exact"] + facts["uncounted"]["wrong"] == facts["requests"]
    assert facts["approximate"]["predicted_hits"] > 0
    assert facts["routing"]["steps_on_every_engine"] > 0
    assert facts["routing"]["precise_agrees"] == facts["routing"]["steps_on_every_engine"]
    assert len(facts["summary"]) == 5 and facts["summary"][0].startswith("precise index (copies counted): %d/%d" % (
        facts["requests"], facts["requests"]))


def test_token_ids_stay_inside_and_a_topic_prefix_is_enough():
    with two_engines() as engines:
        p = params(engines, workload=dict(WORKLOAD, rounds=2), expect={"min_requests": 1})
        p["engines"][0]["topic"] = "kv@127.0.0.1:%d@" % engines[0].port
        ok, facts = run(p)
    assert ok, facts.msg
    assert "token_ids" not in repr(facts)

    def int_lists(value):
        if isinstance(value, dict):
            return [found for item in value.values() for found in int_lists(item)]
        if isinstance(value, (list, tuple)):
            if value and all(isinstance(item, int) for item in value):
                return [value]
            return [found for item in value for found in int_lists(item)]
        return []
    assert int_lists(facts) == []
    assert facts["engines"]["engine-0"]["batches"] > 0 and facts["engines"]["engine-0"]["other_topics"] == {}


def test_wrong_topic_fails_naming_family_engine_and_counts():
    with two_engines() as engines:
        p = params(engines)
        p["engines"][1]["topic"] = "kv@127.0.0.1:1@tiny"
        ok, exc = run(p)
    assert not ok
    msg = assert_one_sentence(exc.msg)
    assert "for prompt family family-" in msg and "on engine engine-1 but the engine reported" in msg
    assert "predicted 0 cached tokens" in msg
    assert "no KV events arrived under its topic prefix 'kv@127.0.0.1:1@tiny', but messages arrived under 'kv@127.0.0.1:%d@tiny'" % (
        engines[1].port) in msg
    assert exc.facts["mismatches"][0]["predicted"] == 0 and exc.facts["mismatches"][0]["reported"] > 0
    assert list(exc.facts["engines"]["engine-1"]["other_topics"]) == ["kv@127.0.0.1:%d@tiny" % engines[1].port]
    assert exc.facts["engines"]["engine-1"]["batches"] == 0


def test_stopped_subscription_fails():
    with two_engines() as engines:
        p = params(engines)
        p["engines"][0]["withhold_after"] = 4
        ok, exc = run(p)
    assert not ok
    msg = assert_one_sentence(exc.msg)
    assert "the subscription to its events was stopped after 4 requests" in msg
    assert "on engine engine-0" in msg
    assert exc.facts["engines"]["engine-0"]["subscription_stopped"] is True
    assert exc.facts["requests"] > 4


def test_engine_without_cached_tokens():
    with two_engines(report_cached=False) as engines:
        ok, exc = run(params(engines))
    assert not ok
    assert "--enable-prompt-tokens-details" in assert_one_sentence(exc.msg)


def test_too_few_evictions():
    with two_engines(num_blocks=400) as engines:
        ok, exc = run(params(engines, workload=dict(WORKLOAD, rounds=2), expect={"min_requests": 1, "min_evictions_per_engine": 1}))
    assert not ok
    assert "evicted 0 blocks (BlockRemoved) during the check, fewer than expect.min_evictions_per_engine 1" in assert_one_sentence(exc.msg)
    assert exc.facts["exact"] == exc.facts["requests"]


def test_too_few_requests():
    with two_engines() as engines:
        ok, exc = run(params(engines, workload=dict(WORKLOAD, rounds=1), expect={"min_requests": 50}))
    assert not ok
    assert "fewer than expect.min_requests 50" in assert_one_sentence(exc.msg)


def test_bind_mode_engines_connect():
    engines = []
    with contextlib.ExitStack() as stack:
        for _i in range(2):
            port = free_port()
            engines.append(stack.enter_context(FakeEngine(port, "tcp://127.0.0.1:%d" % free_port(), "kv@127.0.0.1:%d@tiny" % port,
                                                          bind=False)))
        p = params(engines, workload=dict(WORKLOAD, rounds=2), expect={"min_requests": 1})
        for spec in p["engines"]:
            spec["socket_mode"] = "bind"
        ok, facts = run(p)
    assert ok, facts.msg
    assert facts["exact"] == facts["requests"] > 0


@pytest.mark.parametrize("change, expected", [
    ({"engines": []}, "engines must list at least one engine (url, endpoint, topic)."),
    ({"timeout": 0}, "timeout must be above 0, got 0."),
    ({"request_timeout": -1}, "request_timeout must be above 0, got -1."),
    ({"max_tokens": 0}, "max_tokens must be at least 1, got 0."),
    ({"workload": {"families": 0}}, "workload.families must be at least 1, got 0."),
    ({"workload": {"suffix_words": -1}}, "workload.suffix_words must be at least 0, got -1."),
    ({"workload": {"bogus": 1}}, "workload has unknown keys bogus; known: "),
    ({"engines": [{"url": "http://127.0.0.1:1", "endpoint": "127.0.0.1:1"}]}, "engines[0].endpoint must be a ZMQ endpoint such as"),
    ({"engines": [{"url": "http://127.0.0.1:1", "endpoint": "tcp://127.0.0.1:1", "withhold_after": -1}]},
     "engines[0].withhold_after must be at least 0, got -1."),
    ({"engines": [{"url": "http://127.0.0.1:1"}]}, "engines[0].endpoint is required."),
])
def test_bad_parameters(change, expected):
    p = params([FakeEngine(free_port(), "tcp://127.0.0.1:1", "kv@a:1@m")])
    p.update(change)
    ok, exc = run(p)
    assert not ok
    assert expected in assert_one_sentence(exc.msg)


@pytest.mark.parametrize("change, expected", [
    ({"validate_certs": "no"}, "engines[0].validate_certs must be true or false, got 'no'."),
    ({"client_key": "/k.pem"}, "engines[0].client_key needs engines[0].client_cert"),
    ({"max_body_bytes": 10}, "engines[0].max_body_bytes must be between 1024 and 1073741824, got 10."),
    ({"max_body_bytes": 2048.5}, "engines[0].max_body_bytes must be an integer, got 2048.5."),
    ({"ca_path": ["x"]}, "engines[0].ca_path must be a file path."),
    ({"api_key": 3}, "engines[0].api_key must be a string."),
])
def test_bad_http_options(change, expected):
    spec = dict({"url": "https://127.0.0.1:1", "endpoint": "tcp://127.0.0.1:1", "topic": "kv@a:1@m"}, **change)
    ok, exc = run({"engines": [spec], "timeout": 5})
    assert not ok and expected in assert_one_sentence(exc.msg)


def test_engines_use_the_collections_http_options():
    """TLS, proxy and body limit per engine, with the same names and defaults as prefix_cache_check's."""
    made = []

    class Client(object):
        def __init__(self, base_url, timeout=None, **connection):
            made.append((base_url, timeout, connection))
            raise chk.OpenAIHTTPError("stop here")

    spec = {"url": "https://10.0.0.5:8443/v1", "endpoint": "tcp://127.0.0.1:1", "topic": "kv@a:1@m", "api_key": "k",
            "ca_path": "/ca.pem", "validate_certs": True, "use_proxy": False, "max_body_bytes": 2048}
    with pytest.raises(chk.OpenAIHTTPError):
        chk.KVIndexCheck({"engines": [spec], "timeout": 5, "request_timeout": 2}, client_class=Client)._client(spec)
    connection = {"api_key": "k", "validate_certs": True, "ca_path": "/ca.pem", "client_cert": None, "client_key": None,
                  "use_proxy": False, "max_body_bytes": 2048}
    assert made == [("https://10.0.0.5:8443", 2.0, connection)]
    assert all(chk.ENGINE_SPEC[name] == spec for name, spec in HTTP_ARG_SPEC.items())


def test_duplicate_names_and_bad_url():
    spec = {"url": "http://127.0.0.1:1", "endpoint": "tcp://127.0.0.1:1", "topic": "kv@a:1@m"}
    ok, exc = run({"engines": [spec, dict(spec)], "timeout": 5})
    assert not ok and "Two engines are named 'a:1'" in assert_one_sentence(exc.msg)
    ok, exc = run({"engines": [dict(spec, url="127.0.0.1:1")], "timeout": 5})
    assert not ok and assert_one_sentence(exc.msg) == ("engines[0].url must be an http:// or https:// URL of the OpenAI-compatible "
                                                       "server, got '127.0.0.1:1'.")


def test_unreachable_engine():
    spec = {"url": "http://127.0.0.1:%d" % free_port(), "endpoint": "tcp://127.0.0.1:1", "topic": "kv@a:1@m"}
    ok, exc = run({"engines": [spec], "timeout": 5, "request_timeout": 2})
    assert not ok
    assert assert_one_sentence(exc.msg).startswith("Engine a:1 cannot be queried: ")


def test_nobody_connects_in_bind_mode():
    port = free_port()
    with FakeEngine(port, "tcp://127.0.0.1:%d" % free_port(), "kv@x:1@tiny") as engine:
        p = params([engine], event_wait=0.2)
        p["engines"][0]["socket_mode"] = "bind"
        p["engines"][0]["endpoint"] = "tcp://127.0.0.1:%d" % free_port()
        ok, exc = run(p)
    assert not ok
    assert assert_one_sentence(exc.msg).startswith("Engine engine-0 (%s): no publisher connected; the engine must connect to this "
                                                   "address" % p["engines"][0]["endpoint"])


def test_nothing_bound_in_connect_mode():
    with FakeEngine(free_port(), "tcp://127.0.0.1:%d" % free_port(), "kv@x:1@tiny") as engine:
        p = params([engine], event_wait=0.2)
        p["engines"][0]["endpoint"] = "tcp://127.0.0.1:%d" % free_port()
        ok, exc = run(p)
    assert not ok
    assert assert_one_sentence(exc.msg).startswith("Engine engine-0 (%s): the connection never completed, so nothing is bound there; "
                                                   "the engine must bind" % p["engines"][0]["endpoint"])
    assert exc.facts["engines"]["engine-0"]["batches"] == 0


@pytest.mark.parametrize("text, expected", [
    ('vllm:cache_config_info{_block_size_resolved="True",block_size="32",num_gpu_blocks="72"} 1.0\n', (32, 72)),
    ('# nothing\n', (None, None)),
    ('vllm:cache_config_info{block_size="x"} 1.0\n', (None, None)),
])
def test_cache_config(text, expected):
    config = chk.cache_config(text)
    assert (config["block_size"], config["num_gpu_blocks"]) == expected


@pytest.mark.parametrize("topic, pod", [("kv@10.0.0.1:8000@tiny", "10.0.0.1:8000"), ("kv-events", "kv-events"), ("", "")])
def test_topic_pod(topic, pod):
    assert chk.topic_pod(topic) == pod


def _frames(seq, events, topic=b"kv@a:1@tiny"):
    import msgspec  # pylint: disable=import-outside-toplevel
    return [topic, seq.to_bytes(8, "big"), msgspec.msgpack.encode([time.time(), events, 0])]


def _stored(hashes, parent, tokens):
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens, "block_size": 4,
            "lora_id": None, "medium": "GPU", "lora_name": None}


def _stream():
    check = chk.KVIndexCheck({"engines": []})
    check.index = KVBlockIndex(4, "tiny")
    check.uncounted = KVBlockIndex(4, "tiny", count_copies=False)
    engine = chk.Engine({"name": "a", "topic": "kv@a:1@tiny", "url": "http://127.0.0.1:1", "endpoint": "tcp://127.0.0.1:1"}, None)
    check.engines, check.by_name = [engine], {"a": engine}
    return check, engine


def receive(check, engine, frames):
    """One live message from the engine's socket, as the consumer drains it."""
    check.consumer.receive(engine.source, frames)


def test_restart_and_all_blocks_cleared_clear_the_engine():
    check, engine = _stream()
    receive(check, engine, _frames(0, [_stored([1, 2], None, list(range(8)))]))
    second = _frames(1, [_stored([3], 2, list(range(8, 12)))])
    receive(check, engine, second)
    assert check.index.size("a") == 3 and engine.restarts == 0
    receive(check, engine, second)     # the very same message again: ignored
    assert check.index.size("a") == 3 and engine.restarts == 0
    receive(check, engine, _frames(0, [_stored([5], None, list(range(20, 24)))]))   # seq went back: a restart
    assert engine.restarts == 1 and check.index.size("a") == 1 and check.uncounted.size("a") == 1
    receive(check, engine, _frames(1, [{"type": "AllBlocksCleared"}]))
    assert check.index.size("a") == 0 and check.index.engines["a"].clears == 2
    assert engine.source.activity == 5
    assert engine.restart_log == [{"rank": 0, "from": 1, "to": 0}]


def test_another_batch_under_the_last_number_is_a_restart_that_got_there_again():
    """ZMQ never hands a subscriber one live message twice: the same number with other content is a new run's batch."""
    check, engine = _stream()
    receive(check, engine, _frames(0, [_stored([1, 2], None, list(range(8)))]))
    receive(check, engine, _frames(0, [_stored([7], None, list(range(30, 34)))]))   # started again, and got to 0 again
    assert engine.restarts == 1 and check.index.size("a") == 1 and engine.batches == 2


RESTART_SENTENCE = ("Engine a restarted in place during the check (its KV-event sequence started again); llm-d-kv-cache v0.9.0 keeps a "
                    "restarted engine's old blocks until the pod is replaced, so a precise llm-d EPP may route to blocks that engine no "
                    "longer holds: replace the pod (delete it so its Deployment creates a new one with a new address) rather than "
                    "restart its container.")


def test_the_restart_sentence():
    assert chk.restart_warning([]) is None
    assert assert_one_sentence(chk.restart_warning(["a"])) == RESTART_SENTENCE
    assert chk.restart_warning(["c", "a", "b"]).startswith("Engines a, b and c restarted in place during the check")
    assert "(their KV-event sequences started again)" in chk.restart_warning(["a", "b"])
    assert "route to blocks those engines no longer hold: replace the pod" in chk.restart_warning(["a", "b"])


# -- synthetic streams over real ZMQ (tools/_kv_synthetic.py): restarts, gaps and data-parallel ranks ----------------
TOPIC = "kv@a:1@tiny"


def _payload(hashes, tokens, parent=None, rank=0):
    """A vLLM batch of one BlockStored (block size 4) of our choosing, as the synthetic publisher sends it."""
    return synth.encode_batch([{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
                                "block_size": 4, "lora_id": None, "medium": "GPU", "lora_name": None}], rank=rank)


class Synthetic:
    """The index check's consumer subscribed to synthetic engines (real ZMQ on 127.0.0.1), one check engine named ``a``.

    ``bind``: the check binds and the publishers (one per data-parallel rank in ``ranks``) connect, else the one publisher
    binds. Every wait is for a condition (a subscription seen, a number of batches applied), bounded generously.
    """

    BOUND = 60.0

    def __init__(self, zctx, replay=True, bind=False, ranks=(0,)):
        self.zctx = zctx
        endpoint = "tcp://127.0.0.1:%d" % free_port()
        replay_endpoint = "tcp://127.0.0.1:%d" % free_port() if replay else None
        self.check = chk.KVIndexCheck({"engines": []}, ctx=zctx)
        self.check.params = {"settle": 0.0, "event_wait": self.BOUND, "timeout": 2 * self.BOUND}
        self.check.deadline = time.monotonic() + 4 * self.BOUND
        self.check.index = KVBlockIndex(4, "tiny")
        self.check.uncounted = KVBlockIndex(4, "tiny", count_copies=False)
        self.engine = chk.Engine({"name": "a", "topic": TOPIC, "url": "http://127.0.0.1:1", "endpoint": endpoint,
                                  "socket_mode": "bind" if bind else "connect", "replay_endpoint": replay_endpoint}, None)
        self.check.engines, self.check.by_name = [self.engine], {"a": self.engine}
        self.pubs = []
        if bind:
            self.check.consumer.open(self.engine.source)
        for rank in ranks:
            self.pubs.append(synth.SyntheticPublisher(endpoint, bind=not bind, replay_endpoint=replay_endpoint if rank == 0 else None,
                                                      topic=TOPIC, block_size=4, rank=rank, ctx=zctx))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self):
        while not self.stop.is_set():
            self.pubs[0].serve_replay(0.02)

    def __enter__(self):
        if self.engine.source.sock is None:
            self.check.consumer.open(self.engine.source)
        for pub in self.pubs:
            self.subscribed(pub)
        self.thread.start()
        return self

    def subscribed(self, pub):
        """Wait until the publisher's XPUB saw the check's subscription. The check's socket is polled meanwhile: a bound SUB
        sends its subscription to a peer that connected only once its own thread handles the new connection."""
        until = time.monotonic() + self.BOUND
        while True:
            assert time.monotonic() < until, "no subscription reached the synthetic publisher"
            self.check.consumer.poll(0.02)
            if pub.pub.poll(20, zmq.POLLIN) and pub.pub.recv()[:1] == b"\x01":
                return

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)
        self.check.consumer.close()
        for pub in self.pubs:
            pub.close()

    def applied(self, batches):
        """Poll the check's stream until the engine applied ``batches`` batches in all (the condition), bounded."""
        until = time.monotonic() + self.BOUND
        while self.engine.batches < batches:
            assert time.monotonic() < until, "%d of %d batches applied" % (self.engine.batches, batches)
            self.check.consumer.poll(0.05)
            self.check.drain()


def test_a_synthetic_engine_restarted_in_place_is_named_with_one_sentence(zctx):
    with Synthetic(zctx) as run:
        pub = run.pubs[0]
        for _i in range(4):
            pub.publish(removed=False)
        run.applied(4)
        assert run.engine.restarts == 0 and run.check.index.size("a") == 8
        pub.restart()   # seq 0 again, replay buffer empty, no AllBlocksCleared (as vLLM at start)
        pub.publish(payload=_payload([101, 102], list(range(500, 508))))
        pub.publish(payload=_payload([103], list(range(508, 512)), parent=102))
        run.applied(6)
    assert run.engine.restarts == 1 and run.engine.restart_log == [{"rank": 0, "from": 3, "to": 0}]
    assert run.check.index.size("a") == 3 and run.engine.gaps_unrepaired == 0   # the old run's 8 blocks forgotten
    facts = run.check.facts()
    assert facts["restarted_engines"] == ["a"] and facts["restart_warning"] == RESTART_SENTENCE
    assert facts["engines"]["a"]["restarts"] == 1 and facts["engines"]["a"]["restart_seqs"] == [{"rank": 0, "from": 3, "to": 0}]
    assert facts["summary"][-1].startswith("restarted in place (sequence started again): a 1;")


def test_the_live_backlog_of_a_replay_is_no_restart(zctx):
    """Live batches whose numbers were replayed already, with the replayed bytes: the replay's backlog, skipped."""
    with Synthetic(zctx) as run:
        pub = run.pubs[0]
        for _i in range(3):
            pub.publish(removed=False)   # live, queued in the check's socket while it replays
        run.check.catch_up()             # the engine's history from seq 0: batches 0..2
        assert run.engine.batches == 3
        until = time.monotonic() + run.BOUND
        while run.engine.source.activity < 3:   # the three live copies arrive: same numbers, same bytes
            assert time.monotonic() < until
            run.check.consumer.poll(0.05)
            run.check.drain()
    assert run.engine.restarts == 0 and run.engine.batches == 3 and run.check.index.size("a") == 6


def test_a_restart_right_after_the_replayed_history_is_told_from_its_backlog(zctx):
    """A live number at or below the last replayed one with other bytes than the replayed batch: the engine started again."""
    with Synthetic(zctx) as run:
        pub = run.pubs[0]
        for _i in range(3):
            pub.publish(drop=True, removed=False)   # only in the replay buffer
        run.check.catch_up()
        assert run.engine.batches == 3 and run.check.index.size("a") == 6
        pub.restart()
        pub.publish(payload=_payload([201], list(range(900, 904))))   # seq 0 again, live
        run.applied(4)
    assert run.engine.restarts == 1 and run.check.index.size("a") == 1
    assert run.engine.restart_log == [{"rank": 0, "from": 2, "to": 0}] and run.check.facts()["restarted_engines"] == ["a"]


def test_a_gap_is_repaired_through_replay_and_is_no_restart(zctx):
    with Synthetic(zctx) as run:
        pub = run.pubs[0]
        pub.publish()
        pub.publish(drop=True)         # lost on the way: only in the replay buffer
        pub.publish()
        run.applied(3)
    assert run.engine.gaps == 0 and run.engine.gaps_unrepaired == 0 and run.engine.restarts == 0
    facts = run.check.facts()
    assert facts["restarted_engines"] == [] and facts["restart_warning"] is None and len(facts["summary"]) == 5


def test_data_parallel_ranks_on_one_stream_are_no_restart(zctx):
    """Each rank's publisher counts from 0 on its own: interleaved numbers of two ranks are neither restarts nor duplicates."""
    with Synthetic(zctx, replay=False, bind=True, ranks=(0, 1)) as run:
        for step in range(3):
            for pub in run.pubs:
                pub.publish(payload=_payload([1000 * pub.rank + step], list(range(4)), rank=pub.rank))
        run.applied(6)
    assert run.engine.restarts == 0 and run.engine.gaps == 0 and run.engine.gaps_unrepaired == 0
    assert sorted(run.engine.ranks) == [0, 1] and all(state["applied"] == 2 for state in run.engine.ranks.values())
    assert run.check.facts()["restarted_engines"] == []


def test_a_restart_mid_workload_is_a_warning_and_the_check_stays_exact():
    """An engine restarted in place between two requests: the request that revealed it is a restart miss, the rest exact."""
    with two_engines(restart_after=9) as engines:
        ok, facts = run(params(engines))
    assert ok, facts.msg
    assert engines[0].restarts == 1 and engines[1].restarts == 1
    assert facts["restarted_engines"] == ["engine-0", "engine-1"]
    assert assert_one_sentence(facts["restart_warning"]).startswith("Engines engine-0 and engine-1 restarted in place during the check")
    assert facts["exact"] + facts["restart_misses"] == facts["requests"] and facts["mismatches"] == []
    assert facts["restart_misses"] == len(facts["restart_miss_steps"]) >= 1
    assert all(e["restarts"] == 1 for e in facts["engines"].values())


def test_gap_without_replay_and_other_topics_are_counted():
    check, engine = _stream()
    receive(check, engine, _frames(0, [_stored([1], None, list(range(4)))]))
    receive(check, engine, _frames(3, [_stored([2], 1, list(range(4, 8)))]))
    assert engine.gaps_unrepaired == 1 and check.index.size("a") == 2
    receive(check, engine, _frames(4, [_stored([7], None, list(range(4)))], topic=b"kv@b:2@tiny"))
    assert engine.tally.other_topics == {"kv@b:2@tiny": 1} and check.index.size("a") == 2
    receive(check, engine, [b"kv@a:1@tiny", b"\x00", b"x"])
    assert engine.tally.malformed == 1
    assert check.explain(engine) == "; a gap in its event stream could not be repaired (1 in all)"
    facts = engine.facts(check.index, check.uncounted)
    assert facts["other_topics"] == {"kv@b:2@tiny": 1} and facts["malformed"] == 1 and facts["gaps_unrepaired"] == 1


def test_events_the_index_cannot_key_are_malformed_not_a_crash():
    check, engine = _stream()
    no_tokens = dict(_stored([1], None, None))
    del no_tokens["token_ids"]
    receive(check, engine, _frames(0, [no_tokens, _stored([2], None, list(range(4)))]))
    assert engine.tally.malformed == 1 and "without token ids" in engine.tally.malformed_reason
    assert check.index.size("a") == 1   # the good event of the same batch was applied


CLUSTER_VERIFY = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "roles", "cluster_verify", "files", "cluster_verify.py")


@contextlib.contextmanager
def pods(http_port, kv_port):
    """Two fake engine pods on 127.0.0.2 and 127.0.0.3, same ports (as pods behind a headless Service)."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(FakeEngine(http_port, "tcp://127.0.0.%d:%d" % (n, kv_port), "kv@127.0.0.%d:%d@tiny" % (n, http_port),
                                              host="127.0.0.%d" % n)) for n in (2, 3)]


@pytest.mark.parametrize("template, ok", [("kv@$(POD_IP):%d@", True), ("kv@$(POD_IP):1@", False)])
def test_cluster_verify_runs_the_check_over_all_pods(capsys, template, ok):
    spec = importlib.util.spec_from_file_location("cluster_verify_for_kv_index", CLUSTER_VERIFY)
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    http_port, kv_port = free_port(), free_port()
    with pods(http_port, kv_port):
        code = cli.main(["--service", "engines.ns.svc", "--pods", "127.0.0.2,127.0.0.3", "--checks", "kv_index", "--http-port",
                         str(http_port), "--kv-port", str(kv_port), "--topic-template", template.replace("%d", str(http_port)),
                         "--timeout", "20"])
    report = json.loads(capsys.readouterr().out)
    result = report["pool"]["kv_index"]
    assert (code == 0) is ok and result["ok"] is ok and report["ok"] is ok
    if ok:
        assert result["exact"] == result["requests"] > 0
    else:
        assert_one_sentence(result["msg"])
        assert "no KV events arrived under its topic prefix 'kv@127.0.0." in result["msg"]
        assert report["msg"].startswith("Across the pods, kv_index: The index predicted ")
