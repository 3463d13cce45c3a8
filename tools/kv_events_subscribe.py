#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Subscribe to a vLLM / SGLang KV-event stream and print one JSON line per event (redacted), then a summary.

Example (the local vLLM engine connects to tcp://127.0.0.1:5557, so bind):
  tools/kv_events_subscribe.py --endpoint tcp://127.0.0.1:5557 --bind --topic kv-events --max 10 --json
Exit status: 0 when at least one batch arrived and nothing was malformed, 1 otherwise (one sentence on stderr).
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
module_utils = _LOADER.module_utils


# The shared messages name the module's options; this tool says its own flags instead.
CLI_WORDS = (("set socket_mode=bind", "pass --bind"), ("set socket_mode=connect", "leave out --bind"),
             ("with socket_mode=connect", "without --bind"))


def cli_message(msg):
    for module_words, cli_words in CLI_WORDS:
        msg = msg.replace(module_words, cli_words)
    return msg


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--endpoint", required=True, help="ZMQ endpoint, e.g. tcp://127.0.0.1:5557")
    parser.add_argument("--bind", action="store_true", help="bind the endpoint (the engine connects); default: connect")
    parser.add_argument("--topic", default="", help="topic prefix to accept (default: all)")
    parser.add_argument("--engine", default="auto", choices=["auto", "vllm", "sglang"])
    parser.add_argument("--data-parallel-size", type=int, default=1)
    parser.add_argument("--replay-endpoint", help="ROUTER replay endpoint used to repair sequence gaps")
    parser.add_argument("--max", type=int, default=0, help="stop after this many events (default: until --timeout)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to listen in total (default 30)")
    parser.add_argument("--settle", type=float, default=1.0, help="with --max 0: stop after a quiet period once events arrived")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON (events are always JSON lines)")
    parser.add_argument("--include-token-ids", action="store_true", help="opt in to printing token ids")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    kv = module_utils("kv.events")
    report = module_utils("kv.report")
    check = module_utils("kv.events_check")
    errors = module_utils("common.errors")
    if not kv.HAS_MSGSPEC or not module_utils("kv.consumer").HAS_ZMQ:
        sys.stderr.write("error: this tool needs the pyzmq and msgspec Python libraries (pip install pyzmq msgspec).\n")
        return 2
    params = {
        "endpoint": args.endpoint, "socket_mode": "bind" if args.bind else "connect", "topic": args.topic,
        "engine": args.engine, "data_parallel_size": args.data_parallel_size, "replay_endpoint": args.replay_endpoint,
        "timeout": args.timeout, "expect": {}, "settle": 0.0 if args.max else args.settle, "include_token_ids": args.include_token_ids,
    }
    printed = [0]

    def show(batch, payload, live, source):  # pylint: disable=unused-argument
        """The check's hook for every batch it counts, live or replayed: one JSON line per event."""
        for line in report.batch_json_lines(batch, args.include_token_ids):
            if args.max and printed[0] >= args.max:
                return
            sys.stdout.write(line + "\n")
            printed[0] += 1
        sys.stdout.flush()

    runner = check.KVEventsCheck(params, on_batch=show, enough=(lambda: printed[0] >= args.max) if args.max else None)
    try:
        facts = runner.run()
        status = 0
    except errors.CheckError as exc:
        facts, status = exc.facts, 1
        sys.stderr.write("error: %s\n" % cli_message(exc.msg))
    except KeyboardInterrupt:
        return 130
    summary = dict((k, facts.get(k)) for k in ("counts", "batches", "seq", "gaps", "restarts", "topics", "other_topics", "ranks",
                                               "block_size", "stored_blocks", "stored_tokens", "removed_blocks", "wire_format",
                                               "engine", "malformed", "unknown_event_types", "elapsed"))
    if args.json:
        sys.stdout.write(json.dumps({"summary": summary}, sort_keys=True) + "\n")
    else:
        sys.stderr.write("summary: %d batches, counts %s, engine %s, wire %s, gaps %s, %.2fs\n" % (
            summary["batches"] or 0, summary["counts"], summary["engine"], summary["wire_format"], summary["gaps"], summary["elapsed"] or 0))
    return status


if __name__ == "__main__":
    sys.exit(main())
