"""`longdoc bench decode --suite systems`: our engine vs transformers on one device, one run.

Contract: ``run_systems(settings, on_batch)`` loads ``settings.model`` on
``settings.device``, builds ``max(batch_sizes)`` summary prompts of exactly
``prompt_tokens`` tokens (pipeline/bench/prompts.py), and for every batch size B
runs the chosen systems (pipeline/bench/systems.py) on the first B prompts, each
generating ``new_tokens`` tokens per row. It returns one JSON-able dict (layout in
pipeline/bench/results.py) and calls ``on_batch(result_so_far)`` after every batch
size, so a run cut short still leaves the sizes it finished.

Per batch size and system: one warm-up call (``new_tokens // 4`` tokens; for
hf-static-compiled the full call, which compiles), then one timed call. A system
that raises (e.g. out of GPU memory) is recorded as ``status: error`` and the run
goes on; a system not chosen is ``status: skipped`` with the reason.

Step cost of our loop: width 1 = the greedy run's decode seconds / steps. Verify
widths w: our engine decoding the same rows with prompt lookup, drafting ``w - 1``
tokens every step (adaptive off) from the prompt + the greedy output (oracle drafts,
so most are accepted and most steps run at width w), on an engine state of its own
so it teaches the timed systems nothing; ms/step = decode seconds / steps, and the
measured mean fed width is reported beside it.

Engine (``--engine``, pipeline/bench/slot_systems.py): ``static`` runs longdoc and
longdoc-pld on stages.decoding.slot_engine.SlotEngine (continuous batching over
static KV slots, steps compiled as CUDA graphs on CUDA): ONE engine for the whole
run, as one generate actor has, with slots for the largest batch size and widths up
to the widest step; it is made and warmed up (every step shape compiled) before the
first batch, its seconds are the header's ``warm_up_s``, never part of a timed
figure. The verify-width probe uses it too, with oracle drafts as above.
``dynamic`` runs them on stages.decoding.engine.decode. ``auto``: static on CUDA,
dynamic on CPU.

Nightly-job figures (docs/hour, $/1k documents) per system and batch size are
derived from the timed calls (pipeline/bench/nightly.py).
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
from pipeline.bench.slot_systems import (
    ENGINE_NOTES,
    GREEDY,
    PLD,
    drafts_for,
    resolve_engine,
    run_slot,
    warmed_slot_engine,
    widest_step,
)
from pipeline.bench.systems import (
    SYSTEMS,
    Clock,
    Run,
    agreement,
    greedy_config,
    make_engine,
    pld_config,
    run_hf,
    run_longdoc,
)
from schemas.spec import CostSpec


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
    ignore_eos: bool = True
    threads: int = 1
    engine: str = "auto"  # auto | dynamic | static (slot_systems.resolve_engine)
    compile: str = "auto"  # static engine: auto | inductor | cudagraphs | off (slot_engine.compile_plan)
    usd_per_device_hour: float = CostSpec().usd_per_device_hour  # the spec's default price
    command: str = field(default="", compare=False)


def check_settings(s: Settings) -> None:
    """ValueError naming the option and what is allowed."""
    if s.device not in ("cpu", "cuda"):
        raise ValueError(f"--device {s.device!r} not supported; allowed: cpu, cuda")
    if s.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is visible to torch")
    bad = [x for x in s.systems if x not in SYSTEMS]
    if bad or not s.systems:
        raise ValueError(f"--systems {','.join(s.systems)!r}: allowed: a comma list of {', '.join(SYSTEMS)}")
    if not s.batch_sizes or min(s.batch_sizes) < 1:
        raise ValueError(f"--batch-sizes {s.batch_sizes}: allowed: positive integers")
    if s.new_tokens < 2:
        raise ValueError(f"--new-tokens {s.new_tokens}: allowed: >= 2 (the first token comes from the prefill)")
    if any(w < 2 for w in s.verify_widths):
        raise ValueError(f"--verify-widths {s.verify_widths}: allowed: widths >= 2")
    resolve_engine(s.engine, torch.device(s.device))
    from stages.decoding.slot_engine import compile_plan

    try:
        compile_plan(s.compile, torch.device(s.device))
    except ValueError as e:
        raise ValueError(f"--{e}") from None
    if s.usd_per_device_hour < 0:
        raise ValueError(f"--usd-per-device-hour {s.usd_per_device_hour}: allowed: >= 0")


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


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
    nominal = roofline.nominal_bandwidth(name) if device.type == "cuda" else None
    params = sum(p.numel() for p in model.parameters())
    return {
        "bench": "decode-systems",
        "layout_version": 1,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": s.command,
        "device": {
            "type": device.type, "name": name, "torch_threads": torch.get_num_threads(),
            "bandwidth_measured_GBps": measured / 1e9,
            "bandwidth_nominal_GBps": nominal / 1e9 if nominal else None,
            "clock": clock.name,
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
        "subtracts the batch's prefill (ours, measured; for HF systems the same prefill is assumed).",
        "Prompts: long-document summary requests from the corpus, cut to exactly prompt_tokens tokens.",
        f"clock: {Clock(device).name}; one warm-up call per system and batch size "
        "(hf-static-compiled: the timed call is the 2nd, after compilation).",
        ENGINE_NOTES[resolve_engine(s.engine, device)],
        "Agreement: rows of a system identical to longdoc greedy token for token, and the earliest token "
        "where a row diverges, in the model's dtype (exact in fp32; bf16 reductions depend on the verify "
        "width and the kernels, so there it is a measured figure).",
        FORMULA + f" Price: usd_per_device_hour = {s.usd_per_device_hour:g} (--usd-per-device-hour; "
        f"the spec's default cost.usd_per_device_hour is {CostSpec().usd_per_device_hour:g}).",
    ]
    if device.type == "cpu":
        notes.append("CPU roofline: DRAM copy bandwidth at the bench's thread count; a model whose weights "
                     "fit in the CPU caches (random:tiny: 13 MB) can run above it.")
    if s.ignore_eos:
        notes.append("EOS ignored: every row generates exactly new_tokens tokens in every system.")
    if s.model.startswith("random:"):
        notes.append("Random weights: outputs are meaningless and prompt-lookup acceptance is NOT "
                     "representative of a trained model; the cost per step is.")
    return notes


def _system_record(run: Run, prefill_s: float | None, new_tokens: int, pld: bool) -> dict:
    pre = run.prefill_s if run.prefill_s is not None else prefill_s
    decode_s = run.seconds - pre if pre is not None else None
    steps = run.steps or (new_tokens - 1)
    rec = {
        "status": "ok", "tokens": run.generated, "seconds": run.seconds,
        "tok_s": run.generated / run.seconds if run.seconds > 0 else None,
        "decode_tok_s": run.generated / decode_s if decode_s and decode_s > 0 else None,
        "ms_per_step": 1e3 * decode_s / steps if decode_s is not None and steps else None,
        "steps": steps,
    }
    if pld:
        rec.update(drafted=run.drafted, accepted=run.accepted,
                   acceptance=run.accepted / run.drafted if run.drafted else 0.0)
    return rec


def _one_batch(s: Settings, model, tok, engine, prompts, device, clock, static=None) -> tuple[dict, dict[str, Run]]:
    """Every chosen system on one batch: (record, runs by system). ``engine``: the dynamic
    engine's state, or None; ``static``: the run's one SlotEngine (see the module docstring)."""
    n, eos = s.new_tokens, frozenset() if s.ignore_eos else frozenset([tok.eos_token_id])
    warm_n = max(2, n // 4)
    pad, eos_id = tok.pad_token_id, tok.eos_token_id
    def call(system: str, tokens: int) -> Run:
        if static is not None and system in (GREEDY, PLD):
            cfg = greedy_config(tokens, eos) if system == GREEDY else pld_config(tokens, eos)
            return run_slot(static, model, prompts, cfg, pad, clock)
        if system == "longdoc":
            return run_longdoc(engine, model, prompts, greedy_config(tokens, eos), pad, clock)
        if system == "longdoc-pld":
            return run_longdoc(engine, model, prompts, pld_config(tokens, eos), pad, clock)
        return run_hf(model, prompts, tokens, pad, eos_id, clock, static_compiled=system == "hf-static-compiled",
                      ignore_eos=s.ignore_eos)

    runs: dict[str, Run] = {}
    extra: dict[str, dict] = {}  # per system: wall seconds of the warm-up call, peak GPU memory
    rec: dict = {"batch_size": len(prompts), "systems": {}}
    for system in SYSTEMS:
        if system not in s.systems:
            rec["systems"][system] = {"status": "skipped", "reason": "not in --systems"}
            continue
        try:
            extra[system] = {}
            if static is not None and system in (GREEDY, PLD):
                extra[system]["engine"] = static.describe()
            t = time.perf_counter()
            call(system, n if system == "hf-static-compiled" else warm_n)
            extra[system]["first_call_s"] = time.perf_counter() - t  # hf-static-compiled: compiles
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            runs[system] = call(system, n)
            if device.type == "cuda":
                extra[system]["peak_memory_GB"] = torch.cuda.max_memory_allocated(device) / 1e9
        except Exception as e:  # noqa: BLE001 - one failing system (OOM, compile error) must not stop the others
            rec["systems"][system] = {"status": "error", "error": f"{type(e).__name__}: {e}"[:600]}
            print(f"#   {system}: {rec['systems'][system]['error']}", flush=True)
        _free(device)
    prefill = next((runs[x].prefill_s for x in ("longdoc", "longdoc-pld") if x in runs), None)
    rec["prefill_s"] = prefill
    for system, run in runs.items():
        rec["systems"][system] = _system_record(run, prefill, n, pld=system == "longdoc-pld") | extra[system]
    rec["systems"] = {x: rec["systems"][x] for x in SYSTEMS}  # one key order in every file
    return rec, runs


def _step_costs(s: Settings, model, tok, prompts, greedy: Run | None, device, clock, kind: str,
                static=None) -> dict:
    """ms per step of our loop at width 1 and at the verify widths (see the module docstring).
    ``kind``: static | dynamic; ``static``: the run's SlotEngine."""
    out: dict = {}
    if greedy is None or greedy.prefill_s is None:
        return out
    out["1"] = {"ms": 1e3 * (greedy.seconds - greedy.prefill_s) / greedy.steps, "mean_width": 1.0}
    if not s.verify_widths:
        return out
    from stages.decoding.adaptive import Tuning

    if kind == "dynamic":
        probe = make_engine(model, device)
        runner = run_longdoc
    else:
        probe = static
        runner = run_slot
    # Earliest match + k pad tokens after the greedy output: every emitted token's suffix
    # matches inside the copied output with >= k tokens after it, so drafts are full length.
    earliest = Tuning(prefer="earliest")
    eos = frozenset() if s.ignore_eos else frozenset([tok.eos_token_id])
    for w in s.verify_widths:
        lookups = [p + t + [tok.pad_token_id] * w for p, t in zip(prompts, greedy.tokens, strict=True)]
        if kind == "static" and w > widest_step(probe):
            out[str(w)] = {"error": f"wider than the static engine's widest step ({widest_step(probe)})"}
            continue
        try:
            cfg = pld_config(s.new_tokens, eos, draft_tokens=w - 1)
            runner(probe, model, prompts, pld_config(max(2, s.new_tokens // 4), eos, draft_tokens=w - 1),
                   tok.pad_token_id, clock, lookups, earliest)
            run = runner(probe, model, prompts, cfg, tok.pad_token_id, clock, lookups, earliest)
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
    base = tok_s.get("hf-static-compiled")
    rec["ratio_vs_hf_static_compiled"] = {x: v / base for x, v in tok_s.items()} if base else None
    if "longdoc" in tok_s and "longdoc-pld" in tok_s:
        rec["pld_over_greedy"] = tok_s["longdoc-pld"] / tok_s["longdoc"]
    w, kv = roofline.step_bytes(model, b, s.prompt_tokens + s.new_tokens // 2)
    rec["roofline"] = {
        "weights_tok_s": roofline.roofline_tok_s(b, w, 0, bandwidth),
        "weights_kv_tok_s": roofline.roofline_tok_s(b, w, kv, bandwidth),
        "bytes_per_step": w + kv,
    }
    rec["nightly"] = nightly_figures(rec, s.usd_per_device_hour)


def run_systems(s: Settings, on_batch: Callable[[dict], None] | None = None) -> dict:
    """The whole comparison; see the module docstring."""
    from pipeline.bench.prompts import summary_prompts
    from stages.model_loading import load_causal_lm

    check_settings(s)
    device = torch.device(s.device)
    if device.type == "cpu" and s.threads > 0:
        torch.set_num_threads(s.threads)
    clock = Clock(device)
    t = time.perf_counter()
    model, tok = load_causal_lm(s.model, s.dtype, device)
    print(f"# bench decode (systems): {s.model} on {device} loaded in {time.perf_counter() - t:.1f}s", flush=True)
    result = _header(s, device, model, clock)
    bandwidth = result["device"]["bandwidth_measured_GBps"] * 1e9
    prompts = summary_prompts(tok, s.corpus, max(s.batch_sizes), s.prompt_tokens)
    kind = resolve_engine(s.engine, device)
    result["engine_kind"] = kind
    engine = make_engine(model, device) if kind == "dynamic" else None
    static = None
    if engine is not None:
        result["engine"] = "dynamic: " + (engine.describe() if hasattr(engine, "describe") else type(engine).__name__)
    elif GREEDY in s.systems or PLD in s.systems:
        # One engine for every batch size and both systems, as one actor has: its slots
        # hold the largest batch, its widths the widest step; batch and width are
        # symbolic to the compiler, so its few graphs serve every run.
        widest = max([drafts_for(PLD), *(w - 1 for w in s.verify_widths)])
        static, warm_s = warmed_slot_engine(model, max(s.batch_sizes), widest, s.prompt_tokens, s.new_tokens, s.compile)
        result["engine"] = f"static: {static.describe()}"
        result["warm_up_s"] = warm_s
        print(f"# static engine {static.describe()} warmed up in {warm_s:.1f}s", flush=True)
    for b in s.batch_sizes:
        rec, runs = _one_batch(s, model, tok, engine, prompts[:b], device, clock, static)
        rec["created_utc"] = result["created_utc"]
        rec["longdoc_commit"] = result["versions"]["longdoc_commit"]
        rec["step_ms"] = _step_costs(s, model, tok, prompts[:b], runs.get("longdoc"), device, clock, kind, static)
        _derived(rec, runs, s, model, bandwidth)
        result["results"].append(rec)
        for x, r in rec["systems"].items():
            if r["status"] == "error":
                result["systems"][x] = {"status": "error", "reason": f"B={b}: {r['error']}"}
        del runs
        _free(device)
        if on_batch is not None:
            on_batch(result)
    return result


def command_line() -> str:
    """The command as typed: ``longdoc bench decode ...`` or ``python -m pipeline.bench.command ...``."""
    if not sys.argv:
        return ""
    head = "python -m pipeline.bench.command" if sys.argv[0].endswith("command.py") else "longdoc"
    return " ".join([head] + sys.argv[1:])
