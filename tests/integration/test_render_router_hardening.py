# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Issue 38 item 1: the router as the pinned EPPs run it (GIE v1.4.0, llm-d-router v0.9.0), rendered without a cluster.

* 1: ``router_epp_extra_flags`` (and the flags map of ``router_extra_values``) checked against the pinned EPP's flags: an
  unknown flag (the EPP parses with ExitOnError), a removed metric flag (Validate refuses it) and a flag the role sets
  itself (a second ``--pool-name`` silently wins) are refused in one sentence in preflight, before anything is written.
  The flag tables are the EPPs' own: GIE's source at the tag and ``epp --help`` of the gie build;
* 2: ``router_epp_metrics_auth: true`` renders the ClusterRole and binding the EPP's token checks need (TokenReview,
  SubjectAccessReview), for both routers; the default stays false, behind the NetworkPolicy, which false cannot drop;
* 3: the EPP's NetworkPolicy admits what carries the requests: the standalone proxy's listener, a Gateway's pods (the
  chart's HTTPRoute, or your own Gateway naming a GIE pool), a managed Gateway's address ranges
  (``router_ext_proc_source_cidrs``); GKE without them is refused, never a silent bypass (FailOpen). Under
  ``router_impl: gie`` the engines' KV-event port no longer admits the llm-d EPP's label;
* 4: the GIE data-layer factory rules of ``epp/gie.py``: the cited lines at the tag hold the messages, and the gie build
  refuses (or takes) each case as ``epp_config_check`` says (the table itself: tests/unit/plugins/module_utils/epp/test_gie.py);
* 5: pprof off unless asked (``--enable-pprof=false``), on through ``router_epp_pprof``;
* 6: chart values the role's templates do not read are refused in one sentence; ``extProcPort`` moves the Service, the
  InferencePool, the container port, ``--grpc-port`` and the NetworkPolicy together.
