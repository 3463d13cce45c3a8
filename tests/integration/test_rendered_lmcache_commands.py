# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The rendered LMCache settings and SGLang commands, executed by LMCache's and SGLang's own code at the pin (issue 36).

The same render as test_rendered_engine_commands.py (tests/integration/_engine_commands.py: every case of
tests/integration/_k8s_render.py, once per pytest run), the same containers as the kubelet would run them.

  ``lmcache server`` command of the LMCache sidecar (multiprocess mode) and every ``LMCacheMPConnector`` config,
  through LMCache's own config loader, CLI parser and connector code at the pin (tests/integration/_lmcache_cli.py):
  LMCache 0.5.6 from the engine venv for the vLLM pods, LMCache 0.3.15 (what the SGLang image carries) from the SGLang
  parser's venv for the SGLang pods; then what the two containers of a pod must agree on (the server's address, chunk
  hash and transfer mode, the chunk size against the block size, the probes' URL, L1 inside the memory request).
  ``test_lmcache_check_refuses_a_wrong_render`` renders five pods with one mistake each (a misspelt variable, a value
  LMCache cannot convert, a boolean it would read as False, an unknown server flag, a bad choice) and shows each
  refused with LMCache's own words.
* ``test_rendered_sglang_commands_are_accepted`` (issue 36 point 6): every SGLang engine command through SGLang
  0.5.12's own parser (tests/integration/_sglang_cli.py: ``prepare_server_args`` up to ``ServerArgs.__post_init__``,
  which asks for a GPU) in a venv of its own made here once (``~/.cache/inference_cache/sglang-parser``: SGLang without
  its GPU kernels, the engine's torch), held against the rendered flags; ``test_sglang_check_refuses_a_wrong_command``
  shows the check failing.
* ``test_what_is_not_run_here_is_named``: what cannot start here (a GPU, NIXL), what is not vLLM (the SGLang engine, the

Without the engine installation (``make site``) every test is skipped with that reason; ``LOCAL_ENGINE_START=1``
installs it first and ``LOCAL_ENGINE_REQUIRED=1`` turns the skip into a failure. The same holds for LMCache in the
engine venv (the local engine installs it with LMCache on); for development, ``SUBSTRATE_LMCACHE_PYTHON`` names another
Python with vLLM and LMCache.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _k8s_render as R  # noqa: E402  pylint: disable=wrong-import-position,import-error
import _engine_commands as E  # noqa: E402  pylint: disable=wrong-import-position,import-error
from _engine_commands import (  # noqa: E402  pylint: disable=wrong-import-position,import-error
    ROOT, STATE_DIR, ENGINE_PYTHON, CLI, POD_IP, ADDED_ENV, LMCACHE_VERSION, LMCACHE_FOR_SGLANG, SGLANG_VERSION,
    arg_value, containers, is_sglang, lmcache_missing, local_env)


@pytest.fixture(scope="module")
def installation():
    with E.installation():
        yield


@pytest.fixture(scope="module")
def commands(installation, tmp_path_factory):  # pylint: disable=redefined-outer-name,unused-argument
    return E.commands(tmp_path_factory)


# -- LMCache, executed at the pin (issue 36 point 4) --------------------------------------------------------------

LMCACHE_CLI = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_lmcache_cli.py")
# Rendered through the role like every case, each with one mistake the role cannot know (it does not read LMCache's
# keys): LMCache's own loader and parser must refuse each, with this in the reason.
LMCACHE_WRONG = {
    "lmk-neg-env-name": (R.case("vllm_lmcache", "precise", "ClusterIP", model_server_lmcache_mode="in_process",
                                model_server_env={"LMCACHE_CHUNKSIZE": "256"}),
                         "LMCache %s reads no variable LMCACHE_CHUNKSIZE" % LMCACHE_VERSION),
    "lmk-neg-env-value": (R.case("vllm_lmcache", "precise", "ClusterIP", model_server_lmcache_mode="in_process",
                                 model_server_env={"LMCACHE_MAX_LOCAL_CPU_SIZE": "lots"}),
                          "Failed to convert value for max_local_cpu_size='lots'"),
    "lmk-neg-env-bool": (R.case("vllm_lmcache", "precise", "ClusterIP", model_server_lmcache_mode="in_process",
                                model_server_env={"LMCACHE_LOCAL_CPU": "yes"}),
                         "LMCACHE_LOCAL_CPU='yes' is no boolean LMCache spells"),
    "lmk-neg-server-flag": (R.case("vllm_lmcache", "precise", "ClusterIP", model_server_lmcache_server_extra_args=["--l1-capacity-gb", "4"]),
                            "unrecognized arguments: --l1-capacity-gb 4"),
    "lmk-neg-server-value": (R.case("vllm_lmcache", "precise", "ClusterIP", model_server_lmcache_server_extra_args=["--eviction-policy", "LFU"]),
                             "argument --eviction-policy: invalid choice: 'LFU'"),
}


def _python_with(module, python):
    return os.path.exists(python) and subprocess.run(
        [python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec(%r) is None)" % module],
        capture_output=True, timeout=120, check=False).returncode == 0


@pytest.fixture(scope="module")
def lmcache_python(installation):  # pylint: disable=redefined-outer-name,unused-argument
    """The engine venv's Python once it carries LMCache (the local engine installs it beside vLLM); for development, a
    Python with lmcache and vLLM in SUBSTRATE_LMCACHE_PYTHON. None when there is neither."""
    for python in (ENGINE_PYTHON, os.environ.get("SUBSTRATE_LMCACHE_PYTHON", "")):
        if python and _python_with("lmcache", python):
            return python
    return None


def lmcache_items(per_case):
    """What LMCache reads of the rendered pods: each container's environment, each LMCache server's command, each
    LMCacheMPConnector's config; {key: item} (identical items once) and {container id: {kind: key}}."""
    items, by_container = {}, {}

    def add(entry_id, kind, body):
        key = json.dumps([kind, body], sort_keys=True)
        items.setdefault(key, dict(body, id="l%d" % len(items), kind=kind))
        by_container.setdefault(entry_id, {})[kind] = key

    for entries in per_case.values():
        for entry in entries:
            if entry["role"] != "engine-pod":
                continue
            env = dict(entry["env"])
            if any(k.startswith("LMCACHE_") for k in env) or entry["profile"] in ("vllm_lmcache", "sglang_lmcache"):
                # SGLang pods carry LMCache 0.3.15 (SGLang 0.5.12's connector), read by SGLang's LMCache integration
                add(entry["id"], "env", {"env": env, "loader": "sglang" if is_sglang(entry["argv"]) else "vllm"})
            if entry["argv"][:2] == ["lmcache", "server"]:
                add(entry["id"], "server", {"argv": entry["argv"], "env": env})
            transfer = arg_value(entry["argv"], "--kv-transfer-config")
            if transfer and "LMCacheMPConnector" in transfer:
                add(entry["id"], "connector", {"config": json.loads(transfer)})
    return items, by_container


def run_lmcache_check(python, items, workdir):
    out = os.path.join(workdir, "lmcache-results.jsonl")
    log = os.path.join(workdir, "lmcache-check.log")
    with open(log, "w") as handle:
        run = subprocess.run([python, LMCACHE_CLI, "check", out], input=json.dumps({"items": list(items.values())}),
                             cwd=workdir, stdout=handle, stderr=subprocess.STDOUT, text=True, timeout=600, check=False,
                             env=dict(local_env({"env": {}}, os.path.join(workdir, "home")), PYTHONHASHSEED="42"))
    with open(log) as handle:
        log_text = handle.read()
    assert run.returncode == 0, "the LMCache check process failed (exit %s): %s" % (run.returncode, log_text[-3000:])
    with open(out) as handle:
        lines = [json.loads(line) for line in handle if line.strip()]
    results = dict((r["id"], r) for r in lines[1:])
    return lines[0], dict((key, results[item["id"]]) for key, item in items.items())


@pytest.fixture(scope="module")
def lmcache_checked(commands, lmcache_python, sglang_python):  # pylint: disable=redefined-outer-name
    """vLLM pods through LMCache 0.5.6 (the engine venv), SGLang pods through LMCache 0.3.15 (the SGLang parser's venv)."""
    items, by_container = lmcache_items(commands["per_case"])
    started, results = time.monotonic(), {}
    for loader, python, version in (("vllm", lmcache_python, LMCACHE_VERSION), ("sglang", sglang_python, LMCACHE_FOR_SGLANG)):
        batch = dict((k, v) for k, v in items.items() if v.get("loader", "vllm") == loader)
        if batch and python:
            head, found = run_lmcache_check(python, batch, commands["workdir"])
            assert head["lmcache_version"] == version, head
            results.update(found)
    return {"results": results, "by_container": by_container, "items": items, "seconds": time.monotonic() - started}


def pod_containers(entries):
    """{Deployment: {container name: entry}} of one case's engine pods."""
    pods = {}
    for entry in entries:
        if entry["role"] == "engine-pod":
            pods.setdefault(entry["group"], {})[entry["container"]["name"]] = entry
    return pods


def server_port(url):
    return int(url.rsplit(":", 1)[1])


LMCACHE_CASES = sorted(n for n, host in R.CASES.items() if host.get("model_server_profile") in ("vllm_lmcache", "sglang_lmcache"))


@pytest.mark.parametrize("name", LMCACHE_CASES)
def test_rendered_lmcache_is_accepted(commands, lmcache_checked, name):  # pylint: disable=redefined-outer-name
    """Every LMCache variable, LMCache server command and LMCacheMPConnector config of the case, through LMCache's own
    loader, parser and connector code at the pin; and what the two sides of a pod must agree on."""
    entries = commands["per_case"][name]
    mine = [(e, kinds) for e in entries for kinds in [lmcache_checked["by_container"].get(e["id"])] if kinds]
    assert mine, "%s: an LMCache profile without anything LMCache reads" % name
    if any(key not in lmcache_checked["results"] for _e, kinds in mine for key in kinds.values()):
        lmcache_missing()
    problems = []
    facts = {}
    for entry, kinds in mine:
        for kind, key in sorted(kinds.items()):
            result = lmcache_checked["results"][key]
            if result["stage"] != "ok":
                problems.append("%s (%s): LMCache %s refused it at %s: %s" % (
                    entry["id"], kind, LMCACHE_FOR_SGLANG if is_sglang(entry["argv"]) else LMCACHE_VERSION, result["stage"], result["error"]))
            else:
                facts[(entry["id"], kind)] = result["facts"]
    assert not problems, "\n".join(problems)
    for group, containers_ in pod_containers(entries).items():
        engine, server = containers_.get("engine"), containers_.get("lmcache-server")
        transfer = json.loads(arg_value(engine["argv"], "--kv-transfer-config") or "{}")
        names = [transfer.get("kv_connector")] + [c.get("kv_connector") for c in (transfer.get("kv_connector_extra_config") or {}).get("connectors", [])]
        if server is None:
            assert "LMCacheMPConnector" not in names, "%s/%s: LMCacheMPConnector without an LMCache server in the pod" % (name, group)
            continue
        served = facts[(server["id"], "server")]
        connector = facts[(engine["id"], "connector")]["connectors"]
        assert facts[(engine["id"], "connector")]["resolved_class"].startswith("lmcache.integration.vllm."), facts
        assert len(connector) == 1, connector
        connector = connector[0]
        where = "%s/%s" % (name, group)
        # the connector dials the server it is beside, with the same chunk hash and a transfer mode the server offers
        # ZMQ (the engine's KV) never beyond the pod; the HTTP port (LMCache's metrics beside its admin API) on the pod's
        # addresses where a PodMonitor scrapes it, admitted by the NetworkPolicy to the scraper only (test_render_k8s_production)
        assert served["host"] == "127.0.0.1", "%s: the LMCache server's ZMQ port listens beyond the pod: %s" % (where, served)
        assert served["http_host"] in ("127.0.0.1", "0.0.0.0"), "%s: the LMCache server's HTTP host is %s" % (where, served["http_host"])
        assert connector["server_url"] == "tcp://127.0.0.1:%d" % served["port"], (where, connector, served)
        assert connector["hash_algorithm"] == served["hash_algorithm"], (where, connector, served)
        assert served["supported_transfer_mode"] in ("auto", connector["transfer_mode"]), (where, connector, served)
        block_size = int(arg_value(engine["argv"], "--block-size"))
        assert served["chunk_size"] % block_size == 0, "%s: LMCache chunk %s is no multiple of block %s" % (where, served["chunk_size"], block_size)
        # the probes ask the server's own /healthcheck on its HTTP port, from inside the container
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            command = server["container"][probe]["exec"]["command"]
            assert command[:2] == ["python3", "-c"], command
            compile(command[2], "<probe>", "exec")
            url = re.search(r"urlopen\('([^']+)'", command[2]).group(1)
            assert url == "http://127.0.0.1:%d/healthcheck" % served["http_port"] and "/healthcheck" in served["routes"], (where, url, served)
        # L1 allocated up front, inside the container's memory request
        assert served["l1_use_lazy"] is False and served["eviction_policy"] == "LRU", served
        request = server["container"]["resources"]["requests"]["memory"]
        assert request.endswith("Gi") and int(request[:-2]) * (1 << 30) > served["l1_size_bytes"], (where, request, served)
        # a native sidecar: started before the engine, running beside it
        assert server["container"]["restartPolicy"] == "Always", server["container"]
    print("%s: %d LMCache items accepted by LMCache %s (all cases: %d distinct items in %.0f s)" % (
        name, sum(len(k) for _e, k in mine), LMCACHE_VERSION, len(lmcache_checked["items"]), lmcache_checked["seconds"]))


def test_lmcache_check_refuses_a_wrong_render(lmcache_python, installation, tmp_path):  # pylint: disable=redefined-outer-name,unused-argument
    """The check fails where LMCache would misread what was rendered: one rendered mistake per case (the role cannot
    know LMCache's keys), each refused with LMCache's own reason; the same pods without the mistake pass (the cases of
    test_rendered_lmcache_is_accepted)."""
    if not lmcache_python:
        lmcache_missing()
    returncode, output, out = R.run_render(str(tmp_path), dict((n, host) for n, (host, _why) in LMCACHE_WRONG.items()))
    assert returncode == 0, output[-4000:]
    data_dir = str(tmp_path / "volumes")
    per_case = dict((n, containers(n, R.load_case(out, n), data_dir)) for n in LMCACHE_WRONG)
    items, by_container = lmcache_items(per_case)
    _head, results = run_lmcache_check(lmcache_python, items, str(tmp_path))
    for name, (_host, reason) in LMCACHE_WRONG.items():
        refused = [r for e in per_case[name] for key in by_container.get(e["id"], {}).values()
                   for r in [results[key]] if r["stage"] != "ok"]
        assert refused, "%s: LMCache's loader and parser accepted the wrong render" % name
        assert any(reason in r["error"] for r in refused), (name, refused)


# -- the vLLM production-stack chart, rendered and run at the pin (issue 36 point 5) ----------------------------------

with open(R.PINS) as _pins:
    VLLM_STACK = yaml.safe_load(_pins)["charts"]["vllm_stack"]
# No chart repository can be reached from this machine, and the chart is never committed: a copy of the chart at the pinned
# version, outside the repository, where SUBSTRATE_VLLM_STACK_CHART says or in the collection's cache. Fetch it with
# `helm pull vllm-stack --repo https://vllm-project.github.io/production-stack --version 0.1.12 --untar` (or
# `git archive vllm-stack-0.1.12 helm` of vllm-project/production-stack).
VLLM_STACK_CHART = os.environ.get("SUBSTRATE_VLLM_STACK_CHART") or os.path.join(
    os.path.dirname(STATE_DIR), "charts", "vllm-stack-%s" % VLLM_STACK["version"])
HELM_CANDIDATES = (os.path.join(os.path.dirname(STATE_DIR), "kwok_cluster", "bin", "helm-v3.18.4", "helm"), shutil.which("helm") or "")
CHART_CASE = R.case("vllm_lmcache", "precise", "ClusterIP", model_server_chart_ref=VLLM_STACK_CHART, model_server_hash_seed="123",
                    model_server_hf_token_secret="hf-secret")


def _coalesce(defaults, values):
    """Helm's merge of user values over the chart's: maps merge, null deletes a key, anything else replaces."""
    merged = dict(defaults)
    for key, value in values.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _coalesce(merged[key], value)
        else:
            merged[key] = value
    return merged


def _undeclared(values, schema, whole, prefix=""):
    """Paths of the values the schema declares no property for (it allows any, and helm passes them on), down to the maps
    the chart's templates pass through whole (``whole``: k8s_conformance.yml vllm_stack_values)."""
    found = []
    for key, value in values.items():
        path = "%s.%s" % (prefix, key) if prefix else key
        props = schema.get("properties")
        if props is None:
            continue
        if key not in props:
            found.append(path)
            continue
        if path in whole:
            continue
        sub = props[key]
        if isinstance(value, dict):
            found.extend(_undeclared(value, sub, whole, path))
        elif isinstance(value, list) and "items" in sub:
            found.extend(p for item in value if isinstance(item, dict) for p in _undeclared(item, sub["items"], whole, path + "[]"))
    return found


def test_vllm_stack_chart_runs_at_the_pin(commands, lmcache_python, tmp_path):  # pylint: disable=redefined-outer-name
    """The chart alternative, with a copy of vllm-stack 0.1.12 outside the repository: the rendered values against the
    chart's values.schema.json (after helm's own merge with values.yaml) and every key declared there; `helm template`
    of the chart with them (its two dependencies, both off, as empty stand-ins); and the engine container the chart renders
    through vLLM 0.32.0's parser and config builder and LMCache 0.5.6's loader, as the role's own pods are."""
    import jsonschema  # pylint: disable=import-outside-toplevel

    helm = [h for h in HELM_CANDIDATES if h and os.path.exists(h)]
    if not os.path.exists(os.path.join(VLLM_STACK_CHART, "Chart.yaml")) or not helm:
        pytest.skip("no copy of the vllm-stack %s chart at %s (SUBSTRATE_VLLM_STACK_CHART; no chart repository is reachable here) or "
                    "no helm (%s): fetch the chart with `helm pull vllm-stack --repo https://vllm-project.github.io/production-stack "
                    "--version %s --untar`" % (VLLM_STACK["version"], VLLM_STACK_CHART, ", ".join(h for h in HELM_CANDIDATES if h),
                                               VLLM_STACK["version"]))
    with open(os.path.join(VLLM_STACK_CHART, "Chart.yaml")) as handle:
        chart = yaml.safe_load(handle)
    assert chart["name"] == VLLM_STACK["name"] and str(chart["version"]) == VLLM_STACK["version"], chart
    os.makedirs(str(tmp_path / "render"))
    returncode, output, out = R.run_render(str(tmp_path / "render"), {"chart": CHART_CASE})
    assert returncode == 0, output[-4000:]
    with open(os.path.join(out, "chart", "model_server", "helm", "vllm-stack.values.yaml")) as handle:
        values = yaml.safe_load(handle)
    case = R.load_case(out, "chart")
    # the schema, as helm applies it (to the merged values), and every key a declared one
    with open(os.path.join(VLLM_STACK_CHART, "values.schema.json")) as handle:
        schema = json.load(handle)
    with open(os.path.join(VLLM_STACK_CHART, "values.yaml")) as handle:
        defaults = yaml.safe_load(handle)
    merged = _coalesce(defaults, values)
    errors = sorted(e.message for e in jsonschema.validators.validator_for(schema)(schema).iter_errors(merged))
    assert not errors, errors
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "k8s_conformance.yml")) as handle:
        whole = set(yaml.safe_load(handle)["vllm_stack_values"])
    undeclared = _undeclared(values, schema, whole)
    assert not undeclared, "keys values.schema.json does not declare: %s" % undeclared
    # helm template, on a copy whose dependencies (conditions off) are empty charts of their names and versions
    copy = str(tmp_path / "vllm-stack")
    shutil.copytree(VLLM_STACK_CHART, copy)
    for dep in chart.get("dependencies", []):
        os.makedirs(os.path.join(copy, "charts", dep["name"]))
        with open(os.path.join(copy, "charts", dep["name"], "Chart.yaml"), "w") as handle:
            yaml.safe_dump({"apiVersion": "v2", "name": dep["name"], "version": dep["version"]}, handle)
        assert not (merged.get(dep["name"]) or {}).get("enabled"), dep
    values_file = os.path.join(out, "chart", "model_server", "helm", "vllm-stack.values.yaml")
    run = subprocess.run([helm[0], "template", "model-server", copy, "--namespace", "inference-cache", "-f", values_file],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    docs = [d for d in yaml.safe_load_all(run.stdout) if d]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds.count("Deployment") == 1 and "Ingress" not in kinds, kinds
    deployment = [d for d in docs if d["kind"] == "Deployment"][0]
    assert deployment["metadata"]["name"] == "model-server-model-server-deployment-vllm"
    pod = deployment["spec"]["template"]
    # the role's Services and NetworkPolicy, and the contract, select these pods
    for doc in case["manifests"]["model_server"]:
        if doc["kind"] in ("Service", "NetworkPolicy"):
            selector = doc["spec"].get("selector") or doc["spec"]["podSelector"]["matchLabels"]
            assert set(selector.items()) <= set(pod["metadata"]["labels"].items()), (doc["kind"], selector, pod["metadata"]["labels"])
    assert pod["metadata"]["labels"]["llm-d.ai/inference-serving"] == "true"
    container = pod["spec"]["containers"][0]
    names = [e["name"] for e in container["env"]]
    assert len(names) == len(set(names)), "an environment variable twice: %s" % names
    assert container["securityContext"].get("runAsNonRoot") is not False, container["securityContext"]
    env = dict((e["name"], e.get("value")) for e in container["env"])
    assert env["PYTHONHASHSEED"] == "123", "the chart's own seed, which model_server_hash_seed must equal"
    # executed at the pin: vLLM's parser and config builder, LMCache's loader (as for the role's own pods)
    entry = containers("chart", {"manifests": {"model_server": [deployment]}, "engine": {"profile": "vllm_lmcache"},
                                 "router_values": {"router": {"tokenizer": {"enabled": False}}}}, commands["data_dir"])[0]
    assert entry["argv"][:2] == ["vllm", "serve"], entry["argv"]
    result = _vllm_check_one(entry, commands)
    # vLLM 0.32.0 knows no VLLM_RPC_TIMEOUT, which the chart sets on every LMCache engine (the engine only warns; the
    # check's hard_fail names it): parser and config builder passed (the facts are there)
    assert result["stage"] == "environ" and result["error"] == "Unknown vLLM environment variable detected: VLLM_RPC_TIMEOUT", result
    assert result["facts"]["kv_transfer_config"]["kv_connector"] == "LMCacheConnectorV1"
    assert result["facts"]["kv_events_config"]["topic"] == "kv@%s:8000@Qwen/Qwen3-0.6B" % POD_IP
    if not lmcache_python:
        lmcache_missing()
    items = {"chart": {"id": "chart", "kind": "env", "env": entry["env"], "loader": "vllm"}}
    dead = sorted(n for n in entry["env"] if n in ("LMCACHE_USE_EXPERIMENTAL",))
    _head, results = run_lmcache_check(lmcache_python, items, str(tmp_path))
    # LMCache 0.5.6 reads no LMCACHE_USE_EXPERIMENTAL, which the chart sets on every LMCache engine (a leftover of
    # LMCache's experimental namespace): named, and the rest must load
    assert results["chart"]["stage"] == "names" and dead == ["LMCACHE_USE_EXPERIMENTAL"], results["chart"]
    assert results["chart"]["error"] == "LMCache %s reads no variable LMCACHE_USE_EXPERIMENTAL" % LMCACHE_VERSION, results["chart"]
    items["chart"]["env"] = dict((k, v) for k, v in entry["env"].items() if k not in dead)
    _head, results = run_lmcache_check(lmcache_python, items, str(tmp_path))
    assert results["chart"]["stage"] == "ok", results["chart"]
    facts = results["chart"]["facts"]
    assert facts["local_cpu"] is True and facts["max_local_cpu_size"] == 5.0 and facts["enable_kv_events"] is True, facts
    assert facts["chunk_size"] == 256


def _vllm_check_one(entry, commands):  # pylint: disable=redefined-outer-name
    out = os.path.join(commands["workdir"], "chart-results.jsonl")
    env = local_env(entry, os.path.join(commands["data_dir"], "home"))
    with open(os.path.join(commands["workdir"], "chart-check.log"), "w") as handle:
        run = subprocess.run([ENGINE_PYTHON, CLI, "check", out], input=json.dumps({"commands": [{"id": "chart", "argv": entry["argv"], "env": env}]}),
                             cwd=commands["workdir"], stdout=handle, stderr=subprocess.STDOUT, text=True, timeout=600, check=False,
                             env=dict(local_env({"env": {}}, os.path.join(commands["data_dir"], "home")), PYTHONHASHSEED="42"))
    assert run.returncode == 0
    with open(out) as handle:
        return [json.loads(line) for line in handle if line.strip()][1]


# -- SGLang's own parser (issue 36 point 6) -----------------------------------------------------------------------

SGLANG_CLI = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sglang_cli.py")
# SGLang 0.5.12 from PyPI cannot start here (its kernels are CUDA builds; REFERENCE M2), but its parser imports without
# them. A venv of its own, made once and kept: sglang at the pin with its dependencies but the GPU kernels, the CUDA-only
# packages and the model, grammar and media packages the parser never imports (uv overrides that never match drop them),
# the engine venv's torch in place of SGLang's torch==2.11.0 (the parser imports torch but depends on no version of it;
# uv links the engine's copy from its cache), and LMCache 0.3.15 without dependencies (what the SGLang image must carry;
# its config loader reads the pods' LMCACHE_* variables). Measured here: made in 2.7 s on a warm uv cache; 36 packages,
# 394 MB beyond the engine's; 4.7 MB of files of its own (the rest hard links into uv's cache).
SGLANG_DIR = os.path.join(os.path.dirname(STATE_DIR), "sglang-parser")
SGLANG_VENV = os.path.join(SGLANG_DIR, "venv")
SGLANG_PYTHON = os.path.join(SGLANG_VENV, "bin", "python")
SGLANG_LEFT_OUT = ("flashinfer_python", "flashinfer_cubin", "nvidia-cutlass-dsl", "sglang-kernel", "sgl-deep-gemm", "flash-attn-4",
                   "quack-kernels", "tilelang", "tokenspeed_mla", "torch_memory_saver", "torchao", "torchaudio", "torchcodec",
                   "cuda-python", "apache-tvm-ffi", "kernels",
                   "modelscope", "timm", "scipy", "xgrammar", "llguidance", "outlines", "soundfile", "py-spy", "gguf", "openai-harmony",
                   "smg-grpc-servicer", "blobfile", "compressed-tensors", "anthropic")


def _uv():
    for uv in (os.path.join(ROOT, ".venv", "bin", "uv"), shutil.which("uv") or ""):
        if uv and os.path.exists(uv):
            return uv
    return None


@pytest.fixture(scope="module")
def sglang_python(installation):  # pylint: disable=redefined-outer-name,unused-argument
    """The SGLang parser's venv (made here once; kept while what it holds stays the same)."""
    torch = subprocess.run([ENGINE_PYTHON, "-c", "import importlib.metadata as m; print(m.version('torch'))"],
                           capture_output=True, text=True, timeout=120, check=True).stdout.strip().split("+")[0]
    major, minor = torch.split(".")[:2]
    # torchvision's minor is torch's plus 15 (0.28 goes with 2.13); SGLang's parser module imports torchvision.io
    overrides = ["torch==%s" % torch, "torchvision==0.%d.*" % (int(minor) + 15)] + ['%s; sys_platform == "never"' % p for p in SGLANG_LEFT_OUT]
    want = {"sglang": SGLANG_VERSION, "lmcache": LMCACHE_FOR_SGLANG, "overrides": overrides, "torch_major": major}
    marker = os.path.join(SGLANG_VENV, ".substrate-sglang-parser.json")
    if os.path.exists(marker) and os.path.exists(SGLANG_PYTHON):
        with open(marker) as handle:
            if json.load(handle) == want:
                return SGLANG_PYTHON
    uv = _uv()
    if not uv:
        pytest.fail("no uv here (make setup installs it into .venv): the SGLang parser's venv cannot be made")
    shutil.rmtree(SGLANG_VENV, ignore_errors=True)
    os.makedirs(SGLANG_DIR, exist_ok=True)
    overrides_file = os.path.join(SGLANG_DIR, "overrides.txt")
    with open(overrides_file, "w") as handle:
        handle.write("\n".join(overrides) + "\n")
    # uv's download cache: the engine's (inventories/local: UV_CACHE_DIR, else the state folder's), where its torch is
    env = dict(os.environ, UV_CACHE_DIR=os.environ.get("UV_CACHE_DIR") or os.path.join(STATE_DIR, "cache", "uv"), UV_NO_PROGRESS="1")
    started = time.monotonic()
    for argv in ([uv, "venv", "--quiet", "--python", sys.executable, SGLANG_VENV],
                 [uv, "pip", "install", "--quiet", "--python", SGLANG_PYTHON, "sglang==%s" % SGLANG_VERSION, "--override", overrides_file],
                 [uv, "pip", "install", "--quiet", "--python", SGLANG_PYTHON, "--no-deps", "lmcache==%s" % LMCACHE_FOR_SGLANG]):
        run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800, check=False)
        if run.returncode != 0:
            shutil.rmtree(SGLANG_VENV, ignore_errors=True)
            pytest.fail("the SGLang parser's venv could not be made (`%s`): %s" % (" ".join(argv[:3]), (run.stdout + run.stderr)[-2000:]))
    with open(marker, "w") as handle:
        json.dump(want, handle)
    print("SGLang parser venv made in %.0f s" % (time.monotonic() - started))
    return SGLANG_PYTHON


