"""Generate stage on a tiny random Llama: batched generation, error rows, limits, every
compression method x drafter (none, prompt lookup, suffix) x greedy/sampling, requests
streamed through fewer slots than the batch, and several batches at once in one actor."""

from __future__ import annotations

import threading

import pytest
from method_cases import method_batches, request, text_stages

from schemas.loading import spec_from_dict
from schemas.output import OUTPUT_COLUMNS
from stages.compression import budgeted_names, method_names
from stages.decoding.config import DecodeConfig
from stages.decoding.reference import decode_plain
from stages.decoding.state import prefill_full
from stages.generate import GenerateStage
from stages.prompting import PromptBuilder
from stages.rows import batch_to_rows, rows_to_batch


def _spec(model_dir, **gen):
    return spec_from_dict(
        {
            "name": "g",
            "input": {"uri": "/unused"},
            "generation": {"model": str(model_dir), "max_new_tokens": 6, **gen},
            "cost": {"usd_per_device_hour": 3.6},
        }
    ).model_dump(mode="json")


def _request(i, tokenizer, text, error=None):
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] if text else None
    return {
        "request_id": f"r{i}", "run_id": "run", "run_date": "2026-01-01", "job": "g",
        "doc_id": f"d{i}", "source_uri": f"f{i}", "task": "summarize", "prompt": "Summarize.",
        "instruction": "Summarize.", "question": None, "reference": None, "text": text,
        "error": error, "doc_ids": ids, "doc_tokens": len(ids) if ids else None,
    }  # fmt: skip


@pytest.fixture(scope="module")
def stage(tiny_model_dir):
    return GenerateStage(_spec(tiny_model_dir))


def test_batch_rows_match_plain_greedy_per_row(stage, tokenizer, tiny_model):
    texts = ["short doc", "a somewhat longer document about rivers and mountains " * 3, "mid length text here"]
    reqs = [_request(i, tokenizer, t) for i, t in enumerate(texts)]
    out = batch_to_rows(stage(rows_to_batch(reqs)))
    assert [o["request_id"] for o in out] == ["r0", "r1", "r2"]
    builder = PromptBuilder(tokenizer)
    cfg = DecodeConfig(max_new_tokens=6, eos_ids=frozenset({tokenizer.eos_token_id}))
    padded = 0  # rows whose decoded text had whitespace around it (the column has none)
    for req, row in zip(reqs, out):
        assert set(OUTPUT_COLUMNS) <= set(row)
        assert row["error"] is None
        parts = builder.build(req["doc_ids"], "Summarize.", None)
        ref = decode_plain(tiny_model, prefill_full(tiny_model, [parts.full_ids], tokenizer.pad_token_id), cfg)[0]
        assert row["output_tokens"] == len(ref.tokens) <= 6
        # Why it stopped: the EOS token (kept as the last output token) or the token limit.
        ended = bool(ref.tokens) and ref.tokens[-1] == tokenizer.eos_token_id
        assert row["finish_reason"] == ("eos" if ended else "length"), (row["finish_reason"], ref.tokens)
        raw = tokenizer.decode(ref.tokens, skip_special_tokens=True)
        assert row["output_text"] == raw.strip()
        padded += raw != raw.strip()
        assert row["prompt_tokens"] == len(parts)
        assert row["compression_ratio"] == 1.0
        assert row["device"] == "cpu" and row["device_s"] > 0
        assert row["cost_usd"] == pytest.approx(row["device_s"] * 3.6 / 3600)
        assert row["e2e_s"] >= row["ttft_s"] > 0
    assert padded, "no decoded text had whitespace around it: the strip above went unchecked"


@pytest.mark.parametrize("prefix_cache", ["auto", "off"])
def test_questions_on_one_document_prefill_it_once_with_the_same_rows(tiny_model_dir, tokenizer, tiny_model,
                                                                       prefix_cache):
    spec = spec_from_dict({
        "name": "g", "input": {"uri": "/unused"}, "task": {"kind": "qa", "questions": ["Who?"]},
        "generation": {"model": str(tiny_model_dir), "max_new_tokens": 6, "prefix_cache": prefix_cache},
    })  # fmt: skip
    assert spec.reuses_document_prefix is (prefix_cache == "auto")
    stage = GenerateStage(spec.model_dump(mode="json"))
    docs = ["rivers and mountains of the north " * 4, "a short note on tea"]
    questions = ["Which rivers?", "How high are the mountains?", "Is tea mentioned?"]
    reqs = []
    for d, text in enumerate(docs):
        for q in questions:
            r = _request(len(reqs), tokenizer, text)
            reqs.append({**r, "doc_id": f"d{d}", "task": "qa", "instruction": "Answer.", "question": q})
    out = batch_to_rows(stage(rows_to_batch(reqs)))
    builder = PromptBuilder(tokenizer)
    cfg = DecodeConfig(max_new_tokens=6, eos_ids=frozenset({tokenizer.eos_token_id}))
    for req, row in zip(reqs, out, strict=True):
        parts = builder.build(req["doc_ids"], "Answer.", req["question"])
        ref = decode_plain(tiny_model, prefill_full(tiny_model, [parts.full_ids], tokenizer.pad_token_id), cfg)[0]
        assert row["error"] is None and row["output_text"] == tokenizer.decode(ref.tokens, skip_special_tokens=True).strip()
    # auto: each document's second and third questions reuse its prefill, and their rows say so.
    assert stage.engine.stats.prefix_hits == (4 if prefix_cache == "auto" else 0)
    cached = [row["cached_prompt_tokens"] for row in out]
    if prefix_cache == "auto":
        assert [c > 0 for c in cached] == [False, True, True] * 2
        assert all(c < row["prompt_tokens"] for c, row in zip(cached, out, strict=True))
    else:
        assert cached == [0] * 6


def test_a_small_scorer_reads_a_batch_of_documents_in_one_pass_on_cpu(tiny_model_dir, tokenizer):
    """select with a scorer asks for groups of documents (prefill_group_rows), and the CPU
    engine honours it: one method prefill for the batch, not one per document (its narrow
    matmuls run faster batched: jobs/results/bench-job/README.md)."""
    spec = spec_from_dict({
        "name": "g", "input": {"uri": "/unused"}, "task": {"kind": "summarize"},
        "compression": {"method": "select", "target_tokens": 24, "chunk_tokens": 32,
                        "scorer": str(tiny_model_dir)},
        "generation": {"model": str(tiny_model_dir), "max_new_tokens": 4},
    })  # fmt: skip
    stage = GenerateStage(spec.model_dump(mode="json"))
    engine = stage.engine
    calls: list[int] = []
    prefill = engine.prefill

    def counted(parts, on_chunk=None):
        calls.append(len(parts))
        return prefill(parts, on_chunk=on_chunk)

    engine.prefill = counted
    texts = [f"The river number {i} rises in the hills. It flows north to the sea. " * 6 for i in range(4)]
    out = batch_to_rows(stage(rows_to_batch([_request(i, tokenizer, t) for i, t in enumerate(texts)])))
    assert engine.group_rows == 16 and calls == [4]
    assert all(r["error"] is None and 0 < r["context_tokens"] <= 24 for r in out)


def test_errors_pass_through_and_too_long_fails_alone(tiny_model_dir, tokenizer):
    stage = GenerateStage(_spec(tiny_model_dir, max_new_tokens=4))
    stage.max_context = 64  # the tiny model's window, shrunk so a short text overflows it
    reqs = [
        _request(0, tokenizer, "fine"),
        _request(1, tokenizer, None, error="read: x.txt is empty"),
        _request(2, tokenizer, "word " * 200),
    ]
    out = batch_to_rows(stage(rows_to_batch(reqs)))
    assert out[0]["error"] is None and out[0]["output_text"] is not None
    assert out[1]["error"] == "read: x.txt is empty" and out[1]["output_text"] is None
    assert "more than the model's context of 64" in out[2]["error"]
    assert all(m in out[2]["error"] for m in budgeted_names())  # the methods with a budget


