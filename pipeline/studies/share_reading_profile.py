"""Where a prefill call of a Finch-family method spends its time, with a document's
questions read once (``compression.share_reading: true``) or once each (``false``).

One document of a QA JSONL (``id``, ``text``, ``questions``), one warm-up call, then one
profiled call (cProfile) of the method's prefill over all the document's questions: a single
call when shared, one call per question otherwise. Prints the document's size, the wall
seconds of the profiled call and the cProfile table sorted by cumulative time.

    python -m pipeline.studies.share_reading_profile share|noshare \\
        [--spec jobs/results/bench-job/specs/sample-qa-select.yaml] [--threads 2] [--doc 0]

Results: jobs/results/bench-job/profiles/share-reading-profile-2026-11-29-cpu.md.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from pathlib import Path

DEFAULT_SPEC = "jobs/results/bench-job/specs/sample-qa-select.yaml"


def profile_call(spec_path: str, share: bool, threads: int, doc: int, max_doc_tokens: int | None = None,
                 overrides: tuple[str, ...] = ()) -> tuple[float, str]:
    """(wall seconds of the profiled call, the cProfile table) for document ``doc`` of the
    spec's input (its first ``max_doc_tokens`` tokens when given)."""
    import torch

    from schemas.loading import load_spec
    from stages.compression import method_for
    from stages.decoding.backends.torch_eager import TorchEagerBackend
    from stages.prompting import PromptBuilder

    # The generate actor's own process settings on CPU (threads, allocator, SDPA's grouped heads).
    TorchEagerBackend.prepare_process(torch.device("cpu"), threads)
    spec = load_spec(spec_path, [f"compression.share_reading={str(share).lower()}", *overrides])
    loaded = method_for(spec.compression).load(spec, torch.device("cpu"))
    with open(spec.input.uri) as f:
        record = [json.loads(line) for line in f if line.strip()][doc]
    builder = PromptBuilder(loaded.tokenizer)
    ctx = builder.encode_text(record[spec.input.text_field])[:max_doc_tokens]
    questions = record[spec.input.question_field]
    parts = [builder.build(ctx, spec.task.resolved_instruction, q) for q in questions]
    loaded.prefill(parts[:1])  # warm-up, not profiled
    profile = cProfile.Profile()
    t = time.perf_counter()
    profile.enable()
    if share:
        loaded.prefill(parts)  # one call: the document's questions share its reading
    else:
        for p in parts:  # one call per question: each reads the document
            loaded.prefill([p])
    profile.disable()
    wall = time.perf_counter() - t
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(45)
    head = f"doc tokens {len(ctx)} questions {len(parts)} query tokens {[len(p.query_ids) for p in parts]}\n"
    return wall, head + f"wall {wall:.2f}\n" + out.getvalue()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["share", "noshare"])
    ap.add_argument("--spec", default=DEFAULT_SPEC)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--doc", type=int, default=0, help="which record of the spec's input")
    ap.add_argument("--max-doc-tokens", type=int, default=None)
    ap.add_argument("--set", action="append", default=[], dest="overrides", help="spec override, as for longdoc")
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = ap.parse_args(argv)
    _, text = profile_call(args.spec, args.mode == "share", args.threads, args.doc, args.max_doc_tokens,
                           tuple(args.overrides))
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
