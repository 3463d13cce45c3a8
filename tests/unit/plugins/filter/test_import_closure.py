# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The import_closure filter (plugins/filter/import_closure.py): the files a tool needs, read from its imports."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import os
import re
import shutil
import subprocess
import sys

import pytest

from ansible_collections.inference_cache.substrate.plugins.filter import import_closure as C

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))

TREE = {
    "tools/tool.py": '"""Loads module_utils("fam.unused") in its docstring only."""\n'
                     "import os\nimport sys\nfrom _loader import module_utils\n\n"
                     "def run():\n    return module_utils(\"fam.a\"), module_utils(\"other\")\n",
    "tools/_loader.py": "def module_utils(name):\n    return name\n",
    "tools/unrelated.py": "import json\n",
    "pkg/fam/__init__.py": "",
    "pkg/fam/a.py": "import json\nfrom .b import X\nfrom ..other import c\nfrom . import d as dee\n\n"
                    "def late():\n    from .lazy import Y\n    return Y\n",
    "pkg/fam/b.py": "from .a import late\nX = 1\n",
    "pkg/fam/d.py": "",
    "pkg/fam/lazy.py": "Y = 2\n",
    "pkg/fam/unused.py": "",
    "pkg/other/__init__.py": "NAME = 'other'\n",
    "pkg/other/c.py": "from .deep.e import Z\n",
    "pkg/other/deep/__init__.py": "",
    "pkg/other/deep/e.py": "from ... import fam\nfrom ..c import Z as again\nZ = 3\n",
}


def make(tmp_path, tree=None, **changes):
    files = dict(TREE if tree is None else tree, **changes)
    for rel, text in files.items():
        if text is None:
            continue
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path)


def closure(root, entries=("tools/tool.py",)):
    return C.import_closure(list(entries), root, package="pkg")


def test_closure_follows_loader_calls_script_imports_and_relative_imports(tmp_path):
    assert closure(make(tmp_path)) == [
        "tools/tool.py",
        "pkg/fam/__init__.py", "pkg/fam/a.py", "pkg/fam/b.py", "pkg/fam/d.py", "pkg/fam/lazy.py",
        "pkg/other/__init__.py", "pkg/other/c.py", "pkg/other/deep/__init__.py", "pkg/other/deep/e.py",
        "tools/_loader.py",
    ]


def test_closure_leaves_out_what_nothing_imports(tmp_path):
    files = closure(make(tmp_path))
    assert "pkg/fam/unused.py" not in files, "named in a docstring, never loaded"
    assert "tools/unrelated.py" not in files


def test_a_package_module_brings_the_init_of_its_package(tmp_path):
    root = make(tmp_path, **{"tools/tool.py": "module_utils('other.deep.e')\n"})
    files = closure(root)
    assert "pkg/other/deep/__init__.py" in files and "pkg/other/__init__.py" in files
    assert "pkg/fam/__init__.py" in files, "e.py imports the package fam (from ... import fam)"


def test_a_string_entry_and_the_default_package(tmp_path):
    root = make(tmp_path, tree={"tools/t.py": "module_utils('kv.x')\n", "plugins/module_utils/kv/__init__.py": "",
                                "plugins/module_utils/kv/x.py": ""})
    assert C.import_closure("tools/t.py", root) == ["tools/t.py", "plugins/module_utils/kv/__init__.py",
                                                    "plugins/module_utils/kv/x.py"]


def test_a_loader_call_naming_no_file_is_one_sentence(tmp_path):
    root = make(tmp_path, **{"tools/tool.py": "module_utils('fam.nope')\n"})
    with pytest.raises(C.ImportClosureError) as err:
        closure(root)
    assert str(err.value) == ("tools/tool.py line 1 loads module_utils('fam.nope'), but neither pkg/fam/nope.py nor "
                              "pkg/fam/nope/__init__.py exists.")


def test_a_relative_import_naming_no_file_is_one_sentence(tmp_path):
    root = make(tmp_path, **{"pkg/fam/b.py": "X = 1\nfrom .gone import Y\n"})
    with pytest.raises(C.ImportClosureError, match=r"^pkg/fam/b.py line 2 imports from .gone, but neither pkg/fam/gone.py nor "):
        closure(root)
    root = make(tmp_path, **{"pkg/fam/b.py": "from . import gone\n", "pkg/fam/__init__.py": None})
    os.remove(os.path.join(root, "pkg", "fam", "__init__.py"))
    with pytest.raises(C.ImportClosureError, match=r"^pkg/fam/b.py line 1 imports gone from ., but pkg/fam/gone.py does not exist.$"):
        closure(root)


