#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

DOCUMENTATION = r"""
module: render_files
short_description: Write rendered manifests and Helm values into a folder on the controller
version_added: 0.1.0
description:
  - Writes each entry of O(files) under O(dest) on the Ansible controller, creating folders as needed.
  - Used by the render mode of the Kubernetes roles (C(<role>_render_dir)); runs as an action plugin, so rendering many
    profiles does not start one module process per file.
  - A file whose content is already the same is left alone (idempotent); in check mode nothing is written.
author:
  - inference_cache.substrate contributors (@inference-cache)
extends_documentation_fragment:
  - inference_cache.substrate._attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  dest:
    description: Folder to write into (on the controller).
    type: path
    required: true
  files:
    description: Mapping of paths relative to O(dest) to their text content. Paths may not leave O(dest).
    type: dict
    required: true
  mode:
    description: Permissions of the files written.
    type: str
    default: "0644"
"""

EXAMPLES = r"""
- name: Write the rendered manifests
  inference_cache.substrate.render_files:
    dest: /tmp/render/model_server
    files:
      manifests.yaml: "{{ manifests | map('ansible.builtin.to_nice_yaml') | join('---\n') }}"
"""

RETURN = r"""
files:
  description: Absolute paths of all files of O(files).
  returned: always
  type: list
  elements: str
changed_files:
  description: The files whose content changed (or would change in check mode).
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(
        argument_spec=dict(dest=dict(type="path", required=True), files=dict(type="dict", required=True),
                           mode=dict(type="str", default="0644")),
        supports_check_mode=True,
    )
    module.fail_json(msg="render_files runs as an action plugin on the controller; it cannot run as a module.")


if __name__ == "__main__":
    main()
