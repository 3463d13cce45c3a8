# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Each doc fragment against the option table it documents, and each module that extends one against its own table.

Every option of a table is documented with the same type, default, choices, required and elements (suboptions too),
and every documented option is in the table, so a fragment and its spec cannot drift apart. The modules' documentation
is merged the way Ansible merges it (``ansible.utils.plugin_docs.add_fragments``: top-level options only).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import ast
import copy
import importlib
import os

import pytest
import yaml
from ansible.utils.plugin_docs import add_fragments

from ansible_collections.inference_cache.substrate.plugins.doc_fragments import _engines, _http, kv_events
from ansible_collections.inference_cache.substrate.plugins.module_utils.common.options import argument_spec
from ansible_collections.inference_cache.substrate.plugins.module_utils.epp import route_check
from ansible_collections.inference_cache.substrate.plugins.module_utils.http.args import HTTP_ARG_SPEC
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import events_check, index_check
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.args import ENGINE_ARG_SPEC, KV_STREAM_ARG_SPEC

COLLECTION = "inference_cache.substrate."
PACKAGE = "ansible_collections.inference_cache.substrate.plugins."
# The fragments that document options (``_attributes`` documents attributes only).
OPTION_FRAGMENTS = ("_http", "_engines", "kv_events")
# (fragment attribute, the option table it documents: {option: argument_spec entry}).
PAIRS = {
    "_http": (_http.ModuleDocFragment.DOCUMENTATION, HTTP_ARG_SPEC),
    "kv_events": (kv_events.ModuleDocFragment.DOCUMENTATION, KV_STREAM_ARG_SPEC),
    "kv_events.TRIGGER": (kv_events.ModuleDocFragment.TRIGGER, {"trigger": events_check.CHECK_ARG_SPEC["trigger"]}),
    "_engines": (_engines.ModuleDocFragment.DOCUMENTATION, {"engines": {"type": "list", "elements": "dict", "required": True,
                                                                        "options": ENGINE_ARG_SPEC}}),
    "_engines.KV_INDEX": (_engines.ModuleDocFragment.KV_INDEX, {"engines": index_check.OPTIONS["engines"]}),
    "_engines.EPP_ROUTE": (_engines.ModuleDocFragment.EPP_ROUTE, {"engines": route_check.OPTIONS["engines"]}),
}
MODULE_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "plugins", "modules")