"""

from __future__ import absolute_import, division, print_function

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
import _k8s_render as R  # noqa: E402  pylint: disable=wrong-import-position
import test_render_router_gie as G  # noqa: E402  pylint: disable=wrong-import-position

from ansible_collections.inference_cache.substrate.plugins.module_utils.epp import flags, gie  # noqa: E402
from ansible_collections.inference_cache.substrate.plugins.module_utils.epp.config import check_epp_config  # noqa: E402

ROOT = R.ROOT
EPP = G.EPP
NS = G.NS
CIDR = "10.129.0.0/23"
GATEWAY = {"gateway.networking.k8s.io/gateway-name": "inference-gateway"}
VERIFIER = {"app.kubernetes.io/component": "kv-events-verifier"}
with open(os.path.join(ROOT, "roles", "router", "vars", "main.yml")) as _handle:
    ROLE_VARS = yaml.safe_load(_handle)
# The pinned EPPs' flag tables, in Python beside their citations (epp/llm_d.py, epp/gie.py), which the role asks.
FLAGS = flags.EPPS
OWNED = ROLE_VARS["_router_owned_flags"]


# The verifier's checks with epp_route, which asks the EPP's ext_proc port where it routes (router_contract.ext_proc_address).
CHECKS = ["kv_events", "prefix_cache", "routed_prefix", "epp_route"]


def llmd(mode="approximate", **extra):
    return R.case("vllm_cpu", mode, "ClusterIP", **extra)


POSITIVE = {
    # The defaults: pprof off, no ClusterRole, the Gateway that names the pool admitted to ext_proc, the verifier alone on
    # the engines' KV-event port.
    "h-gie": R.gie_case(cluster_verify_checks=CHECKS),
    "h-gie-auth-pprof": R.gie_case(router_epp_metrics_auth=True, router_epp_pprof=True),
    "h-gie-gke": R.gie_case(router_chart="gateway", router_gateway_provider="gke", router_ext_proc_source_cidrs=[CIDR],
                            model_server_http_source_cidrs=[CIDR]),
    "h-gie-extproc": R.gie_case(router_extra_values={"inferenceExtension": {"extProcPort": 9102, "env": [{"name": "A", "value": "1"}]}},
                                cluster_verify_checks=CHECKS),
    "h-gie-flags": R.gie_case(router_epp_extra_flags={"refresh-metrics-interval": "100ms", "zap-log-level": "info"}),
    "h-llmd": llmd(),
    "h-llmd-auth": llmd(router_epp_metrics_auth=True, router_epp_extra_flags={"grpc-max-recv-msg-size": "10MiB"}),
    "h-llmd-gke": llmd("precise", router_chart="gateway", router_gateway_provider="gke", router_ext_proc_source_cidrs=[CIDR],
                       model_server_http_source_cidrs=[CIDR], cluster_verify_router=R.GATEWAY_URL),
    "h-llmd-istio": llmd("precise", router_chart="gateway", router_gateway_provider="istio", cluster_verify_router=R.GATEWAY_URL),
}

NEGATIVE = {
    "neg-h-gie-unknown-flag": (R.gie_case(router_epp_extra_flags={"bogus": 1}),
                               "router_epp_extra_flags (with the flags of router_extra_values) cannot pass bogus to the GIE EPP "
                               "v1.4.0: bogus is not a flag of it (an unknown flag stops it at start)."),
    # llm-d-router's own flag is no flag of GIE's EPP.
    "neg-h-gie-llmd-flag": (R.gie_case(router_epp_extra_flags={"grpc-max-recv-msg-size": "10MiB"}),
                            "grpc-max-recv-msg-size is not a flag of it"),
    "neg-h-gie-removed-flag": (R.gie_case(router_epp_extra_flags={"total-queued-requests-metric": "x", "lora-info-metric": ""}),
                               "lora-info-metric, total-queued-requests-metric were removed (it refuses them at start: name the "
                               "metrics in the engineConfigs of the EndpointPickerConfig's metrics extractor instead)."),
    "neg-h-gie-owned-flag": (R.gie_case(router_epp_extra_flags={"pool-name": "other"}),
                             "the role sets pool-name (from router_release_name) itself, and a second value would silently win"),
    "neg-h-gie-owned-values-flag": (R.gie_case(router_extra_values={"inferenceExtension": {"flags": {"config-file": "/x.yaml"}}}),
                                    "cannot pass config-file to the GIE EPP v1.4.0: the role sets config-file (from "
                                    "router_epp_config_file) itself"),
    "neg-h-llmd-owned-flag": (llmd(router_epp_extra_flags={"secure-serving": False, "enable-pprof": True}),
                              "the role sets enable-pprof (from router_epp_pprof), secure-serving (from router_epp_secure_serving)"),
    "neg-h-llmd-unknown-values-flag": (llmd(router_extra_values={"router": {"epp": {"flags": {"kubeconfig": "/k"}}}}),
                                       "cannot pass kubeconfig to the llm-d EPP v0.9.0: kubeconfig is not a flag of it"),
    "neg-h-gie-unread-values": (R.gie_case(router_extra_values={"inferenceExtension": {"sidecar": {"enabled": True}, "env": []},
                                                                "inferencePool": {"modelServerType": "sglang"}}),
                                "router_extra_values sets inferenceExtension.sidecar, inferencePool.modelServerType, which the role's "
                                "templates of the inferencepool chart do not read, so they would be dropped: leave them out, or "
                                "install the chart itself by giving it in router_chart_ref (a local chart directory, .tgz or mirror)."),
    "neg-h-gie-metrics-port": (R.gie_case(router_extra_values={"inferenceExtension": {"metricsPort": 9191}}),
                               "router_extra_values sets inferenceExtension.metricsPort, which the role's templates"),
    "neg-h-gie-gke-no-cidrs": (R.gie_case(router_chart="gateway", router_gateway_provider="gke", model_server_http_source_cidrs=[CIDR]),
                               "router_gateway_provider=gke is a managed Gateway whose proxies run outside the cluster, so the EPP's "
                               "NetworkPolicy cannot admit them by pod label and, with the InferencePool's failureMode FailOpen, every "
                               "request would bypass the EPP without an error"),
    "neg-h-llmd-gke-no-cidrs": (llmd("precise", router_chart="gateway", router_gateway_provider="gke", model_server_http_source_cidrs=[CIDR]),
                                "give the address ranges its proxies connect from in router_ext_proc_source_cidrs"),
    "neg-h-metrics-open": (R.gie_case(router_network_policy_enabled=False),
                           "router_epp_metrics_auth=false and router_network_policy_enabled=false would serve the EPP's /metrics on "
                           "port 9090 without a token to every pod of the cluster"),
    "neg-h-gie-chart-pprof": (R.gie_case(router_chart_ref="/srv/charts/inferencepool-v1.4.0.tgz"),
                              "so enable-pprof set to false would stay true: leave router_chart_ref empty (the role's templates "
                              "pass --name=false) or turn it on (router_epp_pprof=true)."),
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("router-hardening"))
    cases = dict(POSITIVE, **dict((name, host) for name, (host, _msg) in NEGATIVE.items()))
    returncode, output, out = R.run_render(tmp, cases, callback="oneline")
    assert returncode != 0, output[-4000:]
    loaded = {}
    for name in POSITIVE:
        failed = [line for line in output.splitlines() if line.startswith(name + " | FAILED")]
        assert not failed, failed[0][:3000]
        loaded[name] = R.load_case(out, name)
        loaded[name]["router"] = dict((d["kind"] + "/" + d["metadata"]["name"], d) for d in loaded[name]["manifests"]["router"])
    return {"cases": loaded, "output": output, "out": out}


def _policy(case):
    """{port: (pod label sets, CIDRs)} of the EPP's NetworkPolicy; a rule without peers as None."""
    policy = [d for d in case["manifests"]["router"] if d["kind"] == "NetworkPolicy"][0]
    ports = {}
    for rule in policy["spec"]["ingress"]:
        for port in rule["ports"]:
            ports[port["port"]] = None if "from" not in rule else (
                [p["podSelector"]["matchLabels"] for p in rule["from"] if "podSelector" in p],
                [p["ipBlock"]["cidr"] for p in rule["from"] if "ipBlock" in p])
    return ports


