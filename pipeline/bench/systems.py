"""The decoders `longdoc bench decode` compares, each run the same way.

Contract: every runner takes the model, a batch of prompts (token lists) and the
number of new tokens, generates greedily, and returns a ``Run``: the generated ids
per row, the seconds of the whole call (prefill + decode, what a caller waits for)
and, where the system exposes it, the prefill's share, measured with ``Clock``.

Systems (names are the JSON keys, results.SYSTEMS):
- ``longdoc``: our engine (stages/decoding/engine.py), plain greedy: the batch's
  requests submitted at once, prefilled by the engine and decoded in its slots.
- ``longdoc-pld``: the same with prompt lookup at the job spec's defaults
  (schemas.spec.SpeculativeSpec), drafting from the prompt and the output so far.
- ``longdoc-suffix``: the same with the suffix drafter (prompt + earlier outputs).
- ``hf-dynamic``: transformers ``generate`` with its default dynamic cache.
- ``hf-static-compiled``: ``generate`` with ``cache_implementation="static"`` and
  transformers' automatic torch.compile of the decode step (CompileConfig; on CUDA
  mode "reduce-overhead" = CUDA graphs; on CPU inductor's default mode, which
  transformers only does when asked). The caller times the 2nd call: the 1st compiles.
- ``hf-pld``: ``generate`` with ``prompt_lookup_num_tokens`` (transformers' prompt
  lookup; batch size 1 only, transformers' limit).
Prefill: ours is measured inside the engine (its prefill seconds); transformers'
``generate`` does not expose its prefill, so ``hf_prefill_seconds`` times one
forward pass over the same padded batch (what generate runs first) for the
decode-only figures.

EOS: with ``ignore_eos`` every row generates exactly ``new_tokens`` tokens (ours: no
EOS ids; HF: ``min_new_tokens``), so every system does the same work.

Clock: on a device (CUDA) ``perf_counter`` after its step backend's synchronize
(``cuda.synchronize``); on the host with one torch thread this process's CPU time (on a
shared machine it leaves out time other processes hold the core), else wall. Which is
which the step backend says (stages/decoding/backends: ``runs_on_host``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from pipeline.bench.results import SYSTEMS  # noqa: F401 - the names live in the light module


class Clock:
    """Seconds for timing a call on ``device`` (see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        from stages.decoding.backends import device_backend, synchronize

        self.device, self._synchronize = device, synchronize
        backend = device_backend(device)
        if not backend.runs_on_host(device):
            self.name = f"{backend.name}.synchronize+perf_counter"  # cuda.synchronize+perf_counter
        elif torch.get_num_threads() == 1:
            self.name = "process_time (one torch thread)"
        else:
            self.name = "perf_counter"
        self._timer = time.process_time if self.name.startswith("process_time") else time.perf_counter

    def __call__(self) -> float:
        self._synchronize(self.device)  # queued device work counts (nothing to wait for on CPU)
        return self._timer()


@dataclass
class Run:
    tokens: list[list[int]]  # generated ids per row
    seconds: float  # the whole call: prefill + decode
    prefill_s: float | None = None  # of that, the prefill (where the system exposes it)
    # Decode forward passes after the prefill: longdoc systems count theirs; transformers' the
    # tokens after the first of its longest row (one pass each; hf-pld's verify passes are fewer).
    # Per call, so consecutive batches add up (suite._merge_runs).
    steps: int = 0
    row_steps: int = 0  # the same summed over rows (a row leaves the batch when it finishes)
    drafted: int = 0  # prompt lookup: draft tokens fed, all rows
    accepted: int = 0  # prompt lookup: draft tokens accepted, all rows

    @property
    def generated(self) -> int:
        return sum(map(len, self.tokens))


def greedy_config(new_tokens: int, eos: frozenset[int]):
    from stages.decoding.config import DecodeConfig

    return DecodeConfig(max_new_tokens=new_tokens, eos_ids=eos)


def pld_config(
    new_tokens: int, eos: frozenset[int], draft_tokens: int | None = None, adaptive: bool = True,
    method: str = "prompt_lookup",
):
    """Speculation (``method``: a drafter) at the spec's defaults; ``draft_tokens``/``adaptive`` override them."""
    from schemas.spec import SpeculativeSpec
    from stages.decoding.config import DecodeConfig

    spec = SpeculativeSpec()
    return DecodeConfig(
        max_new_tokens=new_tokens, eos_ids=eos, speculative=method,
        num_draft_tokens=draft_tokens or spec.num_draft_tokens, max_ngram=spec.max_ngram,
        min_ngram=spec.min_ngram, adaptive=adaptive if draft_tokens is None else False,
    )


def make_engine(model, config, slots: int, prompt_tokens: int, compile: str = "auto"):
    """Our engine for the bench, as one actor has it: ``slots`` fixed slots sized for prompts
    of ``prompt_tokens`` (+ the new tokens and the widest step), the CPU kernel plan
    measured (or read) and, on CUDA, every step shape compiled now; wall seconds it took."""
    from stages.decoding.backends import synchronize
    from stages.decoding.engine import Engine

    device = next(model.parameters()).device
    t0 = time.perf_counter()
    engine = Engine(model, config, slots=slots, expected_tokens=prompt_tokens, compile=compile,
                    chunk_tokens=max(prompt_tokens, 512))
    engine.warm_up(greedy=config.greedy)
    synchronize(device)
    return engine, time.perf_counter() - t0


def run_longdoc(engine, prompts: list[list[int]], config, clock: Clock, lookups: list[list[int]] | None = None) -> Run:
    """Generate for ``prompts`` on ``engine`` with ``config`` (all submitted at once).
    ``lookups``: what the drafter reads (default: the prompts, as in the product).
    A request that fails raises (the bench records the system as an error)."""
    from stages.decoding.request import Request
    from stages.prompting import PromptParts

    engine.configure(config)
    before = engine.stats.prefill_s
    reqs = [Request(i, PromptParts([], list(p), []), list((lookups or prompts)[i])) for i, p in enumerate(prompts)]
    t0 = clock()
    done = engine.run(reqs)
    t1 = clock()
    failed = next((f.error for f in done if f.error is not None), None)
    if failed is not None:
        raise failed
    res = [f.result for f in done]
    return Run(
        tokens=[r.tokens for r in res], seconds=t1 - t0, prefill_s=engine.stats.prefill_s - before,
        steps=max(r.decode_steps for r in res), row_steps=sum(r.decode_steps for r in res),
        drafted=sum(r.draft_tokens for r in res), accepted=sum(r.accepted_tokens for r in res),
    )


def compile_config(device: torch.device):
    """transformers' CompileConfig for the static-cache system on ``device``."""
    import torch._dynamo
    from transformers import CompileConfig

    from stages.decoding.backends import compile_plan

    # One compiled step per batch size (and cache length): more than dynamo's default
    # 8 graphs per function on a long --batch-sizes list would fall back to eager.
    dyn = torch._dynamo.config
    for limit in ("cache_size_limit", "recompile_limit"):
        if hasattr(dyn, limit):
            setattr(dyn, limit, max(getattr(dyn, limit), 64))
    # The mode our own inductor steps take on this device (the step backend's compile plan):
    # CUDA "reduce-overhead" (CUDA graphs; transformers' default), elsewhere inductor's default.
    mode, _compiler = compile_plan("inductor", device)
    cfg = CompileConfig(mode=mode or "default")
    cfg._compile_all_devices = True  # transformers compiles off CUDA only when told to (no-op on CUDA)
    return cfg


def run_hf(
    model, prompts: list[list[int]], new_tokens: int, pad_id: int, eos_id: int, clock: Clock,
    static_compiled: bool = False, ignore_eos: bool = True, prompt_lookup: int = 0,
) -> Run:
    """One transformers ``generate`` call, greedy; ``prompt_lookup`` > 0: transformers'
    prompt lookup with that many tokens (batch size 1); see the module docstring."""
    from transformers import GenerationConfig

    from stages.decoding.state import left_pad

    device = next(model.parameters()).device
    ids, real = left_pad(prompts, pad_id, device)
    kw = dict(
        max_new_tokens=new_tokens, do_sample=False, num_beams=1, pad_token_id=pad_id, eos_token_id=eos_id,
        min_new_tokens=new_tokens if ignore_eos else None,
    )
    if prompt_lookup:
        if len(prompts) != 1:
            raise ValueError("transformers' prompt lookup runs at batch size 1 only")
        gen = GenerationConfig(**kw, prompt_lookup_num_tokens=prompt_lookup, disable_compile=True)
    elif static_compiled:
        gen = GenerationConfig(**kw, cache_implementation="static", compile_config=compile_config(device))
    else:
        gen = GenerationConfig(**kw, disable_compile=True)
    t0 = clock()
    with torch.inference_mode():
        seq = model.generate(input_ids=ids, attention_mask=real.long(), generation_config=gen)
    t1 = clock()
    width = ids.shape[1]
    outs = []
    for row in seq[:, width:].tolist():
        cut = len(row) if ignore_eos else next((i + 1 for i, x in enumerate(row) if x == eos_id), len(row))
        outs.append(row[:cut])
    return Run(tokens=outs, seconds=t1 - t0, steps=max(0, max(map(len, outs), default=0) - 1))


def hf_prefill_seconds(model, prompts: list[list[int]], pad_id: int, clock: Clock) -> float:
    """Seconds of the prefill ``generate`` runs first: one forward over the padded batch."""
    from transformers import DynamicCache

    from stages.decoding.forward import cache_kwargs
    from stages.decoding.state import left_pad

    ids, real = left_pad(prompts, pad_id, next(model.parameters()).device)
    t0 = clock()
    with torch.inference_mode():
        model(input_ids=ids, attention_mask=real.long(), use_cache=True, logits_to_keep=1,
              **cache_kwargs(model, DynamicCache(config=model.config)))
    return clock() - t0


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where ``a`` and ``b`` differ (None when identical)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def agreement(reference: list[list[int]], other: list[list[int]]) -> dict:
    """Rows of ``other`` identical to ``reference``, and where the others first diverge."""
    firsts = [first_divergence(a, b) for a, b in zip(reference, other, strict=True)]
    diverged = [f for f in firsts if f is not None]
    return {
        "rows": len(firsts),
        "rows_identical": (len(firsts) - len(diverged)) / len(firsts) if firsts else None,
        "first_divergence": min(diverged) if diverged else None,
        "first_divergence_by_row": firsts,
    }
