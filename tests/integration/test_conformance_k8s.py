# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Every rendered Kubernetes case held against the pinned upstream, as data (tests/integration/k8s_conformance.yml).

The facts there were read in upstream source at the pinned tags and cite ``repo@tag:path``: the Helm values the
router and device-plugin charts consume, the chart defaults that must be overridden, the EPP plugin parameter
fields at llm-d-router v0.9.0 (decoded with DisallowUnknownFields: one unknown field and the EPP does not start),
nvkind's RuntimeClass, vLLM's render endpoint and SGLang's LMCache connector. The cases are the render tests'
(tests/integration/_k8s_render.py): kind and GPU inventories, vLLM CPU/LMCache and SGLang, precise and
approximate, standalone and gateway charts.
"""

from __future__ import absolute_import, division, print_function

import json
import os
import re
import sys

import msgspec
import pytest
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _k8s_render as R  # noqa: E402  pylint: disable=wrong-import-position

from ansible_collections.inference_cache.substrate.plugins.module_utils.kv import router_decoder as D  # noqa: E402
from ansible_collections.inference_cache.substrate.tests.harness import kv_synthetic as synthetic  # noqa: E402

FACTS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "k8s_conformance.yml")
with open(FACTS_FILE) as _handle:
    FACTS = yaml.safe_load(_handle)
CITATION = re.compile(r"^[\w.-]+/[\w.-]+@[\w.-]+:\S+|^[\w.-]+==[\w.]+ wheel:\S+")


@pytest.fixture(scope="module")
def rendered(rendered_cases):
    return rendered_cases["cases"]   # conftest.py: every case rendered once per session


def leaf_paths(value, prefix=""):
    """Dotted paths of every leaf of a nested mapping (lists and empty maps are leaves)."""
    if isinstance(value, dict) and value:
        for key, sub in value.items():
            yield from leaf_paths(sub, prefix + "." + key if prefix else key)
    else:
        yield prefix


def consumed(path, allowed):
    return any(path == a or path.startswith(a + ".") for a in allowed)


def check_parameters(value, spec, where):
    """Problems of one plugin's parameters against the v0.9.0 field lists (unknown fields, maps where scalars go)."""
    problems = []
    fields = spec["fields"]
    if not isinstance(value, dict):
        return ["%s is not a mapping" % where]
    for key, sub in value.items():
        if key not in fields:
            problems.append("%s.%s is not a field at v0.9.0 (%s)" % (where, key, spec.get("source", "see parent")))
        elif isinstance(fields[key], dict):
            problems.extend(check_parameters(sub, fields[key], where + "." + key))
        elif fields[key] == "scalar" and isinstance(sub, (dict, list)):
            problems.append("%s.%s must be a scalar" % (where, key))
    return problems


def all_cases():
    return sorted(R.CASES)


def test_every_fact_cites_upstream():
    def sources(node):
        if isinstance(node, dict):
            for key, sub in node.items():
                if key == "source" or (isinstance(sub, str) and "@" in sub and ":" in sub):
                    yield sub
                else:
                    yield from sources(sub)
    cited = list(sources(FACTS))
    assert len(cited) > 40
    for source in cited:
        assert CITATION.match(source), "not a repo@tag:path citation: %s" % source
    for section in ("router_chart_values", "epp_plugin_parameters", "device_plugin_chart_values"):
        assert FACTS[section]


@pytest.mark.parametrize("name", all_cases())
def test_router_values_are_all_consumed_by_the_chart(rendered, name):
    chart = R.CASES[name].get("router_chart", "standalone")
    allowed = list(FACTS["router_chart_values"]["common"]) + list(FACTS["router_chart_values"][chart])
    values = rendered[name]["router_values"]
    unread = [p for p in leaf_paths(values) if not consumed(p, allowed)]
    assert not unread, "%s: values no %s template of v0.9.0 reads: %s" % (name, chart, unread)


@pytest.mark.parametrize("name", all_cases())
def test_chart_defaults_that_break_a_deployment_are_overridden(rendered, name):
    values = rendered[name]["router_values"]
    for path, fact in FACTS["router_chart_defaults_overridden"].items():
        node = values
        for key in path.split("."):
            node = node.get(key) if isinstance(node, dict) else None
        if path.startswith("router.tokenizer.") and not values["router"]["tokenizer"]["enabled"]:
            continue
        if path.startswith("router.proxy.") and "proxy" not in values["router"]:
            continue
        assert node is not None, "%s: %s keeps the chart default %s (%s)" % (name, path, fact["default"], fact["source"])
        assert node != fact["default"], "%s: %s equals the chart default (%s)" % (name, path, fact["source"])


@pytest.mark.parametrize("name", all_cases())
def test_standalone_listener_and_epp_label(rendered, name):
    values = rendered[name]["router_values"]
    if "proxy" in values["router"]:
        ports = [p for p in values["router"]["extraServicePorts"] if p["name"] == "http"]
        assert ports[0]["port"] == FACTS["standalone_http_port"]["port"]
    policy = [d for d in rendered[name]["docs"] if d["kind"] == "NetworkPolicy"][0]
    keys = set(k for rule in policy["spec"]["ingress"] for peer in rule.get("from", []) for k in peer.get("podSelector", {}).get("matchLabels", {}))
    assert FACTS["epp_pod_label"]["key"] in keys


@pytest.mark.parametrize("name", all_cases())
def test_epp_plugin_parameters_are_v0_9_0_fields(rendered, name):
    config = rendered[name]["epp_config"]
    problems = []
    for plugin in config["plugins"]:
        spec = FACTS["epp_plugin_parameters"].get(plugin["type"])
        params = plugin.get("parameters")
        if spec is None:
            assert not params, "%s: %s has parameters this test does not know the v0.9.0 fields of" % (name, plugin["type"])
            continue
        problems.extend(check_parameters(params or {}, spec, plugin["type"]))
    assert not problems, "%s: %s" % (name, problems)


def test_parameter_check_refuses_what_v0_9_0_refuses():
    """The field check is strict: the v0.10 replay port and a misspelt field are both caught."""
    spec = FACTS["epp_plugin_parameters"]["precise-prefix-cache-producer"]
    bad = {"kvEventsConfig": {"podDiscoveryConfig": {"socketPort": 5557, "replaySocketPort": 5558}},
           "tokenProcessorConfig": {"blockSizeToken": 16}}
    problems = check_parameters(bad, spec, "precise-prefix-cache-producer")
    assert len(problems) == 2 and "replaySocketPort" in problems[0] + problems[1]


@pytest.mark.parametrize("name", all_cases())
def test_engine_type_is_rendered_but_ignored_at_v0_9_0(rendered, name):
    """kvEventsConfig.engineType is accepted (a field) but the v0.9.0 producer always decodes with the vLLM adapter."""
    case = rendered[name]
    for plugin in case["epp_config"]["plugins"]:
        if plugin["type"] == "precise-prefix-cache-producer":
            assert plugin["parameters"]["kvEventsConfig"]["engineType"] == case["engine"]["engine_type"]
    with open(os.path.join(R.ROOT, "docs", "compatibility.md")) as handle:
        docs = handle.read()
    assert FACTS["engine_type_ignored"]["source"].split(":", 1)[1] in docs


@pytest.mark.parametrize("name", all_cases())
def test_device_plugin_values_are_consumed_by_the_chart(rendered, name):
    values = rendered[name].get("nvdp_values")
    if values is None:
        return
    unread = [p for p in leaf_paths(values) if not consumed(p, FACTS["device_plugin_chart_values"])]
    assert not unread, "%s: device plugin values no v0.17.1 template reads: %s" % (name, unread)
    if R.CASES[name].get("kind_cluster_mode") == "nvkind":
        assert values["runtimeClassName"] == FACTS["nvkind_runtime_class"]["name"]


@pytest.mark.parametrize("name", all_cases())
def test_sglang_lmcache_pair_starts(rendered, name):
    case = rendered[name]
    if case["engine"]["profile"] != "sglang_lmcache":
        return
    pins = yaml.safe_load(open(R.PINS))
    pinned = pins["software"]["lmcache_for_sglang"]
    assert pinned == FACTS["sglang_lmcache"]["pinned"]
    newest = tuple(int(x) for x in FACTS["sglang_lmcache"]["newest_compatible"].split("."))
    assert tuple(int(x) for x in pinned.split(".")) <= newest
    assert "--enable-lmcache" in case["engine"]["args"]


