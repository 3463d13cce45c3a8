# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""Decoder and stream bookkeeping for vLLM / SGLang KV-cache events (pure Python, no Ansible).

Wire format (vLLM ``ZmqEventPublisher``, SGLang's copy of it):
ZMQ multipart ``[topic, seq (8 bytes big-endian), msgpack(EventBatch)]``.
``EventBatch`` is ``[ts, events, data_parallel_rank]`` (SGLang: ``attn_dp_rank``), or a map.
Each event is a map with ``"type"`` (vLLM >= 0.24) or a positional array ``["BlockStored", ...]``.

Token content never leaves the decoder unless ``include_token_ids`` is set: ``token_ids`` become
``token_count`` and ``extra_keys`` (cache salts, multimodal hashes) are dropped.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json
import traceback

from . import _kv_wire as wire

HAS_MSGSPEC = wire.HAS_MSGSPEC
MSGSPEC_IMPORT_ERROR = None
if not HAS_MSGSPEC:
    try:
        import msgspec  # noqa: F401  pylint: disable=unused-import
    except ImportError:
        MSGSPEC_IMPORT_ERROR = traceback.format_exc()

EVENT_TYPES = ("BlockStored", "BlockRemoved", "AllBlocksCleared")
END_SEQ = (1 << 64) - 1
END_SEQ_BYTES = b"\xff" * 8
MAX_PAYLOAD = 64 * 1024 * 1024
UINT64_MAX = (1 << 64) - 1

VLLM_STORED_FIELDS = (
    "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
    "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window",
)
SGLANG_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "metadata")
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")
SGLANG_MEDIA = ("CPU_PINNED", "DISK", "EXTERNAL")

_INT_FIELDS = ("block_size", "lora_id", "group_idx", "kv_cache_spec_sliding_window")
_STR_FIELDS = ("medium", "lora_name", "kv_cache_spec_kind")


_NO_UNKNOWN = {}


class MalformedMessage(Exception):
    """A message that cannot be decoded at all (one-sentence reason in ``str(exc)``)."""


class Event:
    """A decoded, redacted event (one shape whatever the wire encoding)."""

    __slots__ = ("type", "block_hashes", "parent_block_hash", "token_count", "token_ids", "block_size",
                 "lora_id", "medium", "lora_name", "group_idx", "kv_cache_spec_kind",
                 "kv_cache_spec_sliding_window", "has_cache_salt")

    def __init__(self, type_, block_hashes=None, parent_block_hash=None, token_count=None, token_ids=None,
                 block_size=None, lora_id=None, medium=None, lora_name=None, group_idx=None,
                 kv_cache_spec_kind=None, kv_cache_spec_sliding_window=None, has_cache_salt=False):
        self.type = type_
        self.block_hashes = block_hashes if block_hashes is not None else []
        self.parent_block_hash = parent_block_hash
        self.token_count = token_count
        self.token_ids = token_ids
        self.block_size = block_size
        self.lora_id = lora_id
        self.medium = medium
        self.lora_name = lora_name
        self.group_idx = group_idx
        self.kv_cache_spec_kind = kv_cache_spec_kind
        self.kv_cache_spec_sliding_window = kv_cache_spec_sliding_window
        self.has_cache_salt = has_cache_salt

    to_dict = wire.event_to_dict


class DecodedBatch:
    """One decoded message."""

    __slots__ = ("topic", "seq", "ts", "rank", "events", "batch_format", "event_format", "engine_hint",
                 "unknown", "errors", "fast")

    def __init__(self, topic, seq, ts, rank, events, batch_format, event_format, engine_hint=None,
                 unknown=None, errors=None, fast=False):
        self.topic = topic
        self.seq = seq
        self.ts = ts
        self.rank = rank
        self.events = events
        self.batch_format = batch_format
        self.event_format = event_format
        self.engine_hint = engine_hint
        self.unknown = unknown or _NO_UNKNOWN  # shared empty values: never mutated
        self.errors = errors or ()
        self.fast = fast


hash_to_json = wire.hash_to_json


def topic_to_str(topic):
    return bytes(topic).decode("utf-8", "replace")


def seq_from_bytes(frame):
    frame = bytes(frame)
    if len(frame) != 8:
        raise MalformedMessage("the sequence frame has %d bytes instead of 8" % len(frame))
    return int.from_bytes(frame, "big")


def seq_to_bytes(seq):
    return int(seq).to_bytes(8, "big")


