# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The make targets work whatever HOME is.

Ansible expands the "~" of its async folder through the account's home, not $HOME; with HOME set to another folder an
async task's status is looked up where the job never wrote it ("could not find job"): the local engine's vLLM install
failed that way. The Makefile names the folder outright (ANSIBLE_ASYNC_DIR under $HOME).
"""

from __future__ import absolute_import, division, print_function

import os
import shutil
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: An async task, polled like the engine's install
      ansible.builtin.command: "true"
      async: 30
      poll: 1
"""


def _make(home, playbook):
    env = {k: v for k, v in os.environ.items() if k != "ANSIBLE_ASYNC_DIR"}
    env["HOME"] = home
    target = "home-async-check: ; $(BIN)/ansible-playbook -i inventories/local %s" % playbook
    return subprocess.run(["make", "--no-print-directory", "--eval", target, "home-async-check"], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=300, check=False)


def test_an_async_task_runs_with_home_set_elsewhere():
    home = tempfile.mkdtemp(prefix="substrate-home-")
    try:
        playbook = os.path.join(home, "async.yml")
        with open(playbook, "w") as handle:
            handle.write(PLAYBOOK)
        proc = _make(home, playbook)
        assert proc.returncode == 0, proc.stdout[-3000:]
        assert "could not find job" not in proc.stdout
        # The job's status went to the home it was given, not the account's.
        assert os.path.isdir(os.path.join(home, ".ansible_async"))
    finally:
        shutil.rmtree(home)
