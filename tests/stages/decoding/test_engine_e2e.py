"""End to end with the embedded SmolLM2: speculation on real documents changes nothing."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from schemas.spec import DEFAULT_QA_INSTRUCTION
from stages.decoding.config import DecodeConfig
from stages.decoding.engine import decode
from stages.decoding.engine_state import EngineState
from stages.decoding.reference import decode_plain
from stages.decoding.state import prefill_full
from stages.prompting import PromptBuilder

SAMPLE = Path(__file__).resolve().parents[3] / "jobs" / "sample-qa.jsonl"


@pytest.mark.e2e
def test_pld_identical_to_plain_greedy_on_real_documents(embedded_model):
    model, tok = embedded_model
    docs = [json.loads(line) for line in SAMPLE.read_text().splitlines()[:2]]
    builder = PromptBuilder(tok)
    prompts = [
        builder.build(builder.encode_text(d["text"])[:250], DEFAULT_QA_INSTRUCTION, d["questions"][0]).full_ids
        for d in docs
    ]
    eos = frozenset({tok.eos_token_id})
    state = prefill_full(model, prompts, tok.pad_token_id)
    engine = EngineState(model)
    ref = decode_plain(model, copy.deepcopy(state), DecodeConfig(max_new_tokens=24, eos_ids=eos))
    for adaptive in (False, True):
        cfg = DecodeConfig(max_new_tokens=24, eos_ids=eos, speculative="prompt_lookup", adaptive=adaptive)
        out = decode(engine, copy.deepcopy(state), prompts, cfg)
        assert [r.tokens for r in out] == [r.tokens for r in ref]
        assert [r.finish_reason for r in out] == [r.finish_reason for r in ref]
        if not adaptive:
            assert sum(r.draft_tokens for r in out) > 0
