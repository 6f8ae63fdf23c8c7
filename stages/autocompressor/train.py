"""Training an AutoCompressor: summary embeddings + LoRA adapters on a frozen causal LM.

Objective (Chevalier et al., 2023, Sec. 3; authors' substep_trainer.py): each training
block of ``block_tokens`` is cut into ``substeps`` equal slices; each slice is read as
``segments_per_substep`` segments with randomised lengths (uniform random breakpoints,
every segment >= ``min_segment_tokens``); the loss is next-token cross-entropy on every
segment conditioned on the summaries of all earlier segments (accumulated). After each
substep the loss is back-propagated and the soft prompt is detached (stop-gradient), so
gradients flow through at most ``segments_per_substep`` segments' summaries (the paper's
Llama-2 run: 2 substeps x 2 segments of a 6,144-token block, 50 summary vectors, LoRA
r=16 on q/k/v/o, lr 8e-4; run/train_llama.sh).

Not in the paper: ``autoencode_weight`` > 0 adds, per segment, the loss of reconstructing
the segment from its own summary (model.AutoCompressor.reconstruction_loss), weighted and
added to the next-token loss. The logged ``loss`` stays the next-token loss alone, so curves
of runs with and without it compare; ``ae_loss`` is logged beside it.

Contract: ``make_trainable(lm, ...)`` returns an AutoCompressor whose only trainable
parameters are the summary embeddings and the LoRA weights; ``fit(ac, batches, cfg)``
runs ``cfg.steps`` optimizer steps and reports progress through ``on_log`` (stats are
returned/handed over, never printed here); ``train(cfg)`` is the whole job: load, data,
fit, save (checkpoint.save_autocompressor).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from schemas.spec import EMBEDDED_MODEL
from stages.autocompressor.model import ACConfig, AutoCompressor, scheme_for
from stages.decoding.backends import accelerator, device_backend

Segmenter = Callable[[int, random.Random], list[int]]


@dataclass
class TrainConfig:
    base_model: str = EMBEDDED_MODEL
    data: tuple[str, ...] = ("jobs/corpus",)
    out_dir: str = "out/autocompressor"
    summary_length: int = 50
    accumulate_summary: bool = True
    # See model.ACConfig. "none" (the paper's feed-back) stays the default: embedding_rms
    # did not make summaries useful in a 240-step CPU run either (jobs/results/autocompressor).
    summary_scale: str = "none"
    autoencode_weight: float = 0.0  # 0: the paper's objective; see the module docstring
    # "kv": each segment kept as the K/V of every kv_stride-th token (kv_form.py); one
    # masked pass per block, so substeps must be 1 and there is no autoencoding.
    summary_form: str = "vectors"
    kv_stride: int = 10
    block_tokens: int = 2048
    substeps: int = 2
    segments_per_substep: int = 2
    min_segment_tokens: int = 32
    batch_size: int = 2
    grad_accum: int = 1
    steps: int = 1000
    lr: float = 8e-4
    warmup_steps: int = 50
    max_grad_norm: float = 1.0
    lora_r: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.05
    lora_targets: tuple[str, ...] = ("q_proj", "v_proj", "o_proj", "out_proj")
    grad_checkpointing: bool = False
    device: str = "auto"
    dtype: str = "auto"
    seed: int = 0
    log_every: int = 10
    save_every: int = 0  # write out_dir/last every N steps (0: only at the end of the run)
    resume: bool = False  # continue from out_dir/last (same settings) instead of starting over
    stop_after: int = 0  # run at most N steps now (0: to cfg.steps); resume later

    def validate(self) -> None:
        for name in (
            "summary_length",
            "substeps",
            "segments_per_substep",
            "batch_size",
            "grad_accum",
            "steps",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        # The model's own checks (allowed summary_scale / summary_form, kv_stride >= 1), run
        # here so a bad setting fails before the model loads.
        ACConfig(
            self.summary_length,
            summary_scale=self.summary_scale,  # type: ignore[arg-type]
            summary_form=self.summary_form,  # type: ignore[arg-type]
            kv_stride=self.kv_stride,
        )
        need = self.substeps * self.segments_per_substep * self.min_segment_tokens
        if self.block_tokens < need:
            raise ValueError(
                f"block_tokens={self.block_tokens} is too short for {self.substeps} substeps x "
                f"{self.segments_per_substep} segments of >= {self.min_segment_tokens} tokens (need {need})"
            )
        for name in ("save_every", "stop_after", "log_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.autoencode_weight <= 100.0:
            raise ValueError(
                f"autoencode_weight must be in [0, 100] (0 = the paper's objective), got {self.autoencode_weight}"
            )
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive number (the paper's Llama-2 LoRA run: 8e-4), got {self.lr}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if self.lora_alpha < 1:
            raise ValueError(f"lora_alpha must be >= 1, got {self.lora_alpha}")
        if self.lora_r < 0:
            raise ValueError(
                f"lora_r must be >= 0 (0 = train only the summary embeddings), got {self.lora_r}"
            )
        if self.summary_form == "kv":
            if self.substeps != 1 or self.autoencode_weight != 0.0:
                raise ValueError(
                    "summary_form kv reads a block in one masked pass: it needs substeps 1 and "
                    f"autoencode_weight 0 (got substeps {self.substeps}, autoencode_weight {self.autoencode_weight})"
                )
            if self.lora_r == 0:
                raise ValueError("summary_form kv trains only the LoRA adapter: lora_r must be >= 1")


@dataclass
class TrainResult:
    out_dir: Path | None
    history: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    model: AutoCompressor | None = None  # the trained model (peft-wrapped, unmerged)


def random_segment_lengths(total: int, n: int, min_len: int, rng: random.Random) -> list[int]:
    """n lengths >= min_len summing to total, breakpoints drawn uniformly (randomised segmenting)."""
    free = total - n * min_len
    if free < 0:
        raise ValueError(f"cannot cut {total} tokens into {n} segments of >= {min_len}")
    cuts = sorted(rng.randint(0, free) for _ in range(n - 1))
    bounds = [0, *cuts, free]
    return [bounds[i + 1] - bounds[i] + min_len for i in range(n)]


def make_trainable(
    lm,
    summary_length: int,
    lora_r: int = 8,
    lora_alpha: int = 16,
    lora_dropout: float = 0.05,
    lora_targets: tuple[str, ...] = ("q_proj", "v_proj", "o_proj", "out_proj"),
    accumulate_summary: bool = True,
    summary_scale: str = "none",
    summary_form: str = "vectors",
    kv_stride: int = 10,
) -> AutoCompressor:
    """Freeze ``lm``, add LoRA (lora_r > 0) on the target projections present, wrap it."""
    lm.requires_grad_(False)
    if lora_r > 0:
        from peft import LoraConfig, get_peft_model

        present = {name.rsplit(".", 1)[-1] for name, _ in lm.named_modules()}
        targets = [t for t in lora_targets if t in present]
        if not targets:
            linear = sorted({name.rsplit(".", 1)[-1] for name, m in lm.named_modules()
                             if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"})
            raise ValueError(
                f"none of the LoRA targets {list(lora_targets)} exist in the model; its projections are named "
                f"{', '.join(linear[:12]) or 'otherwise'}: pass --lora-targets with those (e.g. --lora-targets "
                f"{','.join(linear[:2]) or 'NAME'}), or --lora-r 0 to train only the summary embeddings")
        lora = LoraConfig(
            r=lora_r, lora_alpha=lora_alpha, lora_dropout=lora_dropout, target_modules=targets
        )
        lm = get_peft_model(lm, lora)
    config = ACConfig(
        summary_length=summary_length,
        accumulate_summary=accumulate_summary,
        position_scheme=scheme_for(lm.config.model_type),
        summary_scale=summary_scale,  # type: ignore[arg-type]
        summary_form=summary_form,  # type: ignore[arg-type]
        kv_stride=kv_stride,
    )
    ac = AutoCompressor(lm, config)
    if summary_form == "kv":  # the kv form has no summary tokens: nothing to learn there
        ac.summary_embeddings.requires_grad_(False)
    return ac


def _lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warmup, then cosine decay to 10% of the peak."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def train_step(
    ac: AutoCompressor,
    batch: torch.Tensor,
    cfg: TrainConfig,
    rng: random.Random,
    segmenter: Segmenter | None = None,
    ae_losses: list[float] | None = None,
) -> list[float]:
    """Forward/backward over one batch [B, T]; gradients accumulate. Returns per-substep
    next-token losses; with cfg.autoencode_weight > 0 the per-substep reconstruction losses
    are appended to ``ae_losses``."""
    segmenter = segmenter or (
        lambda total, r: random_segment_lengths(
            total, cfg.segments_per_substep, cfg.min_segment_tokens, r
        )
    )
    t = batch.shape[1]
    edges = [round(i * t / cfg.substeps) for i in range(cfg.substeps + 1)]
    amp = device_backend(batch.device).autocast(batch.device)
    soft, losses = None, []
    autoencode = cfg.autoencode_weight > 0
    for s in range(cfg.substeps):
        part = batch[:, edges[s] : edges[s + 1]]
        lengths = segmenter(part.shape[1], rng)
        # kv form: the first segment reads nothing compressed, so only the segments after
        # it (which read its kept slots) are scored; that is what the adapter is for.
        loss_from = lengths[0] if cfg.summary_form == "kv" else 0
        with amp:
            out = ac(part, lengths, softprompt=soft, autoencode=autoencode, loss_from=loss_from)
        total = out.loss
        if out.ae_loss is not None:
            total = total + cfg.autoencode_weight * out.ae_loss
            if ae_losses is not None:
                ae_losses.append(float(out.ae_loss.detach()))
        (total / cfg.grad_accum).backward()
        soft = out.softprompt.detach()  # stop-gradient between substeps
        losses.append(float(out.loss.detach()))
    return losses


def fit(
    ac: AutoCompressor,
    data: Iterator[torch.Tensor],
    cfg: TrainConfig,
    on_log: Callable[[dict], None] | None = None,
    segmenter: Segmenter | None = None,
    state: dict | None = None,
    on_step: Callable[[dict], None] | None = None,
    on_save: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Run optimizer steps on batches from ``data`` (moved to ac's device).

    Steps run from ``state["step"]`` (0 without ``state``, a resume.capture dict) to
    ``cfg.steps``, or ``cfg.stop_after`` of them; the batches the earlier steps used are
    skipped, so a resumed run continues exactly. ``on_step`` gets one record per step
    (step, loss, lr, elapsed_s, tokens); ``on_save`` gets a resume.capture state every
    ``cfg.save_every`` steps and after the last step run. Returns the on_log records.
    """
    from stages.autocompressor import resume

    params = [p for p in ac.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: _lr_factor(s, cfg.warmup_steps, cfg.steps)
    )
    rng = random.Random(cfg.seed)
    start, elapsed0, tokens = 0, 0.0, 0
    if state is not None:
        resume.restore(state, ac, opt, sched, rng)
        start, elapsed0, tokens = state["step"], state["elapsed_s"], state["tokens"]
        for _ in range(start * cfg.grad_accum):  # replay the data order (indexing only)
            next(data)
    stop = cfg.steps if not cfg.stop_after else min(cfg.steps, start + cfg.stop_after)
    ac.train()
    history: list[dict] = []
    t0, run_tokens, window, ae_window = time.perf_counter(), 0, [], []
    for step in range(start, stop):
        losses, ae = [], []
        for _ in range(cfg.grad_accum):
            batch = next(data).to(ac.device)
            losses.append(sum(train_step(ac, batch, cfg, rng, segmenter, ae)) / cfg.substeps)
            run_tokens += batch.numel()
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        lr = sched.get_last_lr()[0]  # the lr this step used
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        window += losses
        ae_window += ae
        dt = time.perf_counter() - t0
        if on_step:
            on_step(
                {
                    "step": step + 1,
                    "loss": sum(losses) / len(losses),
                    "lr": lr,
                    "elapsed_s": round(elapsed0 + dt, 2),
                    "tokens": tokens + run_tokens,
                    "ae_loss": sum(ae) / len(ae) if ae else None,
                }
            )
        if (step + 1) % max(1, cfg.log_every) == 0 or step + 1 == stop:
            rec = {
                "step": step + 1,
                "loss": sum(window) / len(window),
                "lr": sched.get_last_lr()[0],
                "tokens_per_s": run_tokens / dt,
                "s_per_step": dt / (step + 1 - start),
            }
            if ae_window:
                rec["ae_loss"] = sum(ae_window) / len(ae_window)
            history.append(rec)
            window, ae_window = [], []
            if on_log:
                on_log(rec)
        if on_save and ((cfg.save_every and (step + 1) % cfg.save_every == 0) or step + 1 == stop):
            on_save(resume.capture(step + 1, ac, opt, sched, rng, elapsed0 + dt, tokens + run_tokens))
    ac.eval()
    return history


