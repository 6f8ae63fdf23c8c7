"""Finch's early-exit text choices side by side, from one head pass per question (a tuning tool).

Why: ``longdoc eval`` runs every setting through the whole pipeline, one Finch head
pass per question and setting. The settings that decide which text early exit reads
(evidence, sentence units, relevance floor, order) act after the chunked head pass,
so one pass per (question, budget) serves all of them. Tune on the tuning part
(jobs/eval/qa-tuning.jsonl, the default) only; the report part is for reporting.

    OMP_NUM_THREADS=1 .venv/bin/python -m pipeline.eval.finch_sweep --target 512 \\
        --variants heads-lines-f0.5,fused0.5-prose-f0.5,rag --out out/sweep-512

Contract:
- A variant name is ``EVIDENCE[-UNITS][-fFLOOR][-next][-doc]``: EVIDENCE ``heads`` (the
  chunked pass's scores as shipped before fusion: snap_to_sentences then order.lay_out)
  or ``fusedW`` (stages/finch/fusion.py, similarity weight W in [0, 1]; ``fused1``:
  the embedder alone); UNITS ``lines`` (default) or ``prose`` (spans.sentence_spans
  ``join_lines``); FLOOR the relevance floor (default 0: fill the budget); ``next``:
  each chosen sentence brings the next one of its paragraph (fused only); ``doc``:
  document order instead of relevance order. ``rag`` is the rag method at the same
  budget (the embedded MiniLM), for reference.
- For each question of ``--eval-set`` (``--limit`` questions at most): Finch's head pass
  (the shipped heads, or ``--heads FILE``) at ``--target``, keep tokens, its kept tokens
  and their last-pass scores cached in ``{out}/headpass.json``; then each variant's
  token list, prefilled with the pipeline's prompt and answered greedily
  (``--max-new-tokens``, default 32 as in ``longdoc eval``); answers are cached per
  context in ``{out}/answers.json`` (a rerun after a crash redoes nothing it has).
  ``--evidence-only`` answers nothing (contains is None): a fast screen of the variants.
- Writes ``{out}/rows.json`` (one row per question and variant: style, kind, contains,
  evidence = the answer in the read text, tokens read) and ``{out}/summary.md``: per
  variant and style, contains and evidence.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_SET = "jobs/eval/qa-tuning.jsonl"
_VARIANT = re.compile(
    r"^(heads|fused(?P<w>[0-9.]+))(-(?P<units>lines|prose))?(-f(?P<floor>[0-9.]+))?(?P<next>-next)?(?P<doc>-doc)?$"
)


@dataclass(frozen=True)
class Variant:
    name: str
    evidence: str  # "heads" | "fused" | "rag"
    weight: float = 0.0
    join_lines: bool = False
    floor: float = 0.0
    order: str = "relevance"
    next_sentence: bool = False


def parse_variant(name: str) -> Variant:
    """A Variant from its name (see the module contract); ValueError names the grammar."""
    if name == "rag":
        return Variant(name, "rag")
    m = _VARIANT.match(name)
    if not m:
        raise ValueError(f"variant {name!r}: expected EVIDENCE[-lines|-prose][-fFLOOR][-next][-doc] "
                         "with EVIDENCE heads or fusedW (W in [0, 1]), or rag")
    weight = float(m["w"]) if m["w"] else 0.0
    floor = float(m["floor"]) if m["floor"] else 0.0
    if not 0 <= weight <= 1 or not 0 <= floor <= 1:
        raise ValueError(f"variant {name!r}: weight and floor must be in [0, 1]")
    if m["next"] and not m["w"]:
        raise ValueError(f"variant {name!r}: -next needs fused evidence")
    return Variant(name, "fused" if m["w"] else "heads", weight, m["units"] == "prose", floor,
                   "document" if m["doc"] else "relevance", bool(m["next"]))


def questions(path: str, limit: int | None) -> list[dict[str, Any]]:
    """One dict per question of a styled eval set: doc, text, question, answer, kind, style."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        n = len(r["questions"])
        styles = r.get("style") or ["-"] * n
        kinds = r.get("kind") or ["-"] * n
        for q, a, k, s in zip(r["questions"], r["answers"], kinds, styles, strict=True):
            out.append({"doc": r["id"], "text": r["text"], "question": q, "answer": a, "kind": k, "style": s})
    return out[:limit] if limit else out


