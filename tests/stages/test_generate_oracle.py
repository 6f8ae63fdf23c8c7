"""Every compression method's prompt through the generate stage, against an independent
oracle: transformers' own ``generate`` (tests/hf_oracle.py; why an oracle outside the
project, and what is and is not claimed: tests/stages/decoding/test_oracle_generate.py).

Each registered method (and the kv form of the AutoCompressor) runs the stages before
generate and GenerateStage on the shared tiny windowed Llama (tests/method_cases.py),
fp32 on CPU, greedy, requests streamed through two KV slots, a drafter per method
(none, prompt_lookup, suffix in turn, always drafting). What each row is compared with:
- methods whose model reads the prompt as token ids (none, truncate, rag, bm25: those
  keeping the base ``load``, a full prefill): ``generate`` on the chat prompt (stages/prompting.PromptBuilder) around
  the row's ``context_ids`` (the document for none). Token for token: the row's
  ``output_tokens`` and ``output_text`` equal generate's count and decoded text, and
  its ``prompt_tokens`` the prompt's length.
- select (early exit): the cache it hands the engine is a plain prefill of
  ``prefix ; kept document tokens ; query``; the code does not expose those ids, so they
  are read back from the cache itself (layer 0's values carry no position: each slot's
  value vector is ``v_proj(input_layernorm(embedding(id)))`` for exactly one id of the
  vocabulary). ``generate`` on those ids is then the oracle for select's prompt, its
  early-exit prefill and the engine's decode on it.
- finch (the paper's frame: kept keys/values, read chunk by chunk) and autocompressor
  (summary vectors, and kv: kept keys/values at their original positions): no plain
  prompt gives that cache. The oracle is transformers' forward continuing the method's
  own prefill cache greedily (hf_oracle.hf_continue), so it covers the engine's loading of
  that cache into its slots and every decode step, not the compression (the method's own
  output, the same on both sides).
A method the registry adds later fails here until its oracle is chosen (``oracle_kind``).
EOS: the tokenizer's and the model's generation_config ids (transformers' own handling).
"""

from __future__ import annotations

import pytest
import torch
from hf_oracle import hf_continue, hf_greedy
from method_cases import cases, method_batches, method_of

from schemas.loading import spec_from_dict
from schemas.spec import JobSpec
from stages.compression import CompressionMethod, method_for, registry
from stages.generate import GenerateStage
from stages.prompting import PromptBuilder
from stages.rows import batch_to_rows

MAX_NEW = 12
RIVER = "The Elbe rises in the Giant Mountains and flows north to Hamburg and the sea. "
# A document within every budget, two longer than the methods' TARGET (48 tokens).
TEXTS = ["The river is the Elbe.", RIVER * 6, "Rivers: " + RIVER * 3 + "The Elbe, the Elbe.", "Elbe " * 30]
DRAFTERS = ("none", "prompt_lookup", "suffix")


def oracle_kind(case: str) -> str:
    """How ``case``'s rows are checked (see the module docstring)."""
    method = registry()[method_of(case)]
    if type(method).load is CompressionMethod.load:  # the whole prompt, prefilled as it is
        return "context_ids"
    if method.name == "select":
        return "cache_ids"
    if method.name in ("finch", "autocompressor"):
        return "continue_cache"
    raise AssertionError(f"compression method {method.name!r} has no oracle yet: add it to oracle_kind")


@pytest.fixture(scope="module")
def batches(method_env) -> dict[str, dict]:
    return method_batches(method_env, TEXTS)


