#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

DOCUMENTATION = r"""
module: go_build
short_description: Build Go programs from a module at a pinned version, once
version_added: 0.1.0
description:
  - Builds the O(packages) of the Go module O(module) at O(version) into the folder O(dest), with the go command and the
    Go module proxy (C(GOPROXY)), as C(go install) would, but through a C(go.mod) of its own in O(src) (C(go install)
    refuses a module whose proxy lists no versions, and refuses C(k8s.io/kubernetes), whose staging modules it replaces by
    their published versions when O(staging_version) is given).
  - C(go.sum) is checked against the checksum database; nothing of the module is copied into the folder but what the
    go command builds and what the O(generate) commands write.
  - A build that exists (every binary in O(dest); with O(source), built from the same sources) is never redone
    (C(changed=false)). Two runs at once build once, the second waiting on a lock beside O(dest) and then finding the
    build there.
  - Run it with C(async) and C(poll) for a line every few seconds while a long build runs.
author:
  - inference_cache.substrate contributors (@inference-cache)
extends_documentation_fragment:
  - inference_cache.substrate._attributes
attributes:
  check_mode:
    support: full
    details: Reports whether the build would run; builds nothing.
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  module:
    description: The Go module path, for example V(sigs.k8s.io/gateway-api-inference-extension).
    type: str
    required: true
  version:
    description: The module version (a tag such as V(v1.4.0)).
    type: str
    required: true
  packages:
    description:
      - Mapping of binary names to the package paths built into them. It may be empty when O(outputs) names what the
        O(generate) commands write (a build of generated files only, such as CRDs from a module's API types).
    type: dict
    required: true
  outputs:
    description:
      - Files (paths under O(dest)) the O(generate) commands write; with the binaries, they tell that the build exists.
    type: list
    elements: str
    default: []
  dest:
    description: The folder the binaries go into (built in C(<dest>.partial), then renamed).
    type: path
    required: true
  src:
    description: The folder of the build's own C(go.mod) (with O(source), a scratch folder).
    type: path
    required: true
  source:
    description:
      - "A program of the collection's own to build instead of a module from the proxy (O(module) then names it only): a
        folder with its own C(go.mod) and C(go.sum), where C(go build) runs and fetches what they pin."
      - The build records the digest of the folder's Go sources, C(go.mod) and C(go.sum), and a change of them builds it
        again.
    type: path
  ldflags:
    description: The linker flags (C(-ldflags)).
    type: str
    default: -s -w
  cgo:
    description: Build with cgo; V(false) sets C(CGO_ENABLED=0) (static binaries).
    type: bool
    default: true
  staging_version:
    description:
      - Replace every C(k8s.io/*) module that the module's own C(go.mod) points at C(./staging/) by that module at this
        version (V(v0.33.13) for C(k8s.io/kubernetes) V(v1.33.13)). Empty means no replace.
    type: str
    default: ""
  generate:
    description:
      - Commands (argument lists) run in O(src) after the binaries are built, before the build is moved into place;
        C({out}) in an argument is the folder being built. For example controller-gen writing CRDs from the module's API
        types.
    type: list
    elements: list
    default: []
  go_binary:
    description: The go command.
    type: str
    default: go
  min_go_version:
    description: The oldest Go that can build it.
    type: str
    default: "1.24"
  environment:
    description: Extra environment of the go command (C(GOPROXY), C(GOCACHE), C(GOMODCACHE), ...).
    type: dict
    default: {}
  timeout:
    description: Seconds the build may take, waiting on another run's lock included.
    type: int
    default: 3600
  remedy:
    description:
      - What to do when the Go module proxy cannot serve the module or one it requires, said at the end of the failure's
        sentence in place of the advice to set C(GOPROXY) (for example how to give a binary built elsewhere).
      - Empty means that advice.
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: Build the Gateway API Inference Extension's EPP (static)
  inference_cache.substrate.go_build:
    module: sigs.k8s.io/gateway-api-inference-extension
    version: v1.4.0
    packages:
      epp: sigs.k8s.io/gateway-api-inference-extension/cmd/epp
    dest: ~/.cache/inference_cache/kwok_cluster/bin/gie-v1.4.0
    src: ~/.cache/inference_cache/kwok_cluster/src/gie-v1.4.0
    cgo: false
  async: 3600
  poll: 10
"""

RETURN = r"""
binaries:
  description: Each binary's path.
  returned: always
  type: dict
  sample: {epp: /home/u/.cache/inference_cache/kwok_cluster/bin/gie-v1.4.0/epp}
dest:
  description: The build's folder.
  returned: always
  type: str
go_version:
  description: The Go that built it (when a build ran).
  returned: when a build ran
  type: str
seconds:
  description: How long the build took.
  returned: when a build ran
  type: float
"""

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.errors import CheckError
from ansible_collections.inference_cache.substrate.plugins.module_utils.common.module import ansible_module
from ansible_collections.inference_cache.substrate.plugins.module_utils.common.options import validate
from ansible_collections.inference_cache.substrate.plugins.module_utils.go.build import GoBuild


def _packages_problem(packages, name):
    bad = [key for key, value in packages.items() if not key or "/" in key or not isinstance(value, str) or not value]
    return "%s maps binary names (no /) to package paths; fix %s." % (name, ", ".join(map(str, bad))) if bad else None


# The option table (common/options.py): the argument spec and the checks made before anything is touched.
OPTIONS = dict(
    module=dict(type="str", required=True),
    version=dict(type="str", required=True),
    packages=dict(type="dict", required=True, check=_packages_problem),
    dest=dict(type="path", required=True),
    src=dict(type="path", required=True),
    source=dict(type="path"),
    ldflags=dict(type="str", default="-s -w"),
    cgo=dict(type="bool", default=True),
    staging_version=dict(type="str", default=""),
    generate=dict(type="list", elements="list", default=[]),
    outputs=dict(type="list", elements="str", default=[]),
    go_binary=dict(type="str", default="go"),
    min_go_version=dict(type="str", default="1.24"),
    environment=dict(type="dict", default={}),
    timeout=dict(type="int", default=3600, range=(0, None, "open-low"), must_be="a positive number of seconds"),
    remedy=dict(type="str", default=""),
)


def main():
    # This module changes things, so it builds its module itself (common/module.run_module is for checks).
    module = ansible_module(OPTIONS, supports_check_mode=True)
    # Failures are reported outside the handlers: inside one, ansible-core before 2.19 attaches its traceback.
    failure = None
    try:
        params = validate(OPTIONS, module.params)
        result = GoBuild(params, check_mode=module.check_mode).ensure()
    except CheckError as exc:
        failure = dict(exc.facts, msg=exc.msg)
    except (IOError, OSError) as exc:
        failure = {"msg": "Cannot build %s@%s into %s: %s." % (module.params["module"], module.params["version"], module.params["dest"], exc)}
    if failure is not None:
        module.fail_json(**dict(failure, changed=False))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
