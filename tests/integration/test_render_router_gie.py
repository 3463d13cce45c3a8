# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""router_impl gie: the Gateway API Inference Extension v1.4.0's own EPP, rendered and applied without a cluster.

Render mode (playbooks/render.yml, the cases of ``_k8s_render.GIE_CASES``): every object the GIE inferencepool chart
renders, from the router role's templates, in ``manifests.yaml``; the chart's values shape (only keys a v1.4.0 template
reads, ``k8s_conformance.yml`` ``gie_chart_values``); the approximate EndpointPickerConfig; the built-in kinds validated
against the Kubernetes schemas; the refusals (precise mode, an unpinned image, P/D, a NodePort, what a given chart
cannot express), one sentence each, before anything is written.

Apply mode (the stand-in ``kubernetes.core`` of ``test_k8s_roles_without_a_cluster.py``, which records every call): the objects
applied in order with ``apply: true`` and the EPP Deployment waited for last; a chart in ``router_chart_ref`` installed
with Helm and the same values instead; ``router_state: absent`` removes them in reverse; a missing CRD manifest with
``router_skip_unavailable_chart`` leaves them out; check mode moves nothing; the published ``router_contract``.

The facts are also held against the GIE v1.4.0 source, read from the Go module cache (``go mod download`` brings it
there when no build has yet, as on a fresh machine): each values key appears as ``.Values.<key>`` in the template
cited, each flag is defined in ``pkg/epp/server/options.go``.
"""

from __future__ import absolute_import, division, print_function

import functools
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _k8s_render as R  # noqa: E402  pylint: disable=wrong-import-position
import test_k8s_roles_without_a_cluster as D  # noqa: E402  pylint: disable=wrong-import-position

try:
    import kubernetes_validate
except ImportError:  # pragma: no cover - the schema test skips
    kubernetes_validate = None

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "k8s_conformance.yml")) as _handle:
    FACTS = yaml.safe_load(_handle)
PINS = yaml.safe_load(open(R.PINS))
GIE = "sigs.k8s.io/gateway-api-inference-extension@" + PINS["tools"]["gateway_api_inference_extension"]
# The module's source in a Go module cache (read-only; never copied).
_GOMOD_ROOTS = (os.environ.get("GOMODCACHE"), os.path.expanduser("~/.cache/substrate-ci/gomod"), os.path.expanduser("~/go/pkg/mod"))
RELEASE = "inference-cache-router"
EPP = RELEASE + "-epp"
NS = "inference-cache"
BUILTIN = {"ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Service", "Deployment", "NetworkPolicy", "ClusterRole",
           "ClusterRoleBinding"}
# A user-written config the GIE EPP starts with (random picker, one scorer).
USER_CONFIG = {"apiVersion": "inference.networking.x-k8s.io/v1alpha1", "kind": "EndpointPickerConfig",
               "plugins": [{"type": "queue-scorer"}, {"type": "random-picker"}],
               "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": "queue-scorer", "weight": 1},
                                                                      {"pluginRef": "random-picker"}]}]}


@functools.lru_cache(maxsize=None)
def _upstream_root():
    """The module's folder: in a Go module cache already, or downloaded there by the go command (once per session).

    The integration lane can run before any Go build fetched the module (a fresh machine): it is then fetched here,
    through the Go module proxy, rather than the tests that read it skipping."""
    found = next((p for p in [os.path.join(root, GIE) for root in _GOMOD_ROOTS if root] if os.path.isdir(p)), None)
    if found is not None:
        return found
    go = shutil.which("go")   # as the go_builds role's go_build (go_builds_go_binary: go)
    if go is None:
        pytest.skip("the %s source is not in a Go module cache and no go command is on PATH to fetch it" % GIE)
    with tempfile.TemporaryDirectory() as outside_any_module:
        done = subprocess.run([go, "mod", "download", "-json", GIE], cwd=outside_any_module, capture_output=True,
                              text=True, timeout=600, check=False)
    assert done.returncode == 0, "go mod download %s failed: %s%s" % (GIE, done.stdout[-2000:], done.stderr[-2000:])
    return json.loads(done.stdout)["Dir"]


def _upstream(rel):
    with open(os.path.join(_upstream_root(), rel)) as handle:
        return handle.read()


def _cited_path(citation):
    return citation.split(":", 1)[1]


# -- render mode ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("gie-render"))
    config = os.path.join(tmp, "user-epp-config.yaml")
    with open(config, "w") as handle:
        yaml.safe_dump(USER_CONFIG, handle)
    cases = dict((name, dict((k, config if v == "@USER_CONFIG@" else v) for k, v in host.items())) for name, host in R.GIE_CASES.items())
    refusals = dict((name, host) for name, (host, _msg) in R.GIE_NEGATIVE.items())
    # One run: the cases that render and those that must be refused (one sentence each in the oneline output).
    returncode, output, out = R.run_render(tmp, dict(cases, **refusals), callback="oneline")
    assert returncode != 0, output[-4000:]
    loaded = {}
    for name in R.GIE_CASES:
        failed = [line for line in output.splitlines() if line.startswith(name + " | FAILED")]
        assert not failed, failed[0][:3000]
        loaded[name] = R.load_case(out, name)
        loaded[name]["router"] = dict((d["kind"] + "/" + d["metadata"]["name"], d) for d in loaded[name]["manifests"]["router"])
        loaded[name]["kinds"] = [d["kind"] for d in loaded[name]["manifests"]["router"]]
    return {"cases": loaded, "output": output, "out": out}


def _case(rendered, name):
    return rendered["cases"][name]


def _deployment(case):
    return case["router"]["Deployment/" + EPP]


def _container(case):
    (container,) = _deployment(case)["spec"]["template"]["spec"]["containers"]
    return container


def _flag(args, name):
    """The value of --name=value in the EPP's args (None when absent)."""
    found = [a.split("=", 1)[1] for a in args if a.startswith("--%s=" % name)]
    return found[0] if found else None