def test_a_failing_row_does_not_fail_its_batch(stage, tokenizer):
    good = _request(0, tokenizer, "good document")
    broken = _request(1, tokenizer, "broken")
    broken["doc_ids"] = [10**9]  # out of vocabulary: the embedding lookup raises
    out = batch_to_rows(stage(rows_to_batch([good, broken])))
    assert out[0]["error"] is None
    assert out[1]["error"].startswith("generate: ")


# ----------------------------------------------------------------------------- every method
# GenerateStage across every registered compression method x prompt lookup on/off x
# greedy/sampling, on the tiny windowed model of tests/method_cases.py.
LOOKUP = {"lookup": {"method": "prompt_lookup"}, "suffix": {"method": "suffix"}, "plain": {"method": "none"}}
# Drafting at every n-gram match: the adaptive default may stop drafting on a slow
# machine (it weighs measured step costs), so exactness is also checked on this one.
ALWAYS_DRAFT = {"method": "prompt_lookup", "adaptive": False}
SAMPLING = {"greedy": 0.0, "sampling": 0.9}
RIVER = "The Elbe rises in the Giant Mountains and flows north to Hamburg and the sea. "


@pytest.fixture(scope="module")
def method_inputs(method_env) -> dict[str, dict]:
    """Per method: a batch of three requests after the stages before generate."""
    return method_batches(method_env, ["The river is the Elbe.", RIVER * 6, "Rivers: " + RIVER * 3 + "The Elbe, the Elbe."])


@pytest.fixture(scope="module")
def stage_for(method_env):
    """(method, lookup, sampling) -> GenerateStage, built once per module."""
    built: dict[tuple[str, str, str], GenerateStage] = {}

    def get(method: str, lookup: str, sampling: str) -> GenerateStage:
        key = (method, lookup, sampling)
        if key not in built:
            speculative = {"always": ALWAYS_DRAFT, "suffix-always": {"method": "suffix", "adaptive": False}}.get(
                lookup, LOOKUP.get(lookup))
            gen = {"speculative": speculative, "temperature": SAMPLING[sampling], "seed": 7}
            built[key] = GenerateStage(method_env.spec(method, max_new_tokens=8, **gen))
        return built[key]

    return get


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("sampling", list(SAMPLING))
@pytest.mark.parametrize("lookup", ["lookup", "plain"])
@pytest.mark.parametrize("method", method_names())
def test_every_method_with_and_without_lookup_greedy_and_sampling(
    method, lookup, sampling, stage_for, method_inputs
):
    stage = stage_for(method, lookup, sampling)
    batch = method_inputs[method]
    out = batch_to_rows(stage(batch))
    assert [o["request_id"] for o in out] == ["r0", "r1", "r2"]
    for o in out:
        assert o["error"] is None, o["error"]
        assert o["compression"] == method and o["speculative"] == LOOKUP[lookup]["method"]
        assert 1 <= o["output_tokens"] <= 8
        overhead = stage.prompts.overhead_tokens("Answer briefly.", "Which river is it?")
        assert o["prompt_tokens"] == o["context_tokens"] + overhead
        assert o["e2e_s"] >= o["ttft_s"] > 0 and o["compress_s"] >= 0
        if lookup == "plain":
            assert o["draft_tokens"] == 0 and o["acceptance_rate"] is None
        else:
            assert 0 <= o["accepted_tokens"] <= o["draft_tokens"]
    # Per-request seeds: the same request generates the same text in a rerun and alone.
    again = batch_to_rows(stage(batch))
    assert [o["output_text"] for o in again] == [o["output_text"] for o in out]
    alone = batch_to_rows(stage(rows_to_batch(batch_to_rows(batch)[1:2])))
    assert alone[0]["output_text"] == out[1]["output_text"]


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("method", method_names())
def test_greedy_output_is_the_same_with_and_without_lookup(method, stage_for, method_inputs):
    batch = method_inputs[method]
    plain = batch_to_rows(stage_for(method, "plain", "greedy")(batch))
    for variant in ("lookup", "always", "suffix", "suffix-always"):
        lookup = batch_to_rows(stage_for(method, variant, "greedy")(batch))
        assert [o["output_text"] for o in lookup] == [o["output_text"] for o in plain]
        assert [o["output_tokens"] for o in lookup] == [o["output_tokens"] for o in plain]
    assert sum(o["draft_tokens"] for o in lookup) > 0  # speculation really ran


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("method", ["rag", "finch"])
def test_cost_charges_each_methods_compression_once(method, method_env, method_inputs):
    """cost_usd = (device_s + a text method's compress_s) x price / 3600 (schemas/output.py):
    rag's embedding, done before the engine, is charged; finch reads inside the engine's
    prefill, so its compress_s is part of prefill_s and device_s and is not added again."""
    spec = method_env.spec(method, max_new_tokens=8)
    spec["cost"] = {"usd_per_device_hour": 3.6}
    batch = method_inputs[method]
    carried = [r.get("compress_s") for r in batch_to_rows(batch)]  # what the text stage measured
    out = batch_to_rows(GenerateStage(spec)(batch))
    for row, text_s in zip(out, carried, strict=True):
        assert row["error"] is None, row["error"]
        if method == "rag":
            assert text_s > 0 and row["compress_s"] == text_s
            assert row["cost_usd"] == pytest.approx((row["device_s"] + text_s) * 3.6 / 3600)
            assert row["e2e_s"] == pytest.approx(text_s + row["ttft_s"] + row["decode_s"])
        else:
            assert text_s is None and 0 <= row["compress_s"] <= row["prefill_s"] <= row["device_s"]
            assert row["cost_usd"] == pytest.approx(row["device_s"] * 3.6 / 3600)
    if method == "finch":  # the long documents were really read by the method
        assert max(row["compress_s"] for row in out) > 0


