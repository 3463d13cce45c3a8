# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""Reporting for KV-event streams: counts over decoded batches and JSON lines (pure Python, no Ansible).

``Tally`` counts what a subscriber could not use (other topics, malformed messages); ``KVStats`` adds the counts
over decoded batches that the check module returns; ``batch_json_lines`` is what ``capture_path`` and the
subscriber CLI write. Neither ever contains token ids unless the caller opted in to decoding them.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json

from .events import EVENT_TYPES

MAX_TOPICS = 256
OTHER_TOPICS_OVERFLOW = "(more topics)"


class Tally:
    """What a subscriber could not use: messages under other topics (bounded) and malformed ones (the first reason kept).

    ``topics`` counts the batches accepted per topic (``KVStats`` fills it); ``accepts_topic`` bounds their number.
    """

    def __init__(self, max_topics=MAX_TOPICS):
        self.topics = {}
        self.other_topics = {}
        self.malformed = 0
        self.malformed_reason = None
        self.max_topics = max_topics

    def add_malformed(self, reason):
        self.malformed += 1
        if self.malformed_reason is None:
            self.malformed_reason = reason

    def add_other_topic(self, topic):
        """Count a message under a topic the check does not accept (at most ``max_topics`` names, then one bucket)."""
        if topic not in self.other_topics and len(self.other_topics) >= self.max_topics:
            topic = OTHER_TOPICS_OVERFLOW
        self.other_topics[topic] = self.other_topics.get(topic, 0) + 1

    def accepts_topic(self, topic):
        """False for a new topic beyond ``max_topics`` distinct accepted ones (the caller reports it as malformed)."""
        return topic in self.topics or len(self.topics) < self.max_topics


class KVStats(Tally):
    """Aggregate counts over decoded batches (what the check module returns)."""

    def __init__(self, sample_size=3, max_tracked_hashes=1000000, max_topics=MAX_TOPICS):
        super(KVStats, self).__init__(max_topics)
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
        self.ranks = set()
        self.sample = []
        self.sample_size = sample_size
        self.unknown_event_types = {}
        self.stored_hashes = set()
        self.max_tracked_hashes = max_tracked_hashes
        self.removed_after_stored = 0
        self.media = {}   # medium -> stored blocks and tokens, removed blocks, block sizes (a tier each: GPU, CPU, ...)

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
            if ev.type == "BlockStored":
                tokens = ev.token_count
                if tokens is not None and tokens < 0:  # the typed path counts on demand: token_ids was not an array
                    self.add_malformed("BlockStored.token_ids is not a list of integers")
                    continue
            counts[ev.type] += 1
            hashes = ev.block_hashes
            if hashes:
                self.hash_formats.add("bytes" if isinstance(hashes[0], bytes) else "int")
            if ev.type in ("BlockStored", "BlockRemoved"):
                medium = self.media.setdefault(ev.medium if isinstance(ev.medium, str) and ev.medium else "unspecified",
                                               {"stored_blocks": 0, "stored_tokens": 0, "removed_blocks": 0, "block_sizes": set()})
            if ev.type == "BlockStored":
                self.stored_blocks += len(hashes)
                medium["stored_blocks"] += len(hashes)
                if tokens:
                    self.stored_tokens += tokens
                    medium["stored_tokens"] += tokens
                if ev.block_size is not None:
                    self.block_sizes.add(ev.block_size)
                    medium["block_sizes"].add(ev.block_size)
                if len(self.stored_hashes) < self.max_tracked_hashes:
                    self.stored_hashes.update(h if isinstance(h, int) else bytes(h) for h in hashes)
            elif ev.type == "BlockRemoved":
                self.removed_blocks += len(hashes)
                medium["removed_blocks"] += len(hashes)
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
        fresh = KVStats(self.sample_size, self.max_tracked_hashes, self.max_topics)
        for name in ("counts", "batches", "stored_blocks", "stored_tokens", "removed_blocks", "removed_after_stored",
                     "block_sizes", "sample", "stored_hashes", "media"):
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
            # The same per medium (tier): vLLM's own cache says GPU (even on CPU); LMCache's connector adds CPU.
            "media": dict((name, {"stored_blocks": entry["stored_blocks"], "stored_tokens": entry["stored_tokens"],
                                  "removed_blocks": entry["removed_blocks"], "block_size": self._one_or_list(entry["block_sizes"])})
                          for name, entry in self.media.items()),
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
