"""Resumable AutoCompressor training: the state file, its atomic directory, the loss log.

Layout inside the training ``out_dir``:
```
last/                  the latest resumable checkpoint, always complete:
  autocompressor.json, summary_embeddings.safetensors, adapter/   our checkpoint format
  train_state.pt       step, trainable weights, optimizer, scheduler, RNG states, elapsed time
train_log.csv          one row per optimizer step: step, loss, lr, elapsed_s, tokens
train_curve.png        the loss curve (curve.plot_curve)
```
``write_checkpoint`` builds the new checkpoint in ``last.tmp/`` and swaps it in with two
renames (``last`` -> ``last.old``, ``last.tmp`` -> ``last``), so a kill at any moment leaves
either ``last/`` or ``last.old/`` complete; ``find_checkpoint`` takes whichever exists.
Exact resumption needs every source of randomness restored: the segmenter's
``random.Random`` state, torch's CPU generator and this machine's accelerator's (LoRA
dropout; its step backend's ``rng_state``, keyed ``cuda_rng`` on CUDA), the optimizer and
scheduler states; the data order is replayed (``fit`` skips the batches already used).
"""

from __future__ import annotations

import csv
import random
import shutil
from pathlib import Path
from typing import Any

import torch

from stages.autocompressor.checkpoint import save_autocompressor
from stages.autocompressor.model import AutoCompressor
from stages.decoding.backends import accelerator_backend

LAST, TMP, OLD = "last", "last.tmp", "last.old"
STATE_FILE = "train_state.pt"
LOG_FILE = "train_log.csv"
# ae_loss: the reconstruction loss (empty unless the run trains with autoencode_weight > 0).
LOG_FIELDS = ("step", "loss", "lr", "elapsed_s", "tokens", "ae_loss")
# Settings that must not change between a run and its resumption (the rest may, e.g. threads).
FIXED = (
    "base_model", "summary_length", "accumulate_summary", "summary_scale", "block_tokens", "substeps",
    "segments_per_substep", "min_segment_tokens", "batch_size", "grad_accum", "steps", "lr",
    "warmup_steps", "max_grad_norm", "lora_r", "lora_alpha", "lora_dropout", "lora_targets", "seed",
    "autoencode_weight", "summary_form", "kv_stride",
)  # fmt: skip


def trainable_state(ac: AutoCompressor) -> dict[str, torch.Tensor]:
    """The trainable parameters by name (summary embeddings + LoRA), detached CPU copies."""
    return {n: p.detach().cpu().clone() for n, p in ac.named_parameters() if p.requires_grad}


def capture(
    step: int,
    ac: AutoCompressor,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    rng: random.Random,
    elapsed_s: float,
    tokens: int,
) -> dict[str, Any]:
    """Everything needed to continue after optimizer step ``step`` exactly."""
    state = {
        "step": step,
        "trainable": trainable_state(ac),
        "summary_center": ac.summary_center.detach().cpu().clone(),
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "py_rng": rng.getstate(),
        "torch_rng": torch.get_rng_state(),
        "elapsed_s": elapsed_s,
        "tokens": tokens,
    }
    acc = accelerator_backend()
    if acc is not None:  # this machine's accelerator: its generators too
        state[_rng_key(acc)] = acc.rng_state()
    return state


def _rng_key(acc) -> str:
    """The state's key of an accelerator's generators (``cuda_rng`` on CUDA)."""
    return f"{acc.device_type}_rng"


def restore(
    state: dict[str, Any],
    ac: AutoCompressor,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    rng: random.Random,
) -> None:
    """Inverse of ``capture``: weights, optimizer, scheduler and RNGs as they were."""
    params = dict(ac.named_parameters())
    names = {n for n, p in params.items() if p.requires_grad}
    if names != set(state["trainable"]):
        missing, extra = names - set(state["trainable"]), set(state["trainable"]) - names
        raise ValueError(
            f"the checkpoint's trainable parameters do not match the model "
            f"(missing {sorted(missing)[:3]}, unexpected {sorted(extra)[:3]}); "
            "resume with the settings of the original run"
        )
    with torch.no_grad():
        for n, t in state["trainable"].items():
            params[n].copy_(t)
        if "summary_center" in state:  # absent in states saved before summary_scale centered
            ac.summary_center.copy_(state["summary_center"])
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    rng.setstate(state["py_rng"])
    torch.set_rng_state(state["torch_rng"])
    acc = accelerator_backend()
    if acc is not None and _rng_key(acc) in state:
        acc.set_rng_state(state[_rng_key(acc)])


