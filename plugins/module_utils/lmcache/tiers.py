# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""What a precise router learns of the cache tiers from an engine's KV events (pure Python, no Ansible).

``TierWatch`` listens to one engine's KV-event stream while ``lmcache/check.py`` stores a prompt, makes the engine's
own prefix cache lose it and sends it again. It keeps every batch in arrival order and ``mark``s where the check was
when it sent the restored request; ``tiers`` then answers, per medium, what the events announced (``GPU``: vLLM's own
cache; ``CPU``: LMCache's host tier, which LMCache's connector in vLLM announces as BlockStored of medium CPU, one per
chunk) and what an index built from them (``kv/index.py``, the llm-d router's semantics) predicts for the restored
prompt, at the moment its engine's own cache is known to be empty: right after the AllBlocksCleared of the reset (vLLM
publishes it with the next engine step, the restored request's), else where the check marked.

Two indexes: the engine's own tier (events of every medium but CPU; AllBlocksCleared clears it) and LMCache's host
tier (medium CPU; a reset of vLLM's prefix cache leaves LMCache's chunks where they are, so it does not clear them).
What both together predict against what the engine and LMCache really served is the reuse a precise router could not
see. LMCache 0.5.6 announces stores only: nothing removes a host-tier entry, so the index keeps chunks LMCache evicted.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

from ..kv.consumer import KVConsumer, SocketSetupError, Source, unconnected
from ..kv.events import KVDecoder
from ..kv.index import KVBlockIndex, predicted_cached_tokens

HOST_MEDIUM = "CPU"
# The root key of the indexes (any name: only the chaining matters, the same for the events and the prompt).
INDEX_MODEL = "lmcache-check"


class EventsNotConnected(SocketSetupError):
    """The engine never connected to (or accepted) the check's KV-event socket: one sentence."""


def medium_of(event):
    """The tier an event concerns: ``CPU`` for LMCache's host tier, else the engine's own (vLLM says ``GPU`` even on CPU)."""
    medium = getattr(event, "medium", None)
    return medium if isinstance(medium, str) and medium else "GPU"


class TierWatch:
    """Listen to one engine's KV events during the check; ``tiers`` says what they told a router about each tier.

    ``endpoint``, ``bind``, ``topic``: the engine's stream (vLLM connects to an endpoint without ``*``: bind it).
    ``consumer``: stands in for ``kv/consumer.KVConsumer`` (tests).
    """

    def __init__(self, endpoint, bind=True, topic="", clock=None, consumer=None, connect_timeout=5.0):
        self.source = Source(endpoint, bind, topic)
        self.batches = []   # (arrival position, batch), in the order they came
        self.marks = {}
        self.connect_timeout = connect_timeout
        self.consumer = consumer or KVConsumer(KVDecoder("vllm", include_token_ids=True), self.on_batch,
                                               **({"clock": clock} if clock else {}))
        self.clock = self.consumer.clock

    def take_over(self, consumer):
        """Watch on ``consumer``, another watch's open subscription of the same stream (``RequestWindows.hand_over``),
        instead of subscribing anew: no wait for the engine to connect again, it decodes for this watch from now on.
        Returns this watch; its ``start()`` then drops what arrived before it, unread."""
        consumer.decoder = self.consumer.decoder
        consumer.tracker = None
        consumer.on_batch = self.on_batch
        self.source, self.consumer = consumer.listening()[0], consumer
        return self

    def on_batch(self, batch, payload, live, source):  # pylint: disable=unused-argument
        self.batches.append(batch)

    def start(self):
        """Open the socket and wait until the engine is connected; ``EventsNotConnected`` with one sentence if it never is."""
        if self.source.sock is not None:   # taken over, connected: what came before the check is not its own
            self.consumer.drain_all()
            del self.batches[:]
            return
        self.consumer.open(self.source)
        deadline = self.clock() + self.connect_timeout
        while not self.source.connected and self.clock() < deadline:
            self.consumer.poll(0.05)
            self.consumer.drain_all()
        if not self.source.connected:
            self.close()
            raise EventsNotConnected("The engine's KV events at %s never arrived within %.1f s: %s."
                                     % (self.source.endpoint, self.connect_timeout, unconnected(self.source.bind)))
        self.pump(0.1)  # the subscription reaches the publisher

    def pump(self, seconds):
        """Receive for ``seconds``."""
        deadline = self.clock() + seconds
        while True:
            self.consumer.poll(min(0.05, max(deadline - self.clock(), 0.001)))
            self.consumer.drain_all()
            if self.clock() >= deadline:
                return

    def settle(self, mark, quiet, most):
        """Receive until a batch arrived after ``mark`` and none for ``quiet`` seconds since, or ``most`` seconds passed."""
        deadline = self.clock() + most
        count, last = len(self.batches), self.clock()
        while self.clock() < deadline:
            self.consumer.poll(min(0.02, max(deadline - self.clock(), 0.001)))
            self.consumer.drain_all()
            if len(self.batches) != count:
                count, last = len(self.batches), self.clock()
            elif count > self.marks.get(mark, 0) and self.clock() - last >= quiet:
                return

    def wait_for(self, predicate, seconds):
        """Receive until ``predicate()`` holds or ``seconds`` passed; whether it held."""
        deadline = self.clock() + seconds
        while not predicate():
            if self.clock() >= deadline:
                return False
            self.consumer.poll(0.05)
            self.consumer.drain_all()
        return True

    def mark(self, name):
        """Remember how many batches had arrived (where the check was when it did ``name``)."""
        self.consumer.drain_all()
        self.marks[name] = len(self.batches)

    def stored_chunks(self, medium=HOST_MEDIUM):
        """BlockStored events of ``medium`` so far."""
        return sum(1 for batch in self.batches for ev in batch.events if ev.type == "BlockStored" and medium_of(ev) == medium)

    def close(self):
        self.consumer.close()

    # -- what the events told ---------------------------------------------------------
    def media(self):
        """Per medium: BlockStored / BlockRemoved events, blocks and tokens, the block sizes seen."""
        out = {}
        for batch in self.batches:
            for ev in batch.events:
                if ev.type not in ("BlockStored", "BlockRemoved"):
                    continue
                entry = out.setdefault(medium_of(ev), {"stored_events": 0, "stored_blocks": 0, "stored_tokens": 0,
                                                       "removed_blocks": 0, "block_sizes": []})
                hashes = ev.block_hashes or []
                if ev.type == "BlockStored":
                    entry["stored_events"] += 1
                    entry["stored_blocks"] += len(hashes)
                    entry["stored_tokens"] += len(ev.token_ids or [])
                    if ev.block_size and ev.block_size not in entry["block_sizes"]:
                        entry["block_sizes"].append(ev.block_size)
                else:
                    entry["removed_blocks"] += len(hashes)
        return out

    def tiers(self, prompt_token_ids, block_size, restored_mark="restored"):
        """What an index built from the events predicts for the restored prompt, per tier and in all.

        ``prompt_token_ids``: the restored prompt as the engine tokenizes it; ``block_size``: the engine's.
        """
        device = KVBlockIndex(block_size, INDEX_MODEL)
        host = KVBlockIndex(block_size, INDEX_MODEL)
        mark = self.marks.get(restored_mark, len(self.batches))
        after_clear = False
        for position, batch in enumerate(self.batches):
            late = position >= mark   # arrived after the restored request was sent
            for ev in batch.events:
                if ev.type == "AllBlocksCleared":
                    device.cleared("engine")
                    if late:   # the reset's, published with the restored request's first engine step
                        after_clear = True
                        break
                elif not late:
                    index = host if medium_of(ev) == HOST_MEDIUM else device
                    if ev.type == "BlockStored" and ev.token_ids is not None:
                        index.stored("engine", ev.block_hashes, ev.parent_block_hash, ev.token_ids, ev.block_size,
                                     getattr(ev, "lora_name", None))
                    elif ev.type == "BlockRemoved":
                        index.removed("engine", ev.block_hashes)
            if after_clear:
                break
        keys = device.prompt_keys(list(prompt_token_ids))
        held_device = device.engines.get("engine")
        held_host = host.engines.get("engine")

        def leading(*helds):
            count = 0
            for key in keys:
                if not any(h is not None and key in h.held for h in helds):
                    break
                count += 1
            return count
        prompt_tokens = len(prompt_token_ids)
        return {
            "device_tokens": predicted_cached_tokens(leading(held_device), prompt_tokens, block_size),
            "host_tokens": predicted_cached_tokens(leading(held_host), prompt_tokens, block_size),
            "predicted_tokens": predicted_cached_tokens(leading(held_device, held_host), prompt_tokens, block_size),
            "after_clear": after_clear,
        }
