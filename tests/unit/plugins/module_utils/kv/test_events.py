# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Decoder, replay-reply parsing and sequence bookkeeping (pure functions, no sockets)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json

import msgspec
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import events as kv
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import report
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import stream
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import consumer as kvc
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import sockets as kvz
from ansible_collections.inference_cache.substrate.tests.harness import kv_synthetic as synth

ENC = msgspec.msgpack.encode
BIG = (1 << 64) - 5  # above the int64 range
BYTES_HASH = b"\x01" * 32
TOKENS = list(range(32))

# Real capture from vLLM 0.26 (REFERENCE A2), plus the newer fields seen on 0.32 (REFERENCE L).
VLLM_MAP_STORED = {"type": "BlockStored", "block_hashes": [BIG, 7], "parent_block_hash": None, "token_ids": TOKENS,
                   "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None, "extra_keys": [None, None],
                   "group_idx": 0, "kv_cache_spec_kind": "full_attention", "locality": "local", "ownership": None,
                   "session_id": "abc"}
VLLM_ARRAY_STORED_OLD = ["BlockStored", [BIG], None, TOKENS, 16, None]                    # 5 fields (old vLLM)
VLLM_ARRAY_STORED_FULL = ["BlockStored", [BIG], 3, TOKENS, 16, None, "GPU", "lora-a", [None], 1, "sliding_window", 128]
SGLANG_STORED = ["BlockStored", [5], None, TOKENS, 16, None, "GPU"]
SGLANG_STORED_META = ["BlockStored", [5], None, TOKENS, 16, None, "GPU", {"cache_salt": "secret"}]


def frames(payload, seq=0, topic=b"kv"):
    return [topic, seq.to_bytes(8, "big"), payload]


@pytest.fixture
def dec():
    return kv.KVDecoder()


# --- encodings -------------------------------------------------------------------------------
CASES = [
    # id, batch object, expected (batch fmt, event fmt, engine, hash kind, types)
    ("vllm-map-events", [1.5, [VLLM_MAP_STORED, {"type": "BlockRemoved", "block_hashes": [BIG], "medium": "GPU"}], 0],
     ("array", "map", "vllm", ["BlockStored", "BlockRemoved"])),
    ("vllm-map-batch", {"ts": 1.5, "events": [VLLM_MAP_STORED], "data_parallel_rank": 2},
     ("map", "map", "vllm", ["BlockStored"])),
    ("vllm-map-no-rank", [1, [VLLM_MAP_STORED, {"type": "AllBlocksCleared"}]],
     ("array", "map", "vllm", ["BlockStored", "AllBlocksCleared"])),
    ("vllm-array-old", [1.5, [VLLM_ARRAY_STORED_OLD, ["BlockRemoved", [BIG]], ["AllBlocksCleared"]]],
     ("array", "array", None, ["BlockStored", "BlockRemoved", "AllBlocksCleared"])),
    ("vllm-array-full", [1.5, [VLLM_ARRAY_STORED_FULL, ["BlockRemoved", [BIG], "GPU", 1]], 0],
     ("array", "array", "vllm", ["BlockStored", "BlockRemoved"])),
    ("sglang-array", [1.5, [SGLANG_STORED, ["BlockRemoved", [5], "CPU_PINNED"]], 0],
     ("array", "array", "sglang", ["BlockStored", "BlockRemoved"])),
    ("sglang-metadata", [1.5, [SGLANG_STORED_META], 1], ("array", "array", "sglang", ["BlockStored"])),
    ("sglang-map-batch", {"ts": 1.5, "events": [SGLANG_STORED], "attn_dp_rank": 3}, ("map", "array", "sglang", ["BlockStored"])),
    ("vllm-bytes-hashes", [1.5, [dict(VLLM_MAP_STORED, block_hashes=[BYTES_HASH], parent_block_hash=BYTES_HASH)], 0],
     ("array", "map", "vllm", ["BlockStored"])),
]


