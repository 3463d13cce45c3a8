# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""LMCache's own config loader and argument parser, run on what the roles render (issue 36 point 4).

Run with a Python that has ``lmcache`` (0.5.6, the pin) and vLLM: the engine venv once the local engine installs LMCache
(tests/integration/test_rendered_lmcache_commands.py chooses it). ``_lmcache_cli.py check OUT.jsonl`` reads
``{"items": [...]}`` on stdin and writes one JSON line per item to OUT.jsonl, after a first line with LMCache's version.
Each item is one of:

* ``{"kind": "env", "env": {...}, "loader": "vllm" | "sglang"}``: a container's environment. Every ``LMCACHE_*`` name
  must be one LMCache reads (a key of ``lmcache.v1.config._CONFIG_DEFINITIONS`` as ``LMCACHE_<KEY>``, or a name
  LMCache's own code reads: the ``LMCACHE_*`` string constants of the installed package); then the config is built as
  the engine's LMCache integration builds it, with ``os.environ`` set to that environment: vLLM's in-process connector
  (``lmcache.integration.vllm.utils.lmcache_get_or_create_config()``: ``LMCACHE_CONFIG_FILE`` or the variables, then
  ``validate()``) or SGLang's (``lmcache.integration.sglang.utils.lmcache_get_config()``, run with LMCache 0.3.15,
  the version the SGLang image carries); each ``LMCACHE_<KEY>`` must come out as LMCache's own converter reads the
  rendered string.
* ``{"kind": "server", "argv": ["lmcache", "server", ...], "env": {...}}``: the command of the LMCache server container,
  parsed by LMCache's CLI as ``lmcache.cli.main.main()`` builds it (its parser, ``register_commands`` on that route,
  ``parse_args``), then the five configs ``lmcache server`` builds before it listens
  (``lmcache/cli/commands/server.py`` ``ServerCommand.execute``: ``parse_args_to_http_frontend_config``,
  ``parse_args_to_mp_server_config``, ``parse_args_to_config``, ``parse_args_to_observability_config``,
  ``parse_args_to_coordinator_config``), with ``os.environ`` set to the container's environment.
* ``{"kind": "connector", "config": {...}}``: a ``--kv-transfer-config`` naming ``LMCacheMPConnector`` (alone or inside a
  MultiConnector). vLLM 0.32.0 resolves that name to LMCache's own connector when LMCache is installed
  (vllm/distributed/kv_transfer/kv_connector/v1/lmcache_mp_connector.py ``_resolve_lmcache_mp_connector``); its
  ``kv_connector_extra_config`` keys must be ones that connector reads (``lmcache.mp.`` + the members of
  ``ExtraConfigDefault``, and the ``lmcache.mp.*`` string constants of ``lmcache/integration/vllm``), and the values go
  through its own ``_resolve_extra_config`` and ``MPTransferMode``.

LMCache's loader only logs a WARNING for an unknown key or a value it cannot convert (and carries on with the default,
``lmcache/v1/config_base.py``); here every WARNING LMCache logs while loading fails the item (but the two notes that no
config file is set, which are the normal env-only path, and the server's note that this machine cannot pin memory), and so
does a boolean that LMCache's ``_to_bool`` would silently read as False (anything but true/1, false/0). An item's
result: ``stage`` ``ok`` with ``facts``, or the stage that refused it (``names``, ``parse``, ``config``, ``warnings``,
``values``) with ``error``.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import argparse
import ast
import contextlib
import importlib.metadata
import io
import json
import logging
import os
import re
import sys
import traceback

_NAME = re.compile(r"^LMCACHE_[A-Z0-9_]+$")
_MP_KEY = re.compile(r"^lmcache\.mp\.[a-z0-9_.]+$")
# The env-only path of lmcache_get_or_create_config() says so twice; that is the path the pods take.
_EXPECTED_WARNINGS = ("No LMCache configuration file is set", "You can set the configuration file through")
# Said by the server's config builder where no memory can be pinned (this CPU machine), not of the rendered arguments.
_PLATFORM_WARNINGS = ("LazyMemoryAllocator requires memory pinning which is not supported on the current backend",)


class _Capture(logging.Handler):
    def __init__(self):
        super(_Capture, self).__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append("%s: %s" % (record.levelname, record.getMessage()))


@contextlib.contextmanager
def _environment(env):
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _warnings():
    """Every WARNING or worse that LMCache logs meanwhile. Its loggers do not propagate (lmcache/logging.py init_logger):
    the handler goes on each existing one and on each one a module imported meanwhile creates."""
    import lmcache.logging as lm_logging  # pylint: disable=import-error,import-outside-toplevel

    capture = _Capture()
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict) if name.startswith("lmcache")]
    for logger in loggers:
        logger.addHandler(capture)
    original = lm_logging.init_logger

    def init_logger(name):
        logger = original(name)
        logger.addHandler(capture)
        loggers.append(logger)
        return logger

    lm_logging.init_logger = init_logger
    try:
        yield capture.records
    finally:
        lm_logging.init_logger = original
        for logger in loggers:
            logger.removeHandler(capture)


