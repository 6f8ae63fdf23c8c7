"""AutoCompressor model wrapper: a causal LM plus learned summary-token embeddings.

Mechanism (Chevalier et al., 2023, "Adapting Language Models to Compress Contexts",
arXiv:2305.14788), checked against the authors' code (github.com/princeton-nlp/AutoCompressors:
``auto_compressor.py`` ``AutoCompressorMixin`` / ``OPTAutoCompressorModel`` /
``LlamaAutoCompressorModel``, ``modeling_flash_llama.py``, ``substep_trainer.py``) and the
published Hugging Face configs:

- ``summary_length`` (K) learned summary-token embeddings (parameter ``embed_summary.weight``,
  shape [K, H_in], H_in = input-embedding width, initialised to the EOS token's embedding)
  are appended after each segment's tokens.
- Each segment is one forward pass over ``[soft prompt ; segment tokens ; K summary tokens]``.
  The final hidden states (after the final norm, and OPT's ``project_out`` when present) at
  the K summary positions are that segment's summary vectors.
- ``accumulate_summary=True`` (every published AutoCompressor): the soft prompt of segment s
  is the concatenation, oldest first, of the summaries of segments 0..s-1. ``False`` is the
  RMT baseline: only the previous segment's summary is carried.
- Generation conditions on ``[soft prompt ; prompt tokens]`` (the README's
  ``model(prompt_ids, softprompt=summary_vectors)``).
- Positions differ by family:
  * Llama (RoPE, ``modeling_flash_llama.py``): no special handling; the rotary offset runs
    0..T-1 over the whole ``[soft ; segment ; summary]`` sequence of each pass, so the soft
    prompt takes positions 0..P-1 and text starts at P. We call this ``"contiguous"``.
  * OPT (learned absolute positions): ``OPTLearnedPositionalEmbeddingWithPadding`` gives
    soft-prompt and summary tokens the padding row (index 1 of ``embed_positions``, i.e. no
    position) and numbers only the text tokens from position 0. We call this
    ``"text_only"`` and express it with ``position_ids = -1`` (HF OPT adds its offset 2).

Contract: the wrapper owns no weights of the LM; ``lm`` may be a plain transformers causal
LM or a peft-wrapped one (LoRA layers live inside the modules, so calling the inner decoder
applies them). Every pass hands the decoder an explicit 4D boolean mask (see
stages/decoding/state.step_mask), so padding may sit anywhere in a row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import nn

from stages.autocompressor.config import SummaryForm, SummaryScale
from stages.decoding.state import positions_from_real, step_mask
from stages.kv.model_parts import decoder

PositionScheme = Literal["contiguous", "text_only"]
SUMMARY_SCALES: tuple[str, ...] = get_args(SummaryScale)
SUMMARY_FORMS: tuple[str, ...] = get_args(SummaryForm)
CENTER_MOMENTUM = 0.01  # weight of each training batch in the running summary mean


@dataclass(frozen=True)
class ACConfig:
    """What an AutoCompressor checkpoint fixes about the mechanism.

    summary_length: K summary vectors per segment. accumulate_summary: concatenate all
    previous summaries (True) or carry only the last (RMT). position_scheme: see module
    docstring. bos_first_segment: prepend the tokenizer's BOS to the document before
    segmenting (the published checkpoints compress ``tokenizer(context)``, BOS included).
    summary_scale: ``none`` feeds the final hidden states back as they come (the paper and
    every published checkpoint); ``embedding_rms`` rescales each summary vector to the mean
    RMS of the input-embedding rows first. Why: a final hidden state is ~14x larger than a
    token embedding in SmolLM2-135M (RMS 1.9 vs 0.13), so unscaled summaries swamp the
    residual stream at the soft-prompt slots and training has to undo that first.
    ``centered`` first subtracts the running mean summary per slot (``summary_center``, kept
    while training, saved with the checkpoint), then rescales like ``embedding_rms``. Why:
    in SmolLM2-135M a summary slot's vector is 99.6% the same for every document (cosine
    0.996 across held-out pages; 5 of 576 dimensions hold 55% of its energy), so what a
    document changes is 0.5% of the energy; centering hands that part to the next pass.
    summary_form: ``vectors`` (the paper: summary vectors fed back as a soft prompt) or
    ``kv`` (each segment kept as the keys/values of every ``kv_stride``-th token; see
    kv_form.py, where summary_length, accumulate_summary and summary_scale do not apply).
    """

    summary_length: int
    accumulate_summary: bool = True
    position_scheme: PositionScheme = "contiguous"
    bos_first_segment: bool = False
    summary_scale: SummaryScale = "none"
    summary_form: SummaryForm = "vectors"
    kv_stride: int = 10

    def __post_init__(self) -> None:
        if self.summary_length < 1 or self.kv_stride < 1:
            raise ValueError(
                f"summary_length and kv_stride must be >= 1, got {self.summary_length}, {self.kv_stride}"
            )
        for name, allowed in (("position_scheme", ("contiguous", "text_only")),
                              ("summary_scale", SUMMARY_SCALES), ("summary_form", SUMMARY_FORMS)):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"{name} {getattr(self, name)!r} not supported; allowed: " + ", ".join(allowed)
                )

def scheme_for(model_type: str) -> PositionScheme:
    """OPT's learned absolute positions follow the OPT convention; RoPE families the Llama one."""
    return "text_only" if model_type == "opt" else "contiguous"


