# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""plugins/module_utils/_loader.py: the one way into the collection's Python for a program outside a collection path (run
from a copy of the collection's files alone, in a fresh interpreter, as the verifier's Job and the roles' daemons run)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import os
import shutil
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
SCRIPT = """
import importlib.util, os, sys
_LOADER_SPEC = importlib.util.spec_from_file_location(
    "inference_cache_substrate_loader", os.path.join(%r, "plugins", "module_utils", "_loader.py"))
_LOADER = importlib.util.module_from_spec(_LOADER_SPEC)
_LOADER_SPEC.loader.exec_module(_LOADER)
root = _LOADER.collection()
from ansible_collections.inference_cache.substrate.plugins.module_utils.common import wiring
from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import engines
print(root == %r, wiring.__file__.startswith(%r), engines.named([{"url": "http://h:1"}])[0]["name"])
"""


def _copy(tmp_path):
    """The collection's plugins/module_utils alone, in a folder that is no collection path."""
    root = tmp_path / "copy"
    shutil.copytree(os.path.join(ROOT, "plugins", "module_utils"), str(root / "plugins" / "module_utils"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    return str(root)


def _python(args, cwd):
    return subprocess.run([sys.executable] + args, cwd=cwd, env=dict(os.environ, PYTHONPATH="", PYTHONDONTWRITEBYTECODE="1"),
                          capture_output=True, text=True, timeout=60, check=False)


def test_a_script_imports_the_collection_by_its_full_name_from_a_copy(tmp_path):
    root = _copy(tmp_path)
    run = _python(["-c", SCRIPT % (root, root, root)], cwd=str(tmp_path))
    assert run.returncode == 0 and run.stdout.split() == ["True", "True", "h:1"], run.stderr[-2000:]


def test_the_loader_runs_a_modules_main_and_says_its_usage(tmp_path):
    root = _copy(tmp_path)
    loader = os.path.join(root, "plugins", "module_utils", "_loader.py")
    usage = _python([loader], cwd=str(tmp_path))
    assert usage.returncode == 2 and usage.stderr.startswith("usage: python _loader.py MODULE [ARGS...]")
    confine = _python([loader, "service.confine"], cwd=str(tmp_path))
    assert confine.returncode == 2 and "usage: --inside SPEC -- COMMAND" in confine.stderr