@pytest.mark.parametrize("name", sorted(n for n in R.CASES if R.CASES[n].get("model_server_disaggregation")))
def test_prefill_decode_engines_match_v0_9_0_and_vllm(rendered, name):
    """issue 12: role labels the v0.9.0 filters select on, vLLM's NIXL connector, the routing sidecar's flags."""
    groups = dict((d["metadata"]["name"].rsplit("-", 1)[1], d["spec"]["template"])
                  for d in rendered[name]["manifests"]["model_server"] if d["kind"] == "Deployment")
    assert sorted(groups) == ["decode", "prefill"]
    for role, pod in groups.items():
        assert pod["metadata"]["labels"][FACTS["pd_role_label"]["value"]] == FACTS["pd_role_values"]["value"][role]
        transfer = json.loads(pod["spec"]["containers"][0]["args"][pod["spec"]["containers"][0]["args"].index("--kv-transfer-config") + 1])
        nixl = [c for c in transfer.get("kv_connector_extra_config", {}).get("connectors", [transfer])
                if c["kv_connector"] == FACTS["vllm_nixl_connector"]["value"]]
        assert nixl and nixl[0]["kv_role"] in FACTS["vllm_kv_roles"]["value"] and transfer["kv_role"] in FACTS["vllm_kv_roles"]["value"]
    # the routing sidecar (an LMCache server in multiprocess mode is the other native sidecar of an LMCache pod)
    routing = dict((role, [c for c in pod["spec"].get("initContainers", []) if c["name"] != "lmcache-server"]) for role, pod in groups.items())
    sidecar = routing["decode"][0]
    assert (sidecar.get("restartPolicy") == "Always") is FACTS["pd_sidecar_native"]["value"]
    assert sidecar["image"].startswith(FACTS["pd_sidecar_image"]["value"] + ":")
    flags = dict(a[2:].split("=", 1) for a in sidecar["args"])
    assert set(flags) <= set(FACTS["pd_sidecar_flags"]["value"]), flags
    assert flags["kv-connector"] == FACTS["pd_sidecar_nixl_connector"]["value"]
    assert not routing["prefill"] and len(routing["decode"]) == 1


def test_pins_agree_with_the_facts():
    pins = yaml.safe_load(open(R.PINS))
    assert pins["charts"]["llm_d_router_standalone"]["version"] == pins["charts"]["llm_d_router_gateway"]["version"] == "v0.9.0"
    assert pins["images"]["epp"]["tag"] == "v0.9.0"
    assert pins["images"]["pd_sidecar"]["tag"] == "v0.9.0"
    assert "%s/%s" % (pins["images"]["pd_sidecar"]["registry"], pins["images"]["pd_sidecar"]["repository"]) == FACTS["pd_sidecar_image"]["value"]
    assert pins["software"]["llm_d_kv_cache"] == "v0.9.0", "llm-d-router@v0.9.0:go.mod requires llm-d-kv-cache v0.9.0"
    assert pins["images"]["envoy"]["tag"] == "distroless-v1.33.2", "llm-d-router@v0.9.0 standalone values: envoy preset image"
    assert pins["charts"]["nvidia_device_plugin"]["version"] == "0.17.1"
    assert json.dumps(FACTS["vllm_render_endpoint"]["flag"]) == '"--enable-scale-out"'


DECODER = FACTS["kv_cache_vllm_decoder"]


def _problems(payload):
    return D.problems(msgspec.msgpack.decode(payload), "v0.9.0")


def test_the_collections_decoder_facts_are_the_cited_ones():
    """plugins/module_utils/kv/router_decoder.py (what kv_events_check reports) holds exactly the facts cited here."""
    ours = D.DECODERS["v0.9.0"]
    assert ours["tag_key"] == DECODER["tag_key"]
    assert [(f["name"], f["kind"], f["optional"]) for f in ours["batch"]] == [
        (f["name"], f["kind"], f.get("optional", False)) for f in DECODER["batch"]]
    assert sorted(ours["events"]) == sorted(DECODER["events"])
    for tag, fields in DECODER["events"].items():
        assert [(f["name"], f["kind"], f["optional"]) for f in ours["events"][tag]] == [
            (f["name"], f["kind"], f.get("optional", False)) for f in fields], tag