def position_ids(
    real: torch.Tensor,
    is_text: torch.Tensor,
    scheme: PositionScheme,
    start: torch.Tensor | None = None,
) -> torch.Tensor:
    """Position ids for a block mixing soft/summary vectors and text tokens.

    real: [B, T] bool (False = padding); is_text: [B, T] bool (False = soft prompt or summary
    token); start: optional [B] offset. contiguous: every real slot counts (0.. over real
    slots). text_only: text slots count from 0, every other slot gets -1 (OPT's no-position
    row). Padding slots get an arbitrary position (they are masked out).
    """
    if scheme == "contiguous":
        return positions_from_real(real, start)
    text = real & is_text
    pos = text.long().cumsum(dim=1) - 1
    if start is not None:
        pos = pos + start[:, None]
    return torch.where(text, pos, torch.full_like(pos, -1))


@dataclass
class SegmentLoss:
    """Output of ``AutoCompressor.forward``: summed next-token loss, number of predicted
    tokens, the soft prompt after the last segment ([B, P, H_in]), and (``autoencode``)
    the summed reconstruction loss of every segment from its own summary and its tokens."""

    loss_sum: torch.Tensor
    n_tokens: int
    softprompt: torch.Tensor
    ae_loss_sum: torch.Tensor | None = None
    ae_tokens: int = 0

    @property
    def ae_loss(self) -> torch.Tensor | None:
        return None if self.ae_loss_sum is None else self.ae_loss_sum / max(1, self.ae_tokens)

    @property
    def loss(self) -> torch.Tensor:
        return self.loss_sum / max(1, self.n_tokens)


