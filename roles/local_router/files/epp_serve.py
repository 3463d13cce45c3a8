#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""One EPP on this machine, confined to loopback, in the foreground until SIGTERM: the local_router role's launcher runs it as
a service of local_service. Everything but reading the arguments is ``plugins/module_utils/epp/local.serve``'s."""

from __future__ import absolute_import, division, print_function

import argparse
import importlib.util
import os
import sys

# The collection's Python by its full name, through its one loader (this file is roles/local_router/files/ of it).
_LOADER_SPEC = importlib.util.spec_from_file_location(
    "inference_cache_substrate_loader", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "plugins", "module_utils", "_loader.py"))
_LOADER = importlib.util.module_from_spec(_LOADER_SPEC)
_LOADER_SPEC.loader.exec_module(_LOADER)
_LOADER.collection()
from ansible_collections.inference_cache.substrate.plugins.module_utils.epp import local  # noqa: E402  pylint: disable=wrong-import-position


def parser():
    out = argparse.ArgumentParser(prog="epp_serve.py", description=__doc__.splitlines()[0])
    out.add_argument("--binary", required=True)
    out.add_argument("--impl", choices=local.IMPLS, default="gie")
    out.add_argument("--config", required=True, help="the EndpointPickerConfig (YAML)")
    out.add_argument("--folder", required=True, help="a private folder for the EPP's files")
    out.add_argument("--grpc-port", type=int, required=True, help="ext_proc on 127.0.0.1")
    out.add_argument("--metrics-port", type=int, required=True, help="metrics on 127.0.0.1")
    out.add_argument("--endpoint", action="append", default=[], metavar="NAME=HOST:PORT", help="an engine it reaches")
    out.add_argument("--kubeconfig")
    out.add_argument("--pool")
    out.add_argument("--namespace", default="default")
    out.add_argument("--service-account", help="run with this ServiceAccount's token (of --namespace), not --kubeconfig's user")
    out.add_argument("--secure", action="store_true")
    return out


def main(argv):
    args = parser().parse_args(argv)
    endpoints = []
    for item in args.endpoint:
        name, _eq, where = item.partition("=")
        host, _colon, port = where.rpartition(":")
        endpoints.append((name, host, int(port)))
    return local.serve(args.binary, args.impl, args.config, args.folder, args.grpc_port, args.metrics_port, endpoints=endpoints,
                       kubeconfig=args.kubeconfig, pool=args.pool, namespace=args.namespace, service_account=args.service_account,
                       secure=args.secure)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