@pytest.mark.parametrize("obj,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_encoding(dec, obj, expected):
    batch_fmt, event_fmt, engine, types = expected
    batch = dec.decode_frames(frames(ENC(obj), seq=7))
    assert batch.seq == 7 and batch.topic == "kv"
    assert batch.batch_format == batch_fmt
    assert batch.event_format == event_fmt
    assert batch.engine_hint == engine
    assert [e.type for e in batch.events] == types
    assert not batch.errors and not batch.unknown
    stored = batch.events[0]
    assert stored.token_count == 32
    assert stored.token_ids is None  # redacted by default
    assert stored.block_size == 16


def test_uint64_and_bytes_hashes_survive(dec):
    batch = dec.decode_payload(ENC([0, [VLLM_MAP_STORED], 0]))
    assert batch.fast and batch.events[0].block_hashes == [BIG, 7]
    batch = dec.decode_payload(ENC([0, [dict(VLLM_MAP_STORED, block_hashes=[BYTES_HASH])], 0]))
    assert batch.events[0].block_hashes == [BYTES_HASH]
    assert batch.events[0].to_dict()["block_hashes"] == [BYTES_HASH.hex()]


def test_rank_from_batch(dec):
    assert dec.decode_payload(ENC({"ts": 1, "events": [], "data_parallel_rank": 2})).rank == 2
    assert dec.decode_payload(ENC({"ts": 1, "events": [SGLANG_STORED], "attn_dp_rank": 3})).rank == 3
    assert dec.decode_payload(ENC([1, []])).rank is None


def test_sglang_metadata_redacted_to_flag(dec):
    ev = dec.decode_payload(ENC([1, [SGLANG_STORED_META], 0])).events[0]
    assert ev.has_cache_salt is True
    assert "secret" not in json.dumps(ev.to_dict())


def test_forced_engine_selects_sglang_order():
    batch = kv.KVDecoder(engine="sglang").decode_payload(ENC([1, [SGLANG_STORED_META], 0]))
    assert batch.engine_hint == "sglang" and batch.events[0].has_cache_salt


def test_token_ids_opt_in():
    for obj in ([1, [VLLM_MAP_STORED], 0], [1, [VLLM_ARRAY_STORED_OLD], 0]):
        ev = kv.KVDecoder(include_token_ids=True).decode_payload(ENC(obj)).events[0]
        assert list(ev.token_ids) == TOKENS and ev.to_dict()["token_ids"] == TOKENS
        ev = kv.KVDecoder().decode_payload(ENC(obj)).events[0]
        assert "token_ids" not in ev.to_dict()


SALTED_EXTRA = [["adapter", "tenant-salt"], None]   # vLLM 0.32: bare LoRA name and cache salt, one entry per block


@pytest.mark.parametrize("obj", [
    [1, [dict(VLLM_MAP_STORED, extra_keys=SALTED_EXTRA)], 0],                                    # typed path
    [1, [["BlockStored", [BIG, 7], None, TOKENS, 16, None, "GPU", "adapter", SALTED_EXTRA]], 0],   # tolerant path
], ids=["map", "array"])
def test_extra_keys_kept_only_with_token_ids_and_never_reported(obj):
    ev = kv.KVDecoder(include_token_ids=True).decode_payload(ENC(obj)).events[0]
    assert [None if e is None else list(e) for e in ev.extra_keys] == SALTED_EXTRA
    assert "extra_keys" not in ev.to_dict() and "tenant-salt" not in repr(ev.to_dict())
    assert getattr(kv.KVDecoder().decode_payload(ENC(obj)).events[0], "extra_keys", None) is None


@pytest.mark.parametrize("extra", ["salt", [1, 2], {"salt": 1}], ids=["string", "scalars", "map"])
@pytest.mark.parametrize("as_map", [True, False], ids=["map", "array"])
def test_malformed_extra_keys_are_one_bad_event_when_kept(extra, as_map):
    event = dict(VLLM_MAP_STORED, extra_keys=extra) if as_map else ["BlockStored", [BIG], None, TOKENS[:16], 16, None, "GPU", None, extra]
    stats = report.KVStats()
    stats.add_batch(kv.KVDecoder(include_token_ids=True).decode_payload(ENC([1, [event, VLLM_MAP_STORED], 0])))
    facts = stats.facts()
    assert facts["malformed"]["count"] == 1 and "extra_keys" in facts["malformed"]["first_reason"], facts["malformed"]
    stats = report.KVStats()   # not kept: not read, as the check never needs them
    stats.add_batch(kv.KVDecoder().decode_payload(ENC([1, [event, VLLM_MAP_STORED], 0])))
    assert stats.facts()["malformed"]["count"] == 0


def test_large_token_array_counts_without_decoding(dec):
    big = dict(VLLM_MAP_STORED, token_ids=list(range(70000)))
    assert dec.decode_payload(ENC([1, [big], 0])).events[0].token_count == 70000
    mid = dict(VLLM_MAP_STORED, token_ids=list(range(300)))
    assert dec.decode_payload(ENC([1, [mid], 0])).events[0].token_count == 300


def test_unknown_event_types_counted_not_fatal(dec):
    batch = dec.decode_payload(ENC([1, [VLLM_MAP_STORED, {"type": "Future", "x": 1}, ["AlsoNew", 1]], 0]))
    assert [e.type for e in batch.events] == ["BlockStored"]
    assert batch.unknown == {"Future": 1, "AlsoNew": 1}
    assert not batch.errors


def test_unknown_extra_fields_ignored(dec):
    ev = dict(VLLM_MAP_STORED, brand_new_field=[1, 2, {"a": 1}])
    assert dec.decode_payload(ENC([1, [ev], 0])).events[0].block_size == 16
    arr = VLLM_ARRAY_STORED_FULL + ["locality", "more"]
    assert dec.decode_payload(ENC([1, [arr], 0])).events[0].kv_cache_spec_sliding_window == 128


# --- malformed input ---------------------------------------------------------------------------
MALFORMED_FRAMES = [
    ("two-frames", [b"kv", b"\x00" * 8], "2 frames instead of 3"),
    ("four-frames", [b"kv", b"\x00" * 8, b"x", b"y"], "4 frames instead of 3"),
    ("short-seq", [b"kv", b"\x00" * 4, ENC([1, []])], "4 bytes instead of 8"),
    ("garbage", [b"kv", b"\x00" * 8, b"\xc1\xc1"], "not valid msgpack"),
    ("truncated", [b"kv", b"\x00" * 8, ENC([1, [VLLM_MAP_STORED]])[:-3]], "not valid msgpack"),
    ("huge-array-header", [b"kv", b"\x00" * 8, b"\xdd\xff\xff\xff\xff"], "not valid msgpack"),
    ("scalar-batch", [b"kv", b"\x00" * 8, ENC(5)], "is a int"),
    ("short-batch", [b"kv", b"\x00" * 8, ENC([1])], "1 elements"),
    ("events-not-list", [b"kv", b"\x00" * 8, ENC([1, {"a": 1}])], "events are a dict"),
    ("ts-string", [b"kv", b"\x00" * 8, ENC(["now", []])], "timestamp is a str"),
    ("rank-string", [b"kv", b"\x00" * 8, ENC([1, [], "zero"])], "rank is a str"),
    ("map-without-events", [b"kv", b"\x00" * 8, ENC({"ts": 1})], "no 'events' key"),
]


@pytest.mark.parametrize("msg,reason", [c[1:] for c in MALFORMED_FRAMES], ids=[c[0] for c in MALFORMED_FRAMES])
def test_malformed_messages_reported(dec, msg, reason):
    with pytest.raises(kv.MalformedMessage, match=reason):
        dec.decode_frames(msg)


def test_payload_size_limit():
    with pytest.raises(kv.MalformedMessage, match="exceeds"):
        kv.KVDecoder(max_payload=10).decode_payload(ENC([1, [VLLM_MAP_STORED]]))


MALFORMED_EVENTS = [
    ("wrong-hash-type", dict(VLLM_MAP_STORED, block_hashes=["abc"]), "block_hashes is not a list"),
    ("hash-float", dict(VLLM_MAP_STORED, block_hashes=[1.5]), "block_hashes"),
    ("block-size-str", dict(VLLM_MAP_STORED, block_size="16"), "block_size is a str"),
    ("medium-int", dict(VLLM_MAP_STORED, medium=3), "medium is a int"),
    ("tokens-not-list", dict(VLLM_MAP_STORED, token_ids="abc"), "token_ids is not a list"),
    ("parent-str", dict(VLLM_MAP_STORED, parent_block_hash="p"), "parent_block_hash"),
    ("no-type", {"block_hashes": [1]}, "no string 'type'"),
    ("scalar-event", 17, "an event is a int"),
    ("removed-bad", {"type": "BlockRemoved", "block_hashes": 5}, "BlockRemoved.block_hashes"),
    ("bool-as-int", dict(VLLM_MAP_STORED, block_size=True), "block_size is a bool"),
]


@pytest.mark.parametrize("event,reason", [c[1:] for c in MALFORMED_EVENTS], ids=[c[0] for c in MALFORMED_EVENTS])
@pytest.mark.parametrize("include_token_ids", [False, True], ids=["tokens-counted", "tokens-decoded"])
def test_malformed_events_reported_and_others_kept(event, reason, include_token_ids):
    # The typed path counts token ids on demand, so a token_ids that is not an array shows when the batch is counted.
    stats = report.KVStats()
    stats.add_batch(kv.KVDecoder(include_token_ids=include_token_ids).decode_payload(ENC([1, [event, VLLM_MAP_STORED], 0])))
    facts = stats.facts()
    assert facts["malformed"]["count"] == 1 and reason in facts["malformed"]["first_reason"]
    assert facts["counts"] == {"BlockStored": 1, "BlockRemoved": 0, "AllBlocksCleared": 0} and facts["stored_tokens"] == 32


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=256), st.binary(max_size=12))
def test_random_bytes_never_crash(payload, seq):
    dec = kv.KVDecoder()
    try:
        batch = dec.decode_frames([b"kv", seq, payload])
    except kv.MalformedMessage as exc:
        assert str(exc)
    else:
        assert isinstance(batch.events, list)


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1), st.floats(),
                    st.text(max_size=5), st.binary(max_size=5))
