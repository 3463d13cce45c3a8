# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""`make units` runs every test file under tests/unit through ansible-test units, each in one group, once.

The runner's own collection (``ansible-test units --collect-only`` on a staged copy, as ``make units`` stages it) is
compared with the test files on disk by ``scripts/check_units_collected.py``, the check ``make units`` runs after the
real run on its junit reports. The check itself must fail for a folder left out, a file ansible-test does not take, a file
run twice, and a group that never started (junit reports with no test case, what ansible-test exits 0 with).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import importlib.util
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SPEC = importlib.util.spec_from_file_location("check_units_collected", os.path.join(ROOT, "scripts", "check_units_collected.py"))
CHECK = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(CHECK)

COLLECT_ONLY = """Unit test modules with Python 3.11
collected 3 items

<Dir substrate>
  <Dir tests>
    <Dir unit>
      <Dir plugins>
        <Dir modules>
          <Module test_a.py>
            <Function test_one>
            <Function test_two[x]>
Unit test controller with Python 3.11
<Dir substrate>
  <Dir tests>
    <Dir unit>
      <Dir plugins>
        <Dir filter>
          <Module test_f.py>
            <Class TestF>
              <Function test_method>
"""


def _tree(tmp_path, files):
    for rel in files:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("def test_x():\n    pass\n")
    return str(tmp_path)


def _junit(folder, group, files):
    folder.mkdir(parents=True, exist_ok=True)
    cases = "".join('<testcase classname="c" name="t%d" file="%s" line="1" time="0.1" />' % (i, f) for i, f in enumerate(files))
    (folder / ("python3.11-%s-units.xml" % group)).write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="%d">%s</testsuite></testsuites>'
        % (len(files), cases))


def test_the_collect_only_tree_gives_each_file_its_group_and_items():
    ran = CHECK.from_collect_only(COLLECT_ONLY)
    assert ran == {"modules": {"tests/unit/plugins/modules/test_a.py": 2}, "controller": {"tests/unit/plugins/filter/test_f.py": 1}}


def test_a_folder_left_out_fails_the_check_naming_it(tmp_path):
    root = _tree(tmp_path, ["tests/unit/plugins/modules/test_a.py", "tests/unit/plugins/filter/test_f.py",
                            "tests/unit/plugins/extra/test_g.py", "tests/unit/plugins/extra/test_h.py"])
    found = CHECK.problems(CHECK.test_files(root), CHECK.from_collect_only(COLLECT_ONLY))
    assert len(found) == 1 and found[0].startswith("tests/unit/plugins/extra: no ansible-test units group ran its test files "
                                                   "(test_g.py, test_h.py)"), found


def test_a_file_ansible_test_does_not_take_fails_the_check(tmp_path):
    """pytest alone collects *_test.py; ansible-test units takes test_*.py only: the file would be left out silently."""
    root = _tree(tmp_path, ["tests/unit/plugins/modules/test_a.py", "tests/unit/plugins/filter/test_f.py",
                            "tests/unit/plugins/filter/wiring_test.py"])
    found = CHECK.problems(CHECK.test_files(root), CHECK.from_collect_only(COLLECT_ONLY))
    assert found == ["tests/unit/plugins/filter: no ansible-test units group ran 1 of its 2 test files (wiring_test.py); "
                     "ansible-test takes only test_*.py files and runs them under tests/unit/plugins/modules (modules), "
                     "tests/unit/plugins/module_utils (module_utils) or anywhere else (controller)."]


def test_a_file_run_twice_and_a_group_that_never_started_fail_the_check(tmp_path):
    files = ["tests/unit/plugins/modules/test_a.py", "tests/unit/plugins/filter/test_f.py"]
    root = _tree(tmp_path / "root", files)
    junit = tmp_path / "junit"
    _junit(junit, "modules", [files[0]])
    _junit(junit, "controller", [files[0]])  # run twice ...
    found = CHECK.problems(CHECK.test_files(root), CHECK.from_junit(str(junit)))
    assert "tests/unit/plugins/modules/test_a.py ran in 2 groups (controller, modules): each test file must run once." in found
    assert any(line.startswith("tests/unit/plugins/filter: no ansible-test units group ran its test files") for line in found), found
    # ... and the controller group as ansible-test reports it when its workers never start: no test case, exit 0.
    _junit(junit, "controller", [])
    found = CHECK.problems(CHECK.test_files(root), CHECK.from_junit(str(junit)))
    assert len(found) == 1 and found[0].startswith("tests/unit/plugins/filter: no ansible-test units group ran"), found
    assert CHECK.main(["--junit", str(junit), "--root", root]) == 1
    _junit(junit, "controller", [files[1]])
    assert CHECK.main(["--junit", str(junit), "--root", root]) == 0


def test_make_units_runner_collects_every_test_file_under_tests_unit_once(tmp_path):
    """ansible-test units --collect-only on a staged copy, as make units runs it: every test file in exactly one group."""
    env = dict(os.environ, ANSIBLE_TEST_STAGE=str(tmp_path / "stage"))
    proc = subprocess.run([os.path.join(ROOT, "scripts", "ansible_test.sh"), "units", "--local", "--python", "3.11", "--color", "no",
                           "--collect-only"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:]
    ran = CHECK.from_collect_only(proc.stdout)
    assert sorted(ran) == ["controller", "module_utils", "modules"], proc.stdout[-4000:]
    files = CHECK.test_files(ROOT)
    assert len(files) >= 20 and "tests/unit/plugins/filter/test_wiring_filters.py" in files
    found = CHECK.problems(files, ran)
    assert not found, "\n".join(found)
    assert all(count > 0 for counts in ran.values() for count in counts.values()), "a test file with no test: %s" % ran


def test_the_controller_group_runs_its_tests(tmp_path):
    """The group that used to crash: ansible-test's plugin in the xdist workers read pytest-ansible's collections path, no
    worker started, and ansible-test reported "no tests ran" with exit 0 (tests/unit/conftest.py gives the workers
    ansible-test's path back). One small file of the group, run for real: its junit report must hold its test cases."""
    stage = tmp_path / "stage"
    target = "tests/unit/plugins/filter/test_import_closure.py"
    env = dict(os.environ, ANSIBLE_TEST_STAGE=str(stage))
    proc = subprocess.run([os.path.join(ROOT, "scripts", "ansible_test.sh"), "units", "--local", "--python", "3.11", "--color", "no",
                           target], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:]
    junit = stage / "ansible_collections" / "inference_cache" / "substrate" / "tests" / "output" / "junit"
    ran = CHECK.from_junit(str(junit))
    assert ran.get("controller", {}).get(target, 0) > 0, "the controller group ran nothing: %s\n%s" % (ran, proc.stdout[-3000:])
    assert "node down" not in proc.stdout and "no tests ran" not in proc.stdout, proc.stdout[-3000:]


@pytest.mark.parametrize("group, folder", [("modules", "tests/unit/plugins/modules"), ("module_utils", "tests/unit/plugins/module_utils"),
                                           ("controller", "tests/unit/plugins/filter")])
def test_each_group_has_its_folder(group, folder):
    """The folders ansible-test maps to each group exist here, so a group with nothing to run is a defect, not a layout."""
    assert [f for f in CHECK.test_files(ROOT) if f.startswith(folder + "/")], "%s (%s) holds no test file" % (folder, group)
