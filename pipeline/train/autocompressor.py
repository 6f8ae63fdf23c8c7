"""`longdoc train-autocompressor`: turn a causal LM into an AutoCompressor.

Register with ``app.command("train-autocompressor")(train_autocompressor)``. The core is
stages/autocompressor/train.py; this module only maps options to a TrainConfig and
prints progress. Heavy imports happen inside the command.
"""

from __future__ import annotations

from typing import Annotated, Optional, get_args

import typer

from pipeline.bundled import bundled
from pipeline.choices import Dtype, choice
from schemas.spec import EMBEDDED_MODEL
from stages.autocompressor.config import SummaryForm, SummaryScale

Scale = choice("Scale", get_args(SummaryScale))
Form = choice("Form", get_args(SummaryForm))


def _format(rec: dict, steps: int) -> str:
    """One progress line: a training record (step of ``steps``, loss, time left at this
    step's pace) or the start's facts."""
    if "step" not in rec:
        return ", ".join(f"{k}={v}" for k, v in rec.items())
    ae = f"  ae_loss {rec['ae_loss']:.4f}" if "ae_loss" in rec else ""
    left = max(steps - int(rec["step"]), 0) * float(rec["s_per_step"])
    return (
        f"step {rec['step']:>6}/{steps}  loss {rec['loss']:.4f}{ae}  lr {rec['lr']:.2e}  "
        f"{rec['tokens_per_s']:,.0f} tok/s  {rec['s_per_step']:.2f} s/step  ~{_duration(left)} left"
    )