def test_the_epp_kv_cache_module_is_the_one_whose_map_decoding_was_seen():
    """Point 6: the module the EPP v0.9.0 builds with is, hash for hash, the one whose tests decode map events."""
    assert DECODER["module"].startswith("github.com/llm-d/llm-d-kv-cache %s h1:" % yaml.safe_load(open(R.PINS))["software"]["llm_d_kv_cache"])
    assert len(DECODER["module_sources"]) == 2 and "llm-d/llm-d-router@v0.9.0:go.sum" in DECODER["module_sources"]
    for source in DECODER["module_sources"] + [DECODER["maps_decoded_source"], DECODER["source"], FACTS["sglang_event_fields"]["source"]]:
        assert CITATION.match(source), source
    docs = open(os.path.join(R.ROOT, "docs", "compatibility.md")).read()
    assert DECODER["module"].split()[-1] in docs and DECODER["maps_decoded_source"] in docs
    assert "6. **Map-encoded events: decoded at v0.9.0 (confirmed).**" in docs


@pytest.mark.parametrize("fmt", ["vllm-map", "vllm-array", "sglang"])
@pytest.mark.parametrize("hash_kind", ["int", "bytes"])
def test_synthetic_events_are_what_the_epp_decoder_takes(fmt, hash_kind):
    """The synthetic publisher the tests rely on speaks what the EPP reads (vLLM maps and arrays, SGLang 0.5.12)."""
    seen = set()
    for step in range(4):
        payload = synthetic.encode_batch(synthetic.synthetic_events(fmt, step, hash_kind=hash_kind))
        assert _problems(payload) == [], (fmt, step)
        seen.update(D.tags(msgspec.msgpack.decode(payload)))
    assert seen == {"BlockStored", "BlockRemoved"}


@pytest.mark.parametrize("event, message", [
    ({"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "block_size": 16},
     "event 0 BlockStored.token_ids is nil, not an array of integers"),
    ({"type": "BlockStored", "block_hashes": [b""], "parent_block_hash": None, "token_ids": [1], "block_size": 16}, "block_hashes"),
    ({"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": [1], "block_size": 16,
      "lora_name": {"salt": 1}}, "lora_name"),
    ({"type": "BlockRemoved", "block_hashes": [1], "group_idx": -1}, "group_idx"),
    ({"tag": "BlockStored"}, "event 0 is a map without a string 'type' tag"),
    (["BlockStored", [1], None, [1]], "event 0 BlockStored has no block_size"),
    (["BlockStored", [1], None, [1], 16, None, "GPU", {"cache_salt": "s"}],
     "event 0 BlockStored.lora_name is a map, not a string or nil"),  # a map where a string goes; the value is never printed
    (["FutureEvent", 1], "event 0 has the type 'FutureEvent', which the decoder does not know"),
])
def test_the_decoder_facts_refuse_what_the_epp_refuses(event, message):
    found = _problems(synthetic.encode_batch([event]))
    assert found and message in found[0], found


def test_the_decoder_facts_refuse_a_map_batch():
    found = _problems(synthetic.encode_batch([], batch_format="map"))
    assert found == ["the batch is a map, not a positional array"]


def test_a_renamed_parent_is_only_a_lost_parent():
    """vLLM's parent_block_hash may be nil, so a renamed one is read as 'no parent', not refused: the facts say so too."""
    event = {"type": "BlockStored", "block_hashes": [1], "parent_hash": 7, "token_ids": [1], "block_size": 16}
    assert _problems(synthetic.encode_batch([event])) == []


def test_sglang_0_5_12_fields_sit_where_the_vllm_adapter_reads_them():
    """Point 7: engineType is ignored at v0.9.0, so SGLang's positional events go through the vLLM adapter."""
    for tag, names in FACTS["sglang_event_fields"]["value"].items():
        assert names == [f["name"] for f in DECODER["events"][tag]][:len(names)], tag
    assert len(FACTS["sglang_event_fields"]["batch"]) == len(DECODER["batch"])