def write_checkpoint(
    ac: AutoCompressor, out_dir: str | Path, base_model: str, info: dict, state: dict
) -> Path:
    """Atomically replace ``out_dir/last`` with the model (our format) + ``state``."""
    out = Path(out_dir)
    tmp, last, old = out / TMP, out / LAST, out / OLD
    shutil.rmtree(tmp, ignore_errors=True)
    save_autocompressor(ac, tmp, base_model, {**info, "step": state["step"]})
    torch.save(state, tmp / STATE_FILE)
    if last.exists():
        shutil.rmtree(old, ignore_errors=True)
        last.rename(old)
    tmp.rename(last)
    shutil.rmtree(old, ignore_errors=True)
    return last


def saved_step(out_dir: str | Path) -> int | None:
    """The step of ``out_dir``'s resumable checkpoint (``find_checkpoint``), or None."""
    d = find_checkpoint(out_dir)
    if d is None:
        return None
    import json

    step = json.loads((d / "autocompressor.json").read_text()).get("training", {}).get("step")
    return int(step) if isinstance(step, int) else None


def find_checkpoint(out_dir: str | Path) -> Path | None:
    """The complete resumable checkpoint in ``out_dir`` (``last``, else ``last.old``), or None."""
    for name in (LAST, OLD):
        d = Path(out_dir) / name
        if (d / STATE_FILE).is_file():
            return d
    return None


def load_state(out_dir: str | Path, info: dict) -> dict[str, Any]:
    """The saved training state; ValueError if there is none or a FIXED setting changed."""
    d = find_checkpoint(out_dir)
    if d is None:
        raise ValueError(f"resume: no {LAST}/{STATE_FILE} under {str(out_dir)!r} to resume from")
    import json

    saved = json.loads((d / "autocompressor.json").read_text())["training"]
    saved.setdefault("summary_scale", "none")  # runs saved before these settings existed
    saved.setdefault("autoencode_weight", 0.0)
    saved.setdefault("summary_form", "vectors")
    saved.setdefault("kv_stride", 10)
    from stages.autocompressor.checkpoint_files import same_model

    changed = {k: (saved.get(k), info.get(k)) for k in FIXED
               if not (same_model(str(saved.get(k)), str(info.get(k))) if k == "base_model" else saved.get(k) == info.get(k))}
    if changed:
        k, (was, now) = next(iter(changed.items()))
        raise ValueError(
            f"resume: {k} was {was!r} in the saved run, now {now!r}; "
            f"resume with the same settings (changed: {sorted(changed)})"
        )
    # Plain tensors, numbers and tuples only: a training folder is data, never code to run.
    return torch.load(d / STATE_FILE, map_location="cpu", weights_only=True)


class StepLog:
    """Appends one CSV row per optimizer step to ``out_dir/train_log.csv``.

    On resumption from step ``start`` rows after ``start`` (written after the last save by
    the interrupted run) are dropped first, so the log matches the weights.
    """

    def __init__(self, out_dir: str | Path, start: int = 0):
        self.path = Path(out_dir) / LOG_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        rows = read_log(self.path) if start > 0 and self.path.is_file() else []
        with open(self.path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=LOG_FIELDS)
            w.writeheader()
            w.writerows(r for r in rows if int(r["step"]) <= start)

    def __call__(self, rec: dict) -> None:
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=LOG_FIELDS, extrasaction="ignore").writerow(rec)


def read_log(path: str | Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def export_checkpoint(out_dir: str | Path, dest: str | Path) -> Path:
    """Copy the latest checkpoint of ``out_dir`` to ``dest`` for shipping: our format only
    (no train_state.pt, no peft README); ``dest`` is replaced. Returns ``dest``."""
    src = find_checkpoint(out_dir)
    if src is None:
        raise ValueError(f"export: no {LAST}/{STATE_FILE} under {str(out_dir)!r}")
    dest = Path(dest)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns(STATE_FILE, "README.md"))
    adapter = tmp / "adapter" / "adapter_config.json"
    if adapter.is_file():  # name the base model portably, not by this machine's cache path
        import json

        conf = json.loads(adapter.read_text())
        conf["base_model_name_or_path"] = json.loads((tmp / "autocompressor.json").read_text())[
            "base_model"
        ]
        adapter.write_text(json.dumps(conf, indent=2))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest
