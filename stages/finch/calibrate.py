"""Find a model's retrieval heads: where the question's attention lands on the answer.

Contract:
- ``needle_prompts(builder, texts, n, haystack_tokens, seed, paraphrased)``: ``n`` synthetic
  needle-in-a-haystack prompts. Haystack: ``haystack_tokens`` tokens of real text
  from ``texts`` (random text, random offset); needle: an invented fact from the
  templates below (invented places, codes and words, no fact from any eval set)
  inserted as its own paragraph at a random depth in [0.1, 0.9]; question: the
  matching question, echoing the statement's words or, for a ``paraphrased`` share of
  the prompts (``is_paraphrased``), asking the same in other words.
  ``NeedlePrompt.answer`` is the [start, end) span of the answer value's tokens in ``parts.context_ids`` (tokenised on its own, so the span is exact).
- ``answer_share(model, prompts)``: [L, H] float, per layer and query head, the mean
  over prompts of the share of the head's normalised question attention (the
  ``heads`` scoring of evidence.py: prompt rows weighted by n_j, then normalised
  over the document tokens) that falls on the answer span. Uniform attention scores
  len(answer) / len(doc).
- ``calibrate_heads(model, tokenizer, texts, config, name)``: the ``top_k`` heads by
  that share (over all prompts, echoed and paraphrased) among the layers below
  ``max_depth`` of the model's depth (``pick_heads``), as a HeadSet keyed by
  ``model_fingerprint``, with the figures in ``info`` (``heads_share_by_style``: the
  chosen heads' summed share on each question style). One full forward per prompt: about a minute on CPU for SmolLM2-135M.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from stages.decoding.forward import cache_kwargs
from stages.finch.evidence import head_mass, normalise
from stages.finch.heads import HeadSet, model_fingerprint
from stages.finch.support import check_supported
from stages.kv.model_parts import attention_modules, decoder
from stages.kv.queries import QueryCapture
from stages.prompting import PromptBuilder, PromptParts

QA_INSTRUCTION = "Answer the question using the document."

# Invented facts: (statement with {place} and {value}, question that echoes the
# statement's words, question that asks the same in other words: only {place} is shared).
TEMPLATES = (
    ("The access code of the {place} archive room is {value}.",
     "What is the access code of the {place} archive room?",
     "What must you type to get into the {place} record store?"),
    ("The mascot of the {place} chess club is a {value}.",
     "What is the mascot of the {place} chess club?",
     "What figure stands for the {place} board-game society?"),
    ("The night porter of the {place} observatory is called {value}.",
     "What is the night porter of the {place} observatory called?",
     "Who guards the {place} star-watching building after dark?"),
    ("The {place} rowing team keeps its spare oars in shed {value}.",
     "In which shed does the {place} rowing team keep its spare oars?",
     "Where does the {place} boat crew store extra paddles?"),
    ("The prototype built by the {place} workshop is codenamed {value}.",
     "What is the codename of the prototype built by the {place} workshop?",
     "What secret label was given to the first model made by the {place} craftsmen?"),
    ("The favourite dish of the {place} lighthouse keeper is {value}.",
     "What is the favourite dish of the {place} lighthouse keeper?",
     "Which meal does the person tending the {place} beacon like best?"),
)
PLACES = ("Tallinn", "Porto", "Dakar", "Quito", "Hobart", "Tromso", "Gdansk", "Busan",
          "Windhoek", "Cusco", "Tbilisi", "Nagoya", "Ghent", "Perth", "Salta", "Kazan")
WORDS = ("saffron", "walrus", "obsidian", "marzipan", "tangerine", "albatross", "juniper",
         "quartz", "pelican", "cobalt", "hazelnut", "meridian", "lantern", "sorrel")


@dataclass(frozen=True)
class NeedlePrompt:
    parts: PromptParts
    answer: tuple[int, int]  # [start, end) in parts.context_ids


@dataclass(frozen=True)
class CalibrationConfig:
    prompts: int = 32
    #: Share of the prompts asked with the paraphrased question (spread evenly over the
    #: prompts): heads that follow the question's words score on echoed questions only.
    paraphrased: float = 0.0
    haystack_tokens: int = 1500
    top_k: int = 8
    seed: int = 0
    #: Only layers below this fraction of the depth may select: early exit reads the
    #: document up to the deepest selecting layer, so one late head would cost most
    #: of a full pass (SmolLM2-135M: a head in layer 28 of 30 ranked 7th).
    max_depth: float = 0.8


def _value(rng: random.Random, template: int) -> str:
    if template in (0, 3):
        return f"{rng.choice('BCDFGHKMPRTVXZ')}{rng.randint(100, 999)}"
    if template == 4:
        return f"{rng.choice(WORDS).upper()}-{rng.randint(2, 99)}"
    return rng.choice(WORDS) if template != 2 else f"{rng.choice(WORDS).capitalize()} {rng.choice(PLACES)}s"


def is_paraphrased(i: int, share: float) -> bool:
    """Whether prompt ``i`` is asked in other words: ``share`` of the prompts, evenly spread
    (without drawing from the needles' random stream, so share 0 keeps the old needles)."""
    return int((i + 1) * share) > int(i * share)


def needle_prompts(
    builder: PromptBuilder, texts: list[str], n: int, haystack_tokens: int, seed: int,
    paraphrased: float = 0.0,
) -> list[NeedlePrompt]:
    """See the module contract. Raises ValueError when no text holds haystack_tokens tokens
    or ``paraphrased`` is outside [0, 1]."""
    if not 0.0 <= paraphrased <= 1.0:
        raise ValueError(f"paraphrased must be a share in [0, 1], got {paraphrased}")
    rng = random.Random(seed)
    pools = [ids for ids in (builder.encode_text(t) for t in texts) if len(ids) >= haystack_tokens]
    if not pools:
        raise ValueError(f"no calibration text holds haystack_tokens={haystack_tokens} tokens")
    decode = builder.tokenizer.decode
    out = []
    for i in range(n):
        ids = rng.choice(pools)
        start = rng.randrange(0, len(ids) - haystack_tokens + 1)
        hay = decode(ids[start : start + haystack_tokens])
        cut = int(len(hay) * rng.uniform(0.1, 0.9))
        para = hay.rfind("\n", 0, cut)
        cut = para if para > 0 else cut
        t = rng.randrange(len(TEMPLATES))
        statement, echoed, other_words = TEMPLATES[t]
        question = other_words if is_paraphrased(i, paraphrased) else echoed
        place, value = rng.choice(PLACES), _value(rng, t)
        lead, tail = statement.format(place=place, value="\0").split("\0")
        before = builder.encode_text(hay[:cut].rstrip() + "\n\n" + lead.rstrip())
        answer = builder.encode_text(" " + value)
        after = builder.encode_text(tail + "\n\n" + hay[cut:].lstrip())
        parts = builder.build(before + answer + after, QA_INSTRUCTION, question.format(place=place))
        out.append(NeedlePrompt(parts, (len(before), len(before) + len(answer))))
    return out


@torch.inference_mode()
def answer_share(model, prompts: list[NeedlePrompt]) -> torch.Tensor:
    """[L, H] mean share of each head's normalised question attention on the answer."""
    check_supported(model)
    attn = attention_modules(model)
    base = decoder(model)
    capture = QueryCapture(attn)
    total = None
    for np_ in prompts:
        p = np_.parts
        ids = torch.tensor([p.full_ids], device=model.device)
        s, q, lp, n = ids.shape[1], len(p.query_ids), len(p.prefix_ids), len(p.context_ids)
        cache = DynamicCache()
        with capture.capturing(q):
            base(input_ids=ids, use_cache=True, **cache_kwargs(base, cache))
        # Prompt row j sits at position s - q + j and sees slots 0 .. s - q + j.
        row_mask = torch.arange(s, device=ids.device)[None] <= (s - q + torch.arange(q, device=ids.device))[:, None]
        p_real = torch.ones((1, q), dtype=torch.bool, device=ids.device)
        doc_valid = torch.ones((1, n), dtype=torch.bool, device=ids.device)
        a0, a1 = np_.answer
        rows = []
        for layer, module in enumerate(attn):
            mass = head_mass(capture.queries[layer], cache.layers[layer].keys, row_mask[None],
                             p_real, float(module.scaling))  # [1, H, S]
            e = normalise(mass[:, :, lp : lp + n], doc_valid)  # [1, H, N]
            rows.append(e[0, :, a0:a1].sum(dim=-1).float().cpu())
        share = torch.stack(rows)  # [L, H]
        total = share if total is None else total + share
    assert total is not None, "answer_share needs at least one prompt"
    return total / len(prompts)


def pick_heads(share: torch.Tensor, top_k: int, max_depth: float = 1.0) -> tuple[tuple[int, int], ...]:
    """The ``top_k`` (layer, head) pairs of ``share`` [L, H], best first, among the
    layers below ``max_depth`` x L (at least the first layer)."""
    layers = max(1, int(round(max_depth * share.shape[0])))
    if not 0 < max_depth <= 1:
        raise ValueError(f"max_depth must be in (0, 1], got {max_depth}")
    if not 1 <= top_k <= layers * share.shape[1]:
        raise ValueError(f"top_k must be in 1..{layers * share.shape[1]} (layers x heads), got {top_k}")
    flat = share[:layers].flatten().topk(top_k).indices.tolist()
    h = share.shape[1]
    return tuple((i // h, i % h) for i in flat)


def calibrate_heads(model, tokenizer, texts: list[str], config: CalibrationConfig, name: str) -> HeadSet:
    """Measure ``answer_share`` on synthetic needles and keep the best heads (see contract)."""
    t0 = time.perf_counter()
    prompts = needle_prompts(PromptBuilder(tokenizer), texts, config.prompts,
                             config.haystack_tokens, config.seed, config.paraphrased)
    styled = {"echoed": [p for i, p in enumerate(prompts) if not is_paraphrased(i, config.paraphrased)],
              "paraphrased": [p for i, p in enumerate(prompts) if is_paraphrased(i, config.paraphrased)]}
    by_style = {k: answer_share(model, v) for k, v in styled.items() if v}  # [L, H] each
    share = sum(by_style[k] * len(styled[k]) for k in by_style) / len(prompts)
    heads = pick_heads(share, config.top_k, config.max_depth)
    ranked = pick_heads(share, min(32, share.numel()))
    uniform = sum((p.answer[1] - p.answer[0]) / len(p.parts.context_ids) for p in prompts) / len(prompts)
    info = {
        "metric": "mean share of the head's normalised question attention on the answer span",
        "prompts": config.prompts,
        "paraphrased": config.paraphrased,
        "haystack_tokens": config.haystack_tokens,
        "seed": config.seed,
        "max_depth": config.max_depth,
        "uniform_share": round(uniform, 5),
        "top": [[la, h, round(float(share[la, h]), 4)] for la, h in ranked],
        # The chosen heads' summed answer share on each question style: how much of the
        # heads' attention finds a fact asked in its own words vs in other words.
        "heads_share_by_style": {k: round(float(sum(v[la, h] for la, h in heads)), 4) for k, v in by_style.items()},
        "seconds": round(time.perf_counter() - t0, 1),
    }
    return HeadSet(model=name, fingerprint=model_fingerprint(model), heads=heads, info=info)
