"""Our systems on the static-slot engine (issue 12's GPU path) for `bench decode --suite systems`.

Contract:
- ``resolve_engine(engine, device)`` -> ``"static"`` or ``"dynamic"``: ``auto`` is
  static on CUDA and dynamic on CPU; anything else but those three names is a
  ValueError naming ``--engine`` and the allowed values.
- ``warmed_slot_engine(model, batch, max_drafts, prompt_tokens, new_tokens, compile)`` ->
  ``(SlotEngine, warm_up_seconds)``: ``batch`` slots with capacity for a prompt of
  ``prompt_tokens`` + ``new_tokens`` + the widest step, every (batch bucket, width
  bucket) step compiled up front (``SlotEngine.warm_up``; on CUDA torch.compile
  "reduce-overhead" = CUDA graphs by default, on CPU eager). The seconds are wall time (on
  CUDA after a synchronize): compilation runs partly in other processes, so
  process CPU time would miss it. The bench reports them apart from the timed call.
- ``run_slot(engine, model, prompts, config, pad_id, clock, lookups, tuning)`` ->
  ``Run``, like systems.run_longdoc: the whole ``SlotEngine.run`` call timed with
  ``clock``; the prefill (stages.decoding.state.prefill_full, called by the engine
  for each group it loads into free slots) timed inside it and summed. A request
  the engine reports as failed raises (the bench records the system as an error).

The suite makes one engine with slots for its largest batch size; a batch of B
rows then fills B slots at once and the engine decodes one full batch (bucket B),
as the dynamic engine does: the two paths do the same work.
"""

from __future__ import annotations

import time

import torch

from pipeline.bench.systems import Clock, Run

ENGINES = ("auto", "dynamic", "static")

ENGINE_NOTES = {
    "dynamic": "Engine dynamic: longdoc and longdoc-pld run stages.decoding.engine.decode (growing KV cache).",
    "static": "Engine static: longdoc and longdoc-pld run stages.decoding.slot_engine.SlotEngine (static KV "
    "slots, bucketed steps, compiled as CUDA graphs on CUDA, eager on CPU), one engine for the whole run "
    "with slots for the largest batch; its construction + warm-up (compilation of every step shape) is the "
    "header's warm_up_s, outside every timed figure.",
}

# Our two systems (names as in results.SYSTEMS); drafts_for says how wide their steps get.
GREEDY, PLD = "longdoc", "longdoc-pld"


def resolve_engine(engine: str, device: torch.device) -> str:
    """static | dynamic for ``--engine`` on ``device`` (see the module docstring)."""
    if engine not in ENGINES:
        raise ValueError(f"--engine {engine!r}: allowed: {', '.join(ENGINES)}")
    if engine == "auto":
        return "static" if device.type == "cuda" else "dynamic"
    return engine


def drafts_for(system: str) -> int:
    """Most drafts per step of ``system``: 0 for greedy, the spec's default for prompt lookup."""
    if system == GREEDY:
        return 0
    from schemas.spec import SpeculativeSpec

    return SpeculativeSpec().num_draft_tokens


def warmed_slot_engine(model, batch: int, max_drafts: int, prompt_tokens: int, new_tokens: int, compile: str = "auto"):
    """(SlotEngine with ``batch`` slots, warmed up; wall seconds the construction + warm-up took).

    ``compile``: slot_engine.compile_plan's choice (auto: inductor + CUDA graphs on CUDA)."""
    from stages.decoding.slot_engine import SlotEngine

    device = next(model.parameters()).device
    t0 = time.perf_counter()
    engine = SlotEngine(model, slots=batch, max_drafts=max_drafts,
                        capacity=prompt_tokens + new_tokens + max_drafts + 2, compile=compile)
    engine.warm_up(greedy=True, max_drafts=max_drafts)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return engine, time.perf_counter() - t0


def widest_step(engine) -> int:
    """The widest step (1 + drafts) ``engine`` was built for."""
    return engine.widths[-1]


def run_slot(
    engine, model, prompts: list[list[int]], config, pad_id: int, clock: Clock,
    lookups: list[list[int]] | None = None, tuning=None,
) -> Run:
    """Generate for ``prompts`` on the SlotEngine (see the module docstring). ``lookups``:
    what prompt lookup drafts from (default: the prompts); ``tuning``: adaptive.Tuning
    for this call only (the engine's own is restored after)."""
    from stages.decoding.state import prefill_full

    prefill_s = [0.0]

    def prefill(indices: list[int]):
        t = clock()
        state = prefill_full(model, [prompts[i] for i in indices], pad_id)
        prefill_s[0] += clock() - t
        return state

    t0 = clock()
    results, errors = engine.run(
        [list(x) for x in (lookups or prompts)], [0] * len(prompts), prefill, config, tuning=tuning
    )
    t1 = clock()
    failed = next((e for e in errors if e is not None), None)
    if failed is not None:
        raise failed
    res = [r for r in results if r is not None]
    return Run(
        tokens=[r.tokens for r in res], seconds=t1 - t0, prefill_s=prefill_s[0],
        steps=max(r.decode_steps for r in res), row_steps=sum(r.decode_steps for r in res),
        drafted=sum(r.draft_tokens for r in res), accepted=sum(r.accepted_tokens for r in res),
    )
