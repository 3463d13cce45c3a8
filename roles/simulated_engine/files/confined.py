#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A simulated engine confined to loopback, in the foreground until SIGTERM: the simulated_engine role's launcher runs it as a
service of local_service.

    confined.py SPEC -- COMMAND...

SPEC (JSON): what ``plugins/module_utils/service/confine.run`` takes. Everything but reading the arguments is that function's.
"""

from __future__ import absolute_import, division, print_function

import importlib.util
import json
import os
import sys

# The collection's Python by its full name, through its one loader (this file is roles/simulated_engine/files/ of it).
_LOADER_SPEC = importlib.util.spec_from_file_location(
    "inference_cache_substrate_loader", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "plugins", "module_utils", "_loader.py"))
_LOADER = importlib.util.module_from_spec(_LOADER_SPEC)
_LOADER_SPEC.loader.exec_module(_LOADER)
_LOADER.collection()
from ansible_collections.inference_cache.substrate.plugins.module_utils.service import confine  # noqa: E402  pylint: disable=wrong-import-position


def main(argv):
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: confined.py SPEC -- COMMAND...\n")
        return 2
    return confine.run(json.loads(argv[0]), argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
