# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Filters that hand the go_builds role where the Go builds live, as ``plugins/module_utils/go/build.py`` says once."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

from ansible.errors import AnsibleFilterError

from ansible_collections.inference_cache.substrate.plugins.module_utils.go import build


def go_build_state_dir(home):
    """``home | inference_cache.substrate.go_build_state_dir`` -> the folder holding the builds (``bin/``) and their sources."""
    if not isinstance(home, str) or not home.startswith("/"):
        raise AnsibleFilterError("go_build_state_dir needs the target's HOME (an absolute path), got %r." % (home,))
    return build.state_dir(home)


def go_build_dirs(builds, state_dir):
    """``catalog.builds | inference_cache.substrate.go_build_dirs(state_dir)`` -> ``{name: bin/<name>-<version>}``."""
    if not isinstance(builds, list) or not all(isinstance(b, dict) and b.get("name") and b.get("version") for b in builds):
        raise AnsibleFilterError("go_build_dirs takes the builds of vars/go_builds.yml (each with a name and a version), got %r."
                                 % (builds,))
    return dict((b["name"], build.build_dir(state_dir, b["name"], b["version"])) for b in builds)


class FilterModule(object):
    def filters(self):
        return {"go_build_state_dir": go_build_state_dir, "go_build_dirs": go_build_dirs}