def _gie_args(case):
    (container,) = case["router"]["Deployment/" + EPP]["spec"]["template"]["spec"]["containers"]
    return container["args"]


def _llmd_flags(case):
    return case["router_values"]["router"]["epp"]["flags"]


# -- 1: the flags given ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(NEGATIVE))
def test_refused_in_one_sentence_before_anything_is_written(rendered, name):
    expected = NEGATIVE[name][1]
    lines = [line for line in rendered["output"].splitlines() if line.startswith(name + " | FAILED")]
    assert lines, "%s did not fail:\n%s" % (name, rendered["output"][-3000:])
    msg = re.search(r'"msg": "(.*?)(?<!\\)"', lines[0])
    assert msg, lines[0][:2000]
    sentence = msg.group(1).replace('\\"', '"')
    assert expected in sentence, sentence
    assert sentence.count(". ") == 0 and sentence.endswith("."), "one sentence: %s" % sentence
    assert not os.path.exists(os.path.join(rendered["out"], name, "router")), "%s rendered the router before refusing" % name


def test_flags_given_that_the_epp_defines_pass_through(rendered):
    args = _gie_args(rendered["cases"]["h-gie-flags"])
    assert "--refresh-metrics-interval=100ms" in args and "--zap-log-level=info" in args
    assert _llmd_flags(rendered["cases"]["h-llmd-auth"])["grpc-max-recv-msg-size"] == "10MiB"


