# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""The one way into this collection's Python for a program that does not run inside a collection path.

The collection's Python is imported one way: by its full name,
``ansible_collections.inference_cache.substrate.plugins.module_utils.<family>.<name>`` (modules, filters, tests, tools,
benchmarks, the roles' programs), and relatively between the files of ``plugins/module_utils``. Ansible and the tests
find that name on a collections path. A program started from a checkout or a copied folder (the hand-run tools, the
benchmarks, the in-cluster verifier, the roles' daemons, a confined program's side inside its network namespace) first
makes the name importable with this file, found beside its own path (by its file, not ``runpy.run_path``, which
Ansible's path hooks turn away)::

    import importlib.util, os
    _LOADER_SPEC = importlib.util.spec_from_file_location(
        "inference_cache_substrate_loader", os.path.join(COLLECTION_ROOT, "plugins", "module_utils", "_loader.py"))
    _LOADER = importlib.util.module_from_spec(_LOADER_SPEC)
    _LOADER_SPEC.loader.exec_module(_LOADER)
    _LOADER.collection()

``collection()`` registers ``ansible_collections.inference_cache.substrate`` at the collection root this file sits in,
unless that name can be imported already (an installed collection, the tests' own), and returns the root.
``python _loader.py MODULE ARGS...`` runs ``main(ARGS)`` of ``plugins/module_utils/MODULE`` (dotted, e.g.
``service.confine``) that way and exits with what it returns.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import importlib
import os
import sys
import types

NAME = "ansible_collections.inference_cache.substrate"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _package(name, path):
    module = types.ModuleType(name)
    module.__path__ = path
    sys.modules[name] = module
    return module


def collection(root=ROOT):
    """Make ``ansible_collections.inference_cache.substrate`` importable (at ``root`` unless it is already); its root."""
    if NAME not in sys.modules:
        try:
            importlib.import_module(NAME)
        except ImportError:
            try:
                importlib.import_module("ansible_collections")
            except ImportError:
                _package("ansible_collections", [])
            _package("ansible_collections.inference_cache", [])
            _package(NAME, [root])
    return list(sys.modules[NAME].__path__)[0]


def module_utils(name):
    """``plugins/module_utils/<name>`` (dotted) of the collection, loaded by its full name."""
    collection()
    return importlib.import_module("%s.plugins.module_utils.%s" % (NAME, name))


def main(argv):
    if not argv:
        sys.stderr.write("usage: python _loader.py MODULE [ARGS...]: runs main(ARGS) of plugins/module_utils/MODULE\n")
        return 2
    return module_utils(argv[0]).main(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
