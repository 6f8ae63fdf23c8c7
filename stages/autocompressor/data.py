"""Training data for the AutoCompressor job: text files -> fixed-length token blocks.

Contract: ``find_text_files(paths)`` lists .txt/.md/.jsonl files (folders searched
recursively, sorted); ``read_training_texts`` yields one text per .txt/.md file or per JSONL
line (its ``text_field``); ``token_blocks`` tokenizes the documents, joins them with EOS
(documents shorter than a block then share one, as in the authors' pre-tokenized 6K-token
RedPajama blocks) and cuts ``[N, block_tokens]`` int64 blocks, dropping the tail.
``batches`` yields shuffled ``[B, block_tokens]`` batches forever (reshuffled every epoch).
The corpus is held in memory as token ids.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

TEXT_SUFFIXES = (".txt", ".md")
JSONL_SUFFIXES = (".jsonl",)


def find_text_files(paths: Sequence[str | Path]) -> list[Path]:
    """Files to train on from files and folders; raises ValueError when there are none."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(
                f
                for f in p.rglob("*")
                if f.is_file() and f.suffix in TEXT_SUFFIXES + JSONL_SUFFIXES
            )
        elif p.is_file():
            files.append(p)
        else:
            raise ValueError(f"training data path {str(p)!r} does not exist")
    if not files:
        raise ValueError(f"no .txt/.md/.jsonl files under {[str(p) for p in paths]}")
    return files


def read_training_texts(files: Sequence[Path], text_field: str = "text") -> Iterator[str]:
    for f in files:
        if f.suffix in JSONL_SUFFIXES:
            for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
                if line.strip():
                    obj = json.loads(line)
                    if text_field not in obj:
                        raise ValueError(f"{f}:{n}: no {text_field!r} field in the JSON object")
                    yield str(obj[text_field])
        else:
            yield f.read_text(encoding="utf-8", errors="replace")


def token_blocks(docs: Iterator[str], tokenizer, block_tokens: int) -> torch.Tensor:
    """Tokenize, join with EOS and cut into blocks. Returns [N, block_tokens] long."""
    if block_tokens < 2:
        raise ValueError(f"block_tokens must be >= 2, got {block_tokens}")
    eos = tokenizer.eos_token_id
    stream: list[int] = []
    for text in docs:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if ids:
            stream += list(ids) + ([eos] if eos is not None else [])
    n = len(stream) // block_tokens
    if n == 0:
        raise ValueError(
            f"the training text has {len(stream)} tokens, fewer than one block of {block_tokens}"
        )
    return torch.tensor(stream[: n * block_tokens], dtype=torch.long).view(n, block_tokens)


def batches(blocks: torch.Tensor, batch_size: int, seed: int = 0) -> Iterator[torch.Tensor]:
    """Shuffled [B, T] batches forever; every block is seen once per epoch."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    rng = random.Random(seed)
    order: list[int] = []
    while True:
        if len(order) < batch_size:
            fresh = list(range(blocks.shape[0]))
            rng.shuffle(fresh)
            order += fresh
        pick, order = order[:batch_size], order[batch_size:]
        yield blocks[pick]
