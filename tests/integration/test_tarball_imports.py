# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""scripts/check_tarball_imports.py (make build): nothing in the collection tarball imports, loads or runs a file it leaves
out. A tarball and its source tree of a few files each, one import of each kind the check refuses, and a clean one."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import importlib.util
import os
import tarfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SPEC = importlib.util.spec_from_file_location("check_tarball_imports", os.path.join(ROOT, "scripts", "check_tarball_imports.py"))
CHECK = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(CHECK)

SHIPPED = {
    "plugins/module_utils/kv/__init__.py": "",
    "plugins/module_utils/kv/a.py": "from .b import X\nfrom ..common.errors import E\n",
    "plugins/module_utils/kv/b.py": "X = 1\n",
    "plugins/module_utils/common/errors.py": "E = 1\n",
    "tests/unit/test_a.py": "from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import a\n"
                            "from ansible_collections.inference_cache.substrate.plugins.module_utils.kv.b import X\n",
}
LEFT_OUT = {"tools/_loader.py": "", "benchmarks/bench_x.py": "", "scripts/s.py": "", "Makefile": ""}


def _build(tmp_path, extra):
    source, staged = tmp_path / "src", tmp_path / "staged"
    for folder, files in ((source, dict(SHIPPED, **dict(LEFT_OUT, **extra))), (staged, dict(SHIPPED, **extra))):
        for rel, text in files.items():
            path = folder / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    tarball = tmp_path / "collection.tar.gz"
    with tarfile.open(str(tarball), "w:gz") as archive:
        for rel in sorted(dict(SHIPPED, **extra)):
            archive.add(str(staged / rel), arcname=rel)
    return str(tarball), str(source)


def test_a_tarball_whose_imports_it_carries_passes(tmp_path):
    tarball, source = _build(tmp_path, {"tests/integration/test_b.py": "import os\nos.path.join(ROOT, 'Makefile')\n"})
    assert CHECK.check(tarball, source) == ([], 6)


def test_each_import_of_a_left_out_path_is_one_line(tmp_path):
    tarball, source = _build(tmp_path, {"tests/integration/test_c.py": (
        "import os, sys\nsys.path.insert(0, os.path.join(ROOT, 'tools'))\nfrom _loader import module_utils\nimport bench_x\n"
        "from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import a_name_of_its_init\n"
        "import ansible_collections.inference_cache.substrate.tools.x\n"),
        "plugins/module_utils/kv/c.py": "from .missing import Y\n"})
    found, _count = CHECK.check(tarball, source)
    assert found == [
        "plugins/module_utils/kv/c.py line 1 imports from .missing, which the tarball lacks (plugins/module_utils/kv/missing.py)",
        "tests/integration/test_c.py line 2 names tools of the collection's root, which the tarball leaves out",
        "tests/integration/test_c.py line 3 imports _loader, a file of the source tree the tarball leaves out (tools/_loader.py)",
        "tests/integration/test_c.py line 4 imports bench_x, a file of the source tree the tarball leaves out (benchmarks/bench_x.py)",
        "tests/integration/test_c.py line 6 imports ansible_collections.inference_cache.substrate.tools.x, which the tarball lacks",
    ]
