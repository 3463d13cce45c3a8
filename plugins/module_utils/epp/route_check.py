# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""The check behind ``inference_cache.substrate.epp_route_check`` (pure Python, no Ansible).

Asks a running EPP where it routes each given request (``epp/extproc.ask_pick``: the ext_proc protocol Envoy
speaks; nothing reaches an engine) and holds each pick against the collection's KV-block index built from the
engines' own KV events (``kv/live_index.LiveIndex``: copies counted, the index ``kv_index_check`` proves exact), which
the check holds (``live``); the engines' HTTP side is ``kv/engines.py``'s. The precise router's claim is that its pick
holds the longest cached prefix of the request among the endpoints.

``RouteCheck(params).run()`` returns the facts or raises ``CheckError(msg, facts)``. Prompts and token ids stay in
this process; the facts carry counts and endpoint addresses only.

An engine whose KV-event sequence starts again while the check listens restarted in place: the collection's index
forgets its blocks, the EPP v0.9.0's does not (llm-d-kv-cache v0.9.0 clears a pod only on AllBlocksCleared; see
``kv/live_index.RESTART_WARNING``). The facts name it (``restarted_engines``, ``restart_warning``), and a pick of it
that misses the longest prefix says so.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json
import time
from urllib.parse import urlsplit

from ..common.errors import CheckError
from ..common.options import validate
from ..http.openai import OpenAIClient
from ..kv.args import ENGINE_ARG_SPEC
from ..kv.consumer import MAX_FRAME
from ..kv.engines import complete, named, require_cached_tokens, tokenize
from ..kv.index_check import start_engines
from ..kv.live_index import LiveIndex, OutOfTime, restart_warning
from .extproc import ask_pick, split_target


def _address_problem(value, name):
    try:
        split_target(value)
    except ValueError as exc:
        return "%s: %s." % (name, exc)
    return None


def _non_empty(value, name):
    return None if value else "%s must list at least one entry." % name


EPP_SPEC = {
    "address": {"type": "str", "required": True, "check": _address_problem},
    "tls": {"type": "bool", "default": False},
    "validate_certs": {"type": "bool", "default": True},
    "ca_path": {"type": "path"},
    "client_cert": {"type": "path"},
    "client_key": {"type": "path", "no_log": False},
    "server_name": {"type": "str"},
    "path": {"type": "str", "default": "/v1/completions"},
    "headers": {"type": "dict", "default": {}},
}
ROUTE_ENGINE_SPEC = dict(ENGINE_ARG_SPEC)
ROUTE_ENGINE_SPEC["address"] = {"type": "str", "check": _address_problem}
REQUEST_SPEC = {
    "prompt": {"type": "str", "required": True, "no_log": False},
    "name": {"type": "str"},
    "headers": {"type": "dict", "default": {}},
}
OPTIONS = {
    "epp": {"type": "dict", "required": True, "options": EPP_SPEC},
    "engines": {"type": "list", "elements": "dict", "required": True, "options": ROUTE_ENGINE_SPEC, "check": _non_empty},
    "requests": {"type": "list", "elements": "dict", "required": True, "options": REQUEST_SPEC, "check": _non_empty},
    "model": {"type": "str"},
    "max_tokens": {"type": "int", "default": 1, "no_log": False, "range": (1, None)},
    "expect_longest_prefix": {"type": "bool", "default": True},
    "send_to_pick": {"type": "bool", "default": False},
    "settle": {"type": "float", "default": 1.0, "range": (0, 3600)},
    "event_wait": {"type": "float", "default": 5.0, "range": (0, 3600)},
    "timeout": {"type": "float", "default": 120.0, "range": (0, None, "open-low")},
    "request_timeout": {"type": "float", "default": 30.0, "range": (0, None, "open-low")},
}


def url_address(url):
    """``host:port`` of an engine URL (port 80/443 by scheme when absent): how the EPP names an endpoint."""
    parts = urlsplit(url)
    host = "[%s]" % parts.hostname if ":" in parts.hostname else parts.hostname
    return "%s:%d" % (host, parts.port or (443 if parts.scheme.lower() == "https" else 80))