MSGPACK_OBJ = st.recursive(SCALARS, lambda c: st.one_of(st.lists(c, max_size=5), st.dictionaries(st.text(max_size=5), c, max_size=5)),
                           max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(MSGPACK_OBJ)
def test_random_msgpack_structures_never_crash(obj):
    try:
        batch = kv.KVDecoder().decode_payload(ENC(obj))
    except kv.MalformedMessage:
        return
    stats = report.KVStats()
    stats.add_batch(batch)
    json.dumps(stats.facts())


def test_begin_window_sets_the_backlog_aside(dec):
    stats = report.KVStats()
    stats.add_batch(dec.decode_frames(frames(ENC([1.0, [VLLM_MAP_STORED], 0]), seq=0)))
    stats.add_batch(dec.decode_frames(frames(ENC([1.1, [VLLM_MAP_STORED], 0]), seq=1)))
    stats.add_malformed("first reason")
    assert stats.begin_window() == 2
    stats.add_batch(dec.decode_frames(frames(ENC([2.0, [dict(VLLM_MAP_STORED, block_hashes=[9])], 0]), seq=2)))
    facts = stats.facts()
    assert facts["batches"] == 1 and facts["counts"]["BlockStored"] == 1
    assert facts["stored_blocks"] == 1 and facts["stored_tokens"] == 32 and len(facts["sample"]) == 1
    assert facts["malformed"] == {"count": 1, "first_reason": "first reason"} and facts["engine"] == "vllm"


# --- replay replies -----------------------------------------------------------------------------
REPLIES = [
    ("with-topic", [b"", b"kv", (5).to_bytes(8, "big"), b"P"], ("kv", 5, b"P", False)),
    ("without-topic", [b"", (5).to_bytes(8, "big"), b"P"], (None, 5, b"P", False)),
    ("no-delimiter", [(5).to_bytes(8, "big"), b"P"], (None, 5, b"P", False)),
    ("end-with-topic", [b"", b"", b"\xff" * 8, b""], ("", kv.END_SEQ, b"", True)),
    ("end-without-topic", [b"", b"\xff" * 8, b""], (None, kv.END_SEQ, b"", True)),
    ("empty-payload-is-end", [b"", b"kv", (9).to_bytes(8, "big"), b""], ("kv", kv.END_SEQ, b"", True)),
]


@pytest.mark.parametrize("reply,expected", [c[1:] for c in REPLIES], ids=[c[0] for c in REPLIES])
def test_replay_reply_shapes(reply, expected):
    assert kv.parse_replay_reply(reply) == expected


@pytest.mark.parametrize("reply", [[b""], [b"", b"a", b"b", b"c", b"d"], [b"", b"kv", b"\x00", b"P"]])
def test_replay_reply_malformed(reply):
    with pytest.raises(kv.MalformedMessage):
        kv.parse_replay_reply(reply)


# --- sequence bookkeeping -----------------------------------------------------------------------


def test_stats_facts():
    dec = kv.KVDecoder()
    stats = report.KVStats()
    stats.add_batch(dec.decode_frames(frames(ENC([1, [VLLM_MAP_STORED], 0]), topic=b"a")))
    stats.add_batch(dec.decode_frames(frames(ENC([1, [{"type": "BlockRemoved", "block_hashes": [BIG], "medium": "GPU"}], 1]))))
    stats.add_batch(dec.decode_frames(frames(ENC([1, [dict(VLLM_MAP_STORED, block_size=32, block_hashes=[BYTES_HASH])], 0]))))
    facts = stats.facts()
    assert facts["counts"] == {"BlockStored": 2, "BlockRemoved": 1, "AllBlocksCleared": 0}
    assert facts["stored_blocks"] == 3 and facts["stored_tokens"] == 64 and facts["removed_blocks"] == 1
    assert facts["removed_after_stored"] == 1
    assert facts["block_size"] == [16, 32]
    assert facts["wire_format"] == {"batch": "array", "events": "map", "hashes": ["bytes", "int"]}
    assert facts["ranks"] == [0, 1] and facts["topics"] == {"a": 1, "kv": 2}
    assert facts["engine"] == "vllm"
    assert all("token_ids" not in s for s in facts["sample"])
    json.dumps(facts)


def test_offset_endpoint():
    assert kvc.offset_endpoint("tcp://*:5557", 0) == "tcp://*:5557"
    assert kvc.offset_endpoint("tcp://*:5557", 2) == "tcp://*:5559"
    assert kvc.offset_endpoint("tcp://*:0", 2) == "tcp://*:0"   # vLLM leaves a port of 0 to the OS
    assert kvc.offset_endpoint("ipc:///tmp/kv", 1) == "ipc:///tmp/kv_dp1"
    with pytest.raises(ValueError):
        kvc.offset_endpoint("tcp://host", 1)
    sources = kvc.rank_sources("tcp://*:5557", False, "kv@", "tcp://h:5600", 3)
    assert [(s.endpoint, s.replay_endpoint, s.rank, s.topic) for s in sources] == [
        ("tcp://*:5557", "tcp://h:5600", 0, "kv@"), ("tcp://*:5558", "tcp://h:5601", 1, "kv@"), ("tcp://*:5559", "tcp://h:5602", 2, "kv@")]
    assert kvc.rank_sources("ipc:///tmp/kv", True, ranks=2)[1].replay_endpoint is None


@pytest.mark.parametrize("fmt", synth.WIRE_FORMATS)
@pytest.mark.parametrize("hash_kind", ["int", "bytes"])
def test_synthetic_publisher_payloads_decode(fmt, hash_kind):
    dec = kv.KVDecoder()
    payload = synth.encode_batch(synth.synthetic_events(fmt, 4, hash_kind=hash_kind, salted=True), rank=1)
    batch = dec.decode_payload(payload)
    assert [e.type for e in batch.events] == ["BlockStored", "BlockRemoved"]
    assert batch.rank == 1 and not batch.errors


# Near-valid batches: the right outer shape with events whose fields have random types (both decoder paths).
FIELD_VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=4), st.dictionaries(st.text(max_size=4), SCALARS, max_size=3))
WRONG_EVENTS = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(kv.EVENT_TYPES + ("Other",))},
                          optional=dict((name, FIELD_VALUES) for name in kv.VLLM_STORED_FIELDS + ("metadata",))),
    st.lists(FIELD_VALUES, max_size=12).map(lambda values: [values[0] if values and isinstance(values[0], str) else "BlockStored"] + values[1:]),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(WRONG_EVENTS, max_size=4), st.one_of(SCALARS, st.integers(0, 3)), st.booleans(), st.booleans(), st.sampled_from(["auto", "vllm", "sglang"]))
