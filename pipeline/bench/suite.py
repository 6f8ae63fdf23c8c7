"""`longdoc bench decode`: our engine vs transformers on one device, side by side in one run.

Contract: ``run_systems(settings, on_batch)`` loads ``settings.model`` on
``settings.device``, builds for every task (``summarize``: summary prompts of exactly
``prompt_tokens`` tokens from a folder or JSONL corpus; ``qa``: question prompts over
a JSONL corpus with questions, the document cut so the prompt has that length;
pipeline/bench/prompts.py) ``max(batch_sizes)`` prompts, and for every batch size B
runs the chosen systems (pipeline/bench/systems.py) on the first B prompts, each
generating ``new_tokens`` tokens per row (or up to EOS with ``ignore_eos`` off). It
returns one JSON-able dict (layout in pipeline/bench/results.py) and calls
``on_batch(result_so_far)`` after every (task, batch size), so a run cut short still
leaves what it finished.

Per (task, batch size) and system: one warm-up call (``new_tokens // 4`` tokens; for
hf-static-compiled the full call, which compiles), then one timed call. A system that
raises (e.g. out of GPU memory) is recorded as ``status: error`` and the run goes on; a
system not chosen, or hf-pld at a batch size above 1, is ``status: skipped`` with the reason.

Our systems run on ONE engine for the whole run, as one generate actor has
(stages/decoding/engine.py): fixed slots for the largest batch size, its CPU kernel
plan measured and (CUDA) every step shape compiled before the first timed call; its
seconds are the header's ``warm_up_s``, never part of a timed figure. A batch of B
requests is submitted at once and decoded in B slots.

Step cost of our loop: width 1 = the greedy run's decode seconds / steps. Verify
widths w: the engine decoding the same rows with prompt lookup drafting ``w - 1``
tokens every step (adaptive off) from the prompt + the greedy output (oracle drafts,
so most are accepted and most steps run at width w); ms/step = decode seconds /
steps, and the measured mean fed width is reported beside it.

Decode-only figures subtract the prefill: ours as the engine measured it, transformers'
as one forward pass over the same padded batch (systems.hf_prefill_seconds). The CPU
checks (``CPU_CHECKS``) compare decode-only tokens/s, as the project's CPU targets did.
Nightly-job figures (docs/hour, $/1k documents) per system and batch size are derived
from the timed calls (pipeline/bench/nightly.py).
"""

from __future__ import annotations

import gc
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from pipeline.bench import roofline
from pipeline.bench.nightly import FORMULA, nightly_figures
from pipeline.bench.systems import (
    SYSTEMS,
    Clock,
    Run,
    agreement,
    greedy_config,
    hf_prefill_seconds,
    make_engine,
    pld_config,
    run_hf,
    run_longdoc,
)
from pipeline.host_load import cpu_identity, cpu_label
from schemas.spec import CostSpec

#: Our systems and the drafter each runs (None: plain greedy).
OURS = {"longdoc": None, "longdoc-pld": "prompt_lookup", "longdoc-suffix": "suffix"}
TASKS = ("summarize", "qa")
#: The CPU comparisons, decode-only tokens/s measured side by side (PASS/FAIL lines).
CPU_CHECKS = (
    "longdoc >= hf-dynamic at B=1 and at the largest batch (every task)",
    "longdoc-pld >= 1.1x hf-pld at B=1 (every task)",
    "longdoc-pld >= 1.3x longdoc on QA at B=1",
    "longdoc-pld >= 0.95x longdoc (every task and batch size)",
    "greedy rows identical with and without speculation (every task and batch size)",
)


@dataclass(frozen=True)
class Settings:
    device: str = "cpu"
    model: str = "random:tiny"
    dtype: str = "auto"
    batch_sizes: tuple[int, ...] = (1, 8, 32)
    prompt_tokens: int = 1024
    new_tokens: int = 128
    systems: tuple[str, ...] = SYSTEMS
    verify_widths: tuple[int, ...] = (2, 4, 8, 16)
    corpus: str = "jobs/corpus"
    tasks: tuple[str, ...] = ("summarize",)
    ignore_eos: bool = True
    threads: int = 1
    compile: str = "auto"  # auto | inductor | cudagraphs | off (backends.compile_plan)
    hf_pld_tokens: int = 10  # transformers' prompt_lookup_num_tokens for hf-pld
    min_rows: int = 1  # at batch size B, decode max(B, min_rows) prompts in batches of B (steadier small B)
    usd_per_device_hour: float = CostSpec().usd_per_device_hour  # the spec's default price
    command: str = field(default="", compare=False)


