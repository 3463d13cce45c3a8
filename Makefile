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

.PHONY: help setup site verify teardown render kubernetes kwok kwok-traffic gie-epp go-build kwok-teardown test sanity units pytest integration engine lint molecule molecule-destroy build changelog argspecs bench bench-site bench-verify bench-load bench-routing study-routing study-fleet bench-kv-scale freeze clean

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
	$(BIN)/ansible-playbook playbooks/go_build.yml -e '{"kwok_cluster_builds": ["kubernetes", "etcd", "kwok", "helm", "gie", "prometheus-operator-crds"]}'

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

# pytest with skip reasons and the slowest tests listed; with the real engine started when none runs, and required.
PYTEST := $(BIN)/pytest -rs --durations=10
PYTEST_ENGINE := LOCAL_ENGINE_START=1 LOCAL_ENGINE_REQUIRED=1 $(PYTEST)
ENGINE_TESTS := tests/integration/test_local_engine_e2e.py tests/integration/test_kv_events_engine.py tests/integration/test_rendered_engine_commands.py tests/integration/test_rendered_lmcache_commands.py \
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

# bench_site.py installs and starts an engine on a fresh HOME (minutes): `make bench-site` runs it, `make bench` does not.
bench: setup  ## Benchmarks (print numbers; not part of `make test`)
	@for b in $(filter-out benchmarks/bench_site.py,$(wildcard benchmarks/bench_*.py)); do echo "== $$b"; $(BIN)/python $$b || exit 1; done

bench-site: setup  ## Where a first `make site` spends its time: site.yml on a fresh HOME (install, model build, engine start, first verification, the rest), then the second run (changed=0, under 20 s); engine on 8500, stopped at the end (ARGS: more options)
	$(BIN)/python benchmarks/bench_site.py $(ARGS)

bench-verify: setup  ## How long `make verify` takes on the warm local default (run `make site` first): min, median, max of RUNS (5), the slowest tasks
	$(BIN)/python benchmarks/bench_verify.py --runs $(or $(RUNS),5) $(ARGS)

# Four engines of playbooks/kv_index.yml (72 KV blocks each) on ports of their own (8510-8513, replay 5911-5917), each
# binding its KV-event endpoint (an ipc:// path under out/bench-load), so that kv_index_check's core and one
# kv_events_check per engine subscribe to the same stream; the restart stops and starts one engine part way.
BENCH_LOAD_DIR := $(CURDIR)/out/bench-load
BENCH_LOAD_FILE := $(BENCH_LOAD_DIR)/engines.json
BENCH_LOAD_JSON := {"kv_index_engines": [{"instance": "load-a", "port": 8510, "kv_events_port": 5910, "replay_port": 5911, "kv_events_endpoint": "ipc://$(BENCH_LOAD_DIR)/load-a.kv"}, {"instance": "load-b", "port": 8511, "kv_events_port": 5912, "replay_port": 5913, "kv_events_endpoint": "ipc://$(BENCH_LOAD_DIR)/load-b.kv"}, \
  {"instance": "load-c", "port": 8512, "kv_events_port": 5914, "replay_port": 5915, "kv_events_endpoint": "ipc://$(BENCH_LOAD_DIR)/load-c.kv"}, {"instance": "load-d", "port": 8513, "kv_events_port": 5916, "replay_port": 5917, "kv_events_endpoint": "ipc://$(BENCH_LOAD_DIR)/load-d.kv"}]}
BENCH_LOAD_ENGINES := $(BIN)/ansible-playbook playbooks/kv_index.yml -e @$(BENCH_LOAD_FILE) -e kv_index_run_check=false
BENCH_LOAD_RESTART := $(BENCH_LOAD_ENGINES) -e kv_index_only={engine}