def test_events_of_wrong_shapes_never_crash(events, rank, as_map, include_token_ids, engine):
    obj = {"ts": 1.0, "events": events, "data_parallel_rank": rank} if as_map else [1.0, events, rank]
    stats = report.KVStats()
    try:
        batch = kv.KVDecoder(engine=engine, include_token_ids=include_token_ids).decode_frames([b"kv", b"\x00" * 8, ENC(obj)])
    except kv.MalformedMessage as exc:
        assert str(exc)
        return
    stats.add_batch(batch)
    facts = stats.facts()
    json.dumps(facts)
    assert sum(facts["counts"].values()) + facts["malformed"]["count"] + sum(facts["unknown_event_types"].values()) == len(events)


def test_streams_and_topics_are_bounded():
    tr = stream.SequenceTracker(max_streams=2)
    assert [tr.observe("t%d" % i, 0, 0)[0] for i in range(3)] == ["first", "first", "overflow"]
    stats = report.KVStats(max_topics=2)
    for name in ("a", "b", "c", "d"):
        stats.add_other_topic(name)
    assert stats.facts()["other_topics"] == {"a": 1, "b": 1, report.OTHER_TOPICS_OVERFLOW: 2}
    stats.add_batch(kv.KVDecoder().decode_frames(frames(ENC([1, [VLLM_MAP_STORED], 0]), topic=b"x")))
    stats.add_batch(kv.KVDecoder().decode_frames(frames(ENC([1, [VLLM_MAP_STORED], 0]), topic=b"y")))
    assert stats.accepts_topic("x") and not stats.accepts_topic("z")