@pytest.fixture(scope="module")
def sglang_checked(commands, sglang_python):  # pylint: disable=redefined-outer-name
    """Every distinct SGLang command through SGLang's own parser, in one process."""
    unique, by_container = {}, {}
    for entries in commands["per_case"].values():
        for entry in entries:
            if entry["role"] == "engine-pod" and is_sglang(entry["argv"]):
                # the process's own temporary folder too (local_env's): importing SGLang's parser imports torch's
                # inductor, which makes torchinductor_<user> there
                env = dict(entry["env"], TMPDIR=os.path.join(commands["data_dir"], "home", "tmp"), **ADDED_ENV)
                key = json.dumps([entry["argv"], env], sort_keys=True)
                unique.setdefault(key, {"id": "s%d" % len(unique), "argv": entry["argv"], "env": env, "users": []})["users"].append(entry["id"])
    out = os.path.join(commands["workdir"], "sglang-results.jsonl")
    log = os.path.join(commands["workdir"], "sglang-check.log")
    started = time.monotonic()
    with open(log, "w") as handle:
        run = subprocess.run([sglang_python, SGLANG_CLI, "check", out], input=json.dumps({"commands": list(unique.values())}),
                             cwd=commands["workdir"], stdout=handle, stderr=subprocess.STDOUT, text=True, timeout=600, check=False,
                             env=dict(local_env({"env": {}}, os.path.join(commands["data_dir"], "home")), PYTHONHASHSEED="42"))
    with open(log) as handle:
        log_text = handle.read()
    assert run.returncode == 0, "the SGLang check process failed (exit %s): %s" % (run.returncode, log_text[-3000:])
    with open(out) as handle:
        lines = [json.loads(line) for line in handle if line.strip()]
    assert lines[0]["sglang_version"] == SGLANG_VERSION, lines[0]
    results = dict((r["id"], r) for r in lines[1:])
    for command in unique.values():
        for user in command["users"]:
            by_container[user] = results[command["id"]]
    return {"by_container": by_container, "distinct": len(unique), "seconds": time.monotonic() - started}


