# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""The engines of a check over several engines, over HTTP (pure Python, no Ansible).

What ``kv_index_check``, ``epp_route_check`` and the benchmarks need of each engine's OpenAI-compatible server beside
its KV-event stream (``kv/live_index.py``): a name (given, else the topic's pod, else the URL's host and port), a client
with the collection's HTTP options, the model and the block and KV-cache sizes the engine reports on ``/metrics``
(``cache_config``), its tokenizer (``/tokenize``) and a completion's cached tokens. Failures are one ``CheckError``
sentence naming the engine; a check adds its facts.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import re

from ..common.errors import CheckError
from ..common.wiring import topic_pod
from ..http.args import client_options, http_problem
from ..http.openai import OpenAIClient, OpenAIHTTPError, cached_tokens, model_ids

CACHE_CONFIG_RE = re.compile(r'^vllm:cache_config_info\{([^}]*)\}', re.M)
LABEL_RE = re.compile(r'(\w+)="([^"]*)"')
PAD = " a"


def engines_problem(engines, name):
    """At least one engine, and the HTTP options of each usable (http_problem's sentences, before the types)."""
    if not engines:
        return "%s must list at least one engine (url, endpoint, topic)." % name
    for pos, engine in enumerate(engines):
        problem = http_problem(engine, "%s[%d]" % (name, pos)) if isinstance(engine, dict) else None
        if problem:
            return problem
    return None


def named(specs):
    """The engines' validated specs, each with its name (given, the topic's pod, or the URL's host:port) and a topic."""
    out = []
    for raw in specs:
        spec = dict(raw, topic=raw.get("topic") or "")
        spec["name"] = spec.get("name") or topic_pod(spec["topic"]) or spec["url"].split("//", 1)[1].rstrip("/")
        if spec["name"] in [s["name"] for s in out]:
            raise CheckError("Two engines are named %r; give each a distinct name (or topic)." % spec["name"])
        out.append(spec)
    return out


def cache_config(metrics_text):
    """``block_size`` and ``num_gpu_blocks`` from vLLM's ``vllm:cache_config_info`` labels (None when absent).

    The router reads the same labels (llm-d/llm-d-router@v0.9.0:
    pkg/epp/framework/plugins/datalayer/extractor/metrics/extractor.go).
    """
    match = CACHE_CONFIG_RE.search(metrics_text or "")
    labels = dict(LABEL_RE.findall(match.group(1))) if match else {}

    def number(name):
        value = labels.get(name, "")
        try:
            return int(float(value))
        except ValueError:
            return None
    return {"block_size": number("block_size"), "num_gpu_blocks": number("num_gpu_blocks")}


def make_client(spec, timeout, client_class=OpenAIClient):
    """An OpenAI-compatible client of the engine at ``spec["url"]`` (a trailing /v1 dropped) with its HTTP options."""
    base = spec["url"].rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    return client_class(base, timeout=timeout, **client_options(spec))


class Engine:
    """One engine: its spec, its HTTP client, what it reported of its cache, and the requests sent to it. ``stream`` is its
    KV-event stream in a ``LiveIndex`` (set by whoever holds the index)."""

    def __init__(self, spec, client):
        self.spec = spec
        self.name = spec["name"]
        self.client = client
        self.stream = None
        self.requests = 0
        self.block_size = None
        self.num_gpu_blocks = None


def discover(engines, model=None):
    """``(model, block_size)``: the model (``model``, else the first the first engine lists at /v1/models) and the one block
    size every engine reports on /metrics; each engine's ``block_size`` and ``num_gpu_blocks`` are set on the way."""
    for engine in engines:
        try:
            if not model:
                models = model_ids(engine.client.get_json("/v1/models"))
                if not models:
                    raise CheckError("%s lists no model; set model." % engine.client.url("/v1/models"))
                model = models[0]
            config = cache_config(engine.client.get_text("/metrics"))
        except OpenAIHTTPError as exc:
            raise CheckError("Engine %s cannot be queried: %s." % (engine.name, str(exc).rstrip(".")))
        engine.block_size = config["block_size"]
        engine.num_gpu_blocks = config["num_gpu_blocks"]
    sizes = set(e.block_size for e in engines if e.block_size)
    if len(sizes) > 1:
        raise CheckError("The engines run different block sizes (%s); this check needs one block size for all of them." % (
            ", ".join("%s %s" % (e.name, e.block_size) for e in engines)))
    return model, (sizes.pop() if sizes else None)


def tokenize(engine, model, prompt):
    """The engine's token ids of ``prompt`` (its ``/tokenize``)."""
    try:
        answer = engine.client.post_json("/tokenize", {"model": model, "prompt": prompt})
    except OpenAIHTTPError as exc:
        raise CheckError("Tokenizing through engine %s failed: %s." % (engine.name, str(exc).rstrip(".")))
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    if not isinstance(tokens, list):
        raise CheckError("Engine %s answered /tokenize without a token list." % engine.name)
    return tokens


def complete(engine, model, prompt, max_tokens):
    """``(prompt_tokens, cached_tokens)`` the engine reports for a greedy completion of ``prompt``."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    try:
        answer = engine.client.post_json("/v1/completions", body)
    except OpenAIHTTPError as exc:
        raise CheckError("A request to engine %s failed: %s." % (engine.name, str(exc).rstrip(".")))
    usage = (answer if isinstance(answer, dict) else {}).get("usage") or {}
    engine.requests += 1
    return usage.get("prompt_tokens"), cached_tokens(usage)


def require_cached_tokens(engine, reported):
    if reported is None:
        raise CheckError("Engine %s does not report usage.prompt_tokens_details.cached_tokens; start vLLM with "
                         "--enable-prompt-tokens-details." % engine.name)


def align(engine, model, prompt, block_size):
    """Pad a prompt to a whole number of blocks as the engine tokenizes it (a pad token per missing token first)."""
    count = len(tokenize(engine, model, prompt))
    if count % block_size:
        prompt += PAD * (block_size - count % block_size)
        for _i in range(2 * block_size):
            count = len(tokenize(engine, model, prompt))
            if count % block_size == 0:
                break
            prompt += PAD
    return prompt