class CachedEmbedder:
    """A TextEmbedder that embeds each distinct sentence once per sweep (the questions of a
    document share its sentences); the vectors are the inner embedder's."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.max_tokens = inner, inner.max_tokens
        self.vectors: dict[str, Any] = {}

    def count_tokens(self, texts: list[str]) -> list[int]:
        return self.inner.count_tokens(texts)

    def embed_queries(self, texts: list[str]):
        return self.inner.embed_queries(texts)

    def embed_chunks(self, texts: list[str]):
        import torch

        missing = list(dict.fromkeys(t for t in texts if t not in self.vectors))
        if missing:
            self.vectors.update(zip(missing, self.inner.embed_chunks(missing), strict=True))
        return torch.stack([self.vectors[t] for t in texts]) if texts else self.inner.embed_chunks([])


def _load_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _save_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    tmp.replace(path)


def read_text(v: Variant, doc: list[int], kept: dict[int, float], target: int, spans_of, cosines_of) -> list[int]:
    """The document indices variant ``v`` reads, from the head pass's ``kept`` scores."""
    from stages.finch.fusion import choose_sentences, fuse, head_evidence, similarity_evidence
    from stages.finch.order import lay_out
    from stages.finch.spans import snap_to_sentences

    spans = spans_of(v.join_lines)
    if v.evidence == "heads":
        chosen = snap_to_sentences(sorted(kept), spans, min(target, len(doc)), kept)
        return lay_out(chosen, spans, kept, v.order, v.floor)
    view = cosines_of(v.join_lines)
    fused = fuse(head_evidence(spans, kept), similarity_evidence(view.cosine, view.content), v.weight)
    return choose_sentences(spans, fused, target, v.floor, v.order, view.follows if v.next_sentence else None)


def summarise(rows: list[dict[str, Any]], variants: list[str]) -> str:
    """Markdown: per variant and style, contains (evidence) and mean tokens read."""
    styles = sorted({r["style"] for r in rows})
    head = "| variant | " + " | ".join(f"{s} (n={sum(1 for r in rows if r['style'] == s and r['variant'] == variants[0])})"
                                      for s in styles) + " | all | tokens read |"
    lines = [head, "|" + "---|" * (len(styles) + 3)]
    for v in variants:
        mine = [r for r in rows if r["variant"] == v]
        cells = []
        for s in [*styles, None]:
            sub = [r for r in mine if s is None or r["style"] == s]
            if sub:
                answered = [r["contains"] for r in sub if r["contains"] is not None]
                acc = f"{sum(answered) / len(answered):.3f}" if answered else "-"
                cells.append(f"{acc} ({sum(r['evidence'] for r in sub) / len(sub):.2f})")
        tokens = sum(r["tokens"] for r in mine) / max(1, len(mine))
        lines.append(f"| {v} | " + " | ".join(cells) + f" | {tokens:.0f} |")
    return "\n".join(lines)