SGLANG_CASES = sorted(n for n, host in R.CASES.items() if host.get("model_server_profile") == "sglang_lmcache")


@pytest.mark.parametrize("name", SGLANG_CASES)
def test_rendered_sglang_commands_are_accepted(commands, sglang_checked, name):  # pylint: disable=redefined-outer-name
    """Every SGLang engine command of the case through SGLang 0.5.12's own parser (_sglang_cli.py: prepare_server_args
    up to ServerArgs.__post_init__, which needs a GPU), and what it built held against the rendered flags."""
    entries = [e for e in commands["per_case"][name] if e["role"] == "engine-pod" and is_sglang(e["argv"])]
    assert entries, "%s renders no SGLang command" % name
    problems = []
    for entry in entries:
        result = sglang_checked["by_container"][entry["id"]]
        if result["stage"] != "ok":
            problems.append("%s: SGLang %s refused `%s` at %s: %s" % (entry["id"], SGLANG_VERSION, " ".join(entry["argv"]),
                                                                      result["stage"], result["error"]))
            continue
        facts, argv = result["facts"], entry["argv"]
        want = {"model_path": arg_value(argv, "--model-path"), "port": int(arg_value(argv, "--port")),
                "page_size": int(arg_value(argv, "--page-size")), "context_length": int(arg_value(argv, "--context-length")),
                "tp_size": int(arg_value(argv, "--tp")), "enable_lmcache": "--enable-lmcache" in argv,
                "enable_metrics": "--enable-metrics" in argv}
        for key, value in want.items():
            if facts[key] != value:
                problems.append("%s: SGLang built %s=%r, the command says %r" % (entry["id"], key, facts[key], value))
        kv_arg = arg_value(argv, "--kv-events-config")
        if kv_arg:
            for key, value in json.loads(kv_arg).items():
                if (facts["kv_events_config"] or {}).get(key) != value:
                    problems.append("%s: --kv-events-config %s=%r became %r" % (entry["id"], key, value, (facts["kv_events_config"] or {}).get(key)))
    assert not problems, "\n".join(problems)
    print("%s: %d SGLang command(s) accepted (%d distinct in %.0f s)" % (name, len(entries), sglang_checked["distinct"], sglang_checked["seconds"]))


