# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A burst of KV-event batches through vLLM's own ZmqEventPublisher (run with the engine venv's Python).

vllm@v0.32.0:vllm/distributed/kv_events.py: ``ZmqEventPublisher(data_parallel_rank, endpoint, replay_endpoint,
buffer_steps, hwm, max_queue_size, topic)``; it connects to an endpoint without '*' and binds the replay ROUTER.
Every batch holds one BlockStored of one block. Prints one JSON line (batches published) when done, then keeps
serving replay requests for --linger seconds. With --go-on-stdin it first prints a ready line once vLLM is imported and
the publisher exists, and waits for a line on stdin.

  ~/.cache/inference_cache/local_engine/venv/bin/python tests/integration/_kv_vllm_burst.py \\
      --endpoint tcp://127.0.0.1:5600 --replay-endpoint tcp://*:5601 --batches 20000 --hwm 20 --buffer-steps 20000
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import argparse
import json
import sys
import time


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--replay-endpoint", required=True)
    parser.add_argument("--topic", default="kv@burst")
    parser.add_argument("--batches", type=int, default=20000)
    parser.add_argument("--hwm", type=int, default=20)
    parser.add_argument("--buffer-steps", type=int, default=20000)
    parser.add_argument("--start-delay", type=float, default=1.0, help="seconds between connecting and the burst (slow joiner)")
    parser.add_argument("--go-on-stdin", action="store_true",
                        help="once the publisher exists, print a ready line, then start the burst when a line arrives on stdin "
                             "(a test sends it once its check saw the connection), not after --start-delay")
    parser.add_argument("--linger", type=float, default=30.0)
    args = parser.parse_args(argv)
    from vllm.distributed.kv_events import BlockStored, KVEventBatch, ZmqEventPublisher  # pylint: disable=import-error,import-outside-toplevel

    pub = ZmqEventPublisher(0, endpoint=args.endpoint, replay_endpoint=args.replay_endpoint, buffer_steps=args.buffer_steps,
                            hwm=args.hwm, max_queue_size=args.batches + 10, topic=args.topic)
    if args.go_on_stdin:
        sys.stdout.write(json.dumps({"ready": True}) + "\n")
        sys.stdout.flush()
        sys.stdin.readline()
    else:
        time.sleep(args.start_delay)
    for step in range(args.batches):
        event = BlockStored(block_hashes=[step + 1], parent_block_hash=step or None, token_ids=list(range(16)), block_size=16,
                            lora_id=None, medium="GPU", lora_name=None)
        pub.publish(KVEventBatch(ts=time.time(), events=[event]))
    # The publisher thread drains its queue; wait until it did.
    while pub._event_queue.qsize():  # pylint: disable=protected-access
        time.sleep(0.01)
    sys.stdout.write(json.dumps({"published": args.batches}) + "\n")
    sys.stdout.flush()
    time.sleep(args.linger)  # the publisher thread keeps answering replay requests
    pub.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