def test_the_gie_flag_table_is_the_epps_source_at_the_tag():
    """gateway-api-inference-extension@v1.4.0:pkg/epp/server/options.go AddFlags (and zap's BindFlags), Validate."""
    text = G._upstream("pkg/epp/server/options.go")  # pylint: disable=protected-access
    defined = set(re.findall(r'fs\.\w+\(&opts\.\w+, "([\w-]+)"', text))
    zap = ["zap-devel", "zap-encoder", "zap-log-level", "zap-stacktrace-level", "zap-time-encoding"]  # controller-runtime pkg/log/zap
    assert "opts.ZapOptions.BindFlags(gofs)" in text
    assert defined | set(zap) == set(FLAGS["gie"]["flags"])
    validate = text.split("func (opts *Options) Validate", 1)[1]
    removed = re.findall(r'^\s+"([\w-]+)",$', validate.split("deprecatedMetricFlags := []string{", 1)[1].split("}", 1)[0], re.M)
    assert sorted(removed) == sorted(FLAGS["gie"]["removed_flags"])
    assert "pflag.Parse()" in G._upstream("cmd/epp/runner/runner.go")  # pylint: disable=protected-access


def _gie_build():
    with open(R.PINS) as handle:
        version = yaml.safe_load(handle)["tools"]["gateway_api_inference_extension"]
    path = os.path.join(os.path.expanduser("~"), ".cache", "inference_cache", "kwok_cluster", "bin", "gie-%s" % version, "epp")
    if not os.access(path, os.X_OK):
        pytest.skip("no GIE EPP %s built at %s (make gie-epp)" % (version, path))
    return path