def _string_constants(package_dir, pattern):
    """The string constants of every module under package_dir matching pattern (what LMCache's code names)."""
    found = set()
    for root, _dirs, files in os.walk(package_dir):
        for name in files:
            if not name.endswith(".py"):
                continue
            try:
                with open(os.path.join(root, name), "rb") as handle:
                    tree = ast.parse(handle.read())
            except (SyntaxError, ValueError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and pattern.match(node.value):
                    found.add(node.value)
    return found


def _known_names():
    import lmcache  # pylint: disable=import-error,import-outside-toplevel
    from lmcache.v1 import config as lm_config  # pylint: disable=import-error,import-outside-toplevel

    keys = set(lm_config._CONFIG_DEFINITIONS)  # pylint: disable=protected-access
    aliases = set(lm_config._CONFIG_ALIASES) | set(lm_config._DEPRECATED_CONFIGS)  # pylint: disable=protected-access
    code = _string_constants(os.path.dirname(lmcache.__file__), _NAME)
    return keys, aliases, code


def _load_config(loader):
    """The config as the engine's LMCache integration loads it: vLLM's in-process connector (lmcache_get_or_create_config,
    then validate()) or SGLang's (lmcache/integration/sglang/utils.py lmcache_get_config, LMCache 0.3.x)."""
    if loader == "sglang":
        from lmcache.integration.sglang.utils import lmcache_get_config  # pylint: disable=import-error,import-outside-toplevel

        return lmcache_get_config()
    from lmcache.integration.vllm import utils as lm_utils  # pylint: disable=import-error,import-outside-toplevel

    lm_utils._config_instance = None  # pylint: disable=protected-access
    try:
        return lm_utils.lmcache_get_or_create_config()
    finally:
        lm_utils._config_instance = None  # pylint: disable=protected-access


def check_env(env, known, loader="vllm"):
    keys, aliases, code = known
    names = sorted(n for n in env if n.startswith("LMCACHE_"))
    unknown = [n for n in names if n[len("LMCACHE_"):].lower() not in keys and n not in code]
    deprecated = [n for n in names if n[len("LMCACHE_"):].lower() in aliases]
    if unknown or deprecated:
        return {"stage": "names", "error": "; ".join(
            ["LMCache %s reads no variable %s" % (_version(), n) for n in unknown]
            + ["%s is a deprecated LMCache name" % n for n in deprecated])}
    config_names = [n for n in names if n[len("LMCACHE_"):].lower() in keys]
    if not config_names and "LMCACHE_CONFIG_FILE" not in env:
        return {"stage": "ok", "facts": {"lmcache_variables": names}}
    from lmcache.v1 import config as lm_config  # pylint: disable=import-error,import-outside-toplevel
    from lmcache.v1.config_base import _parse_quoted_string  # pylint: disable=import-error,import-outside-toplevel

    with _environment(env), _warnings() as logged:
        try:
            config = _load_config(loader)
        except Exception as exc:  # pylint: disable=broad-except
            return {"stage": "config", "error": "%s: %s" % (type(exc).__name__, exc), "traceback": traceback.format_exc()[-2000:]}
    bad = [w for w in logged if not any(e in w for e in _EXPECTED_WARNINGS)]
    if bad:
        return {"stage": "warnings", "error": "LMCache's config loader warned: %s" % " | ".join(bad)}
    problems, facts = [], {}
    definitions = lm_config._CONFIG_DEFINITIONS  # pylint: disable=protected-access
    for name in config_names:
        key = name[len("LMCACHE_"):].lower()
        try:
            want = definitions[key]["env_converter"](_parse_quoted_string(env[name]))
        except Exception as exc:  # pylint: disable=broad-except
            problems.append("%s=%r: LMCache's converter refuses it (%s: %s)" % (name, env[name], type(exc).__name__, exc))
            continue
        if definitions[key]["type"] is bool and env[name].strip().lower() not in ("true", "1", "false", "0"):
            # _to_bool (lmcache/v1/config_base.py) reads anything but "true"/"1" as False, without a word.
            problems.append("%s=%r is no boolean LMCache spells (true/1 or false/0); it would read it as %r" % (
                name, env[name], want))
            continue
        got = getattr(config, key)
        facts[key] = got
        if got != want:
            problems.append("%s=%r became %s=%r" % (name, env[name], key, got))
    if problems:
        return {"stage": "values", "error": "; ".join(problems)}
    return {"stage": "ok", "facts": _jsonable(facts)}


def _version():
    return importlib.metadata.version("lmcache")


def check_server(argv, env):
    entry = [e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == "lmcache"]
    if not argv or os.path.basename(argv[0]) != "lmcache" or not entry or entry[0].value != "lmcache.cli.main:main":
        return {"stage": "parse", "error": "`%s` is not LMCache's `lmcache` command (console script %s)" % (
            " ".join(argv[:2]), [e.value for e in entry])}
    from lmcache.cli.commands import register_commands  # pylint: disable=import-error,import-outside-toplevel

    tokens = list(argv[1:])
    stderr = io.StringIO()
    with _environment(env), _warnings() as logged:
        # lmcache.cli.main.main(), up to args.func(args): the same parser and directed registration.
        parser = argparse.ArgumentParser(prog="lmcache", description="LMCache")
        subparsers = parser.add_subparsers(dest="command")
        register_commands(subparsers, tokens)
        try:
            with contextlib.redirect_stderr(stderr):
                args = parser.parse_args(tokens)
        except SystemExit as exc:
            return {"stage": "parse", "error": "exit %s: %s" % (exc.code, _argparse_error(stderr.getvalue()))}
        if args.command != "server" or not hasattr(args, "chunk_size"):
            # ServerCommand.add_arguments registers nothing when the server's modules cannot be imported.
            return {"stage": "parse", "error": "LMCache's server arguments are not registered here (a lightweight install?): %s"
                    % " | ".join(logged)}
        try:
            from lmcache.v1.distributed.config import parse_args_to_config  # pylint: disable=import-error,import-outside-toplevel
            from lmcache.v1.mp_observability.config import parse_args_to_observability_config  # pylint: disable=import-error,import-outside-toplevel
            from lmcache.v1.multiprocess.config import (  # pylint: disable=import-error,import-outside-toplevel
                parse_args_to_coordinator_config, parse_args_to_http_frontend_config, parse_args_to_mp_server_config)

            http = parse_args_to_http_frontend_config(args)
            mp_config = parse_args_to_mp_server_config(args)
            storage = parse_args_to_config(args)
            parse_args_to_observability_config(args)
            parse_args_to_coordinator_config(args)
        except Exception as exc:  # pylint: disable=broad-except
            return {"stage": "config", "error": "%s: %s" % (type(exc).__name__, exc), "traceback": traceback.format_exc()[-2000:]}
    logged = [w for w in logged if not any(p in w for p in _PLATFORM_WARNINGS)]
    if logged:
        return {"stage": "warnings", "error": "LMCache warned while building the server's config: %s" % " | ".join(logged)}
    memory = storage.l1_manager_config.memory_config
    return {"stage": "ok", "facts": _jsonable({
        "host": mp_config.host, "port": mp_config.port, "transport": mp_config.transport, "chunk_size": mp_config.chunk_size,
        "hash_algorithm": mp_config.hash_algorithm, "supported_transfer_mode": mp_config.supported_transfer_mode,
        "kv_event_log_size": mp_config.kv_event_log_size, "http_host": http.http_host, "http_port": http.http_port,
        "l1_size_bytes": memory.size_in_bytes, "l1_use_lazy": memory.use_lazy,
        "eviction_policy": storage.eviction_config.eviction_policy,
        "routes": _routes()})}


def _routes():
    """GET paths of the server's HTTP frontend that the probes may ask (its info API: /healthcheck)."""
    from lmcache.v1.multiprocess.http_apis import info_api  # pylint: disable=import-error,import-outside-toplevel

    return sorted(getattr(route, "path", "") for route in info_api.router.routes)


def _connector_keys():
    import lmcache.integration.vllm as integration  # pylint: disable=import-error,import-outside-toplevel
    from lmcache.integration.vllm.vllm_multi_process_adapter import ExtraConfigDefault  # pylint: disable=import-error,import-outside-toplevel

    keys = set("lmcache.mp." + member.name for member in ExtraConfigDefault)
    return keys | _string_constants(os.path.dirname(integration.__file__), _MP_KEY)


def check_connector(config):
    connectors = [config]
    if config.get("kv_connector") == "MultiConnector":
        connectors = (config.get("kv_connector_extra_config") or {}).get("connectors", [])
    connectors = [c for c in connectors if c.get("kv_connector") == "LMCacheMPConnector"]
    if not connectors:
        return {"stage": "ok", "facts": {"connectors": []}}
    from vllm.distributed.kv_transfer.kv_connector.v1 import lmcache_mp_connector as vllm_side  # pylint: disable=import-error,import-outside-toplevel
    from lmcache.integration.vllm.lmcache_mp_connector import _ensure_transport_scheme  # pylint: disable=import-error,import-outside-toplevel
    from lmcache.integration.vllm.vllm_multi_process_adapter import _resolve_extra_config  # pylint: disable=import-error,import-outside-toplevel
    from lmcache.v1.multiprocess.transfer_mode import MPTransferMode  # pylint: disable=import-error,import-outside-toplevel

    resolved_class = "%s.%s" % (vllm_side.LMCacheMPConnector.__module__, vllm_side.LMCacheMPConnector.__name__)
    known = _connector_keys()
    facts = []
    for connector in connectors:
        extra = connector.get("kv_connector_extra_config") or {}
        unknown = sorted(k for k in extra if k not in known)
        if unknown:
            return {"stage": "names", "error": "the connector vLLM uses (%s) reads no key %s of kv_connector_extra_config" % (
                resolved_class, ", ".join(unknown))}
        with _warnings() as logged:
            try:
                values = _resolve_extra_config(extra)
                mode = MPTransferMode(values["mp_transfer_mode"]).value
                port = int(extra.get("lmcache.mp.port", 5555))
                if not 0 < port < 65536:
                    raise ValueError("lmcache.mp.port %s is not a TCP port" % port)
                url = _ensure_transport_scheme("%s:%s" % (extra.get("lmcache.mp.host", "tcp://localhost"), port))
            except Exception as exc:  # pylint: disable=broad-except
                return {"stage": "values", "error": "LMCache's connector refuses its extra config %s: %s: %s" % (
                    json.dumps(extra), type(exc).__name__, exc)}
        if logged:
            return {"stage": "warnings", "error": "LMCache warned on the connector's extra config: %s" % " | ".join(logged)}
        facts.append({"server_url": url, "transfer_mode": mode, "hash_algorithm": values["hash_algorithm"],
                      "mq_timeout": values["mq_timeout"]})
    return {"stage": "ok", "facts": _jsonable({"resolved_class": resolved_class, "connectors": facts})}


def _argparse_error(text):
    """argparse's own sentence ("<prog>: error: ...") without the usage block before it."""
    lines = [line for line in text.strip().splitlines() if ": error: " in line]
    return lines[-1].strip() if lines else text.strip()[-2000:]


def _jsonable(value):
    return json.loads(json.dumps(value, default=str))


def main(argv):
    if argv[1:2] != ["check"] or len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    request = json.load(sys.stdin)
    logging.getLogger("lmcache").setLevel(logging.INFO)
    known = _known_names()
    with open(argv[2], "w") as out:
        out.write(json.dumps({"lmcache_version": _version(), "config_keys": len(known[0])}) + "\n")
        for item in request["items"]:
            try:
                if item["kind"] == "env":
                    result = check_env(item["env"], known, item.get("loader", "vllm"))
                elif item["kind"] == "server":
                    result = check_server(item["argv"], item.get("env", {}))
                elif item["kind"] == "connector":
                    result = check_connector(item["config"])
                else:
                    result = {"stage": "request", "error": "unknown kind %r" % item["kind"]}
            except Exception as exc:  # pylint: disable=broad-except
                result = {"stage": "crash", "error": "%s: %s" % (type(exc).__name__, exc), "traceback": traceback.format_exc()[-3000:]}
            result["id"] = item["id"]
            out.write(json.dumps(result, default=str) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
