# wakustore: `make run` starts a node, `make test` runs the whole suite.
# Both install what they need first (idempotent): a virtualenv in .venv
# with the project and its test tools.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DATA_DIR ?= ./data
PYTEST_ARGS ?=

.PHONY: install run test bench protos clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

run: install
	$(BIN)/wakustore serve --data-dir $(DATA_DIR)

test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: install
	$(BIN)/wakustore bench store

protos: install
	$(BIN)/python -m wakustore.protos.generate

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