def test_the_gie_flag_table_is_what_the_gie_build_parses():
    """`epp --help` lists every flag but the deprecated ones it hides (MarkDeprecated): the removed metric flags and
    model-server-metrics-port, which it still accepts."""
    proc = subprocess.run([_gie_build(), "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                          timeout=60, check=False)
    shown = set(re.findall(r"^\s+(?:-\w, )?--([\w-]+)", proc.stdout, re.M))
    assert shown and shown <= set(FLAGS["gie"]["flags"]), shown - set(FLAGS["gie"]["flags"])
    assert set(FLAGS["gie"]["flags"]) - shown == set(FLAGS["gie"]["removed_flags"]) | {"model-server-metrics-port"}


def test_the_role_lists_no_flag_of_its_own_and_asks_the_table():
    """One home for the flag sets: the role's variables hold none; its refusal is the filter's over the Python table."""
    assert not any("flags" in impl or "removed_flags" in impl for impl in ROLE_VARS["_router_impls"].values())
    assert "epp_flag_refusal(router_impl" in ROLE_VARS["_router_flag_refusal"] and "_router_flag_problems" not in ROLE_VARS


def test_the_llm_d_flags_are_gies_and_three_more():
    """llm-d/llm-d-router@v0.9.0:pkg/epp/server/options.go adds the gRPC message sizes and stream metrics; its Validate
    refuses the same five metric flags (deprecatedMetricFlags)."""
    assert set(FLAGS["llm-d"]["flags"]) - set(FLAGS["gie"]["flags"]) == {
        "grpc-max-recv-msg-size", "grpc-max-send-msg-size", "enable-grpc-stream-metrics"}
    assert set(FLAGS["gie"]["flags"]) <= set(FLAGS["llm-d"]["flags"])
    assert FLAGS["llm-d"]["removed_flags"] == FLAGS["gie"]["removed_flags"]


def test_every_flag_the_role_or_the_chart_passes_is_the_roles_own(rendered):
    """A user cannot pass a second value of any flag the EPP gets from the role (the templates' args, the chart's)."""
    assert set(OWNED) <= set(FLAGS["gie"]["flags"]) and set(OWNED) <= set(FLAGS["llm-d"]["flags"])
    for name in ("h-gie", "h-gie-auth-pprof", "h-gie-extproc"):
        flags = set(a[2:].split("=", 1)[0] for a in _gie_args(rendered["cases"][name]) if a.startswith("--"))
        assert flags <= set(OWNED), flags - set(OWNED)
    # llm-d-router@v0.9.0:config/charts/routerlib/templates/_deployment.yaml passes these, then the flags map.
    chart = {"pool-name", "pool-namespace", "pool-group", "zap-encoder", "config-file", "ha-enable-leader-election",
             "grpc-health-port", "tracing", "metrics-endpoint-auth", "endpoint-selector", "endpoint-target-ports"}
    assert chart | set(_llmd_flags(rendered["cases"]["h-llmd"])) <= set(OWNED)


# -- 2: the permissions of the EPP's authenticated /metrics ---------------------------------------------------------

@pytest.mark.parametrize("name,auth", [("h-gie", False), ("h-gie-auth-pprof", True), ("h-llmd", False), ("h-llmd-auth", True)])
def test_metrics_auth_gets_its_cluster_permissions(rendered, name, auth):
    case = rendered["cases"][name]
    cluster = "%s-%s-metrics-auth" % (EPP, NS)
    assert ("ClusterRole/" + cluster in case["router"]) is auth and ("ClusterRoleBinding/" + cluster in case["router"]) is auth
    if not auth:
        return
    role = case["router"]["ClusterRole/" + cluster]
    assert role["rules"] == [{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
                             {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]}]
    binding = case["router"]["ClusterRoleBinding/" + cluster]
    # The EPP's ServiceAccount: the role's templates' and both charts' (<release>-epp).
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": EPP, "namespace": NS}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster}
    if name.startswith("h-gie"):
        assert "--metrics-endpoint-auth=false" not in _gie_args(case)
        assert case["router"]["ServiceAccount/" + EPP]
    else:
        assert case["router_values"]["router"]["monitoring"]["prometheus"]["auth"]["enabled"] is True


def test_the_default_keeps_metrics_behind_the_network_policy():
    with open(os.path.join(ROOT, "roles", "router", "defaults", "main.yml")) as handle:
        defaults = yaml.safe_load(handle)
    assert defaults["router_epp_metrics_auth"] is False and defaults["router_network_policy_enabled"] is True
    # The verifier, and the Prometheus that scrapes the EPP's PodMonitor (issue 46), in its own namespace.
    assert defaults["router_metrics_allowed_peers"] == [{"labels": VERIFIER},
                                                        {"labels": {"app.kubernetes.io/name": "prometheus"}, "namespace": "monitoring"}]
    assert defaults["router_epp_pprof"] is False


# -- 3: what carries the requests -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name,proxy,gateway_pods,cidrs", [
    ("h-llmd", True, False, []),            # the standalone chart's proxy: in the EPP's pod (loopback), its listener open
    ("h-llmd-istio", False, True, []),      # the llm-d gateway chart: the Gateway's pods
    ("h-llmd-gke", False, False, [CIDR]),   # a managed Gateway: its proxies' addresses
    ("h-gie", False, True, []),             # GIE without the chart's HTTPRoute: your Gateway that names the pool
    ("h-gie-gke", False, False, [CIDR]),
])
def test_the_network_policy_admits_what_carries_the_requests(rendered, name, proxy, gateway_pods, cidrs):
    ports = _policy(rendered["cases"][name])
    assert (ports.get(8081, "absent") is None) is proxy, ports
    peers, blocks = ports[9002]
    assert (GATEWAY in peers) is gateway_pods and VERIFIER in peers
    assert blocks == cidrs
    assert ports[9090] == ([VERIFIER, {"app.kubernetes.io/name": "prometheus"}], [])


