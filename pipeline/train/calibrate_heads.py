"""`longdoc calibrate-heads`: find a model's retrieval heads for Finch's scoring.

Register with ``app.command("calibrate-heads")(calibrate_heads_command)``. The core is
stages/finch/calibrate.py; this module reads the haystack text, maps options to a
CalibrationConfig and writes the HeadSet: by default into the user cache
(``$LONGDOC_CACHE/finch_heads/<fingerprint>.json``) where Finch finds it for this
model; ``--out`` writes a file to ship (stages/finch/heads/ holds the shipped ones).
Heavy imports happen inside the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from pipeline.bundled import bundled
from schemas.spec import EMBEDDED_MODEL


def read_texts(corpus: str, exclude: list[str]) -> list[str]:
    """The .txt/.md files under ``corpus`` whose stem is not in ``exclude``."""
    root = Path(corpus)
    files = sorted(p for p in root.glob("*") if p.suffix in (".txt", ".md"))
    texts = [p.read_text(encoding="utf-8") for p in files if p.stem not in set(exclude)]
    if not texts:
        raise ValueError(f"no .txt/.md files under {corpus!r} (after --exclude); pass --corpus")
    return texts


def calibrate_heads_command(
    model: Annotated[str, typer.Option(help="Model: HF id, local path or the embedded default.")] = EMBEDDED_MODEL,
    corpus: Annotated[str, typer.Option(help="Folder of .txt/.md files used as haystack text.")] = "jobs/corpus",
    exclude: Annotated[
        Optional[list[str]],  # noqa: UP045 - typer needs Optional here
        typer.Option(help="File stems of --corpus not to use (e.g. documents of an eval set); repeatable."),
    ] = None,
    prompts: Annotated[int, typer.Option(help="Synthetic needle prompts.")] = 32,
    paraphrased: Annotated[
        float, typer.Option(help="Share of the needles asked in other words than their fact (0-1).")
    ] = 0.0,
    haystack_tokens: Annotated[int, typer.Option(help="Haystack length per prompt, in tokens.")] = 1500,
    top_k: Annotated[int, typer.Option(help="Heads kept.")] = 8,
    max_depth: Annotated[float, typer.Option(help="Only layers below this fraction of the depth may select.")] = 0.8,
    seed: Annotated[int, typer.Option(help="Seed of the needles and haystacks.")] = 0,
    out: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Write the head set here (default: the user cache, keyed by the model's fingerprint)."),
    ] = None,
    threads: Annotated[int, typer.Option(help="torch CPU threads (0 = torch default).")] = 0,
    num_gpus: Annotated[float, typer.Option(help="> 0 runs on CUDA when available.")] = 0.0,
) -> None:
    """Find the heads whose question attention lands on the answer and save them."""
    import torch

    from stages.finch.calibrate import CalibrationConfig, calibrate_heads
    from stages.finch.heads import save_heads
    from stages.model_loading import load_causal_lm, pick_device

    if threads > 0:
        torch.set_num_threads(threads)
    try:
        texts = read_texts(bundled(corpus), exclude or [])
        cfg = CalibrationConfig(prompts=prompts, haystack_tokens=haystack_tokens, top_k=top_k,
                                seed=seed, max_depth=max_depth, paraphrased=paraphrased)
        lm, tok = load_causal_lm(model, device=pick_device(num_gpus))
        heads = calibrate_heads(lm, tok, texts, cfg, name=model)
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    heads.info["corpus"] = corpus
    heads.info["excluded"] = sorted(exclude or [])
    path = save_heads(heads, Path(out) if out else None)
    typer.echo(f"model {model} fingerprint {heads.fingerprint}: heads (layer, head) "
               f"{', '.join(f'L{la}H{h}' for la, h in heads.heads)} "
               f"(answer share {heads.info['top'][0][2]:.3f} best vs uniform {heads.info['uniform_share']:.4f}; "
               f"chosen heads' share by question style {heads.info['heads_share_by_style']}; "
               f"{heads.info['seconds']} s)")
    typer.echo(f"written: {path}")