def leaf_paths(value, prefix=""):
    if isinstance(value, dict) and value:
        for key, sub in value.items():
            yield from leaf_paths(sub, prefix + "." + key if prefix else key)
    else:
        yield prefix


@pytest.mark.parametrize("name", sorted(R.GIE_CASES))
def test_every_object_of_the_chart_is_rendered(rendered, name):
    case = _case(rendered, name)
    host = R.GIE_CASES[name]
    chart = host.get("router_chart", "standalone")
    provider = host.get("router_gateway_provider", "")
    expected = (["ServiceAccount", "Role", "RoleBinding", "Role", "RoleBinding"]
                # Two replicas by default, under leader election (approximate scoring keeps state in each replica).
                + (["Role", "RoleBinding"] if host.get("router_epp_replicas", 2) > 1 else [])
                + ["ConfigMap", "Service", "InferencePool"] + (["HTTPRoute"] if chart == "gateway" else [])
                + {"istio": ["DestinationRule"], "gke": ["HealthCheckPolicy", "GCPBackendPolicy"]}.get(provider, [])
                + ["Deployment"]
                # The role's own objects: what the EPP's authenticated /metrics needs, then its NetworkPolicy.
                + (["ClusterRole", "ClusterRoleBinding"] if host.get("router_epp_metrics_auth") else [])
                + ["NetworkPolicy"]
                # Its PodMonitor, scraped without a token (none with router_epp_metrics_auth).
                + ([] if host.get("router_epp_metrics_auth") else ["PodMonitor"]))
    # In apply order: the InferencePool before the EPP (ready only once its pool has synced), the Deployment last.
    assert case["kinds"] == expected
    assert set(case["router"]) >= {"ServiceAccount/" + EPP, "Role/%s-sa" % EPP, "RoleBinding/%s-sa" % EPP, "Role/%s-non-sa" % EPP,
                                   "RoleBinding/%s-non-sa" % EPP, "ConfigMap/" + EPP, "Service/" + EPP, "InferencePool/" + RELEASE,
                                   "Deployment/" + EPP, "NetworkPolicy/%s-ingress" % EPP}
    assert all(d["metadata"]["namespace"] == NS for d in case["manifests"]["router"] if not d["kind"].startswith("Cluster"))
    assert "Secret" not in case["kinds"], "no render sidecar, no Hugging Face token"
    for rel in ("epp-config.yaml", "helm/inferencepool.values.yaml", "helm/release.yaml", "manifests.yaml"):
        assert os.path.exists(os.path.join(rendered["out"], name, "router", rel)), rel
    assert not os.path.exists(os.path.join(rendered["out"], name, "router", "helm", "llm-d-router-standalone.values.yaml"))
    release = case["router_release"]
    assert release["chart_ref"] == PINS["charts"]["gie_inferencepool"]["ref"]
    assert release["chart_version"] == PINS["charts"]["gie_inferencepool"]["version"] == "v1.4.0"
    assert release["install"].startswith("templates")


@pytest.mark.skipif(kubernetes_validate is None, reason="kubernetes-validate is not installed")
@pytest.mark.parametrize("version", ["1.29.0", "1.33.0", "1.37.0"])
def test_builtin_kinds_validate_against_kubernetes_schemas(rendered, version):
    checked = 0
    for name, case in sorted(rendered["cases"].items()):
        for doc in case["manifests"]["router"]:
            if doc["kind"] not in BUILTIN:
                continue
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail("%s: %s/%s is invalid for Kubernetes %s: %s" % (name, doc["kind"], doc["metadata"]["name"], version, exc))
            checked += 1
    assert checked >= 9 * len(rendered["cases"])