def _extends(path):
    """The fragments a module file's DOCUMENTATION extends (read from the source, without importing it)."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["DOCUMENTATION"]:
            return list(yaml.safe_load(node.value.value).get("extends_documentation_fragment") or [])
    return []


# Every module that extends an option fragment; each is held against its option table (the module's OPTIONS).
MODULES = sorted(name[:-3] for name in os.listdir(MODULE_DIR) if name.endswith(".py") and any(
    fragment[len(COLLECTION):].split(".")[0] in OPTION_FRAGMENTS for fragment in _extends(os.path.join(MODULE_DIR, name))))


def _value(entry, key, absent=None):
    value = entry.get(key, absent)
    return (isinstance(value, bool), value)  # true is no 1


def drift(documented, spec, where=""):
    """Sentences naming every difference between documented options and an argument spec (empty when they agree)."""
    found = []
    for name in sorted(set(documented) - set(spec)):
        found.append("%s%s is documented but not in the spec." % (where, name))
    for name in sorted(set(spec) - set(documented)):
        found.append("%s%s is in the spec but not documented." % (where, name))
    for name in sorted(set(spec) & set(documented)):
        doc, arg = documented[name], spec[name]
        for key, absent in (("type", "str"), ("default", None), ("choices", None), ("required", False), ("elements", None)):
            if _value(doc, key, absent) != _value(arg, key, absent):
                found.append("%s%s: %s is %r in the docs but %r in the spec." % (where, name, key, doc.get(key, absent), arg.get(key, absent)))
        if "suboptions" in doc or "options" in arg:
            found += drift(doc.get("suboptions") or {}, arg.get("options") or {}, "%s%s." % (where, name))
    return found


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_each_fragment_documents_its_spec(pair):
    text, table = PAIRS[pair]
    assert drift(yaml.safe_load(text)["options"], argument_spec(table)) == []


class FragmentLoader:
    """The collection's fragments by name, for ``add_fragments`` (None for a name with an attribute, as Ansible's)."""

    @staticmethod
    def get(name):
        short = name[len(COLLECTION):] if name.startswith(COLLECTION) else None
        if not short or "." in short:
            return None
        fragment = importlib.import_module(PACKAGE + "doc_fragments." + short).ModuleDocFragment()
        fragment.ansible_name = name
        return fragment


def module_doc(name):
    module = importlib.import_module(PACKAGE + "modules." + name)
    doc = yaml.safe_load(module.DOCUMENTATION)
    extends = list(doc.get("extends_documentation_fragment", []))
    add_fragments(doc, module.__file__, FragmentLoader(), is_module=True)
    return module, extends, doc


def test_the_modules_with_a_fragment_are_found():
    assert set(MODULES) >= {"epp_route_check", "kv_events_check", "kv_index_check", "prefix_cache_check"}, MODULES


@pytest.mark.parametrize("name", MODULES)
def test_each_module_with_a_fragment_documents_its_table(name):
    module, extends, doc = module_doc(name)
    assert extends == _extends(module.__file__)
    assert hasattr(module, "OPTIONS"), "%s extends %s: name its option table OPTIONS in the module" % (name, extends)
    assert drift(doc["options"], argument_spec(module.OPTIONS)) == []


def test_no_module_copies_what_a_fragment_documents():
    """The engines' and the trigger's suboptions come from the fragments only: no module documents them again."""
    for name in sorted(n[:-3] for n in os.listdir(MODULE_DIR) if n.endswith(".py")):
        text = importlib.import_module(PACKAGE + "modules." + name).DOCUMENTATION
        assert "\n  engines:\n" not in text and "\n  trigger:\n" not in text, name
        assert "use_proxy:" not in text, "%s writes out the HTTP options; extend the _http or _engines fragment" % name


def test_nested_http_options_name_their_own_path():
    text = _http.http_suboptions("engines[]")
    assert "O(engines[].client_key)" in text and "O(engines[].client_cert)" in text and "O(client_" not in text
    assert yaml.safe_load("options:\n  x:\n    suboptions:\n" + text)["options"]["x"]["suboptions"] == yaml.safe_load(
        _http.ModuleDocFragment.DOCUMENTATION.replace("O(client_", "O(engines[].client_"))["options"]


@pytest.mark.parametrize("change, sentence", [
    (lambda s: s["engines"]["options"]["socket_mode"].update(default="bind"),
     "engines.socket_mode: default is 'connect' in the docs but 'bind' in the spec."),
    (lambda s: s["engines"]["options"].pop("topic"), "engines.topic is documented but not in the spec."),
    (lambda s: s["engines"]["options"].update(extra={"type": "int"}), "engines.extra is in the spec but not documented."),
    (lambda s: s["engines"]["options"]["use_proxy"].update(default=1), "engines.use_proxy: default is True in the docs but 1 in the spec."),
    (lambda s: s["engines"].update(required=False), "engines: required is True in the docs but False in the spec."),
    (lambda s: s["engines"]["options"]["validate_certs"].update(type="str"),
     "engines.validate_certs: type is 'bool' in the docs but 'str' in the spec."),
])
def test_a_drift_is_named(change, sentence):
    """The comparison fails on each kind of drift (a test that cannot fail is a defect)."""
    text, table = PAIRS["_engines.KV_INDEX"]
    spec = copy.deepcopy(argument_spec(table))
    change(spec)
    assert sentence in drift(yaml.safe_load(text)["options"], spec)