# ----------------------------------------------------------------------------- the engine's queue
TEXTS = ["The river is the Elbe.", RIVER * 6, "Rivers: " + RIVER * 3 + "The Elbe, the Elbe.", RIVER, "Elbe " * 30]


def _slots_spec(method_env, case: str, **gen) -> dict:
    spec = method_env.spec(case, max_new_tokens=8, **gen)
    spec["resources"] = {**spec.get("resources", {}), "decode_slots": 2, "batch_size": 5}
    return spec_from_dict(spec).model_dump(mode="json")


@pytest.fixture(scope="module")
def five(method_env) -> dict[str, dict]:
    return method_batches(method_env, TEXTS)


def _reference_texts(stage: GenerateStage, batch) -> list[str]:
    """Plain greedy (reference.decode_plain, its own forward loop) on the method's own prefill."""
    from stages.compression import method_for
    from stages.decoding.config import decode_config_for

    rows = batch_to_rows(batch)
    parts = stage._prompt_parts(rows)
    loaded = method_for(stage.spec.compression).load(stage.spec, stage.device)
    cfg = decode_config_for(stage.spec.generation, loaded.tokenizer, loaded.model.generation_config)
    plain = DecodeConfig(max_new_tokens=cfg.max_new_tokens, eos_ids=cfg.eos_ids)
    texts = []
    for p in parts:  # one row at a time: no padding in the reference
        state = loaded.prefill([p]).state
        toks = decode_plain(loaded.model, state, plain)[0].tokens
        texts.append(loaded.tokenizer.decode(toks, skip_special_tokens=True).strip())
    return texts


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("drafter", ["prompt_lookup", "suffix"])
@pytest.mark.parametrize("case", [*method_names(), "autocompressor-kv"])
def test_rows_stream_through_two_slots_and_equal_the_reference(method_env, five, case, drafter):
    """Five requests through two KV slots (rows leave, newcomers are prefilled into their
    slots): every method's rows equal plain greedy on the method's own prefill (fp32)."""
    method = "autocompressor" if case == "autocompressor-kv" else case
    stage = GenerateStage(_slots_spec(method_env, case, speculative={"method": drafter, "adaptive": False}))
    rows = batch_to_rows(stage(five[method]))
    assert [r["request_id"] for r in rows] == [f"r{i}" for i in range(len(TEXTS))]
    assert all(r["error"] is None for r in rows), [r["error"] for r in rows]
    assert [r["output_text"] for r in rows] == _reference_texts(stage, five[method])
    assert stage.engine.cache.slots == 2 and stage.engine.stats.max_active == 2
    for r in rows:
        assert r["e2e_s"] >= r["ttft_s"] > 0 and r["device_s"] > 0


