"""Continuation NLL (pipeline/eval/nll.py) through every method's scoring hook, on the
tiny random Llama in float32: full budgets reproduce the full-context NLL computed
directly, no-context reproduces the bare continuation's, every method gives a finite
figure within its budget, and `run_eval --metrics nll` writes the table and plot."""

from __future__ import annotations

import json
import math
import struct

import pytest
import torch
from tiny_models import one_torch_thread

from pipeline.eval.conditioning import condition_for
from pipeline.eval.nll import (
    NO_CONTEXT,
    aggregate_nll,
    continuation_nll,
    read_eval_documents,
    run_nll,
    split_document,
    start_ids,
)
from pipeline.eval.plot import plot_eval
from pipeline.eval.specs import EvalRun, build_eval_spec, plan_runs, split_overrides
from stages.compression import method_for, registry

TEXT = (
    "The harbour committee met in the old library to review the archive of the town. "
    "Members read reports about roads, bridges, ferries and the lighthouse, argued about "
    "the budget for the summer festival and agreed to meet again after the harvest. "
)
C, Q = 24, 8  # continuation tokens, query tokens


@pytest.fixture(autouse=True)
def _one_thread():
    yield from one_torch_thread()


@pytest.fixture
def eval_path(tmp_path):
    recs = [{"id": f"doc-{i}", "text": f"Chapter {i}. " + TEXT * (3 + i)} for i in range(2)]
    p = tmp_path / "docs.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return p


def spec(run: EvalRun, eval_path, tmp_path, model_dir, *extra: str, ac: str | None = None):
    sets = [f"generation.model={model_dir}", "generation.dtype=float32", *extra]
    common, scoped = split_overrides(sets, set(registry()))
    return build_eval_spec(run, str(eval_path), str(tmp_path / "out"), max_new_tokens=4, limit=None,
                           overrides=common + scoped.get(run.method, []), autocompressor=ac)  # fmt: skip


@torch.inference_mode()
def direct_nll(model, context: list[int], cont: list[int]) -> float:
    """Mean NLL of ``cont`` after ``context`` from one plain forward over both."""
    ids = torch.tensor([context + cont])
    logits = model(ids).logits[0, len(context) - 1 : -1].float()
    return float(torch.nn.functional.cross_entropy(logits, torch.tensor(cont)))


def doc_split(tokenizer, eval_path):
    _, text = read_eval_documents(str(eval_path))[1]
    return split_document(tokenizer(text, add_special_tokens=False)["input_ids"], C, 10**6)


def scored(job, start, earlier, cont):
    loaded, condition = condition_for(method_for(job.compression), job, torch.device("cpu"))
    cond = condition(start, earlier, Q)
    nll = continuation_nll(loaded.model, cond.state, cont)
    return loaded.model, cond, nll


def test_split_document_and_start() -> None:
    earlier, cont = split_document(list(range(10)), 3, 4)
    assert (earlier, cont) == ([3, 4, 5, 6], [7, 8, 9])
    assert split_document(list(range(10)), 3, 100)[0] == list(range(7))
    with pytest.raises(ValueError, match="continuation_tokens"):
        split_document([1, 2, 3], 3, 10)
    with pytest.raises(ValueError, match=">= 1"):
        split_document([1, 2, 3], 0, 10)


@pytest.mark.parametrize(
    "method,extra",
    [("none", ()), ("truncate", ()), ("finch", ()), ("finch", ("finch:compression.mode=kv", "finch:compression.scoring=paper"))],
)  # fmt: skip
def test_full_budget_equals_full_context(method, extra, eval_path, tmp_path, tiny_model_dir, tokenizer) -> None:
    earlier, cont = doc_split(tokenizer, eval_path)
    start = start_ids(tokenizer)
    budget = None if method == "none" else len(earlier) + 5
    model, cond, nll = scored(spec(EvalRun(method, budget), eval_path, tmp_path, tiny_model_dir, *extra), start, earlier, cont)
    assert nll.shape == (C,) and cond.context_tokens == [len(earlier)]
    assert float(nll.mean()) == pytest.approx(direct_nll(model, start + earlier, cont), abs=1e-4)


def test_small_budget_differs_and_is_respected(eval_path, tmp_path, tiny_model_dir, tokenizer) -> None:
    earlier, cont = doc_split(tokenizer, eval_path)
    start = start_ids(tokenizer)
    model, cond, nll = scored(spec(EvalRun("truncate", 16), eval_path, tmp_path, tiny_model_dir), start, earlier, cont)
    assert cond.context_tokens == [16]
    kept = earlier[:8] + earlier[-8:]  # truncate's default head_tail
    assert float(nll.mean()) == pytest.approx(direct_nll(model, start + kept, cont), abs=1e-4)
    assert abs(float(nll.mean()) - direct_nll(model, start + earlier, cont)) > 1e-3
    with pytest.raises(ValueError, match="query_tokens"):  # finch's query must fit its budget
        scored(spec(EvalRun("finch", Q), eval_path, tmp_path, tiny_model_dir), start, earlier, cont)


def test_no_context_equals_direct(eval_path, tmp_path, tiny_model_dir, tokenizer) -> None:
    docs = read_eval_documents(str(eval_path))
    job = spec(EvalRun("none", None), eval_path, tmp_path, tiny_model_dir)
    rows = run_nll([EvalRun("none", None)], {"none-full": job}, docs, continuation_tokens=C, query_tokens=Q)
    ref = {r["doc_id"]: r for r in rows if r["method"] == NO_CONTEXT}
    loaded, _ = condition_for(method_for(job.compression), job, torch.device("cpu"))
    for doc_id, text in docs:
        cont = tokenizer(text, add_special_tokens=False)["input_ids"][-C:]
        want = direct_nll(loaded.model, start_ids(tokenizer), cont)
        assert ref[doc_id]["nll"] == pytest.approx(want, abs=1e-4)
        assert ref[doc_id]["context_tokens"] == 0 and ref[doc_id]["error"] is None


@pytest.fixture(params=["vectors", "kv"])
def ac_checkpoint(request, tmp_path, tiny_model_dir):
    """An AutoCompressor checkpoint of each summary form (3 vectors or every 4th K/V per segment)."""
    from stages.autocompressor.checkpoint import save_autocompressor
    from stages.autocompressor.model import ACConfig, AutoCompressor
    from stages.model_loading import load_causal_lm

    lm, _ = load_causal_lm(str(tiny_model_dir), "float32")
    summary = torch.randn(3, lm.config.hidden_size, generator=torch.Generator().manual_seed(1)) * 0.2
    config = ACConfig(summary_length=3, accumulate_summary=True, summary_form=request.param, kv_stride=4)
    ac = AutoCompressor(lm, config, summary)
    return str(save_autocompressor(ac, tmp_path / "ac", base_model=str(tiny_model_dir)))


def test_every_method_finite_and_within_budget(eval_path, tmp_path, tiny_model_dir, ac_checkpoint) -> None:
    budget = 40
    runs = plan_runs(None, [budget], ac_checkpoint)
    assert {r.method for r in runs} == set(registry())  # every registered method is scored
    sets = ("rag:compression.chunk_tokens=16", "bm25:compression.chunk_tokens=16",
            "autocompressor:compression.segment_tokens=64")  # fmt: skip
    specs = {r.tag: spec(r, eval_path, tmp_path, tiny_model_dir, *sets, ac=ac_checkpoint) for r in runs}
    failed: dict[str, str] = {}
    rows = run_nll(runs, specs, read_eval_documents(str(eval_path)), continuation_tokens=C, query_tokens=Q, failed=failed)
    assert not failed and len(rows) == 2 * (len(runs) + 1)  # + the no-context reference
    for r in rows:
        assert r["error"] is None, r
        assert math.isfinite(r["nll"]) and r["e2e_s"] >= 0 and r["compress_s"] >= 0
        if r["target_tokens"] is not None:
            assert r["context_tokens"] <= budget < r["doc_tokens"]
            assert r["compression_ratio"] == pytest.approx(r["doc_tokens"] / r["context_tokens"])
    summary = aggregate_nll(rows)
    assert summary[0]["method"] == NO_CONTEXT and summary[1]["method"] == "none"
    assert summary[0]["gap_recovered"] == pytest.approx(0.0) and summary[1]["gap_recovered"] == pytest.approx(1.0)
    assert all(s["n"] == 2 and s["failed"] == 0 for s in summary)


