# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""kv/engines.py: the engines of a check over several engines, their names, clients, cache sizes, tokenizer and completions."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.errors import CheckError
from ansible_collections.inference_cache.substrate.plugins.module_utils.http.args import HTTP_ARG_SPEC
from ansible_collections.inference_cache.substrate.plugins.module_utils.http.openai import OpenAIHTTPError
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import engines as E
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.index_check import ENGINE_SPEC
from ansible_collections.inference_cache.substrate.tests.unit.plugins.kv_index_fake import FakeEngine
from ansible_collections.inference_cache.substrate.tests.unit.plugins.net_utils import free_port
from ansible_collections.inference_cache.substrate.tests.unit.plugins.sentences import assert_one_sentence


def test_engines_use_the_collections_http_options():
    """TLS, proxy and body limit per engine, with the same names and defaults as prefix_cache_check's."""
    made = []

    class Client(object):
        def __init__(self, base_url, timeout=None, **connection):
            made.append((base_url, timeout, connection))

    spec = {"url": "https://10.0.0.5:8443/v1", "endpoint": "tcp://127.0.0.1:1", "topic": "kv@a:1@m", "api_key": "k",
            "ca_path": "/ca.pem", "validate_certs": True, "use_proxy": False, "max_body_bytes": 2048}
    E.make_client(spec, 2.0, Client)
    connection = {"api_key": "k", "validate_certs": True, "ca_path": "/ca.pem", "client_cert": None, "client_key": None,
                  "use_proxy": False, "max_body_bytes": 2048}
    assert made == [("https://10.0.0.5:8443", 2.0, connection)]
    assert all(ENGINE_SPEC[name] == spec for name, spec in HTTP_ARG_SPEC.items())


@pytest.mark.parametrize("text, expected", [
    ('vllm:cache_config_info{_block_size_resolved="True",block_size="32",num_gpu_blocks="72"} 1.0\n', (32, 72)),
    ('# nothing\n', (None, None)),
    ('vllm:cache_config_info{block_size="x"} 1.0\n', (None, None)),
])
def test_cache_config(text, expected):
    config = E.cache_config(text)
    assert (config["block_size"], config["num_gpu_blocks"]) == expected


@pytest.mark.parametrize("spec, name", [
    ({"name": "given", "topic": "kv@10.0.0.1:8000@tiny", "url": "http://x:1"}, "given"),
    ({"topic": "kv@10.0.0.1:8000@tiny", "url": "http://x:1"}, "10.0.0.1:8000"),
    ({"topic": "kv-events", "url": "http://x:1"}, "kv-events"),
    ({"topic": None, "url": "http://10.0.0.2:8000/"}, "10.0.0.2:8000"),
])
def test_an_engine_is_named_by_its_name_its_topics_pod_or_its_url(spec, name):
    assert E.named([spec])[0]["name"] == name


def test_two_engines_of_one_name_are_one_sentence():
    spec = {"url": "http://127.0.0.1:1", "topic": "kv@a:1@m"}
    with pytest.raises(CheckError) as info:
        E.named([spec, dict(spec)])
    assert assert_one_sentence(info.value.msg) == "Two engines are named 'a:1'; give each a distinct name (or topic)."


@pytest.mark.parametrize("engines, expected", [
    ([], "engines must list at least one engine (url, endpoint, topic)."),
    ([{"url": "http://x:1", "validate_certs": "no"}], "engines[0].validate_certs must be true or false, got 'no'."),
    ([{"url": "http://x:1"}], None),
])
def test_engines_problem(engines, expected):
    assert E.engines_problem(engines, "engines") == expected


def _engine(fake, name="e"):
    return E.Engine({"name": name, "url": fake.url}, E.make_client({"url": fake.url}, 10.0))


def test_discover_tokenize_complete_align_against_a_fake_engine():
    with FakeEngine(free_port(), "tcp://127.0.0.1:%d" % free_port(), "kv@a:1@tiny", num_blocks=24) as fake:
        engine = _engine(fake)
        model, block_size = E.discover([engine])
        assert (model, block_size) == ("tiny", fake.block_size) and engine.num_gpu_blocks == 24
        prompt = E.align(engine, model, " ".join("word%d" % i for i in range(40)), block_size)
        tokens = E.tokenize(engine, model, prompt)
        assert len(tokens) % block_size == 0
        prompt_tokens, cached = E.complete(engine, model, prompt, 1)
        assert prompt_tokens == len(tokens) and cached == 0 and engine.requests == 1
        assert E.complete(engine, model, prompt, 1)[1] > 0


def test_an_unreachable_engine_and_missing_cached_tokens_are_one_sentence():
    engine = E.Engine({"name": "gone", "url": "http://127.0.0.1:%d" % free_port()}, None)
    engine.client = E.make_client(engine.spec, 2.0)
    with pytest.raises(CheckError) as info:
        E.discover([engine])
    assert assert_one_sentence(info.value.msg).startswith("Engine gone cannot be queried: ")
    with pytest.raises(CheckError) as info:
        E.tokenize(engine, "tiny", "x")
    assert assert_one_sentence(info.value.msg).startswith("Tokenizing through engine gone failed: ")
    with pytest.raises(CheckError) as info:
        E.require_cached_tokens(engine, None)
    assert "--enable-prompt-tokens-details" in assert_one_sentence(info.value.msg)
    assert issubclass(OpenAIHTTPError, CheckError)


def test_engines_of_different_block_sizes_are_refused():
    with FakeEngine(free_port(), "tcp://127.0.0.1:%d" % free_port(), "kv@a:1@tiny") as one:
        a, b = _engine(one, "a"), _engine(one, "b")
        original = b.client.get_text

        def other_size(path):
            text = original(path)
            return text.replace('block_size="%d"' % one.block_size, 'block_size="%d"' % (2 * one.block_size))
        b.client.get_text = other_size
        with pytest.raises(CheckError) as info:
            E.discover([a, b])
    assert assert_one_sentence(info.value.msg).startswith("The engines run different block sizes (a %d, b %d)" % (
        one.block_size, 2 * one.block_size))
