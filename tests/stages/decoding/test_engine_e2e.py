"""End to end with the embedded SmolLM2: the engine with speculation on real documents
writes plain greedy's tokens (fp32)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from schemas.spec import DEFAULT_QA_INSTRUCTION
from stages.decoding.config import DecodeConfig
from stages.decoding.engine import Engine
from stages.decoding.reference import decode_plain
from stages.decoding.request import Request
from stages.decoding.state import prefill_full
from stages.prompting import PromptBuilder

SAMPLE = Path(__file__).resolve().parents[3] / "jobs" / "sample-qa.jsonl"


@pytest.mark.e2e
def test_pld_identical_to_plain_greedy_on_real_documents(embedded_model):
    model, tok = embedded_model
    docs = [json.loads(line) for line in SAMPLE.read_text().splitlines()[:2]]
    builder = PromptBuilder(tok)
    parts = [builder.build(builder.encode_text(d["text"])[:250], DEFAULT_QA_INSTRUCTION, d["questions"][0])
             for d in docs]
    prompts = [p.full_ids for p in parts]
    eos = frozenset({tok.eos_token_id})
    state = prefill_full(model, prompts, tok.pad_token_id)
    ref = decode_plain(model, copy.deepcopy(state), DecodeConfig(max_new_tokens=24, eos_ids=eos))
    for method, adaptive in (("prompt_lookup", False), ("prompt_lookup", True), ("suffix", True)):
        cfg = DecodeConfig(max_new_tokens=24, eos_ids=eos, speculative=method, adaptive=adaptive)
        engine = Engine(model, cfg, slots=2, expected_tokens=300)
        out = [o.result for o in engine.run(Request(i, p, p.full_ids) for i, p in enumerate(parts))]
        assert [r.tokens for r in out] == [r.tokens for r in ref]
        assert [r.finish_reason for r in out] == [r.finish_reason for r in ref]
        if not adaptive:
            assert sum(r.draft_tokens for r in out) > 0