def run_sweep(eval_set: str, target: int, variants: list[str], out: Path, *, limit: int | None = None,
              heads_file: str | None = None, max_new_tokens: int = 32, model_name: str | None = None,
              answer: bool = True) -> list[dict]:
    """Run the sweep (see the module contract); returns the rows it wrote."""
    import torch

    from pipeline.eval.metrics import contains
    from schemas.spec import DEFAULT_QA_INSTRUCTION, EMBEDDED_EMBEDDER, EMBEDDED_MODEL
    from stages.compression.rag import rag_contexts
    from stages.decoding.config import DecodeConfig, eos_ids_of
    from stages.decoding.reference import decode_plain
    from stages.decoding.state import prefill_full
    from stages.embedding import load_embedder
    from stages.finch import finch_prefill
    from stages.finch.config import SelectCompression
    from stages.finch.fusion import make_similarity
    from stages.finch.heads import HeadSet, find_heads
    from stages.finch.spans import sentence_boundaries, sentence_spans
    from stages.model_loading import load_causal_lm
    from stages.prompting import PromptBuilder

    parsed = [parse_variant(v) for v in variants]
    out.mkdir(parents=True, exist_ok=True)
    model, tok = load_causal_lm(model_name or EMBEDDED_MODEL)
    heads = (HeadSet.from_json(json.loads(Path(heads_file).read_text(encoding="utf-8")))
             if heads_file else find_heads(model))
    builder, bounds = PromptBuilder(tok), sentence_boundaries(tok)
    embedder = load_embedder(EMBEDDED_EMBEDDER)
    similarity = make_similarity(CachedEmbedder(embedder), tok)  # what finch_prefill's evidence fused calls
    dcfg = DecodeConfig(max_new_tokens=max_new_tokens, eos_ids=eos_ids_of(tok, model.generation_config))
    cfg = SelectCompression(target_tokens=target, keep="tokens", order="document", min_relevance=0.0)
    head_key = hashlib.sha1(json.dumps([target, heads.heads if heads else None]).encode()).hexdigest()[:12]
    passes, answers = _load_json(out / "headpass.json"), _load_json(out / "answers.json")
    rows: list[dict[str, Any]] = []
    for i, item in enumerate(questions(eval_set, limit)):
        doc = builder.encode_text(item["text"])
        parts = builder.build(doc, DEFAULT_QA_INSTRUCTION, item["question"])
        key = f"{head_key}\t{item['doc']}\t{item['question']}"
        if key not in passes:
            trace: list = []
            with torch.inference_mode():
                finch_prefill(model, [parts], cfg, tok.pad_token_id, trace=trace, heads=heads)
            last = trace[-1]
            k = last.kept[0]
            idx = last.kept_index[0][0, 0, -k:].tolist()
            passes[key] = [idx, last.kept_score[0, -k:].tolist()]
            _save_json(out / "headpass.json", passes)
        idx, sc = passes[key]
        kept = dict(zip(idx, sc, strict=True))
        spans = {j: sentence_spans(doc, bounds, join_lines=j) for j in (False, True)}
        cos_cache: dict[bool, Any] = {}

        def cosines_of(join: bool, _parts=parts, _spans=spans, _c=cos_cache):
            if join not in _c:
                _c[join] = similarity([_parts], [_spans[join]])[0]
            return _c[join]

        for v in parsed:
            if v.evidence == "rag":
                toks = rag_contexts([doc], [item["question"]], tokenizer=tok, embedder=embedder,
                                    target_tokens=target)[0].context_ids
            else:
                toks = [doc[j] for j in read_text(v, doc, kept, target, spans.__getitem__, cosines_of)]
            akey = hashlib.sha1(json.dumps([item["question"], toks]).encode()).hexdigest()
            if answer and akey not in answers:
                with torch.inference_mode():
                    state = prefill_full(model, [parts.prefix_ids + toks + parts.query_ids], tok.pad_token_id)
                    answers[akey] = tok.decode(decode_plain(model, state, dcfg)[0].tokens, skip_special_tokens=True)
                _save_json(out / "answers.json", answers)
            text = answers.get(akey)
            rows.append({"variant": v.name, "doc": item["doc"], "question": item["question"],
                         "reference": item["answer"], "kind": item["kind"], "style": item["style"],
                         "output_text": text, "contains": None if text is None else contains(text, item["answer"]),
                         "evidence": contains(tok.decode(toks), item["answer"]), "tokens": len(toks)})
        print(f"[{i + 1}] {item['style'][:5]} " + " ".join(
            f"{'?' if r['contains'] is None else int(r['contains'])}{'e' if r['evidence'] else '-'}"
            for r in rows[-len(parsed):]), flush=True)
        _save_json(out / "rows.json", rows)
    (out / "summary.md").write_text(summarise(rows, variants) + "\n", encoding="utf-8")
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--eval-set", default=DEFAULT_SET, help="styled QA eval set (JSONL)")
    ap.add_argument("--target", type=int, default=512, help="Finch budget (target_tokens)")
    ap.add_argument("--variants", required=True, help="comma-separated variant names (see the module doc)")
    ap.add_argument("--out", type=Path, required=True, help="folder for caches, rows.json and summary.md")
    ap.add_argument("--limit", type=int, default=None, help="first N questions only")
    ap.add_argument("--heads", default=None, help="a head-set JSON (default: the model's calibrated heads)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--model", default=None, help="generating model (default: the embedded one)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--evidence-only", action="store_true",
                    help="do not answer: only whether each variant's text holds the answer (fast screen)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    try:
        names = [v.strip() for v in args.variants.split(",") if v.strip()]
        for v in names:
            parse_variant(v)
        rows = run_sweep(args.eval_set, args.target, names, args.out, limit=args.limit,
                         heads_file=args.heads, max_new_tokens=args.max_new_tokens, model_name=args.model,
                         answer=not args.evidence_only)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    print(summarise(rows, names))


if __name__ == "__main__":
    main()
