# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The real EPPs beside the stand-in router: which run, with which configurations, and how each is started and asked.

* the llm-d EPP (``EPPLane``): a fresh EPP per configuration, with file discovery over the engines (``epp/local.py``).
  Each engine connects to its KV-event endpoint; a relay binds it and republishes at ``tcp://<engine address>:<kv
  port>``, the one port the EPP's precise producer dials per endpoint (``podDiscoveryConfig.socketPort``), which the
  bench subscribes to as well.
* the Gateway API Inference Extension's EPP (``GIELane``): approximate prefix-cache scoring from its own routing
  history, no KV events; it discovers its endpoints through the Kubernetes API only, so the lane puts, in the kwok cluster
  the benchmark's playbook started (``--kubeconfig``: ``benchmarks/bench_routing.yml``), one simulated pod per engine whose
  IP is the engine's address and the router role's InferencePool over them; a fresh EPP per configuration reconciles that
  pool. An InferencePool has one target port, so the engines listen on one port, each on its own 127.x address.
* ``Lanes``: every lane of the run, by configuration name; asks the current EPP for its pick over ext_proc
  (``epp/extproc.ask_pick``) and removes the run's scratch folder when it closes.

Which EPPs: ``--epp`` words or paths (``parse_epp``, ``asked_epps``), resolved once (``resolve_epps``: a path must be
executable; a word that cannot be had is left out with one sentence), each with its own configurations
(``--epp-config``, ``--gie-config``: ``epp_policies``, ``select_configs``); ``epp_lanes`` puts it together.
"""

from __future__ import absolute_import, division, print_function

import argparse
import atexit
import contextlib
import json
import os
import re
import shutil
import tempfile

import yaml

from . import ROOT, module_utils
from ansible_collections.inference_cache.substrate.plugins.module_utils.common import errors, wiring
from ansible_collections.inference_cache.substrate.plugins.module_utils.epp import local as _epp_local
from ansible_collections.inference_cache.substrate.plugins.module_utils.http import openai as http
from ansible_collections.inference_cache.substrate.tests.harness import epp_lab


# The real EPPs the bench knows (epp/local.IMPLS) and how the report names them.
EPP_LABELS = {"llm-d": "llm-d EPP %s" % wiring.ROUTER_VERSION, "gie": "GIE EPP %s" % _epp_local.GIE_VERSION}
EPP_WORDS = {"llm-d": "the llm-d router's EPP %s" % wiring.ROUTER_VERSION,
             "gie": "the Gateway API Inference Extension's EPP %s" % _epp_local.GIE_VERSION}
# The GIE lane's side of Kubernetes: its namespace and InferencePool in the kwok cluster the benchmark's playbook started.
GIE_NAMESPACE, GIE_POOL = "bench-routing", "bench-routing-pool"
# The router role's InferencePool, as make bench-routing renders it (benchmarks/epp_configs.yml, router_impl gie).
GIE_POOL_MANIFESTS = os.path.join(ROOT, "out", "bench-routing", "epp", "gie", "router", "manifests.yaml")
PREFIX_MATCH_RE = re.compile(r"^(?:inference_extension|llm_d_epp)_prefix_indexer_hit_ratio_(sum|count)(?:\{[^}]*\})?\s+(\S+)\s*$", re.M)


def prefix_match(metrics_texts):
    """The mean share of each prompt an EPP's own prefix index matched on the endpoint it picked, over the EPPs' metrics
    texts: the GIE EPP's inference_extension_prefix_indexer_hit_ratio histogram, observed at each pick
    (sigs.k8s.io/gateway-api-inference-extension@v1.4.0: pkg/epp/metrics/metrics.go RecordPrefixCacheMatch, called by
    the prefix-cache-scorer's PreRequest); None where none exports it."""
    total = {"sum": 0.0, "count": 0.0}
    for text in metrics_texts:
        for kind, value in PREFIX_MATCH_RE.findall(text or ""):
            total[kind] += float(value)
    return round(total["sum"] / total["count"], 4) if total["count"] else None


def epp_prefix_match(epps):
    """``prefix_match`` of the running ``epps`` (their metrics read now)."""
    texts = []
    for epp in epps:
        try:
            texts.append(http.OpenAIClient(epp.metrics_url.rsplit("/metrics", 1)[0], timeout=5).get_text("/metrics"))
        except http.OpenAIHTTPError:
            continue
    return prefix_match(texts)


class EPPLane:
    """The real llm-d EPP for its ``epp:NAME`` policies: one KV relay per engine, a fresh EPP per configuration."""

    impl = "llm-d"

    def __init__(self, binary, configs, specs, kv_port, folder, confine=True):
        self.binary = binary
        self.configs = configs
        self.specs = specs
        self.kv_port = kv_port
        self.folder = folder
        self.confine = confine
        self.relays = []
        self.current = None

    def label(self, _name=None):
        return EPP_LABELS[self.impl]

    def describe(self):
        return "%s: %s (%s), with file discovery over the engines and a KV relay per engine" % (
            ", ".join("epp:%s" % n for n in sorted(self.configs)), EPP_WORDS[self.impl], self.binary)

    def open(self):
        """Bind the relays (each engine connects to its own endpoint); the bench then subscribes to their public side."""
        for spec in self.specs:
            public = "tcp://%s:%d" % (spec["host"], self.kv_port)
            self.relays.append(epp_lab.Relay(spec["endpoint"], public))
            spec["endpoint"], spec["socket_mode"] = public, "connect"
        return self

    def close(self):
        for relay in self.relays:
            relay.stop()
        self.relays = []

    @staticmethod
    def _precise(config):
        return [p.get("parameters") or {} for p in config.get("plugins") or [] if p.get("type") == "precise-prefix-cache-producer"]

    def check_configs(self, block_size):
        """The configs' precise producers hash blocks of the engines' size and dial the relays' port."""
        for name, config in sorted(self.configs.items()):
            for params in self._precise(config):
                size = (params.get("tokenProcessorConfig") or {}).get("blockSizeTokens")
                port = ((params.get("kvEventsConfig") or {}).get("podDiscoveryConfig") or {}).get("socketPort")
                if size != block_size:
                    raise errors.CheckError("EPP config %s hashes blocks of %s tokens but the engines' blocks hold %d: render it "
                                            "with the engines' block size." % (name, size, block_size))
                if port != self.kv_port:
                    raise errors.CheckError("EPP config %s dials KV events on port %s but the relays publish on %d: render it with "
                                            "kv_events_port %d, or pass --kv-port %s." % (name, port, self.kv_port, self.kv_port, port))

    def _new(self, name, i):
        endpoints = [(s["name"], s["host"], s["port"]) for s in self.specs]
        label = "epp-%s-%d" % (re.sub(r"[^\w.-]", "-", name), i)
        return _epp_local.EPP(self.binary, epp_lab.file_discovery(self.configs[name], endpoints, self.folder, label), endpoints,
                              self.folder, name=label, confine=self.confine)

    def _ready(self, epp, name, before):
        """Once the EPP subscribes to every relay when it reads events."""
        if any((p.get("kvEventsConfig") or {}).get("discoverPods") for p in self._precise(self.configs[name])):
            epp_lab.wait_subscribed(self.relays, [n + 1 for n in before])

    @contextlib.contextmanager
    def router(self, name, count=1):
        """``count`` fresh EPPs with config ``name`` (an index each), each ready to route."""
        epps = []
        try:
            for i in range(count):
                before = [len(r.subscriptions) for r in self.relays]
                epp = self._new(name, i)
                epps.append(epp)
                epp.start()
                self._ready(epp, name, before)
        except _epp_local.EPPError as exc:
            for epp in epps:
                epp.stop()
            raise errors.CheckError(str(exc).replace("ask for an unconfined EPP", "pass --epp-listen-all for an unconfined EPP"))
        self.current = epps
        try:
            yield epps
        finally:
            self.current = None
            for epp in epps:
                epp.stop()


def one_port(specs):
    """The engines' common port: an InferencePool has one target port for all its pods, told apart by address."""
    ports = sorted(set(int(s["port"]) for s in specs))
    hosts = [s["host"] for s in specs]
    if len(ports) != 1 or len(set(hosts)) != len(hosts):
        raise errors.CheckError(
            "The GIE EPP reaches its engines through one InferencePool, which has one target port for all its pods, but the "
            "engines are %s: run them on one port, each on its own 127.x address (--engine NAME=127.0.0.2:PORT,...)." % ", ".join(
                "%s on %s:%s" % (s["name"], s["host"], s["port"]) for s in specs))
    return ports[0]


class GIELane(EPPLane):
    """The Gateway API Inference Extension's EPP for its ``epp:NAME`` policies: a kwok cluster, an InferencePool over one
    simulated pod per engine (each pod's IP its engine's address), a fresh EPP per configuration reconciling that pool."""

    impl = "gie"

    def __init__(self, binary, configs, specs, folder, confine=True, kubeconfig=None, pool=GIE_POOL_MANIFESTS):
        super(GIELane, self).__init__(binary, configs, specs, None, folder, confine=confine)
        self.kubeconfig = kubeconfig
        self.pool_manifests = pool
        self.port = one_port(specs)
        self.pool = None

    def describe(self):
        return ("%s: %s (%s), discovering the engines through InferencePool %s/%s of the kwok cluster of %s (a simulated pod per "
                "engine, its IP the engine's address)" % (
                    ", ".join("epp:%s" % n for n in sorted(self.configs)), EPP_WORDS[self.impl], self.binary, GIE_NAMESPACE, GIE_POOL,
                    self.kubeconfig))

    def open(self):
        """The InferencePool CRDs, the namespace, the pool and its pods (until they run with the engines' IPs)."""
        if not self.kubeconfig or not os.path.isfile(self.kubeconfig):
            raise errors.CheckError("The GIE EPP discovers its endpoints through the Kubernetes API only: give the kubeconfig of a "
                                    "kwok cluster (--kubeconfig; benchmarks/bench_routing.yml starts one), not %r." % (self.kubeconfig,))
        try:
            self.pool = epp_lab.GIEPool(self.kubeconfig, epp_lab.rendered_pool(self.pool_manifests),
                                        [(s["name"], s["host"]) for s in self.specs], name=GIE_POOL, namespace=GIE_NAMESPACE, port=self.port)
            self.pool.apply(crds=_epp_local.gie_crds())
        except Exception as exc:  # pylint: disable=broad-except
            raise errors.CheckError("The GIE EPP's InferencePool could not be set up in the kwok cluster: %s" % (
                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__))
        return self

    def close(self):
        """The pool (its namespace; the cluster is the playbook's to stop)."""
        if self.pool is not None:
            pool, self.pool = self.pool, None
            try:
                pool.delete()
            except Exception as exc:  # pylint: disable=broad-except
                raise errors.CheckError("Stopping the GIE lane failed: the pool: %s" % exc)

    def check_configs(self, block_size):
        """A block size in a config's prefix-cache-scorer is the engines' (the EPP falls back to it without their metrics)."""
        for name, config in sorted(self.configs.items()):
            for plugin in config.get("plugins") or []:
                size = (plugin.get("parameters") or {}).get("blockSizeTokens") if plugin.get("type") == "prefix-cache-scorer" else None
                if size is not None and int(size) != block_size:
                    raise errors.CheckError("GIE config %s hashes blocks of %s tokens but the engines' blocks hold %d: render it with "
                                            "the engines' block size." % (name, size, block_size))

    def _new(self, name, i):
        return _epp_local.EPP(self.binary, self.configs[name], [(s["name"], s["host"], s["port"]) for s in self.specs], self.folder,
                              name="epp-%s-%d" % (re.sub(r"[^\w.-]", "-", name), i), confine=self.confine, impl="gie",
                              pool=GIE_POOL, kubeconfig=self.kubeconfig, namespace=GIE_NAMESPACE)

    def _ready(self, epp, name, before):
        """Once its metrics count every engine's pod ready in the pool: it reconciled the InferencePool."""
        epp.wait_ready_pods(len(self.specs), GIE_POOL)


class Lanes:
    """Every real EPP of the run, by configuration name; ``current`` the EPPs of the configuration that runs.

    ``folder`` (the run's scratch folder: the EPPs' configs, logs, the kwok cluster's info) is removed by ``close``."""

    def __init__(self, lanes, folder=None):
        self.lanes = list(lanes)
        self.folder = folder
        self.by_name = {}
        for lane in self.lanes:
            for name in lane.configs:
                self.by_name[name] = lane
        self.current = None

    def pick(self, router, body, engines):
        """The name of the engine the current EPP of ``router`` picks for ``body``, asked over ext_proc as Envoy asks."""
        extproc, route_check = module_utils("epp.extproc"), module_utils("epp.route_check")
        address = self.current[router % len(self.current)].address
        picked = extproc.ask_pick(address, json.dumps(body).encode("utf-8"), timeout=30.0)["picked"]
        for engine in engines:
            if route_check.url_address(engine.spec["url"]) == picked:
                return engine.name
        raise errors.CheckError("The EPP picked %s, which is none of the engines (%s)." % (
            picked, ", ".join(e.spec["url"] for e in engines)))

    @staticmethod
    def prefix_match(epps):
        return epp_prefix_match(epps)

    def label(self, name):
        return self.by_name[name].label(name)

    def check_configs(self, block_size):
        for lane in self.lanes:
            lane.check_configs(block_size)

    def open(self):
        for lane in self.lanes:
            lane.open()
        return self

    def close(self):
        """Every lane, each tried, then the run's folder; the first failure raised after all."""
        problems = []
        for lane in self.lanes:
            try:
                lane.close()
            except errors.CheckError as exc:
                problems.append(exc)
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)
        if problems:
            raise problems[0]

    @contextlib.contextmanager
    def router(self, name, count=1):
        with self.by_name[name].router(name, count=count) as epps:
            self.current = epps
            try:
                yield epps
            finally:
                self.current = None


