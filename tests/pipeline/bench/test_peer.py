"""pipeline/bench/peer.py, the plain-transformers script the bench job compares with: the
prompt it builds is longdoc's to the token (stages/prompting.py, truncate's cut), its
options are checked, and its batched greedy run equals each row decoded alone.

The peer runs in-process here (``main(argv)``) on the tiny model; the bench job runs it
as a script in a fresh process (tests/pipeline/bench/test_job.py)."""

from __future__ import annotations

import copy
import json

import pyarrow.parquet as pq
import pytest
import torch
from tiny_models import one_torch_thread

from pipeline.bench import peer
from stages.compression.truncate import truncate_ids
from stages.prompting import PromptBuilder


@pytest.fixture(autouse=True)
def _one_thread():
    yield from one_torch_thread()  # tiny matmuls on a shared 2-core machine


INSTRUCTION = "Summarize the document."
TEXTS = ["The river Elbe rises in the Giant Mountains. " * 4, "Hamburg is a port.", "It flows north to the sea. " * 3]


@pytest.mark.parametrize("keep", ["head", "tail", "head_tail"])
@pytest.mark.parametrize("target", [1, 2, 5, 9, 10, 30])
def test_keep_tokens_is_longdocs_truncation(keep: str, target: int):
    ids = list(range(100, 110))
    assert peer.keep_tokens(ids, target, keep) == truncate_ids(ids, target, keep)


def test_keep_tokens_zero_keeps_everything():
    assert peer.keep_tokens([5, 6, 7], 0, "head_tail") == [5, 6, 7]


@pytest.mark.parametrize("question", [None, "Which river is it?"])
def test_prompt_ids_are_longdocs_prompt(tokenizer, question):
    doc = tokenizer(TEXTS[0], add_special_tokens=False)["input_ids"]
    want = PromptBuilder(tokenizer).build(doc, INSTRUCTION, question).full_ids
    assert peer.prompt_ids(tokenizer, doc, INSTRUCTION, question) == want
    plain = copy.deepcopy(tokenizer)  # a base model's tokenizer: no chat template
    plain.chat_template = None
    got = peer.prompt_ids(plain, doc, INSTRUCTION, question)
    assert got == PromptBuilder(plain).build(doc, INSTRUCTION, question).full_ids
    assert plain.decode(got).endswith("\n\nAnswer:")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--model", "m"], "give exactly one of --batch-size (run) or --probe (probe)"),
        (["--model", "m", "--batch-size", "2", "--probe", "1,2"], "give exactly one of --batch-size"),
        (["--model", "m", "--batch-size", "2"], "run mode needs --batch-size >= 1 and --out"),
        (["--model", "m", "--batch-size", "0", "--out", "o"], "run mode needs --batch-size >= 1"),
        (["--probe", "1"], "give exactly one of --model or --random-config"),
        (["--model", "m", "--random-config", "c", "--probe", "1"], "give exactly one of --model or --random-config"),
    ],
)
def test_bad_options_are_refused(extra, message, capsys):
    with pytest.raises(SystemExit) as err:
        peer.parse_args(["--requests", "r.jsonl", "--max-new-tokens", "4", "--timing", "t.json", *extra])
    assert err.value.code == 2 and message in capsys.readouterr().err


def _requests(tmp_path) -> str:
    path = tmp_path / "requests.jsonl"
    rows = [{"request_id": f"r{i}", "doc_id": f"d{i}", "text": t, "instruction": INSTRUCTION,
             "question": "Which river?" if i == 1 else None} for i, t in enumerate(TEXTS)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _greedy_alone(model, ids: list[int], steps: int, eos: set[int]) -> list[int]:
    """Greedy decoding of one unpadded row by plain forward passes (the oracle)."""
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(steps):
            nxt = int(model(input_ids=torch.tensor([ids + out])).logits[0, -1].argmax())
            out.append(nxt)
            if nxt in eos:
                break
    return out


def test_run_writes_every_request_as_each_row_decoded_alone(tiny_model_dir, tmp_path):
    out, timing = tmp_path / "out.parquet", tmp_path / "timing.json"
    argv = ["--requests", _requests(tmp_path), "--model", str(tiny_model_dir), "--max-new-tokens", "5",
            "--truncate-tokens", "12", "--keep", "head_tail", "--batch-size", "2", "--static-compile", "off",
            "--out", str(out), "--timing", str(timing)]
    peer.main(argv)
    rows = pq.read_table(out).to_pylist()
    assert [r["request_id"] for r in rows] == ["r0", "r1", "r2"] and [r["batch"] for r in rows] == [0, 0, 1]
    args = peer.parse_args(argv)
    model, tok = peer.load(args)
    eos = {tok.eos_token_id, model.generation_config.eos_token_id} - {None}
    for r, text, question in zip(rows, TEXTS, [None, "Which river?", None], strict=True):
        doc = peer.keep_tokens(tok(text, add_special_tokens=False)["input_ids"], 12, "head_tail")
        ids = peer.prompt_ids(tok, doc, INSTRUCTION, question)
        assert r["prompt_tokens"] == len(ids)
        want = _greedy_alone(model, ids, 5, eos)
        assert r["output_tokens"] == len(want) and r["output_text"] == tok.decode(want, skip_special_tokens=True).strip()
    t = json.loads(timing.read_text())
    assert t["mode"] == "run" and t["rows"] == 3 and [b["size"] for b in t["batches"]] == [2, 1]
    assert t["t_start"] <= t["t_loaded"] <= t["t_first_batch"] <= t["t_written"]
    assert t["static_compile"] is False and t["device"] == "cpu" and t["peak_gpu_bytes"] is None


def test_rows_stop_at_eos_and_probe_times_every_candidate(tiny_model_dir, tmp_path):
    argv = ["--requests", _requests(tmp_path), "--model", str(tiny_model_dir), "--max-new-tokens", "6",
            "--probe", "1,2", "--probe-docs", "3", "--timing", str(tmp_path / "t.json")]
    args = peer.parse_args(argv)
    model, tok = peer.load(args)
    rows = peer.tokenize(peer.read_requests(args.requests), tok, args)
    free = _greedy_alone(model, rows[0]["ids"], 6, set())
    model.generation_config.eos_token_id = free[2]  # the model's own EOS joins the tokenizer's
    gen, eos = peer.generation_config(model, tok, args, static=False)
    assert eos == {tok.eos_token_id, free[2]}
    got = peer.generate(model, rows[:2], 2, gen, eos, tok.pad_token_id, static=False)
    assert got[0] == free[: free.index(free[2]) + 1]  # cut after the first EOS, kept
    res = peer.probe(args, model, tok, rows, static=False)
    assert [c["batch_size"] for c in res["candidates"]] == [1, 2]
    assert all(c["status"] == "ok" and c["docs"] == 3 and c["docs_per_s"] > 0 for c in res["candidates"])
    assert res["best"] == max(res["candidates"], key=lambda c: c["docs_per_s"])["batch_size"]