@pytest.mark.parametrize("name", sorted(R.GIE_CASES))
def test_values_have_the_shape_of_the_inferencepool_chart(rendered, name):
    values = _case(rendered, name)["router_values"]
    allowed = FACTS["gie_chart_values"]
    unread = [p for p in leaf_paths(values) if not any(p == a or p.startswith(a + ".") for a in allowed)]
    assert not unread, "%s: values no inferencepool v1.4.0 template reads: %s" % (name, unread)
    assert sorted(values) == ["experimentalHttpRoute", "inferenceExtension", "inferencePool", "provider"]
    assert "router" not in values, "the llm-d charts' keys"
    ie, pool = values["inferenceExtension"], values["inferencePool"]
    for path, fact in FACTS["gie_chart_defaults_overridden"].items():
        node = values
        for key in path.split("."):
            node = node[key]
        assert node != fact["default"], "%s: %s keeps the chart default (%s)" % (name, path, fact["source"])
    assert ie["extProcPort"] == 9002 and ie["failureMode"] == "FailOpen" and ie["tracing"]["enabled"] is False
    assert ie["monitoring"]["prometheus"]["auth"]["enabled"] is bool(R.GIE_CASES[name].get("router_epp_metrics_auth", False))
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1" and pool["modelServerType"] == "vllm"
    assert pool["modelServers"]["matchLabels"] and pool["targetPorts"] == [{"number": 8000}]
    assert values["provider"]["name"] == (R.GIE_CASES[name].get("router_gateway_provider") or "none")
    assert values["experimentalHttpRoute"]["enabled"] is (R.GIE_CASES[name].get("router_chart") == "gateway")
    # The chart gets exactly the config in use, under the file its --config-file names.
    assert yaml.safe_load(ie["pluginsCustomConfig"][ie["pluginsConfigFile"]]) == _case(rendered, name)["epp_config"]


@pytest.mark.parametrize("path", sorted(FACTS["gie_chart_values"]))
def test_each_values_key_is_read_by_the_cited_template(path):
    text = _upstream(_cited_path(FACTS["gie_chart_values"][path]))
    assert ".Values.%s" % path in text, "%s does not read %s" % (FACTS["gie_chart_values"][path], path)


def test_chart_defaults_the_role_overrides_are_the_upstream_ones():
    values = yaml.safe_load(_upstream("config/charts/inferencepool/values.yaml"))
    for path, fact in FACTS["gie_chart_defaults_overridden"].items():
        node = values
        for key in path.split("."):
            node = node[key]
        assert node == fact["default"], path


