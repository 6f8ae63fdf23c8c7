"""The engine against an independent oracle: transformers' own ``generate``.

Why an oracle outside the project: reference.decode_plain shares the engine's forward
helpers (state.forward_step, prefill_full, StopChecker), so a bug in that shared path
would pass every test that compares the engine with it. ``generate`` (tests/hf_oracle.py)
runs the unmodified transformers model: its own attention (SDPA with transformers'
repeated KV heads, not forward.packed_gqa_sdpa), its own masks and positions, its own
DynamicCache, its own EOS handling, one row at a time with no padding.

What is exact (asserted here): in fp32 on CPU, greedy, our engine's tokens equal
``generate``'s token for token, and each row finishes where ``generate`` stops (EOS
kept as the last token, or ``max_new_tokens``), for
- tiny random models of three families (Llama, Qwen2, Mistral: GQA, RoPE, Qwen2's
  q/k/v biases), prompts of mixed lengths (1 to 300 tokens), several EOS ids
  ending rows mid-way, every drafter (none, prompt_lookup, suffix; adaptive on and
  off) with draft sources whose drafts are all accepted, partly accepted or all
  rejected, slot counts 1 / 3 / 8 and a KV budget that forces a relayout, prefill
  chunks of 8 and 16 tokens (multi-chunk prefill) and the default, and requests that
  arrive while others decode;
- the embedded SmolLM2-135M on a sample of real rows (``e2e``): corpus documents and
  sample-qa questions truncated head_tail to 512 tokens, 24 new tokens.
Every compression method's prompt is checked against the oracle in
tests/stages/test_generate_oracle.py.

What is not claimed: agreement in bf16, or on a GPU in any dtype. There the engine's
compiled steps and CUDA kernels reorder reductions (and a step's width and batch size
change the order), so near-tied logits can flip and rows diverge after some token; that
agreement is measured, not assumed: ``longdoc bench decode`` reports it per
configuration and dtype (``agreement_with_longdoc``: the share of rows identical to
transformers' greedy output and the first token where the others diverge). The repeat guard (``generation.repeat_guard``,
off by default) is left off here: ``generate`` has no such rule, so it cannot be an
oracle for it (tests/stages/decoding/test_engine_stops.py covers it). Stop strings
likewise (transformers' ``stop_strings`` cut differently: it keeps the text up to the
string, we cut it out).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hf_oracle import finish_reason, hf_greedy
from tiny_models import tiny_causal_lm

from stages.decoding.config import DecodeConfig
from stages.decoding.engine import Engine
from stages.decoding.memory import KvBudget
from stages.decoding.request import Request
from stages.decoding.slots import bytes_per_token, layer_shapes_of
from stages.prompting import PromptBuilder, PromptParts

ROOT = Path(__file__).resolve().parents[3]
VOCAB = 512
MAX_NEW = 20
# Mixed lengths: 1-token prompts, prompts spanning several 8-token prefill chunks, and
# one of 300 tokens that does not fit the KV budget setup's first slots (a relayout).
LENGTHS = (1, 5, 13, 40, 7, 26, 64, 300, 3)


@dataclass(frozen=True)
class OracleCase:
    """One family's tiny model, its prompts, the drafting sources and generate's output."""

    model: torch.nn.Module
    prompts: list[list[int]]
    lookups: list[list[int]]  # per row: prompt only / prompt + oracle output / + corrupted output
    eos: frozenset[int]
    expected: list[list[int]]  # generate's new tokens per row (EOS kept)


def build_case(family: str) -> OracleCase:
    """Built once per family. A larger init spreads the logits (no near-ties), and greedy
    decoding of a random model soon loops, so drafts find matches."""
    model = tiny_causal_lm(VOCAB, family, seed=5, initializer_range=0.2)
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in LENGTHS]
    # EOS ids that end rows mid-way: two tokens generate emits at steps 4 and 9 of two
    # rows (first occurrences there), found from a run with an EOS no prompt contains.
    free = [hf_greedy(model, p, MAX_NEW, [0]) for p in prompts]
    picks = []
    for row, at in ((1, 4), (5, 9)):
        toks = free[row]
        assert len(toks) == MAX_NEW and toks[at] not in toks[:at], "pick other EOS positions"
        picks.append(toks[at])
    eos = frozenset(picks)
    expected = [hf_greedy(model, p, MAX_NEW, eos) for p in prompts]
    reasons = [finish_reason(t, MAX_NEW, eos) for t in expected]
    assert reasons.count("eos") >= 2 and "length" in reasons, reasons
    lookups = []
    for i, (p, out) in enumerate(zip(prompts, expected, strict=True)):
        kind = i % 3
        if kind == 0:  # the prompt alone: drafts from loops in the prompt and output
            lookups.append(list(p))
        elif kind == 1:  # the oracle's own continuation: drafts accepted
            lookups.append(p + out)
        else:  # every 4th continuation token changed: drafts partly accepted
            lookups.append(p + [(t + 1) % VOCAB if j % 4 == 2 else t for j, t in enumerate(out)])
    return OracleCase(model, prompts, lookups, eos, expected)


@pytest.fixture(scope="module")
def oracle_case():
    """family -> OracleCase, each built once in this module."""
    built: dict[str, OracleCase] = {}
    return lambda family: built[family] if family in built else built.setdefault(family, build_case(family))


DRAFTERS = {  # name -> (speculative, adaptive)
    "none": ("none", False),
    "prompt_lookup": ("prompt_lookup", False),
    "prompt_lookup-adaptive": ("prompt_lookup", True),
    "suffix": ("suffix", False),
    "suffix-adaptive": ("suffix", True),
}
SETUPS = {  # name -> Engine keywords (budget in KV tokens)
    "1slot-chunk8": {"slots": 1, "chunk_tokens": 8},
    "3slots": {"slots": 3},
    "budget-chunk8": {"budget_tokens": 2 * 256, "expected_tokens": 16, "chunk_tokens": 8},
    "8slots-chunk16": {"slots": 8, "chunk_tokens": 16},
}
# Llama: every drafter in every setup; Qwen2 and Mistral: every drafter once, the setups rotated.
MATRIX = [("llama", d, s) for d in DRAFTERS for s in SETUPS] + [
    (family, d, list(SETUPS)[(i + shift) % len(SETUPS)])
    for family, shift in (("qwen2", 1), ("mistral", 2))
    for i, d in enumerate(DRAFTERS)
]


def make_engine(model, eos: frozenset[int], drafter: str, setup: str, max_new: int = MAX_NEW) -> Engine:
    speculative, adaptive = DRAFTERS[drafter]
    cfg = DecodeConfig(max_new_tokens=max_new, eos_ids=eos, speculative=speculative, num_draft_tokens=5,
                       adaptive=adaptive)
    kw = dict(SETUPS[setup])
    tokens = kw.pop("budget_tokens", None)
    if tokens is not None:
        per = bytes_per_token(layer_shapes_of(model), torch.float32)
        kw["budget"] = KvBudget(per, tokens * per)
    kw.setdefault("expected_tokens", 64)
    return Engine(model, cfg, **kw)


def requests(case: OracleCase) -> list[Request]:
    return [Request(i, PromptParts([], list(p), []), list(lk)) for i, (p, lk) in
            enumerate(zip(case.prompts, case.lookups, strict=True))]


def assert_same_as_generate(finished, expected: list[list[int]], eos: frozenset[int], max_new: int) -> None:
    assert [f.error for f in finished] == [None] * len(expected)
    for i, (f, want) in enumerate(zip(finished, expected, strict=True)):
        got = f.result.tokens
        assert got == want, f"row {i}: first difference at token {_first_difference(got, want)}"
        assert f.result.finish_reason == finish_reason(want, max_new, eos), f"row {i}"


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@pytest.mark.parametrize(("family", "drafter", "setup"), MATRIX)
def test_engine_equals_transformers_generate(oracle_case, family, drafter, setup):
    case = oracle_case(family)
    eng = make_engine(case.model, case.eos, drafter, setup)
    out = eng.run(requests(case))
    assert_same_as_generate(out, case.expected, case.eos, MAX_NEW)
    assert eng.stats.rows_done == len(case.prompts)
    if setup == "budget-chunk8":
        assert eng.stats.relayouts >= 1  # the 300-token row needed longer slots
    elif eng.cache.slots > 1:
        assert eng.stats.max_active > 1  # rows decoded together
    if drafter in ("prompt_lookup", "suffix"):  # always drafting: the oracle rows' drafts are accepted
        assert sum(out[i].result.accepted_tokens for i in range(1, len(out), 3)) > 0


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_requests_arriving_while_rows_decode_equal_generate(oracle_case, family):
    """Later requests (a later Ray batch) join while earlier rows decode and prefill in
    chunks between their steps: still generate's tokens."""
    case = oracle_case(family)
    eng = make_engine(case.model, case.eos, "prompt_lookup-adaptive", "3slots")
    eng.chunk_tokens = 8
    reqs = requests(case)
    got = {}
    for r in reqs[:4]:
        eng.submit(r)
    while not any(len(row.result.tokens) >= 3 for row in eng.active):  # rows are decoding
        got.update((f.key, f) for f in eng.step())
    for r in reqs[4:]:
        eng.submit(r)
    while len(got) < len(reqs):
        got.update((f.key, f) for f in eng.step())
    assert_same_as_generate([got[i] for i in range(len(reqs))], case.expected, case.eos, MAX_NEW)


