# wakustore: `make run` starts a node, `make test` runs the whole suite.
# Both install what they need first (idempotent): a virtualenv in .venv
# with the project and its test tools.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DATA_DIR ?= ./data
PYTEST_ARGS ?=
# `make run ARGS="--tcp-port 0 --shard 1"`: flags passed on to `wakustore serve`
ARGS ?=

.PHONY: install run test lint typecheck bench fuzz soak powercut protos clean interop interop-deps

install: $(STAMP)

# The spark engine's Delta Lake jars (pinned, checked) come from Maven
# Central into the virtualenv's cache dir (storage/spark_jars.py).
$(STAMP): pyproject.toml setup.py native/native.c storage/spark_jars.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	$(BIN)/python -m wakustore.storage.spark_jars
	touch $(STAMP)

# ARGS reaches the node word by word and never the shell: a ';' in a
# retention policy (time:86400;capacity:1000) is the policy's, not a
# command separator (values cannot hold spaces).
run: install
	@set -f; args='$(subst ','"'"',$(ARGS))'; echo "$(BIN)/wakustore serve --data-dir $(DATA_DIR) $$args"; \
	exec $(BIN)/wakustore serve --data-dir "$(DATA_DIR)" $$args

test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Static checks: ruff's linter and formatter, then mypy (strict on
# protocols/ and transport/; see pyproject.toml). mypy reads the package
# where the install finds it: src/wakustore (links, see pyproject.toml).
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(MAKE) --no-print-directory typecheck

typecheck: install
	cd src && ../$(BIN)/mypy --config-file ../pyproject.toml -p wakustore

# The interop tests against real peers (also part of `make test`):
# js-waku and @chainsafe/discv5 from npm (tests/interop, `npm ci`), and
# go-waku's node and the status-go store client harness (go-waku's
# waku/v2/api packages) built through the Go module proxy from the pinned
# module in tests/interop_gowaku/build (kept under .cache/gowaku; a rerun
# reuses them). interop-deps installs them ahead of time; the tests install
# any that is missing.
INTEROP_TESTS := tests/interop_gowaku tests/node/test_js_waku_interop.py \
	tests/node/test_peer_exchange.py::test_js_waku_learns_from_our_node_a_relay_node_that_dns_discovery_found \
	tests/node/test_discv5.py::test_chainsafe_discv5_on_d5waku_finds_our_nodes_and_ours_handshake_with_it \
	tests/node/test_hostile_peers.py::test_js_waku_pages_through_a_key_rotating_query_flood

interop-deps: install
	test -x tests/interop/node_modules/.bin/node || (cd tests/interop && npm ci --no-audit --no-fund)
	$(BIN)/python tests/interop_gowaku/gowaku_build.py

interop: interop-deps
	$(BIN)/python -m pytest $(INTEROP_TESTS) $(PYTEST_ARGS)

bench: install
	$(BIN)/wakustore bench store

# Coverage-guided fuzzing of every network decoder (tests/fuzz/run_fuzz.py),
# one target after the other on one core; not part of `make test`, which
# runs a small budget of the same targets.
FUZZ_RUNS ?= 1000000
FUZZ_TIME ?= 0
FUZZ_TARGETS ?=

fuzz: install
	$(BIN)/python -m pip install --quiet -e ".[test,fuzz]"
	$(BIN)/python tests/fuzz/run_fuzz.py --runs $(FUZZ_RUNS) --max-time $(FUZZ_TIME) $(FUZZ_TARGETS)

# The model-based crash test against a real node, killed and restarted,
# for as long as asked; its last line is the totals (`... 0 mismatches`).
SOAK_MINUTES ?= 30

soak: install
	$(BIN)/wakustore soak --minutes $(SOAK_MINUTES)

# The soak with power cuts: the node's data dir on a FUSE file system
# that forgets what was not fsynced (tests/powercut/); root, /dev/fuse and
# Debian's fuse3 (installed when missing). Last line: the totals
# (`... 0 lost, 0 served twice, 0 revived; ... 0 mismatches`).
POWERCUT_MINUTES ?= 30

powercut: install
	$(BIN)/python tests/powercut/powercut.py --minutes $(POWERCUT_MINUTES)

protos: install
	$(BIN)/python -m wakustore.protos.generate

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .hypothesis wakustore/_native*.so