def offset_endpoint(endpoint, rank):
    """vLLM ``offset_endpoint_port``: tcp port + rank, ipc/inproc suffix ``_dp<rank>``."""
    if not rank:
        return endpoint
    if endpoint.startswith(("ipc://", "inproc://")):
        return "%s_dp%d" % (endpoint, rank)
    head, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError("cannot offset the port of endpoint %r for data-parallel rank %d" % (endpoint, rank))
    return "%s:%d" % (head, int(port) + rank)


def _raw_array_len(raw):
    """Length of a msgpack array from its header, without decoding it; None for nil, -1 if not an array."""
    view = memoryview(raw)
    if not view:
        return None
    head = view[0]
    if 0x90 <= head <= 0x9F:
        return head & 0x0F
    if head == 0xDC and len(view) >= 3:
        return int.from_bytes(view[1:3], "big")
    if head == 0xDD and len(view) >= 5:
        return int.from_bytes(view[1:5], "big")
    if head == 0xC0:
        return None
    return -1


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_hash(value):
    if isinstance(value, bytes):
        return True
    return _is_int(value) and -(1 << 63) <= value <= UINT64_MAX


class KVDecoder:
    """Decode KV-event messages. ``engine``: auto, vllm or sglang (selects the positional field order)."""

    def __init__(self, engine="auto", include_token_ids=False, max_payload=MAX_PAYLOAD):
        if not HAS_MSGSPEC:
            raise RuntimeError("the msgspec Python library is required")
        self.engine = engine
        self.include_token_ids = include_token_ids
        self.max_payload = max_payload
        self._typed = list(wire.TYPED_DECODERS)
        self._topics = {}

    # -- messages -------------------------------------------------------------------------
    def decode_frames(self, frames):
        """Decode a live PUB message ``[topic, seq, payload]``."""
        if len(frames) != 3:
            raise MalformedMessage("a message has %d frames instead of 3 (topic, sequence, payload)" % len(frames))
        topic, seq, payload = frames
        if len(seq) != 8:
            raise MalformedMessage("the sequence frame has %d bytes instead of 8" % len(seq))
        seq = int.from_bytes(seq, "big")
        name = self._topics.get(topic)
        if name is None:
            name = topic_to_str(topic)
            if len(self._topics) < 1024:
                self._topics[bytes(topic)] = name
        if self.engine != "sglang" and len(payload) <= self.max_payload:
            for idx, (fmt, decoder) in enumerate(self._typed):  # fast path, inlined for the common case
                try:
                    raw_batch = decoder.decode(payload)
                except (wire.DecodeError, wire.ValidationError):
                    continue
                if idx:
                    self._typed.insert(0, self._typed.pop(idx))
                batch = self._from_typed(raw_batch, fmt, name, seq)
                if batch is not None:
                    return batch
                break
        return self.decode_payload(payload, name, seq)

    def decode_payload(self, payload, topic="", seq=None):
        if len(payload) > self.max_payload:
            raise MalformedMessage("a payload of %d bytes exceeds the %d-byte limit" % (len(payload), self.max_payload))
        if self.engine != "sglang":
            batch = self._decode_typed(payload, topic, seq)
            if batch is not None:
                return batch
        return self._decode_generic(payload, topic, seq)

    # -- fast path ------------------------------------------------------------------------
    def _decode_typed(self, payload, topic, seq):
        typed = self._typed
        for idx, (fmt, decoder) in enumerate(typed):
            try:
                raw_batch = decoder.decode(payload)
            except (wire.DecodeError, wire.ValidationError):
                continue
            if idx:
                typed.insert(0, typed.pop(idx))  # the last shape that worked is tried first
            return self._from_typed(raw_batch, fmt, topic, seq)
        return None

    def _from_typed(self, raw_batch, fmt, topic, seq):
        # The typed structs are the events: only redact token ids into a count (no second object per event).
        events = raw_batch.events
        include = self.include_token_ids
        stored_cls = wire.BlockStored
        for ev in events:
            if type(ev) is stored_cls:  # pylint: disable=unidiomatic-typecheck
                count = _raw_array_len(ev.token_ids)
                if count == -1:
                    return None  # let the generic path explain it
                ev.token_ids = wire.TOKEN_DECODER.decode(ev.token_ids) if include and count is not None else None
                ev.token_count = count
                ev.extra_keys = None
                ev.has_cache_salt = False
        rank = raw_batch.data_parallel_rank
        hint = "vllm"
        if fmt == "map" and raw_batch.attn_dp_rank is not None:
            rank = raw_batch.attn_dp_rank if rank is None else rank
            hint = "sglang"
        if self.engine != "auto":
            hint = self.engine
        return DecodedBatch(topic, seq, raw_batch.ts, rank, events, fmt, "map" if events else None, hint, None, None, True)

    # -- tolerant path --------------------------------------------------------------------
    def _decode_generic(self, payload, topic, seq):
        try:
            obj = wire.GENERIC_DECODER.decode(payload)
        except (wire.DecodeError, wire.ValidationError, TypeError, ValueError, RecursionError) as exc:
            raise MalformedMessage("the payload is not valid msgpack (%s)" % exc)
        hint = None
        if isinstance(obj, (list, tuple)):
            if len(obj) < 2:
                raise MalformedMessage("the event batch array has %d elements, expected [ts, events, rank]" % len(obj))
            fmt = "array"
            ts, events_in = obj[0], obj[1]
            rank = obj[2] if len(obj) > 2 else None
        elif isinstance(obj, dict):
            fmt = "map"
            if "events" not in obj:
                raise MalformedMessage("the event batch map has no 'events' key")
            ts, events_in = obj.get("ts"), obj["events"]
            rank = obj.get("data_parallel_rank")
            if rank is None and obj.get("attn_dp_rank") is not None:
                rank = obj["attn_dp_rank"]
                hint = "sglang"
        else:
            raise MalformedMessage("the event batch is a %s, expected an array or a map" % type(obj).__name__)
        if ts is not None and (not isinstance(ts, (int, float)) or isinstance(ts, bool)):
            raise MalformedMessage("the batch timestamp is a %s, expected a number" % type(ts).__name__)
        if not isinstance(events_in, (list, tuple)):
            raise MalformedMessage("the batch events are a %s, expected an array" % type(events_in).__name__)
        if rank is not None and not _is_int(rank):
            raise MalformedMessage("the batch data-parallel rank is a %s, expected an integer" % type(rank).__name__)
        events, unknown, errors = [], {}, []
        event_formats = set()
        for raw in events_in:
            try:
                ev, ev_fmt, ev_hint = self._event(raw)
            except MalformedMessage as exc:
                errors.append(str(exc))
                continue
            if ev_fmt:
                event_formats.add(ev_fmt)
            if ev_hint and hint is None:
                hint = ev_hint
            if isinstance(ev, str):
                unknown[ev] = unknown.get(ev, 0) + 1
            else:
                events.append(ev)
        if self.engine != "auto":
            hint = self.engine
        event_format = "+".join(sorted(event_formats)) if event_formats else None
        return DecodedBatch(topic, seq, ts, rank, events, fmt, event_format, hint, unknown, errors)

    def _event(self, raw):
        """Return (Event or unknown type name, wire format, engine hint)."""
        if isinstance(raw, dict):
            etype = raw.get("type")
            if not isinstance(etype, str):
                raise MalformedMessage("an event map has no string 'type' key")
            fields = raw
            fmt = "map"
            hint = "sglang" if isinstance(raw.get("metadata"), dict) else "vllm"
        elif isinstance(raw, (list, tuple)) and raw and isinstance(raw[0], str):
            etype = raw[0]
            fmt = "array"
            hint = None
            values = raw[1:]
            if etype == "BlockStored":
                order = VLLM_STORED_FIELDS
                if self.engine == "sglang" or (len(values) > 6 and isinstance(values[6], dict)):
                    order = SGLANG_STORED_FIELDS
                    hint = "sglang" if len(values) > 6 else None
                elif len(values) > 6:
                    hint = "vllm"
            elif etype == "BlockRemoved":
                order = REMOVED_FIELDS
                if len(values) > 2:
                    hint = "vllm"
            else:
                order = ()
            fields = dict(zip(order, values))
        else:
            raise MalformedMessage("an event is a %s, expected a map or a tagged array" % type(raw).__name__)
        if etype not in EVENT_TYPES:
            return etype, fmt, hint
        if isinstance(fields.get("medium"), str) and fields["medium"] in SGLANG_MEDIA:
            hint = "sglang"
        return self._build(etype, fields), fmt, hint

    def _build(self, etype, fields):
        if etype == "AllBlocksCleared":
            return Event(etype)
        hashes = fields.get("block_hashes")
        if not isinstance(hashes, (list, tuple)) or not all(_is_hash(h) for h in hashes):
            raise MalformedMessage("%s.block_hashes is not a list of uint64 integers or bytes" % etype)
        for name in _INT_FIELDS:
            value = fields.get(name)
            if value is not None and not _is_int(value):
                raise MalformedMessage("%s.%s is a %s, expected an integer" % (etype, name, type(value).__name__))
        for name in _STR_FIELDS:
            value = fields.get(name)
            if value is not None and not isinstance(value, str):
                raise MalformedMessage("%s.%s is a %s, expected a string" % (etype, name, type(value).__name__))
        if etype == "BlockRemoved":
            return Event(etype, list(hashes), medium=fields.get("medium"), group_idx=fields.get("group_idx"))
        parent = fields.get("parent_block_hash")
        if parent is not None and not _is_hash(parent):
            raise MalformedMessage("BlockStored.parent_block_hash is a %s, expected an integer or bytes" % type(parent).__name__)
        tokens = fields.get("token_ids")
        if tokens is not None and (not isinstance(tokens, (list, tuple)) or not all(_is_int(t) for t in tokens)):
            raise MalformedMessage("BlockStored.token_ids is not a list of integers")
        metadata = fields.get("metadata")
        salted = isinstance(metadata, dict) and bool(metadata.get("cache_salt"))
        return Event(etype, list(hashes), parent, None if tokens is None else len(tokens),
                     list(tokens) if (self.include_token_ids and tokens is not None) else None,
                     fields.get("block_size"), fields.get("lora_id"), fields.get("medium"), fields.get("lora_name"),
                     fields.get("group_idx"), fields.get("kv_cache_spec_kind"), fields.get("kv_cache_spec_sliding_window"),
                     salted)


