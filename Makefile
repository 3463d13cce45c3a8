# One entry point for every stage. `make test` is the README's test command and what CI (.ci/run) runs.
SHELL := /bin/bash
VENV  := $(CURDIR)/.venv
BIN   := $(VENV)/bin
export PATH := $(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
# Ansible expands the "~" of its async folder through the account's home, not $$HOME: with HOME set elsewhere
# (a CI home, a sandbox), async_status looks in the wrong folder ("could not find job"). Name it outright.
export ANSIBLE_ASYNC_DIR ?= $(HOME)/.ansible_async
export ANSIBLE_FORCE_COLOR := 0
export PY_COLORS := 0
export NO_COLOR := 1

.PHONY: help setup site verify teardown render kubernetes kwok kwok-traffic gie-epp go-build kwok-teardown test sanity units core-floor core-newest release-check docs pytest integration engine lint molecule molecule-destroy build changelog argspecs bench bench-site bench-verify bench-load bench-routing study-routing study-fleet bench-kv-scale freeze clean

help:  ## List the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-17s %s\n", $$1, $$2}'

setup:  ## Toolchain in .venv, kubernetes.core and this collection under .cache/collections
	@scripts/setup.sh

site: setup  ## The main job: the whole stack on the local default (real vLLM on CPU), then verification
	$(BIN)/ansible-playbook -i inventories/local playbooks/site.yml

verify: setup  ## The checks alone against the local default (pass -e to point at other endpoints)
	$(BIN)/ansible-playbook -i inventories/local playbooks/verify.yml

teardown: setup  ## Stop the local engine
	$(BIN)/ansible-playbook -i inventories/local playbooks/teardown.yml

render: setup  ## Render the Kubernetes manifests and Helm values of inventories/kind, KAITO's approximate default, into out/render (no cluster)
	$(BIN)/ansible-playbook -i inventories/kind playbooks/render.yml -e substrate_render_hosts=k8s_controller \
	  -e substrate_render_dir=$(CURDIR)/out/render -e router_scoring_mode=approximate -e model_server_allow_unpinned_images=true \
	  -e router_allow_unpinned_images=true -e cluster_verify_allow_unpinned_images=true

kubernetes: setup  ## The whole stack on a local kind cluster (needs a Docker engine, kind and helm)
	$(BIN)/ansible-playbook -i inventories/kind playbooks/kubernetes.yml $(ARGS)

kwok: setup  ## The whole Kubernetes path on a local kwok cluster (a real API server, simulated nodes; builds it with Go the first time)
	$(BIN)/ansible-playbook -i inventories/kwok playbooks/kubernetes.yml $(ARGS)

kwok-traffic: setup  ## Real traffic on the kwok cluster (after `make kwok`): a real engine per engine pod, the GIE EPP routing to them (STATE=absent stops them)
	$(BIN)/ansible-playbook -i inventories/kwok playbooks/kwok_traffic.yml $(if $(STATE),-e kwok_traffic_state=$(STATE)) $(ARGS)

gie-epp: setup  ## Build the Gateway API Inference Extension's EPP and its InferencePool CRDs from the Go module proxy (once per version)
	$(BIN)/ansible-playbook playbooks/go_build.yml

go-build: setup  ## Build every Go program the tests run (kwok cluster, helm, the GIE EPP and its CRDs), once per version
	$(BIN)/ansible-playbook playbooks/go_build.yml -e '{"go_builds_names": ["kubernetes", "etcd", "kwok", "helm", "gie", "prometheus-operator-crds"]}'

kwok-teardown: setup  ## Stop the kwok cluster and remove its data (the built binaries stay)
	$(BIN)/ansible-playbook -i inventories/kwok playbooks/teardown.yml

test: setup  ## Everything below, with a summary; fails if any stage fails
	@scripts/test_all.sh

sanity: setup  ## ansible-test sanity on a staged copy (no Docker)
	scripts/ansible_test.sh sanity --local --python 3.11 --color no

units: setup  ## ansible-test units on a staged copy (no Docker): every test file under tests/unit, each in one group, once
	scripts/ansible_test.sh units --local --python 3.11 --color no
	@# A group that never starts reports "no tests ran" and exits 0: compare its junit reports with the files on disk.
	$(BIN)/python scripts/check_units_collected.py

# pytest with the failed tests, errors and skip reasons (-rfEs: "FAILED path::test - reason" lines, which the
# summary of `make test` repeats last) and the slowest tests listed; with the real engine started when none runs, and required.
PYTEST := $(BIN)/pytest -rfEs --durations=10
PYTEST_ENGINE := LOCAL_ENGINE_START=1 LOCAL_ENGINE_REQUIRED=1 $(PYTEST)
ENGINE_TESTS := tests/integration/test_local_engine_e2e.py tests/integration/test_kv_events_engine.py tests/integration/test_rendered_engine_commands.py tests/integration/test_rendered_lmcache_commands.py \
                tests/integration/test_kvcache_probe_engine.py tests/integration/test_epp_route_engine.py \
                tests/integration/test_local_engine_drain.py

pytest: setup  ## pytest, all of it: what `units`, `integration` and `engine` run (one engine run at a time)
	$(PYTEST_ENGINE) tests/unit tests/integration

integration: setup  ## pytest tests/integration without the real engine: synthetic KV events, roles, rendered manifests
	$(PYTEST) tests/integration $(addprefix --ignore=,$(ENGINE_TESTS))

engine: setup  ## pytest against the real local vLLM engine on CPU (installs and starts it; stops it at the end)
	$(PYTEST_ENGINE) $(ENGINE_TESTS)

lint: setup  ## ansible-lint, production profile, offline
	$(BIN)/ansible-lint --offline

molecule: setup  ## Every molecule scenario that can run here (or SCENARIOS="a b", MOLECULE_EXCEPT="c"); the others are skipped with their reason
	MOLECULE_TEST_ARGS="$(MOLECULE_TEST_ARGS)" MOLECULE_EXCEPT="$(MOLECULE_EXCEPT)" scripts/molecule.sh $(SCENARIOS)

molecule-destroy: setup  ## molecule destroy of SCENARIOS, or of all (after `make molecule MOLECULE_TEST_ARGS=--destroy=never`)
	$(if $(SCENARIOS),for s in $(SCENARIOS); do $(BIN)/molecule destroy -s $$s || exit 1; done,$(BIN)/molecule destroy --all)

# The ansible-core matrix (scripts/core_matrix.py): the declared floor and the newest release, each in a venv of its own
# under .cache/matrix: sanity, units and the installed tarball used by FQCN (render, a verify with no host, the modules).
core-floor: setup  ## ansible-core floor (2.16, Python 3.11): sanity, units, the installed tarball by FQCN (STAGES: some of venv sanity units installed)
	$(BIN)/python scripts/core_matrix.py floor $(STAGES)

core-newest: setup  ## ansible-core newest (2.21, Python 3.13): sanity, units, the installed tarball by FQCN (STAGES: as above)
	$(BIN)/python scripts/core_matrix.py newest $(STAGES)

release-check: setup  ## The built tarball as Galaxy and users get it: galaxy-importer (0 errors), ansible-builder introspect and create, antsibull-docs lint
	$(BIN)/python scripts/check_release.py

docs: setup  ## The documentation site (antsibull-docs sphinx-init, then Sphinx) into .cache/docs-site/build/html
	$(BIN)/python scripts/check_release.py docs-site

build: setup  ## ansible-galaxy collection build into .cache/dist
	@mkdir -p .cache/dist
	$(BIN)/ansible-galaxy collection build --force --output-path .cache/dist
	@scripts/check_tarball.sh .cache/dist/inference_cache-substrate-*.tar.gz

changelog: setup  ## antsibull-changelog lint
	$(BIN)/antsibull-changelog lint

argspecs: setup  ## meta/argument_specs.yml of every role matches its defaults/main.yml
	$(BIN)/python scripts/check_argument_specs.py

# Each benchmark is a client of the collection: one playbook (its engines started, the benchmark, everything stopped in
# `always`) or one Python entry over module_utils; none runs ansible-playbook (benchmarks/_lab.py restarts an engine through
# the service record its role published). `make bench` runs the Python entries that need nothing started (each skips, with
# one sentence, what needs engines); bench_site.py and bench_verify.py report the playbook runs of their .sh drivers.
# The benchmarks a playbook drives (benchmarks/<name>.yml: it starts what they measure and stops it) run through their targets.
BENCH_BY_PLAYBOOK := bench_site.py bench_verify.py bench_checks_load.py bench_routing.py bench_kv_scale.py
bench: setup bench-load bench-routing bench-kv-scale  ## Benchmarks (print numbers; not part of `make test`): those their playbooks drive, then the others
	@for b in $(filter-out $(addprefix benchmarks/,$(BENCH_BY_PLAYBOOK)),$(wildcard benchmarks/bench_*.py)); do echo "== $$b"; $(BIN)/python $$b || exit 1; done

bench-site: setup  ## Where a first `make site` spends its time: site.yml on a fresh HOME (install, model build, engine start, first verification, the rest), then the second run (changed=0, under 20 s); engine on 8500, stopped at the end (ARGS: --keep-home, --no-shared-cache, --json)
	benchmarks/bench_site.sh $(ARGS)

bench-verify: setup  ## How long `make verify` takes on the warm local default (run `make site` first): min, median, max of RUNS (5), the slowest tasks (ARGS: more ansible-playbook arguments)
	benchmarks/bench_verify.sh $(or $(RUNS),5) $(ARGS)

bench-load: setup  ## kv_index_check's core and a kv_events_check per engine over four real engines (8510-8513, stopped at the end) for MINUTES (10): bursts, evictions, one engine restarted (ARGS: more options of bench_checks_load.py)
	$(BIN)/ansible-playbook benchmarks/bench_load.yml -e '{"bench_minutes": $(or $(MINUTES),10), "bench_args": "$(ARGS)"}'

bench-routing: setup gie-epp  ## Routing policies on two real engines (port 8400 on 127.0.0.1 and 127.0.0.2, stopped at the end): the stand-in router, and real EPPs beside it: EPP=gie, EPP=/path/to/llm-d-epp or both (default: llm-d's where it can be had, else GIE's; ARGS: more options)
	$(BIN)/ansible-playbook benchmarks/bench_routing.yml -e '{"bench_epp": "$(EPP)", "bench_args": "$(ARGS)"}'

study-routing: setup gie-epp  ## The routing study: every workload of bench-routing, every policy, three seeds, into out/bench-routing/study (table, plots; EPP= as above)
	$(BIN)/ansible-playbook benchmarks/bench_routing.yml -e '{"bench_epp": "$(EPP)", "bench_args": "--workload all --repeats 3 --report $(CURDIR)/out/bench-routing/study $(ARGS)"}'

# The routing study's kwok cluster and EPP configs, which the fleet study below still uses (benchmarks/kwok_cluster.yml).
BENCH_KWOK := $(BIN)/ansible-playbook benchmarks/kwok_cluster.yml
BENCH_KWOK_DIR := $(HOME)/.cache/inference_cache/kwok_cluster/clusters/substrate-bench

# The fleet study (docs/routing-study/fleet.md): one playbook sets up the kwok cluster, the GIE router's InferencePool and 8
# simulated engines through the collection's roles, runs every policy with two seeds (benchmarks/fleet/), writes the report
# into docs/routing-study/fleet and stops everything (18 min 38 s on 2 cores, 2026-12-06; ARGS: more -e options).
study-fleet: setup  ## The fleet study: when precise routing pays over approximate (kwok cluster, GIE EPP, 8 simulated engines, 2 seeds) into docs/routing-study/fleet
	$(BIN)/ansible-playbook -i inventories/kwok benchmarks/fleet/study.yml -e fleet_study_report=$(CURDIR)/docs/routing-study/fleet $(ARGS)

bench-kv-scale: setup  ## The KV checks at scale: SCALE (32) simulated engines (bursts, evictions, restarts, injected failures), then the largest fleet one checker keeps up with on one core (ARGS: more options)
	$(BIN)/ansible-playbook benchmarks/bench_kv_scale.yml -e '{"bench_scale": $(or $(SCALE),32), "bench_args": "$(ARGS)"}'

# tools/kvcache_probe: the first build fetches github.com/llm-d/llm-d-kv-cache v0.9.0 and its modules through the Go
# module proxy (its go.sum pins them); the catalog builds it again when its sources change.
.PHONY: kvcache-probe gotest
kvcache-probe: setup  ## Build tools/kvcache_probe (llm-d-kv-cache v0.9.0's own KV-event pool, vLLM adapter and index) through the catalog of Go builds
	$(BIN)/ansible-playbook playbooks/go_build.yml -e '{"go_builds_names": ["kvcache-probe"]}'

gotest:  ## go test of the collection's own Go program (tools/kvcache_probe)
	cd tools/kvcache_probe && go test ./...

freeze:  ## Re-pin requirements-dev.txt from the current .venv
	{ echo "# Pinned development toolchain (controller). Regenerate with: make freeze"; $(BIN)/pip freeze | grep -v '^pip=='; } > requirements-dev.txt

clean:  ## Remove build and test output (keeps .venv and the local engine's state)
	rm -rf .cache/stage .cache/dist tests/output collections