def check_settings(s: Settings) -> None:
    """ValueError naming the option and what is allowed."""
    from stages.decoding.backends import compile_plan, device_backend

    if s.device not in ("cpu", "cuda"):
        raise ValueError(f"--device {s.device!r} not supported; allowed: cpu, cuda")
    if not device_backend(s.device).is_available(torch.device(s.device)):
        raise ValueError(f"--device {s.device}: no {s.device.upper()} device is visible to torch")
    bad = [x for x in s.systems if x not in SYSTEMS]
    if bad or not s.systems:
        raise ValueError(f"--systems {','.join(s.systems)!r}: allowed: a comma list of {', '.join(SYSTEMS)}")
    if not s.batch_sizes or min(s.batch_sizes) < 1 or max(s.batch_sizes) > 256:
        raise ValueError(f"--batch-sizes {s.batch_sizes}: allowed: integers 1..256")
    if s.new_tokens < 2:
        raise ValueError(f"--new-tokens {s.new_tokens}: allowed: >= 2 (the first token comes from the prefill)")
    if any(w < 2 for w in s.verify_widths):
        raise ValueError(f"--verify-widths {s.verify_widths}: allowed: widths >= 2")
    if not s.tasks or any(t not in TASKS for t in s.tasks):
        raise ValueError(f"--tasks {','.join(s.tasks)!r}: allowed: a comma list of {', '.join(TASKS)}")
    if s.min_rows < 1:
        raise ValueError(f"--min-rows {s.min_rows}: allowed: >= 1")
    if s.hf_pld_tokens < 1:
        raise ValueError(f"--hf-pld-tokens {s.hf_pld_tokens}: allowed: >= 1")
    try:
        compile_plan(s.compile, torch.device(s.device))
    except ValueError as e:
        raise ValueError(f"--{e}") from None
    if s.usd_per_device_hour < 0:
        raise ValueError(f"--usd-per-device-hour {s.usd_per_device_hour}: allowed: >= 0")


def _on_host(device: torch.device) -> bool:
    """The host's CPU runs the bench (its threads, DRAM bandwidth and CPU checks apply)."""
    from stages.decoding.backends import device_backend

    return device_backend(device).runs_on_host(device)


def _free(device: torch.device) -> None:
    from stages.decoding.backends import device_backend

    gc.collect()
    device_backend(device).empty_cache(device)


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _header(s: Settings, device: torch.device, model, clock: Clock) -> dict:
    import transformers

    name = roofline.device_name(device)
    measured = roofline.measure_bandwidth(device)
    nominal = roofline.nominal_bandwidth(device, name)  # None on the host (no data sheet)
    params = sum(p.numel() for p in model.parameters())
    return {
        "bench": "decode",
        "layout_version": 2,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": s.command,
        "device": {
            "type": device.type, "name": name, "torch_threads": torch.get_num_threads(),
            "bandwidth_measured_GBps": measured / 1e9,
            "bandwidth_nominal_GBps": nominal / 1e9 if nominal else None,
            "clock": clock.name,
            # vendor, family/model and ISA features ({} off Linux): the brand string alone
            # says "Intel(R) Xeon(R) Processor" under KVM, whichever generation it is
            **({"cpu": cpu_identity()} if _on_host(device) else {}),
        },
        "versions": {
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "longdoc_commit": _git_commit(),
        },
        "model": {
            "name": s.model, "parameters": params, "dtype": str(next(model.parameters()).dtype),
            "weight_bytes_per_step": roofline.weight_bytes_per_step(model),
            "kv_bytes_per_token": roofline.kv_bytes_per_token(model),
        },
        "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(s).items() if k != "command"},
        "systems": {
            x: ({"status": "ok"} if x in s.systems else {"status": "skipped", "reason": "not in --systems"})
            for x in SYSTEMS
        },
        "results": [],
        "notes": _notes(s, device),
    }


