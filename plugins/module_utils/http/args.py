# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""Option table of an HTTP(S) connection to an OpenAI-compatible server (auth, TLS, proxy, body limit).

One source of truth, documented by the ``inference_cache.substrate._http`` doc fragment
(``plugins/doc_fragments/_http.py``): keep the two in lock-step. The names follow
``ansible.module_utils.urls.url_argument_spec()`` (``validate_certs``, ``ca_path``, ``client_cert``, ``client_key``,
``use_proxy``). Plain Python, no Ansible import.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

from ..common.options import range_problems
from .openai import DEFAULT_MAX_BODY_BYTES

# The option table (common/options.py) of the HTTP options; ``argument_spec(HTTP_ARG_SPEC)`` is the AnsibleModule spec.
HTTP_ARG_SPEC = {
    "api_key": {"type": "str", "no_log": True},
    "validate_certs": {"type": "bool", "default": True},
    "ca_path": {"type": "path"},
    "client_cert": {"type": "path"},
    "client_key": {"type": "path", "no_log": False},
    "use_proxy": {"type": "bool", "default": True},
    "max_body_bytes": {"type": "int", "default": DEFAULT_MAX_BODY_BYTES, "range": (1024, 1024 * 1024 * 1024)},
}
# AnsibleModule(required_by=...): a key file alone is no client certificate.
HTTP_REQUIRED_BY = {"client_key": ["client_cert"]}
# The ranges of the table, for callers of range_problems.
HTTP_RANGES = dict((name, entry["range"]) for name, entry in HTTP_ARG_SPEC.items() if "range" in entry)
# How http_problem words an option of each type that is wrong ("%(got)s": the value given).
_WRONG_TYPE = {"bool": "true or false, got %(got)r", "int": "an integer, got %(got)r", "str": "a string", "path": "a file path"}
# The order http_problem checks the options in (the first problem is the one reported).
_ORDER = ("validate_certs", "use_proxy", "api_key", "ca_path", "client_cert", "client_key", "max_body_bytes")


def client_options(params):
    """Keyword arguments of ``http.openai.OpenAIClient`` from module parameters holding the options above."""
    return {
        "api_key": params.get("api_key"),
        "validate_certs": params.get("validate_certs", True),
        "ca_path": params.get("ca_path"),
        "client_cert": params.get("client_cert"),
        "client_key": params.get("client_key"),
        "use_proxy": params.get("use_proxy", True),
        "max_body_bytes": params.get("max_body_bytes") or DEFAULT_MAX_BODY_BYTES,
    }


def _type_problem(name, value):
    kind = HTTP_ARG_SPEC[name]["type"]
    ok = isinstance(value, bool) if kind == "bool" else (
        isinstance(value, int) and not isinstance(value, bool) if kind == "int" else isinstance(value, str))
    return None if ok else _WRONG_TYPE[kind] % {"got": value}


def http_problem(options, where=""):
    """The first thing wrong with the HTTP options in ``options`` as one sentence (None when they are usable).

    Read from HTTP_ARG_SPEC (types, required_by, ranges), for options that AnsibleModule does not validate: a trigger
    or an engine given as a plain mapping (the CLIs, the module's fallback after an ansible-core validator crash).
    ``where`` prefixes the option names, e.g. ``trigger``.
    """
    prefix = where + "." if where else ""
    for name in _ORDER:
        value = options.get(name)
        problem = None if value is None else _type_problem(name, value)
        if problem:
            return "%s%s must be %s." % (prefix, name, problem)
        if name in HTTP_REQUIRED_BY and options.get(name) and not all(options.get(need) for need in HTTP_REQUIRED_BY[name]):
            return "%s%s needs %s%s: a key file alone is no client certificate." % (prefix, name, prefix, HTTP_REQUIRED_BY[name][0])
    problems = range_problems(dict((prefix + name, options.get(name)) for name in HTTP_RANGES),
                              dict((prefix + name, bounds) for name, bounds in HTTP_RANGES.items()))
    return problems[0] if problems else None
