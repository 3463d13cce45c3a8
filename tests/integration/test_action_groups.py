# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""module_defaults for an action group of meta/runtime.yml reach every member: a play sets the group's shared options
once (``group/inference_cache.substrate.http: {validate_certs: false, timeout: 30, url: ...}``) and runs each member
against a server that does not answer; each must get that far (its own sentence for the unreachable server), never
"Unsupported parameters". Run by FQCN from a folder outside the repository, as a user runs it."""

from __future__ import absolute_import, division, print_function

import json
import os
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
COLLECTIONS = os.path.join(ROOT, ".cache", "collections")


def members():
    with open(os.path.join(ROOT, "meta", "runtime.yml")) as handle:
        return yaml.safe_load(handle)["action_groups"]["http"]


def run_members(tmp_path, defaults):
    """Each member of the http group with no option of its own under ``module_defaults`` for the group: what each said."""
    names = members()
    tasks = [{"name": name, "inference_cache.substrate.%s" % name: {}, "register": "result_%d" % index, "ignore_errors": True}
             for index, name in enumerate(names)]
    tasks.append({"name": "answers", "ansible.builtin.copy": {
        "dest": str(tmp_path / "answers.json"), "mode": "0644",
        "content": "{{ [%s] | to_json }}" % ", ".join("result_%d.msg" % index for index in range(len(names)))}})
    play = [{"hosts": "localhost", "connection": "local", "gather_facts": False,
             "module_defaults": {"group/inference_cache.substrate.http": defaults}, "tasks": tasks}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    env = dict((k, v) for k, v in os.environ.items() if not k.startswith("ANSIBLE_"))
    env.update(ANSIBLE_COLLECTIONS_PATH=COLLECTIONS, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
               ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "play.yml"], cwd=str(tmp_path), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:]
    answers = json.loads((tmp_path / "answers.json").read_text())
    assert len(answers) == len(names) >= 2
    return dict(zip(names, answers))


def test_module_defaults_of_the_http_group_reach_every_member(tmp_path):
    """The issue's defaults (validate_certs false, timeout 30) and the server, set once for the group: every member takes
    them and gets as far as the server, which does not answer."""
    answers = run_members(tmp_path, {"validate_certs": False, "timeout": 30, "url": "https://127.0.0.1:9", "model": "tiny"})
    for name, msg in answers.items():
        assert "Unsupported parameters" not in msg and "Cannot reach https://127.0.0.1:9/" in msg, (name, msg)


def test_every_member_reads_the_groups_timeout(tmp_path):
    """The shared timeout is the member's own: a wrong one set for the group is refused by each member by name."""
    answers = run_members(tmp_path, {"timeout": 0, "url": "http://127.0.0.1:9", "model": "tiny"})
    for name, msg in answers.items():
        assert msg.startswith("timeout must be above 0"), (name, msg)
