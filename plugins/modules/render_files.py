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
  - A file whose content and mode are already the same is left alone (idempotent). A file whose content is the same
    but whose mode differs gets the mode and counts as changed. In check mode nothing is written and the same files are
    reported; with C(--diff) the content and mode changes are shown.
  - Refuses, with one sentence and before writing anything, a content that is not text (a mapping, a list, a number);
    render it to text in the task, for example with P(ansible.builtin.to_nice_yaml#filter), so the format is chosen
    there and not guessed here.
author:
  - inference_cache.substrate contributors (@inference-cache)
extends_documentation_fragment:
  - inference_cache.substrate._attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  idempotent:
    support: full
options:
  dest:
    description: Folder to write into (on the controller).
    type: path
    required: true
  files:
    description:
      - Mapping of paths relative to O(dest) to their text content, written as UTF-8.
      - Paths may not leave O(dest) (no absolute paths, no C(..) out of it, no symbolic link pointing out of it).
      - Every content must be a string.
    type: dict
    required: true
  mode:
    description:
      - Permissions of the files written, an octal string such as V("0644") (or an integer, as YAML reads an unquoted
        V(0644)). Applied to unchanged files too.
    type: raw
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
  description: The files whose content or mode changed (or would change in check mode).
  returned: always
  type: list
  elements: str
"""

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.module import ansible_module
from ansible_collections.inference_cache.substrate.plugins.module_utils.common.render_files import OPTIONS


def main():
    module = ansible_module(OPTIONS, supports_check_mode=True)
    module.fail_json(msg="render_files runs as an action plugin on the controller; it cannot run as a module.")


if __name__ == "__main__":
    main()