@pytest.mark.parametrize("name,llm_d_admitted", [("h-gie", False), ("h-gie-gke", False), ("h-llmd", True), ("h-llmd-istio", True)])
def test_the_engines_kv_event_port_admits_the_llm_d_epp_only_under_llm_d(rendered, name, llm_d_admitted):
    policy = [d for d in rendered["cases"][name]["manifests"]["model_server"] if d["kind"] == "NetworkPolicy"][0]
    (rule,) = [r for r in policy["spec"]["ingress"] if any(p["port"] == 5557 for p in r["ports"])]
    peers = [p["podSelector"]["matchLabels"] for p in rule["from"]]
    assert ({"llm-d-router-gateway": EPP} in peers) is llm_d_admitted and VERIFIER in peers


# -- 5: pprof -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,pprof", [("h-gie", "false"), ("h-gie-auth-pprof", "true"), ("h-llmd", False)])
def test_pprof_is_off_unless_asked(rendered, name, pprof):
    if name.startswith("h-gie"):
        assert G._flag(_gie_args(rendered["cases"][name]), "enable-pprof") == pprof  # pylint: disable=protected-access
    else:
        assert _llmd_flags(rendered["cases"][name])["enable-pprof"] is pprof


# -- 6: extProcPort end to end --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,port", [("h-gie", 9002), ("h-gie-extproc", 9102)])
def test_ext_proc_port_is_one_port_end_to_end(rendered, name, port):
    case = rendered["cases"][name]
    service = case["router"]["Service/" + EPP]
    assert [p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc-ext-proc"] == [port]
    assert "targetPort" not in service["spec"]["ports"][0], "the Service sends to its port, where the EPP listens"
    assert case["router"]["InferencePool/" + G.RELEASE]["spec"]["endpointPickerRef"]["port"] == {"number": port}
    (container,) = case["router"]["Deployment/" + EPP]["spec"]["template"]["spec"]["containers"]
    assert dict((p["name"], p["containerPort"]) for p in container["ports"])["grpc"] == port
    assert G._flag(container["args"], "grpc-port") == str(port)  # pylint: disable=protected-access
    ports = set(_policy(case))
    assert ports >= {port, 9090} and (9002 in ports) is (port == 9002)
    job = [d for d in case["manifests"]["cluster_verify"] if d["kind"] == "Job"][0]
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--epp-address") + 1] == "%s.%s.svc.cluster.local:%d" % (EPP, NS, port)


# -- 4: the GIE data-layer factory rules, held against the tag and the build ----------------------------------------

# (file at the tag, the lines epp/gie.py cites, a message those lines return)
CITED = {
    "notification-source-without-gvk": ("version and kind are required for k8s-notification-source",),
    "metrics-engine-without-name": ("engine config name cannot be empty",),
    "metrics-engine-reserved-name": ("engine config name cannot be %q (reserved)",),
    "metrics-engine-twice": ("registry.Register(engineConfig.Name, mapping)",),
    "metrics-default-engine-undefined": ('defaultEngine %q not found in engineConfigs',),
}


@pytest.mark.parametrize("behaviour", sorted(CITED))
def test_each_factory_rule_cites_the_lines_that_refuse(behaviour):
    source = gie.BEHAVIOUR[gie.GIE_VERSION][behaviour][2]
    match = re.match(r"^kubernetes-sigs/gateway-api-inference-extension@v1\.4\.0:(\S+)#L(\d+)-L(\d+)$", source)
    assert match, source
    lines = G._upstream(match.group(1)).splitlines()[int(match.group(2)) - 1:int(match.group(3))]  # pylint: disable=protected-access
    assert any(CITED[behaviour][0] in line for line in lines), (source, lines)


API = "inference.networking.x-k8s.io/v1alpha1"
BASE = [{"type": "queue-scorer"}, {"type": "prefix-cache-scorer"}, {"type": "max-score-picker"}, {"type": "single-profile-handler"}]
PROFILE = [{"name": "default", "plugins": [{"pluginRef": "queue-scorer", "weight": 2}, {"pluginRef": "prefix-cache-scorer", "weight": 3},
                                           {"pluginRef": "max-score-picker"}]}]


def _config(extra, **top):
    config = {"apiVersion": API, "kind": "EndpointPickerConfig", "plugins": BASE + extra, "schedulingProfiles": PROFILE}
    config.update(top)
    return config


def _metrics(params):
    return _config([{"type": "metrics-data-source"}, {"type": "model-server-protocol-metrics", "parameters": params}],
                   featureGates=["dataLayer"],
                   data={"sources": [{"pluginRef": "metrics-data-source", "extractors": [{"pluginRef": "model-server-protocol-metrics"}]}]})


BUILD_CASES = {
    "notification-source-group-only": _config([{"type": "k8s-notification-source", "parameters": {"group": "apps"}}]),
    "notification-source-no-kind": _config([{"type": "k8s-notification-source", "parameters": {"version": "v1"}}]),
    "notification-source-complete": _config([{"type": "k8s-notification-source", "parameters": {"version": "v1", "kind": "ConfigMap"}}]),
    "engine-without-name": _metrics({"engineConfigs": [{"queuedRequestsSpec": "x:queue"}]}),
    "engine-named-default": _metrics({"engineConfigs": [{"name": "default"}]}),
    "engine-twice": _metrics({"engineConfigs": [{"name": "trt"}, {"name": "trt"}]}),
    "default-engine-undefined": _metrics({"defaultEngine": "trt"}),
    "default-engine-defined": _metrics({"defaultEngine": "trt", "engineConfigs": [{"name": "trt", "queuedRequestsSpec": "trt:queue"}]}),
    "default-engine-built-in": _metrics({"defaultEngine": "sglang"}),
}


def _run_build(epp, folder, name, config, timeout=60):
    """The gie build on one config, in a network namespace of its own (nothing it opens is reachable) with a kubeconfig
    whose server does not answer: it reads the config after discovery (whose errors it only logs), then logs "loaded
    configuration from file/text successfully" or exits with "Failed to parse configuration". True, False, or the log."""
    path = os.path.join(folder, name + ".yaml")
    with open(path, "w") as handle:
        yaml.safe_dump(config, handle)
    cmd = ["unshare", "--net", "--", epp, "--pool-name", "p", "--pool-namespace", "ns", "--config-file", path,
           "--secure-serving=false", "--enable-pprof=false", "--tracing=false"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                            env=dict(os.environ, KUBECONFIG=os.path.join(folder, "kubeconfig")))
    log, verdict, deadline = [], None, time.monotonic() + timeout
    try:
        for line in proc.stdout:
            log.append(line)
            if "loaded configuration from file/text successfully" in line or "Failed to parse configuration" in line:
                verdict = "loaded configuration" in line
                break
            if time.monotonic() > deadline:
                break
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    return verdict if verdict is not None else "".join(log[-20:])


def test_the_gie_build_refuses_what_the_factory_rules_refuse(tmp_path):
    epp = _gie_build()
    if shutil.which("unshare") is None:
        pytest.skip("no unshare (util-linux) to keep the EPP off the network")
    with open(str(tmp_path / "kubeconfig"), "w") as handle:
        yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "current-context": "c",
                        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
                        "users": [{"name": "u", "user": {"token": "none"}}], "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]},
                       handle)
    seen = {}
    for name, config in sorted(BUILD_CASES.items()):
        started = _run_build(epp, str(tmp_path), name, config)
        checked = check_epp_config(json.loads(json.dumps(config)), router_impl="gie")
        seen[name] = started
        assert started in (True, False), "%s: the EPP neither took nor refused the config:\n%s" % (name, started)
        assert checked.epp_starts is started, (name, started, checked.findings)
    taken = sorted(n for n, started in seen.items() if started)
    assert taken == ["default-engine-built-in", "default-engine-defined", "notification-source-complete"], taken
