# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""Image and chart references, read one way for every role (pure Python, no Ansible).

``image_ref(pin, image, registry, repository, tag, digest)``: the image a role runs: ``image`` as given, else the pin's
parts (``vars/pinned_versions.yml`` images: ``registry`` optional, ``repository``, ``tag``, ``digest``), each part
overridable. ``image_parts(ref)``: a reference split as charts compose it: ``name`` (without tag or digest) and ``tag``
(a digest rides in it: ``tag@sha256:...``), the name's ``hub`` (all but its last path segment) and ``leaf`` (the last),
its ``host`` (the first segment) and ``path`` (the rest).

``chart_ref(ref, version, repo_url, default_repo_url)``: how Helm takes a chart: a local directory or ``.tgz`` (a
``path``: no ``--version``, no ``--repo``), an ``oci://`` or other URL (no ``--repo``), or a chart name (``--repo``: the
given repository, else the default one for a bare name; a ``repo/chart`` name is a repository Helm already knows). The
result says it in one ``desc`` and gives Helm's arguments after the reference (``helm_args``).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import os
import re

_PATH = re.compile(r"^[/.~]|[.](tgz|tar[.]gz)$")
_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def image_ref(pin, image="", registry="", repository="", tag="", digest=None):
    """``image``, else ``[registry/]repository:tag[@digest]`` from the pin, each part given taking its place."""
    if image:
        return image
    pin = pin or {}
    registry = registry or pin.get("registry") or ""
    repository = repository or pin.get("repository") or ""
    digest = pin.get("digest") or "" if digest is None or digest == "" else digest
    return "%s%s:%s%s" % (registry + "/" if registry else "", repository, tag or pin.get("tag") or "", "@" + digest if digest else "")


def image_parts(ref):
    """``{name, tag, hub, leaf, host, path}`` of an image reference (the tag keeps a digest: ``tag@sha256:...``)."""
    ref = ref or ""
    name = re.sub(r":[^/:]*$", "", re.sub(r"@.*$", "", ref))
    tag = ref[len(name) + 1:] if len(ref) > len(name) else ""
    hub, _slash, leaf = name.rpartition("/")
    host, _slash, path = name.partition("/")
    return {"name": name, "tag": tag, "hub": hub, "leaf": leaf, "host": host, "path": path}


def chart_ref(ref, version="", repo_url="", default_repo_url=""):
    """``{ref, path, url, version, repo_url, desc, helm_args}`` of a chart reference as Helm takes it."""
    ref = os.path.expanduser(ref or "") if (ref or "").startswith("~") else (ref or "")
    is_path = bool(_PATH.search(ref))
    is_url = bool(_URL.match(ref))
    repo = "" if is_path or is_url else (repo_url or ("" if "/" in ref else default_repo_url or ""))
    version = "" if is_path else (version or "")
    desc = ref + (" version %s" % version if version else "") + (" from %s" % repo if repo else "")
    args = (["--repo", repo] if repo else []) + (["--version", version] if version else [])
    return {"ref": ref, "path": is_path, "url": is_url, "version": version, "repo_url": repo, "desc": desc, "helm_args": args}