def config_parser(option):
    """The argparse type of ``option`` (--epp-config, --gie-config): NAME=PATH, the file an EndpointPickerConfig mapping."""
    def parse(text):
        name, sep, path = text.partition("=")
        if not sep or not re.match(r"^[\w.-]+$", name):
            raise argparse.ArgumentTypeError("%s wants NAME=PATH, got %r" % (option, text))
        try:
            with open(path, encoding="utf-8") as handle:
                config = yaml.safe_load(handle)
        except (OSError, yaml.YAMLError) as exc:
            raise argparse.ArgumentTypeError("%s %s: cannot read %s (%s)" % (option, name, path, exc))
        if not isinstance(config, dict):
            raise argparse.ArgumentTypeError("%s %s: %s holds no EndpointPickerConfig mapping" % (option, name, path))
        return name, config
    return parse


parse_epp_config = config_parser("--epp-config")
parse_gie_config = config_parser("--gie-config")


def parse_epp(text):
    """``--epp``: ``(impl, path or None)``: a word (llm-d, gie) for that EPP from its usual place, IMPL=PATH for a binary of
    that EPP, or a path, the llm-d EPP's binary."""
    impl, sep, path = text.partition("=")
    if text in _epp_local.IMPLS:
        return text, None
    if sep and impl in _epp_local.IMPLS and path:
        return impl, path
    if not text or (sep and re.match(r"^[\w-]+$", impl)):
        raise argparse.ArgumentTypeError("--epp wants a binary's path, %s, or IMPL=PATH with IMPL %s; got %r" % (
            " or ".join(_epp_local.IMPLS), " or ".join(_epp_local.IMPLS), text))
    return "llm-d", text


