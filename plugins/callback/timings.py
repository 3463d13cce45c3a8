# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Callback plugin inference_cache.substrate.timings: the start and end of every task, written to a JSON file."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

DOCUMENTATION = r"""
name: timings
type: aggregate
author:
  - inference_cache maintainers (@inference-cache)
short_description: Write when each task started and ended, and the play recap, to a JSON file
version_added: 0.1.0
description:
  - Records, for every task of the playbook, its name, role, file and line, action, when it started and when its last
    result arrived, and per host its status and whether it changed something; at the end writes them, with the play
    recap of every host, to one JSON file.
  - Prints nothing. C(benchmarks/bench_site.py) (C(make bench-site)) enables it for its runs only and reads the file
    to say where the time of C(playbooks/site.yml) goes.
  - Enable it with E(ANSIBLE_CALLBACKS_ENABLED=inference_cache.substrate.timings) and name the file with
    O(output_path); without a file it writes nothing.
requirements:
  - enable in configuration (C(callbacks_enabled) or E(ANSIBLE_CALLBACKS_ENABLED))
options:
  output_path:
    description:
      - The JSON file to write at the end of the playbook (replaced if it exists; its folder must exist).
      - "Its keys: C(started) and C(ended) (seconds since the epoch), C(elapsed), C(cpu) (CPU seconds, user and system,
        of C(ansible-playbook) and the processes it waited for, at the end), C(tasks) (each with C(name), C(role),
        C(path), C(action), C(start) and C(end) in seconds after C(started), C(cpu) at its start, and C(hosts): status
        and C(changed) per host) and C(stats) (the recap per host: C(ok), C(changed), C(failures), C(unreachable),
        C(skipped), C(rescued), C(ignored))."
      - CPU of processes that outlive their task (an C(async) task's job, a daemon a module starts) is not counted.
    type: path
    env:
      - name: INFERENCE_CACHE_TIMINGS_PATH
    ini:
      - section: callback_timings
        key: output_path
"""

import json
import os
import resource
import time

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    """Keep the start and end of each task; write them and the recap to ``output_path`` at the end."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "inference_cache.substrate.timings"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, display=None):
        super(CallbackModule, self).__init__(display=display)
        self.started = time.time()
        self.origin = time.monotonic()
        self.tasks = []
        self.by_uuid = {}
        self.path = None

    def set_options(self, task_keys=None, var_options=None, direct=None):
        super(CallbackModule, self).set_options(task_keys=task_keys, var_options=var_options, direct=direct)
        self.path = self.get_option("output_path")

    def _now(self):
        return round(time.monotonic() - self.origin, 3)

    @staticmethod
    def _cpu():
        """CPU seconds of this process and of the children it waited for (Ansible's workers, the modules they ran)."""
        total = 0.0
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
            usage = resource.getrusage(who)
            total += usage.ru_utime + usage.ru_stime
        return round(total, 3)

    # -- tasks ----------------------------------------------------------------------------
    def _task_start(self, task, handler=False):
        role = getattr(task, "_role", None)
        entry = {
            "name": task.get_name(),
            "role": role.get_name() if role is not None else None,
            "path": task.get_path(),
            "action": task.action,
            "handler": handler,
            "start": self._now(),
            "cpu": self._cpu(),
            "end": None,
            "hosts": {},
        }
        self.tasks.append(entry)
        self.by_uuid[task._uuid] = entry  # pylint: disable=protected-access

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._task_start(task)

    def v2_playbook_on_handler_task_start(self, task):
        self._task_start(task, handler=True)

    def _result(self, result, status):
        entry = self.by_uuid.get(result._task._uuid)  # pylint: disable=protected-access
        if entry is None:
            return
        entry["end"] = self._now()
        host = result._host.get_name()  # pylint: disable=protected-access
        entry["hosts"][host] = {"status": status, "changed": bool(result._result.get("changed", False))}  # pylint: disable=protected-access

    def v2_runner_on_ok(self, result):
        self._result(result, "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._result(result, "ignored" if ignore_errors else "failed")

    def v2_runner_on_skipped(self, result):
        self._result(result, "skipped")

    def v2_runner_on_unreachable(self, result):
        self._result(result, "unreachable")

    # -- the end --------------------------------------------------------------------------
    def v2_playbook_on_stats(self, stats):
        if not self.path:
            return
        recap = {}
        for host in sorted(stats.processed):
            summary = stats.summarize(host)
            recap[host] = dict((key, summary.get(key, 0)) for key in
                               ("ok", "changed", "failures", "unreachable", "skipped", "rescued", "ignored"))
        document = {
            "started": round(self.started, 3),
            "ended": round(time.time(), 3),
            "elapsed": self._now(),
            "cpu": self._cpu(),
            "tasks": self.tasks,
            "stats": recap,
        }
        temporary = "%s.%d.tmp" % (self.path, os.getpid())
        try:
            with open(temporary, "w") as handle:
                json.dump(document, handle, indent=1, sort_keys=True)
            os.rename(temporary, self.path)
        except (IOError, OSError) as exc:
            self._display.warning("inference_cache.substrate.timings could not write %s: %s" % (self.path, exc))