@pytest.fixture(scope="module")
def hf_model(method_env):
    """The tiny model as transformers loads it (fp32, its own sdpa attention), apart from
    the project's model loading."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(method_env.model_dir, dtype=torch.float32).eval()


def eos_of(tokenizer, model) -> frozenset[int]:
    gen = model.generation_config.eos_token_id
    return frozenset({tokenizer.eos_token_id, *(gen if isinstance(gen, list) else [gen])} - {None})


@torch.inference_mode()
def token_ids_of_cache(model, cache, valid: torch.Tensor) -> list[int]:
    """The ids a plain prefill's cache (batch 1) was computed from, read back from layer
    0's values: value = v_proj(input_layernorm(embedding(id))), no position in it.
    valid: [1, S] bool. Each real slot must match one vocabulary entry to fp32 rounding."""
    layer = model.model.layers[0]
    table = layer.self_attn.v_proj(layer.input_layernorm(model.get_input_embeddings().weight))  # [V, Hkv*D]
    values = cache.layers[0].values[0]  # [Hkv, S, D]
    slots = values.transpose(0, 1).reshape(values.shape[1], -1)[valid[0]]  # [n, Hkv*D]
    # Pairwise differences, not cdist's matrix-product shortcut (it cancels to ~1e-3 here).
    dist = torch.cdist(slots, table, compute_mode="donot_use_mm_for_euclid_dist")  # [n, V]
    two = dist.topk(2, dim=1, largest=False)
    assert float(two.values[:, 0].max()) < 1e-4 < 0.1 < float(two.values[:, 1].min()), "not a plain prefill"
    return two.indices[:, 0].tolist()


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("case", cases())
def test_every_method_equals_transformers_generate(case, method_env, batches, hf_model, tokenizer):
    method = method_of(case)
    drafter = DRAFTERS[cases().index(case) % len(DRAFTERS)]
    spec = method_env.spec(case, max_new_tokens=MAX_NEW, speculative={"method": drafter, "adaptive": False})
    spec["resources"] = {**spec.get("resources", {}), "decode_slots": 2, "batch_size": len(TEXTS)}
    spec = spec_from_dict(spec).model_dump(mode="json")
    stage = GenerateStage(spec)
    batch = batches[method]
    rows = batch_to_rows(batch)
    out = batch_to_rows(stage(batch))
    assert [o["error"] for o in out] == [None] * len(rows)
    builder = PromptBuilder(tokenizer)
    kind = oracle_kind(case)
    compressed = 0
    if kind == "context_ids":
        eos = eos_of(tokenizer, hf_model)
        for row, o in zip(rows, out, strict=True):
            ctx = row.get("context_ids") if row.get("context_ids") is not None else row["doc_ids"]
            ids = builder.build(list(ctx), row["instruction"], row.get("question")).full_ids
            want = hf_greedy(hf_model, ids, MAX_NEW, eos)
            assert o["prompt_tokens"] == len(ids)
            assert (o["output_tokens"], o["output_text"]) == (len(want), tokenizer.decode(want, skip_special_tokens=True).strip())
            compressed += len(ctx) < len(row["doc_ids"])
    else:
        loaded = method_for(JobSpec.model_validate(spec).compression).load(JobSpec.model_validate(spec), torch.device("cpu"))
        eos = eos_of(loaded.tokenizer, loaded.model)
        for row, o in zip(rows, out, strict=True):
            parts = builder.build(list(row["doc_ids"]), row["instruction"], row.get("question"))
            state = loaded.prefill([parts]).state  # one row, as the engine prefills it on CPU
            assert bool(state.valid.all())
            if kind == "cache_ids":
                ids = token_ids_of_cache(hf_model, state.cache, state.valid)
                n_prefix, n_query = len(parts.prefix_ids), len(parts.query_ids)
                assert ids[:n_prefix] == parts.prefix_ids and ids[len(ids) - n_query :] == parts.query_ids
                kept = ids[n_prefix : len(ids) - n_query]
                assert len(kept) == o["context_tokens"] and set(kept) <= set(row["doc_ids"])
                want = hf_greedy(hf_model, ids, MAX_NEW, eos)
                compressed += len(kept) < len(row["doc_ids"])
            else:
                want = hf_continue(loaded.model, state.cache, int(state.next_pos[0]), state.last_logits[0], MAX_NEW, eos)
                compressed += 1
            assert (o["output_tokens"], o["output_text"]) == (len(want), loaded.tokenizer.decode(want, skip_special_tokens=True).strip())
    if method != "none":
        assert compressed > 0  # the method really kept less than some document
    if drafter != "none":
        assert sum(o["draft_tokens"] for o in out) > 0