@pytest.mark.usefixtures("one_thread")
def test_kv_autocompressor_keeps_every_fourth_token_of_each_segment(method_env, five):
    from stages.autocompressor.kv_form import kept_offsets
    from stages.autocompressor.prefill import document_segments

    stage = GenerateStage(_slots_spec(method_env, "autocompressor-kv"))
    rows = batch_to_rows(stage(five["autocompressor"]))
    cfg = stage.spec.compression  # the chat prefix and question are not counted
    segments = [document_segments(list(r["doc_ids"]), cfg.segment_tokens_for("kv"), cfg.target_tokens)
                for r in batch_to_rows(five["autocompressor"])]
    assert [r["context_tokens"] for r in rows] == [sum(len(kept_offsets(len(s), 4)) for s in segs) for segs in segments]


@pytest.mark.usefixtures("one_thread")
def test_batches_called_at_once_share_the_engine(method_env, five):
    """Ray calls a generate actor for several batches at once: each call gets its own rows,
    and the engine decodes rows of both calls together."""
    spec = method_env.spec("none", max_new_tokens=8)
    spec["resources"] = {**spec.get("resources", {}), "decode_slots": 4}
    stage = GenerateStage(spec_from_dict(spec).model_dump(mode="json"))
    rows = batch_to_rows(five["none"])
    halves = [rows_to_batch(rows[:2]), rows_to_batch(rows[2:4])]
    alone = [batch_to_rows(stage(h)) for h in halves]
    got: dict[int, list] = {}
    start = threading.Barrier(2)

    def call(i: int) -> None:
        start.wait()
        got[i] = batch_to_rows(stage(halves[i]))

    before = stage.engine.stats.max_active
    threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert [[r["request_id"] for r in got[i]] for i in range(2)] == [["r0", "r1"], ["r2", "r3"]]
    assert [[r["output_text"] for r in got[i]] for i in range(2)] == [[r["output_text"] for r in a] for a in alone]
    assert before == 2 and stage.engine.stats.max_active > 2  # the two calls' rows shared steps


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("method", ["none", "finch"])
def test_sampling_is_per_request(method_env, five, method):
    """Sampled text depends on the request's seed, not on its batch (verify.py's keyed uniforms)."""
    stage = GenerateStage(_slots_spec(method_env, method, temperature=0.9, seed=3))
    rows = batch_to_rows(stage(five[method]))
    assert all(r["error"] is None and 1 <= r["output_tokens"] <= 8 for r in rows)
    alone = batch_to_rows(stage(rows_to_batch(batch_to_rows(five[method])[3:4])))
    assert alone[0]["output_text"] == rows[3]["output_text"]
    greedy = batch_to_rows(GenerateStage(_slots_spec(method_env, method))(five[method]))
    assert [r["output_text"] for r in rows] != [r["output_text"] for r in greedy]


@pytest.mark.usefixtures("one_thread")
def test_error_rows_stay_rows(method_env):
    stage = GenerateStage(_slots_spec(method_env, "none"))
    reqs = [request(i, t) for i, t in enumerate(TEXTS[:3])]
    reqs.append(request(3, None, error="read: f3 is empty"))
    batch = batch_to_rows(text_stages(method_env.spec("none"))[0](rows_to_batch(reqs)))
    batch[1]["doc_ids"] = [10**9]  # out of vocabulary: this request's prefill raises
    rows = batch_to_rows(stage(rows_to_batch(batch)))
    assert [r["request_id"] for r in rows] == ["r0", "r1", "r2", "r3"]
    assert rows[0]["error"] is None and rows[2]["error"] is None
    assert rows[1]["error"].startswith("generate: ") and rows[1]["output_text"] is None
    assert rows[1]["finish_reason"] is None and rows[3]["finish_reason"] is None
    assert rows[0]["finish_reason"] in {"eos", "length"} and rows[2]["finish_reason"] in {"eos", "length"}
    assert rows[3]["error"] == "read: f3 is empty"


