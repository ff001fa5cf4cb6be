# upscale: two commands on a fresh machine.
#   make demo   -> creates .venv, installs, runs the main job end to end on embedded defaults
#   make test   -> creates .venv, installs, runs ruff and the test suite (slow tests excluded)
PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
PYTEST_ARGS ?=

.PHONY: venv demo test test-slow test-all lint bench clean

venv: $(STAMP)

# torch is installed first and alone, pinned, so that pip takes the CPU wheel on disk and no
# later resolution can pull a CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[worker,dev]'
	# DeepSpeed's CPU communication op is C++ compiled on first use (a minute or two): build it here, at install,
	# rather than inside the first test or the demo's first segment.
	$(BIN)/python -c 'from upscale.workers.distributed import build_pending_op; build_pending_op()'
	rm -f $(VENV)/.installed-* && touch $@

demo: venv
	$(BIN)/upscale demo

# ruff, then the import contracts of pyproject.toml (layers; fitting pure): an upward import fails the build.
lint: venv
	$(BIN)/ruff check .
	$(BIN)/python tools/lint_imports.py

test: venv lint
	$(BIN)/pytest -m "not slow and not gpu" $(PYTEST_ARGS)

test-slow: venv
	$(BIN)/pytest -m "slow" $(PYTEST_ARGS)

test-all: venv lint
	$(BIN)/pytest $(PYTEST_ARGS)

bench: venv
	for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .upscale .pytest_cache .ruff_cache
