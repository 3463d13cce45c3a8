#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Can the molecule scenario "kind" run here? It needs a running Docker engine, kind, helm and the kubernetes library.

Exit status 0: everything is there. Exit status 77 (the automake/meson "skipped" code) with one line
``SKIPPED: molecule scenario kind: <reason>`` on stdout: something is missing, the scenario must be reported
as skipped, never as passed. The scenario's create playbook and tests/integration/test_molecule_kind.py both use it.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import os
import shutil
import subprocess
import sys

SKIP = 77


def missing():
    reasons = []
    docker = shutil.which(os.environ.get("DOCKER", "docker"))
    if not docker:
        reasons.append("the docker CLI is not installed")
    else:
        proc = subprocess.run([docker, "info"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, universal_newlines=True, check=False)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            reasons.append("no Docker engine answers (`docker info`: %s)" % last)
    for tool in ("kind", "helm"):
        if not shutil.which(os.environ.get(tool.upper(), tool)):
            reasons.append("the %s binary is not on PATH" % tool)
    try:
        import kubernetes  # noqa: F401  pylint: disable=unused-import,import-outside-toplevel
    except ImportError:
        reasons.append("the Python kubernetes library is missing")
    return reasons


def main():
    reasons = missing()
    if reasons:
        sys.stdout.write("SKIPPED: molecule scenario kind: %s.\n" % "; ".join(reasons))
        return SKIP
    sys.stdout.write("READY: molecule scenario kind: Docker engine, kind, helm and the kubernetes library are present.\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