@pytest.mark.parametrize("name", sorted(R.GIE_CASES))
def test_the_objects_follow_the_values(rendered, name):
    """The templates render from the values, as the chart would: image, config, pool, selector, ports."""
    case = _case(rendered, name)
    values = case["router_values"]
    ie, pool_values = values["inferenceExtension"], values["inferencePool"]
    container = _container(case)
    assert container["image"] == "%s/%s:%s" % (ie["image"]["hub"], ie["image"]["name"], ie["image"]["tag"])
    assert re.match(r"^[^\s@]+:[^\s@/]+@sha256:[0-9a-f]{64}$", container["image"]), container["image"]
    expected = R.GIE_CASES[name]["router_epp_image"] or "mirror.example.com/gie/epp:v1.4.0@" + R.fake_digest("gie-epp-mirror")
    assert container["image"] == expected
    assert container["resources"] == ie["resources"] and container["imagePullPolicy"] == "IfNotPresent"
    config_map = case["router"]["ConfigMap/" + EPP]
    assert config_map["data"] == ie["pluginsCustomConfig"]
    assert _flag(container["args"], "config-file") is None and "/config/" + ie["pluginsConfigFile"] in container["args"]
    pool = case["router"]["InferencePool/" + RELEASE]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["spec"]["selector"]["matchLabels"] == pool_values["modelServers"]["matchLabels"]
    engines = [d for d in case["manifests"]["model_server"] if d["kind"] == "Deployment"]
    for engine in engines:  # the pool selects the engines' pods
        labels = engine["spec"]["template"]["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in pool["spec"]["selector"]["matchLabels"].items())
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    ref = pool["spec"]["endpointPickerRef"]
    assert ref == {"name": EPP, "port": {"number": 9002}, "failureMode": "FailOpen"}
    assert set(pool["spec"]) <= set(FACTS["gie_inference_pool"]["spec_fields"])
    assert set(ref) <= set(FACTS["gie_inference_pool"]["endpoint_picker_ref_fields"])
    assert ref["failureMode"] in FACTS["gie_inference_pool"]["failure_modes"]


@pytest.mark.parametrize("name", sorted(R.GIE_CASES))
def test_epp_deployment_as_the_chart_renders_it(rendered, name):
    case = _case(rendered, name)
    host = R.GIE_CASES[name]
    deployment = _deployment(case)
    replicas = host.get("router_epp_replicas", 2)
    label = {FACTS["gie_epp_pod_label"]["key"]: EPP}
    # Leader election (the approximate prefix producer keeps its state in the replica): the chart's Recreate.
    assert deployment["spec"]["replicas"] == replicas and deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert deployment["spec"]["selector"]["matchLabels"] == label
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["labels"] == dict(label, **{"inference.networking.k8s.io/igw-mode": "inferencepool"})
    assert pod["spec"]["serviceAccountName"] == EPP
    assert pod["spec"]["volumes"] == [{"name": "plugins-config-volume", "configMap": {"name": EPP}}]
    container = _container(case)
    args = container["args"]
    assert args[:10] == ["--pool-name", RELEASE, "--pool-namespace", NS, "--pool-group", "inference.networking.k8s.io",
                         "--zap-encoder", "json", "--config-file", "/config/inference-cache-substrate.yaml"]
    flags = [a[2:].split("=", 1)[0] for a in args if a.startswith("--")]
    assert set(flags) <= set(FACTS["gie_epp_flags"]["value"]), set(flags) - set(FACTS["gie_epp_flags"]["value"])
    assert not set(flags) & set(FACTS["gie_epp_flags"]["refused"]), "deprecated metric flags stop the EPP v1.4.0"
    secure = host.get("router_epp_secure_serving", True)
    assert _flag(args, "secure-serving") == str(secure).lower(), "a boolean flag is one --name=value argument (pflag)"
    assert "--secure-serving" not in args and _flag(args, "v") == "2"
    assert _flag(args, "tracing") == "false"
    assert (_flag(args, "metrics-endpoint-auth") == "false") is (not host.get("router_epp_metrics_auth", False))
    assert ("--ha-enable-leader-election" in args) is (replicas > 1)
    ports = dict((p["name"], p["containerPort"]) for p in container["ports"])
    assert ports == FACTS["gie_epp_ports"]["value"]
    probe = FACTS["gie_epp_ports"]["probe_service"] if replicas == 1 else None
    assert container["livenessProbe"]["grpc"] == {"port": 9003, "service": probe or "liveness"}
    assert container["readinessProbe"]["grpc"] == {"port": 9003, "service": probe or "readiness"}
    env = dict((e["name"], e) for e in container["env"])
    assert env["NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert container["volumeMounts"] == [{"name": "plugins-config-volume", "mountPath": "/config"}]
    assert container["resources"]["requests"] == {"cpu": "500m", "memory": "1Gi"}


def test_extra_values_reach_the_templates(rendered):
    case = _case(rendered, "gie-mirror-extra-values")
    container = _container(case)
    assert {"name": "GODEBUG", "value": "madvdontneed=1"} in container["env"] and container["env"][0]["name"] == "NAMESPACE"
    assert _deployment(case)["spec"]["template"]["spec"]["tolerations"][0]["key"] == "dedicated"
    weights = dict((p["pluginRef"], p.get("weight")) for p in case["epp_config"]["schedulingProfiles"][0]["plugins"])
    assert weights["prefix-cache-scorer"] == 5.0


def test_every_flag_is_one_the_epp_defines():
    text = _upstream("pkg/epp/server/options.go")
    defined = set(re.findall(r'fs\.\w+\(&opts\.\w+, "([\w-]+)"', text))
    zap = [f for f in FACTS["gie_epp_flags"]["value"] if f.startswith("zap-")]
    assert defined | set(zap) == set(FACTS["gie_epp_flags"]["value"]) | set(FACTS["gie_epp_flags"]["refused"])
    for flag in FACTS["gie_epp_flags"]["refused"]:
        assert '"%s"' % flag in text.split("func (opts *Options) Validate", 1)[1], flag


@pytest.mark.parametrize("name", sorted(R.GIE_CASES))
def test_service_rbac_and_network_policy(rendered, name):
    case = _case(rendered, name)
    service = case["router"]["Service/" + EPP]
    assert service["spec"]["selector"] == {"inferencepool": EPP} and service["spec"]["type"] == "ClusterIP"
    assert dict((p["name"], p["port"]) for p in service["spec"]["ports"]) == FACTS["gie_epp_ports"]["service"]
    rules = case["router"]["Role/%s-sa" % EPP]["rules"]
    assert rules == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "watch", "list"]}]
    rules = case["router"]["Role/%s-non-sa" % EPP]["rules"]
    assert rules[0] == {"apiGroups": ["inference.networking.x-k8s.io"], "resources": ["inferenceobjectives", "inferencemodelrewrites"],
                        "verbs": ["get", "watch", "list"]}
    assert rules[1] == {"apiGroups": ["inference.networking.k8s.io"], "resources": ["inferencepools"], "verbs": ["get", "watch", "list"]}
    for role in ("sa", "non-sa"):
        binding = case["router"]["RoleBinding/%s-%s" % (EPP, role)]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": EPP, "namespace": NS}]
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "%s-%s" % (EPP, role)}
    policy = case["router"]["NetworkPolicy/%s-ingress" % EPP]
    assert policy["spec"]["podSelector"] == {"matchLabels": {"inferencepool": EPP}}
    ports, blocks = {}, {}
    for rule in policy["spec"]["ingress"]:
        assert rule.get("from"), "%s: a rule without peers would open the EPP to every pod (no proxy listener with gie)" % name
        for port in rule["ports"]:
            ports[port["port"]] = [p["podSelector"]["matchLabels"] for p in rule["from"] if "podSelector" in p]
            blocks[port["port"]] = [p["ipBlock"]["cidr"] for p in rule["from"] if "ipBlock" in p]
    assert sorted(ports) == [9002, 9090]
    # What carries the requests (issue 38 finding 3): the Gateway's pods, whether the chart's HTTPRoute or your own Gateway
    # names the pool; a managed Gateway (GKE) has none, its proxies come from the address ranges given.
    gateway = {"gateway.networking.k8s.io/gateway-name": "inference-gateway"}
    managed = R.GIE_CASES[name].get("router_gateway_provider") == "gke"
    assert (gateway in ports[9002]) is not managed
    assert blocks[9002] == R.GIE_CASES[name].get("router_ext_proc_source_cidrs", []) and (blocks[9002] != []) is managed
    assert gateway not in ports[9090] and blocks[9090] == []