def pick_train_device(device: str) -> torch.device:
    """``auto``: the accelerator torch sees, else the CPU; otherwise the named device, which a
    step backend must run on and find visible (stages/decoding/backends knows the devices:
    a new one is trained on once its backend is registered). ValueError naming the fix."""
    if device == "auto":
        return accelerator() or torch.device("cpu")
    try:
        dev = torch.device(device)
        backend = device_backend(dev)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"device {device!r} not supported ({e}); allowed: auto, or a device such as cpu or cuda:0") from e
    if not backend.is_available(dev):
        raise ValueError(f"device {device!r}: no such device is visible to torch here; use auto or cpu")
    return dev


def train(cfg: TrainConfig, on_log: Callable[[dict], None] | None = None) -> TrainResult:
    """The whole job: base model + corpus -> trained AutoCompressor saved to cfg.out_dir."""
    from stages.autocompressor import resume
    from stages.autocompressor.checkpoint import save_autocompressor
    from stages.autocompressor.data import (
        batches,
        find_text_files,
        read_training_texts,
        token_blocks,
    )
    from stages.model_loading import load_causal_lm

    cfg.validate()
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    device = pick_train_device(cfg.device)
    files = find_text_files(cfg.data)
    # The output folder's state is checked before the model loads (a minute on a big model).
    info = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()}
    if not cfg.resume and resume.find_checkpoint(cfg.out_dir):
        raise ValueError(
            f"out_dir {cfg.out_dir!r} already holds a training checkpoint; pass resume "
            "(--resume) to continue it or choose another out_dir"
        )
    state = resume.load_state(cfg.out_dir, info) if cfg.resume else None
    # Frozen base weights in the serving dtype (bf16 on GPU); the trainable LoRA and summary
    # parameters stay float32 (peft and the wrapper keep them so) under bf16 autocast.
    lm, tok = load_causal_lm(cfg.base_model, cfg.dtype, device)
    blocks = token_blocks(read_training_texts(files), tok, cfg.block_tokens)
    if cfg.grad_checkpointing:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ac = make_trainable(
        lm,
        cfg.summary_length,
        cfg.lora_r,
        cfg.lora_alpha,
        cfg.lora_dropout,
        cfg.lora_targets,
        cfg.accumulate_summary,
        cfg.summary_scale,
        cfg.summary_form,
        cfg.kv_stride,
    ).to(device)
    ac.segment_checkpointing = cfg.grad_checkpointing
    if on_log:
        n_train = sum(p.numel() for p in ac.parameters() if p.requires_grad)
        on_log(
            {
                "files": len(files),
                "blocks": int(blocks.shape[0]),
                "trainable_params": n_train,
                "device": str(device),
            }
        )
    step_log = resume.StepLog(cfg.out_dir, state["step"] if state else 0)

    def save(st: dict) -> None:
        resume.write_checkpoint(ac, cfg.out_dir, cfg.base_model, info, st)

    history = fit(
        ac, batches(blocks, cfg.batch_size, cfg.seed), cfg, on_log, state=state,
        on_step=step_log, on_save=save,
    )  # fmt: skip
    info["final_loss"] = history[-1]["loss"] if history else None
    done = (history[-1]["step"] if history else (state or {}).get("step", 0)) >= cfg.steps
    # The finished model goes to out_dir itself; an interrupted run leaves only out_dir/last.
    out = save_autocompressor(ac, cfg.out_dir, cfg.base_model, info) if done else None
    return TrainResult(out_dir=out, history=history, seconds=time.perf_counter() - t0, model=ac)
