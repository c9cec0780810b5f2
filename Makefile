# foxhunt: `make run` trains on the embedded synthetic market; `make test` runs the test suite.
# Both build .venv from nothing on a fresh machine (python3 -m venv + editable installs of the
# core and of every distribution under plugins/).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PLUGIN_DIRS := $(patsubst %/pyproject.toml,%,$(wildcard plugins/*/pyproject.toml))

SEED   ?= 0
DEVICE ?= auto
FLAGS  ?= flags/stage-00-baseline.yaml
OUT    ?= runs/stage-00-seed-$(SEED)
STEPS  ?=
PYTEST_ARGS ?=
# Test processes (pytest-xdist); 0 runs the suite in this process.
TEST_WORKERS ?= 2
# Small GEMMs on two cores run best single-threaded; set it in the environment to override.
OPENBLAS_NUM_THREADS ?= 1
export OPENBLAS_NUM_THREADS

.PHONY: run test install clean

$(VENV)/.installed: pyproject.toml $(addsuffix /pyproject.toml,$(PLUGIN_DIRS))
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]' $(addprefix -e ,$(PLUGIN_DIRS))
	touch $@

install: $(VENV)/.installed

run: $(VENV)/.installed
	$(BIN)/foxhunt train --flags $(FLAGS) --out $(OUT) --seed $(SEED) --device $(DEVICE) --overwrite $(if $(STEPS),--steps $(STEPS))

test: $(VENV)/.installed
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache
