"""Check that `make units` ran every test file under tests/unit, each in one ansible-test group, once.

ansible-test units splits tests/unit into groups by path (tests/unit/plugins/modules: modules, tests/unit/plugins/
module_utils: module_utils, everything else: controller), runs one pytest per group and takes only files named test_*.py.
A group that never starts (its xdist workers crash) reports "no tests ran" and exits 0, and a file it does not take
(a *_test.py that pytest alone would collect) is silently left out. This script compares the test files on disk with
what the runner reported and prints one line per problem:

* a folder whose test files no group ran (named with its files), or a file with no test case;
* a file that ran in more than one group (run twice).

Sources of "what ran":
  --junit DIR          the junit reports of the run (python<version>-<group>-units.xml), written by ansible-test units;
  --collect-only FILE  the output of `ansible-test units --collect-only` (pytest's collection tree per group).
Default: --junit under the staged copy scripts/ansible_test.sh ran (ANSIBLE_TEST_STAGE, else .cache/stage).
The last line is a summary ("units: ..."); the exit status is 1 when there is any problem.
"""
import argparse
import collections
import fnmatch
import os
import pathlib
import re
import sys
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parent.parent
UNIT_DIR = "tests/unit"
# pytest's default python_files (ansible-test's pytest config sets none): what a test file is.
PYTHON_FILES = ("test_*.py", "*_test.py")
GROUP_HEADER = re.compile(r"^Unit test (\S+) with Python (\S+)$")
TREE_NODE = re.compile(r"^(?P<indent>\s*)<(?P<kind>\w+) (?P<name>[^>]*)>$")
JUNIT_NAME = re.compile(r"^python[0-9.]+-(?P<group>.+)-units\.xml$")


def staged_root():
    stage = os.environ.get("ANSIBLE_TEST_STAGE") or str(ROOT / ".cache" / "stage")
    return pathlib.Path(stage) / "ansible_collections" / "inference_cache" / "substrate"


def test_files(root):
    """Paths (relative to root, '/'-separated) of every file under tests/unit that pytest would take as a test file."""
    found = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(str(root), UNIT_DIR)):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        for name in sorted(filenames):
            if any(fnmatch.fnmatch(name, pattern) for pattern in PYTHON_FILES):
                found.append(os.path.relpath(os.path.join(dirpath, name), str(root)).replace(os.sep, "/"))
    return found


def from_junit(junit_dir):
    """{group: Counter(file: test cases)} from the junit reports of one ansible-test units run."""
    ran = {}
    for path in sorted(pathlib.Path(junit_dir).glob("*-units.xml")):
        match = JUNIT_NAME.match(path.name)
        group = match.group("group") if match else path.stem
        counts = ran.setdefault(group, collections.Counter())
        for case in ET.parse(str(path)).getroot().iter("testcase"):
            if case.get("file"):
                counts[case.get("file").replace(os.sep, "/")] += 1
    return ran


def from_collect_only(text):
    """{group: Counter(file: items)} from the output of `ansible-test units --collect-only` (pytest's tree, per group)."""
    ran = {}
    group = None
    stack = []  # (depth, kind, name) of the nodes above the current line
    for line in text.splitlines():
        header = GROUP_HEADER.match(line.strip())
        if header:
            group, stack = header.group(1), []
            ran.setdefault(group, collections.Counter())
            continue
        node = TREE_NODE.match(line.rstrip())
        if group is None or not node:
            continue
        depth = len(node.group("indent")) // 2
        stack = [entry for entry in stack if entry[0] < depth] + [(depth, node.group("kind"), node.group("name"))]
        modules = [i for i, entry in enumerate(stack) if entry[1] == "Module"]
        if not modules:
            continue
        # The first node is the collection root (pytest's rootdir): the path starts below it.
        path = "/".join(entry[2] for entry in stack[1:modules[-1] + 1])
        ran[group][path] += 0 if node.group("kind") in ("Module", "Class", "UnitTestCase") else 1
    return ran


def problems(files, ran):
    """Sentences for what ran in no group or in several, given the test files on disk and {group: Counter(file: n)}."""
    found = []
    groups_of = collections.defaultdict(list)
    for group, counts in sorted(ran.items()):
        for path, count in counts.items():
            if count > 0:
                groups_of[path].append(group)
    left_out = collections.defaultdict(list)
    for path in files:
        if not groups_of.get(path):
            left_out[posix_dirname(path)].append(path.rsplit("/", 1)[-1])
    for folder, names in sorted(left_out.items()):
        total = len([f for f in files if posix_dirname(f) == folder])
        what = "its test files" if len(names) == total else "%d of its %d test files" % (len(names), total)
        found.append("%s: no ansible-test units group ran %s (%s); ansible-test takes only test_*.py files and "
                     "runs them under tests/unit/plugins/modules (modules), tests/unit/plugins/module_utils (module_utils) or "
                     "anywhere else (controller)." % (folder, what, ", ".join(names)))
    for path, groups in sorted(groups_of.items()):
        if len(groups) > 1:
            found.append("%s ran in %d groups (%s): each test file must run once." % (path, len(groups), ", ".join(groups)))
    return found


def posix_dirname(path):
    return path.rsplit("/", 1)[0] if "/" in path else "."


def summary(files, ran):
    parts = ", ".join("%s %d" % (group, sum(counts.values())) for group, counts in sorted(ran.items()))
    folders = len({posix_dirname(f) for f in files})
    return "units: %d test files in %d folders under %s; by group: %s" % (len(files), folders, UNIT_DIR, parts or "nothing ran")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--junit", help="folder of the junit reports (default: the staged copy's tests/output/junit)")
    source.add_argument("--collect-only", dest="collect_only", help="output of ansible-test units --collect-only")
    parser.add_argument("--root", help="collection root whose tests/unit is compared (default: the staged copy)")
    args = parser.parse_args(argv)
    root = pathlib.Path(args.root) if args.root else staged_root()
    if args.collect_only:
        with open(args.collect_only) as handle:
            ran = from_collect_only(handle.read())
    else:
        junit = pathlib.Path(args.junit) if args.junit else root / "tests" / "output" / "junit"
        if not junit.is_dir():
            print("No junit reports in %s: run ansible-test units (scripts/ansible_test.sh units) first." % junit)
            return 1
        ran = from_junit(junit)
    files = test_files(root)
    found = problems(files, ran)
    for line in found:
        print(line)
    print(summary(files, ran))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
