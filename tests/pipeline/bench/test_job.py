"""`longdoc bench job` end to end on random:tiny (Ray and the no-Ray runner), and its refusals."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.cli import app

ROOT = Path(__file__).resolve().parents[3]
SPEC = str(ROOT / "jobs" / "sample-summarize.yaml")
TINY = ["--model", "random:tiny", "--docs", "3", "--set", "generation.max_new_tokens=4"]


def _invoke(*args: str):
    return CliRunner().invoke(app, ["bench", "job", *args], catch_exceptions=False)


def test_ray_job_and_peer_write_every_document_and_the_json_layout(tmp_path, monkeypatch):
    # ~40 s here: `longdoc run` starts its own Ray (~15 s) and the peer two interpreters.
    monkeypatch.chdir(ROOT)
    r = _invoke(SPEC, *TINY, "--peer-batch-sizes", "1,2", "--runs", "1", "--runner", "ray", "--out", str(tmp_path))
    assert r.exit_code == 0, r.output
    [js] = tmp_path.glob("job-cpu-sample-summarize-random-tiny.json")
    [md] = tmp_path.glob("job-cpu-sample-summarize-random-tiny.md")
    res = json.loads(js.read_text())

    assert res["bench"] == "job" and res["layout_version"] == 1
    assert res["command"] == (f"longdoc bench job {SPEC} --set generation.max_new_tokens=4 --docs 3 --model random:tiny "
                              f"--runner ray --runs 1 --out {tmp_path} --peer-batch-sizes 1,2")
    assert set(res["versions"]) >= {"longdoc_commit", "torch", "transformers", "ray", "python"}
    assert res["device"]["type"] == "cpu" and res["device"]["name"]
    s = res["settings"]
    assert s["docs"] == 3 and s["max_new_tokens"] == 4 and s["runner"] == "ray" and s["dtype"] == "float32"
    assert res["sides"]["longdoc"]["kind"] == "longdoc" and res["sides"]["longdoc"]["method"] == "truncate"
    assert res["sides"]["peer"]["kind"] == "peer" and res["sides"]["peer"]["batch_size"] in (1, 2)
    # Every candidate batch size of the peer was measured, and the best one timed.
    probe = res["peer_probe"]["peer"]
    assert [c["batch_size"] for c in probe["candidates"]] == [1, 2]
    assert all(c["status"] == "ok" and c["docs_per_s"] > 0 for c in probe["candidates"])
    assert probe["best"] == max(probe["candidates"], key=lambda c: c["docs_per_s"])["batch_size"]
    for side in ("longdoc", "peer"):
        [run] = res["runs_by_side"][side]
        assert run["docs"] == 3 and run["failed"] == 0  # both sides wrote every document
        assert 0 < run["steady_s"] < run["wall_s"]
        assert run["peak_rss_gb"] > 0 and run["latency_p50_s"] > 0 and run["strays"] == []
        m = res["summary"][side]
        assert m["runs"] == 1 and m["docs_per_hour_wall"] == pytest.approx(3 * 3600 / run["wall_s"])
    assert res["runs_by_side"]["longdoc"][0]["processes"] > 2  # Ray's processes are in the tree
    assert res["runs_by_side"]["longdoc"][0]["where"]["ray_up_and_plan_s"] > 0
    # Same prompt ids, same seeded weights, fp32: the peer's greedy text is longdoc's.
    agree = res["agreement"]["longdoc"]
    assert agree["compared"] == 3 and agree["text_equal"] == 3 and agree["prompt_tokens_equal"] == 3
    ratio = res["ratios"]["longdoc"]["vs_peer"]
    assert ratio["wall"] == pytest.approx(res["summary"]["longdoc"]["docs_per_hour_wall"]
                                          / res["summary"]["peer"]["docs_per_hour_wall"])
    [target] = res["targets"]
    assert target["pass"] == (ratio["wall"] >= 1.5)
    assert ("PASS" if target["pass"] else "FAIL") + " longdoc: documents/hour >= 1.5x" in r.output
    assert "ratio longdoc / peer: documents/hour" in r.output
    assert "## Medians" in md.read_text() and "| peer |" in md.read_text()


# Blocks `import ray` in every interpreter the bench starts (sitecustomize runs at start-up),
# as on a GPU machine without Ray: the bench must pick the in-process runner by itself.
_NO_RAY = "import sys\nsys.modules['ray'] = None\n"


def test_without_ray_the_local_runner_runs_variants_with_engine_figures(tmp_path):
    block = tmp_path / "no-ray"
    block.mkdir()
    marks = tmp_path / "marks.txt"
    # Every interpreter that has BENCH_MARK in its environment says so: the variant's env.
    # override must reach its own side's process, and no other.
    (block / "sitecustomize.py").write_text(
        _NO_RAY + f"import os\nif os.environ.get('BENCH_MARK'):\n    open({str(marks)!r}, 'a').write(os.environ['BENCH_MARK'] + '\\n')\n")
    env = {**os.environ, "PYTHONPATH": str(block), "OMP_NUM_THREADS": "1"}
    env.pop("BENCH_MARK", None)
    out = tmp_path / "results"
    args = [SPEC, "--model", "random:tiny", "--docs", "2", "--set", "generation.max_new_tokens=4", "--runs", "1",
            "--sides", "longdoc", "--variant", "greedy:generation.speculative.method=none",
            "--variant", "pld:generation.speculative.method=prompt_lookup;env.BENCH_MARK=pld-side;generation.dtype=bfloat16",
            "--out", str(out)]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pipeline.bench.job", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert time.perf_counter() - t0 < 300
    res = json.loads(next(out.glob("job-cpu-*.json")).read_text())
    assert ("--variant 'pld:generation.speculative.method=prompt_lookup;env.BENCH_MARK=pld-side;generation.dtype=bfloat16'"
            " --docs 2") in res["command"]
    # Sides in other dtypes are named as such, and each one's weights were drawn before any side ran.
    assert res["settings"]["side_dtypes"] == {"greedy": "auto", "pld": "bfloat16"}
    assert "dtype float32 (the peer); sides: greedy auto, pld bfloat16" in proc.stdout
    assert set(marks.read_text().split()) == {"pld-side"}  # the pld side's process, not the greedy one's
    assert res["sides"]["pld"]["overrides"] == ["generation.speculative.method=prompt_lookup", "env.BENCH_MARK=pld-side",
                                                "generation.dtype=bfloat16"]
    assert res["settings"]["runner"] == "inprocess" and res["versions"]["ray"] is not None  # installed, not importable
    assert list(res["sides"]) == ["greedy", "pld"] and res["peer_probe"] == {}
    assert {res["sides"][x]["engines"] for x in ("greedy", "pld")} == {1}  # the in-process runner runs one
    for side in ("greedy", "pld"):
        [run] = res["runs_by_side"][side]
        assert run["docs"] == 2 and run["failed"] == 0 and run["runner"] == "inprocess"
        w = run["where"]
        assert w["engine_steps"] >= 3 and w["engine_prefill_s"] > 0 and w["generate_init_s (model load + warm-up)"] > 0
        # what comes before the first row, each part apart
        assert w["interpreter_s"] > 0 and w["imports_s"] > 0 and w["read_s"] > 0 and w["tokenize_init_s"] > 0
        assert sum(w[k] for k in ("interpreter_s", "imports_s", "generate_init_s (model load + warm-up)", "read_s",
                                  "tokenize_init_s")) <= w["first_row_start_s"]
    assert res["ratios"]["pld"]["vs_first"]["side"] == "greedy"
    # CPU targets compare with the peer, which did not run: named, neither passed nor failed
    assert res["targets"] and all(t["pass"] is None and t["value"] is None for t in res["targets"])
    assert "ratio pld / greedy: documents/hour" in proc.stdout



def test_a_bench_cut_short_keeps_the_sides_it_finished(tmp_path):
    # A device call's time limit ends the bench with SIGTERM (timeout): the sides measured
    # before it are on disk, marked partial, not lost with the side that was running.
    out = tmp_path / "results"
    args = [SPEC, "--model", "random:tiny", "--docs", "2", "--set", "generation.max_new_tokens=4", "--runs", "1",
            "--sides", "longdoc", "--runner", "local", "--variant", "first:generation.speculative.method=none",
            "--variant", "second:generation.speculative.method=prompt_lookup", "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.bench.job", *args], cwd=ROOT,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while not list(out.glob("job-cpu-*.json")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        proc.terminate()  # while the second side runs
        log = proc.communicate(timeout=60)[0]
    finally:
        proc.kill()
    res = json.loads(next(out.glob("job-cpu-*.json")).read_text())
    assert proc.returncode != 0, log[-2000:]  # it was cut short, not finished
    assert list(res["runs_by_side"]) == ["first"] and res["runs_by_side"]["first"][0]["docs"] == 2
    assert res["partial"] and "**Partial**" in next(out.glob("job-cpu-*.md")).read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.yaml"], "job spec 'missing.yaml' not found"),
        ([SPEC, "--runs", "0"], "--runs 0: allowed: an integer >= 1"),
        ([SPEC, "--peer-batch-sizes", "4,x"], "--peer-batch-sizes '4,x': allowed"),
        ([SPEC, "--peer-batch-sizes", "0,8"], "--peer-batch-sizes '0,8': allowed"),
        ([SPEC, "--peer-batch-sizes", "8,8"], "--peer-batch-sizes '8,8': allowed"),
        ([SPEC, "--docs", "0"], "--docs 0: allowed"),
        # a candidate above the documents probed: the same work as a smaller one, noise picks
        ([SPEC, "--peer-batch-sizes", "4,12", "--probe-docs", "4"], "--peer-batch-sizes 4,12 --probe-docs 4: batch "
         "size 12 would be timed on 4 documents, the same work as batch 4; give --probe-docs 12 or more"),
        ([SPEC, "--synthetic-docs", "10"], "--synthetic-docs and --doc-tokens go together"),
        ([SPEC, "--variant", "x:generation.model=random:tiny"], "'generation.model' cannot differ between sides"),
        ([SPEC, "--variant", "x:input.limit=3"], "'input.limit' cannot differ"),
        ([SPEC, "--variant", "no name"], "NAME:key=value"),
        ([SPEC, "--variant", "x:env.1BAD=2"], "env.NAME=value"),
        ([SPEC, "--variant", "a:compression.method=none", "--variant", "a:compression.method=rag"], "distinct names"),
        ([SPEC, "--variant", "a:compression.method=zip"], "compression"),
        ([SPEC, "--set", "generation.temperature=0.7"], "the bench compares greedy decoding"),
        ([SPEC, "--runner", "yarn"], "'yarn' is not one of 'auto', 'ray', 'local'"),
        ([SPEC, "--variant", "a:runner=yarn"], "--variant a: 'runner=yarn': allowed: runner=auto|ray|local"),
        ([SPEC, "--sides", "longdoc,hf"], "--sides 'longdoc,hf': allowed"),
        ([SPEC, "--usd-per-device-hour", "-1"], "--usd-per-device-hour -1.0: allowed: >= 0"),
        ([SPEC, "--date", "2026-02-30"], "2026-02-30"),
    ],
)
def test_bad_options_are_refused_at_once_with_a_clear_message(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    t0 = time.perf_counter()
    r = CliRunner().invoke(app, ["bench", "job", *args, "--out", str(tmp_path)])
    assert r.exit_code == 2, r.output
    # the message as one line: typer boxes an Enum option's refusal and wraps it in the box
    assert message in " ".join(r.output.replace("│", " ").split())
    assert "Traceback" not in r.output
    assert time.perf_counter() - t0 < 10
    assert not list(tmp_path.iterdir())  # nothing ran


def test_the_peer_imports_only_what_a_user_without_longdoc_has():
    tree = ast.parse((ROOT / "pipeline" / "bench" / "peer.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add((node.module or "").split(".")[0])
    assert names <= {"__future__", "argparse", "json", "time", "torch", "transformers", "pyarrow"}, names


def test_agreement_counts_rows_a_stop_rule_ended_early_apart_from_different_text(tmp_path):
    from pipeline.bench.job import Prepared, agreement

    p = Prepared(tmp_path, {}, {"longdoc": "truncate"}, {"longdoc": True}, {"longdoc": "none"}, {"longdoc": "peer"},
                 {}, "cpu", "cpu", "float32", [], 3, 0, "3 docs", 2, "spec", 16, True)

    def row(rid: str, text: str, tokens: int) -> dict:
        return {"request_id": rid, "doc_id": f"{rid}.txt", "error": None, "output_text": text,
                "output_tokens": tokens, "prompt_tokens": 10}

    peer = [row("a", "same text", 4), row("b", "a loop a loop a loop", 16), row("c", "other words", 16)]
    ours = [row("a", "same text", 4), row("b", "a loop a loop ", 9), row("c", "other", 16)]
    got = agreement(p, "longdoc", ours, peer)
    # b stopped earlier (fewer tokens, the start of the peer's text); c decoded differently.
    assert (got["compared"], got["text_equal"], got["text_prefix"], got["differs"]) == (3, 1, 1, ["c.txt"])


def test_side_agreement_matches_each_question_of_a_document_by_its_prompt(tmp_path):
    """Sides with other settings have other request ids: rows are matched by document and
    prompt, so each of a document's questions is compared with its own answer."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.bench.job import side_agreement
    from pipeline.bench.job_sides import read_rows

    def side(name: str, texts: list[str], order: list[int]) -> list[dict]:
        part = tmp_path / name / "run_date=2026-01-01"
        part.mkdir(parents=True)
        n = len(texts)
        cols = {"request_id": [f"{name}-{i}" for i in range(n)], "doc_id": [f"d{i // 2}" for i in range(n)],
                "prompt": [f"doc {i // 2} question {i % 2}" for i in range(n)], "output_text": texts}
        for c in ("output_tokens", "prompt_tokens", "context_tokens", "draft_tokens", "accepted_tokens",
                  "decode_steps"):
            cols[c] = [1] * n
        for c in ("e2e_s", "prefill_s", "decode_s", "ttft_s", "compress_s"):
            cols[c] = [0.1] * n
        cols["error"] = pa.array([None] * n, pa.string())
        pq.write_table(pa.table(cols).take(order), part / "part-0.parquet")
        return read_rows(tmp_path / name, "2026-01-01")

    first = side("a", ["x", "y", "z", "w"], [0, 1, 2, 3])
    other = side("b", ["x", "y", "z", "q"], [3, 1, 0, 2])  # another order of the rows
    agreement = side_agreement(first, other)
    assert agreement["compared"] == 4 and agreement["text_equal"] == 3 and agreement["differs"] == ["d1"]


def test_a_sides_method_says_where_it_reads_for_the_time_line():
    """The time line took a text method's compress_s (spent in the tokenize stage) off the
    engine's prefill: each side now records where its method reads."""
    from pipeline.bench.job import _runs_at

    assert _runs_at("truncate") == "tokenize" and _runs_at("finch") == "prefill" and _runs_at("none") == "prefill"
    assert _runs_at("bm25") == "text_stage" and _runs_at("no-such-method") is None