@pytest.mark.parametrize("name", sorted(R.GIE_CASES))
def test_endpoint_picker_config_is_approximate(rendered, name):
    config = _case(rendered, name)["epp_config"]
    if name == "gie-user-config":
        assert config == USER_CONFIG, "a user file replaces the generated config"
        return
    facts = FACTS["gie_plugins"]
    assert config["apiVersion"] == "inference.networking.x-k8s.io/v1alpha1" and config["kind"] == "EndpointPickerConfig"
    assert set(config) <= set(facts["config_fields"])
    types = dict((p["type"], p) for p in config["plugins"])
    assert set(types) <= set(facts["types"]), "every plugin type is one the EPP v1.4.0 registers"
    for kind, plugin in types.items():
        fields = facts["parameters"].get(kind, {}).get("fields", [])
        assert set(plugin.get("parameters", {})) <= set(fields), (kind, plugin)
    assert not [t for t in types if "precise" in t or "token" in t], "no KV events, no token producer"
    (profile,) = config["schedulingProfiles"]
    weights = dict((p["pluginRef"], p.get("weight")) for p in profile["plugins"])
    expected = dict(facts["default_weights"])
    if name == "gie-mirror-extra-values":
        expected["prefix-cache-scorer"] = 5.0
    assert weights == dict(expected, **{"max-score-picker": None})
    assert profile["name"] == "default" and "single-profile-handler" in types
    assert types["prefix-cache-scorer"]["parameters"] == {"blockSizeTokens": 32}, "the engines' block size as the fallback"
    sglang = R.GIE_CASES[name]["model_server_profile"] == "sglang_lmcache"
    assert (config.get("featureGates") == [facts["data_layer_gate"]]) is sglang
    if sglang:  # SGLang's metric names through the data layer (the chart's sglang flags are refused at v1.4.0)
        assert types["model-server-protocol-metrics"]["parameters"] == {"defaultEngine": "sglang"}
        assert config["data"] == {"sources": [{"pluginRef": "metrics-data-source",
                                               "extractors": [{"pluginRef": "model-server-protocol-metrics"}]}]}
    else:
        assert "data" not in config and "metrics-data-source" not in types


def test_default_weights_are_the_epps_own():
    text = _upstream("pkg/epp/config/loader/defaults.go")
    for var, plugin in (("queueScorerWeight", "queue-scorer"), ("kvCacheUtilizationScorerWeight", "kv-cache-utilization-scorer"),
                        ("prefixCacheScorerWeight", "prefix-cache-scorer")):
        assert re.search(r"%s := %s\b" % (var, re.escape(repr(FACTS["gie_plugins"]["default_weights"][plugin]))), text), var
    with open(os.path.join(R.ROOT, "roles", "router", "defaults", "main.yml")) as handle:
        defaults = yaml.safe_load(handle)
    assert defaults["router_impl"] == "llm-d", "llm-d stays the default"
    assert (defaults["router_gie_queue_scorer_weight"], defaults["router_gie_kv_cache_utilization_weight"],
            defaults["router_gie_prefix_scorer_weight"]) == (2.0, 2.0, 3.0)


def test_gateway_and_provider_objects(rendered):
    route = _case(rendered, "gie-sglang-istio-ha")["router"]["HTTPRoute/" + RELEASE]
    assert route["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference-gateway",
                                            "namespace": "gateways"}]
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"] == [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": RELEASE}]
    assert rule["timeouts"] == {"request": "300s"}
    rule_istio = _case(rendered, "gie-sglang-istio-ha")["router"]["DestinationRule/" + EPP]
    assert rule_istio["spec"]["host"] == "%s.%s.svc.cluster.local" % (EPP, NS)
    assert rule_istio["spec"]["trafficPolicy"]["tls"] == {"mode": "SIMPLE", "insecureSkipVerify": True}
    gke = _case(rendered, "gie-gpu-gke")["router"]
    assert "timeouts" not in gke["HTTPRoute/" + RELEASE]["spec"]["rules"][0], "the chart sets no timeout for GKE"
    assert "namespace" not in gke["HTTPRoute/" + RELEASE]["spec"]["parentRefs"][0]
    health = gke["HealthCheckPolicy/" + RELEASE]["spec"]
    assert health["targetRef"] == {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": RELEASE}
    assert health["default"]["config"]["httpHealthCheck"] == {"requestPath": "/health", "port": 8000}
    assert gke["GCPBackendPolicy/" + RELEASE]["spec"]["default"]["timeoutSec"] == 300
    assert list(_case(rendered, "gie-kgateway")["router"]).count("HTTPRoute/" + RELEASE) == 1
    leader = _case(rendered, "gie-sglang-istio-ha")["router"]["RoleBinding/%s-leader-election-binding" % EPP]
    assert leader["roleRef"]["name"] == "%s-leader-election" % EPP


def test_the_verifier_reads_the_gie_epp(rendered):
    """The verifier Job gets the EPP's metrics URL and approximate mode; its requests go through the Gateway."""
    for name in ("gie-cpu", "gie-gpu-gke"):
        job = [d for d in _case(rendered, name)["manifests"]["cluster_verify"] if d["kind"] == "Job"][0]
        args = job["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--scoring-mode") + 1] == "approximate"
        assert args[args.index("--router-url") + 1] == R.GATEWAY_URL["request_url"]
        metrics = args[args.index("--epp-metrics-url") + 1]
        assert metrics == ("" if name == "gie-gpu-gke" else "http://%s.%s.svc.cluster.local:9090/metrics" % (EPP, NS))
        assert "--speculative-indexing" not in args


