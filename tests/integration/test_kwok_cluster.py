# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The kwok cluster of roles/kwok_cluster, for real: a kube-apiserver of the pinned version answers these tests.

* every manifest the render cases of _k8s_render.py produce passes a server-side dry-run apply against it
  (the API server's own validation, admission and defaulting, not an offline schema);
* the role is idempotent, survives a kwok restart (new settings: the node leases of the old kwok are deleted, so the
  nodes' pods are still scheduled and become Ready), and state absent leaves no process, port or data.

The cluster here has a name and ports of its own (not those of the molecule scenario `kwok`); its binaries come from the
same state folder, so they are built once per machine and version (Go 1.24+ needed: the first build takes minutes).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest
import yaml

import _k8s_render as R  # pylint: disable=import-error

ROOT = R.ROOT
NAME = "substrate-kwok-test"
PORTS = {"kwok_cluster_api_port": 17443, "kwok_cluster_etcd_port": 17379, "kwok_cluster_etcd_peer_port": 17380,
         "kwok_cluster_controller_manager_port": 17257, "kwok_cluster_scheduler_port": 17259, "kwok_cluster_kwok_port": 17247}
PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  roles:
    - role: inference_cache.substrate.kwok_cluster
"""
# Kinds whose API comes from a CRD that this cluster does not have (the router's Gateway API objects): they are
# listed by the test, never counted as passed. The InferencePool CRDs are there: kwok_cluster generates them from the
# GIE API types (its gie build), and the dry-run test applies them first.
CRD_GROUPS = ("gateway.networking.k8s.io",)


def _env():
    return dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1",
                ANSIBLE_DEPRECATION_WARNINGS="0")


def run_role(tmp_path, **extra):
    """One run of the role (state present unless told); returns (returncode, output, PLAY RECAP counts)."""
    playbook = tmp_path / "kwok.yml"
    playbook.write_text(PLAYBOOK)
    variables = dict(PORTS, kwok_cluster_name=NAME, ansible_python_interpreter=sys.executable)
    variables.update(extra)
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
           str(playbook), "-e", json.dumps(variables)]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, check=False)
    recap = re.search(r"localhost\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", proc.stdout)
    counts = dict(zip(("ok", "changed", "unreachable", "failed"), map(int, recap.groups()))) if recap else {}
    return proc.returncode, proc.stdout, counts


def _open(port):
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _processes_of(run_dir):
    proc = subprocess.run(["pgrep", "-f", run_dir + "/"], stdout=subprocess.PIPE, universal_newlines=True, check=False)
    return proc.stdout.split()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kwok")
    code, output, unused_counts = run_role(tmp)
    assert code == 0, output[-6000:]
    run_dir = os.path.join(os.environ["HOME"], ".cache", "inference_cache", "kwok_cluster", "clusters", NAME)
    info = {"run_dir": run_dir, "kubeconfig": os.path.join(run_dir, "kubeconfig"), "nodes": ["kwok-cpu-0", "kwok-gpu-0"],
            "gpu_nodes": ["kwok-gpu-0"]}
    assert os.path.isfile(info["kubeconfig"]), output[-4000:]
    from kubernetes import config  # pylint: disable=import-outside-toplevel
    yield {"tmp": tmp, "info": info, "api": config.new_client_from_config(info["kubeconfig"])}
    code, output, unused_counts = run_role(tmp, kwok_cluster_state="absent")
    assert code == 0, output[-4000:]
    assert not [port for port in PORTS.values() if _open(port)], "ports still open after state absent"
    assert not _processes_of(info["run_dir"]), "processes left after state absent"
    assert not os.path.exists(info["run_dir"]) and not os.path.exists(info["kubeconfig"])


def _dynamic(api):
    """The collection's dynamic client (discovery in memory: no osrcp-<hash>.json left in the temporary folder)."""
    from ansible_collections.inference_cache.substrate.tests.harness.epp_lab import dynamic_client  # pylint: disable=import-outside-toplevel
    return dynamic_client(api)


@pytest.fixture(scope="module")
def rendered_docs(rendered_cases):
    """Every object of every render case (conftest.py renders them once per session)."""
    docs = []
    for name in sorted(R.CASES):
        for role, manifests in rendered_cases["cases"][name]["manifests"].items():
            docs.extend((name, role, doc) for doc in manifests)
    return docs


def _generated_crds():
    with open(R.PINS) as handle:
        version = yaml.safe_load(handle)["tools"]["gateway_api_inference_extension"]
    return os.path.join(os.environ["HOME"], ".cache", "inference_cache", "kwok_cluster", "bin", "gie-%s" % version, "inferencepool-crds.yaml")


def _apply_generated_crds(client, timeout=60):
    """The CRDs the role's gie build generated (controller-gen over the GIE API types), applied and established."""
    crds = client.resources.get(api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition")
    with open(_generated_crds()) as handle:
        names = []
        for doc in yaml.safe_load_all(handle):
            if doc:
                crds.server_side_apply(body=doc, name=doc["metadata"]["name"], field_manager="substrate-dry-run", force_conflicts=True)
                names.append(doc["metadata"]["name"])
    assert "inferencepools.inference.networking.k8s.io" in names, names
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        established = [c.metadata.name for c in crds.get().items
                       if any(k.type == "Established" and k.status == "True" for k in (c.status.conditions or []))]
        if set(names) <= set(established):
            client.resources.invalidate_cache()   # the new kinds are served now
            return names
        time.sleep(0.5)
    raise AssertionError("the generated CRDs %s were not established within %ss" % (names, timeout))


def test_every_rendered_manifest_passes_a_server_side_dry_run(cluster, rendered_docs):
    """Each object of every render case, applied server-side with dryRun=All: the API server validates, defaults and
    admits it (unknown fields are refused: fieldValidation=Strict) and stores nothing."""
    from kubernetes.dynamic.exceptions import ResourceNotFoundError  # pylint: disable=import-outside-toplevel
    client = _dynamic(cluster["api"])
    namespaces = client.resources.get(api_version="v1", kind="Namespace")
    # The nvkind cases' pods name RuntimeClass nvidia, which nvkind creates (NVIDIA/nvkind pkg/nvkind/cluster.go): so does this test.
    client.resources.get(api_version="node.k8s.io/v1", kind="RuntimeClass").server_side_apply(
        body={"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia"},
        name="nvidia", field_manager="substrate-dry-run")
    _apply_generated_crds(client)
    for namespace in sorted({doc["metadata"].get("namespace") for unused_case, unused_role, doc in rendered_docs} - {None}):
        if not [n for n in namespaces.get().items if n.metadata.name == namespace]:
            namespaces.create(body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    passed, without_crd, refused = 0, set(), []
    for case_name, role, doc in rendered_docs:
        try:
            resource = client.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        except ResourceNotFoundError:
            group = doc["apiVersion"].split("/")[0]
            assert group in CRD_GROUPS, "%s/%s %s of %s is of no API this Kubernetes serves" % (
                doc["apiVersion"], doc["kind"], doc["metadata"]["name"], case_name)
            without_crd.add("%s/%s" % (doc["apiVersion"], doc["kind"]))
            continue
        try:
            resource.server_side_apply(body=doc, name=doc["metadata"]["name"], namespace=doc["metadata"].get("namespace"),
                                       field_manager="substrate-dry-run", dry_run="All", force_conflicts=True,
                                       query_params=[("fieldValidation", "Strict")])
            passed += 1
        except Exception as exc:  # pylint: disable=broad-exception-caught  # every refusal is reported together
            refused.append("%s %s %s/%s: %s" % (case_name, role, doc["kind"], doc["metadata"]["name"],
                                                getattr(exc, "body", None) or exc))
    print("server-side dry-run: %d objects of %d cases passed; kinds of CRDs this cluster lacks: %s"
          % (passed, len(R.CASES), ", ".join(sorted(without_crd)) or "none"))
    assert not refused, "\n".join(refused)
    assert passed >= len(R.CASES) * 4  # a Deployment, two Services and a NetworkPolicy per case at least


# router_impl gie (the render cases of test_render_router_gie.py): every object the router role renders, its own included
# (the ClusterRole and binding metrics authentication needs, a NetworkPolicy with an ipBlock for a managed Gateway). The
# HTTPRoute, Istio's DestinationRule and GKE's policies are of CRDs this cluster lacks.
GIE_CRD_GROUPS = CRD_GROUPS + ("networking.istio.io", "networking.gke.io")


def test_every_gie_router_object_passes_a_server_side_dry_run(cluster, tmp_path):
    import test_render_router_gie as G  # pylint: disable=import-error,import-outside-toplevel
    from kubernetes.dynamic.exceptions import ResourceNotFoundError  # pylint: disable=import-outside-toplevel
    config = tmp_path / "user-epp-config.yaml"
    config.write_text(yaml.safe_dump(G.USER_CONFIG))
    cases = dict((name, dict((k, str(config) if v == "@USER_CONFIG@" else v) for k, v in host.items())) for name, host in R.GIE_CASES.items())
    code, output, out = R.run_render(str(tmp_path), cases)
    assert code == 0, output[-4000:]
    docs = [(name, doc) for name in sorted(cases) for doc in R.load_case(out, name)["manifests"]["router"]]
    client = _dynamic(cluster["api"])
    _apply_generated_crds(client)
    namespaces = client.resources.get(api_version="v1", kind="Namespace")
    for namespace in sorted({doc["metadata"].get("namespace") for unused_name, doc in docs} - {None}):
        if not [n for n in namespaces.get().items if n.metadata.name == namespace]:
            namespaces.create(body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    passed, refused = [], []
    for name, doc in docs:
        try:
            resource = client.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        except ResourceNotFoundError:
            assert doc["apiVersion"].split("/")[0] in GIE_CRD_GROUPS, "%s/%s of %s" % (doc["apiVersion"], doc["kind"], name)
            continue
        try:
            resource.server_side_apply(body=doc, name=doc["metadata"]["name"], namespace=doc["metadata"].get("namespace"),
                                       field_manager="substrate-dry-run", dry_run="All", force_conflicts=True,
                                       query_params=[("fieldValidation", "Strict")])
            passed.append(doc["kind"])
        except Exception as exc:  # pylint: disable=broad-exception-caught  # every refusal is reported together
            refused.append("%s %s/%s: %s" % (name, doc["kind"], doc["metadata"]["name"], getattr(exc, "body", None) or exc))
    assert not refused, "\n".join(refused)
    assert {"InferencePool", "Deployment", "NetworkPolicy", "ClusterRole", "ClusterRoleBinding"} <= set(passed), sorted(set(passed))


def test_a_second_run_changes_nothing(cluster):
    code, output, counts = run_role(cluster["tmp"])
    assert code == 0, output[-4000:]
    assert counts["changed"] == 0, output[-4000:]


def _wait_ready_pod(api, name, timeout=60):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    core = client.CoreV1Api(api)
    core.create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/none:0"}], "nodeSelector": {"type": "kwok"}}})
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            pod = core.read_namespaced_pod(name, "default")
            if pod.status.phase == "Running" and pod.status.pod_ip and pod.spec.node_name:
                return pod
            time.sleep(1)
        return core.read_namespaced_pod(name, "default")
    finally:
        core.delete_namespaced_pod(name, "default", grace_period_seconds=0)


def test_new_kwok_settings_restart_kwok_and_its_nodes_keep_running_pods(cluster):
    """kwok restarted with other settings: a new kwok does not take over the node leases of the old one, so the role
    deletes them; pods scheduled afterwards must still become Running on a kwok node."""
    assert _wait_ready_pod(cluster["api"], "before-restart").status.phase == "Running"
    changed_port = dict(kwok_cluster_kwok_port=PORTS["kwok_cluster_kwok_port"] + 1)
    try:
        code, output, counts = run_role(cluster["tmp"], **changed_port)
        assert code == 0, output[-4000:]
        assert counts["changed"] > 0
        assert not _open(PORTS["kwok_cluster_kwok_port"]) and _open(PORTS["kwok_cluster_kwok_port"] + 1)
        pod = _wait_ready_pod(cluster["api"], "after-restart")
        assert pod.status.phase == "Running", "pod after the kwok restart: %s" % pod.status
    finally:
        code, output, unused_counts = run_role(cluster["tmp"])  # back to the module's settings (the finalizer checks those ports)
        assert code == 0, output[-4000:]


def test_the_api_server_reports_the_pinned_version(cluster):
    """The linker flags stamp the version the binaries were built at (clients read major and minor from /version)."""
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    with open(R.PINS) as handle:
        pinned = yaml.safe_load(handle)["tools"]["kubernetes"]
    version = client.VersionApi(cluster["api"]).get_code()
    major, minor = re.match(r"v(\d+)\.(\d+)\.", pinned).groups()
    assert (version.git_version, version.major, version.minor) == (pinned, major, minor), version


def test_the_gpu_node_advertises_a_gpu_and_the_cpu_node_none(cluster):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    nodes = {n.metadata.name: n for n in client.CoreV1Api(cluster["api"]).list_node().items}
    assert sorted(nodes) == sorted(cluster["info"]["nodes"]) == ["kwok-cpu-0", "kwok-gpu-0"]
    assert nodes["kwok-gpu-0"].status.allocatable.get("nvidia.com/gpu") == "1"
    assert "nvidia.com/gpu" not in nodes["kwok-cpu-0"].status.allocatable
    assert cluster["info"]["gpu_nodes"] == ["kwok-gpu-0"]
    for node in nodes.values():
        ready = [c for c in node.status.conditions if c.type == "Ready"]
        assert ready and ready[0].status == "True"


def test_the_control_plane_listens_on_loopback_only(cluster):
    """Every socket of the cluster's processes is bound to 127.0.0.1 (the etcd client port has no authentication)."""
    pids = _processes_of(cluster["info"]["run_dir"])
    assert len(pids) >= 5
    inodes = set()
    for pid in pids:
        for fd in os.listdir("/proc/%s/fd" % pid):
            link = os.readlink("/proc/%s/fd/%s" % (pid, fd)) if os.path.islink("/proc/%s/fd/%s" % (pid, fd)) else ""
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as handle:
            for line in handle.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                    listening.append(fields[1])
    assert listening, "no listening socket found for the cluster's processes"
    assert all(address.startswith("0100007F:") for address in listening), listening


def test_a_bad_setting_is_one_sentence(tmp_path):
    code, output, unused_counts = run_role(tmp_path, kwok_cluster_host="0.0.0.0")
    assert code != 0
    assert "a loopback host (127.x" in output and "Traceback" not in output


def test_without_go_a_missing_build_is_one_sentence(tmp_path):
    """A builds' folder without binaries and no Go toolchain: the go_builds role the cluster asks stops before building,
    naming what it would build."""
    code, output, unused_counts = run_role(tmp_path, kwok_cluster_state_dir=str(tmp_path / "state"),
                                           go_builds_state_dir=str(tmp_path / "builds"),
                                           go_builds_go_binary=str(tmp_path / "no-such-go"))
    assert code != 0
    assert ("go_builds builds kubernetes, etcd, kwok, helm, controller-gen, gie, prometheus-operator-crds from the Go module proxy "
            "and needs Go 1.24 or later") in \
        " ".join(output.split())
    assert "as %s (not found): install Go" % (tmp_path / "no-such-go") in " ".join(output.split())
    assert "Traceback" not in output and not (tmp_path / "state" / "clusters").exists()


def test_the_kubernetes_pin_is_the_minor_of_the_kind_node_image():
    with open(R.PINS) as handle:
        pins = yaml.safe_load(handle)
    minor = re.match(r"v(\d+\.\d+)\.", pins["tools"]["kubernetes"]).group(1)
    assert pins["images"]["kind_node"]["tag"].startswith("v%s." % minor)
    assert re.match(r"v\d+\.\d+\.\d+$", pins["tools"]["etcd"]) and re.match(r"v\d+\.\d+\.\d+$", pins["tools"]["kwok"])
