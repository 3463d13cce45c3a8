# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The files a tool of the collection needs to run: its import closure, read from the source with ``ast``.

Documented in ``plugins/filter/import_closure.yml``. The walk:

* any file brings the collection's modules it imports by their full name
  (``from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import events_check``:
  ``plugins/module_utils/kv/events_check.py``) or loads by literal name (``module_utils("kv.events_check")``);
* a script (a file outside the package, such as ``roles/cluster_verify/files/cluster_verify.py``) that reaches the package
  brings the package's loader, ``_loader.py`` (``plugins/module_utils/_loader.py``: what makes the full name importable
  outside a collection path), and the scripts beside it that it imports by name (as ``sys.path[0]`` does);
* a package module brings what its relative imports name (``from .wire import X``, ``from ..http.args import Y``,
  ``from . import wire``), each module once, and the ``__init__.py`` of every package on the way.

Imports of anything else (the standard library, pyzmq, ansible) are not files of the collection and are left out.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import ast
import os

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - the plugin runs under Ansible; the walk itself needs none
    AnsibleFilterError = ValueError


class ImportClosureError(AnsibleFilterError):
    """One sentence saying which import names a file that does not exist (or which file does not parse)."""


def _read(root, rel):
    path = os.path.join(root, rel)
    try:
        with open(path, "rb") as handle:
            source = handle.read()
    except (IOError, OSError) as exc:
        raise ImportClosureError("import_closure cannot read %s under %s: %s." % (rel, root, exc.strerror or exc))
    try:
        return ast.parse(source, filename=rel)
    except SyntaxError as exc:
        raise ImportClosureError("import_closure cannot parse %s (line %s: %s), so it cannot tell what it imports."
                                 % (rel, exc.lineno, exc.msg))


def _module_file(root, rel_dir):
    """``rel_dir.py`` or ``rel_dir/__init__.py`` when either exists under ``root``, else None."""
    for candidate in (rel_dir + ".py", rel_dir + "/__init__.py"):
        if os.path.isfile(os.path.join(root, candidate)):
            return candidate
    return None


def _package_inits(root, package, rel):
    """The ``__init__.py`` of each package between ``package`` (exclusive when it has none) and ``rel``'s folder."""
    inits = []
    folder = os.path.dirname(rel)
    while folder and (folder == package or folder.startswith(package + "/")):
        init = folder + "/__init__.py"
        if os.path.isfile(os.path.join(root, init)):
            inits.append(init)
        if folder == package:
            break
        folder = os.path.dirname(folder)
    return inits


def _loader_calls(tree, loader):
    """The literal names of ``loader("a.b")`` calls (``loader`` as a name or an attribute)."""
    names = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or len(node.args) != 1 or node.keywords:
            continue
        func = node.func
        called = func.id if isinstance(func, ast.Name) else (func.attr if isinstance(func, ast.Attribute) else None)
        arg = node.args[0]
        if called == loader and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            names.append((node.lineno, arg.value))
    return names


def _script_imports(root, rel, tree):
    """Files beside the script ``rel`` that it imports by top-level name (``import x`` / ``from x import y``)."""
    here = os.path.dirname(rel)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module.split(".")[0]]
        else:
            continue
        for name in names:
            target = _module_file(root, (here + "/" if here else "") + name)
            if target:
                found.append(target)
    return found


def _absolute_imports(root, package, rel, tree, collection):
    """Files of the package that ``rel`` imports by their full name (``collection`` + the package's dotted path)."""
    prefix = collection + "." + package.replace("/", ".")
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            pairs = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            pairs = [(node.module, [alias.name for alias in node.names])]
        else:
            continue
        for module, names in pairs:
            if module != prefix and not module.startswith(prefix + "."):
                continue
            stem = package + module[len(prefix):].replace(".", "/")
            target = _module_file(root, stem)
            if target is None and stem != package:
                raise ImportClosureError("%s line %d imports %s, but neither %s.py nor %s/__init__.py exists."
                                         % (rel, node.lineno, module, stem, stem))
            if target:
                found.append(target)
                found.extend(_package_inits(root, package, target))
            for name in names or []:
                sub = _module_file(root, stem + "/" + name) if name != "*" else None
                if sub:
                    found.append(sub)
                    found.extend(_package_inits(root, package, sub))
    return found


