"""The documents of a bench job: the spec's own requests for the peer, and synthetic corpora.

Contract:
- ``spec_requests(spec, run_date)``: the requests `longdoc run` makes of the spec's
  input (stages.read and stages.requests: the same listing, reader, ``input.limit`` and request ids), as
  plain records ``request_id, doc_id, text, instruction, question`` for the peer
  (pipeline/bench/peer.py reads them as JSONL), plus the number of documents that
  failed to read (the peer cannot run those; longdoc writes them as error rows).
- ``write_synthetic_corpus(tokenizer, n, tokens, out, source)``: a JSONL corpus of ``n``
  documents (``id``, ``text``) of EXACTLY ``tokens`` tokens each in ``tokenizer``
  (``add_special_tokens=False``: how the tokenize stage counts them). Each is a window
  of the source text (the files of ``source``, default jobs/corpus, joined and cycled)
  starting at its own offset, decoded and re-encoded until the count is exact, so the
  text is real prose and code (prompt lookup finds what it would in real documents;
  windows of different documents overlap when ``n x tokens`` exceeds the source).
"""

from __future__ import annotations

import json
from pathlib import Path

DEFAULT_SOURCE = "jobs/corpus"


def spec_requests(spec, run_date: str) -> tuple[list[dict], int]:
    """(requests as records, documents that failed to read) for ``spec`` on ``run_date``."""
    from stages.listing import list_shards, resolve_uri
    from stages.read import iter_shard
    from stages.requests import expand_requests, generation_fingerprint

    root_uri = resolve_uri(spec.input.uri, run_date)
    fingerprint = generation_fingerprint(spec)
    out, n_docs, bad = [], 0, 0
    for shard in list_shards(spec.input, run_date):
        for doc in iter_shard(shard, spec.input, root_uri):
            if spec.input.limit is not None and n_docs >= spec.input.limit:
                break
            n_docs += 1
            if doc.error or doc.text is None:
                bad += 1
                continue
            for r in expand_requests(doc, spec, "bench", run_date, fingerprint):
                if r["error"] is None:
                    out.append({k: r[k] for k in ("request_id", "doc_id", "text", "instruction", "question")})
    return out, bad


def write_requests(records: list[dict], path: Path) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return path


def _source_ids(tokenizer, source: str | Path) -> list[int]:
    files = sorted(p for p in Path(source).rglob("*") if p.is_file() and p.suffix in (".txt", ".md"))
    if not files:
        raise ValueError(f"--synthetic-source {str(source)!r} has no .txt or .md files")
    text = "\n\n".join(p.read_text(encoding="utf-8", errors="replace") for p in files)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def exact_text(tokenizer, source: list[int], start: int, tokens: int, tries: int = 8) -> str | None:
    """Text of exactly ``tokens`` tokens from ``source`` (cycled) at ``start``; None if it never settles."""
    n = len(source)
    ids = [source[(start + i) % n] for i in range(tokens)]
    nxt = start + tokens
    for _ in range(tries):
        text = tokenizer.decode(ids)
        again = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        if len(again) == tokens:
            return text
        if len(again) > tokens:
            ids = again[:tokens]
        else:  # decoding merged pieces: extend from the source and cut again
            ids = again + [source[(nxt + i) % n] for i in range(tokens - len(again))]
            nxt += tokens - len(again)
    return None


def write_synthetic_corpus(tokenizer, n: int, tokens: int, out: Path, source: str | Path = DEFAULT_SOURCE) -> Path:
    """See the module contract; returns ``out`` (a .jsonl file)."""
    if n < 1 or tokens < 1:
        raise ValueError(f"synthetic corpus: need n >= 1 and tokens >= 1, got n={n}, tokens={tokens}")
    src = _source_ids(tokenizer, source)
    # Offsets spread over the source, coprime-ish so documents differ even when they wrap.
    stride = max(1, len(src) // n) if n * tokens <= len(src) else max(1, len(src) // n + 7)
    with open(out, "w", encoding="utf-8") as f:
        for i in range(n):
            text = None
            for shift in range(16):  # another start when decoding never settles on the count
                text = exact_text(tokenizer, src, i * stride + shift * 13, tokens)
                if text is not None:
                    break
            if text is None:
                raise RuntimeError(f"synthetic document {i}: no text of exactly {tokens} tokens found")
            f.write(json.dumps({"id": f"synthetic-{i:05d}", "text": text}, ensure_ascii=False) + "\n")
    return out