def asked_epps(given, env=None):
    """``[(impl or None, path or None)]``: the EPPs asked for (``--epp`` values parsed), else ``SUBSTRATE_EPP_BINARY`` (of
    ``SUBSTRATE_EPP_IMPL``, llm-d by default), else ``[(None, None)]``: llm-d's where it can be had, else the GIE EPP."""
    env = os.environ if env is None else env
    if given:
        impls = [impl for impl, _path in given]
        twice = sorted(set(i for i in impls if impls.count(i) > 1))
        if twice:
            raise argparse.ArgumentTypeError("--epp names the %s EPP more than once; give each EPP once" % ", ".join(twice))
        return list(given)
    if env.get("SUBSTRATE_EPP_BINARY"):
        return [(env.get("SUBSTRATE_EPP_IMPL") or "llm-d", env["SUBSTRATE_EPP_BINARY"])]
    return [(None, None)]


def _resolve_any_epp():
    """The EPP resolve_epp picks when no implementation is named, as ((impl, path), why)."""
    path, impl, why = _epp_local.resolve_epp(None, None)
    return (impl, path), why


def _default_resolvers():
    return {"llm-d": lambda: _epp_local.resolve_binary(given=None),
            "gie": _epp_local.resolve_gie,
            None: _resolve_any_epp}


