# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""SGLang's own argument parser for rendered ``python3 -m sglang.launch_server`` commands (issue 36 point 6).

Run with the Python of a venv holding ``sglang==0.5.12`` without its GPU kernels (tests/integration/
test_rendered_lmcache_commands.py makes it). ``_sglang_cli.py check OUT.jsonl`` reads ``{"commands": [{"id", "argv",
"env"}]}`` on stdin and writes one JSON line per command (after one with SGLang's version).

What runs is what ``python3 -m sglang.launch_server`` runs before it starts anything (``sglang/launch_server.py``:
``load_plugins()``, then ``prepare_server_args(sys.argv[1:])``, ``sglang/srt/server_args.py``): SGLang's parser with
every flag ``ServerArgs.add_cli_args`` registers, ``parse_args`` (an unknown flag, a bad type or choice exits), and
``ServerArgs.from_cli_args``, which maps every parsed attribute onto the dataclass. Only ``ServerArgs.__post_init__``
is left out: it asks the accelerator first (``get_device()`` raises "No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) is
available" on a CPU machine), then its memory and the model's config from the hub, none of which exist here. Then the
``--kv-events-config`` value goes through SGLang's ``KVEventsConfig.from_cli`` (``sglang/srt/disaggregation/
kv_events.py``, a pydantic model that ignores unknown keys, so each key must also be one of its fields here), with
``os.environ`` set to the pod's environment throughout.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import contextlib
import dataclasses
import importlib.metadata
import io
import json
import os
import sys
import traceback


class _Parsed(Exception):
    def __init__(self, fields):
        super(_Parsed, self).__init__("parsed")
        self.fields = fields


FACTS = ("model_path", "served_model_name", "host", "port", "page_size", "context_length", "tp_size", "mem_fraction_static",
         "enable_metrics", "enable_cache_report", "enable_lmcache", "kv_events_config")


def check(argv, env):
    from sglang.srt import server_args as sgl_args  # pylint: disable=import-error,import-outside-toplevel
    from sglang.srt.disaggregation.kv_events import KVEventsConfig  # pylint: disable=import-error,import-outside-toplevel

    if argv[:3] != ["python3", "-m", "sglang.launch_server"]:
        return {"stage": "parse", "error": "`%s` is not SGLang's launch_server" % " ".join(argv[:3])}

    def post_init(self):
        raise _Parsed(dict((f.name, getattr(self, f.name)) for f in dataclasses.fields(self) if f.name in FACTS))

    original = sgl_args.ServerArgs.__post_init__
    sgl_args.ServerArgs.__post_init__ = post_init
    saved_env, stderr = dict(os.environ), io.StringIO()
    os.environ.clear()
    os.environ.update(env)
    try:
        with contextlib.redirect_stderr(stderr):
            try:
                sgl_args.prepare_server_args(list(argv[3:]))
                return {"stage": "parse", "error": "prepare_server_args returned without building ServerArgs"}
            except _Parsed as parsed:
                fields = parsed.fields
            except SystemExit as exc:
                return {"stage": "parse", "error": "exit %s: %s" % (exc.code, _argparse_error(stderr.getvalue()))}
            except Exception as exc:  # pylint: disable=broad-except
                return {"stage": "build", "error": "%s: %s" % (type(exc).__name__, exc), "traceback": traceback.format_exc()[-2000:]}
        if fields.get("kv_events_config"):
            try:
                raw = json.loads(fields["kv_events_config"])
                unknown = sorted(set(raw) - set(KVEventsConfig.model_fields))
                if unknown:
                    raise ValueError("SGLang's KVEventsConfig has no field %s" % ", ".join(unknown))
                fields["kv_events_config"] = KVEventsConfig.from_cli(fields["kv_events_config"]).model_dump()
            except Exception as exc:  # pylint: disable=broad-except
                return {"stage": "kv_events_config", "error": "%s: %s" % (type(exc).__name__, exc)}
    finally:
        sgl_args.ServerArgs.__post_init__ = original
        os.environ.clear()
        os.environ.update(saved_env)
    return {"stage": "ok", "facts": json.loads(json.dumps(fields, default=str))}


def _argparse_error(text):
    """argparse's own sentence ("<prog>: error: ...") without the usage block before it."""
    lines = [line for line in text.strip().splitlines() if ": error: " in line]
    return lines[-1].strip() if lines else text.strip()[-2000:]


def main(argv):
    if argv[1:2] != ["check"] or len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    request = json.load(sys.stdin)
    from sglang.srt.plugins import load_plugins  # pylint: disable=import-error,import-outside-toplevel

    load_plugins()
    with open(argv[2], "w") as out:
        out.write(json.dumps({"sglang_version": importlib.metadata.version("sglang")}) + "\n")
        out.flush()
        for command in request["commands"]:
            try:
                result = check(command["argv"], command["env"])
            except Exception as exc:  # pylint: disable=broad-except
                result = {"stage": "crash", "error": "%s: %s" % (type(exc).__name__, exc), "traceback": traceback.format_exc()[-3000:]}
            result["id"] = command["id"]
            out.write(json.dumps(result, default=str) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
