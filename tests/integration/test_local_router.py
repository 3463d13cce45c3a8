# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""roles/local_router without a cluster: its settings checked first in one sentence, a missing EPP binary named with
where to get it, and state absent (nothing to stop) twice without a change. What it does with a cluster and real
engines runs in `make kwok-traffic` and the verify step of the molecule scenario `kwok`."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  roles:
    - role: inference_cache.substrate.local_router
"""


def run_role(tmp_path, **variables):
    """One ansible-playbook run of the role on localhost: (returncode, output with its lines joined, PLAY RECAP counts)."""
    playbook = tmp_path / "local_router.yml"
    playbook.write_text(PLAYBOOK)
    variables = dict(variables, ansible_python_interpreter=sys.executable)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           str(playbook), "-e", json.dumps(variables)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    recap = re.search(r"localhost\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", proc.stdout)
    counts = dict(zip(("ok", "changed", "unreachable", "failed"), map(int, recap.groups()))) if recap else {}
    return proc.returncode, " ".join((proc.stdout + proc.stderr).split()), counts


def test_settings_are_checked_first_in_one_sentence(tmp_path):
    code, output, _counts = run_role(tmp_path, local_router_kubeconfig="/nowhere", local_router_addresses=["10.0.0.1"],
                                     local_router_dir=str(tmp_path / "epp"))
    assert code != 0 and "local_router settings are inconsistent" in output and "distinct loopback addresses" in output
    assert "Traceback" not in output and not (tmp_path / "epp").exists()


def test_a_missing_epp_binary_says_where_to_get_one(tmp_path):
    code, output, _counts = run_role(tmp_path, local_router_kubeconfig="/nowhere", local_router_epp_binary=str(tmp_path / "no-epp"),
                                     local_router_dir=str(tmp_path / "epp"))
    assert code != 0 and ("No GIE EPP v1.4.0 at %s: build it with `ansible-playbook playbooks/go_build.yml` (make gie-epp; the "
                          "catalog's gie build), or set local_router_epp_binary to one." % (tmp_path / "no-epp")) in output
    assert "Traceback" not in output and not (tmp_path / "epp").exists()


def test_absent_with_nothing_running_changes_nothing_and_needs_no_cluster(tmp_path):
    folder = tmp_path / "epp"
    folder.mkdir()
    (folder / "epp.kubeconfig").write_text("token: x\n")
    code, output, counts = run_role(tmp_path, local_router_state="absent", local_router_dir=str(folder))
    assert code == 0 and counts["changed"] == 1 and not folder.exists(), output[-3000:]   # the folder (a token in it) is gone
    code, output, counts = run_role(tmp_path, local_router_state="absent", local_router_dir=str(folder))
    assert code == 0 and counts["changed"] == 0, output[-3000:]


FLAGS_PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  tasks:
    - ansible.builtin.include_vars:
        file: %s
    - ansible.builtin.debug:
        msg: "FLAGS {{ {'tls': _local_router_flags['--secure-serving'] | default('true') | string | lower == 'true',
                        'config': _local_router_flags['--config-file'] | basename} | to_json }}"
"""


def test_the_epps_flags_are_read_in_both_shapes(tmp_path):
    """The chart passes --name value, the router role --name=value (a boolean flag must be one argument): both are read, so
    a Deployment with --secure-serving=false makes the local EPP serve plain gRPC."""
    playbook = tmp_path / "flags.yml"
    playbook.write_text(FLAGS_PLAYBOOK % os.path.join(ROOT, "roles", "local_router", "vars", "main.yml"))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    seen = []
    for args in (["--pool-name", "r", "--config-file", "/config/a.yaml", "--secure-serving=false", "--tracing=false"],
                 ["--config-file", "/config/b.yaml", "--secure-serving", "false"],
                 ["--config-file=/config/c.yaml"]):
        variables = {"_local_router_epp_args": args, "ansible_python_interpreter": sys.executable}
        proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
                               str(playbook), "-e", json.dumps(variables)], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300, check=False)
        found = re.search(r'FLAGS (\{[^}]*\})', proc.stdout)
        assert proc.returncode == 0 and found, proc.stdout[-2000:]
        seen.append(json.loads(found.group(1)))
    assert seen == [{"tls": False, "config": "a.yaml"}, {"tls": False, "config": "b.yaml"}, {"tls": True, "config": "c.yaml"}]