def test_frames_above_the_size_bound_are_refused_by_libzmq():
    """An XPUB publisher sees the subscription arrive, and its withdrawal when libzmq drops the subscriber's connection for a
    frame above its bound: the test waits for one of those events, never for a time."""
    ctx = zmq.Context()
    try:
        results = []
        for max_frame in (4096, 0):  # with the bound, then without
            pub = ctx.socket(zmq.XPUB)
            port = pub.bind_to_random_port("tcp://127.0.0.1")
            sub, _mon = kvz.open_socket(ctx, zmq.SUB, "tcp://127.0.0.1:%d" % port, bind=False, max_frame=max_frame)
            assert pub.poll(60000) and pub.recv() == b"\x01"   # subscribed
            pub.send_multipart([b"kv", b"\x00" * 8, b"\x00" * 10000])
            poller = zmq.Poller()
            poller.register(pub, zmq.POLLIN)
            poller.register(sub, zmq.POLLIN)
            ready = dict(poller.poll(60000))
            assert ready, "neither the message nor the subscriber's withdrawal arrived"
            if sub in ready:
                results.append(True)       # delivered
            else:
                assert pub.recv() == b"\x00"   # the subscription withdrawn: the connection was dropped
                results.append(False)
            sub.close(0)
            pub.close(0)
        assert results == [False, True]
        assert kvz.MAX_FRAME > kv.MAX_PAYLOAD
    finally:
        ctx.destroy(0)
