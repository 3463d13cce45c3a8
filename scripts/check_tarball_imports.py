"""Check that nothing in the collection tarball imports, loads or names a file the tarball leaves out.

The tarball (``ansible-galaxy collection build``) leaves out what galaxy.yml's build_ignore names: the benchmarks, the
hand-run tools, the scripts, the Makefile, the generated study data. Every Python file it carries is read here (with
``ast``, nothing is run) for:

* imports of the collection by its full name (``ansible_collections.inference_cache.substrate...``) and relative imports
  inside a package, which must resolve to a file (or folder) in the tarball;
* imports by plain name (``import _loader``, ``from _routing import x``, ``import bench_routing``) of a module that is a
  file of the source tree but not of the tarball (a script that puts ``tools/`` or ``benchmarks/`` on ``sys.path``);
* paths built from the collection's root that name a top-level folder of Python the tarball lacks
  (``os.path.join(ROOT, "scripts", ...)``, ``os.path.join(ROOT, "tools")``: a script run, loaded or put on ``sys.path``).

Usage: check_tarball_imports.py TARBALL [SOURCE_ROOT]   (SOURCE_ROOT: the checkout it was built from; default: this one)
Prints one line per problem and a summary; exit status 1 when there is any problem.
"""

import ast
import os
import subprocess
import sys
import tarfile
import tempfile

COLLECTION = "ansible_collections.inference_cache.substrate"
SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def source_files(root):
    """The files of the source tree (what git tracks or would track), relative, '/'-separated."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=root, capture_output=True, text=True, check=True).stdout
        return set(line for line in out.splitlines() if line and os.path.exists(os.path.join(root, line)))
    except (OSError, subprocess.CalledProcessError):
        return set(os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/") for d, _s, fs in os.walk(root) for f in fs)


def _exists(files, dirs, stem):
    return stem + ".py" in files or stem + "/__init__.py" in files or stem in dirs


def _literal_parts(node):
    """The string literals among the arguments of an ``os.path.join(...)`` call, in order."""
    return [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]


def problems_of(rel, tree, files, dirs, missing_modules, missing_top):
    """Sentences for one Python file of the tarball."""
    found = []
    here = os.path.dirname(rel)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = here
            for _level in range(node.level - 1):
                base = os.path.dirname(base)
            stem = base + ("/" + node.module.replace(".", "/") if node.module else "")
            if node.module and not _exists(files, dirs, stem):
                found.append("%s line %d imports from %s%s, which the tarball lacks (%s.py)" % (
                    rel, node.lineno, "." * node.level, node.module, stem))
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module] + ["%s.%s" % (node.module, alias.name) for alias in node.names]
        else:
            names = []
        for name in names:
            if name == COLLECTION or name.startswith(COLLECTION + "."):
                stem = name[len(COLLECTION) + 1:].replace(".", "/")
                parent = os.path.dirname(stem)
                if stem and not _exists(files, dirs, stem) and not (isinstance(node, ast.ImportFrom) and name != node.module
                                                                    and _exists(files, dirs, parent)):
                    found.append("%s line %d imports %s, which the tarball lacks" % (rel, node.lineno, name))
            elif name.split(".")[0] in missing_modules and (isinstance(node, ast.Import) or name == node.module):
                found.append("%s line %d imports %s, a file of the source tree the tarball leaves out (%s)" % (
                    rel, node.lineno, name, missing_modules[name.split(".")[0]]))
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "join":
            for part in _literal_parts(node)[:2]:
                if part in missing_top:
                    found.append("%s line %d names %s of the collection's root, which the tarball leaves out" % (rel, node.lineno, part))
                    break
    return found


def check(tarball, source=SOURCE):
    with tempfile.TemporaryDirectory(prefix="tarball-imports-") as scratch:
        with tarfile.open(tarball) as archive:
            archive.extractall(scratch, filter="data") if hasattr(tarfile, "data_filter") else archive.extractall(scratch)
        files = set(os.path.relpath(os.path.join(d, f), scratch).replace(os.sep, "/") for d, _s, fs in os.walk(scratch) for f in fs)
        dirs = set(os.path.dirname(f) for f in files)
        dirs |= set(d for f in list(dirs) for d in [f.rsplit("/", i)[0] for i in range(f.count("/") + 1)])
        source_only = source_files(source) - files
        missing_modules = {}
        for path in sorted(source_only):
            if path.endswith(".py"):
                stem = os.path.basename(path)[:-3]
                if stem == "__init__":
                    stem = os.path.basename(os.path.dirname(path))
                missing_modules.setdefault(stem, path)
        missing_top = set(p.split("/")[0] for p in source_only if "/" in p and p.endswith(".py")) - set(f.split("/")[0] for f in files)
        found = []
        for rel in sorted(f for f in files if f.endswith(".py")):
            with open(os.path.join(scratch, rel), "rb") as handle:
                try:
                    tree = ast.parse(handle.read(), filename=rel)
                except SyntaxError as exc:
                    found.append("%s does not parse (line %s: %s)" % (rel, exc.lineno, exc.msg))
                    continue
            found.extend(sorted(problems_of(rel, tree, files, dirs, missing_modules, missing_top),
                                key=lambda line: int(line.split(" line ", 1)[1].split()[0])))
        return found, len([f for f in files if f.endswith(".py")])


def main(argv):
    if not argv or len(argv) > 2:
        print(__doc__.strip().splitlines()[0])
        return 2
    found, count = check(argv[0], argv[1] if len(argv) > 1 else SOURCE)
    for line in found:
        print(line)
    print("tarball imports: %d Python files read, %d %s" % (count, len(found), "problem" if len(found) == 1 else "problems"))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
