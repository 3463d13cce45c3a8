#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

DOCUMENTATION = r"""
module: local_service
short_description: Start, health-check, restart or stop a local process that runs from a launcher script
version_added: 0.1.0
description:
  - Runs a launcher script (a vLLM engine of the role C(inference_cache.substrate.local_engine), etcd and the control
    plane of C(inference_cache.substrate.kwok_cluster), a confined EPP, any process the collection runs on this
    machine) in the background, in a session of its own, and waits until its health URL answers; or stops that
    session (SIGTERM to the whole process group, or first to its leader alone, see O(stop_scope); a bounded wait, then
    SIGKILL).
  - The process is restarted when O(checksum) differs from the checksum it was started with.
  - Records the process's pid in O(pidfile), and in O(runfile) the checksum and the process's identity (start time and
    boot id). A pid is only signalled when the live process is the one recorded, so a pid reused after a reboot or
    after the process died is left alone.
  - Before a start, fails with one sentence naming the owner when one of O(ports) is taken.
  - Replaces C(inference_cache.substrate.local_engine_service), which is redirected here.
  - Linux only (the boot id, process sessions and groups).
author:
  - inference_cache.substrate contributors (@inference-cache)
requirements:
  - psutil (on the managed host)
extends_documentation_fragment:
  - inference_cache.substrate._attributes
attributes:
  check_mode:
    support: full
    details: Reports whether the process would be started, restarted or stopped, and does nothing.
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  state:
    description:
      - V(started) runs the process with the launcher's settings (restarting it when O(checksum) changed);
        V(stopped) stops it and removes its pid and run files.
    type: str
    choices: [started, stopped]
    default: started
  launcher:
    description: Executable script that C(exec)s the process. Required when O(state=started).
    type: path
  log:
    description: File that receives the process's standard output and error (truncated at each start).
    type: path
  pidfile:
    description: File holding the process's pid.
    type: path
    required: true
  runfile:
    description: File recording the settings checksum the process was started with and its identity.
    type: path
    required: true
  checksum:
    description: Checksum of the process's settings; empty takes the SHA-1 of O(launcher).
    type: str
    default: ""
  health_url:
    description: URL that answers HTTP 200 once the process is ready. Required when O(state=started).
    type: str
  api_key:
    description: Bearer token sent with the health request.
    type: str
    default: ""
  host:
    description: Address the process binds, for the check of O(ports).
    type: str
    default: 127.0.0.1
  ports:
    description: TCP ports the process binds; each must be free before a start.
    type: list
    elements: int
    default: []
  health_ca_path:
    description:
      - CA bundle (PEM) that signs the certificate of an C(https) O(health_url), for a process that serves its health
        endpoint over TLS with a certificate of its own CA (the components of C(inference_cache.substrate.kwok_cluster)).
      - Empty uses the system's trust store.
    type: path
  name:
    description: What the process is, in the sentences of a failure (for example V(engine) or V(kube-apiserver)).
    type: str
    default: service
  ports_hint:
    description:
      - The variables that set O(ports), named in the sentence when a port is taken.
      - Empty names none.
    type: str
    default: ""
  start_timeout:
    description: Seconds to wait for O(health_url) after a start.
    type: int
    default: 300
  stop_timeout:
    description: Seconds to wait after SIGTERM before SIGKILL.
    type: int
    default: 30
  stop_scope:
    description:
      - Who gets the first SIGTERM of a stop (or of a restart on new settings).
      - V(group) signals every process of the session's process group at once.
      - V(leader) signals the process the launcher C(exec)s alone, as the kubelet signals a container's first process,
        and the rest of the group only once it has exited (or at once when it is gone already). For a program that stops
        its own children, such as a vLLM engine, whose API server sends its EngineCore a SIGTERM of its own (vLLM 0.32.0's
        EngineCore can hang for good on a second one that lands while the first is handled).
      - Whatever is left when O(stop_timeout) runs out gets SIGKILL, the whole group, either way.
    type: str
    choices: [group, leader]
    default: group
"""

EXAMPLES = r"""
- name: Run the engine
  inference_cache.substrate.local_service:
    name: engine
    launcher: /srv/engine/run/default/engine.sh
    log: /srv/engine/run/default/engine.log
    pidfile: /srv/engine/run/default/engine.pid
    runfile: /srv/engine/run/default/engine.settings.sha1
    health_url: http://127.0.0.1:8000/health
    ports: [8000, 5558]
    ports_hint: local_engine_port, local_engine_kv_events_replay_endpoint

- name: Stop the engine
  inference_cache.substrate.local_service:
    name: engine
    state: stopped
    pidfile: /srv/engine/run/default/engine.pid
    runfile: /srv/engine/run/default/engine.settings.sha1
"""