bench-load: setup  ## kv_index_check's core and a kv_events_check per engine over four real engines (8510-8513, stopped at the end) for MINUTES (10): bursts, evictions, one engine restarted (ARGS: more options)
	@mkdir -p $(BENCH_LOAD_DIR) && printf '%s\n' '$(BENCH_LOAD_JSON)' > $(BENCH_LOAD_FILE); \
	rc=0; stop() { $(BENCH_LOAD_ENGINES) -e kv_index_state=absent || { [ $$rc != 0 ] || rc=1; }; }; \
	trap 'stop; exit $$rc' EXIT; trap 'rc=130; exit' INT TERM; \
	$(BENCH_LOAD_ENGINES) || { rc=$$?; exit; }; \
	$(BIN)/python benchmarks/bench_checks_load.py --require --engines-file $(BENCH_LOAD_FILE) --minutes $(or $(MINUTES),10) \
	  --restart-command "$(BENCH_LOAD_RESTART) -e kv_index_state=absent && $(BENCH_LOAD_RESTART) -e kv_index_state=present" $(ARGS) || rc=$$?

# Two engines of playbooks/kv_index.yml on ports of their own (not those of `make test`: 8000, 8300-8301, 5557-5558, 5700-5703):
# one port, 8400, on 127.0.0.1 and 127.0.0.2 (an InferencePool, the GIE EPP's, has one target port for all its pods; the
# llm-d EPP tells endpoints apart by address and dials one KV port on each: 5810, through relays), both with
# --enable-scale-out (the llm-d EPP's token producer reads /v1/completions/render).
BENCH_ROUTING_JSON := {"kv_index_engines": [{"instance": "bench-a", "port": 8400, "kv_events_port": 5800, "replay_port": 5801}, {"instance": "bench-b", "host": "127.0.0.2", "port": 8400, "kv_events_port": 5802, "replay_port": 5803}], "local_engine_extra_args": ["--enable-scale-out"], "local_engine_env": {"VLLM_SERVER_DEV_MODE": "1"}}
BENCH_ROUTING_FILE := $(CURDIR)/out/bench-routing/engines.json
BENCH_ROUTING_ENGINES := -e @$(BENCH_ROUTING_FILE)
# The restart workload stops and starts one engine part way ({engine}: its instance name).
BENCH_RESTART := $(BIN)/ansible-playbook playbooks/kv_index.yml $(BENCH_ROUTING_ENGINES) -e kv_index_only={engine} -e kv_index_run_check=false
BENCH_EPP_DIR := $(CURDIR)/out/bench-routing/epp
BENCH_EPP_RENDER := -e bench_epp_dir=$(BENCH_EPP_DIR) -e bench_epp_token_url=http://127.0.0.1:8400 \
  -e '{"bench_epp_engine": {"served_model_name": "tiny", "block_size": 32, "hash_seed": "0", "topic": "kv@127.0.0.1:8400@tiny", "kv_events_port": 5810}}'
BENCH_EPP_CONFIGS := $(foreach m,precise precise-speculative approximate approximate-equal,--epp-config $(m)=$(BENCH_EPP_DIR)/$(m)/router/epp-config.yaml) \
  $(foreach m,gie gie-equal,--gie-config $(m)=$(BENCH_EPP_DIR)/$(m)/router/epp-config.yaml)
# The GIE EPP's kwok cluster (benchmarks/kwok_cluster.yml, started and stopped by bench_routing.py; stopped here too if
# it is still there at the end).
BENCH_KWOK := $(BIN)/ansible-playbook benchmarks/kwok_cluster.yml
BENCH_KWOK_DIR := $(HOME)/.cache/inference_cache/kwok_cluster/clusters/substrate-bench

