"""Build the Ray Data plan for a JobSpec (nothing runs until the dataset is consumed).

    shards -> read (tasks) -> [limit] -> requests (tasks, skip finished)
           -> tokenize (+ truncate)      actor pool, resources.compress_actors
           -> rag                         actor pool, compress_num_gpus (method=rag)
           -> generate                    actor pool, resources.actors/num_gpus/num_cpus
           -> write Parquet               tasks; returns per-row figures to the driver

Each stage declares the columns it needs and adds (``STAGES``); ``check_chain``
verifies the chain when the plan is built, so a wiring mistake fails before any
model loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schemas.spec import JobSpec
from stages.read import Document, expand_requests, generation_fingerprint, list_shards, read_shard

READ_COLUMNS = (
    "request_id", "run_id", "run_date", "job", "doc_id", "source_uri", "task",
    "prompt", "instruction", "question", "reference", "text", "error",
)  # fmt: skip


@dataclass(frozen=True)
class StageColumns:
    name: str
    needs: tuple[str, ...]
    adds: tuple[str, ...]


STAGES: dict[str, StageColumns] = {
    "read": StageColumns("read", (), READ_COLUMNS),
    "tokenize": StageColumns("tokenize", ("text", "error"), ("doc_ids", "doc_tokens")),
    "truncate": StageColumns("truncate", ("doc_ids",), ("context_ids", "context_tokens", "compress_s")),
    "rag": StageColumns(
        "rag", ("doc_ids", "question", "instruction"), ("context_ids", "context_tokens", "compress_s")
    ),
    "generate": StageColumns(
        "generate", ("request_id", "doc_ids", "instruction", "question", "error"), ("output_text",)
    ),
    "write": StageColumns("write", ("request_id", "output_text"), ()),
}


def stage_chain(spec: JobSpec) -> list[str]:
    chain = ["read", "tokenize"]
    if spec.compression.method == "truncate":
        chain.append("truncate")
    elif spec.compression.method == "rag":
        chain.append("rag")
    return chain + ["generate", "write"]


def check_chain(chain: list[str]) -> None:
    have: set[str] = set()
    for name in chain:
        cols = STAGES[name]
        missing = [c for c in cols.needs if c not in have]
        if missing:
            raise ValueError(f"plan: stage {name!r} needs columns {missing} that no earlier stage adds")
        have |= set(cols.adds)


def _actor_pool(size: int | tuple[int, int]):
    from ray.data import ActorPoolStrategy

    if isinstance(size, int):
        return ActorPoolStrategy(size=size)
    return ActorPoolStrategy(min_size=size[0], max_size=size[1])


class _ReadDocuments:
    """flat_map fn: one shard path -> document rows (errors become rows too)."""

    def __init__(self, spec: JobSpec, root_uri: str) -> None:
        self.inp, self.root_uri = spec.input, root_uri

    def __call__(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        return [vars(d) for d in read_shard(item["shard"], self.inp, self.root_uri)]


class _ExpandRequests:
    """flat_map fn: one document row -> request rows, minus those already written."""

    def __init__(self, spec: JobSpec, run_id: str, run_date: str, skip: frozenset[str]) -> None:
        self.spec, self.run_id, self.run_date, self.skip = spec, run_id, run_date, skip
        self.fingerprint = generation_fingerprint(spec)

    def __call__(self, doc: dict[str, Any]) -> list[dict[str, Any]]:
        d = Document(**{k: doc[k] for k in ("doc_id", "source_uri", "text", "questions", "answers", "error")})
        reqs = expand_requests(d, self.spec, self.run_id, self.run_date, self.fingerprint)
        return [r for r in reqs if r["request_id"] not in self.skip]


def build_plan(spec: JobSpec, run_id: str, run_date: str, output_root: str, skip: frozenset[str]):
    """Return (dataset of per-row figures, number of shards)."""
    import ray.data

    from stages.generate import GenerateStage
    from stages.read import resolve_uri
    from stages.tokenize import TokenizeStage
    from stages.write import WriteStage

    check_chain(stage_chain(spec))
    shards = list_shards(spec.input, run_date)
    spec_json = spec.model_dump(mode="json")
    res = spec.resources
    root_uri = resolve_uri(spec.input.uri, run_date)
    ds = ray.data.from_items([{"shard": s} for s in shards], override_num_blocks=max(1, min(len(shards), 200)))
    ds = ds.flat_map(_ReadDocuments(spec, root_uri))
    if spec.input.limit:
        ds = ds.limit(spec.input.limit)
    ds = ds.flat_map(_ExpandRequests(spec, run_id, run_date, skip))
    ds = ds.map_batches(
        TokenizeStage,
        fn_constructor_kwargs={"spec": spec_json},
        compute=_actor_pool(res.compress_actors),
        batch_size=16,
        num_cpus=0.5,
        batch_format="numpy",
    )
    if spec.compression.method == "rag":
        from stages.rag import RagStage

        ds = ds.map_batches(
            RagStage,
            fn_constructor_kwargs={"spec": spec_json},
            compute=_actor_pool(res.compress_actors),
            batch_size=16,
            num_cpus=0.5,
            num_gpus=res.compress_num_gpus,
            batch_format="numpy",
        )
    # One block per generate batch: a shard (a big JSONL file) otherwise reaches the
    # generate pool as ONE block, so a single actor would decode the whole file before
    # anything is written: no progress, no use of the other actors, and a crash loses it all.
    ds = ds.repartition(target_num_rows_per_block=res.batch_size)
    ds = ds.map_batches(
        GenerateStage,
        fn_constructor_kwargs={"spec": spec_json},
        compute=_actor_pool(res.actors),
        batch_size=res.batch_size,
        num_cpus=res.num_cpus,
        num_gpus=res.num_gpus,
        batch_format="numpy",
        # Ray Data's actor pools default to max_restarts=-1 and max_task_retries=-1:
        # an actor that dies (OOM, node loss, kill -9) is restarted and its batch
        # retried; write file names are deterministic, so retries add no duplicates.
    )
    ds = ds.map_batches(WriteStage(output_root, run_date, run_id), batch_size=None, batch_format="numpy")
    return ds, len(shards)