def _notes(s: Settings, device: torch.device) -> list[str]:
    notes = [
        "tok/s = generated tokens / seconds of the whole call (prefill + decode); decode_tok_s "
        "subtracts the batch's prefill (ours: measured by the engine; transformers': one forward "
        "pass over the same padded batch, measured).",
        "Prompts: summarize = long-document summary requests cut to exactly prompt_tokens tokens; "
        "qa = a question over a document cut so the prompt has prompt_tokens tokens.",
        f"clock: {Clock(device).name}; one warm-up call per system and batch size "
        "(hf-static-compiled: the timed call is the 2nd, after compilation).",
        "Our systems run on one engine (stages/decoding/engine.py) made once, with fixed slots for "
        "the largest batch size; its construction and warm-up (the CPU kernel plan, the compiled step "
        "shapes on CUDA) is the header's warm_up_s, outside every timed figure.",
        "Agreement: rows of a system identical to longdoc greedy token for token, and the earliest token "
        "where a row diverges, in the model's dtype (exact in fp32; bf16 reductions depend on the verify "
        "width and the kernels, so there it is a measured figure).",
        FORMULA + f" Price: usd_per_device_hour = {s.usd_per_device_hour:g} (--usd-per-device-hour; "
        f"the spec's default cost.usd_per_device_hour is {CostSpec().usd_per_device_hour:g}).",
    ]
    if _on_host(device):
        notes.append("CPU roofline: DRAM copy bandwidth at the bench's thread count; a model whose weights "
                     "fit in the CPU caches (random:tiny: 13 MB) can run above it.")
    if s.ignore_eos:
        notes.append("EOS ignored: every row generates exactly new_tokens tokens in every system.")
    if s.model.startswith("random:"):
        notes.append("Random weights: outputs are meaningless and prompt-lookup acceptance is NOT "
                     "representative of a trained model; the cost per step is.")
    return notes


def _system_record(run: Run, prefill_s: float | None, drafts: bool) -> dict:
    pre = run.prefill_s if run.prefill_s is not None else prefill_s
    decode_s = run.seconds - pre if pre is not None else None
    # Every batch's steps (Run.steps, added up by _merge_runs): the old fallback of new_tokens - 1
    # for transformers' systems counted one batch of the several run at B=1 (ms/step 4x at --min-rows 4).
    steps = run.steps
    rec = {
        "status": "ok", "tokens": run.generated, "seconds": run.seconds, "prefill_s": pre,
        "tok_s": run.generated / run.seconds if run.seconds > 0 else None,
        "decode_tok_s": run.generated / decode_s if decode_s and decode_s > 0 else None,
        "ms_per_step": 1e3 * decode_s / steps if decode_s is not None and steps else None,
        "steps": steps,
    }
    if drafts:
        rec.update(drafted=run.drafted, accepted=run.accepted,
                   acceptance=run.accepted / run.drafted if run.drafted else 0.0)
    return rec


def _merge_runs(runs: list[Run]) -> Run:
    """Consecutive batches of one system as one run: rows, seconds, steps and drafts added up."""
    pre = [r.prefill_s for r in runs]
    return Run(
        tokens=[t for r in runs for t in r.tokens], seconds=sum(r.seconds for r in runs),
        prefill_s=None if None in pre else sum(pre), steps=sum(r.steps for r in runs),
        row_steps=sum(r.row_steps for r in runs), drafted=sum(r.drafted for r in runs),
        accepted=sum(r.accepted for r in runs),
    )


def _one_size(s: Settings, model, tok, engine, prompts, b: int, device, clock) -> tuple[dict, dict[str, Run]]:
    """Every chosen system at batch size ``b`` over ``prompts`` (consecutive batches of ``b``):
    (record, runs by system, each the batches' sum)."""
    batches = [prompts[i : i + b] for i in range(0, len(prompts) - b + 1, b)]
    recs, parts = [], []
    for i, batch in enumerate(batches):
        rec, runs = _one_batch(s, model, tok, engine, batch, device, clock, warm=i == 0)
        recs.append(rec)
        parts.append(runs)
    runs = {x: _merge_runs([p[x] for p in parts]) for x in parts[0] if all(x in p for p in parts)}
    first = recs[0]
    rec = {"batch_size": b, "rows": b * len(batches), "systems": {}}
    pre = [r["prefill_s"] for r in recs]
    hf_pre = [r["hf_prefill_s"] for r in recs]
    rec["prefill_s"] = None if None in pre else sum(pre)
    rec["hf_prefill_s"] = None if None in hf_pre else sum(hf_pre)
    for x in SYSTEMS:
        if x in runs:
            extra = {k: v for k, v in first["systems"][x].items() if k in ("first_call_s", "peak_memory_GB")}
            rec["systems"][x] = _system_record(runs[x], rec["hf_prefill_s"],
                                               drafts=OURS.get(x) is not None) | extra
        else:
            rec["systems"][x] = next((r["systems"][x] for r in recs if r["systems"][x]["status"] == "error"),
                                     first["systems"][x])
    return rec, runs


