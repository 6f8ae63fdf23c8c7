"""`longdoc bench decode`: one decode benchmark (pipeline/bench/suite.py) behind one command.

Our engine (greedy, prompt lookup, suffix drafting) vs transformers ``generate``
(dynamic cache; static cache + torch.compile; its own prompt lookup at batch 1) on one
device, side by side in one run, with the memory roofline; JSON + Markdown under
jobs/results/bench-decode/.

Defaults depend on the device:
- CPU (a bare ``longdoc bench decode``): the embedded model on jobs/sample-qa.jsonl,
  summary and question prompts of 1024 tokens, 48 new tokens up to EOS, batch sizes
  1,4,8 (at least 4 rows per batch size), systems longdoc, longdoc-pld, longdoc-suffix,
  hf-dynamic, hf-pld, one torch thread, and the CPU checks (decode-only ratios, PASS/FAIL).
- CUDA (``--device cuda``): the GPU table, e.g. ``make bench-gpu``, which runs
    python3 -m pipeline.bench.command --device cuda --model random:llama-8b \\
        --batch-sizes 1,8,32 --prompt-tokens 1024 --new-tokens 128 --usd-per-device-hour 2.50
  (summary prompts from jobs/corpus, EOS ignored, every system; infra/README.md, "GPU
  benchmark", says what the machine needs).
Every option overrides its default. This module's import chain needs typer, torch,
transformers, pyarrow and pydantic (schemas), never ray.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from pipeline.bench.results import SYSTEMS
from pipeline.choices import Compile, Dtype, choice

Opt = Optional  # noqa: UP045 - typer needs Optional

#: Defaults per device (see the module docstring).
PRESETS = {
    "cpu": {"model": None, "batch_sizes": "1,4,8", "prompt_tokens": 1024, "new_tokens": 48,
            "systems": "longdoc,longdoc-pld,longdoc-suffix,hf-dynamic,hf-pld", "corpus": "jobs/sample-qa.jsonl",
            "tasks": "summarize,qa", "stop_at_eos": True, "verify_widths": "", "min_rows": 4},
    "cuda": {"model": None, "batch_sizes": "1,8,32", "prompt_tokens": 1024, "new_tokens": 128,
             "systems": ",".join(SYSTEMS), "corpus": "jobs/corpus", "tasks": "summarize", "stop_at_eos": False,
             "verify_widths": "2,4,8,16", "min_rows": 1},
}

#: ``--device``: the devices with presets.
Device = choice("Device", PRESETS)


def _ints(text: str, option: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{option} {text!r}: allowed: comma-separated integers, e.g. 1,8,32") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def bench_decode_command(
    device: Annotated[Device, typer.Option(help="The device benchmarked (its presets: see the command's description).")] = Device.cpu,  # noqa: E501
    model: Annotated[Opt[str], typer.Option(help="Embedded default, HF id, local path or random:<shape> (tiny, smollm2-135m, llama-1b, llama-8b).")] = None,  # noqa: E501
    dtype: Annotated[Dtype, typer.Option(help="auto: bf16 on CUDA, fp32 on CPU.")] = Dtype.auto,  # noqa: E501
    batch_sizes: Annotated[Opt[str], typer.Option(help="Comma-separated batch sizes (CPU 1,4,8; CUDA 1,8,32).")] = None,  # noqa: E501
    prompt_tokens: Annotated[Opt[int], typer.Option(help="Prompt length in tokens (default 1024).")] = None,
    new_tokens: Annotated[Opt[int], typer.Option(help="Tokens generated per row (CPU 48; CUDA 128).")] = None,
    systems: Annotated[Opt[str], typer.Option(help=f"Comma list of {', '.join(SYSTEMS)}.")] = None,
    tasks: Annotated[Opt[str], typer.Option(help="Comma list of summarize, qa (qa needs a JSONL corpus with questions).")] = None,  # noqa: E501
    verify_widths: Annotated[Opt[str], typer.Option(help="Widths to measure our step cost at (CUDA 2,4,8,16; CPU none; '' = none).")] = None,  # noqa: E501
    out: Annotated[Opt[str], typer.Option(help="Results folder (default jobs/results/bench-decode).")] = None,
    merge: Annotated[bool, typer.Option(help="Keep an earlier file's (task, batch size) records that this run does not measure (same device, model, settings).")] = False,  # noqa: E501
    compile: Annotated[Compile, typer.Option(help="How our steps are compiled: auto (cudagraphs on CUDA, eager on CPU), cudagraphs (the eager step captured as CUDA graphs, one per batch x width x span shape; no compilation), inductor (torch.compile + CUDA graphs), off.")] = Compile.auto,  # noqa: E501
    usd_per_device_hour: Annotated[Opt[float], typer.Option(help="Price of a device hour for the nightly-job $/1k documents (default: the spec's cost.usd_per_device_hour).")] = None,  # noqa: E501
    stop_at_eos: Annotated[Opt[bool], typer.Option("--stop-at-eos/--ignore-eos", help="Stop rows at EOS (CPU default) or generate exactly --new-tokens (CUDA default).")] = None,  # noqa: E501
    corpus: Annotated[Opt[str], typer.Option(help="Documents: a folder of .txt or a JSONL (CPU jobs/sample-qa.jsonl; CUDA jobs/corpus).")] = None,  # noqa: E501
    threads: Annotated[int, typer.Option(help="CPU torch threads (0 = torch default; 1 is steadier on a shared machine).")] = 1,  # noqa: E501
    hf_pld_tokens: Annotated[int, typer.Option(help="transformers' prompt_lookup_num_tokens for hf-pld.")] = 10,
    min_rows: Annotated[Opt[int], typer.Option(help="At batch size B, decode max(B, MIN_ROWS) prompts in batches of B (CPU 4; CUDA 1).")] = None,  # noqa: E501
) -> None:
    """Decoding throughput: our engine vs transformers (see the module docstring)."""
    from pipeline.bench.results import DEFAULT_OUT, check_lines, summary_lines, write_results
    from pipeline.bench.suite import Settings, command_line, run_systems
    from schemas.spec import EMBEDDED_MODEL, CostSpec

    # Members back to plain strings: they are recorded in the results and the command line.
    device, dtype, compile = Device(device).value, Dtype(dtype).value, Compile(compile).value
    preset = PRESETS[device]

    def pick(value, key):
        return preset[key] if value is None else value

    try:
        s = Settings(
            device=device, model=model or EMBEDDED_MODEL, dtype=dtype,
            batch_sizes=_ints(pick(batch_sizes, "batch_sizes"), "--batch-sizes"),
            prompt_tokens=pick(prompt_tokens, "prompt_tokens"), new_tokens=pick(new_tokens, "new_tokens"),
            systems=_names(pick(systems, "systems")), tasks=_names(pick(tasks, "tasks")),
            verify_widths=_ints(pick(verify_widths, "verify_widths"), "--verify-widths"),
            corpus=pick(corpus, "corpus"), ignore_eos=not pick(stop_at_eos, "stop_at_eos"), threads=threads,
            command=command_line(), compile=compile, hf_pld_tokens=hf_pld_tokens,
            min_rows=pick(min_rows, "min_rows"),
            usd_per_device_hour=CostSpec().usd_per_device_hour if usd_per_device_hour is None else usd_per_device_hour,
        )
        out_dir = out or DEFAULT_OUT

        def on_batch(result: dict) -> None:
            for line in summary_lines(result["results"][-1]):
                typer.echo(line)
            write_results(result, out_dir, merge)

        result = run_systems(s, on_batch)
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    js, md = write_results(result, out_dir, merge)
    for x, r in result["systems"].items():
        if r["status"] != "ok":
            typer.echo(f"# {x}: {r['status']} ({r.get('reason', '')})")
    for line in check_lines(result):
        typer.echo(line)
    typer.echo(f"# results: {js} and {md}")


if __name__ == "__main__":
    typer.run(bench_decode_command)