def test_aggregate_gap_error_rows_and_plot(tmp_path) -> None:
    def row(method, budget, nll, error=None):
        return {"task": "nll", "method": method, "target_tokens": budget, "doc_id": "d", "nll": nll,
                "doc_tokens": 1000, "context_tokens": 100, "compression_ratio": 10.0,
                "compress_s": 0.5, "e2e_s": 1.0, "error": error}  # fmt: skip

    rows = [row("finch", 512, 3.0), row("finch", 512, None, "nll: boom"), row("none", None, 2.0),
            row(NO_CONTEXT, None, 4.0), row("truncate", 128, 3.5),
            {**row("truncate", 128, 3.5), "doc_tokens": 2754, "context_tokens": 9, "compression_ratio": 306.0}]  # fmt: skip
    s = {(x["method"], x["target_tokens"]): x for x in aggregate_nll(rows)}
    # tokens given over tokens read, not the mean of the rows' ratios (158)
    assert s[("truncate", 128)]["compression_ratio"] == pytest.approx((1000 + 2754) / (100 + 9))
    assert [k for k in s] == [(NO_CONTEXT, None), ("none", None), ("truncate", 128), ("finch", 512)]
    assert s[("finch", 512)]["gap_recovered"] == pytest.approx(0.5)
    assert s[("finch", 512)]["failed"] == 1 and s[("finch", 512)]["nll"] == pytest.approx(3.0)
    assert s[("truncate", 128)]["gap_recovered"] == pytest.approx(0.25)
    qa = [{"task": "qa", "method": m, "target_tokens": b, "exact_match": 0.0, "contains": 0.5, "f1": 0.2,
           "compression_ratio": 10.0, "e2e_s": 2.0} for m, b in (("none", None), ("truncate", 512))]  # fmt: skip
    path = plot_eval(qa + aggregate_nll(rows), [], tmp_path / "both.png")
    assert struct.unpack(">II", path.read_bytes()[16:24])[1] > 1200  # QA rows + the NLL row
    no_full = aggregate_nll([r for r in rows if r["method"] != "none"])
    assert all(x["gap_recovered"] is None for x in no_full)  # no full-context reference


def test_run_eval_nll_writes_table_and_plot(eval_path, tmp_path, tiny_model_dir) -> None:
    from pipeline.eval.runner import render_markdown, run_eval

    res = run_eval(str(eval_path), methods=["none,truncate"], out=str(tmp_path / "ev"), eval_id="n1",
                   overrides=[f"generation.model={tiny_model_dir}", "generation.dtype=float32"],
                   metrics=["nll"], nll_budgets=[16, 32], continuation_tokens=C, query_tokens=Q,
                   progress=False)  # fmt: skip
    assert [(s["method"], s["target_tokens"]) for s in res.summary] == [
        (NO_CONTEXT, None), ("none", None), ("truncate", 16), ("truncate", 32)]  # fmt: skip
    assert all(s["task"] == "nll" and s["failed"] == 0 for s in res.summary)
    assert "| nll | truncate | 16 | - | 2 | 0 |" in render_markdown(res)
    d = tmp_path / "ev" / "n1"
    assert (d / "scored_nll.csv").is_file() and not (d / "scored.csv").exists()
    data = (d / "eval.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24])[1] < 600  # NLL row only
    with pytest.raises(ValueError, match="--metrics"):
        run_eval(str(eval_path), metrics=["perplexity"], out=str(tmp_path / "ev"))
