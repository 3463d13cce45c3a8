#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Synthetic KV-event publisher: real-shaped vLLM (map or array events) and SGLang frames, with a replay ROUTER.

The publisher itself is tests/harness/kv_synthetic.py (test and tool code, kept out of the modules' payload).

Examples:
  # like vLLM with tcp://*:5557 (binds), replay on 5558, a repairable gap at batch 3 and a restart at batch 6
  tools/kv_events_publish.py --endpoint tcp://127.0.0.1:5557 --bind --replay-endpoint tcp://127.0.0.1:5558 \\
      --count 10 --drop-at 3 --restart-at 6 --wait-subscriber 10
  # like vLLM with tcp://127.0.0.1:5557 (connects to a binding subscriber)
  tools/kv_events_publish.py --endpoint tcp://127.0.0.1:5557 --format vllm-array --count 5
  # the tail of a burst lost at the high-water mark: the last 3 of 10 batches only in the replay buffer
  tools/kv_events_publish.py --endpoint tcp://127.0.0.1:5557 --replay-endpoint tcp://127.0.0.1:5558 --count 10 \\
      --drop-tail 3 --linger 60 --until-unsubscribed
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import argparse
import importlib.util
import json
import os
import sys

# The collection's Python by its full name, through its one loader (this file is tools/ of a checkout).
_LOADER_SPEC = importlib.util.spec_from_file_location(
    "inference_cache_substrate_loader", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "plugins", "module_utils", "_loader.py"))
_LOADER = importlib.util.module_from_spec(_LOADER_SPEC)
_LOADER_SPEC.loader.exec_module(_LOADER)
_LOADER.collection()
from ansible_collections.inference_cache.substrate.tests.harness import kv_synthetic as synth  # noqa: E402  pylint: disable=wrong-import-position


def _ints(text):
    return set(int(x) for x in text.split(",") if x.strip()) if text else set()


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--bind", action="store_true", help="bind the PUB endpoint (default: connect, like vLLM without '*')")
    parser.add_argument("--replay-endpoint", help="bind a replay ROUTER here")
    parser.add_argument("--topic", default="")
    parser.add_argument("--format", default="vllm-map", choices=["vllm-map", "vllm-array", "sglang"])
    parser.add_argument("--batch-format", default="array", choices=["array", "map"])
    parser.add_argument("--hashes", default="int", choices=["int", "bytes"])
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--rank", type=int, default=0, help="data-parallel rank stamped into batches")
    parser.add_argument("--no-replay-topic", action="store_true", help="replay replies without the topic frame (vLLM < 0.26)")
    parser.add_argument("--count", type=int, default=10, help="batches to publish")
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between batches")
    parser.add_argument("--duration", type=float, default=60.0, help="hard limit on the run time in seconds")
    parser.add_argument("--wait-subscriber", type=float, default=0.0, help="wait up to this long for a subscription first")
    parser.add_argument("--linger", type=float, default=0.0, help="keep serving replay at most this long after the last batch")
    parser.add_argument("--until-unsubscribed", action="store_true",
                        help="with --linger: stop as soon as the subscriber has gone (a check closes its socket once done)")
    parser.add_argument("--drop-at", default="", help="batch indexes published only to the replay buffer (repairable gaps)")
    parser.add_argument("--skip-at", default="", help="batch indexes before which one seq is skipped (unrepairable gaps)")
    parser.add_argument("--restart-at", default="", help="batch indexes at which the engine 'restarts' (seq back to 0)")
    parser.add_argument("--unknown-at", default="", help="batch indexes that carry an extra event of an unknown type")
    parser.add_argument("--malformed-at", default="", help="batch indexes replaced by a garbage payload")
    parser.add_argument("--drop-tail", type=int, default=0,
                        help="publish the last N batches only to the replay buffer (a tail lost at the high-water mark)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if not synth.HAS_ZMQ or not synth.HAS_MSGSPEC:
        sys.stderr.write("error: this tool needs the pyzmq and msgspec Python libraries (pip install pyzmq msgspec).\n")
        return 2
    try:
        pub = synth.SyntheticPublisher(args.endpoint, bind=args.bind, replay_endpoint=args.replay_endpoint, topic=args.topic,
                                       wire_format=args.format, hash_kind=args.hashes, block_size=args.block_size, rank=args.rank,
                                       replay_topic=not args.no_replay_topic, batch_format=args.batch_format)
    except synth.SocketSetupError as exc:
        sys.stderr.write("error: %s\n" % exc)
        return 1
    try:
        sent = pub.run(count=args.count, interval=args.interval, drop_at=_ints(args.drop_at), skip_at=_ints(args.skip_at),
                       restart_at=_ints(args.restart_at), unknown_at=_ints(args.unknown_at),
                       malformed_at=_ints(args.malformed_at), wait_subscriber=args.wait_subscriber, linger=args.linger,
                       duration=args.duration, drop_tail=args.drop_tail, until_unsubscribed=args.until_unsubscribed)
    except KeyboardInterrupt:
        sent = pub.sent
    finally:
        pub.close()
    sys.stdout.write(json.dumps({"sent": sent, "last_seq": pub.seq - 1, "format": args.format}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
