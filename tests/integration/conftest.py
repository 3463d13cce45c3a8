# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Environment shared by the integration tests, which run ansible, ansible-playbook and molecule as subprocesses.

pytest-ansible points ANSIBLE_COLLECTIONS_PATH at a ./collections folder that holds only this collection; the
playbooks also need kubernetes.core, which ``make setup`` puts in .cache/collections. Put that folder first, after
pytest-ansible has set the variable and before the test modules build their subprocess environments from os.environ.

The modules that run a kwok cluster go last: on a fresh machine they wait for its Go builds (``make test`` builds them
beside the tests), and every other test can run meanwhile.

``rendered_cases`` is the render of every case of _k8s_render.py, made once per session (one ansible-playbook run of
19 hosts, about two minutes of CPU) for the modules that read it; each takes a copy of its own.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import copy
import os

import pytest

_CACHE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), ".cache", "collections")


@pytest.hookimpl(trylast=True)
def pytest_configure(config):  # pylint: disable=unused-argument
    if os.path.isdir(_CACHE):
        paths = [_CACHE] + [p for p in os.environ.get("ANSIBLE_COLLECTIONS_PATH", "").split(os.pathsep) if p and p != _CACHE]
        os.environ["ANSIBLE_COLLECTIONS_PATH"] = os.pathsep.join(paths)


# The modules whose tests need the kwok cluster's binaries (kube-apiserver, etcd, kwok, and for the last the GIE build too).
_AFTER_THE_GO_BUILDS = ("test_kwok_roles.py", "test_kwok_cluster.py")


def pytest_collection_modifyitems(items):
    """The modules of _AFTER_THE_GO_BUILDS last, in that order; every other test keeps its place."""
    def rank(item):
        name = os.path.basename(str(item.fspath))
        return _AFTER_THE_GO_BUILDS.index(name) + 1 if name in _AFTER_THE_GO_BUILDS else 0
    items.sort(key=rank)   # stable: the order within each rank is pytest's


@pytest.fixture(scope="session")
def _rendered_cases(tmp_path_factory):
    import _k8s_render as R  # pylint: disable=import-error,import-outside-toplevel
    tmp = str(tmp_path_factory.mktemp("render-all-cases"))
    returncode, output, out = R.run_render(tmp, R.CASES, verbosity=1)   # -v: test_render_kubernetes reads its output
    assert returncode == 0, output[-4000:]
    return {"output": output, "out": out, "cases": dict((name, R.load_case(out, name)) for name in R.CASES)}


@pytest.fixture(scope="module")
def rendered_cases(_rendered_cases):  # pylint: disable=redefined-outer-name
    """Every case of _k8s_render.CASES rendered (-v): {"output", "out", "cases": {name: load_case(...)}}, a module's own copy."""
    return copy.deepcopy(_rendered_cases)
