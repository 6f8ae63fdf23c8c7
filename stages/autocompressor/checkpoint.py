"""AutoCompressor checkpoints: our own small directory format and the published ones.

Our format (written by ``save_autocompressor``, read by ``load_autocompressor``), a few MB:
```
autocompressor.json               format marker, base model name/path, ACConfig (summary_form
                                  vectors or kv, kv_stride), training info
summary_embeddings.safetensors    {"summary_embeddings": [K, H_in] float32}
adapter/                          peft LoRA adapter (adapter_config.json + adapter_model.safetensors);
                                  absent when only the summary embeddings were trained
```
The base model is loaded by name through stages.model_loading (so the embedded SmolLM2
default works offline) and the LoRA adapter is merged into it for inference.

Published princeton-nlp checkpoints (AutoCompressor-Llama-2-7b-6k, AutoCompressor-2.7b-6k,
-2.7b-30k, -1.3b-30k; HF model cards and config.json): a plain transformers ``llama`` /
``opt`` directory whose config.json carries the extra keys ``summary_length`` (50),
``accumulate_summary`` (true), ``segment_gradient_checkpointing`` and whose weights use the
stock parameter names plus ``embed_summary.weight`` [summary_length, H_in]. The Llama-2 model
was trained with LoRA (r=16 on q/k/v/o, ``embed_summary`` as a module to save; run/train_llama.sh)
but is published merged: 13.5 GB of bf16 full weights in pytorch_model-0000x-of-00002.bin.
The OPT models are full fine-tunes (train.sh: lr 2e-5, no LoRA; float32 pytorch_model.bin).
Current transformers loads the stock weights (ignoring ``embed_summary.weight``); we read that tensor ourselves.

Shipped checkpoints (package data, our format without training state): ``SHIPPED`` maps a
base model name and a summary form to its directory under ``checkpoints/``: ``vectors``
(the paper's AutoCompressor: summary vectors accumulated over segments, read as a soft
prompt; the default) and ``kv`` (the named variant: every k-th token's keys/values kept
per segment, with a LoRA). ``resolve_checkpoint`` picks it when a job names no checkpoint,
and refuses a named checkpoint whose form is not the one the job asks for
(jobs/results/autocompressor/ says how each was trained and what it measures).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from stages.autocompressor.checkpoint_files import (  # noqa: F401 - re-exported: the files' questions' old home
    CONFIG_FILE,
    FORMAT,
    SHIPPED,
    SHIPPED_DIR,
    SUMMARY_FORMS,
    checkpoint_form,
    checkpoint_problems,
    is_own_checkpoint,
    read_own_config,
    resolve_checkpoint,
    same_model,
    shipped_checkpoint,
    tokenizer_source,
)
from stages.autocompressor.model import ACConfig, AutoCompressor, scheme_for
from stages.model_loading import load_causal_lm, load_tokenizer, resolve_dtype

log = logging.getLogger(__name__)

SUMMARY_FILE = "summary_embeddings.safetensors"
ADAPTER_DIR = "adapter"
SUMMARY_KEY = "embed_summary.weight"  # the published checkpoints' parameter name


def save_autocompressor(
    ac: AutoCompressor, out_dir: str | Path, base_model: str, training: dict[str, Any] | None = None
) -> Path:
    """Write ``ac`` as our checkpoint directory (see module docstring). Returns the path.

    ``ac.lm`` is either a peft model (its LoRA adapter is saved) or the frozen base model.
    """
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {"summary_embeddings": ac.summary_embeddings.detach().float().cpu().contiguous()}
    if ac.config.summary_scale == "centered":
        tensors["summary_center"] = ac.summary_center.detach().float().cpu().contiguous()
    save_file(tensors, str(out / SUMMARY_FILE))
    has_lora = hasattr(ac.lm, "peft_config")
    if has_lora:
        ac.lm.save_pretrained(str(out / ADAPTER_DIR))
    cfg = ac.config
    meta = {
        "format": FORMAT,
        "version": 1,
        "base_model": base_model,
        "summary_length": cfg.summary_length,
        "accumulate_summary": cfg.accumulate_summary,
        "position_scheme": cfg.position_scheme,
        "bos_first_segment": cfg.bos_first_segment,
        "summary_scale": cfg.summary_scale,
        "summary_form": cfg.summary_form,
        "kv_stride": cfg.kv_stride,
        "lora": has_lora,
        "training": training or {},
    }
    (out / CONFIG_FILE).write_text(json.dumps(meta, indent=2))
    return out


def load_own(
    path: str | Path, dtype: str = "auto", device: torch.device | None = None, merge: bool = True
):
    """Load our checkpoint. Returns (AutoCompressor, tokenizer); LoRA merged unless merge=False."""
    from safetensors.torch import load_file

    path = Path(path)
    meta = read_own_config(path)
    device = device or torch.device("cpu")
    lm, tok = load_causal_lm(meta["base_model"], dtype, device)
    if meta.get("lora"):
        from peft import PeftModel

        lm = PeftModel.from_pretrained(lm, str(path / ADAPTER_DIR))
        if merge:
            lm = lm.merge_and_unload()
    config = ACConfig(
        summary_length=int(meta["summary_length"]),
        accumulate_summary=bool(meta["accumulate_summary"]),
        position_scheme=meta["position_scheme"],
        bos_first_segment=bool(meta["bos_first_segment"]),
        summary_scale=meta.get("summary_scale", "none"),  # absent in version-1 files: none
        summary_form=meta.get("summary_form", "vectors"),  # absent before the kv form
        kv_stride=int(meta.get("kv_stride", 10)),
    )
    tensors = load_file(str(path / SUMMARY_FILE))
    ac = AutoCompressor(lm, config, tensors["summary_embeddings"]).to(device).eval()
    if config.summary_scale == "centered":
        if "summary_center" not in tensors:
            raise ValueError(
                f"{path / SUMMARY_FILE}: summary_scale is centered but the file has no "
                "summary_center tensor (allowed keys: summary_embeddings, summary_center)"
            )
        ac.summary_center.copy_(tensors["summary_center"])
    return ac, tok


# ----------------------------------------------------------------------------- published
def _local_dir(name: str) -> Path:
    """A local checkpoint directory, or the HF cache snapshot of a hub id (offline: cache only)."""
    if Path(name).is_dir():
        return Path(name)
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.bin", "*.safetensors", "*.model", "*.txt"]
    return Path(snapshot_download(repo_id=name, allow_patterns=patterns))


def _weight_files(d: Path) -> list[Path]:
    """Weight files that may hold ``embed_summary.weight`` (the index tells which shard)."""
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (d / index).is_file():
            weight_map = json.loads((d / index).read_text())["weight_map"]
            if SUMMARY_KEY in weight_map:
                return [d / weight_map[SUMMARY_KEY]]
            return []
    return [p for p in (d / "model.safetensors", d / "pytorch_model.bin") if p.is_file()]


def read_summary_embeddings(d: Path) -> torch.Tensor:
    """The ``embed_summary.weight`` tensor [K, H_in] of a published checkpoint directory."""
    for f in _weight_files(d):
        if f.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(f), framework="pt") as sf:
                if SUMMARY_KEY in sf.keys():
                    return sf.get_tensor(SUMMARY_KEY)
        else:
            state = torch.load(str(f), map_location="cpu", weights_only=True, mmap=True)
            if SUMMARY_KEY in state:
                return state[SUMMARY_KEY].clone()
    raise ValueError(f"{d}: no {SUMMARY_KEY!r} tensor in the checkpoint's weight files")


def load_published(name: str, dtype: str = "auto", device: torch.device | None = None):
    """Load a princeton-nlp AutoCompressor (directory or hub id). Returns (AutoCompressor, tokenizer)."""
    from transformers import AutoModelForCausalLM

    d = _local_dir(name)
    cfg = json.loads((d / "config.json").read_text())
    if "summary_length" not in cfg:
        raise ValueError(
            f"{name}: config.json has no summary_length; not an AutoCompressor checkpoint "
            f"(nor a directory saved by `longdoc train-autocompressor`, which has {CONFIG_FILE})"
        )
    if cfg.get("model_type") not in ("llama", "opt"):
        raise ValueError(
            f"{name}: model_type {cfg.get('model_type')!r} not supported; allowed: llama, opt"
        )
    device = device or torch.device("cpu")
    lm = AutoModelForCausalLM.from_pretrained(
        str(d), dtype=resolve_dtype(dtype, device), attn_implementation="sdpa"
    )
    lm.to(device).eval()
    tok = load_tokenizer(str(d))
    config = ACConfig(
        summary_length=int(cfg["summary_length"]),
        accumulate_summary=bool(cfg.get("accumulate_summary", True)),
        position_scheme=scheme_for(cfg["model_type"]),
        bos_first_segment=True,
    )
    ac = AutoCompressor(lm, config, read_summary_embeddings(d)).to(device).eval()
    return ac, tok


# ----------------------------------------------------------------------------- entry point
def load_autocompressor(checkpoint: str, dtype: str = "auto", device: torch.device | None = None):
    """Load any AutoCompressor checkpoint for inference. Returns ``(lm, tokenizer, ac)``.

    ``lm`` is the causal LM the decoder feeds with forward_step (LoRA merged); ``ac.lm`` is
    the same object. ``checkpoint``: our directory (has autocompressor.json), a published
    checkpoint directory, or a published hub id (needs the HF cache when offline).
    """
    if is_own_checkpoint(checkpoint):
        ac, tok = load_own(checkpoint, dtype, device)
    else:
        ac, tok = load_published(checkpoint, dtype, device)
    ac.eval()
    ac.requires_grad_(False)
    return ac.lm, tok, ac