def test_slots_and_memory_are_checked_in_the_spec(method_env):
    spec = method_env.spec("none")
    for bad, match in (
        ({"decode_slots": 0}, "decode_slots"), ({"decode_slots": 300}, "decode_slots"),
        ({"decode_slots": "many"}, "decode_slots"), ({"kv_memory_gb": -1}, "kv_memory_gb"),
        ({"kv_memory_gb": float("inf")}, "kv_memory_gb"), ({"kv_memory_fraction": 1.5}, "kv_memory_fraction"),
    ):
        with pytest.raises(ValueError, match=match):
            spec_from_dict({**spec, "resources": {**spec["resources"], **bad}})
    with pytest.raises(ValueError, match="engine"):  # one engine now: the old switch is an unknown key
        spec_from_dict({**spec, "generation": {**spec["generation"], "engine": "dynamic"}})
    ok = spec_from_dict({**spec, "resources": {**spec["resources"], "batch_size": 4, "decode_slots": 64}})
    assert ok.resources.decode_slots == 64  # slots may exceed a batch: several batches share them


def test_the_model_loads_and_every_forward_runs_on_the_engine_thread(tiny_model_dir, tokenizer, monkeypatch):
    """torch's OpenMP work on two threads costs a CPU forward pass ~15% (stages/decoding/
    service.py): the stage loads its model on the engine's thread, not the caller's, and
    every forward pass (prefill and steps) runs there too."""
    import stages.model_loading as model_loading

    where: list[tuple[str, int]] = []
    real_load = model_loading.load_causal_lm

    def load(*args, **kwargs):
        model, tok = real_load(*args, **kwargs)
        where.append(("load", threading.get_ident()))
        # The engine's view is a copy of the model that keeps its hooks (forward.decode_view).
        model.get_input_embeddings().register_forward_pre_hook(
            lambda *_: where.append(("forward", threading.get_ident()))
        )
        return model, tok

    monkeypatch.setattr(model_loading, "load_causal_lm", load)
    stage = GenerateStage(_spec(tiny_model_dir, max_new_tokens=3))
    out = batch_to_rows(stage(rows_to_batch([_request(0, tokenizer, "a document about rivers")])))
    stage.service.close(timeout=60)
    assert out[0]["error"] is None
    assert [w for w, _ in where[:1]] == ["load"] and any(w == "forward" for w, _ in where)
    assert len({ident for _, ident in where}) == 1 and where[0][1] != threading.get_ident()


@pytest.fixture
def reading_passes(monkeypatch) -> list[tuple[int, int]]:
    """(rows, documents) of every Finch chunk-reading pass the test makes, in order."""
    import stages.finch.shared as shared

    calls: list[tuple[int, int]] = []
    groups = shared.document_groups

    def counted(parts):
        row_doc, doc_row = groups(parts)
        calls.append((len(row_doc), len(doc_row)))
        return row_doc, doc_row

    monkeypatch.setattr(shared, "document_groups", counted)
    return calls


def _three_questions_of_two_documents(tokenizer, **extra) -> list[dict]:
    """Request rows: two documents, three questions each, in document order."""
    docs = ["rivers and mountains of the north. " * 12, "a long note on tea and its history. " * 10]
    reqs: list[dict] = []
    for d, text in enumerate(docs):
        for q in ["Which rivers?", "How high are the mountains?", "Is tea mentioned?"]:
            r = _request(len(reqs), tokenizer, text)
            reqs.append({**r, "doc_id": f"d{d}", "task": "qa", "instruction": "Answer.", "question": q, **extra})
    return reqs