def resolve_epps(asked, resolvers=None):
    """``({impl: binary}, [sentence per EPP left out], failure sentence or None)``.

    A binary given by path must be executable (else the run fails with one sentence); an EPP asked for by a word, or none
    asked for (llm-d's where it can be had, else the GIE EPP), that cannot be had is left out with one sentence."""
    resolvers = resolvers or _default_resolvers()
    found, left_out = {}, []
    for impl, path in asked:
        if path is not None:
            if os.path.isfile(path) and os.access(path, os.X_OK):
                found[impl] = path
                continue
            return {}, [], "%s is no executable file; give the path of %s binary." % (path, EPP_WORDS[impl])
        if impl is None:
            (got_impl, got), why = resolvers[None]()
            if got:
                found[got_impl] = got
            else:
                left_out.append("the real EPP is left out: %s" % why)
            continue
        got, why = resolvers[impl]()
        if got:
            found[impl] = got
        else:
            left_out.append("%s is left out: %s" % (EPP_WORDS[impl], why))
    return found, left_out, None


def epp_policies(configs_by_impl):
    """``{"epp:NAME": impl}`` over every EPP's configurations; a name given to two EPPs is refused."""
    out = {}
    for impl in sorted(configs_by_impl):
        for name, _config in configs_by_impl[impl]:
            policy = "epp:%s" % name
            if policy in out and out[policy] != impl:
                raise argparse.ArgumentTypeError("configuration %s is given for both the %s and the %s EPP; give each its own name" % (
                    name, out[policy], impl))
            out[policy] = impl
    return out


