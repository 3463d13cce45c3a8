# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Run the molecule scenario "kind" (whole Kubernetes stack on a local kind cluster) where it can run.

extensions/molecule/kind/prerequisites.py decides: exit 0 = Docker engine, kind, helm and the kubernetes library are
there, so ``molecule test -s kind`` runs and must pass; exit 77 = something is missing, and this test is reported
as SKIPPED with the printed reason (``pytest -rs`` shows it). It never passes without a cluster.
"""

from __future__ import absolute_import, division, print_function

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCENARIO = os.path.join(ROOT, "extensions", "molecule", "kind")


def test_molecule_kind_scenario():
    check = subprocess.run([sys.executable, os.path.join(SCENARIO, "prerequisites.py")], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, universal_newlines=True, check=False)
    if check.returncode == 77:
        pytest.skip(check.stdout.strip())
    assert check.returncode == 0, check.stdout
    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ, MOLECULE_GLOB="extensions/molecule/*/molecule.yml", PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    proc = subprocess.run([os.path.join(bindir, "molecule"), "test", "-s", "kind"], cwd=ROOT, env=env, check=False)
    assert proc.returncode == 0, "molecule test -s kind failed (see its output above)"
