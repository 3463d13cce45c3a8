# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""Decoder for vLLM / SGLang KV-cache event messages and replay replies (pure Python, no Ansible).

Wire format (vLLM ``ZmqEventPublisher``, SGLang's copy of it):
ZMQ multipart ``[topic, seq (8 bytes big-endian), msgpack(EventBatch)]``.
``EventBatch`` is ``[ts, events, data_parallel_rank]`` (SGLang: ``attn_dp_rank``), or a map.
Each event is a map with ``"type"`` (vLLM >= 0.24) or a positional array ``["BlockStored", ...]``.

Entry point: ``KVDecoder(engine, include_token_ids).decode_frames(frames)`` (a live message) or
``.decode_payload(payload, topic, seq)`` (a replayed one); both return a batch or raise ``MalformedMessage``.
The typed fast path (``_kv_wire``) covers vLLM's map-encoded events; the tolerant path takes every other
shape (positional arrays, SGLang, unknown event types) and reports bad events one by one.

Token content never leaves the decoder unless ``include_token_ids`` is set: token ids are only counted
(``token_count``) and ``extra_keys`` (LoRA names, cache salts, multimodal hashes) are dropped. With
``include_token_ids`` both are kept (a KV-block index needs them: extra keys change a block's identity), and
neither ever goes into a report. Stream tracking
(sequence gaps, restarts) is in ``_kv_stream``, counting and JSON output in ``_kv_report``.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import traceback

from . import wire

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
                 "kv_cache_spec_sliding_window", "has_cache_salt", "extra_keys")

    def __init__(self, type_, block_hashes=None, parent_block_hash=None, token_count=None, token_ids=None,
                 block_size=None, lora_id=None, medium=None, lora_name=None, group_idx=None,
                 kv_cache_spec_kind=None, kv_cache_spec_sliding_window=None, has_cache_salt=False, extra_keys=None):
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
        self.extra_keys = extra_keys  # per-block extra keys, kept only with include_token_ids

    to_dict = wire.event_to_dict


class DecodedBatch:
    """One message decoded by the tolerant path (the typed path returns ``_kv_wire`` structs with these attributes)."""

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


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_hash(value):
    if isinstance(value, bytes):
        return True
    return _is_int(value) and -(1 << 63) <= value <= UINT64_MAX


class KVDecoder:
    """Decode KV-event messages.

    ``engine``: auto, vllm or sglang (sglang selects the SGLang positional field order and skips the typed path).
    ``include_token_ids``: decode token ids into lists (slower; for consumers that need the tokens, such as a
    KV-block index); by default they are only counted.
    ``max_payload``: payloads larger than this many bytes are refused with ``MalformedMessage``.
    """

    def __init__(self, engine="auto", include_token_ids=False, max_payload=MAX_PAYLOAD, max_topics=1024):
        if not HAS_MSGSPEC:
            raise RuntimeError("the msgspec Python library is required")
        self.engine = engine
        self.include_token_ids = include_token_ids
        self.max_payload = max_payload
        self.max_topics = max_topics
        self._forced = None if engine == "auto" else engine
        self._typed = list(wire.SHAPES_WITH_TOKENS if include_token_ids else wire.SHAPES) if engine != "sglang" else []
        self._fast = self._typed[0][1].decode if self._typed else None
        self._topics = {}

    # -- messages -------------------------------------------------------------------------
    def decode_frames(self, frames):
        """Decode a live PUB message ``[topic, seq, payload]``."""
        if len(frames) != 3:
            raise MalformedMessage("a message has %d frames instead of 3 (topic, sequence, payload)" % len(frames))
        topic, seq, payload = frames
        if len(seq) != 8:
            raise MalformedMessage("the sequence frame has %d bytes instead of 8" % len(seq))
        name = self._topics.get(topic)
        if name is None:
            name = topic_to_str(topic)
            if len(self._topics) < self.max_topics:  # a cache of topic names, bounded
                self._topics[bytes(topic)] = name
        fast = self._fast
        if fast is not None and len(payload) <= self.max_payload:  # the common case, inlined
            try:
                batch = fast(payload)
            except (wire.DecodeError, wire.ValidationError):
                pass
            else:
                # The typed batch is the decoded batch: no per-event work (token ids are counted on demand).
                batch.topic = name
                batch.seq = int.from_bytes(seq, "big")
                if self._forced:
                    batch.forced_engine = self._forced
                return batch
        return self.decode_payload(payload, name, int.from_bytes(seq, "big"))

    def decode_payload(self, payload, topic="", seq=None):
        """Decode one msgpack ``EventBatch`` (a live payload or a replayed one)."""
        if len(payload) > self.max_payload:
            raise MalformedMessage("a payload of %d bytes exceeds the %d-byte limit" % (len(payload), self.max_payload))
        for _fmt, decoder in self._typed:
            try:
                batch = decoder.decode(payload)
            except (wire.DecodeError, wire.ValidationError):
                continue
            self._fast = decoder.decode  # the last shape that worked is tried first
            batch.topic = topic
            batch.seq = seq
            if self._forced:
                batch.forced_engine = self._forced
            return batch
        return self._decode_generic(payload, topic, seq)

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
        keep = self.include_token_ids   # extra keys are read only when kept, as the typed path does
        extra = fields.get("extra_keys") if keep else None
        if extra is not None and (not isinstance(extra, (list, tuple)) or
                                  not all(e is None or isinstance(e, (list, tuple)) for e in extra)):
            raise MalformedMessage("BlockStored.extra_keys is not a list with one list (or nil) per block")
        metadata = fields.get("metadata")
        salted = isinstance(metadata, dict) and bool(metadata.get("cache_salt"))
        return Event(etype, list(hashes), parent, None if tokens is None else len(tokens),
                     list(tokens) if (keep and tokens is not None) else None,
                     fields.get("block_size"), fields.get("lora_id"), fields.get("medium"), fields.get("lora_name"),
                     fields.get("group_idx"), fields.get("kv_cache_spec_kind"), fields.get("kv_cache_spec_sliding_window"),
                     salted, None if extra is None else [None if e is None else list(e) for e in extra])


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
