# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""Write rendered text files into a folder: what changes (content, mode) is computed once, and the diff, ``changed``
and the writes all come from that one comparison (plain Python, no Ansible; used by the render_files action).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import os
import stat

from .errors import CheckError
from .options import argument_spec

# The option table of the render_files action (common/options.py); what the table cannot say, plan() checks.
OPTIONS = {
    "dest": {"type": "path", "required": True},
    "files": {"type": "dict", "required": True},
    "mode": {"type": "raw", "default": "0644"},
}
ARGUMENT_SPEC = argument_spec(OPTIONS)
MAX_MODE = 0o7777


def parse_mode(mode):
    """``"0644"``, ``"644"``, ``"0o644"`` or an integer (YAML reads an unquoted ``0644`` as 420) -> permission bits."""
    if isinstance(mode, int) and not isinstance(mode, bool):
        value = mode
    elif isinstance(mode, str):
        text = mode.strip().lower()
        text = text[2:] if text.startswith("0o") else text
        if not text or any(c not in "01234567" for c in text):
            raise CheckError("mode must be an octal string such as '0644', got %r." % (mode,))
        value = int(text, 8)
    else:
        raise CheckError("mode must be an octal string such as '0644', got %r." % (mode,))
    if not 0 <= value <= MAX_MODE:
        raise CheckError("mode must be between '0000' and '07777', got %r." % (mode,))
    return value


def _inside(root, rel):
    """The real path of ``rel`` under ``root``, or CheckError when it would leave ``root``."""
    path = os.path.realpath(os.path.join(root, rel))
    if os.path.isabs(rel) or not path.startswith(root + os.sep):
        raise CheckError("File name %r leaves the folder %r." % (rel, root))
    return path


def _current(path):
    """(bytes, permission bits) of an existing regular file, or (None, None)."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            return None, None
        with open(path, "rb") as handle:
            return handle.read(), stat.S_IMODE(info.st_mode)
    except (IOError, OSError):
        return None, None


def plan(dest, files, mode="0644"):
    """What writing ``files`` under ``dest`` would change: a list of entries, one per file, sorted by name.

    Each entry has ``path``, ``data`` (bytes to write), ``before`` (bytes or None), ``before_mode``, ``mode``,
    ``content_changed`` and ``mode_changed``. Raises CheckError (one sentence) on a wrong input.
    """
    if not isinstance(dest, str) or not dest:
        raise CheckError("dest must be the folder to write into.")
    if not isinstance(files, dict) or not files:
        raise CheckError("files must be a non-empty mapping of relative paths to text contents.")
    mode_bits = parse_mode(mode)
    root = os.path.realpath(os.path.expanduser(dest))
    entries = []
    for rel in sorted(files, key=str):
        content = files[rel]
        if not isinstance(rel, str) or not rel:
            raise CheckError("File name %r is not a non-empty string." % (rel,))
        if "\0" in rel:
            raise CheckError("File name %r contains a NUL character." % (rel,))
        if not isinstance(content, str):
            raise CheckError("The content of %r is a %s, not text; render it to text first, for example with ansible.builtin.to_nice_yaml."
                             % (rel, type(content).__name__))
        path = _inside(root, rel)
        try:
            data = content.encode("utf-8")
        except UnicodeEncodeError:
            raise CheckError("The content of %r cannot be written as UTF-8 (it carries a lone surrogate character)." % (rel,))
        for other in entries:
            if other["path"].startswith(path + os.sep) or path.startswith(other["path"] + os.sep) or other["path"] == path:
                raise CheckError("File names %r and %r conflict: one path would be both a file and a folder, or written twice."
                                 % (other["name"], rel))
        before, before_mode = _current(path)
        entries.append({
            "name": rel, "path": path, "data": data, "before": before, "before_mode": before_mode, "mode": mode_bits,
            "content_changed": before != data, "mode_changed": before_mode != mode_bits,
        })
    return entries


def diff(entries):
    """The diff of the changed entries, in the shape Ansible's diff callbacks print."""
    result = []
    for entry in entries:
        if entry["content_changed"]:
            result.append({
                "before_header": entry["path"] if entry["before"] is not None else "%s (absent)" % entry["path"],
                "after_header": entry["path"],
                "before": (entry["before"] or b"").decode("utf-8", "replace"),
                "after": entry["data"].decode("utf-8"),
            })
        if entry["mode_changed"] and entry["before_mode"] is not None:
            result.append({
                "before_header": "%s (mode)" % entry["path"], "after_header": "%s (mode)" % entry["path"],
                "before": "mode: %04o\n" % entry["before_mode"], "after": "mode: %04o\n" % entry["mode"],
            })
    return result


def apply(entries):
    """Write the entries whose content changed (atomically) and set the mode of those whose mode changed."""
    for entry in entries:
        path = entry["path"]
        try:
            if entry["content_changed"]:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                tmp_path = path + ".tmp"
                with open(tmp_path, "wb") as handle:
                    handle.write(entry["data"])
                os.chmod(tmp_path, entry["mode"])
                os.replace(tmp_path, path)
            elif entry["mode_changed"]:
                os.chmod(path, entry["mode"])
        except (IOError, OSError) as exc:
            raise CheckError("Cannot write %r: %s." % (path, " ".join((getattr(exc, "strerror", None) or str(exc)).split()).rstrip(".")))


def changed_paths(entries):
    return [e["path"] for e in entries if e["content_changed"] or e["mode_changed"]]