class RouteCheck:
    """Ask the EPP for each request's pick and judge it against the KV-block index of the engines' events."""

    def __init__(self, params, ask=ask_pick, clock=time.monotonic, client_class=OpenAIClient, ctx=None, max_frame=MAX_FRAME):
        self.params = params
        self.ask = ask
        self.clock = clock
        self.client_class = client_class
        self.live = LiveIndex(clock=clock, ctx=ctx, max_frame=max_frame)
        self.engines = []
        self.by_name = {}
        self.by_address = {}
        self.model = params.get("model")
        self.block_size = None
        self.picks = []

    # -- facts ----------------------------------------------------------------------------
    def facts(self):
        held = [p for p in self.picks if p["holds_longest"]]
        warm = [p for p in self.picks if p["longest_tokens"]]
        epp = self.params.get("epp")
        restarted = self.live.restarted_engines()
        facts = {
            "changed": False,
            "model": self.model,
            "block_size": self.block_size,
            "epp": epp.get("address") if isinstance(epp, dict) else None,
            "requests": len(self.picks),
            "holds_longest": len(held),
            "warm_requests": len(warm),
            "warm_holds_longest": sum(1 for p in warm if p["holds_longest"]),
            "picks": list(self.picks),
            "engines": dict((e.name, {"address": e.spec.get("address"), "batches": e.stream.batches,
                                      "held_blocks": self.live.index.size(e.name) if self.live.index is not None else 0,
                                      "restarts": e.stream.restarts}) for e in self.engines),
            "sent": sum(1 for p in self.picks if "cached_tokens" in p),
            "sent_cached_tokens": sum(p.get("cached_tokens", 0) for p in self.picks),
            "index_exact": sum(1 for p in self.picks if p.get("index_exact")),
            "restarted_engines": restarted,
            "restart_warning": restart_warning(restarted),
        }
        facts["summary"] = ("the EPP's pick held the longest cached prefix on %d of %d requests (%d of %d where an engine held "
                            "part of the prompt)" % (facts["holds_longest"], facts["requests"], facts["warm_holds_longest"],
                                                     facts["warm_requests"]))
        if facts["sent"]:
            facts["summary"] += ("; sent on to the picks, the engines reported %d cached tokens, as the index predicted on %d of %d"
                                 % (facts["sent_cached_tokens"], facts["index_exact"], facts["sent"]))
        return facts

    def fail(self, msg):
        raise CheckError(msg, self.facts())

    # -- validation -----------------------------------------------------------------------
    def prepare(self):
        """Validate the options (each engine named, with the address the EPP knows it by), open nothing yet."""
        try:
            self.params = validate(OPTIONS, self.params)
        except CheckError as exc:
            self.fail(exc.msg)
        specs = named(self.params["engines"])
        for pos, spec in enumerate(specs):
            spec["address"] = spec["address"] or url_address(spec["url"])
            for other in specs[:pos]:
                if spec["address"] == other["address"]:
                    self.fail("Engines %s and %s have the same address %s; give each the address the EPP knows it by." % (
                        other["name"], spec["name"], spec["address"]))
        self.by_address = dict((s["address"], s["name"]) for s in specs)
        self.params["engines"] = specs
        self.live.settle_quiet, self.live.event_wait = self.params["settle"], self.params["event_wait"]
        self.live.deadline = self.clock() + self.params["timeout"]
        self.engines, self.model, self.block_size = start_engines(self.params, self.live, self.client_class)
        self.by_name = dict((e.name, e) for e in self.engines)

    # -- the requests ---------------------------------------------------------------------
    def run(self, warm=None):
        """Route every request; ``warm()``, when given, runs once the engines' streams are open (a caller that warms a cache)."""
        try:
            self.prepare()
            with self.live.listening():
                if warm is not None:
                    since = dict((e.name, e.stream.activity) for e in self.engines)
                    warm()
                    # the engine that served the warm-up is not known: some stream's message, then the quiet period
                    self.live.heard_from_any(since, self.params["event_wait"])
                for pos, request in enumerate(self.params["requests"]):
                    self.route(pos, request)
            self.judge()
        except OutOfTime:
            raise CheckError("The check ran out of its %ss timeout after %d requests; raise timeout." % (
                self.params["timeout"], len(self.picks)), self.facts())
        except CheckError as exc:   # a component's sentence (a warm-up's too, its type kept), with the check's facts
            exc.facts = exc.facts or self.facts()
            raise
        return self.facts()

    def route(self, pos, request):
        self.live.settle()
        prompt = request["prompt"]
        tokens = dict((e.name, tokenize(e, self.model, prompt)) for e in self.engines)
        predicted = dict((name, self.live.predicted(name, ids)) for name, ids in tokens.items())
        epp = self.params["epp"]
        body = json.dumps({"model": self.model, "prompt": prompt, "max_tokens": self.params["max_tokens"]}).encode("utf-8")
        headers = dict(epp["headers"], **request["headers"])
        if self.clock() >= self.live.deadline:
            raise OutOfTime("out of time")
        answer = self.ask(epp["address"], body, headers=headers, path=epp["path"],
                          timeout=min(self.params["request_timeout"], max(self.live.deadline - self.clock(), 0.1)), tls=epp["tls"],
                          validate_certs=epp["validate_certs"], ca_path=epp["ca_path"], client_cert=epp["client_cert"],
                          client_key=epp["client_key"], server_name=epp["server_name"])
        picked = answer["picked"]
        name = self.by_address.get(picked)
        top = max(predicted.values())
        longest = sorted(n for n, held in predicted.items() if held == top)
        pick = {"request": request["name"] or pos, "picked": picked, "engine": name, "predicted": dict(predicted),
                "longest": longest, "longest_tokens": top, "holds_longest": name in longest}
        self.picks.append(pick)
        if name is None:
            self.fail("The EPP picked %s for request %s, which is none of the engines given (%s); give each engine the address "
                      "the EPP knows it by (engines[].address)." % (picked, pick["request"], ", ".join(sorted(self.by_address))))
        if self.params["send_to_pick"]:
            self.send(self.by_name[name], prompt, tokens[name], pick)

    def send(self, engine, prompt, ids, pick):
        """The request on to the picked engine, as the Gateway sends it: the engine's cached tokens for it (the index predicted
        them), then its KV events until every full block of the prompt is held (a condition, bounded by event_wait)."""
        since = engine.stream.activity
        prompt_tokens, reported = complete(engine, self.model, prompt, self.params["max_tokens"])
        require_cached_tokens(engine, reported)
        pick.update({"cached_tokens": reported, "prompt_tokens": prompt_tokens, "index_exact": reported == pick["predicted"][engine.name]})
        keys = self.live.prompt_keys(ids)
        self.live.settle(wait_for=engine.stream if len(keys) * self.block_size > reported else None, since=since,
                         until=lambda: self.live.held(engine.name, keys) >= len(keys))

    # -- verdict --------------------------------------------------------------------------
    def judge(self):
        if not self.params["expect_longest_prefix"]:
            return
        wrong = [p for p in self.picks if not p["holds_longest"]]
        if wrong:
            first = wrong[0]
            if self.by_name[first["engine"]].stream.restarts:
                why = ("%s restarted in place during the check and llm-d-kv-cache v0.9.0, the EPP v0.9.0's index, keeps a restarted "
                       "engine's old blocks until its pod is replaced (see restart_warning)" % first["engine"])
            elif self.params["send_to_pick"]:
                why = ("every request went to the engine the EPP picked, so even an approximate prefix-cache scorer learns the "
                       "prefix from its own picks: check that a prefix-cache scorer weighs enough in the EPP's profile")
            else:
                why = "check that the router runs precise prefix-cache scoring and receives these engines' events"
            self.fail("The EPP picked %s (%s) for request %s, which holds %d cached tokens of its prompt, while %s held %d, the longest "
                      "cached prefix by the engines' KV events (%d of %d picks missed it); %s." % (
                          first["engine"], first["picked"], first["request"], first["predicted"][first["engine"]],
                          " and ".join(first["longest"]), first["longest_tokens"], len(wrong), len(self.picks), why))
