# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Action plugin of inference_cache.substrate.render_files: write rendered files on the controller, no module run."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import os

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.text.converters import to_bytes, to_text
from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):

    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("dest", "files", "mode"))
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        args = self._task.args
        dest = args.get("dest")
        files = args.get("files")
        mode = args.get("mode", "0644")
        if not dest or not isinstance(dest, str):
            raise AnsibleActionFail("dest must be the folder to write into.")
        if not isinstance(files, dict) or not files:
            raise AnsibleActionFail("files must be a non-empty mapping of relative paths to contents.")
        try:
            mode_int = int(str(mode), 8)
        except ValueError:
            raise AnsibleActionFail("mode must be an octal string such as '0644', got %r." % (mode,))
        root = os.path.realpath(os.path.expanduser(dest))
        written, changed = [], []
        for rel, content in sorted(files.items()):
            path = os.path.realpath(os.path.join(root, rel))
            if os.path.isabs(rel) or not path.startswith(root + os.sep):
                raise AnsibleActionFail("File name %r leaves the folder %s." % (rel, root))
            data = to_bytes(content if isinstance(content, str) else to_text(content), errors="surrogate_or_strict")
            try:
                with open(path, "rb") as handle:
                    same = handle.read() == data
            except (IOError, OSError):
                same = False
            written.append(path)
            if same:
                continue
            changed.append(path)
            if self._task.check_mode:
                continue
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                tmp_path = path + ".tmp"
                with open(tmp_path, "wb") as handle:
                    handle.write(data)
                os.chmod(tmp_path, mode_int)
                os.replace(tmp_path, path)
            except (IOError, OSError) as exc:
                raise AnsibleActionFail("Cannot write %s: %s." % (path, exc))
        result.update(changed=bool(changed), files=written, changed_files=changed)
        return result
