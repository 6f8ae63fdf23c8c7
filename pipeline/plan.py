"""Build the Ray Data plan for a JobSpec (nothing runs until the dataset is consumed).

    shards -> read (tasks) -> [limit] -> requests (tasks, skip finished)
           -> tokenize (+ a runs_at=tokenize method, e.g. truncate)
                                          actor pool, resources.compress_actors
           -> a runs_at=text_stage method (e.g. rag)
                                          actor pool, compress_actors/compress_num_gpus
           -> generate (+ a runs_at=prefill method's strategy, e.g. finch)
                                          actor pool, resources.actors/num_gpus/num_cpus;
                                          several batches in flight per actor, one engine
           -> write Parquet               tasks; returns per-row figures to the driver

What runs where comes from the compression method's declaration (stages/compression/);
the model stages, their batch sizes and resources are declared once (``model_stages``)
and folded by this plan and by the local plan (pipeline/local_plan.py) alike.
Each stage and method declares the columns it needs and adds (schemas/rows.py);
``check_chain`` verifies the chain when the plan is built, so a wiring mistake fails
before any model loads.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

# Neither module imports torch: Ray's task workers import the read side, and the driver
# hands Ray the model stages by name (they are imported inside their actors).
from pipeline.plan_inputs import ExpandRequests, ReadDocuments
from pipeline.stage_actors import GenerateStage, TokenizeStage
from schemas.rows import (
    GENERATE_NEEDS,
    TOKENIZE_ADDS,
    TOKENIZE_NEEDS,
    OutputRow,
    RequestRow,
    columns,
)
from schemas.spec import JobSpec
from stages.compression import method_for


@dataclass(frozen=True)
class StageColumns:
    name: str
    needs: tuple[str, ...]
    adds: tuple[str, ...]


READ = StageColumns("read", (), columns(RequestRow))
TOKENIZE = StageColumns("tokenize", TOKENIZE_NEEDS, TOKENIZE_ADDS)
GENERATE = StageColumns("generate", GENERATE_NEEDS, columns(OutputRow))
WRITE = StageColumns("write", columns(OutputRow), ())


def stage_chain(spec: JobSpec) -> list[StageColumns]:
    """The logical chain of a spec: read, tokenize, its compression method, generate, write.

    The method is a step of its own whatever process runs it (tokenize actor, its own
    pool or the generate actor), so its needs are checked against what precedes it.
    """
    m = method_for(spec.compression)
    method = StageColumns(f"compression {m.name!r} ({m.runs_at})", m.needs, m.adds)
    return [READ, TOKENIZE, method, GENERATE, WRITE]


#: CPUs a read, request-expansion or write task asks of Ray (its default is 1). The actor
#: pools hold their CPUs for the whole run; a task of 1 CPU then never fit beside them on a
#: node of the pools' own size (a 2-CPU node: generate 1 + tokenize 0.5), and the run waited
#: for ever with no word (seen on a `ray start --num-cpus=2` cluster). These tasks parse,
#: hash and write files: a quarter of a CPU each.
IO_TASK_CPUS = 0.25

#: Rows a tokenize or text-stage call takes: small batches keep the pipeline streaming
#: (a batch is tokenized while the generate stage decodes the one before).
TEXT_BATCH = 16


@dataclass(frozen=True)
class ModelStage:
    """One model stage of the plan, declared once (``model_stages``) and folded by both
    runners: the Ray plan (``_build_plan``: an actor pool per stage) and the local plan
    (local_plan.py: one instance per stage, called on this process's threads).

    ``make``: the stage class, made with ``{"spec": spec_json}``; ``batch_size``: rows per
    call; ``actors``: the Ray pool size; ``in_flight``: calls one instance takes at once;
    ``num_cpus``/``num_gpus``/``resources``: what one instance needs (Ray schedules by it;
    pipeline/placement.py ``check_fits`` refuses what no machine offers)."""

    name: str
    make: Any
    batch_size: int
    actors: int | tuple[int, int] = 1
    in_flight: int = 1
    num_cpus: float = 0.5
    num_gpus: float = 0.0
    resources: dict[str, float] = field(default_factory=dict)
    gpu_field: str = "resources.compress_num_gpus"  # the spec field num_gpus comes from

    def needs(self) -> dict[str, float]:
        """What one instance needs of a node, as Ray counts it (CPU, GPU, custom resources)."""
        need = {"CPU": float(self.num_cpus), **{k: float(v) for k, v in self.resources.items()}}
        if self.num_gpus > 0:
            need["GPU"] = float(self.num_gpus)
        return need


def model_stages(spec: JobSpec) -> list[ModelStage]:
    """The model stages of ``spec`` in order: tokenize (+ a runs_at=tokenize method), a
    runs_at=text_stage method's own stage, generate (+ a runs_at=prefill method)."""
    res = spec.resources
    method = method_for(spec.compression)
    stages = [ModelStage("tokenize", TokenizeStage, TEXT_BATCH, res.compress_actors)]
    if method.runs_at == "text_stage":
        stages.append(ModelStage(
            f"compression {method.name!r}", method.stage_class(), TEXT_BATCH, res.compress_actors,
            num_gpus=res.compress_num_gpus if method.uses_compress_gpus else 0.0,
        ))
    # A run's spec holds a number (placement.with_actor_cpus); "auto" here counts as a cluster's 1.
    stages.append(ModelStage(
        "generate", GenerateStage, res.batch_size, res.actors, generate_batches_in_flight(spec),
        num_cpus=res.cpus_per_actor(None, res.max_actors), num_gpus=res.num_gpus,
        resources=dict(res.custom_resources),
        gpu_field="resources.num_gpus",
    ))
    return stages


def check_chain(chain: list[StageColumns]) -> None:
    have: set[str] = set()
    for stage in chain:
        missing = [c for c in stage.needs if c not in have]
        if missing:
            raise ValueError(f"plan: stage {stage.name} needs columns {missing} that no earlier stage adds")
        have |= set(stage.adds)


def spec_problems(spec: JobSpec) -> list[str]:
    """What the plan refuses in a spec before any model loads, as ``field: message`` lines:
    budgets that can never fit the generating model's context (stages/context_budget.py;
    the model's config is read, never its weights). ``validate`` and ``run`` print them."""
    from stages.context_budget import budget_problems

    return budget_problems(spec)


def _actor_pool(size: int | tuple[int, int], in_flight: int = 1):
    """An actor pool of ``size`` (or [min, max]); ``in_flight`` > 1: each actor takes that
    many batches at once, its calls running on threads of their own."""
    from ray.data import ActorPoolStrategy

    sizes = {"size": size} if isinstance(size, int) else {"min_size": size[0], "max_size": size[1]}
    if in_flight <= 1:
        return ActorPoolStrategy(**sizes)
    return ActorPoolStrategy(
        **sizes, max_tasks_in_flight_per_actor=in_flight, max_concurrent_calls_per_actor=in_flight,
        enable_true_multi_threading=True,
    )


#: Rows a generate actor aims to hold (decoding + waiting) when decode_slots is auto:
#: enough to fill the decode batch the KV budget allows (on CPU the prefill of each
#: row is the slow part, so rows wait in the engine's queue rather than in Ray's).
ROWS_IN_FLIGHT = {"cpu": 64, "gpu": 256}


def generate_batches_in_flight(spec: JobSpec) -> int:
    """Ray batches one generate actor holds at once, so its engine never drains between
    batches: enough for the rows it may decode together, plus one batch waiting."""
    res = spec.resources
    if isinstance(res.decode_slots, int):
        rows = res.decode_slots
    else:
        rows = ROWS_IN_FLIGHT["gpu" if res.num_gpus > 0 else "cpu"]
    return max(2, min(64, -(-rows // res.batch_size) + 1))


def build_plan(
    spec: JobSpec,
    run_id: str,
    run_date: str,
    output_root: str,
    skip: frozenset[str],
    shards: list[str],
    engine_board: str | None = None,
):
    """Return (dataset of per-row figures, number of shards).

    ``shards``: the input files as the runner listed them, once, before starting Ray
    (stages.listing.list_shards); the plan reads exactly these and never lists again.
    ``engine_board``: the name of the run's engine board (pipeline/engine_board.py), handed
    to the generate actors, which report their engines there for the progress line.
    """
    with warnings.catch_warnings():
        # Ray 2.60 deprecates **ray_remote_args but names no parameter for actor
        # restarts / task retries, which we must bound (max_restarts, max_task_retries):
        # the warning would greet every run with nothing the user can change.
        warnings.filterwarnings("ignore", message=".*`ray_remote_args` is deprecated.*")
        return _build_plan(spec, run_id, run_date, output_root, skip, shards, engine_board)


def _build_plan(
    spec: JobSpec,
    run_id: str,
    run_date: str,
    output_root: str,
    skip: frozenset[str],
    shards: list[str],
    engine_board: str | None,
):
    import ray.data

    from stages.listing import resolve_uri
    from stages.write import WriteStage

    check_chain(stage_chain(spec))
    spec_json = spec.model_dump(mode="json")
    res = spec.resources
    root_uri = resolve_uri(spec.input.uri, run_date)
    items = [{"shard": s, "index": i} for i, s in enumerate(shards)]
    ds = ray.data.from_items(items, override_num_blocks=max(1, min(len(shards), 200)))
    ds = ds.map_batches(ReadDocuments(spec, root_uri, output_root, run_id, run_date),
                        batch_size=None, batch_format="pyarrow", num_cpus=IO_TASK_CPUS)
    if spec.input.limit:
        ds = ds.limit(spec.input.limit)
    ds = ds.flat_map(ExpandRequests(spec, run_id, run_date, skip), num_cpus=IO_TASK_CPUS)
    for stage in model_stages(spec):
        if stage.name == "generate":
            # One block per generate batch: a shard (a big JSONL file) otherwise reaches the
            # generate pool as ONE block, so a single actor would decode the whole file before
            # anything is written: no progress, no use of the other actors, and a crash loses it all.
            ds = ds.repartition(target_num_rows_per_block=stage.batch_size)
        # Each generate actor takes several batches at once (in_flight: its calls only queue
        # requests for the actor's one engine and wait), so the engine's slots stay full.
        kwargs: dict[str, Any] = {"spec": spec_json}
        if stage.name == "generate" and engine_board:
            kwargs["engine_board"] = engine_board  # consumed by the actor class (stage_actors.py)
        ds = ds.map_batches(
            stage.make,
            fn_constructor_kwargs=kwargs,
            compute=_actor_pool(stage.actors, stage.in_flight),
            batch_size=stage.batch_size,
            num_cpus=stage.num_cpus,
            num_gpus=stage.num_gpus,
            # Pins the actors to the nodes that offer these (labelled GPU pools, a node with
            # the model's local disk); the embedded Ray offers them itself (placement.init_ray).
            resources=stage.resources or None,
            batch_format="numpy",
            # Finite (Ray Data's default is -1: an actor that dies on every batch would be
            # restarted for ever): a dead actor (OOM, node loss, kill -9) is restarted and
            # its batch retried up to resources.max_retries times; after that Ray aborts the
            # run and the runner writes the unfinished requests as retryable error rows.
            # Staged file names are deterministic, so retries add no duplicates.
            max_restarts=res.max_retries,
            max_task_retries=res.max_retries,
        )
    ds = ds.map_batches(WriteStage(output_root, run_date, run_id), batch_size=None, batch_format="numpy",
                        num_cpus=IO_TASK_CPUS)
    return ds, len(shards)