@pytest.mark.parametrize("name", sorted(R.GIE_NEGATIVE))
def test_refusals_in_one_sentence_before_anything_is_written(rendered, name):
    expected = R.GIE_NEGATIVE[name][1]
    lines = [line for line in rendered["output"].splitlines() if line.startswith(name + " | FAILED")]
    assert lines, "%s did not fail:\n%s" % (name, rendered["output"][-3000:])
    assert expected in lines[0], lines[0][:2000]
    if "digest" not in expected:  # the digest refusal is the llm-d router's, word for word ("refused as today")
        msg = re.search(r'"msg": "(.*?)"', lines[0])
        assert msg and msg.group(1).count(". ") == 0 and msg.group(1).endswith("."), "one sentence: %s" % lines[0][:1000]
    assert not os.path.exists(os.path.join(rendered["out"], name, "router")), "%s rendered the router before refusing" % name


def test_llm_d_stays_the_default_and_unchanged(rendered):
    """The llm-d cases are untouched: no gie key reaches them (test_render_kubernetes.py holds them as before)."""
    for name, host in R.CASES.items():
        assert "router_impl" not in host, name


def test_render_in_check_mode_writes_nothing(tmp_path):
    cases = {"gie-check": R.GIE_CASES["gie-cpu"]}
    inventory = tmp_path / "inventory.yml"
    R.write_inventory(str(inventory), cases)
    out = tmp_path / "out"
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(R.ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_DEPRECATION_WARNINGS="0")
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(inventory), R.PLAYBOOK, "--check",
                           "-e", "substrate_render_dir=%s" % out, "-e", "substrate_render_hosts=render_cases"],
                          cwd=R.ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert not (out / "gie-check" / "router").exists(), "check mode wrote the router's files"


# -- apply mode, against the stand-in kubernetes.core ---------------------------------------------------------------

GIE_OBJECTS = "Apply | the InferencePool and its EPP (router_impl gie, from the role's templates)"
LEADER_WAIT = "Apply | wait until the EPP's leader is Ready (bounded)"
LOCAL_CHART = "./charts/inferencepool"
APPLY_PLAYBOOK = """
- name: Run one role per case against the stand-in cluster
  hosts: cases
  connection: local
  gather_facts: false
  tasks:
    - name: The role, its failure kept
      block:
        - name: The role
          ansible.builtin.include_role:
            name: inference_cache.substrate.router
      rescue:
        - name: Keep the failure
          ansible.builtin.set_fact:
            _case_failed: "{{ ansible_failed_result.msg | default('failed without a message') }}"
    - name: Write what the case looks at
      changed_when: false
      check_mode: false
      ansible.builtin.copy:
        dest: "{{ _case_out }}"
        mode: "0644"
        content: >-
          {{ {'router_contract': router_contract | default({}), 'router_release_installed': router_release_installed | default(None),
              'router_crds_installed': router_crds_installed | default(None), '_case_failed': _case_failed | default('')} | to_json }}
"""


def _apply_case(**extra):
    host = {"router_impl": "gie", "router_scoring_mode": "approximate", "router_allow_unpinned_images": True,
            "router_engine": D.ENGINES, "router_epp_config_check": False, "router_crds_src": "@TMP@/mirror/manifests.yaml",
            # The leader of the two replicas is Ready (the bounded wait that follows the apply).
            "_fake_k8s_responses": {LEADER_WAIT: {"resources": [{"status": {"readyReplicas": 1}}]}}}
    host.update(extra)
    return host


APPLY_CASES = {
    "gie-apply": _apply_case(),
    # pprof on: the chart cannot turn a boolean flag off (neg-gie-chart-false-flag).
    "gie-apply-chart": _apply_case(router_chart_ref=LOCAL_CHART, _charts=[LOCAL_CHART], router_epp_pprof=True),
    "gie-absent": _apply_case(router_state="absent"),
    "gie-no-crds": _apply_case(router_crds_src="@TMP@/no-such/manifests.yaml", router_skip_unavailable_chart=True),
}