class AutoCompressor(nn.Module):
    """A causal LM turned AutoCompressor: ``lm`` + ``summary_embeddings`` [K, H_in]."""

    def __init__(
        self, lm: nn.Module, config: ACConfig, summary_embeddings: torch.Tensor | None = None
    ):
        super().__init__()
        self.lm = lm
        self.config = config
        emb = lm.get_input_embeddings().weight  # [V, H_in]
        if summary_embeddings is None:
            eos = lm.config.eos_token_id
            eos = eos[0] if isinstance(eos, (list, tuple)) else eos
            if eos is None:
                raise ValueError(
                    "the base model has no eos_token_id to initialise summary tokens from"
                )
            summary_embeddings = emb[eos].detach().float()[None].repeat(config.summary_length, 1)
        if tuple(summary_embeddings.shape) != (config.summary_length, emb.shape[1]):
            raise ValueError(
                f"summary embeddings of shape {tuple(summary_embeddings.shape)} do not match "
                f"summary_length={config.summary_length} x hidden={emb.shape[1]}"
            )
        # Kept in float32 (tiny) so training updates are exact; cast to the LM dtype at use.
        self.summary_embeddings = nn.Parameter(
            summary_embeddings.detach().float().to(emb.device).clone()
        )
        self.segment_checkpointing = False
        # Mean RMS of the token embeddings: the scale summaries are brought to under
        # summary_scale="embedding_rms" (embeddings are frozen, so this is a constant).
        self.embedding_rms = float(emb.detach().float().pow(2).mean(-1).sqrt().mean())
        # Running mean of the raw summary vectors per slot [K, H_in] (summary_scale
        # "centered"); all zeros until the first training batch sets it.
        self.register_buffer(
            "summary_center", torch.zeros_like(self.summary_embeddings.detach()), persistent=True
        )

    # ------------------------------------------------------------------ basics
    @property
    def device(self) -> torch.device:
        return self.lm.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm.get_input_embeddings().weight.dtype

    @property
    def hidden_size(self) -> int:
        return int(self.summary_embeddings.shape[1])

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings: ids [B, T] -> [B, T, H_in]."""
        return self.lm.get_input_embeddings()(ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head: hidden [B, T, H_in] -> logits [B, T, V] float32."""
        return self.lm.get_output_embeddings()(hidden).float()

    def empty_softprompt(self, batch: int) -> torch.Tensor:
        return torch.zeros(batch, 0, self.hidden_size, dtype=self.dtype, device=self.device)

    def next_softprompt(self, soft: torch.Tensor, summary: torch.Tensor) -> torch.Tensor:
        """Soft prompt for the next segment: accumulate (concat) or replace (RMT)."""
        return torch.cat([soft, summary], dim=1) if self.config.accumulate_summary else summary

    # ------------------------------------------------------------------ one segment
    def segment_forward(
        self, soft: torch.Tensor, ids: torch.Tensor, valid: torch.Tensor, with_summary: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass over ``[soft ; segment ; summary tokens]``.

        soft: [B, P, H_in] (all real); ids: [B, L] long; valid: [B, L] bool (padding may sit
        anywhere). Returns (text hidden [B, L, H_in], summary vectors [B, K, H_in]; K = 0 when
        ``with_summary`` is False).
        """
        b, p, length = ids.shape[0], soft.shape[1], ids.shape[1]
        k = self.config.summary_length if with_summary else 0
        dev = ids.device
        tok = self.embed(ids)
        summ = self.summary_embeddings[None].expand(b, -1, -1)[:, :k].to(tok.dtype)
        x = torch.cat([soft.to(tok.dtype), tok, summ], dim=1)  # [B, P+L+K, H_in]
        ones = lambda n: torch.ones(b, n, dtype=torch.bool, device=dev)  # noqa: E731
        real = torch.cat([ones(p), valid, ones(k)], dim=1)
        is_text = torch.cat([~ones(p), ones(length), ~ones(k)], dim=1)
        pos = position_ids(real, is_text, self.config.position_scheme)
        mask = step_mask(real[:, :0], real)  # [B, 1, T, T]: causal over real slots
        out = decoder(self.lm)(
            inputs_embeds=x, attention_mask=mask, position_ids=pos, use_cache=False
        )
        h = out.last_hidden_state
        summary = h[:, p + length :]
        scaled = self.scale_summary(summary)
        if self.training and self.config.summary_scale == "centered" and k:
            # After scaling: a batch is centered by the mean of the batches before it, so a
            # lone row is never centered on itself (all zeros; NaN in attention's backward).
            self.update_center(summary)
        return h[:, p : p + length], scaled

    @torch.no_grad()
    def update_center(self, summary: torch.Tensor) -> None:
        """Fold a batch of raw summaries [B, K, H_in] into ``summary_center`` (exponential
        moving average; the first batch sets it). Only training calls this; recomputation
        under segment checkpointing folds a batch in twice, harmless for a running mean."""
        mean = summary.detach().float().mean(0)
        # Decided on the device (no host sync per segment): weight 1 while still all zeros.
        unset = ~self.summary_center.any()
        self.summary_center.lerp_(mean, torch.where(unset, 1.0, CENTER_MOMENTUM))

    def scale_summary(self, summary: torch.Tensor) -> torch.Tensor:
        """Summary vectors [B, K, H_in] as they enter the next pass (see ACConfig.summary_scale)."""
        if self.config.summary_scale == "none" or summary.shape[1] == 0:
            return summary
        x = summary.float()
        if self.config.summary_scale == "centered":
            x = x - self.summary_center[: x.shape[1]]
        rms = x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
        return (x * (self.embedding_rms / rms)).to(summary.dtype)

    # ------------------------------------------------------------------ compression
    def compress(self, rows: Sequence[Sequence[Sequence[int]]]) -> list[torch.Tensor]:
        """Compress each row's segments into its soft prompt.

        rows[b] = row b's segments (token lists, in document order; a row may have none).
        Rows are batched segment by segment: at step s every row with more than s segments
        has seen exactly s segments, so soft prompts line up without padding; only segment
        lengths are padded. Returns per row a tensor [S_b, H_in] (S_b = n_b * K when
        accumulating, K when not, 0 without segments), in the LM's dtype.
        """
        n = [len(r) for r in rows]
        soft = [self.empty_softprompt(1)[0] for _ in rows]  # [S_b, H_in] each
        for s in range(max(n, default=0)):
            active = [b for b in range(len(rows)) if n[b] > s]
            segs = [list(rows[b][s]) for b in active]
            if any(len(seg) == 0 for seg in segs):
                raise ValueError("compress: segments must be non-empty")
            width = max(len(seg) for seg in segs)
            ids = torch.zeros(len(active), width, dtype=torch.long, device=self.device)
            valid = torch.zeros(len(active), width, dtype=torch.bool, device=self.device)
            for i, seg in enumerate(segs):
                ids[i, : len(seg)] = torch.tensor(seg, dtype=torch.long, device=self.device)
                valid[i, : len(seg)] = True
            prev = torch.stack([soft[b] for b in active])  # [A, P, H_in], same P for all
            _, summary = self.segment_forward(prev, ids, valid)
            new = self.next_softprompt(prev.to(summary.dtype), summary)
            for i, b in enumerate(active):
                soft[b] = new[i]
        return soft

    # ------------------------------------------------------------------ reconstruction
    def reconstruction_loss(self, summary: torch.Tensor, ids: torch.Tensor) -> SegmentLoss:
        """Autoencoding loss: read ``ids`` [B, L] again with only its own summary [B, K, H_in]
        as the soft prompt, and score every token: ``[summary ; marker ; ids]``, where the
        marker slot predicts ids[:, 0].

        Why (the in-context autoencoder's pretraining, Ge et al., 2024, arXiv:2307.06945):
        a continuation's next-token loss rewards summaries only for the few tokens the
        earlier text predicts, so on a CPU budget they learned to carry nothing; asking the
        summaries to reproduce their own segment gives every token a gradient through them.
        The marker (the BOS token, else EOS; never inside a segment of running text) tells
        the model "reproduce" apart from "continue", which the same soft prompt asks for
        in the next-token passes.
        """
        b, k, length = ids.shape[0], summary.shape[1], ids.shape[1]
        marker = torch.full((b, 1), self.reconstruction_marker, dtype=ids.dtype, device=ids.device)
        tok = self.embed(torch.cat([marker, ids], dim=1))  # [B, 1+L, H_in]
        x = torch.cat([summary.to(tok.dtype), tok], dim=1)  # [B, K+1+L, H_in]
        real = torch.ones(b, x.shape[1], dtype=torch.bool, device=ids.device)
        is_text = torch.cat([~real[:, :k], real[:, k:]], dim=1)
        pos = position_ids(real, is_text, self.config.position_scheme)
        out = decoder(self.lm)(
            inputs_embeds=x, attention_mask=step_mask(real[:, :0], real), position_ids=pos,
            use_cache=False,
        )  # fmt: skip
        logits = self.logits(out.last_hidden_state[:, k : k + length])  # [B, L, V]
        loss_sum = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids.reshape(-1), reduction="sum")
        return SegmentLoss(loss_sum, ids.numel(), summary)

    @property
    def reconstruction_marker(self) -> int:
        """Token id that opens a reconstruction pass: the base model's BOS, else its EOS."""
        conf = self.lm.config
        for tid in (conf.bos_token_id, conf.eos_token_id):
            tid = tid[0] if isinstance(tid, (list, tuple)) else tid
            if tid is not None:
                return int(tid)
        raise ValueError("autoencoding needs a BOS or EOS token id in the base model's config")

    # ------------------------------------------------------------------ training forward
    def forward(
        self,
        ids: torch.Tensor,
        segment_lengths: Sequence[int],
        softprompt: torch.Tensor | None = None,
        use_summaries: bool = True,
        loss_from: int = 0,
        autoencode: bool = False,
    ) -> SegmentLoss:
        """Next-token loss over ``ids`` [B, T] read as consecutive segments.

        segment_lengths sum to T. Segment s is conditioned on the soft prompt built from the
        previous segments (and ``softprompt`` [B, P, H_in] carried in from earlier text); the
        last token of a segment predicts the first of the next one, as in the authors'
        trainer. use_summaries=False reads every segment on its own (no soft prompt, no
        summary tokens): the no-memory baseline. Only targets at index >= loss_from count.
        autoencode=True also scores each segment's reconstruction from its own summary
        (``reconstruction_loss``; needs use_summaries).
        """
        if sum(segment_lengths) != ids.shape[1] or min(segment_lengths) < 1:
            raise ValueError(
                f"segment_lengths {list(segment_lengths)} must be >= 1 and sum to {ids.shape[1]}"
            )
        if self.config.summary_form == "kv":
            from stages.autocompressor.kv_form import kv_forward

            loss_sum, n = kv_forward(self, ids, segment_lengths, loss_from)
            return SegmentLoss(loss_sum, n, self.empty_softprompt(ids.shape[0]))
        b = ids.shape[0]
        soft = self.empty_softprompt(b) if softprompt is None else softprompt
        valid = torch.ones_like(ids, dtype=torch.bool)
        hiddens, start = [], 0
        ae_sum, ae_tokens = None, 0
        for s, length in enumerate(segment_lengths):
            seg = ids[:, start : start + length]
            last = s == len(segment_lengths) - 1
            prev = soft if use_summaries else self.empty_softprompt(b)
            args = (prev, seg, valid[:, start : start + length], use_summaries)
            if self.segment_checkpointing and self.training and not last:
                text_h, summary = torch.utils.checkpoint.checkpoint(
                    self.segment_forward, *args, use_reentrant=False
                )
            else:
                text_h, summary = self.segment_forward(*args)
            hiddens.append(text_h)
            if autoencode and use_summaries:
                rec = self.reconstruction_loss(summary, seg)
                ae_sum = rec.loss_sum if ae_sum is None else ae_sum + rec.loss_sum
                ae_tokens += rec.n_tokens
            if use_summaries:
                soft = self.next_softprompt(soft.to(summary.dtype), summary)
            start += length
        loss_sum, n = self.next_token_loss(torch.cat(hiddens, dim=1), ids, loss_from)
        return SegmentLoss(loss_sum, n, soft, ae_sum, ae_tokens)

    def next_token_loss(self, hidden: torch.Tensor, ids: torch.Tensor, loss_from: int) -> tuple[torch.Tensor, int]:
        """Summed next-token loss of text hidden states [B, T, H_in] against ids [B, T]
        (hidden[:, t] predicts ids[:, t+1]); targets at index < loss_from do not count.
        Returns (loss sum, number of targets counted)."""
        targets = ids[:, 1:].clone()
        targets[:, : max(0, loss_from - 1)] = -100
        logits = self.logits(hidden[:, :-1])
        loss_sum = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100, reduction="sum"
        )
        return loss_sum, int((targets != -100).sum())
