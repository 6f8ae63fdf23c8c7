"""`longdoc bench compress`: Finch chunked prefill vs full-context prefill.

One process, one model (the embedded SmolLM2 by default), one long document per
size built by concatenating the real texts of ``--corpus`` (jobs/corpus/*.txt,
sorted) and cutting at exactly N tokens. Every method prefills the same prompt
(chat prefix + document + the summary instruction, or with ``--task qa`` the qa
instruction and ``QA_QUESTION``) for one row and is measured on:

- time: seconds of the whole prefill (Finch's chunk passes, for qa its fused
  evidence (the embedder reading every sentence: the embedder is loaded before, as
  an actor loads it), and its final pass; the full prefill's single pass), as wall seconds and as CPU seconds of this
  process (all threads). On a shared CPU machine the wall clock mostly measures
  how long the process waited for a core; the ratios use CPU seconds there
  (wall seconds on GPU, where the CPU only launches kernels);
- peak: the most bytes held at once by tensors allocated during the prefill:
  activations, masks, attention workspaces, the KV cache (the model's weights,
  allocated before, are not counted). On GPU: the step backend's
  ``peak_memory_bytes`` (CUDA's ``max_memory_allocated``) minus the bytes allocated
  before. On CPU: every allocation and free of the CPU allocator is recorded by
  ``torch.profiler`` (``profile_memory=True``) and the peak is the maximum running
  sum of those events (the profiler's per-op bookkeeping costs the same small
  overhead in every row, so time ratios stay fair). The step backend says which:
  the GPU way where it measures its allocator (``memory_allocated_bytes``), and CPU
  seconds for the ratios where the host runs the prefill (``runs_on_host``).

Methods run interleaved per document size, in one process, so load from other
processes hits them alike; ratios are Finch / full at the same size (< 1 means
Finch is faster or smaller). Full prefill of a document longer than the model's
context window is not run ("n/a (exceeds context)"): RoPE positions past the
window are outside what the model was trained on. Paper claim checked: Finch is
faster than full prefill once chunks exceed ~128 tokens.

What Finch's early exit costs depends on how deep its selecting heads sit:
``--heads all`` runs it as on a model never calibrated (every head of every layer, so
the whole model reads the document), ``--max-scoring-layers 8,16`` caps the layers that
select (compression.max_scoring_layers); the header names the selecting layers.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from pipeline.bundled import bundled
from pipeline.choices import choice, spec_choice
from schemas.spec import TaskSpec
from stages.finch.config import FinchCompression

# The Finch settings it sweeps offer what a job's compression spec allows.
HeadMode = spec_choice("HeadMode", FinchCompression, "head_mode")
Scoring = spec_choice("Scoring", FinchCompression, "scoring")
Mode = spec_choice("Mode", FinchCompression, "mode")
Task = spec_choice("Task", TaskSpec, "kind")
#: ``--heads``: the model's calibrated heads, or every head (a model never calibrated).
Heads = choice("Heads", ("calibrated", "all"))

#: The question of ``--task qa`` (any question: the cost does not depend on its words).
QA_QUESTION = "What does the document say about handling errors?"


def corpus_tokens(corpus: str, n_tokens: int, builder) -> list[int]:
    """The first ``n_tokens`` tokens of the corpus's .txt files concatenated in name order."""
    files = sorted(Path(corpus).glob("*.txt"))
    if not files:
        raise ValueError(f"no .txt files under {corpus!r}; pass --corpus with long real text")
    ids: list[int] = []
    for path in files:
        ids += builder.encode_text(path.read_text() + "\n\n")
        if len(ids) >= n_tokens:
            return ids[:n_tokens]
    raise ValueError(f"{corpus!r} holds {len(ids)} tokens, fewer than the {n_tokens} asked for")


@dataclass
class Measured:
    wall_s: float
    cpu_s: float
    peak_bytes: int

    def cost(self, on_host: bool) -> float:
        return self.cpu_s if on_host else self.wall_s


def measure(fn, device) -> Measured:
    """Run ``fn()`` once; its wall and CPU seconds and the peak bytes of the tensors
    allocated during the call (see the module docstring)."""
    from stages.decoding.backends import device_backend, synchronize

    backend = device_backend(device)
    base = backend.memory_allocated_bytes(device)
    if base is not None:  # the device's allocator counts its peak (a GPU)
        synchronize(device)
        backend.reset_peak_memory(device)
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        synchronize(device)
        w1, c1 = time.perf_counter(), time.process_time()
        return Measured(w1 - w0, c1 - c0, (backend.peak_memory_bytes(device) or 0) - base)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        w1, c1 = time.perf_counter(), time.process_time()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    running = itertools.accumulate(e.nbytes() for e in events)
    return Measured(w1 - w0, c1 - c0, max(running, default=0))