def _run_apply(tmp, cases, check=False):
    fake = os.path.join(tmp, "collections", "ansible_collections", "kubernetes", "core")
    if not os.path.isdir(fake):
        for sub in ("plugins/action", "plugins/modules", "meta"):
            os.makedirs(os.path.join(fake, sub))
        with open(os.path.join(fake, "meta", "runtime.yml"), "w") as handle:
            handle.write('---\nrequires_ansible: ">=2.16.0"\n')
        for name in ("k8s", "k8s_info", "k8s_log", "helm", "k8s_cluster_info"):
            with open(os.path.join(fake, "plugins", "action", name + ".py"), "w") as handle:
                handle.write(D.FAKE_ACTION)
            with open(os.path.join(fake, "plugins", "modules", name + ".py"), "w") as handle:
                handle.write(D.FAKE_MODULE.format(name=name))
        os.makedirs(os.path.join(tmp, "mirror"))
        with open(os.path.join(tmp, "mirror", "manifests.yaml"), "w") as handle:
            handle.write("apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n"
                         "  name: inferencepools.inference.networking.k8s.io\n")
        with open(os.path.join(tmp, "helm"), "w") as handle:
            handle.write(D.FAKE_HELM)
        os.chmod(os.path.join(tmp, "helm"), os.stat(os.path.join(tmp, "helm")).st_mode | stat.S_IEXEC)
    suffix = ".check" if check else ""
    hosts = {}
    for name, case in cases.items():
        case = D._fill(dict(case), tmp)  # pylint: disable=protected-access
        charts = os.path.join(tmp, name + suffix + ".charts")
        with open(charts, "w") as handle:
            handle.write("".join(c + "\n" for c in case.pop("_charts", [])))
        wrapper = os.path.join(tmp, name + suffix + ".helm.sh")
        with open(wrapper, "w") as handle:
            handle.write('#!/bin/sh\nFAKE_HELM_CHARTS=%s FAKE_HELM_LOG=%s exec %s "$@"\n'
                         % (charts, os.path.join(tmp, name + suffix + ".helm"), os.path.join(tmp, "helm")))
        os.chmod(wrapper, 0o755)
        case.update({"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "router_helm_binary": wrapper,
                     "_case_out": os.path.join(tmp, name + suffix + ".json"), "_fake_k8s_calls": os.path.join(tmp, name + suffix + ".calls")})
        hosts[name] = case
    inventory = os.path.join(tmp, "inventory%s.yml" % suffix)
    with open(inventory, "w") as handle:
        yaml.safe_dump({"all": {"children": {"cases": {"hosts": hosts}}}}, handle)
    playbook = os.path.join(tmp, "apply.yml")
    with open(playbook, "w") as handle:
        handle.write(APPLY_PLAYBOOK)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(R.ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_DEPRECATION_WARNINGS="0",
               ANSIBLE_CALLBACK_RESULT_FORMAT="json", TMPDIR=tmp)
    env["ANSIBLE_COLLECTIONS_PATH"] = os.pathsep.join(
        [os.path.join(tmp, "collections"), os.path.join(R.ROOT, ".cache", "collections")]
        + [p for p in os.environ.get("ANSIBLE_COLLECTIONS_PATH", "").split(os.pathsep) if p])
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", inventory, playbook, "--forks", "4"]
    proc = subprocess.run(cmd + (["--check"] if check else []), cwd=R.ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, check=False)
    results, calls = {}, {}
    for name in cases:
        path = os.path.join(tmp, name + suffix + ".json")
        assert os.path.exists(path), proc.stdout[-5000:]
        with open(path) as handle:
            results[name] = json.load(handle)
        log = os.path.join(tmp, name + suffix + ".calls")
        calls[name] = [json.loads(line) for line in open(log)] if os.path.exists(log) else []
        helm = os.path.join(tmp, name + suffix + ".helm")
        results[name]["_helm"] = open(helm).read().splitlines() if os.path.exists(helm) else []
    return {"stdout": proc.stdout, "results": results, "calls": calls}


@pytest.fixture(scope="module")
def applied(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("gie-apply"))
    return {"run": _run_apply(tmp, APPLY_CASES), "check": _run_apply(tmp, {"gie-apply": APPLY_CASES["gie-apply"]}, check=True)}


def _task_calls(run, name, task):
    return [c for c in run["calls"][name] if c["task"] == task]


