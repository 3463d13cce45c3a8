# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Action plugin of inference_cache.substrate.render_files: write rendered files on the controller, no module run."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase

from ansible_collections.inference_cache.substrate.plugins.module_utils.common import render_files as render
from ansible_collections.inference_cache.substrate.plugins.module_utils.common.errors import CheckError


class ActionModule(ActionBase):

    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(render.ARGUMENT_SPEC)
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        checked = ArgumentSpecValidator(render.ARGUMENT_SPEC).validate(dict(self._task.args))
        if checked.error_messages:
            raise AnsibleActionFail(" ".join(" ".join(str(m).split()) for m in checked.error_messages))
        args = checked.validated_parameters
        # The sentence is raised outside the handler: ansible-core before 2.19 would attach the CheckError's traceback.
        failure = None
        try:
            entries = render.plan(args["dest"], args["files"], args["mode"], documents=args["documents"])
            if not self._task.check_mode:
                render.apply(entries)
        except CheckError as exc:
            failure = exc.msg
        if failure is not None:
            raise AnsibleActionFail(failure)
        changed = render.changed_paths(entries)
        result.update(changed=bool(changed), files=[e["path"] for e in entries], changed_files=changed)
        if self._task.diff:
            result["diff"] = render.diff(entries)
        return result