def test_sglang_check_refuses_a_wrong_command(sglang_python, tmp_path):  # pylint: disable=redefined-outer-name
    """The parser check can fail: a vLLM flag, a bad value and a KV-event key SGLang has not, each refused by SGLang."""
    base = ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-0.6B"]
    wrong = {"flag": (base + ["--block-size", "32"], "unrecognized arguments: --block-size 32"),
             "value": (base + ["--tp", "two"], "invalid int value: 'two'"),
             "kv": (base + ["--kv-events-config", '{"enable_kv_cache_events":true,"publisher":"zmq"}'],
                    "KVEventsConfig has no field enable_kv_cache_events")}
    out = str(tmp_path / "wrong.jsonl")
    env = {"TMPDIR": str(tmp_path)}   # importing SGLang's parser makes torchinductor_<user> in the temporary folder
    run = subprocess.run([sglang_python, SGLANG_CLI, "check", out], capture_output=True, text=True, timeout=600, check=False,
                         env=dict(os.environ, **env),
                         input=json.dumps({"commands": [{"id": k, "argv": argv, "env": env} for k, (argv, _why) in wrong.items()]}))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    with open(out) as handle:
        results = dict((r["id"], r) for r in (json.loads(line) for line in list(handle)[1:]))
    for key, (_argv, why) in wrong.items():
        assert results[key]["stage"] != "ok" and why in results[key]["error"], results[key]


# -- what is not run here, named ---------------------------------------------------------------------------------
