# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""http/args.py: the HTTP options every check shares (one table), the client's keyword arguments and their sentences."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import pytest

from ansible_collections.inference_cache.substrate.plugins.module_utils.http import args as A


def test_client_options_take_the_tables_defaults():
    assert A.client_options({}) == {"api_key": None, "validate_certs": True, "ca_path": None, "client_cert": None, "client_key": None,
                                    "use_proxy": True, "max_body_bytes": A.DEFAULT_MAX_BODY_BYTES}
    assert A.client_options({"api_key": "k", "use_proxy": False})["use_proxy"] is False


@pytest.mark.parametrize("options, where, sentence", [
    ({}, "", None),
    ({"validate_certs": "no"}, "trigger", "trigger.validate_certs must be true or false, got 'no'."),
    ({"client_key": "/k.pem"}, "", "client_key needs client_cert: a key file alone is no client certificate."),
    ({"max_body_bytes": 10}, "engines[0]", "engines[0].max_body_bytes must be between 1024 and 1073741824, got 10."),
    ({"api_key": 3}, "", "api_key must be a string."),
])
def test_http_problem_is_the_first_thing_wrong_in_one_sentence(options, where, sentence):
    assert A.http_problem(options, where) == sentence


def test_the_spec_and_its_tables_agree():
    assert set(A.HTTP_RANGES) <= set(A.HTTP_ARG_SPEC) and set(A._ORDER) == set(A.HTTP_ARG_SPEC)  # pylint: disable=protected-access
    assert A.HTTP_ARG_SPEC["api_key"].get("no_log") is True