def _one_batch(s: Settings, model, tok, engine, prompts, device, clock, warm: bool = True) -> tuple[dict, dict[str, Run]]:
    """Every chosen system on one batch: (record, runs by system). ``engine``: the run's one Engine;
    ``warm``: make each system's warm-up call first (the first batch of a batch size)."""
    from stages.decoding.backends import device_backend

    n, eos = s.new_tokens, frozenset() if s.ignore_eos else frozenset([tok.eos_token_id])
    warm_n = max(2, n // 4)
    pad, eos_id = tok.pad_token_id, tok.eos_token_id

    def call(system: str, tokens: int) -> Run:
        if system in OURS:
            cfg = greedy_config(tokens, eos) if OURS[system] is None else pld_config(tokens, eos, method=OURS[system])
            return run_longdoc(engine, prompts, cfg, clock)
        return run_hf(model, prompts, tokens, pad, eos_id, clock, static_compiled=system == "hf-static-compiled",
                      ignore_eos=s.ignore_eos, prompt_lookup=s.hf_pld_tokens if system == "hf-pld" else 0)

    runs: dict[str, Run] = {}
    extra: dict[str, dict] = {}  # per system: wall seconds of the warm-up call, peak GPU memory
    rec: dict = {"batch_size": len(prompts), "systems": {}}  # one batch; _one_size adds batches up
    for system in SYSTEMS:
        if system not in s.systems:
            rec["systems"][system] = {"status": "skipped", "reason": "not in --systems"}
            continue
        if system == "hf-pld" and len(prompts) > 1:
            rec["systems"][system] = {"status": "skipped", "reason": "transformers' prompt lookup: batch size 1 only"}
            continue
        try:
            extra[system] = {}
            if warm:
                t = time.perf_counter()
                call(system, n if system == "hf-static-compiled" else warm_n)
                extra[system]["first_call_s"] = time.perf_counter() - t  # hf-static-compiled: compiles
            device_backend(device).reset_peak_memory(device)
            runs[system] = call(system, n)
            peak = device_backend(device).peak_memory_bytes(device)
            if peak is not None:  # measured where the device's allocator counts it (a GPU)
                extra[system]["peak_memory_GB"] = peak / 1e9
        except Exception as e:  # noqa: BLE001 - one failing system (OOM, compile error) must not stop the others
            rec["systems"][system] = {"status": "error", "error": f"{type(e).__name__}: {e}"[:600]}
            print(f"#   {system}: {rec['systems'][system]['error']}", flush=True)
        _free(device)
    hf_prefill = None
    if any(x in runs for x in SYSTEMS if x not in OURS):
        hf_prefill = hf_prefill_seconds(model, prompts, pad, clock)
    rec["prefill_s"] = next((runs[x].prefill_s for x in OURS if x in runs), None)
    rec["hf_prefill_s"] = hf_prefill
    for system, run in runs.items():
        rec["systems"][system] = _system_record(run, hf_prefill, drafts=OURS.get(system) is not None) | extra[system]
    rec["systems"] = {x: rec["systems"][x] for x in SYSTEMS}  # one key order in every file
    return rec, runs


def _first_batch_greedy(run: Run, b: int) -> Run:
    """The greedy run's first batch as a Run with its mean step figures (for the width probe)."""
    batches = max(1, len(run.tokens) // b)
    return Run(tokens=run.tokens[:b], seconds=run.seconds / batches,
               prefill_s=None if run.prefill_s is None else run.prefill_s / batches,
               steps=max(1, run.steps // batches))


def _step_costs(s: Settings, tok, prompts, greedy: Run | None, engine, device, clock) -> dict:
    """ms per step of our loop at width 1 and at the verify widths (see the module docstring)."""
    out: dict = {}
    if greedy is None or greedy.prefill_s is None:
        return out
    out["1"] = {"ms": 1e3 * (greedy.seconds - greedy.prefill_s) / greedy.steps, "mean_width": 1.0}
    eos = frozenset() if s.ignore_eos else frozenset([tok.eos_token_id])
    for w in s.verify_widths:
        # The greedy output + w pad tokens after the prompt: every emitted token's suffix
        # matches in the copied output with >= w - 1 tokens after it, so drafts are full length.
        lookups = [p + t + [tok.pad_token_id] * w for p, t in zip(prompts, greedy.tokens, strict=True)]
        try:
            run_longdoc(engine, prompts, pld_config(max(2, s.new_tokens // 4), eos, draft_tokens=w - 1), clock, lookups)
            run = run_longdoc(engine, prompts, pld_config(s.new_tokens, eos, draft_tokens=w - 1), clock, lookups)
            out[str(w)] = {
                "ms": 1e3 * (run.seconds - run.prefill_s) / run.steps,
                "mean_width": 1 + run.drafted / max(run.row_steps, 1),
            }
        except Exception as e:  # noqa: BLE001
            out[str(w)] = {"error": f"{type(e).__name__}: {e}"[:300]}
        _free(device)
    return out


def _derived(rec: dict, runs: dict[str, Run], s: Settings, model, bandwidth: float) -> None:
    """Agreement with plain greedy, ratios, roofline: added to ``rec`` in place."""
    b = rec["batch_size"]
    if "longdoc" in runs:
        ref = runs["longdoc"].tokens
        rec["agreement_with_longdoc"] = {x: agreement(ref, r.tokens) for x, r in runs.items() if x != "longdoc"}
        rec["agreement_dtype"] = str(next(model.parameters()).dtype)  # exact in fp32; measured in bf16
    tok_s = {x: r["tok_s"] for x, r in rec["systems"].items() if r.get("status") == "ok"}
    dec = {x: r["decode_tok_s"] for x, r in rec["systems"].items() if r.get("status") == "ok" and r.get("decode_tok_s")}
    base = tok_s.get("hf-static-compiled")
    rec["ratio_vs_hf_static_compiled"] = {x: v / base for x, v in tok_s.items()} if base else None
    rec["decode_ratio_vs_hf_dynamic"] = {x: v / dec["hf-dynamic"] for x, v in dec.items()} if "hf-dynamic" in dec else None
    for ours, key in (("longdoc-pld", "pld_over_greedy"), ("longdoc-suffix", "suffix_over_greedy")):
        if "longdoc" in tok_s and ours in tok_s:
            rec[key] = tok_s[ours] / tok_s["longdoc"]
    if "longdoc-pld" in dec and "hf-pld" in dec:
        rec["pld_over_hf_pld_decode"] = dec["longdoc-pld"] / dec["hf-pld"]
    w, kv = roofline.step_bytes(model, b, s.prompt_tokens + s.new_tokens // 2)
    rec["roofline"] = {
        "weights_tok_s": roofline.roofline_tok_s(b, w, 0, bandwidth),
        "weights_kv_tok_s": roofline.roofline_tok_s(b, w, kv, bandwidth),
        "bytes_per_step": w + kv,
    }
    rec["nightly"] = nightly_figures(rec, s.usd_per_device_hour)


def cpu_checks(results: list[dict]) -> list[tuple[str, bool | None]]:
    """(check, passed) for CPU_CHECKS over the records; None where this run measured too little."""

    def dec(r: dict, x: str) -> float | None:
        sys_ = r["systems"].get(x, {})
        return sys_.get("decode_tok_s") if sys_.get("status") == "ok" else None

    def every(pairs: list[tuple[float | None, float | None]], factor: float) -> bool | None:
        got = [(a, b) for a, b in pairs if a is not None and b is not None]
        return all(a >= factor * b for a, b in got) if got else None

    largest = max((r["batch_size"] for r in results), default=1)
    ident = [r.get("agreement_with_longdoc", {}).get("longdoc-pld", {}).get("rows_identical") for r in results]
    ident = [x for x in ident if x is not None]
    return list(zip(CPU_CHECKS, [
        every([(dec(r, "longdoc"), dec(r, "hf-dynamic")) for r in results if r["batch_size"] in (1, largest)], 1.0),
        every([(dec(r, "longdoc-pld"), dec(r, "hf-pld")) for r in results if r["batch_size"] == 1], 1.1),
        every([(dec(r, "longdoc-pld"), dec(r, "longdoc")) for r in results
               if r["batch_size"] == 1 and r.get("task") == "qa"], 1.3),
        every([(dec(r, "longdoc-pld"), dec(r, "longdoc")) for r in results], 0.95),
        all(x == 1.0 for x in ident) if ident else None,
    ], strict=True))


def _prompts(s: Settings, tok, task: str) -> list[list[int]]:
    from pipeline.bench.prompts import qa_prompts, summary_prompts

    rows = max(max(s.batch_sizes), s.min_rows)
    if task == "qa":
        return qa_prompts(tok, s.corpus, rows, s.prompt_tokens)
    return summary_prompts(tok, s.corpus, rows, s.prompt_tokens)


def run_systems(s: Settings, on_batch: Callable[[dict], None] | None = None) -> dict:
    """The whole comparison; see the module docstring."""
    from stages.model_loading import load_causal_lm

    check_settings(s)
    device = torch.device(s.device)
    if _on_host(device) and s.threads > 0:
        torch.set_num_threads(s.threads)
    clock = Clock(device)
    t = time.perf_counter()
    model, tok = load_causal_lm(s.model, s.dtype, device)
    cpu = cpu_label(cpu_identity()) if _on_host(device) else None
    print(f"# bench decode: {s.model} on {device}{f' ({cpu})' if cpu else ''} loaded in "
          f"{time.perf_counter() - t:.1f}s", flush=True)
    result = _header(s, device, model, clock)
    bandwidth = result["device"]["bandwidth_measured_GBps"] * 1e9
    engine = None
    if any(x in s.systems for x in OURS):
        # One engine for every batch size and system, as one actor has: its slots hold the
        # largest batch; its warm-up compiles the step shapes of the widest speculation.
        first = pld_config(s.new_tokens, frozenset()) if any(OURS[x] for x in s.systems if x in OURS) else \
            greedy_config(s.new_tokens, frozenset())
        engine, warm_s = make_engine(model, first, max(s.batch_sizes), s.prompt_tokens + s.new_tokens, s.compile)
        result["engine"] = engine.describe()
        result["warm_up_s"] = warm_s
        print(f"# engine {engine.describe()} made and warmed up in {warm_s:.1f}s", flush=True)
    for task in s.tasks:
        prompts = _prompts(s, tok, task)
        for b in s.batch_sizes:
            rec, runs = _one_size(s, model, tok, engine, prompts[: max(b, s.min_rows)], b, device, clock)
            rec["task"] = task
            rec["created_utc"] = result["created_utc"]
            rec["longdoc_commit"] = result["versions"]["longdoc_commit"]
            greedy_first = None
            if "longdoc" in runs:  # the probe re-decodes the first batch with its greedy output as drafts
                greedy_first = _first_batch_greedy(runs["longdoc"], b)
            rec["step_ms"] = (_step_costs(s, tok, prompts[:b], greedy_first, engine, device, clock)
                              if engine is not None and s.verify_widths else {})
            _derived(rec, runs, s, model, bandwidth)
            result["results"].append(rec)
            for x, r in rec["systems"].items():
                if r["status"] == "error":
                    result["systems"][x] = {"status": "error", "reason": f"{task} B={b}: {r['error']}"}
            del runs
            _free(device)
            if on_batch is not None:
                on_batch(result)
    if _on_host(device):
        result["cpu_checks"] = [{"check": c, "passed": ok} for c, ok in cpu_checks(result["results"])]
    return result


def command_line() -> str:
    """The command as typed: ``longdoc bench decode ...`` or ``python -m pipeline.bench.command ...``."""
    if not sys.argv:
        return ""
    head = "python -m pipeline.bench.command" if sys.argv[0].endswith("command.py") else "longdoc"
    return " ".join([head] + sys.argv[1:])
