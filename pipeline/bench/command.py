"""`longdoc bench decode`: two suites behind one command.

- ``--suite systems``: our engine (greedy, prompt lookup) vs transformers generate
  (dynamic cache; static cache + torch.compile) on one device, with the memory
  roofline; JSON + Markdown under jobs/results/bench-decode/ (pipeline/bench/suite.py).
- ``--suite cpu-targets``: the CPU comparison with issue 3's PASS/FAIL targets on the
  embedded model (pipeline/bench/decode.py), unchanged.
- ``--suite auto`` (default): systems when any systems option is given (``--device``,
  ``--model``, ``--systems``, ``--prompt-tokens``, ``--new-tokens``, ``--out``, ...),
  else cpu-targets, so a bare ``longdoc bench decode`` runs what it always ran.

The GPU table (issue 12), one command on a machine with torch + transformers:
    make bench-gpu
which runs
    python3 -m pipeline.bench.command --device cuda --model random:llama-8b \\
        --batch-sizes 1,8,32 --prompt-tokens 1024 --new-tokens 128 --usd-per-device-hour 2.50
(``--engine`` auto: our systems on the static-slot engine on CUDA, the dynamic one on CPU;
infra/README.md, "GPU benchmark", says what the machine needs). This module's import
chain needs typer, torch, transformers, pyarrow and pydantic (schemas), never ray.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from pipeline.bench.results import SYSTEMS

Opt = Optional  # noqa: UP045 - typer needs Optional


def _ints(text: str, option: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{option} {text!r}: allowed: comma-separated integers, e.g. 1,8,32") from None


def bench_decode_command(
    suite: Annotated[str, typer.Option(help="systems | cpu-targets | auto (systems when a systems option is given).")] = "auto",  # noqa: E501
    device: Annotated[Opt[str], typer.Option(help="systems: cpu or cuda (default cpu).")] = None,
    model: Annotated[Opt[str], typer.Option(help="systems: embedded default, HF id, local path or random:<shape> (tiny, smollm2-135m, llama-1b, llama-8b).")] = None,  # noqa: E501
    dtype: Annotated[str, typer.Option(help="systems: auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16, float16.")] = "auto",  # noqa: E501
    batch_sizes: Annotated[Opt[str], typer.Option(help="Comma-separated batch sizes (systems: 1,8,32; cpu-targets: 1,4,8).")] = None,  # noqa: E501
    prompt_tokens: Annotated[Opt[int], typer.Option(help="systems: prompt length in tokens (default 1024).")] = None,
    new_tokens: Annotated[Opt[int], typer.Option(help="systems: tokens generated per row (default 128).")] = None,
    systems: Annotated[Opt[str], typer.Option(help=f"systems: comma list of {', '.join(SYSTEMS)} (default all).")] = None,  # noqa: E501
    verify_widths: Annotated[Opt[str], typer.Option(help="systems: widths to measure our step cost at (default 2,4,8,16; '' = none).")] = None,  # noqa: E501
    out: Annotated[Opt[str], typer.Option(help="systems: results folder (default jobs/results/bench-decode).")] = None,
    merge: Annotated[bool, typer.Option(help="systems: keep an earlier file's batch sizes that this run does not measure (same device, model, settings).")] = False,  # noqa: E501
    compile: Annotated[str, typer.Option(help="systems, static engine: how steps are compiled: auto (inductor + CUDA graphs on CUDA, eager on CPU), inductor, cudagraphs (CUDA graphs of the eager kernels; seconds per shape, each batch x width x span shape apart), off.")] = "auto",  # noqa: E501
    engine: Annotated[str, typer.Option(help="systems: our engine: auto (static on CUDA, dynamic on CPU), static (SlotEngine: static KV slots, CUDA graphs), dynamic (engine.decode).")] = "auto",  # noqa: E501
    usd_per_device_hour: Annotated[Opt[float], typer.Option(help="systems: price of a device hour for the nightly-job $/1k documents (default: the spec's cost.usd_per_device_hour).")] = None,  # noqa: E501
    stop_at_eos: Annotated[bool, typer.Option(help="systems: stop rows at EOS (default: ignore EOS, fixed work).")] = False,  # noqa: E501
    corpus: Annotated[Opt[str], typer.Option(help="Documents: a folder of .txt or a JSONL (systems: jobs/corpus; cpu-targets: jobs/sample-qa.jsonl).")] = None,  # noqa: E501
    threads: Annotated[int, typer.Option(help="CPU torch threads (0 = torch default; 1 is steadier on a shared machine).")] = 1,  # noqa: E501
    docs: Annotated[Opt[int], typer.Option(help="cpu-targets: rows per task.")] = None,
    b1_rows: Annotated[Opt[int], typer.Option(help="cpu-targets: rows decoded at B=1 and B=4.")] = None,
    doc_tokens: Annotated[Opt[int], typer.Option(help="cpu-targets: cut each document to this many tokens.")] = None,
    max_new_tokens: Annotated[Opt[int], typer.Option(help="cpu-targets: tokens generated per row.")] = None,
    tasks: Annotated[Opt[str], typer.Option(help="cpu-targets: comma-separated tasks: summarize, qa.")] = None,
    hf_pld_tokens: Annotated[Opt[int], typer.Option(help="cpu-targets: HF prompt_lookup_num_tokens.")] = None,
    prefer: Annotated[Opt[str], typer.Option(help="cpu-targets: drafting tie rule: latest or earliest.")] = None,
) -> None:
    """Decoding throughput: our engine vs transformers (see `--suite`)."""
    sys_opts = {"--device": device, "--model": model, "--prompt-tokens": prompt_tokens, "--new-tokens": new_tokens,
                "--systems": systems, "--verify-widths": verify_widths, "--out": out,
                "--stop-at-eos": stop_at_eos or None, "--merge": merge or None, "--dtype": None if dtype == "auto" else dtype,
                "--engine": None if engine == "auto" else engine, "--compile": None if compile == "auto" else compile, "--usd-per-device-hour": usd_per_device_hour}
    cpu_opts = {"--docs": docs, "--b1-rows": b1_rows, "--doc-tokens": doc_tokens, "--max-new-tokens": max_new_tokens,
                "--tasks": tasks, "--hf-pld-tokens": hf_pld_tokens, "--prefer": prefer}
    given_sys = [k for k, v in sys_opts.items() if v is not None]
    given_cpu = [k for k, v in cpu_opts.items() if v is not None]
    if suite not in ("auto", "systems", "cpu-targets"):
        raise typer.BadParameter(f"--suite {suite!r}: allowed: auto, systems, cpu-targets")
    if suite == "auto":
        suite = "systems" if given_sys else "cpu-targets"
    wrong = given_cpu if suite == "systems" else given_sys
    if wrong:
        raise typer.BadParameter(f"{', '.join(wrong)} do not apply to --suite {suite}")
    if suite == "cpu-targets":
        from pipeline.bench.decode import bench_decode

        kw = {k.lstrip("-").replace("-", "_"): v for k, v in cpu_opts.items() if v is not None}
        if batch_sizes is not None:
            kw["batch_sizes"] = batch_sizes
        if corpus is not None:
            kw["corpus"] = corpus
        bench_decode(threads=threads, **kw)
        return
    try:
        _systems(device or "cpu", model, dtype, batch_sizes, prompt_tokens, new_tokens, systems, verify_widths,
                 out, not stop_at_eos, corpus, threads, merge, engine, usd_per_device_hour, compile)
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None


def _systems(device, model, dtype, batch_sizes, prompt_tokens, new_tokens, systems, verify_widths, out,
             ignore_eos, corpus, threads, merge, engine="auto", usd_per_device_hour=None, compile="auto") -> None:
    from pipeline.bench.results import DEFAULT_OUT, summary_lines, write_results
    from pipeline.bench.suite import Settings, command_line, run_systems
    from schemas.spec import EMBEDDED_MODEL, CostSpec

    s = Settings(
        device=device, model=model or EMBEDDED_MODEL, dtype=dtype,
        batch_sizes=_ints(batch_sizes or "1,8,32", "--batch-sizes"),
        prompt_tokens=prompt_tokens or 1024, new_tokens=new_tokens or 128,
        systems=tuple(x.strip() for x in (systems or ",".join(SYSTEMS)).split(",") if x.strip()),
        verify_widths=_ints("2,4,8,16" if verify_widths is None else verify_widths, "--verify-widths"),
        corpus=corpus or "jobs/corpus", ignore_eos=ignore_eos, threads=threads, command=command_line(), engine=engine,
        compile=compile,
        usd_per_device_hour=CostSpec().usd_per_device_hour if usd_per_device_hour is None else usd_per_device_hour,
    )
    out_dir = out or DEFAULT_OUT

    def on_batch(result: dict) -> None:
        for line in summary_lines(result["results"][-1]):
            typer.echo(line)
        write_results(result, out_dir, merge)

    result = run_systems(s, on_batch)
    js, md = write_results(result, out_dir, merge)
    skipped = {x: r for x, r in result["systems"].items() if r["status"] != "ok"}
    for x, r in skipped.items():
        typer.echo(f"# {x}: {r['status']} ({r.get('reason', '')})")
    typer.echo(f"# results: {js} and {md}")


if __name__ == "__main__":
    typer.run(bench_decode_command)