def bench_compress(
    sizes: Annotated[str, typer.Option(help="Document sizes in tokens, comma-separated.")] = "2000,4000,8000,16000",
    targets: Annotated[str, typer.Option(help="Finch target_tokens, comma-separated.")] = "512,1024",
    chunk: Annotated[int, typer.Option(help="Finch chunk_tokens for the target sweep.")] = 512,
    sweep_chunks: Annotated[str, typer.Option(help="Extra chunk sizes run at the first target.")] = "128,256",
    sweep_sizes: Annotated[str, typer.Option(help="Document sizes the chunk sweep runs at.")] = "4000,8000",
    head_mode: Annotated[HeadMode, typer.Option(help="Finch head_mode.")] = HeadMode.sum,
    scoring: Annotated[Scoring, typer.Option(help="Finch scoring.")] = Scoring.heads,
    mode: Annotated[Mode, typer.Option(help="Finch mode (paper and kv_group need kv).")] = Mode.early_exit,
    model: Annotated[str, typer.Option(help="Model name or path.")] = "embedded:smollm2-135m-instruct",
    corpus: Annotated[str, typer.Option(help="Folder of .txt files with long real text.")] = "jobs/corpus",
    num_gpus: Annotated[float, typer.Option(help="> 0 runs on CUDA when available.")] = 0.0,
    threads: Annotated[
        int, typer.Option(help="torch CPU threads; 1 avoids OpenMP stalls on a shared machine, 0 = torch default.")
    ] = 1,
    task: Annotated[
        Task, typer.Option(help="summarize (the summary instruction) or qa (a question; Finch's qa settings).")
    ] = Task.summarize,
    max_scoring_layers: Annotated[
        str, typer.Option(help="Finch max_scoring_layers, comma-separated ('none' = no cap); each runs at "
                               "every target (early exit reads the document through that many layers).")
    ] = "none",
    heads: Annotated[
        Heads, typer.Option(help="calibrated (the model's calibrated heads, every head when it has none) or all "
                               "(every head of every layer: what a model never calibrated pays).")
    ] = Heads.calibrated,
) -> None:
    """Print Finch vs full-context prefill time and peak memory, side by side with ratios."""
    import torch

    from schemas.spec import DEFAULT_QA_INSTRUCTION, DEFAULT_SUMMARY_INSTRUCTION
    from stages.compression.finch import prompt_similarity
    from stages.decoding.backends import device_backend
    from stages.decoding.state import prefill_full
    from stages.finch import finch_prefill
    from stages.finch.config import SelectCompression
    from stages.finch.heads import find_heads
    from stages.finch.spans import sentence_boundaries
    from stages.model_loading import load_causal_lm, pick_device
    from stages.prompting import PromptBuilder

    # Members back to plain strings: they are printed and passed to the Finch settings.
    head_mode, scoring, mode = HeadMode(head_mode).value, Scoring(scoring).value, Mode(mode).value
    task, heads = Task(task).value, Heads(heads).value
    caps = [_cap(x) for x in max_scoring_layers.split(",")]
    # Every list and the corpus are checked before the model loads (a minute on a big one).
    doc_sizes, target_list = _counts("--sizes", sizes), _counts("--targets", targets)
    sweep = _counts("--sweep-chunks", sweep_chunks, empty=True)
    sweep_at = set(_counts("--sweep-sizes", sweep_sizes, empty=True))
    if chunk < 1:
        raise typer.BadParameter(f"--chunk {chunk}: allowed an integer >= 1")
    corpus = bundled(corpus)
    if not sorted(Path(corpus).glob("*.txt")):
        raise typer.BadParameter(f"--corpus {corpus!r}: no .txt files there; pass a folder of long real text")
    instruction, question = (DEFAULT_QA_INSTRUCTION, QA_QUESTION) if task == "qa" else (DEFAULT_SUMMARY_INSTRUCTION, None)
    if threads > 0:
        torch.set_num_threads(threads)
    device = pick_device(num_gpus)
    lm, tok = load_causal_lm(model, device=device)
    builder = PromptBuilder(tok)
    window = int(lm.config.max_position_embeddings)
    pad = tok.pad_token_id
    bounds = sentence_boundaries(tok)  # for keep: sentences (the early-exit default)
    try:
        all_ids = corpus_tokens(corpus, max(doc_sizes), builder)
    except ValueError as e:  # too little text for the largest size
        raise typer.BadParameter(f"--corpus: {e}") from None
    # Warm up kernels and allocator once so the first row is not an outlier.
    warm = builder.build(all_ids[:600], instruction, question)
    prefill_full(lm, [warm.full_ids], pad)
    warm_cfg = SelectCompression(target_tokens=128, chunk_tokens=256).resolved(task)
    similarity = prompt_similarity(warm_cfg, tok, device)  # None unless evidence fused (qa)
    selecting = find_heads(lm) if heads == "calibrated" else None  # None: every head (uncalibrated)
    finch_prefill(lm, [warm], warm_cfg, pad, boundaries=bounds, similarity=similarity, heads=selecting)

    on_host = device_backend(device).runs_on_host(device)  # ratios of CPU seconds, else of wall seconds
    rows: list[list[str]] = []
    for n in doc_sizes:
        parts = builder.build(all_ids[:n], instruction, question)
        full = None
        if len(parts) <= window:
            full = measure(lambda p=parts: prefill_full(lm, [p.full_ids], pad), device)
            rows.append(_row(n, "full prefill", full, full, on_host))
        else:
            rows.append([str(n), "full prefill", "n/a (exceeds context)", "n/a", "n/a", "", ""])
        configs = [(t, chunk, cap) for t in target_list for cap in caps]
        if n in sweep_at:
            configs += [(target_list[0], c, caps[0]) for c in sweep if c != chunk]
        for target, c, cap in configs:
            cfg = SelectCompression(target_tokens=target, chunk_tokens=c, head_mode=head_mode,
                                   scoring=scoring, mode=mode, max_scoring_layers=cap).resolved(task)  # as a job runs it
            sim = similarity if cfg.evidence == "fused" else None
            m = measure(lambda p=parts, cfg=cfg, sim=sim: finch_prefill(
                lm, [p], cfg, pad, boundaries=bounds, similarity=sim, heads=selecting), device)
            rows.append(_row(n, f"finch t={target} c={c}" + (f" layers<={cap}" if cap else ""), m, full, on_host))
    overhead = builder.overhead_tokens(instruction, question)
    depth = f"selecting layers {', '.join(str(la) for la in sorted({la for la, _ in selecting.heads}))}" \
        if selecting is not None else "every head of every layer"
    print(f"model={model} task={task} device={device} threads={torch.get_num_threads()} window={window} "
          f"head_mode={head_mode} scoring={scoring} mode={mode} heads={heads} ({depth} of "
          f"{lm.config.get_text_config().num_hidden_layers}) prompt overhead={overhead} tokens; "
          f"ratios use {'CPU' if on_host else 'wall'} seconds")
    print("| doc tokens | method | wall s | CPU s | peak MiB | time vs full | peak vs full |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


def _counts(option: str, text: str, empty: bool = False) -> list[int]:
    """A comma list of integers >= 1 (``empty``: the list may be empty), or a BadParameter
    naming the option and what it allows."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if any(not (x.isascii() and x.isdigit()) or int(x) < 1 for x in items) or not (items or empty):
        raise typer.BadParameter(f"{option} {text!r}: allowed a comma list of integers >= 1")
    return [int(x) for x in items]


def _cap(text: str) -> int | None:
    """One --max-scoring-layers value: 'none' -> None, else a layer count >= 1."""
    text = text.strip()
    if text == "none":
        return None
    if not text.isdigit() or int(text) < 1:
        raise typer.BadParameter(f"--max-scoring-layers {text!r}: allowed none or a layer count >= 1")
    return int(text)


def _row(n: int, name: str, m: Measured, full: Measured | None, on_host: bool) -> list[str]:
    def ratio(a: float, b: float | None) -> str:
        return f"{a / b:.2f}x" if b else ""

    return [
        str(n), name, f"{m.wall_s:.2f}", f"{m.cpu_s:.2f}", f"{m.peak_bytes / 2**20:.1f}",
        ratio(m.cost(on_host), full.cost(on_host) if full else None),
        ratio(m.peak_bytes, full.peak_bytes if full else None),
    ]


if __name__ == "__main__":
    typer.run(bench_compress)