def parse_replay_reply(frames):
    """Parse a DEALER-side replay reply.

    Shapes: ``[b"", topic, seq, payload]`` (vLLM >= 0.26), ``[b"", seq, payload]`` (older, SGLang);
    the leading empty delimiter may be absent. Returns ``(topic or None, seq, payload, is_end)``.
    """
    frames = list(frames)
    if len(frames) in (3, 4) and len(frames[0]) == 0:
        frames = frames[1:]
    if len(frames) == 3:
        topic, seq_frame, payload = frames
        topic = topic_to_str(topic)
    elif len(frames) == 2:
        topic = None
        seq_frame, payload = frames
    else:
        raise MalformedMessage("a replay reply has %d frames, expected [topic,] sequence, payload" % len(frames))
    if bytes(seq_frame) == END_SEQ_BYTES or len(payload) == 0:
        return topic, END_SEQ, b"", True
    return topic, seq_from_bytes(seq_frame), payload, False


class SequenceTracker:
    """Per (topic, rank) sequence bookkeeping: first/last seq, gaps, restarts."""

    def __init__(self):
        self.streams = {}
        self.gaps = []
        self.restarts = []

    @staticmethod
    def key(topic, rank):
        return "%s#%s" % (topic, 0 if rank is None else rank)

    def observe(self, topic, rank, seq):
        """Record a live seq. Returns ('first'|'next'|'gap'|'restart'|'duplicate', gap dict or None)."""
        key = self.key(topic, rank)
        stream = self.streams.get(key)
        if stream is None:
            self.streams[key] = {"topic": topic, "rank": 0 if rank is None else rank, "first": seq, "last": seq, "batches": 1}
            return "first", None
        last = stream["last"]
        stream["batches"] += 1
        if seq == last + 1:
            stream["last"] = seq
            return "next", None
        if seq > last + 1:
            gap = {"stream": key, "topic": topic, "rank": stream["rank"], "start": last + 1, "end": seq - 1,
                   "missing": seq - 1 - last, "repaired": False}
            self.gaps.append(gap)
            stream["last"] = seq
            return "gap", gap
        if seq == last:
            return "duplicate", None
        self.restarts.append({"stream": key, "topic": topic, "rank": stream["rank"], "from": last, "to": seq})
        stream["last"] = seq
        gap = None
        if seq > 0:  # the restarted engine already published batches 0..seq-1 that we did not see
            gap = {"stream": key, "topic": topic, "rank": stream["rank"], "start": 0, "end": seq - 1, "missing": seq, "repaired": False}
            self.gaps.append(gap)
        return "restart", gap

    def facts(self):
        found = len(self.gaps)
        repaired = sum(1 for g in self.gaps if g["repaired"])
        return {
            "seq": dict((k, {"first": v["first"], "last": v["last"], "batches": v["batches"]}) for k, v in self.streams.items()),
            "gaps": {"found": found, "repaired": repaired, "unrepaired": found - repaired, "details": self.gaps[:20]},
            "restarts": self.restarts[:20],
        }


