# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""Stream tracking for KV-event streams (pure Python, no Ansible, no sockets).

One stream is one (topic, data-parallel rank): vLLM numbers its batches 0, 1, 2, ... per publisher.
``SequenceTracker`` records the first and last sequence number of each stream, the gaps (batches the
subscriber never saw live, to be repaired through the replay endpoint), engine restarts, and the tail of a
stream: batches after the last one seen live, which no later sequence number reveals and which only a replay
request for "everything after the last seen" finds (``tail_start`` / ``record_tail``).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

MAX_STREAMS = 1024
MAX_DETAILS = 20


class SequenceTracker:
    """Per (topic, rank) sequence bookkeeping: first/last seq, batches that arrived live, gaps, restarts, tails."""

    def __init__(self, max_streams=MAX_STREAMS):
        self.streams = {}
        self.gaps = []
        self.restarts = []
        self.max_streams = max_streams

    @staticmethod
    def key(topic, rank):
        return "%s#%s" % (topic, 0 if rank is None else rank)

    def observe(self, topic, rank, seq):
        """Record a live seq.

        Returns ('first'|'next'|'gap'|'restart'|'duplicate'|'overflow', gap dict or None). 'overflow': a new stream
        beyond ``max_streams``, not tracked.
        """
        key = self.key(topic, rank)
        stream = self.streams.get(key)
        if stream is None:
            if len(self.streams) >= self.max_streams:
                return "overflow", None
            self.streams[key] = {"topic": topic, "rank": 0 if rank is None else rank, "first": seq, "last": seq, "batches": 1,
                                 "replayed": None}
            return "first", None
        last = stream["last"]
        if seq == last + 1:
            stream["batches"] += 1
            stream["last"] = seq
            return "next", None
        if seq > last + 1:
            stream["batches"] += 1
            gap = {"stream": key, "topic": topic, "rank": stream["rank"], "start": last + 1, "end": seq - 1,
                   "missing": seq - 1 - last, "repaired": False}
            self.gaps.append(gap)
            stream["last"] = seq
            return "gap", gap
        replayed = stream["replayed"]
        if seq == last or (replayed is not None and replayed[0] <= seq <= replayed[1]):
            return "duplicate", None  # already counted, live or from a tail replay
        stream["batches"] += 1
        self.restarts.append({"stream": key, "topic": topic, "rank": stream["rank"], "from": last, "to": seq})
        stream["last"] = seq
        stream["replayed"] = None
        gap = None
        if seq > 0:  # the restarted engine already published batches 0..seq-1 that we did not see
            gap = {"stream": key, "topic": topic, "rank": stream["rank"], "start": 0, "end": seq - 1, "missing": seq, "repaired": False}
            self.gaps.append(gap)
        return "restart", gap

    def tail_start(self, key):
        """The first sequence number after the last one seen on stream ``key`` (what a tail replay asks for)."""
        return self.streams[key]["last"] + 1

    def record_tail(self, key, seqs):
        """Record the batches a tail replay of stream ``key`` returned (``seqs``, each after the last seen).

        Returns the tail gap (repaired unless the replay skipped some sequence numbers), or None if nothing came back.
        Live messages with these sequence numbers that are still on their way are then duplicates.
        """
        stream = self.streams[key]
        start = stream["last"] + 1
        seqs = sorted(set(s for s in seqs if s >= start))
        if not seqs:
            return None
        end = seqs[-1]
        missing = end - start + 1
        gap = {"stream": key, "topic": stream["topic"], "rank": stream["rank"], "start": start, "end": end, "missing": missing,
               "repaired": len(seqs) == missing, "still_missing": missing - len(seqs), "tail": True}
        self.gaps.append(gap)
        stream["last"] = end
        stream["replayed"] = (start, end)
        return gap

    def facts(self):
        found = len(self.gaps)
        repaired = sum(1 for g in self.gaps if g["repaired"])
        tail = [g for g in self.gaps if g.get("tail")]
        return {
            "seq": dict((k, {"first": v["first"], "last": v["last"], "batches": v["batches"]}) for k, v in self.streams.items()),
            "gaps": {"found": found, "repaired": repaired, "unrepaired": found - repaired, "details": self.gaps[:MAX_DETAILS],
                     "tail": {"found": len(tail), "batches": sum(g["missing"] - g["still_missing"] for g in tail)}},
            "restarts": self.restarts[:MAX_DETAILS],
        }
