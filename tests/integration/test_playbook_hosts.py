# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Plays that would check nothing fail: site, verify, kubernetes and teardown take their hosts from variables whose
defaults are today's groups, and where no host matches (the inventory, the variable, --limit) the playbook fails with one
sentence naming the variable and what to do, before any other task runs (playbooks/require_hosts.yml).

Run by FQCN from a folder outside the repository, with no ansible.cfg of the repository, as a user runs them.
"""

from __future__ import absolute_import, division, print_function

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
COLLECTIONS = os.path.join(ROOT, ".cache", "collections")
INVENTORIES = os.path.join(ROOT, "inventories")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A user's folder: an inventory with one host in no group of the collection."""
    path = tmp_path_factory.mktemp("user")
    (path / "elsewhere.yml").write_text("all:\n  hosts:\n    engine1:\n      ansible_connection: local\n")
    return path


TASK = re.compile(r"^TASK \[(?P<name>.*)\] \**$")
OUTCOME = re.compile(r"^(?P<status>ok|changed|skipping|fatal|failed): \[(?P<host>[^\]]+)\](?:: FAILED!)?(?: => (?P<result>\{.*\}))?$")


def play(folder, *args):
    """(exit status, [(task name, status, result or None)]) of ansible-playbook run as a user runs it (JSON results)."""
    env = dict((k, v) for k, v in os.environ.items() if not k.startswith("ANSIBLE_"))
    env.update(ANSIBLE_COLLECTIONS_PATH=COLLECTIONS, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", ANSIBLE_CALLBACK_RESULT_FORMAT="json",
               ANSIBLE_HOST_PATTERN_MISMATCH="ignore", ANSIBLE_LOCAL_TEMP=str(folder / "tmp"))
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook")] + list(args), cwd=str(folder), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, check=False)
    tasks, name = [], None
    for line in proc.stdout.splitlines():
        match = TASK.match(line)
        if match:
            name = match.group("name")
            continue
        match = OUTCOME.match(line)
        if match and name:
            tasks.append((name, match.group("status"), json.loads(match.group("result")) if match.group("result") else None))
    return proc.returncode, tasks, proc.stdout


def failure(folder, *args):
    """The one failure of a run that must stop at the hosts check: its sentence; nothing else ran."""
    returncode, tasks, output = play(folder, *args)
    assert returncode == 2, output[-3000:]
    ran = [(name, status, result) for name, status, result in tasks if status != "skipping"]
    assert len(ran) == 1 and ran[0][:2] == ("Hosts | fail when no host of the inventory matches", "fatal"), output[-3000:]
    sentence = ran[0][2]["msg"]
    assert "\n" not in sentence and sentence.count(": ") == 1 and sentence.endswith("."), sentence
    return sentence


@pytest.mark.parametrize("playbook, inventory, extra, named", [
    # The case: a verify play for an engine elsewhere, from an inventory without local_engine hosts.
    ("verify", "elsewhere.yml", ["-e", "verify_url=http://127.0.0.1:9"], "verify_hosts (local_engine)"),
    ("verify", "local", ["-e", "verify_hosts=engines"], "verify_hosts (engines)"),
    ("site", "elsewhere.yml", [], "substrate_local_hosts or substrate_k8s_hosts (local_engine, k8s_controller)"),
    ("site", "local", ["-e", "substrate_local_hosts=engines"], "substrate_local_hosts or substrate_k8s_hosts (engines, k8s_controller)"),
    ("kubernetes", "local", [], "substrate_k8s_hosts (k8s_controller)"),
    ("kubernetes", "kind", ["-e", "substrate_k8s_hosts=cluster_hosts"], "substrate_k8s_hosts (cluster_hosts)"),
    ("teardown", "elsewhere.yml", [], "substrate_local_hosts or substrate_kwok_hosts (local_engine, k8s_kwok)"),
])
def test_a_playbook_that_matches_no_host_fails_in_one_sentence(folder, playbook, inventory, extra, named):
    path = str(folder / inventory) if inventory.endswith(".yml") else os.path.join(INVENTORIES, inventory, "hosts.yml")
    sentence = failure(folder, "-i", path, "inference_cache.substrate.%s" % playbook, *extra)
    assert sentence.startswith("No host of the inventory matches %s, so this playbook would check and change nothing: " % named), sentence


def test_the_sentence_names_the_limit(folder):
    sentence = failure(folder, "-i", os.path.join(INVENTORIES, "local", "hosts.yml"), "-i", str(folder / "elsewhere.yml"), "--limit", "engine1",
                       "inference_cache.substrate.verify", "-e", "verify_url=http://127.0.0.1:9")
    assert "(local_engine, within --limit engine1)" in sentence


def test_the_verify_sentence_says_how_to_check_from_this_machine(folder):
    sentence = failure(folder, "-i", str(folder / "elsewhere.yml"), "inference_cache.substrate.verify", "-e", "verify_url=http://127.0.0.1:9")
    assert "-e verify_hosts=localhost runs them from this machine against the engine of verify_url" in sentence


@pytest.mark.parametrize("patterns, limit, passes", [
    (["local_engine"], None, True),
    (["nothing", "k8s_controller"], None, True),       # site: either path will do
    (["nothing"], None, False),
    (["local_engine"], "localhost", True),
    (["local_engine"], "engine1", False),
    (["engine1"], None, True),                         # a host by name
    (["local_engine:&nothing"], None, False),          # a pattern, as ansible reads it
])
def test_the_check_itself(folder, patterns, limit, passes):
    """require_hosts.yml as the playbooks import it: passes where a pattern matches a host (within --limit), else fails."""
    spec = [{"variable": "var%d" % i, "pattern": p} for i, p in enumerate(patterns)]
    (folder / "check.yml").write_text(
        "- ansible.builtin.import_playbook: inference_cache.substrate.require_hosts\n"
        "  vars:\n    _substrate_host_patterns: %s\n    _substrate_no_hosts_hint: do something.\n" % json.dumps(spec))
    inventories = ["-i", os.path.join(INVENTORIES, "kind", "hosts.yml"), "-i", os.path.join(INVENTORIES, "local", "hosts.yml"),
                   "-i", str(folder / "elsewhere.yml")]
    args = inventories + (["--limit", limit] if limit else []) + [str(folder / "check.yml")]
    if passes:
        returncode, tasks, output = play(folder, *args)
        assert returncode == 0 and [status for _name, status, _result in tasks] == ["skipping"], output[-3000:]
    else:
        assert re.match(r"No host of the inventory matches var0", failure(folder, *args))
