# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Import this collection's plugins/module_utils without installing the collection.

Usage from a script in tools/:  ``from _loader import module_utils; kv = module_utils("kv.events")``.
The directory is registered as the package ``inference_cache_substrate_module_utils`` so that the relative
imports between module_utils files (``from ._kv_events import ...``) work.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import importlib
import os
import sys
import types

PACKAGE = "inference_cache_substrate_module_utils"
MODULE_UTILS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "plugins", "module_utils")


def module_utils(name):
    """Return the module ``plugins/module_utils/<name>.py`` of the collection this file sits in."""
    if PACKAGE not in sys.modules:
        package = types.ModuleType(PACKAGE)
        package.__path__ = [MODULE_UTILS]
        sys.modules[PACKAGE] = package
    return importlib.import_module("%s.%s" % (PACKAGE, name))
