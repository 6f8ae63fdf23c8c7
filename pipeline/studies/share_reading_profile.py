"""Where a prefill call of a Finch-family method spends its time, with a document's
questions read once (``compression.share_reading: true``) or once each (``false``).

One document of a QA JSONL (``id``, ``text``, ``questions``), one warm-up call, then one
profiled call (cProfile) of the method's prefill over all the document's questions: a single
call when shared, one call per question otherwise. Prints the document's size, the wall
seconds of the profiled call, the decoder's forward passes grouped by shape (rows x tokens
through how many layers: the document's chunks, the questions' passes, the final prompts;
their seconds and count, so what a further question costs reads off directly) and the
cProfile table sorted by cumulative time.

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
    from stages.kv.model_parts import decoder
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
    questions = [questions] if isinstance(questions, str) else questions  # one question or a list, as the reader takes
    parts = [builder.build(ctx, spec.task.resolved_instruction, q) for q in questions]
    loaded.prefill(parts[:1])  # warm-up, not profiled
    passes = _PassTimes(decoder(loaded.model))
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
    passes.remove()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(45)
    head = f"doc tokens {len(ctx)} questions {len(parts)} query tokens {[len(p.query_ids) for p in parts]}\n"
    return wall, head + f"wall {wall:.2f}\n" + passes.table() + out.getvalue()


class _PassTimes:
    """The decoder's forward passes by (rows, tokens, layers run): seconds and count (forward
    hooks: a pass that runs only the first layers, early exit or the question pass, shows
    its own layer count)."""

    def __init__(self, module) -> None:
        self.seconds: dict[tuple[int, int, int], float] = {}
        self.calls: dict[tuple[int, int, int], int] = {}
        self._started: list[float] = []
        self._hooks = [module.register_forward_pre_hook(self._pre, with_kwargs=True),
                       module.register_forward_hook(self._post, with_kwargs=True)]

    def _pre(self, module, args, kwargs) -> None:
        self._started.append(time.perf_counter())

    def _post(self, module, args, kwargs, output) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        key = (*tuple(ids.shape), len(module.layers)) if ids is not None else (0, 0, len(module.layers))
        self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - self._started.pop()
        self.calls[key] = self.calls.get(key, 0) + 1

    def remove(self) -> None:
        for hook in self._hooks:
            hook.remove()

    def table(self) -> str:
        lines = ["forward passes (rows x tokens, layers): seconds, calls"]
        for (rows, tokens, layers), sec in sorted(self.seconds.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {rows} x {tokens}, {layers} layers: {sec:.2f} s, {self.calls[(rows, tokens, layers)]}")
        lines.append(f"  all passes: {sum(self.seconds.values()):.2f} s")
        return "\n".join(lines) + "\n"


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
