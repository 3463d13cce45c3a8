# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What the benchmarks share as clients of the collection.

* The collection's Python by its full name (``ansible_collections.inference_cache.substrate.plugins.module_utils...``),
  made importable by its one loader (``plugins/module_utils/_loader.py``), as every program outside a collection path does.
* ``load_engines(path)``: the engines a benchmark's playbook started, from the file it wrote: what their roles published
  (``local_engine_instances``: URL, what a subscriber needs, the service record), as the specs the collection's checks take.
* ``restart(engine)``: stop and start one of them again part way, through the service record its role published
  (``service/supervisor.restart``, what ``local_service`` does), then wait until it answers: a benchmark never runs
  ``ansible-playbook``; its playbook starts the engines before it and stops them after it (``always``).
"""

from __future__ import absolute_import, division, print_function

import importlib.util
import json
import os
import time
from urllib.parse import urlsplit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LOADER_SPEC = importlib.util.spec_from_file_location(
    "inference_cache_substrate_loader", os.path.join(ROOT, "plugins", "module_utils", "_loader.py"))
_LOADER = importlib.util.module_from_spec(_LOADER_SPEC)
_LOADER_SPEC.loader.exec_module(_LOADER)
_LOADER.collection()

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.errors import CheckError  # noqa: E402  pylint: disable=wrong-import-position
from ansible_collections.inference_cache.substrate.plugins.module_utils.http.openai import OpenAIClient, OpenAIHTTPError  # noqa: E402  pylint: disable=wrong-import-position
from ansible_collections.inference_cache.substrate.plugins.module_utils.service import supervisor  # noqa: E402  pylint: disable=wrong-import-position


def load_engines(path):
    """``[spec]`` of the engines file a benchmark playbook writes (``{"engines": local_engine_instances}``), sorted by name:
    name, url, host, port, endpoint, socket_mode, topic, replay_endpoint, num_gpu_blocks and the service record."""
    with open(path, encoding="utf-8") as handle:
        published = json.load(handle)["engines"]
    specs = []
    for name, info in sorted(published.items()):
        sub = info.get("kv_subscriber") or {}
        where = urlsplit(info["url"])
        specs.append({"name": name, "url": info["url"], "host": info.get("address") or where.hostname,
                      "port": int(info.get("port") or where.port), "endpoint": sub.get("endpoint"), "socket_mode": sub.get("socket_mode"),
                      "topic": sub.get("topic") or "", "replay_endpoint": sub.get("replay_endpoint") or None,
                      "num_gpu_blocks": info.get("num_gpu_blocks"), "service": info.get("service") or {}})
    return specs


def reachable(url, path="/health", timeout=5.0):
    """None when ``url`` + ``path`` answers, else why not (one clause)."""
    try:
        OpenAIClient(url, timeout=timeout).get_text(path)
    except OpenAIHTTPError as exc:
        return exc.msg
    return None


def healthy(url):
    try:
        OpenAIClient(url.rsplit("/", 1)[0], timeout=5.0).get_text("/" + url.rsplit("/", 1)[1])
        return True
    except OpenAIHTTPError:
        return False


def restart(engine, wait=300.0):
    """Stop and start ``engine`` (a spec of ``load_engines``) through its role's service record; until it answers again."""
    if not engine.get("service"):
        raise CheckError("Engine %s has no service record, so it cannot be restarted here; start the engines with the benchmark's "
                         "playbook, whose engines file holds each one's record." % engine["name"])
    try:
        supervisor.restart(engine["service"], healthy)
    except CheckError as exc:
        raise CheckError("Restarting %s failed: %s" % (engine["name"], exc.msg))
    deadline = time.monotonic() + wait
    while reachable(engine["url"]):
        if time.monotonic() > deadline:
            raise CheckError("%s did not answer within %d s of its restart." % (engine["name"], wait))
        time.sleep(1)