def select_configs(configs_by_impl, found, policies):
    """The configurations that run: ``{impl: {name: config}}`` of the EPPs found, those whose policy ``epp:NAME`` is in
    ``policies``; an EPP with none is not there."""
    out = {}
    for impl in sorted(found):
        mine = dict((name, config) for name, config in configs_by_impl.get(impl) or [] if "epp:%s" % name in policies)
        if mine:
            out[impl] = mine
    return out


CONFIG_OPTIONS = {"llm-d": "--epp-config", "gie": "--gie-config"}


def epp_lanes(args, engines, policies, resolvers=None):
    """The real EPPs' lanes for ``policies`` (a Lanes, or None), the sentences of the EPPs left out, and a failure sentence."""
    configs_by_impl = {"llm-d": args.epp_config, "gie": args.gie_config}
    by_policy = epp_policies(configs_by_impl)
    wanted = set(by_policy[p] for p in policies if p in by_policy)
    asked = asked_epps(args.epp)
    left_out = ["%s is left out: no configuration of it is given (%s NAME=PATH)" % (EPP_WORDS[impl], CONFIG_OPTIONS[impl])
                for impl, _path in asked if impl is not None and not configs_by_impl.get(impl)]
    if asked == [(None, None)] and len(wanted) == 1:
        asked = [(list(wanted)[0], None)]   # none asked for, the policies name one EPP: that one
    asked = [(impl, path) for impl, path in asked if impl is None or impl in wanted]
    if not asked:
        return None, left_out, None
    found, more, failed = resolve_epps(asked, resolvers)
    if failed:
        return None, [], failed
    configs = select_configs(configs_by_impl, found, policies)
    if not configs:
        return None, left_out + more, None
    module_utils("epp.extproc")   # grpcio and xds-protos: one sentence now rather than at the first pick
    folder = tempfile.mkdtemp(prefix="bench-routing-epp-")   # removed by Lanes.close, or here on failure
    # and at exit whatever happens between here and Lanes.close (a failure before the lanes open, SIGTERM as sys.exit)
    atexit.register(shutil.rmtree, folder, True)
    lanes = []
    try:
        for impl in sorted(configs):
            if impl == "gie":
                lanes.append(GIELane(found[impl], configs[impl], engines, folder, confine=not args.epp_listen_all,
                                     kubeconfig=getattr(args, "kubeconfig", None), pool=args.gie_pool))
            else:
                lanes.append(EPPLane(found[impl], configs[impl], engines, args.kv_port, folder, confine=not args.epp_listen_all))
    except errors.CheckError as exc:
        shutil.rmtree(folder, ignore_errors=True)
        return None, left_out + more, exc.msg
    return Lanes(lanes, folder=folder), left_out + more, None