def test_objects_are_applied_in_order_from_the_templates(applied):
    run = applied["run"]
    res = run["results"]["gie-apply"]
    assert res["_case_failed"] == "", res["_case_failed"]
    assert res["_helm"] == [], "no chart to have: helm is never called"
    assert _task_calls(run, "gie-apply", D.ROUTER_HELM) == []
    (crds,) = _task_calls(run, "gie-apply", D.ROUTER_CRDS)
    objects = _task_calls(run, "gie-apply", GIE_OBJECTS)
    kinds = [c["args"]["definition"]["kind"] for c in objects]
    # Two replicas under leader election (the default for approximate scoring): its Role and RoleBinding too.
    assert kinds == ["ServiceAccount", "Role", "RoleBinding", "Role", "RoleBinding", "Role", "RoleBinding", "ConfigMap", "Service",
                     "InferencePool", "Deployment"]
    assert run["calls"]["gie-apply"].index(crds) < run["calls"]["gie-apply"].index(objects[0]), "the CRDs first"
    for call in objects:
        assert call["args"]["state"] == "present" and call["args"]["apply"] is True
        # Only the leader is Ready: the apply does not wait for every replica (a bounded wait for one follows).
        assert call["args"]["wait"] is False
    assert objects[-1]["args"]["wait_timeout"] == 600
    own = [c["args"]["definition"]["kind"] for c in _task_calls(run, "gie-apply", D.ROUTER_OWN)]
    assert own == ["NetworkPolicy"], "no NodePort Service: gie has no proxy"
    assert (res["router_release_installed"], res["router_crds_installed"]) == (True, True)


def test_router_contract_of_gie(applied):
    contract = applied["run"]["results"]["gie-apply"]["router_contract"]
    assert contract["impl"] == "gie" and contract["scoring_mode"] == "approximate"
    assert contract["ext_proc_address"] == "%s.%s.svc.cluster.local:9002" % (EPP, NS)
    assert contract["epp_metrics_url"] == "http://%s.%s.svc.cluster.local:9090/metrics" % (EPP, NS)
    assert (contract["pool_name"], contract["pool_namespace"], contract["service_account"]) == (RELEASE, NS, EPP)
    assert contract["request_url"] == "", "no request path of its own: the Gateway's address goes in cluster_verify_router"
    assert contract["speculative_indexing"] is False and contract["ext_proc_tls"] is True


def test_a_given_chart_is_installed_with_helm_and_the_same_values(applied):
    run = applied["run"]
    res = run["results"]["gie-apply-chart"]
    assert res["_case_failed"] == "", res["_case_failed"]
    assert res["_helm"] == ["show chart " + LOCAL_CHART]
    (helm,) = _task_calls(run, "gie-apply-chart", D.ROUTER_HELM)
    assert helm["args"]["chart_ref"] == LOCAL_CHART and "chart_version" not in helm["args"]
    values = helm["args"]["release_values"]
    assert sorted(values) == ["experimentalHttpRoute", "inferenceExtension", "inferencePool", "provider"]
    assert values["inferencePool"]["modelServers"]["matchLabels"] == D.ENGINES["selector"]
    assert _task_calls(run, "gie-apply-chart", GIE_OBJECTS) == [], "the chart renders the objects, not the templates"
    assert res["router_release_installed"] is True


def test_absent_removes_what_was_applied_in_reverse(applied):
    run = applied["run"]
    assert run["results"]["gie-absent"]["_case_failed"] == ""
    objects = _task_calls(run, "gie-absent", GIE_OBJECTS)
    assert [c["args"]["definition"]["kind"] for c in objects][:2] == ["Deployment", "InferencePool"]
    assert [c["args"]["definition"]["kind"] for c in objects][-1] == "ServiceAccount"
    assert all(c["args"]["state"] == "absent" and c["args"]["wait"] is False for c in objects)
    assert _task_calls(run, "gie-absent", D.ROUTER_CRDS) == [], "the CRDs are kept"
    assert [c["args"]["state"] for c in _task_calls(run, "gie-absent", D.ROUTER_OWN)] == ["absent"]


def test_missing_crds_leave_the_objects_out_when_told(applied):
    run = applied["run"]
    res = run["results"]["gie-no-crds"]
    assert res["_case_failed"] == "" and (res["router_release_installed"], res["router_crds_installed"]) == (False, False)
    assert _task_calls(run, "gie-no-crds", GIE_OBJECTS) == [] and _task_calls(run, "gie-no-crds", D.ROUTER_CRDS) == []
    assert [c["args"]["definition"]["kind"] for c in _task_calls(run, "gie-no-crds", D.ROUTER_OWN)] == ["NetworkPolicy"]
    assert "were left out: router_crds_src (a local copy of the manifest) or router_crds_url (a mirror) would supply it." in run["stdout"]


def test_check_mode_moves_nothing(applied):
    run = applied["check"]
    assert run["results"]["gie-apply"]["_case_failed"] == ""
    cluster = [c for c in run["calls"]["gie-apply"] if c["action"] in ("k8s", "helm")]
    assert cluster and all(c["check_mode"] for c in cluster), "every call to the cluster runs in check mode"
    # The CRDs would be created (the stand-in reports a change), so the InferencePool, whose kind may not be served yet, is
    # not looked up; every other object is.
    kinds = [c["args"]["definition"]["kind"] for c in _task_calls(run, "gie-apply", GIE_OBJECTS)]
    assert "InferencePool" not in kinds and len(kinds) == 10 and kinds[-1] == "Deployment"