bench-routing: setup gie-epp  ## Routing policies on two real engines (port 8400 on 127.0.0.1 and 127.0.0.2, stopped at the end): the stand-in router, and real EPPs beside it: EPP=gie, EPP=/path/to/llm-d-epp or both (default: llm-d's where it can be had, else GIE's; ARGS: more options)
	@mkdir -p $(dir $(BENCH_ROUTING_FILE)) && printf '%s\n' '$(BENCH_ROUTING_JSON)' > $(BENCH_ROUTING_FILE); \
	rc=0; stop() { $(BIN)/ansible-playbook playbooks/kv_index.yml $(BENCH_ROUTING_ENGINES) -e kv_index_state=absent || { [ $$rc != 0 ] || rc=1; }; \
	  [ ! -d $(BENCH_KWOK_DIR) ] || $(BENCH_KWOK) -e kwok_cluster_state=absent || { [ $$rc != 0 ] || rc=1; }; }; \
	trap 'stop; exit $$rc' EXIT; trap 'rc=130; exit' INT TERM; \
	$(BIN)/ansible-playbook benchmarks/epp_configs.yml $(BENCH_EPP_RENDER) || { rc=$$?; exit; }; \
	$(BIN)/ansible-playbook playbooks/kv_index.yml $(BENCH_ROUTING_ENGINES) -e kv_index_run_check=false || { rc=$$?; exit; }; \
	$(BIN)/python benchmarks/bench_routing.py --require $(foreach e,$(EPP),--epp $(e)) $(BENCH_EPP_CONFIGS) \
	  --restart-command "$(BENCH_RESTART) -e kv_index_state=absent && $(BENCH_RESTART) -e kv_index_state=present" $(ARGS) || rc=$$?

study-routing: setup  ## The routing study: every workload of bench-routing, every policy, three seeds, into out/bench-routing/study (table, plots; EPP= as above)
	@$(MAKE) --no-print-directory bench-routing ARGS="--workload all --repeats 3 --report $(CURDIR)/out/bench-routing/study $(ARGS)"

# The routing study at scale (benchmarks/bench_fleet.py) over FLEET (16) simulated engines of roles/simulated_engine
# (llm-d-inference-sim v0.10.2, built on first use; 127.0.1.1-16 on port 9100, confined to loopback), each with 640 KV
# blocks of 16 tokens, 4 requests at a time, 2 ms per uncached prompt token, every KV event published at once, the
# development endpoints on (the study resets the caches between configurations): the blog-shaped workload at 75% of the
# fleet's blocks (two seeds) and its 30% control, every stand-in policy, llm-d-kv-cache's own index
# (tools/kvcache_probe) and the GIE EPP over a kwok cluster's InferencePool. Stopped at the end, also on failure.
FLEET ?= 16
FLEET_DIR := $(CURDIR)/out/bench-fleet
FLEET_ENGINES := $(BIN)/ansible-playbook playbooks/simulated_engines.yml -e simulated_engine_count=$(FLEET) \
  -e simulated_engine_block_size=16 -e simulated_engine_kv_cache_size=640 -e simulated_engine_max_model_len=2048 \
  -e simulated_engine_max_num_seqs=4 -e simulated_engine_prefill_time_per_token=2ms -e simulated_engine_event_batch_size=1 \
  -e simulated_engine_dev_mode=true
FLEET_EPP_RENDER := -e bench_epp_dir=$(FLEET_DIR)/epp -e bench_epp_token_url=http://127.0.1.1:9100 \
  -e '{"bench_epp_engine": {"served_model_name": "tiny", "block_size": 16, "hash_seed": "0", "topic": "kv@127.0.1.1:9100@tiny", "kv_events_port": 5810}}'

