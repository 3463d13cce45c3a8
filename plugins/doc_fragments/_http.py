# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

import re


class ModuleDocFragment(object):

    # Options of an HTTP(S) connection to an OpenAI-compatible server;
    # paired with module_utils/http/args.py HTTP_ARG_SPEC (keep the two in lock-step;
    # tests/unit/plugins/doc_fragments/test_fragments.py holds them against each other).
    DOCUMENTATION = r"""
options:
  api_key:
    description: "Bearer token for the server, sent as C(Authorization: Bearer ...). Never logged."
    type: str
  validate_certs:
    description:
      - Verify the server's TLS certificate for C(https://) URLs.
      - Set to V(false) only for a server with a self-signed certificate you trust.
    type: bool
    default: true
  ca_path:
    description: PEM file of the certificate authorities to trust instead of the system's.
    type: path
  client_cert:
    description:
      - PEM file of a client certificate for servers that require mutual TLS.
      - It may contain the private key too; otherwise set O(client_key).
    type: path
  client_key:
    description: PEM file of the private key of O(client_cert). Requires O(client_cert).
    type: path
  use_proxy:
    description: Use the proxy named by the C(http_proxy), C(https_proxy) and C(no_proxy) environment variables.
    type: bool
    default: true
  max_body_bytes:
    description:
      - Largest answer read from the server, in bytes (a metrics page, a JSON answer, or a whole completion stream).
      - A larger answer fails the module with one sentence instead of filling memory.
      - Between 1024 and 1073741824.
    type: int
    default: 16777216
"""


# The names of the options above, and an O(...) reference to one of them.
_NAMES = tuple(re.findall(r"^  (\w+):$", ModuleDocFragment.DOCUMENTATION, re.M))
_REFERENCE = re.compile(r"O\((%s)(?=[)=])" % "|".join(_NAMES))


def http_suboptions(path, indent=4):
    """The options of DOCUMENTATION as the suboptions of the option ``path`` (``engines[]``, ``trigger``): YAML lines.

    Ansible merges a fragment's options into a module's at the top level only (a module's option replaces a fragment's
    option of the same name whole), so an option whose suboptions include the HTTP options is documented in a fragment
    of its own that takes them from here: the same text, every line ``indent`` spaces further in (4 for a top-level
    option's suboptions), each O() reference to one of them written under ``path`` (O(client_key) becomes
    O(engines[].client_key)).
    """
    body = ModuleDocFragment.DOCUMENTATION.split("options:\n", 1)[1]
    body = _REFERENCE.sub(lambda match: "O(%s.%s" % (path, match.group(1)), body)
    return "".join(" " * indent + line if line.strip() else line for line in body.splitlines(True))
