"""Which cache entries each Finch chunk pass keeps: the scoring strategies.

Contract: ``make_selector(model, config, heads)`` returns a ``Selector`` whose
``select(...)`` maps one pass (prompt queries captured on ``capture_layers``, the
cache with the block appended) to the candidate indices each layer keeps,
``[B, G, K']`` per layer of the pass (``select_indices`` layout). Strategies:

- scoring="paper": the Finch paper. Each layer ranks by its own prompt attention
  summed over all heads (head_mode="sum", G = 1) or per KV group (G = H_kv);
  no pooling (paper_scores.py).
- scoring="heads", selection="shared": one selection for every layer, from the
  selecting heads' normalised, pooled mass (evidence.py). The heads are the model's
  calibrated retrieval heads (heads.py), or every head of every layer when the
  model was never calibrated, within the first ``max_scoring_layers`` layers when
  that is set (heads.selecting_heads). head_mode="kv_group" makes that one selection
  per KV group. ``run_layers`` is the deepest selecting layer + 1: early exit needs no
  layer past it. With ``keep: sentences`` in mode kv each candidate ranks by its
  sentence's best pooled score (evidence.pool_sentences), so whole sentences are kept.
- scoring="heads", selection="per_layer": each layer ranks by its own heads, all
  of them, normalised and pooled (the uncalibrated recipe, layer by layer).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from stages.finch.compaction import Plan, select_indices
from stages.finch.evidence import (
    fill_empty_groups,
    group_heads,
    head_mass,
    normalise,
    pool_sentences,
    pool_valid,
)
from stages.finch.heads import HeadSet, selecting_heads
from stages.finch.paper_scores import prompt_scores


@dataclass
class PassView:
    """What a selector sees of one pass. queries[l]: [B, H, P, D] for captured layers;
    keys[l]: [B, H_kv, S, D] the layer's cache (block appended); row_mask: [B, P, S];
    p_real: [B, P]; lp: width of the prefix region; cand_valid: [B, C], C = S - lp;
    cand_sentence: [B, C] long, each candidate's sentence in its document (``keep:
    sentences`` in mode kv; None otherwise)."""

    queries: dict[int, torch.Tensor]
    keys: list[torch.Tensor]
    row_mask: torch.Tensor
    p_real: torch.Tensor
    lp: int
    cand_valid: torch.Tensor
    cand_sentence: torch.Tensor | None = None


class Selector(ABC):
    """Base: subclasses set the layer sets and implement ``select``."""

    capture_layers: list[int]
    run_layers: int
    groups: int

    def __init__(self, model, config) -> None:
        text = model.config.get_text_config()
        self.n_layers = int(text.num_hidden_layers)
        self.n_query = int(text.num_attention_heads)
        self.n_kv = int(text.num_key_value_heads)
        self.config = config
        self.scaling = [float(a.scaling) for a in _attn(model)]

    @abstractmethod
    def select(self, view: PassView, plan: Plan) -> list[torch.Tensor]:
        """The kept candidate indices per KV group for this pass (see the subclasses)."""


def _attn(model) -> list[torch.nn.Module]:
    from stages.kv.model_parts import attention_modules

    return attention_modules(model)


class PaperSelector(Selector):
    def __init__(self, model, config) -> None:
        super().__init__(model, config)
        self.capture_layers = list(range(self.n_layers))
        self.run_layers = self.n_layers
        self.groups = 1 if config.head_mode == "sum" else self.n_kv

    def select(self, view: PassView, plan: Plan) -> list[torch.Tensor]:
        out = []
        for layer, keys in enumerate(view.keys):
            scores = prompt_scores(
                view.queries[layer], keys, view.row_mask, view.p_real,
                self.scaling[layer], self.config.head_mode,
            )[:, :, view.lp :]  # [B, G, C]
            out.append(select_indices(scores, view.cand_valid, plan))
        return out


class HeadSelector(Selector):
    """Shared selection from a set of heads (calibrated, or all of them)."""

    def __init__(self, model, config, heads: tuple[tuple[int, int], ...]) -> None:
        super().__init__(model, config)
        self.by_layer: dict[int, list[int]] = {}
        for layer, head in heads:
            self.by_layer.setdefault(layer, []).append(head)
        self.by_layer = {k: sorted(set(v)) for k, v in sorted(self.by_layer.items())}
        self.capture_layers = list(self.by_layer)
        self.run_layers = max(self.by_layer) + 1
        self.groups = 1 if config.head_mode == "sum" else self.n_kv
        has = torch.zeros(self.n_kv, dtype=torch.bool)
        for hs in self.by_layer.values():
            for h in hs:
                has[h // (self.n_query // self.n_kv)] = True
        self.has_head = has

    def scores(self, view: PassView) -> torch.Tensor:
        """[B, G, C] pooled evidence over the candidates."""
        total = None
        for layer, hs in self.by_layer.items():
            q = view.queries[layer][:, hs]  # [B, h, P, D]
            mass = _mass_for(q, view.keys[layer], hs, self.n_query, self.n_kv, view, self.scaling[layer])
            e = normalise(mass[:, :, view.lp :], view.cand_valid)  # [B, h, C]
            g = group_heads(e, hs, self.n_query, self.n_kv, self.groups)
            total = g if total is None else total + g
        assert total is not None
        if self.groups > 1:
            total = fill_empty_groups(total, self.has_head.to(total.device))
        pooled = pool_valid(total, view.cand_valid, self.config.pool_window)
        if view.cand_sentence is not None:  # keep sentences (mode kv): whole sentences rank together
            pooled = pool_sentences(pooled, view.cand_sentence, view.cand_valid)
        return pooled

    def select(self, view: PassView, plan: Plan) -> list[torch.Tensor]:
        idx = select_indices(self.scores(view), view.cand_valid, plan)
        return [idx] * len(view.keys)


def _mass_for(q, keys, hs, n_query, n_kv, view: PassView, scaling: float) -> torch.Tensor:
    """head_mass for a subset ``hs`` of query heads: each picks its own KV head."""
    size = n_query // n_kv
    k = keys[:, [h // size for h in hs]]  # [B, h, S, D]: one KV head per chosen query head
    return head_mass(q, k, view.row_mask, view.p_real, scaling)


class PerLayerSelector(Selector):
    """Each layer selects from its own heads, all of them, normalised and pooled."""

    def __init__(self, model, config) -> None:
        super().__init__(model, config)
        self.capture_layers = list(range(self.n_layers))
        self.run_layers = self.n_layers
        self.groups = 1 if config.head_mode == "sum" else self.n_kv
        self.all = list(range(self.n_query))

    def select(self, view: PassView, plan: Plan) -> list[torch.Tensor]:
        out = []
        for layer, keys in enumerate(view.keys):
            mass = head_mass(view.queries[layer], keys, view.row_mask, view.p_real, self.scaling[layer])
            e = normalise(mass[:, :, view.lp :], view.cand_valid)
            g = group_heads(e, self.all, self.n_query, self.n_kv, self.groups)
            out.append(select_indices(pool_valid(g, view.cand_valid, self.config.pool_window),
                                      view.cand_valid, plan))
        return out


def make_selector(model, config, heads: HeadSet | None) -> Selector:
    """The selector for ``config`` (see module contract); ``heads`` None = uncalibrated."""
    if config.scoring == "paper":
        return PaperSelector(model, config)
    if config.selection == "per_layer":
        return PerLayerSelector(model, config)
    return HeadSelector(model, config, selecting_heads(model, heads, config.max_scoring_layers))
