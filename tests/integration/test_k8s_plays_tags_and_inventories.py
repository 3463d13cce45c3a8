# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""playbooks/kubernetes.yml's tags, the inventories' opt-outs and modes, and the settings check's idempotence, without a cluster
(first written for issue 20's defects 2, 3, 6 and 7).

* 2: ``--tags <role>`` and ``--tags <role>_deploy`` list the tasks that apply (imported, so the tags reach them);
* 3: the README's opt-out line for each inventory names every ``*_allow_unpinned_images`` switch its plays need;
* 6: ``inventories/gpu`` (``kind_cluster_mode: existing``) runs the kind_cluster role's "Use an existing cluster";
* 7a: the settings check play (scratch renders) reports ``changed=0``, twice; real render mode still reports changes;
* 7b: the verifier Job's tasks (a transient probe) carry ``changed_when: false``.
"""

from __future__ import absolute_import, division, print_function

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
PLAYBOOK = os.path.join(ROOT, "playbooks", "kubernetes.yml")
ROLE_PREFIX = "inference_cache.substrate."
# Role -> the task file its <role>_deploy tag stands for.
DEPLOY_FILES = {
    "nvidia_device_plugin": "apply.yml",
    "model_server": "apply.yml",
    "router": "apply.yml",
    "cluster_verify": "run.yml",
}
OPT_OUTS = ["-e", "model_server_allow_unpinned_images=true", "-e", "router_allow_unpinned_images=true",
            "-e", "cluster_verify_allow_unpinned_images=true"]


def _env(**extra):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1",
               ANSIBLE_DEPRECATION_WARNINGS="0")
    env.update(extra)
    return env


def _ansible(tool, *args, **env):
    proc = subprocess.run([os.path.join(BIN, tool)] + list(args), cwd=ROOT, env=_env(**env), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return proc.stdout


def _leaf_tasks(tasks):
    """Names of the tasks --list-tasks shows for a task list: blocks flattened (their block part; always/rescue are not listed)."""
    names = []
    for task in tasks or []:
        if "block" in task:
            names.extend(_leaf_tasks(task["block"]))
        else:
            names.append(task["name"])
    return names


def _load(path):
    with open(os.path.join(ROOT, path)) as handle:
        return yaml.safe_load(handle)


def _plays(listing):
    """--list-tasks / --list-hosts output split into plays: {play header: text}."""
    parts = re.split(r"^\s*(play #\d+ \([^)]*\): [^\n]*)$", listing, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


# 2. Tags that deploy.
@pytest.mark.parametrize("tag_suffix", ["", "_deploy"])
@pytest.mark.parametrize("role", sorted(DEPLOY_FILES))
def test_role_tags_list_the_tasks_that_apply(role, tag_suffix):
    tag = role + tag_suffix
    listing = _ansible("ansible-playbook", PLAYBOOK, "-i", "inventories/kind", "--list-tasks", "--tags", tag)
    listed = set(re.findall(r"^\s+%s : (.*?)\tTAGS: \[([^\]]*)\]$" % re.escape(ROLE_PREFIX + role), listing, re.M))
    listed_names = {name for name, tags in listed if tag in [t.strip() for t in tags.split(",")]}
    wanted = _leaf_tasks(_load("roles/%s/tasks/%s" % (role, DEPLOY_FILES[role])))
    assert wanted, "the task file has tasks"
    missing = [name for name in wanted if name not in listed_names]
    assert not missing, "--tags %s does not reach these tasks of roles/%s/tasks/%s: %s" % (tag, role, DEPLOY_FILES[role], missing)


# 3. The README's opt-out lines.
def _needed_opt_outs(inventory):
    """The *_allow_unpinned_images switches of the roles that the inventory's plays of kubernetes.yml run."""
    groups = json.loads(_ansible("ansible-inventory", "-i", "inventories/" + inventory, "--list"))

    def hosts(group):
        found = set(groups.get(group, {}).get("hosts", []))
        for child in groups.get(group, {}).get("children", []):
            found |= hosts(child)
        return found

    roles = set()
    for play in _load("playbooks/kubernetes.yml"):
        if "hosts" not in play:   # the hosts check (import_playbook: require_hosts.yml), which runs no role
            continue
        # A play's hosts come from a variable whose default is the group: "{{ substrate_k8s_hosts | default('k8s_controller') }}".
        group = re.search(r"default\('([^']+)'\)", play["hosts"])
        if not hosts(group.group(1) if group else play["hosts"]):
            continue
        for entry in play.get("roles", []):
            roles.add(entry["role"] if isinstance(entry, dict) else entry)
        for task in play.get("tasks", []):
            if "ansible.builtin.include_role" in task:
                roles.add(task["ansible.builtin.include_role"]["name"])
    needed = set()
    for role in roles:
        role = role.replace(ROLE_PREFIX, "")
        defaults = _load("roles/%s/defaults/main.yml" % role) or {}
        needed |= {name for name in defaults if name.endswith("_allow_unpinned_images")}
    return needed


def _readme_opt_out_line(marker):
    with open(os.path.join(ROOT, "README.md")) as handle:
        lines = [line for line in handle if "_allow_unpinned_images=true" in line and marker in line]
    assert len(lines) == 1, "README.md has one opt-out command line with %r: %s" % (marker, lines)
    return set(re.findall(r"(\w+_allow_unpinned_images)=true", lines[0]))


@pytest.mark.parametrize("inventory, marker", [("kind", "make kubernetes ARGS="), ("gpu", "-i inventories/gpu ")])
def test_readme_opt_out_line_names_every_switch_the_inventory_needs(inventory, marker):
    needed = _needed_opt_outs(inventory)
    assert "model_server_allow_unpinned_images" in needed
    if inventory == "gpu":
        assert "nvidia_device_plugin_allow_unpinned_images" in needed, "the gpu inventory runs the device plugin"
    named = _readme_opt_out_line(marker)
    assert needed <= named, "README.md's opt-out line for inventories/%s lacks %s" % (inventory, sorted(needed - named))
    # The inventory's group_vars list the same switches, commented out.
    with open(os.path.join(ROOT, "inventories", inventory, "group_vars", "k8s_controller", "main.yml")) as handle:
        commented = set(re.findall(r"^# (\w+_allow_unpinned_images): true$", handle.read(), re.M))
    assert needed <= commented, "inventories/%s group_vars lack the commented %s" % (inventory, sorted(needed - commented))


# 6. The existing cluster of inventories/gpu is checked.
def test_gpu_inventory_checks_the_existing_cluster():
    groups = json.loads(_ansible("ansible-inventory", "-i", "inventories/gpu", "--list"))
    assert "localhost" in groups["k8s_kind"]["hosts"]
    assert groups["_meta"]["hostvars"]["localhost"]["kind_cluster_mode"] == "existing"
    hosts = _plays(_ansible("ansible-playbook", PLAYBOOK, "-i", "inventories/gpu", "--list-hosts"))
    (kind_play,) = [text for header, text in hosts.items() if "Kubernetes | kind cluster" in header]
    assert re.search(r"hosts \(1\):\s+localhost", kind_play), kind_play
    tasks = _plays(_ansible("ansible-playbook", PLAYBOOK, "-i", "inventories/gpu", "--list-tasks"))
    (kind_tasks,) = [text for header, text in tasks.items() if "Kubernetes | kind cluster" in header]
    assert ROLE_PREFIX + "kind_cluster : Use an existing cluster" in kind_tasks


# 7a. The settings check reports no change.
def _recap(output):
    (line,) = re.findall(r"^localhost\s+: (ok=.*)$", output, re.M)
    return dict((k, int(v)) for k, v in re.findall(r"(\w+)=(\d+)", line))


def test_settings_check_play_reports_no_change_twice():
    for attempt in (1, 2):
        out = _ansible("ansible-playbook", PLAYBOOK, "-i", "inventories/kind", "--tags", "substrate_check", *OPT_OUTS)
        assert "TASK [Check | remove the scratch folder]" in out, "the check play ran"
        assert "Render | write the manifests" in out, "the engines were rendered"
        stats = _recap(out)
        assert stats["changed"] == 0 and stats["failed"] == 0, "run %d: %s\n%s" % (attempt, stats, out[-3000:])


def test_real_render_mode_still_reports_changes(tmp_path):
    out = _ansible("ansible-playbook", "-i", "inventories/kind", "playbooks/render.yml", "-e", "substrate_render_dir=%s" % tmp_path,
                   "-e", "router_scoring_mode=approximate", *OPT_OUTS)
    assert _recap(out)["changed"] > 0, "a render into a folder the user keeps reports what it wrote"


# 7b. The verifier Job is a transient probe.
def _tasks(tasks):
    for task in tasks or []:
        if "block" in task:
            for key in ("block", "rescue", "always"):
                yield from _tasks(task.get(key))
        else:
            yield task


def test_verifier_job_tasks_report_no_change():
    tasks = list(_tasks(_load("roles/cluster_verify/tasks/run.yml")))
    cluster = [t for t in tasks if any(k.startswith("kubernetes.core.") for k in t)]
    assert len(cluster) >= 5, "remove, create, wait, read, delete"
    for task in cluster:
        assert task.get("changed_when") is False, "%s: the verifier Job is a probe, changed_when must be false" % task["name"]
    log = [t for t in cluster if "kubernetes.core.k8s_log" in t]
    assert log and all(t.get("failed_when") is False for t in log), "reading the logs must not fail raw"