def test_select_reads_a_document_once_for_all_its_questions(tiny_model_dir, tokenizer, reading_passes):
    """Method select (reading chunk): the engine hands a document's questions to one reading
    pass (share_reading on), with the same answers as one pass per question (off)."""
    calls = reading_passes
    reqs = _three_questions_of_two_documents(tokenizer)
    texts = {}
    for share in (True, False):
        calls.clear()
        spec = spec_from_dict({
            "name": "g", "input": {"uri": "/unused"}, "task": {"kind": "qa", "questions": ["Who?"]},
            "compression": {"method": "select", "target_tokens": 24, "chunk_tokens": 32, "evidence": "heads",
                            "share_reading": share},
            "generation": {"model": str(tiny_model_dir), "max_new_tokens": 6},
        })  # fmt: skip
        out = batch_to_rows(GenerateStage(spec.model_dump(mode="json"))(rows_to_batch(reqs)))
        assert all(row["error"] is None for row in out)
        assert calls == ([(3, 1), (3, 1)] if share else [(1, 1)] * 6)
        assert all(0 < row["context_tokens"] <= 24 and row["compress_s"] > 0 for row in out)
        texts[share] = [row["output_text"] for row in out]
    assert texts[True] == texts[False]


def test_a_document_whose_questions_come_in_two_calls_is_read_once(tiny_model_dir, tokenizer, monkeypatch,
                                                                      reading_passes):
    """Ray Data's batches do not follow documents: the first call holds d0's three questions
    and d1's first, the second d1's other two. Each row says how many requests its document
    has (doc_requests), so the engine holds d1's first question until the rest are queued."""
    import stages.finch.prefill as prefill

    calls = reading_passes

    read, first_read = prefill.read_shared, threading.Event()

    def read_then_say(*args, **kwargs):
        out = read(*args, **kwargs)
        first_read.set()  # the second call comes once d0 is read: d1's first question is queued alone
        return out

    monkeypatch.setattr(prefill, "read_shared", read_then_say)
    reqs = _three_questions_of_two_documents(tokenizer, doc_requests=3)
    spec = spec_from_dict({
        "name": "g", "input": {"uri": "/unused"}, "task": {"kind": "qa", "questions": ["Who?"]},
        "compression": {"method": "select", "target_tokens": 24, "chunk_tokens": 32, "evidence": "heads"},
        "generation": {"model": str(tiny_model_dir), "max_new_tokens": 32},  # d0's rows decode meanwhile
    })  # fmt: skip
    stage = GenerateStage(spec.model_dump(mode="json"))
    batches = [rows_to_batch(reqs[:4]), rows_to_batch(reqs[4:])]
    got: dict[int, list] = {}

    def call(i: int) -> None:
        if i:
            assert first_read.wait(timeout=120)
        got[i] = batch_to_rows(stage(batches[i]))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert [r["request_id"] for r in got[0] + got[1]] == [r["request_id"] for r in reqs]
    assert all(r["error"] is None for r in got[0] + got[1])
    assert calls == [(3, 1), (3, 1)]  # each document read once, all its questions together


@pytest.mark.usefixtures("one_thread")
def test_keep_context_is_the_text_a_method_prefilled_and_null_for_kept_keys_and_values(tiny_model_dir, tokenizer):
    """output.keep_context: select's column is the decoded sentences it prefilled (in
    document order here, so they are exactly kept_spans' tokens); finch in mode kv reads
    kept keys/values, not text, so its column stays null while kept_spans is set."""
    from stages.compression.base import positions_of

    text = "rivers and mountains of the north. a long note on tea and its history. " * 8
    req = {**_request(0, tokenizer, text), "task": "qa", "instruction": "Answer.", "question": "Is tea mentioned?"}
    settings = {"target_tokens": 24, "chunk_tokens": 32}
    for method, extra in (("select", {"evidence": "heads", "order": "document"}), ("finch", {})):
        spec = spec_from_dict({
            "name": "g", "input": {"uri": "/unused"}, "task": {"kind": "qa", "questions": ["Who?"]},
            "compression": {"method": method, **settings, **extra},
            "generation": {"model": str(tiny_model_dir), "max_new_tokens": 4},
            "output": {"uri": "/unused-out", "keep_context": True},
        })  # fmt: skip
        (row,) = batch_to_rows(GenerateStage(spec.model_dump(mode="json"))(rows_to_batch([req])))
        assert row["error"] is None and row["kept_spans"], method
        if method == "select":
            kept = [req["doc_ids"][p] for p in positions_of(row["kept_spans"])]
            assert 0 < len(kept) < req["doc_tokens"]
            assert row["context"] == tokenizer.decode(kept, skip_special_tokens=False)
        else:
            assert row["context"] is None