class KVStats:
    """Aggregate counts over decoded batches (what the check module returns)."""

    def __init__(self, sample_size=3, max_tracked_hashes=1000000):
        self.counts = dict((t, 0) for t in EVENT_TYPES)
        self.batches = 0
        self.stored_blocks = 0
        self.stored_tokens = 0
        self.removed_blocks = 0
        self.block_sizes = set()
        self.batch_formats = set()
        self.event_formats = set()
        self.hash_formats = set()
        self.engines = set()
        self.topics = {}
        self.other_topics = {}
        self.ranks = set()
        self.sample = []
        self.sample_size = sample_size
        self.malformed = 0
        self.malformed_reason = None
        self.unknown_event_types = {}
        self.stored_hashes = set()
        self.max_tracked_hashes = max_tracked_hashes
        self.removed_after_stored = 0

    def add_malformed(self, reason):
        self.malformed += 1
        if self.malformed_reason is None:
            self.malformed_reason = reason

    def add_other_topic(self, topic):
        self.other_topics[topic] = self.other_topics.get(topic, 0) + 1

    def add_batch(self, batch):
        self.batches += 1
        self.topics[batch.topic] = self.topics.get(batch.topic, 0) + 1
        self.ranks.add(0 if batch.rank is None else batch.rank)
        self.batch_formats.add(batch.batch_format)
        if batch.event_format:
            self.event_formats.add(batch.event_format)
        if batch.engine_hint:
            self.engines.add(batch.engine_hint)
        for name, num in batch.unknown.items():
            self.unknown_event_types[name] = self.unknown_event_types.get(name, 0) + num
        for reason in batch.errors:
            self.add_malformed(reason)
        counts = self.counts
        for ev in batch.events:
            counts[ev.type] += 1
            hashes = ev.block_hashes
            if hashes:
                self.hash_formats.add("bytes" if isinstance(hashes[0], bytes) else "int")
            if ev.type == "BlockStored":
                self.stored_blocks += len(hashes)
                if ev.token_count:
                    self.stored_tokens += ev.token_count
                if ev.block_size is not None:
                    self.block_sizes.add(ev.block_size)
                if len(self.stored_hashes) < self.max_tracked_hashes:
                    self.stored_hashes.update(h if isinstance(h, int) else bytes(h) for h in hashes)
            elif ev.type == "BlockRemoved":
                self.removed_blocks += len(hashes)
                stored = self.stored_hashes
                self.removed_after_stored += sum(1 for h in hashes if (h if isinstance(h, int) else bytes(h)) in stored)
            if len(self.sample) < self.sample_size:
                item = ev.to_dict(max_hashes=4)
                item.pop("token_ids", None)
                item.update({"topic": batch.topic, "seq": batch.seq, "rank": batch.rank})
                self.sample.append(item)

    @staticmethod
    def _one_or_list(values):
        values = sorted(values, key=str)
        if not values:
            return None
        return values[0] if len(values) == 1 else values

    def engine(self):
        engines = self.engines
        if len(engines) == 1:
            return next(iter(engines))
        if not engines:
            return "unknown" if self.batches else None
        return "+".join(sorted(engines))

    def begin_window(self):
        """Forget the events counted so far and return how many batches that was.

        What describes the stream (formats, topics, engine, malformed frames) is kept; only the event accounting
        starts again, so that the counts describe what arrived from now on.
        """
        backlog = self.batches
        fresh = KVStats(self.sample_size, self.max_tracked_hashes)
        for name in ("counts", "batches", "stored_blocks", "stored_tokens", "removed_blocks", "removed_after_stored",
                     "block_sizes", "sample", "stored_hashes"):
            setattr(self, name, getattr(fresh, name))
        return backlog

    def facts(self):
        return {
            "counts": dict(self.counts),
            "batches": self.batches,
            "topics": dict(self.topics),
            "other_topics": dict(self.other_topics),
            "ranks": sorted(self.ranks),
            "block_size": self._one_or_list(self.block_sizes),
            "stored_blocks": self.stored_blocks,
            "stored_tokens": self.stored_tokens,
            "removed_blocks": self.removed_blocks,
            "removed_after_stored": self.removed_after_stored,
            "wire_format": {
                "batch": self._one_or_list(self.batch_formats),
                "events": self._one_or_list(self.event_formats),
                "hashes": self._one_or_list(self.hash_formats),
            },
            "engine": self.engine(),
            "sample": list(self.sample),
            "malformed": {"count": self.malformed, "first_reason": self.malformed_reason},
            "unknown_event_types": dict(self.unknown_event_types),
        }


def batch_json_lines(batch, include_token_ids=False):
    """One JSON line per event (metadata only unless token ids were opted in)."""
    lines = []
    for ev in batch.events:
        item = {"topic": batch.topic, "seq": batch.seq, "rank": batch.rank, "ts": batch.ts}
        item.update(ev.to_dict())
        if not include_token_ids:
            item.pop("token_ids", None)
        lines.append(json.dumps(item, sort_keys=True))
    return lines