study-fleet: setup gie-epp kvcache-probe  ## The routing study at scale: FLEET (16) simulated engines under cache pressure, every policy against a referee that knows each engine's true cache, the GIE EPP beside them; into out/bench-fleet/study (table, plots; ARGS: more options)
	@mkdir -p $(FLEET_DIR); rc=0; stop() { $(FLEET_ENGINES) -e simulated_engine_state=absent || { [ $$rc != 0 ] || rc=1; }; \
	  [ ! -d $(BENCH_KWOK_DIR) ] || $(BENCH_KWOK) -e kwok_cluster_state=absent || { [ $$rc != 0 ] || rc=1; }; }; \
	trap 'stop; exit $$rc' EXIT; trap 'rc=130; exit' INT TERM; \
	$(BIN)/ansible-playbook benchmarks/epp_configs.yml $(FLEET_EPP_RENDER) || { rc=$$?; exit; }; \
	$(FLEET_ENGINES) -e simulated_engine_report_path=$(FLEET_DIR)/engines.json || { rc=$$?; exit; }; \
	$(BIN)/python benchmarks/bench_fleet.py --require --engines-file $(FLEET_DIR)/engines.json --workload blog:2,blog-light:1 \
	  --epp gie --gie-config gie=$(FLEET_DIR)/epp/gie/router/epp-config.yaml --gie-pool $(FLEET_DIR)/epp/gie/router/manifests.yaml \
	  --report $(FLEET_DIR)/study $(ARGS) || rc=$$?

# The KV checks at scale (benchmarks/bench_kv_scale.py): kv_events_check and kv_index_check's index over SCALE (32) simulated
# engines (127.0.1.101 on, 64 blocks each so that every engine evicts, 5% of requests failed on purpose) for a minute of
# traffic, bursts and two engine restarts; then synthetic publishers against the index checker on one CPU.
SCALE ?= 32
SCALE_DIR := $(CURDIR)/out/bench-kv-scale
SCALE_ENGINES := $(BIN)/ansible-playbook playbooks/simulated_engines.yml -e simulated_engine_name=scale -e simulated_engine_count=$(SCALE) \
  -e simulated_engine_first_address=127.0.1.101 -e simulated_engine_block_size=16 -e simulated_engine_kv_cache_size=64 \
  -e simulated_engine_max_model_len=1024 -e simulated_engine_max_num_seqs=4 -e simulated_engine_prefill_time_per_token=200us \
  -e simulated_engine_failure_injection_rate=5 -e '{"simulated_engine_failure_types": ["server_error", "rate_limit"]}'

bench-kv-scale: setup  ## The KV checks at scale: SCALE (32) simulated engines (bursts, evictions, restarts, injected failures), then the largest fleet one checker keeps up with on one core (ARGS: more options)
	@mkdir -p $(SCALE_DIR); rc=0; stop() { $(SCALE_ENGINES) -e simulated_engine_state=absent || { [ $$rc != 0 ] || rc=1; }; }; \
	trap 'stop; exit $$rc' EXIT; trap 'rc=130; exit' INT TERM; \
	$(SCALE_ENGINES) -e simulated_engine_report_path=$(SCALE_DIR)/engines.json || { rc=$$?; exit; }; \
	$(BIN)/python benchmarks/bench_kv_scale.py --require --part fleet,capacity --engines-file $(SCALE_DIR)/engines.json --cpu 0 \
	  --restart-command "$(SCALE_ENGINES) -e simulated_engine_only={engine} -e simulated_engine_state=absent && $(SCALE_ENGINES) -e simulated_engine_only={engine}" \
	  $(ARGS) || rc=$$?

# The first build fetches github.com/llm-d/llm-d-kv-cache v0.9.0 and its modules through the Go module proxy (go.sum pins them).
.PHONY: kvcache-probe
kvcache-probe:  ## Build tools/kvcache_probe (llm-d-kv-cache v0.9.0's own KV-event pool, vLLM adapter and index) into .cache/bin
	@mkdir -p .cache/bin
	cd tools/kvcache_probe && go build -trimpath -buildvcs=false -o $(CURDIR)/.cache/bin/kvcache_probe .

freeze:  ## Re-pin requirements-dev.txt from the current .venv
	{ echo "# Pinned development toolchain (controller). Regenerate with: make freeze"; $(BIN)/pip freeze | grep -v '^pip=='; } > requirements-dev.txt

clean:  ## Remove build and test output (keeps .venv and the local engine's state)
	rm -rf .cache/stage .cache/dist tests/output collections