# ----------------------------------------------------------------------------- embedded model
SAMPLE_DOCS = ("howto-sorting",)  # jobs/corpus documents (summaries)
SAMPLE_QA = 2  # the first questions of the first rows of jobs/sample-qa.jsonl
E2E_NEW = 24


@pytest.mark.e2e
def test_embedded_model_equals_transformers_generate(embedded_model):
    """SmolLM2-135M (fp32, CPU) on real rows as the pipeline prompts them: documents
    truncated head_tail to 512 tokens in the chat template. The engine, drafting at every
    step (prompt lookup, adaptive off: drafts accepted and rejected), writes generate's
    tokens and stops where it stops (the model's EOS ids). Three rows: each 560-token
    prefill costs seconds of CPU (the engine without drafts is checked on the tiny models)."""
    from schemas.spec import DEFAULT_QA_INSTRUCTION, DEFAULT_SUMMARY_INSTRUCTION
    from stages.compression.truncate import truncate_ids

    model, tok = embedded_model
    builder = PromptBuilder(tok)
    rows = [(DEFAULT_SUMMARY_INSTRUCTION, None, (ROOT / "jobs" / "corpus" / f"{d}.txt").read_text())
            for d in SAMPLE_DOCS]
    for line in (ROOT / "jobs" / "sample-qa.jsonl").read_text().splitlines()[:SAMPLE_QA]:
        doc = json.loads(line)
        rows.append((DEFAULT_QA_INSTRUCTION, doc["questions"][0], doc["text"]))
    parts = [builder.build(truncate_ids(builder.encode_text(text), 512, "head_tail"), instruction, question)
             for instruction, question, text in rows]
    gen_eos = model.generation_config.eos_token_id
    eos = frozenset({tok.eos_token_id, *(gen_eos if isinstance(gen_eos, list) else [gen_eos])} - {None})
    expected = [hf_greedy(model, p.full_ids, E2E_NEW, eos) for p in parts]
    assert "eos" in [finish_reason(t, E2E_NEW, eos) for t in expected]  # a row that stops early
    cfg = DecodeConfig(max_new_tokens=E2E_NEW, eos_ids=eos, speculative="prompt_lookup", adaptive=False)
    eng = Engine(model, cfg, slots=2, expected_tokens=600)
    out = eng.run(Request(i, p, p.full_ids) for i, p in enumerate(parts))
    assert_same_as_generate(out, expected, eos, E2E_NEW)
    assert sum(f.result.accepted_tokens for f in out) > 0
    assert sum(f.result.accepted_tokens for f in out) < sum(f.result.draft_tokens for f in out)