RETURN = r"""
pid:
  description: Pid of the process's main process (the leader of its session); none when stopped or in check mode.
  returned: O(state=started)
  type: int
pids:
  description: Pids of every process of its session or process group (for an engine, API server, engine core, workers).
  returned: O(state=started)
  type: list
  elements: int
rss_kib:
  description: Resident memory of those processes together, in KiB.
  returned: O(state=started)
  type: int
started:
  description: Whether this run started the process (or would, in check mode).
  returned: O(state=started)
  type: bool
restarted:
  description: Whether a running process was stopped first because its settings changed.
  returned: O(state=started)
  type: bool
start_seconds:
  description: Seconds from the start until the health URL answered; none when the process was already running.
  returned: O(state=started)
  type: float
stopped_pids:
  description: The processes stopped (or that would be, in check mode).
  returned: O(state=stopped)
  type: list
  elements: int
foreign:
  description: A live process whose pid the pid file names but which is not the one recorded; it was left alone.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import missing_required_lib
from ansible.module_utils.urls import open_url

from ansible_collections.inference_cache.substrate.plugins.module_utils.common.errors import CheckError
from ansible_collections.inference_cache.substrate.plugins.module_utils.common.module import ansible_module
from ansible_collections.inference_cache.substrate.plugins.module_utils.common.options import validate
from ansible_collections.inference_cache.substrate.plugins.module_utils.service.process import HAS_PSUTIL, PSUTIL_IMPORT_ERROR
from ansible_collections.inference_cache.substrate.plugins.module_utils.service.supervisor import STOP_SCOPES, ServiceFiles, Supervisor, file_checksum


def _ports_problem(ports, name):
    bad = [port for port in ports if not 0 < port < 65536]
    return "%s must lie in 1-65535, got %s." % (name, ", ".join(map(str, bad))) if bad else None


SECONDS = "a positive number of seconds"
# The option table (common/options.py): the argument spec and the checks made before anything is touched.
OPTIONS = dict(
    state=dict(type="str", choices=["started", "stopped"], default="started"),
    launcher=dict(type="path"),
    log=dict(type="path"),
    pidfile=dict(type="path", required=True),
    runfile=dict(type="path", required=True),
    checksum=dict(type="str", default=""),
    health_url=dict(type="str"),
    api_key=dict(type="str", default="", no_log=True),
    host=dict(type="str", default="127.0.0.1"),
    ports=dict(type="list", elements="int", default=[], check=_ports_problem),
    health_ca_path=dict(type="path"),
    name=dict(type="str", default="service"),
    ports_hint=dict(type="str", default=""),
    start_timeout=dict(type="int", default=300, range=(0, None, "open-low"), must_be=SECONDS),
    stop_timeout=dict(type="int", default=30, range=(0, None, "open-low"), must_be=SECONDS),
    stop_scope=dict(type="str", choices=list(STOP_SCOPES), default="group"),
)


def _health_probe(api_key, ca_path=None):
    headers = {"Authorization": "Bearer " + api_key} if api_key else {}

    def healthy(url):
        try:
            return open_url(url, headers=headers, timeout=5, follow_redirects="none", use_proxy=False,
                            ca_path=ca_path or None).getcode() == 200
        except Exception:  # pylint: disable=broad-exception-caught  # any failure means "not ready yet"
            return False
    return healthy


def _ensure(params, check_mode):
    """Start or stop the process as ``state`` says; the result of the Supervisor (``changed`` from its comparison)."""
    files = ServiceFiles(params["pidfile"], params["runfile"], log=params["log"], launcher=params["launcher"])
    service = Supervisor(files, _health_probe(params["api_key"], params["health_ca_path"]), check_mode=check_mode,
                         name=params["name"], ports_hint=params["ports_hint"], stop_scope=params["stop_scope"])
    try:
        if params["state"] == "stopped":
            return service.ensure_stopped(params["stop_timeout"])
        checksum = params["checksum"] or file_checksum(params["launcher"]) or ""
        return service.ensure_started(checksum, params["health_url"], params["host"], params["ports"],
                                      params["start_timeout"], params["stop_timeout"])
    except (IOError, OSError) as exc:
        raise CheckError("Cannot control the %s of %s: %s." % (params["name"], params["pidfile"], exc))


def main():
    # This module changes things, so it builds its module itself (common/module.run_module is for checks).
    module = ansible_module(OPTIONS, required_if=[("state", "started", ("launcher", "log", "health_url"))], supports_check_mode=True)
    if not HAS_PSUTIL:
        module.fail_json(msg=missing_required_lib("psutil"), exception=PSUTIL_IMPORT_ERROR)
    # The failure is reported outside the handler: inside it, ansible-core before 2.19 attaches its traceback.
    failure = None
    try:
        params = validate(OPTIONS, module.params)
        result = _ensure(params, module.check_mode)
    except CheckError as exc:
        failure = exc
    if failure is not None:
        module.fail_json(msg=failure.msg, **failure.facts)
    if result.get("foreign"):
        module.warn("The pid file %s named pid %d, which is not the %s (%s); it was left alone."
                    % (params["pidfile"], result["foreign"]["pid"], params["name"], result["foreign"]["reason"]))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
