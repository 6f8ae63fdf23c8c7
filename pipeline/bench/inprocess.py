"""Run a job spec in ONE process without Ray: the same stages as `longdoc run`, for benchmarks.

Why: GPU benchmark machines have torch and transformers but no Ray (infra/README.md,
"GPU night"), and Ray's wheel does not travel within the device tool's limits. The
bench job's longdoc side (pipeline/bench/job.py) runs `longdoc run` where Ray is
installed and this module where it is not (``--runner local``); it also reports what
`longdoc run` cannot: the engine's own figures (``EngineStats``) and the model load.

Contract: ``python -m pipeline.bench.inprocess SPEC --date D --run-id R --timeline JSON``
reads the spec's documents (stages.read), expands the requests, tokenizes them
(TokenizeStage, with a method that runs at tokenize), runs a text-stage method (e.g.
rag) through its stage class, then ONE GenerateStage (one generate actor: the spec's
``resources.actors`` beyond one are not simulated) called with up to
``generate_batches_in_flight(spec)`` batches of ``resources.batch_size`` at once from
threads, as Ray calls an actor, so the engine's slots stay full across batches. Each
finished batch is staged by WriteStage and the date is committed at the end
(stages.partition.commit_date): the output table has `longdoc run`'s layout and rows.
The timeline JSON holds wall-clock stamps (``time.time()``): ``t_start`` (this module
imported: the interpreter is up), ``t_imported`` (the stages and torch imported),
``t_generate_ready`` (model loaded, engine warmed up), ``t_first_start`` (the first
document's tokenization began: its compression counts, as in a row's ``e2e_s``),
``t_first_submit`` (the first request reached the engine), ``t_last_written`` (the last
batch staged),
``t_committed``; seconds ``generate_init_s``, ``tokenize_init_s``, ``text_stage_init_s``,
``read_s`` (the documents read and expanded into requests),
``tokenize_s`` and ``text_stage_s`` (spent on the main thread while the engine decodes),
``engine`` (EngineStats as a dict, plus its describe()), ``rows`` and ``failed``.
Imports no Ray.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict

T_START = time.time()


def _batches(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def run_inprocess(spec_path: str, run_date: str, run_id: str) -> dict:
    """Run the spec (see the module contract); returns the timeline record."""
    from pipeline.plan import check_chain, generate_batches_in_flight, stage_chain
    from pipeline.runner import output_root
    from schemas.loading import load_spec
    from stages.compression import method_for
    from stages.generate import GenerateStage
    from stages.partition import commit_date
    from stages.read import (
        expand_requests,
        generation_fingerprint,
        iter_shard,
        list_shards,
        resolve_uri,
    )
    from stages.rows import rows_to_batch
    from stages.tokenize import TokenizeStage
    from stages.write import WriteStage

    t_imported = time.time()
    spec = load_spec(spec_path)
    check_chain(stage_chain(spec))
    spec_json = spec.model_dump(mode="json")
    root = output_root(spec, run_date)
    rec: dict = {"t_start": T_START, "t_imported": t_imported, "runner": "inprocess", "spec": spec_path}

    t0 = time.time()
    generate = GenerateStage(spec_json)  # model load + engine warm-up, once, before any document
    rec["generate_init_s"] = time.time() - t0
    rec["t_generate_ready"] = time.time()
    t0 = time.time()
    tokenize = TokenizeStage(spec_json)
    rec["tokenize_init_s"] = time.time() - t0
    method = method_for(spec.compression)
    text_stage = None
    if method.runs_at == "text_stage":
        t0 = time.time()
        text_stage = method.stage_class()(spec=spec_json)
        rec["text_stage_init_s"] = time.time() - t0
    write = WriteStage(root, run_date, run_id)

    # The requests, in input order (the plan's read -> limit -> requests).
    t0 = time.time()
    root_uri = resolve_uri(spec.input.uri, run_date)
    fingerprint = generation_fingerprint(spec)
    requests, n_docs = [], 0
    for shard in list_shards(spec.input, run_date):
        for doc in iter_shard(shard, spec.input, root_uri):
            if spec.input.limit is not None and n_docs >= spec.input.limit:
                break
            n_docs += 1
            requests.extend(expand_requests(doc, spec, run_id, run_date, fingerprint))

    rec["read_s"] = time.time() - t0
    in_flight = generate_batches_in_flight(spec)
    rec.update(documents=n_docs, requests=len(requests), batches_in_flight=in_flight,
               batch_size=spec.resources.batch_size)
    tokenize_s = text_s = 0.0
    rows = failed = 0
    t_first_start = t_first_submit = None
    t_last_written = time.time()

    def written(fut: Future) -> None:
        nonlocal rows, failed, t_last_written
        table = write(fut.result())
        rows += table.num_rows
        failed += table.num_rows - table.column("error").null_count
        t_last_written = time.time()

    pending: set[Future] = set()
    with ThreadPoolExecutor(max_workers=in_flight, thread_name_prefix="generate-call") as pool:
        for chunk in _batches(requests, spec.resources.batch_size):
            t0 = time.time()
            t_first_start = t_first_start or t0
            batch = tokenize(rows_to_batch(chunk))
            tokenize_s += time.time() - t0
            if text_stage is not None:
                t0 = time.time()
                batch = text_stage(batch)
                text_s += time.time() - t0
            while len(pending) >= in_flight:  # as many calls as Ray gives one actor
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    written(fut)
            t_first_submit = t_first_submit or time.time()
            pending.add(pool.submit(generate, batch))
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                written(fut)
    generate.service.close()
    commit = commit_date(root, run_date, run_id)
    rec.update(
        t_first_start=t_first_start, t_first_submit=t_first_submit, t_last_written=t_last_written, t_committed=time.time(),
        tokenize_s=tokenize_s, text_stage_s=text_s, rows=rows, failed=failed, commit=commit, output=root,
        engine={**asdict(generate.engine.stats), "describe": generate.engine.describe()},
    )
    assert rows == len(requests), f"{rows} rows written for {len(requests)} requests"
    return rec


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Run a job spec in one process without Ray (bench job's local runner).")
    p.add_argument("spec")
    p.add_argument("--date", required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--timeline", required=True, help="where to write the timeline JSON")
    a = p.parse_args(argv)
    rec = run_inprocess(a.spec, a.date, a.run_id)
    with open(a.timeline, "w") as f:
        json.dump(rec, f, indent=1, default=str)
    print(f"inprocess: {rec['rows']} rows ({rec['failed']} failed) -> {rec['output']}", flush=True)


if __name__ == "__main__":
    main()
