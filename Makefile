# One entry point for every stage. `make test` is the README's test command and what CI (.ci/run) runs.
SHELL := /bin/bash
VENV  := $(CURDIR)/.venv
BIN   := $(VENV)/bin
export PATH := $(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export ANSIBLE_FORCE_COLOR := 0
export PY_COLORS := 0
export NO_COLOR := 1

.PHONY: help setup site verify teardown render kubernetes kwok kwok-teardown test sanity units pytest integration engine lint molecule molecule-destroy build changelog argspecs bench bench-routing study-routing freeze clean

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

kwok-teardown: setup  ## Stop the kwok cluster and remove its data (the built binaries stay)
	$(BIN)/ansible-playbook -i inventories/kwok playbooks/teardown.yml

test: setup  ## Everything below, with a summary; fails if any stage fails
	@scripts/test_all.sh

sanity: setup  ## ansible-test sanity on a staged copy (no Docker)
	scripts/ansible_test.sh sanity --local --python 3.11 --color no

units: setup  ## ansible-test units on a staged copy (no Docker), then the filter plugins' tests
	scripts/ansible_test.sh units --local --python 3.11 --color no
	@# ansible-test's controller group (tests/unit/plugins/filter) never starts here: its xdist workers fail to import
	@# tests/unit/conftest.py beside pytest-ansible's collection path and it reports "no tests ran" with exit 0.
	$(BIN)/pytest -q -p no:cacheprovider tests/unit/plugins/filter

# pytest with skip reasons and the slowest tests listed; with the real engine started when none runs, and required.
PYTEST := $(BIN)/pytest -rs --durations=10
PYTEST_ENGINE := LOCAL_ENGINE_START=1 LOCAL_ENGINE_REQUIRED=1 $(PYTEST)
ENGINE_TESTS := tests/integration/test_local_engine_e2e.py tests/integration/test_kv_events_engine.py tests/integration/test_rendered_engine_commands.py \
                tests/integration/test_kvcache_probe_engine.py tests/integration/test_epp_route_engine.py

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

build: setup  ## ansible-galaxy collection build into .cache/dist
	@mkdir -p .cache/dist
	$(BIN)/ansible-galaxy collection build --force --output-path .cache/dist
	@scripts/check_tarball.sh .cache/dist/inference_cache-substrate-*.tar.gz

changelog: setup  ## antsibull-changelog lint
	$(BIN)/antsibull-changelog lint

argspecs: setup  ## meta/argument_specs.yml of every role matches its defaults/main.yml
	$(BIN)/python scripts/check_argument_specs.py

bench: setup  ## Benchmarks (print numbers; not part of `make test`)
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# Two engines of playbooks/kv_index.yml on ports of their own (not those of `make test`: 8000, 8300-8301, 5557-5558, 5700-5703);
# the second on 127.0.0.2 (the EPP tells endpoints apart by address and dials one KV port on each: 5810, through relays),
# both with --enable-scale-out (the EPP's token producer reads /v1/completions/render).
BENCH_ROUTING_JSON := {"kv_index_engines": [{"instance": "bench-a", "port": 8400, "kv_events_port": 5800, "replay_port": 5801}, {"instance": "bench-b", "host": "127.0.0.2", "port": 8401, "kv_events_port": 5802, "replay_port": 5803}], "local_engine_extra_args": ["--enable-scale-out"], "local_engine_env": {"VLLM_SERVER_DEV_MODE": "1"}}
BENCH_ROUTING_FILE := $(CURDIR)/out/bench-routing/engines.json
BENCH_ROUTING_ENGINES := -e @$(BENCH_ROUTING_FILE)
# The restart workload stops and starts one engine part way ({engine}: its instance name).
BENCH_RESTART := $(BIN)/ansible-playbook playbooks/kv_index.yml $(BENCH_ROUTING_ENGINES) -e kv_index_only={engine} -e kv_index_run_check=false
BENCH_EPP_DIR := $(CURDIR)/out/bench-routing/epp
BENCH_EPP_RENDER := -e bench_epp_dir=$(BENCH_EPP_DIR) -e bench_epp_token_url=http://127.0.0.1:8400 \
  -e '{"bench_epp_engine": {"served_model_name": "tiny", "block_size": 32, "hash_seed": "0", "topic": "kv@127.0.0.1:8400@tiny", "kv_events_port": 5810}}'
BENCH_EPP_CONFIGS := $(foreach m,precise precise-speculative approximate approximate-equal,--epp-config $(m)=$(BENCH_EPP_DIR)/$(m)/router/epp-config.yaml)

bench-routing: setup  ## Routing policies on two real engines (8400-8401, stopped at the end): the stand-in router, and the real EPP beside it given EPP=<binary> or SUBSTRATE_EPP_BINARY (ARGS: more options)
	@mkdir -p $(dir $(BENCH_ROUTING_FILE)) && printf '%s\n' '$(BENCH_ROUTING_JSON)' > $(BENCH_ROUTING_FILE); \
	rc=0; stop() { $(BIN)/ansible-playbook playbooks/kv_index.yml $(BENCH_ROUTING_ENGINES) -e kv_index_state=absent || { [ $$rc != 0 ] || rc=1; }; }; \
	trap 'stop; exit $$rc' EXIT; trap 'rc=130; exit' INT TERM; \
	$(BIN)/ansible-playbook benchmarks/epp_configs.yml $(BENCH_EPP_RENDER) || { rc=$$?; exit; }; \
	$(BIN)/ansible-playbook playbooks/kv_index.yml $(BENCH_ROUTING_ENGINES) -e kv_index_run_check=false || { rc=$$?; exit; }; \
	$(BIN)/python benchmarks/bench_routing.py --require $(if $(EPP),--epp $(EPP)) $(BENCH_EPP_CONFIGS) \
	  --restart-command "$(BENCH_RESTART) -e kv_index_state=absent && $(BENCH_RESTART) -e kv_index_state=present" $(ARGS) || rc=$$?

study-routing: setup  ## The routing study: every workload of bench-routing, every policy, three seeds, into out/bench-routing/study (table, plots; EPP= as above)
	@$(MAKE) --no-print-directory bench-routing ARGS="--workload all --repeats 3 --report $(CURDIR)/out/bench-routing/study $(ARGS)"

# The first build fetches github.com/llm-d/llm-d-kv-cache v0.9.0 and its modules through the Go module proxy (go.sum pins them).
.PHONY: kvcache-probe
kvcache-probe:  ## Build tools/kvcache_probe (llm-d-kv-cache v0.9.0's own KV-event pool, vLLM adapter and index) into .cache/bin
	@mkdir -p .cache/bin
	cd tools/kvcache_probe && go build -trimpath -buildvcs=false -o $(CURDIR)/.cache/bin/kvcache_probe .

freeze:  ## Re-pin requirements-dev.txt from the current .venv
	{ echo "# Pinned development toolchain (controller). Regenerate with: make freeze"; $(BIN)/pip freeze | grep -v '^pip=='; } > requirements-dev.txt

clean:  ## Remove build and test output (keeps .venv and the local engine's state)
	rm -rf .cache/stage .cache/dist tests/output collections