def _duration(seconds: float) -> str:
    """``seconds`` as 42s, 7m05s or 3h12m."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def train_autocompressor(
    data: Annotated[
        Optional[list[str]],  # noqa: UP045 - typer needs Optional here
        typer.Option(
            help="Training text: folders of .txt/.md/.jsonl files or single files (repeatable)."
        ),
    ] = None,
    out: Annotated[
        str, typer.Option(help="Output directory (a few MB: summary embeddings + LoRA).")
    ] = "out/autocompressor",
    base_model: Annotated[
        str, typer.Option(help="Base causal LM: HF id, local path or the embedded default.")
    ] = EMBEDDED_MODEL,
    summary_length: Annotated[
        int, typer.Option(help="Summary vectors per segment (the paper: 50).")
    ] = 50,
    summary_scale: Annotated[
        Scale,
        typer.Option(
            help="How summaries re-enter the model: embedding_rms (rescaled to the token "
            "embeddings' RMS), centered (running mean per slot subtracted, then rescaled) "
            "or none (as the paper, unscaled final hidden states)."
        ),
    ] = Scale.none,
    summary_form: Annotated[
        Form,
        typer.Option(
            help="vectors (the paper: summary vectors fed back as a soft prompt) or kv (each "
            "segment kept as the keys/values of every --kv-stride-th token; needs --substeps 1)."
        ),
    ] = Form.vectors,
    kv_stride: Annotated[
        int, typer.Option(help="kv form: document tokens per kept key/value slot (10 = 10x).")
    ] = 10,
    autoencode_weight: Annotated[
        float,
        typer.Option(
            help="Weight of the loss of reconstructing each segment from its own summary "
            "(0 = the paper's next-token objective only)."
        ),
    ] = 0.0,
    block_tokens: Annotated[
        int, typer.Option(help="Tokens per training sequence (the paper: 6144).")
    ] = 2048,
    substeps: Annotated[
        int, typer.Option(help="Slices per sequence; the soft prompt is detached after each.")
    ] = 2,
    segments_per_substep: Annotated[
        int, typer.Option(help="Segments per slice (gradients flow through these).")
    ] = 2,
    min_segment_tokens: Annotated[int, typer.Option(help="Shortest randomised segment.")] = 32,
    batch_size: Annotated[int, typer.Option(help="Sequences per micro-batch.")] = 2,
    grad_accum: Annotated[int, typer.Option(help="Micro-batches per optimizer step.")] = 1,
    steps: Annotated[int, typer.Option(help="Optimizer steps.")] = 1000,
    lr: Annotated[
        float, typer.Option(help="Peak learning rate (the paper's Llama-2 LoRA run: 8e-4).")
    ] = 8e-4,
    warmup_steps: Annotated[
        int, typer.Option(help="Linear warmup steps, then cosine decay to 10%.")
    ] = 50,
    lora_r: Annotated[
        int, typer.Option(help="LoRA rank (0 = train only the summary embeddings).")
    ] = 8,
    lora_alpha: Annotated[int, typer.Option(help="LoRA alpha.")] = 16,
    lora_dropout: Annotated[float, typer.Option(help="LoRA dropout.")] = 0.05,
    lora_targets: Annotated[
        str,
        typer.Option(help="Comma-separated projection names to adapt (those present are used)."),
    ] = "q_proj,v_proj,o_proj,out_proj",
    grad_checkpointing: Annotated[
        bool, typer.Option(help="Activation checkpointing (saves GPU memory).")
    ] = False,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
    dtype: Annotated[
        Dtype, typer.Option(help="Base weights: auto = bf16 on GPU, fp32 on CPU.")
    ] = Dtype.auto,
    seed: Annotated[int, typer.Option(help="Random seed (data order, segment lengths).")] = 0,
    log_every: Annotated[int, typer.Option(help="Print progress every N steps.")] = 10,
    save_every: Annotated[
        int,
        typer.Option(
            help="Write a resumable checkpoint to OUT/last every N steps (0: at the end)."
        ),
    ] = 0,
    resume: Annotated[
        bool, typer.Option(help="Continue from OUT/last exactly (same settings required).")
    ] = False,
    stop_after: Annotated[
        int, typer.Option(help="Run at most N steps now (0: up to --steps); --resume later.")
    ] = 0,
    plot_only: Annotated[
        bool, typer.Option(help="Only redraw OUT/train_curve.png from OUT/train_log.csv.")
    ] = False,
    export: Annotated[
        Optional[str],  # noqa: UP045 - typer needs Optional here
        typer.Option(
            help="Only copy OUT's latest checkpoint, without training state, to this directory."
        ),
    ] = None,
    threads: Annotated[
        int,
        typer.Option(
            help="CPU threads for torch (0 = torch's default). On a shared CPU, 1 avoids spin contention."
        ),
    ] = 0,
) -> None:
    """Train an AutoCompressor (summary embeddings + LoRA) and save it as a directory.

    Writes OUT/train_log.csv (loss per step) as it goes and OUT/train_curve.png at the end.
    """
    from pathlib import Path

    from stages.autocompressor.curve import plot_curve
    from stages.autocompressor.resume import LOG_FILE

    log_csv, png = Path(out) / LOG_FILE, Path(out) / "train_curve.png"
    if export:
        from stages.autocompressor.resume import export_checkpoint

        try:
            typer.echo(f"exported {export_checkpoint(out, export)}")
        except ValueError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None
        return
    if plot_only:
        if not log_csv.is_file():
            typer.echo(f"error: --plot-only: no {log_csv} to plot", err=True)
            raise typer.Exit(2)
        typer.echo(f"wrote {plot_curve(log_csv, png, f'AutoCompressor on {base_model}')}")
        return

    import torch

    from stages.autocompressor.train import TrainConfig, train

    if threads < 0:
        typer.echo(f"error: --threads must be >= 0, got {threads}", err=True)
        raise typer.Exit(2)
    from pipeline.model_checks import model_problem

    problem = model_problem("--base-model", base_model)  # before the load: a typo costs a second
    if problem:
        typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(2)
    local = Path(base_model.removeprefix("file://")).expanduser()
    if local.exists():  # the checkpoint names its base: absolute, so it loads from any folder
        base_model = str(local.resolve())
    if threads:
        torch.set_num_threads(threads)

    cfg = TrainConfig(
        base_model=base_model,
        data=tuple(data or [bundled("jobs/corpus")]),
        out_dir=out,
        summary_length=summary_length,
        summary_scale=Scale(summary_scale).value,
        summary_form=Form(summary_form).value,
        kv_stride=kv_stride,
        autoencode_weight=autoencode_weight,
        block_tokens=block_tokens,
        substeps=substeps,
        segments_per_substep=segments_per_substep,
        min_segment_tokens=min_segment_tokens,
        batch_size=batch_size,
        grad_accum=grad_accum,
        steps=steps,
        lr=lr,
        warmup_steps=warmup_steps,
        lora_r=lora_r,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        lora_targets=tuple(t.strip() for t in lora_targets.split(",") if t.strip()),
        grad_checkpointing=grad_checkpointing,
        device=device,
        dtype=Dtype(dtype).value,
        seed=seed,
        log_every=log_every,
        save_every=save_every,
        resume=resume,
        stop_after=stop_after,
    )
    if warmup_steps >= steps:
        typer.echo(f"note: --warmup-steps {warmup_steps} >= --steps {steps}: the learning rate never reaches "
                   f"--lr {lr:g} (it is still warming up at the last step); lower --warmup-steps", err=True)
    last_step = [0]

    def on_log(rec: dict) -> None:
        last_step[0] = int(rec.get("step", last_step[0]))
        typer.echo(_format(rec, steps))

    try:
        result = train(cfg, on_log=on_log)
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        from stages.autocompressor.resume import saved_step

        saved = saved_step(out)
        kept = (f"the last save (step {saved}) is in {Path(out) / 'last'}: run the same command with --resume to "
                "go on from it" if saved is not None else
                "nothing was saved yet (--save-every N saves a resumable state every N steps)")
        typer.echo(f"interrupted (the last step printed: {last_step[0]} of {steps}); {kept}", err=True)
        raise typer.Exit(130) from None
    if result.history:
        typer.echo(f"wrote {plot_curve(log_csv, png, f'AutoCompressor on {base_model}')}")
    if result.out_dir is None:
        typer.echo(f"stopped before --steps; resume from {Path(out) / 'last'} with --resume")
        return
    files = [p for p in result.out_dir.rglob("*") if p.is_file()]
    size = sum(
        p.stat().st_size for p in files if not p.relative_to(out).parts[0].startswith("last")
    )
    typer.echo(f"saved {result.out_dir} ({size / 1e6:.1f} MB) in {result.seconds:.0f} s")
