# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""Write rendered files into a folder: what changes (content, mode) is computed once, and the diff, ``changed``
and the writes all come from that one comparison (plain Python, no Ansible; used by the render_files action).

A file's content is text, written as given, or data (a mapping, a list, a number, true/false, null) written in the
format of the file's extension: ``.json`` as JSON, ``.yaml``/``.yml`` as YAML, keys in the order given. A multi-document
YAML file is a list of documents under ``documents``. The roles hand over data, never text they serialised themselves,
so what is written does not depend on how one ansible-core version templates a string that looks like data (before
2.19 a ``to_nice_json`` result came back to the action as a mapping).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json
import os
import stat

from .errors import CheckError
from .options import argument_spec

# The option table of the render_files action (common/options.py); what the table cannot say, plan() checks.
OPTIONS = {
    "dest": {"type": "path", "required": True},
    "files": {"type": "dict"},
    "documents": {"type": "dict"},
    "mode": {"type": "raw", "default": "0644"},
}
FORMATS = {".json": "JSON", ".yaml": "YAML", ".yml": "YAML"}
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


def _format(rel):
    return FORMATS.get(os.path.splitext(rel)[1].lower())


def _plain(value, rel, where="the top"):
    """``value`` as plain dicts, lists, strings, numbers, booleans and None (the subclasses an ansible-core version tags
    its values with become the plain type), or CheckError naming what cannot be written."""
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key is not None and not isinstance(key, (str, int, float, bool)):
                raise CheckError("The content of %r has a key %r at %s, which is not text or a number." % (rel, key, where))
            out[_plain(key, rel, where)] = _plain(item, rel, "key %r" % (key,))
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(item, rel, "%s, item %d" % (where, index)) for index, item in enumerate(value)]
    raise CheckError("The content of %r holds a %s at %s, which cannot be written as %s; give text, a mapping, a list, a number, "
                     "true/false or null." % (rel, type(value).__name__, where, _format(rel) or "data"))


def _yaml(data):
    """Block-style YAML, keys in the order given; a text of several lines (a config file in a ConfigMap or in Helm values)
    as a literal block, as a person would write it (PyYAML falls back to quotes where a literal block cannot hold it)."""
    import yaml  # pylint: disable=import-outside-toplevel  # the controller's (ansible-core requires it)

    class Dumper(yaml.SafeDumper):  # pylint: disable=too-many-ancestors
        pass

    def text(dumper, value):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    Dumper.add_representer(str, text)
    return yaml.dump(data, Dumper=Dumper, indent=2, allow_unicode=True, default_flow_style=False, sort_keys=False)


def serialise(rel, content):
    """The text of one entry of ``files``: text as given, data in the format of the file name's extension."""
    if isinstance(content, str):
        return str.__str__(content)
    fmt = _format(rel)
    if fmt is None:
        raise CheckError("The content of %r is a %s, and render_files writes data only into a .json, .yaml or .yml file: give text, "
                         "or a file name with one of those extensions." % (rel, type(content).__name__))
    data = _plain(content, rel)
    if fmt == "JSON":
        try:
            return json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
        except ValueError:
            raise CheckError("The content of %r holds a number JSON cannot write (infinite or not a number)." % (rel,))
    return _yaml(data)


def serialise_documents(rel, documents):
    """The text of one entry of ``documents``: a YAML stream, ``---`` between the documents, in the order given."""
    if _format(rel) != "YAML":
        raise CheckError("The documents of %r can be written only into a .yaml or .yml file." % (rel,))
    if not isinstance(documents, (list, tuple)):
        raise CheckError("The documents of %r must be a list of documents, got a %s." % (rel, type(documents).__name__))
    return "---\n".join(_yaml(_plain(doc, rel, "document %d" % index)) for index, doc in enumerate(documents))


def plan(dest, files, mode="0644", documents=None):
    """What writing ``files`` and ``documents`` under ``dest`` would change: a list of entries, one per file, by name.

    Each entry has ``path``, ``data`` (bytes to write), ``before`` (bytes or None), ``before_mode``, ``mode``,
    ``content_changed`` and ``mode_changed``. Raises CheckError (one sentence) on a wrong input.
    """
    if not isinstance(dest, str) or not dest:
        raise CheckError("dest must be the folder to write into.")
    files = {} if files is None else files
    documents = {} if documents is None else documents
    if not isinstance(files, dict) or not isinstance(documents, dict) or not (files or documents):
        raise CheckError("files (paths to contents) or documents (paths to lists of YAML documents) must be a non-empty mapping.")
    mode_bits = parse_mode(mode)
    root = os.path.realpath(os.path.expanduser(dest))
    named = [(rel, files[rel], serialise) for rel in files] + [(rel, documents[rel], serialise_documents) for rel in documents]
    entries = []
    for rel, content, to_text in sorted(named, key=lambda item: str(item[0])):
        if not isinstance(rel, str) or not rel:
            raise CheckError("File name %r is not a non-empty string." % (rel,))
        if "\0" in rel:
            raise CheckError("File name %r contains a NUL character." % (rel,))
        path = _inside(root, rel)
        text = to_text(rel, content)
        try:
            data = text.encode("utf-8")
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
