# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""Argument dict of an HTTP(S) connection to an OpenAI-compatible server (auth, TLS, proxy, body limit).

One source of truth, documented by the ``inference_cache.substrate._http`` doc fragment
(``plugins/doc_fragments/_http.py``): keep the two in lock-step. The names follow
``ansible.module_utils.urls.url_argument_spec()`` (``validate_certs``, ``ca_path``, ``client_cert``, ``client_key``,
``use_proxy``). Plain Python, no Ansible import.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

from ..common.options import range_problems

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024

HTTP_ARG_SPEC = {
    "api_key": {"type": "str", "no_log": True},
    "validate_certs": {"type": "bool", "default": True},
    "ca_path": {"type": "path"},
    "client_cert": {"type": "path"},
    "client_key": {"type": "path", "no_log": False},
    "use_proxy": {"type": "bool", "default": True},
    "max_body_bytes": {"type": "int", "default": DEFAULT_MAX_BODY_BYTES},
}
# AnsibleModule(required_by=...): a key file alone is no client certificate.
HTTP_REQUIRED_BY = {"client_key": ["client_cert"]}
# Ranges of the numeric options, for _ranges.range_problems.
HTTP_RANGES = {"max_body_bytes": (1024, 1024 * 1024 * 1024)}


def client_options(params):
    """Keyword arguments of ``_openai_http.OpenAIClient`` from module parameters holding the options above."""
    return {
        "api_key": params.get("api_key"),
        "validate_certs": params.get("validate_certs", True),
        "ca_path": params.get("ca_path"),
        "client_cert": params.get("client_cert"),
        "client_key": params.get("client_key"),
        "use_proxy": params.get("use_proxy", True),
        "max_body_bytes": params.get("max_body_bytes") or DEFAULT_MAX_BODY_BYTES,
    }


def http_problem(options, where=""):
    """The first thing wrong with the HTTP options in ``options`` as one sentence (None when they are usable).

    For options that AnsibleModule does not validate: a trigger or an engine given as a plain mapping (the CLIs, the
    module's fallback after an ansible-core validator crash). ``where`` prefixes the option names, e.g. ``trigger``.
    """
    prefix = where + "." if where else ""
    for name in ("validate_certs", "use_proxy"):
        value = options.get(name)
        if value is not None and not isinstance(value, bool):
            return "%s%s must be true or false, got %r." % (prefix, name, value)
    for name, kind in (("api_key", "a string"), ("ca_path", "a file path"), ("client_cert", "a file path"), ("client_key", "a file path")):
        value = options.get(name)
        if value is not None and not isinstance(value, str):
            return "%s%s must be %s." % (prefix, name, kind)
    if options.get("client_key") and not options.get("client_cert"):
        return "%sclient_key needs %sclient_cert: a key file alone is no client certificate." % (prefix, prefix)
    for name in sorted(HTTP_RANGES):
        value = options.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            return "%s%s must be an integer, got %r." % (prefix, name, value)
    problems = range_problems(dict((prefix + name, options.get(name)) for name in HTTP_RANGES),
                              dict((prefix + name, bounds) for name, bounds in HTTP_RANGES.items()))
    return problems[0] if problems else None
