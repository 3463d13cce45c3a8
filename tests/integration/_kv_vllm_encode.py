# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""KV-event batches encoded by vLLM's own classes and encoder (run with the engine venv's Python).

vllm@v0.32.0:vllm/distributed/kv_events.py: ``ZmqEventPublisher`` encodes each ``KVEventBatch`` with
``msgspec.msgpack.Encoder()``; the events are ``BlockStored``, ``BlockRemoved`` and ``AllBlocksCleared``. Every field
the 0.32 structs have is set in one event or another, with integer and bytes hashes. Prints one JSON line: a list of
{"name", "payload" (hex)}.

  ~/.cache/inference_cache/local_engine/venv/bin/python tests/integration/_kv_vllm_encode.py
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json
import sys


def main():
    import msgspec  # pylint: disable=import-error,import-outside-toplevel
    from vllm.distributed.kv_events import (  # pylint: disable=import-error,import-outside-toplevel
        AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch)

    big = 2 ** 64 - 5  # vLLM's 64-bit block hashes are often above the int64 range
    plain = BlockStored(block_hashes=[big, 7], parent_block_hash=None, token_ids=list(range(32)), block_size=16,
                        lora_id=None, medium="GPU", lora_name=None)
    full = BlockStored(block_hashes=[11, 12], parent_block_hash=big, token_ids=list(range(32, 64)), block_size=16,
                       lora_id=3, medium="CPU", lora_name="adapter", extra_keys=[("adapter", "salt"), None], group_idx=1,
                       kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=128, locality="LOCAL",
                       ownership="tier-2", session_id="session-1")
    as_bytes = BlockStored(block_hashes=[b"\x01" * 32], parent_block_hash=b"\x02" * 32, token_ids=list(range(16)),
                           block_size=16, lora_id=None, medium=None, lora_name=None)
    batches = {
        "stored": KVEventBatch(ts=1.5, events=[plain, full]),
        "stored-bytes-hashes": KVEventBatch(ts=2.5, events=[as_bytes]),
        "removed-and-cleared, rank 1": KVEventBatch(ts=3.5, events=[BlockRemoved(block_hashes=[big], medium="GPU"),
                                                                    BlockRemoved(block_hashes=[11], medium=None, group_idx=1,
                                                                                 locality="REMOTE", ownership="tier-2"),
                                                                    AllBlocksCleared()], data_parallel_rank=1),
    }
    encoder = msgspec.msgpack.Encoder()
    out = [{"name": name, "payload": encoder.encode(batch).hex()} for name, batch in batches.items()]
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