def test_an_import_above_the_package_is_one_sentence(tmp_path):
    root = make(tmp_path, **{"pkg/fam/b.py": "from ...outside import Y\n"})
    with pytest.raises(C.ImportClosureError, match=r"^pkg/fam/b.py line 1 imports from ...outside, above the top of its package pkg.$"):
        closure(root)


def test_a_file_that_does_not_parse_is_one_sentence(tmp_path):
    root = make(tmp_path, **{"pkg/fam/d.py": "def broken(:\n"})
    with pytest.raises(C.ImportClosureError, match=r"^import_closure cannot parse pkg/fam/d.py \(line 1: "):
        closure(root)


@pytest.mark.parametrize("entries, root, sentence", [
    ([], None, "import_closure needs the folder the paths are relative to"),
    ([""], "ROOT", "import_closure takes a list of file paths relative to the root"),
    ({"a": 1}, "ROOT", "import_closure takes a list of file paths relative to the root"),
    (["tools/missing.py"], "ROOT", "import_closure cannot read tools/missing.py under "),
])
def test_bad_arguments_are_one_sentence(tmp_path, entries, root, sentence):
    root = make(tmp_path) if root == "ROOT" else root
    with pytest.raises(C.ImportClosureError, match="^" + re.escape(sentence)):
        C.import_closure(entries, root, package="pkg")


TOOL = "roles/cluster_verify/files/cluster_verify.py"
# The tool loaded from a copy of its closure, then every module_utils it loads by name, through its own loader.
LOAD_TOOL = ("import importlib.util; spec = importlib.util.spec_from_file_location('cluster_verify', %r); "
             "tool = importlib.util.module_from_spec(spec); spec.loader.exec_module(tool); [tool.module_utils(n) for n in %r]")


def test_the_verifier_tool_closure_runs_from_its_files_alone(tmp_path):
    """The real tool: its closure holds what it loads and nothing the Job does not run, and imports from a copy of it alone."""
    files = C.import_closure([TOOL], ROOT)
    assert files[0] == TOOL and not [f for f in files if f.startswith("tools/")]   # tools/ does not ship
    for needed in ("plugins/module_utils/kv/__init__.py", "plugins/module_utils/kv/events_check.py",
                   "plugins/module_utils/kv/index_check.py", "plugins/module_utils/http/prefix_cache.py",
                   "plugins/module_utils/common/wiring.py", "plugins/module_utils/kv/router_decoder.py"):
        assert needed in files, needed
    for unneeded in ("plugins/module_utils/service/supervisor.py", "plugins/module_utils/epp/config.py",
                     "plugins/module_utils/common/module.py"):
        assert unneeded not in files, unneeded
    for rel in files:
        os.makedirs(str(tmp_path / os.path.dirname(rel)), exist_ok=True)
        shutil.copy(os.path.join(ROOT, rel), str(tmp_path / rel))
    with open(os.path.join(ROOT, TOOL)) as handle:
        names = sorted(set(re.findall(r'module_utils\("([\w.]+)"\)', handle.read())))
    code = LOAD_TOOL % (TOOL, names)
    run = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=""),
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr[-2000:]


def test_the_filter_is_offered_under_its_name():
    assert C.FilterModule().filters() == {"import_closure": C.import_closure}


def test_absolute_imports_of_the_collection_and_its_loader_are_followed(tmp_path):
    """A script that imports the collection by its full name brings those modules, their packages and the package's loader."""
    root = make(tmp_path, tree={
        "roles/r/files/tool.py": "import importlib.util\nfrom ansible_collections.inference_cache.substrate.plugins.module_utils.kv import x\n"
                                 "import ansible_collections.inference_cache.substrate.plugins.module_utils.common.y as y\n",
        "plugins/module_utils/_loader.py": "", "plugins/module_utils/kv/__init__.py": "", "plugins/module_utils/kv/x.py": "",
        "plugins/module_utils/common/__init__.py": "", "plugins/module_utils/common/y.py": "", "plugins/module_utils/common/z.py": ""})
    assert C.import_closure(["roles/r/files/tool.py"], root) == [
        "roles/r/files/tool.py", "plugins/module_utils/_loader.py", "plugins/module_utils/common/__init__.py",
        "plugins/module_utils/common/y.py", "plugins/module_utils/kv/__init__.py", "plugins/module_utils/kv/x.py"]
    root = make(tmp_path, **{"roles/r/files/tool.py": "from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.gone import Z\n"})
    with pytest.raises(C.ImportClosureError, match=r"^roles/r/files/tool.py line 1 imports ansible_collections\.inference_cache\.substrate\."
                       r"plugins\.module_utils\.kv\.gone, but neither plugins/module_utils/kv/gone.py nor "):
        C.import_closure(["roles/r/files/tool.py"], root)
