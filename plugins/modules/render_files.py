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
  - Writes each entry of O(files) and O(documents) under O(dest) on the Ansible controller, creating folders as needed.
  - Used by the render mode of the Kubernetes roles (C(<role>_render_dir)); runs as an action plugin, so rendering many
    profiles does not start one module process per file.
  - A content that is text is written as given. A content that is data (a mapping, a list, a number, V(true)/V(false),
    V(null)) is written in the format of the file name's extension, C(.json) as JSON (indented by two spaces) and C(.yaml)
    or C(.yml) as YAML (block style), keys in the order given. Hand the data over as it is, not text serialised in the
    task, since ansible-core before 2.19 turns a templated string that reads as a Python literal (a
    P(ansible.builtin.to_nice_json#filter) result, for example) back into data, so text serialised in the task can reach
    the module as a mapping on one ansible-core version and as text on another.
  - A file whose content and mode are already the same is left alone (idempotent). A file whose content is the same
    but whose mode differs gets the mode and counts as changed. In check mode nothing is written and the same files are
    reported; with C(--diff) the content and mode changes are shown.
  - Refuses, with one sentence and before writing anything, data for a file name without one of those extensions, data
    that JSON or YAML cannot hold, and a file name that leaves O(dest).
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
      - Mapping of paths relative to O(dest) to their content, written as UTF-8.
      - A string is written as given; any other content is data, written as JSON or YAML by the file name's extension.
      - Paths may not leave O(dest) (no absolute paths, no C(..) out of it, no symbolic link pointing out of it).
      - At least one of O(files) and O(documents) must hold an entry.
    type: dict
  documents:
    description:
      - Mapping of paths relative to O(dest), each ending in C(.yaml) or C(.yml), to a list of documents, written as one
        multi-document YAML file in the order given (C(---) between documents), for example the manifests of a role in
        apply order.
      - The same rules for paths as O(files); a path may appear in only one of the two.
    type: dict
  mode:
    description:
      - Permissions of the files written, an octal string such as V("0644") (or an integer, as YAML reads an unquoted
        V(0644)). Applied to unchanged files too.
    type: raw
    default: "0644"
"""

EXAMPLES = r"""
- name: Write the rendered manifests and the engine's facts
  inference_cache.substrate.render_files:
    dest: /tmp/render/model_server
    documents:
      manifests.yaml: "{{ manifests }}"           # a list of Kubernetes objects: one multi-document YAML file
    files:
      engine.json: "{{ {'image': image, 'args': args} }}"   # data: written as JSON
      helm/values.yaml: "{{ chart_values }}"                # data: written as YAML
      README.txt: "Rendered by the model_server role.\n"   # text: written as given
"""

RETURN = r"""
files:
  description: Absolute paths of all files of O(files) and O(documents).
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