def _relative_imports(root, package, rel, tree):
    """Files of the package that the module ``rel``'s relative imports name."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        base = os.path.dirname(rel)
        for _level in range(node.level - 1):
            base = os.path.dirname(base)
        dots = "." * node.level
        if not (base == package or base.startswith(package + "/")):
            raise ImportClosureError("%s line %d imports from %s%s, above the top of its package %s." % (rel, node.lineno, dots, node.module or "", package))
        if node.module:
            stem = base + "/" + node.module.replace(".", "/")
            target = _module_file(root, stem)
            if target is None:
                raise ImportClosureError("%s line %d imports from %s%s, but neither %s.py nor %s/__init__.py exists."
                                         % (rel, node.lineno, dots, node.module, stem, stem))
            found.append(target)
            if not target.endswith("/__init__.py"):
                continue
        else:
            stem = base
            init = base + "/__init__.py"
            if os.path.isfile(os.path.join(root, init)):
                found.append(init)
        # from .pkg import name / from . import name: a name may be a module of that package.
        for alias in node.names:
            sub = _module_file(root, stem + "/" + alias.name) if alias.name != "*" else None
            if sub:
                found.append(sub)
            elif not node.module and not os.path.isfile(os.path.join(root, stem + "/__init__.py")):
                raise ImportClosureError("%s line %d imports %s from %s, but %s/%s.py does not exist."
                                         % (rel, node.lineno, alias.name, dots, stem, alias.name))
    return found


def import_closure(entries, root, package="plugins/module_utils", loader="module_utils",
                   collection="ansible_collections.inference_cache.substrate"):
    """``['roles/cluster_verify/files/cluster_verify.py'] | inference_cache.substrate.import_closure(root)``: every file
    the scripts need.

    ``entries`` are paths relative to ``root`` (a string is one entry). The result lists them first, in their order,
    then every other file reached, sorted; all paths relative to ``root`` with ``/`` separators.
    """
    if isinstance(entries, str):
        entries = [entries]
    if not isinstance(entries, (list, tuple)) or not all(isinstance(e, str) and e for e in entries):
        raise ImportClosureError("import_closure takes a list of file paths relative to the root, got %r." % (entries,))
    if not isinstance(root, str) or not os.path.isdir(root):
        raise ImportClosureError("import_closure needs the folder the paths are relative to, got %r." % (root,))
    package = package.strip("/")
    entries = [os.path.normpath(e).replace(os.sep, "/") for e in entries]
    seen = set()
    queue = list(entries)
    while queue:
        rel = queue.pop(0)
        if rel in seen:
            continue
        seen.add(rel)
        tree = _read(root, rel)
        reached = _absolute_imports(root, package, rel, tree, collection)
        if rel.startswith(package + "/"):
            reached.extend(_package_inits(root, package, rel))
            reached.extend(_relative_imports(root, package, rel, tree))
        else:
            reached.extend(_script_imports(root, rel, tree))
        for lineno, name in _loader_calls(tree, loader):
            stem = package + "/" + name.replace(".", "/")
            target = _module_file(root, stem)
            if target is None:
                raise ImportClosureError("%s line %d loads %s(%r), but neither %s.py nor %s/__init__.py exists."
                                         % (rel, lineno, loader, name, stem, stem))
            reached.append(target)
            reached.extend(_package_inits(root, package, target))
        loader_file = package + "/_loader.py"
        if not rel.startswith(package + "/") and any(r.startswith(package + "/") for r in reached) \
                and os.path.isfile(os.path.join(root, loader_file)):
            reached.append(loader_file)
        queue.extend(r for r in reached if r not in seen)
    return entries + sorted(seen - set(entries))


class FilterModule(object):
    def filters(self):
        return {"import_closure": import_closure}
