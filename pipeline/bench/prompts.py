"""Benchmark prompts: long-document summary and question requests cut to an exact token count.

Contract: ``summary_prompts(tokenizer, corpus, rows, prompt_tokens)`` returns ``rows``
token lists, each exactly ``prompt_tokens`` long: the chat-template prompt of the
product's summary task (stages/prompting.PromptBuilder, the default summary
instruction) around a document cut so the whole prompt has that length. Row i uses
document i of the corpus (cycling when rows > documents); a document shorter than
its budget is continued with the next ones, so every row is real text that prompt
lookup can copy from. ``corpus`` is a folder of .txt/.md files (jobs/corpus) or a
JSONL file with a ``text`` field (jobs/sample-qa.jsonl).
``qa_prompts(tokenizer, corpus, rows, prompt_tokens)``: the product's QA prompt (the
default QA instruction and a question) around document i of a JSONL corpus with
``questions`` and ``answers`` lists, the document cut so the prompt has exactly
``prompt_tokens`` tokens; the question is the first whose answer survived the cut
(else the first), so prompt lookup has something to copy.
"""

from __future__ import annotations

import json
from pathlib import Path


def _records(corpus: str) -> list[dict]:
    path = Path(corpus)
    if not path.is_file():
        raise ValueError(f"--corpus {corpus!r}: the qa task needs a JSONL file with text, questions, answers")
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    recs = [r for r in recs if r.get("text", "").strip() and r.get("questions")]
    if not recs:
        raise ValueError(f"--corpus {corpus!r} holds no documents with questions")
    return recs


def read_corpus_texts(corpus: str) -> list[str]:
    """Texts of a folder of .txt/.md files (sorted by name) or of a JSONL file's ``text`` field."""
    path = Path(corpus)
    if path.is_dir():
        texts = [p.read_text() for p in sorted(path.iterdir()) if p.suffix in (".txt", ".md")]
    elif path.is_file():
        texts = [json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()]
    else:
        raise ValueError(f"--corpus {corpus!r} is neither a folder of .txt/.md files nor a JSONL file")
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise ValueError(f"--corpus {corpus!r} holds no documents")
    return texts


def summary_prompts(tokenizer, corpus: str, rows: int, prompt_tokens: int) -> list[list[int]]:
    """``rows`` summary prompts of exactly ``prompt_tokens`` tokens (see the module docstring)."""
    from schemas.spec import DEFAULT_SUMMARY_INSTRUCTION
    from stages.prompting import PromptBuilder

    builder = PromptBuilder(tokenizer)
    budget = prompt_tokens - builder.overhead_tokens(DEFAULT_SUMMARY_INSTRUCTION, None)
    if budget < 1:
        raise ValueError(
            f"--prompt-tokens {prompt_tokens} leaves no room for a document: the summary "
            f"prompt alone takes {prompt_tokens - budget} tokens"
        )
    texts = read_corpus_texts(corpus)
    encoded: dict[int, list[int]] = {}

    def doc(i: int) -> list[int]:
        i %= len(texts)
        if i not in encoded:
            encoded[i] = builder.encode_text(texts[i])
        return encoded[i]

    out = []
    for r in range(rows):
        ids, j = list(doc(r)), r + 1
        while len(ids) < budget:
            if j - r > len(texts):  # the whole corpus is shorter than one budget: repeat it
                ids += ids
                continue
            ids += builder.encode_text("\n\n") + doc(j)
            j += 1
        prompt = builder.build(ids[:budget], DEFAULT_SUMMARY_INSTRUCTION, None).full_ids
        assert len(prompt) == prompt_tokens, (len(prompt), prompt_tokens)
        out.append(prompt)
    return out


def qa_prompts(tokenizer, corpus: str, rows: int, prompt_tokens: int) -> list[list[int]]:
    """``rows`` QA prompts of exactly ``prompt_tokens`` tokens (see the module docstring)."""
    from schemas.spec import DEFAULT_QA_INSTRUCTION
    from stages.prompting import PromptBuilder

    builder = PromptBuilder(tokenizer)
    recs = _records(corpus)
    out = []
    for r in range(rows):
        rec = recs[r % len(recs)]
        ids = builder.encode_text(rec["text"])
        pairs = list(zip(rec["questions"], rec.get("answers") or [], strict=False))
        question = rec["questions"][0]
        for q, a in pairs:
            budget = prompt_tokens - builder.overhead_tokens(DEFAULT_QA_INSTRUCTION, q)
            if budget > 0 and a in tokenizer.decode(ids[:budget]):
                question = q
                break
        budget = prompt_tokens - builder.overhead_tokens(DEFAULT_QA_INSTRUCTION, question)
        if budget < 1:
            raise ValueError(f"--prompt-tokens {prompt_tokens} leaves no room for a document in a QA prompt")
        while len(ids) < budget:  # a short document: repeat it (real text to copy from)
            ids = ids + builder.encode_text("\n\n") + ids
        prompt = builder.build(ids[:budget], DEFAULT_QA_INSTRUCTION, question).full_ids
        assert len(prompt) == prompt_tokens, (len(prompt), prompt_tokens)
        out.append(prompt)
    return out
