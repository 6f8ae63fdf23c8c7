"""`longdoc bench job SPEC`: the whole job, longdoc against the script a user would write instead.

What it runs, in ONE invocation, on the same documents and model:
- the longdoc side: the spec end to end exactly as a user runs it, in a fresh process
  (read, tokenize, compression, the decode engine, Parquet write and commit) into an
  output folder of its own under a temporary directory: ``--runner ray`` runs
  ``longdoc run --runner ray``; ``--runner local`` the same stages in one process
  without Ray (pipeline/bench/inprocess.py: `longdoc run --runner local` plus the
  engine's own figures); ``auto`` (default) what `longdoc run` picks on one machine
  (local for one generate actor, Ray for a pool), local where Ray is not installed
  (GPU benchmark machines). ``--variant NAME:k=v;k=v``
  (repeatable) runs several longdoc sides, each the spec with those overrides (e.g.
  compression methods none vs finch vs rag); an override ``env.NAME=value`` sets an
  environment variable of that side's process instead (e.g. ``env.OMP_NUM_THREADS=1``),
  for settings of the machine rather than of the job, and ``runner=ray|local|auto`` that
  side's runner instead of ``--runner`` (``--variant ray:runner=ray --variant
  local:runner=local`` compares the two runners in one run);
- the peer: pipeline/bench/peer.py in a fresh process, the plain-transformers script a
  user would write (same documents, chat template, instruction and truncation where a
  user could do it in a few lines: ``truncate`` -> the same head/tail cut; every other
  method -> the whole document, as a user without longdoc has no Finch or RAG in a few
  lines; batched greedy ``generate`` with left padding, static cache + compile on CUDA;
  Parquet out), at its BEST batch size: every ``--peer-batch-sizes`` candidate is
  timed on the first documents in a probe process of its own, then the timed runs use
  the fastest.

The sides alternate ``--runs`` times (longdoc sides, then peers, then again), so noise on
a shared machine hits all of them; the summary is the median of each figure. Every
side is measured as a whole process (pipeline/bench/job_measure.py) and at its steady
state; figures, ratios and targets are defined in pipeline/bench/job_report.py.
Results: JSON + Markdown under ``--out`` (default jobs/results/bench-job/), named by
device, spec and model, with the command line, git commit, versions and settings.

Refused before anything heavy starts (exit 2, one line naming the option or field and
what is allowed): a missing or invalid spec, a bad ``--set``/``--variant``, ``--runs``
< 1, bad ``--peer-batch-sizes``, ``--synthetic-docs`` without ``--doc-tokens``, a
variant that changes the input, output or model (all sides read the same documents
with the same model), sampling (``generation.temperature`` > 0: the comparison is
greedy), an unknown ``--runner`` or ``--sides``.

``--synthetic-docs N --doc-tokens T`` replaces the spec's input with N documents of
exactly T tokens cut from jobs/corpus (pipeline/bench/job_docs.py), written as a JSONL
corpus in the temporary directory: the GPU night is
``--model random:llama-8b --synthetic-docs 1000 --doc-tokens 8192`` with variants
none / finch-1k / rag-1k (infra/README.md, "GPU night").

This module's import chain needs typer, pyyaml, pyarrow, psutil, pydantic (schemas)
and, when it runs, torch and transformers; never Ray (the longdoc side imports it in
its own process, when the runner is ray).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Optional

import typer

from pipeline.bench.job_report import (
    DEFAULT_OUT,
    finish,
    side_figures,
    summary_lines,
    write_results,
)
from pipeline.choices import RUNNERS, Runner

ROOT = Path(__file__).resolve().parents[2]
PEER_SCRIPT = Path(__file__).resolve().with_name("peer.py")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ENV_PREFIX = "env."
RUNNER_KEY = "runner"  # a variant's own runner (``runner=local``), not a spec field
#: Spec fields a variant may not change: every side reads the same documents with the same model.
FIXED_FIELDS = ("input", "output", "generation.model")
SIDES = ("longdoc", "peer")
Opt = Optional  # noqa: UP045 - typer needs Optional


@dataclass(frozen=True)
class Variant:
    """One longdoc side: a name and the overrides that make it (``env.NAME=value`` ones set
    its process's environment, ``runner=...`` its runner, the others its spec)."""

    name: str
    overrides: tuple[str, ...] = ()

    @property
    def spec_overrides(self) -> tuple[str, ...]:
        """The overrides of this side's spec (dotted.key=value), in their order."""
        return tuple(o for o in self.overrides if not o.startswith(ENV_PREFIX) and _key(o) != RUNNER_KEY)

    @property
    def runner(self) -> str | None:
        """This side's own runner (``runner=...``), None: the bench's ``--runner``."""
        return next((o.split("=", 1)[1].strip() for o in self.overrides if _key(o) == RUNNER_KEY), None)

    @property
    def env(self) -> dict[str, str]:
        """The environment variables this side's process gets on top of the bench's."""
        pairs = (o.removeprefix(ENV_PREFIX).split("=", 1) for o in self.overrides if o.startswith(ENV_PREFIX))
        return {k.strip(): v.strip() for k, v in pairs}


def _key(override: str) -> str:
    return override.split("=", 1)[0].strip()


@dataclass
class JobBenchSettings:
    spec: str
    overrides: tuple[str, ...] = ()
    variants: tuple[Variant, ...] = (Variant("longdoc"),)
    docs: int | None = None
    peer_batch_sizes: tuple[int, ...] = (1, 4, 8, 16)
    probe_docs: int | None = None
    runs: int = 2
    out: str = DEFAULT_OUT
    model: str | None = None
    synthetic_docs: int | None = None
    doc_tokens: int | None = None
    synthetic_source: str = "jobs/corpus"
    usd_per_device_hour: float | None = None
    runner: str = "auto"
    sides: tuple[str, ...] = SIDES
    merge: bool = False
    keep_temp: bool = False
    date: str = field(default_factory=lambda: datetime.now(timezone.utc).date().isoformat())
    command: str = ""


# ----------------------------------------------------------------------------- options
def parse_sizes(text: str) -> tuple[int, ...]:
    """'1,4,8' -> (1, 4, 8); ValueError naming the option and what is allowed."""
    try:
        sizes = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        sizes = ()
    if not sizes or any(b < 1 for b in sizes) or len(set(sizes)) != len(sizes):
        raise ValueError(f"--peer-batch-sizes {text!r}: allowed: distinct comma-separated integers >= 1, e.g. 1,4,8,16")
    return sizes


def parse_variant(text: str) -> Variant:
    """'finch-1k: compression.method=finch; compression.target_tokens=1024' -> Variant."""
    name, sep, rest = text.partition(":")
    name = name.strip()
    if not sep or not NAME_RE.match(name):
        raise ValueError(f"--variant {text!r}: allowed: NAME:key=value;key=value with NAME of letters, digits, "
                         "'.', '_', '-' (e.g. 'finch-1k:compression.method=finch;compression.target_tokens=1024')")
    overrides = tuple(x.strip() for x in rest.split(";") if x.strip())
    for o in overrides:
        key = o.split("=", 1)[0].strip()
        if "=" not in o:
            raise ValueError(f"--variant {name}: {o!r} must look like dotted.key=value")
        if key.startswith(ENV_PREFIX):
            if not ENV_RE.match(key.removeprefix(ENV_PREFIX)):
                raise ValueError(f"--variant {name}: {key!r}: allowed: env.NAME=value with NAME of letters, "
                                 "digits and '_' not starting with a digit (e.g. env.OMP_NUM_THREADS=1)")
            continue
        if key == RUNNER_KEY:
            if o.split("=", 1)[1].strip() not in RUNNERS:
                raise ValueError(f"--variant {name}: {o!r}: allowed: runner={'|'.join(RUNNERS)}")
            continue
        if any(key == f or key.startswith(f + ".") for f in FIXED_FIELDS):
            raise ValueError(f"--variant {name}: {key!r} cannot differ between sides (every side reads the same "
                             f"documents with the same model); set it for all with --set or --model; "
                             f"allowed: any field but {', '.join(FIXED_FIELDS)}")
    return Variant(name, overrides)


def check_settings(s: JobBenchSettings):
    """Validate every option and the spec of every side, in seconds; returns the first side's spec."""
    from schemas.loading import SpecError, load_spec, spec_from_dict

    if s.runs < 1:
        raise ValueError(f"--runs {s.runs}: allowed: an integer >= 1")
    if s.docs is not None and s.docs < 1:
        raise ValueError(f"--docs {s.docs}: allowed: an integer >= 1")
    if s.probe_docs is not None and s.probe_docs < 1:
        raise ValueError(f"--probe-docs {s.probe_docs}: allowed: an integer >= 1")
    if (s.synthetic_docs is None) != (s.doc_tokens is None):
        raise ValueError("--synthetic-docs and --doc-tokens go together: N documents of exactly T tokens")
    if s.synthetic_docs is not None and (s.synthetic_docs < 1 or s.doc_tokens < 16):
        raise ValueError(f"--synthetic-docs {s.synthetic_docs} --doc-tokens {s.doc_tokens}: allowed: N >= 1, T >= 16")
    if s.runner not in RUNNERS:
        raise ValueError(f"--runner {s.runner!r}: allowed: {', '.join(RUNNERS)}")
    if not s.sides or any(x not in SIDES for x in s.sides):
        raise ValueError(f"--sides {','.join(s.sides)!r}: allowed: a comma list of {', '.join(SIDES)}")
    if s.usd_per_device_hour is not None and s.usd_per_device_hour < 0:
        raise ValueError(f"--usd-per-device-hour {s.usd_per_device_hour}: allowed: >= 0")
    names = [v.name for v in s.variants]
    if len(set(names)) != len(names) or any(n.startswith("peer") for n in names):
        raise ValueError(f"--variant names {names}: allowed: distinct names not starting with 'peer'")
    if "ray" in {s.runner, *(v.runner for v in s.variants)} and importlib.util.find_spec("ray") is None:
        raise ValueError("--runner ray: Ray is not installed here; use --runner local (or auto)")
    try:
        base = load_spec(s.spec, list(s.overrides) + ([f"generation.model={s.model}"] if s.model else []))
        specs = [spec_from_dict(_apply(base.model_dump(mode="json"), v.spec_overrides), source=f"{s.spec} --variant {v.name}")
                 for v in s.variants]
    except SpecError as e:
        raise ValueError(str(e)) from None
    from schemas.loading import check_environment

    problems = check_environment(specs[0], run_date=s.date, local_paths=True)
    if s.synthetic_docs:  # the input is replaced: only the model and other paths matter
        problems = [x for x in problems if not x.startswith("input.")]
    if problems:
        raise ValueError(f"job spec {s.spec} cannot run here: " + "; ".join(problems))
    for v, spec in zip(s.variants, specs, strict=True):
        if spec.generation.temperature > 0:
            raise ValueError(f"{v.name}: generation.temperature {spec.generation.temperature}: the bench compares "
                             "greedy decoding; allowed: 0")
        if spec.generation.stop:
            raise ValueError(f"{v.name}: generation.stop {list(spec.generation.stop)}: the peer stops at EOS only; "
                             "allowed: no stop strings")
    return specs


def _apply(data: dict, overrides: tuple[str, ...]) -> dict:
    from schemas.loading import apply_overrides

    return apply_overrides(data, list(overrides))


# ----------------------------------------------------------------------------- inputs
def _absolute_uri(uri: str) -> str:
    """A local input path made absolute (the sides run with another working directory)."""
    if "://" in uri:
        return uri
    return str(Path(uri).expanduser().resolve())


@dataclass
class Prepared:
    """What every run of every side reads: the side specs (as dicts), requests, model args."""

    tmp: Path
    specs: dict[str, dict]  # side name -> spec data (output.uri set per run)
    methods: dict[str, str]
    same_context: dict[str, bool]  # side name -> the peer reads the very context its method keeps
    speculative: dict[str, str]
    peer_of: dict[str, str | None]
    peers: dict[str, dict]  # peer name -> {truncate, keep, requests, what}
    device_type: str  # data: the peer's --device argument, the results' device record
    device_name: str
    dtype: str
    peer_model_args: list[str]
    requests: int
    bad_docs: int
    docs_label: str
    threads: int
    spec_name: str
    max_new_tokens: int
    on_host: bool  # the host's CPU runs it (step backend's runs_on_host): threads matter, files say "cpu"


def prepare(s: JobBenchSettings, specs, tmp: Path) -> Prepared:
    """Synthetic corpus (if asked), absolute input, the peer's requests and model arguments."""

    from pipeline.bench.job_docs import spec_requests, write_requests, write_synthetic_corpus
    from schemas.loading import spec_from_dict
    from stages.decoding.backends import device_backend
    from stages.model_loading import load_tokenizer, pick_device

    first = specs[0]
    inp = dict(first.input.model_dump(mode="json"))
    if s.synthetic_docs:
        tok = load_tokenizer(first.generation.model)
        path = write_synthetic_corpus(tok, s.synthetic_docs, s.doc_tokens, tmp / "synthetic.jsonl", s.synthetic_source)
        inp.update(uri=str(path), format="jsonl", id_field="id", text_field="text", question_field=None,
                   answer_field=None, limit=None)
        docs_label = f"{s.synthetic_docs} synthetic documents of {s.doc_tokens} tokens"
    else:
        inp["uri"] = _absolute_uri(inp["uri"])
        docs_label = f"documents of {first.input.uri}"
    if s.docs is not None:
        inp["limit"] = s.docs
    datas, out_specs = {}, []
    for v, spec in zip(s.variants, specs, strict=True):
        data = spec.model_dump(mode="json")
        data["input"] = inp
        data["output"] = {"uri": str(tmp / v.name / "out")}  # replaced per run
        out_specs.append(spec_from_dict(data, source=f"{s.spec} --variant {v.name}"))
        datas[v.name] = data
    gpus = max(sp.resources.num_gpus for sp in out_specs)
    device = pick_device(gpus)  # the generate actor's choice (stages/model_loading.py)
    records, bad = spec_requests(out_specs[0], s.date)
    if not records:
        raise ValueError(f"{s.spec}: the input has no readable documents ({bad} failed to read)")
    docs_label = f"{len(records)} requests ({docs_label})"
    # One peer per distinct context: truncate -> the same cut; any other method -> the whole document.
    peers: dict[str, dict] = {}
    peer_of: dict[str, str | None] = {}
    methods, same_context, speculative, keys = {}, {}, {}, {}
    for v, sp in zip(s.variants, out_specs, strict=True):
        c = sp.compression
        methods[v.name] = c.method
        speculative[v.name] = sp.generation.speculative.method
        keys[v.name], same_context[v.name] = _peer_context(c)
    distinct = list(dict.fromkeys(keys.values()))
    for key in distinct:
        name = "peer" if len(distinct) == 1 else ("peer-full" if key == ("full",) else f"peer-truncate-{key[1]}-{key[2]}")
        what = "transformers generate, whole document" if key == ("full",) else \
            f"transformers generate, document cut to {key[1]} tokens ({key[2]})"
        peers[name] = {"key": key, "truncate": key[1] if key[0] == "truncate" else 0,
                       "keep": key[2] if key[0] == "truncate" else "head_tail", "what": what}
    for v in s.variants:  # named even when the peer does not run here (--merge joins an earlier one)
        peer_of[v.name] = next(n for n, p in peers.items() if p["key"] == keys[v.name])
    write_requests(records, tmp / "requests.jsonl")
    model_args, dtype = _peer_model(first.generation.model, first.generation.dtype, device, tmp)
    return Prepared(
        tmp=tmp, specs=datas, methods=methods, same_context=same_context, speculative=speculative, peer_of=peer_of, peers=peers, device_type=device.type,
        device_name=_device_name(device), dtype=dtype, peer_model_args=model_args, requests=len(records),
        bad_docs=bad, docs_label=docs_label, threads=max(1, int(first.resources.num_cpus)),
        spec_name=first.name, max_new_tokens=first.generation.max_new_tokens,
        on_host=device_backend(device).runs_on_host(device),
    )


def _device_name(device) -> str:
    from pipeline.bench.roofline import device_name

    return device_name(device)


def _peer_model(name: str, dtype: str, device, tmp: Path) -> tuple[list[str], str]:
    """The peer's model options (a directory, or a random config + the tokenizer) and its dtype."""
    from transformers import AutoConfig

    from schemas.spec import EMBEDDED_MODEL
    from stages.decoding.backends import device_backend
    from stages.model_loading import embedded_model_dir, resolve_dtype

    if name.startswith("random:"):
        from stages.model_loading import load_tokenizer
        from stages.random_models import random_config

        tok = load_tokenizer(name)  # random:<shape> models share the embedded tokenizer
        cfg = random_config(name, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        cfg.save_pretrained(tmp / "random-config")
        tok.save_pretrained(tmp / "tokenizer")
        torch_dtype = resolve_dtype(dtype, device, cfg)
        args = ["--random-config", str(tmp / "random-config"), "--tokenizer", str(tmp / "tokenizer"), "--seed", "0"]
    else:
        path = str(embedded_model_dir()) if name == EMBEDDED_MODEL else name
        by_size = dtype == "auto" and device_backend(device).auto_dtype_by_size  # as load_causal_lm
        cfg = AutoConfig.from_pretrained(path) if by_size else None
        torch_dtype = resolve_dtype(dtype, device, cfg)
        args = ["--model", path]
    return args, str(torch_dtype).removeprefix("torch.")


# ----------------------------------------------------------------------------- sides
def _env() -> dict[str, str]:
    """The sides' environment: this one, minus RAY_ADDRESS (the bench measures THIS machine,
    with the embedded Ray `longdoc run` starts), plus a progress line per batch."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return {**env, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false",
            "LONGDOC_PROGRESS_INTERVAL_S": "0.001",  # a progress line per batch: it dates the rows
            "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}


def _longdoc_argv() -> list[str]:
    exe = Path(sys.executable).with_name("longdoc")
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "pipeline.cli"]


def _use_ray(s: JobBenchSettings, name: str, spec: dict) -> bool:
    """Side ``name`` runs `longdoc run --runner ray` (True) or the in-process runner.

    Its runner is its variant's ``runner=`` else ``--runner``; ``auto`` follows `longdoc
    run`'s own choice on this one machine (pipeline/runner.py ``resolve_runner``: in one
    process for one generate actor, Ray for a pool), and the in-process runner where Ray
    is not installed (GPU benchmark machines).
    """
    from pipeline.runner import auto_runner

    runner = next((v.runner for v in s.variants if v.name == name and v.runner), s.runner)
    if runner != "auto":
        return runner == "ray"
    return auto_runner(spec["resources"]["actors"], None) == "ray" and importlib.util.find_spec("ray") is not None


def _runner_name(s: JobBenchSettings, name: str, spec: dict) -> str:
    return "ray" if _use_ray(s, name, spec) else "inprocess"


def _engines(s: JobBenchSettings, name: str, spec: dict) -> int:
    """Generate engines a side runs at once: its pool's largest size under Ray; the
    in-process runner runs one whatever ``resources.actors`` says (pipeline/bench/inprocess.py)."""
    actors = spec["resources"]["actors"]
    return (actors if isinstance(actors, int) else max(actors)) if _use_ray(s, name, spec) else 1


class StagingWatch:
    """Dates longdoc's output blocks while it runs: each staged file's mtime and request ids."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.files: dict[str, tuple[float, list[str]]] = {}

    def __call__(self, _now: float) -> None:
        import pyarrow.parquet as pq

        if not self.folder.is_dir():
            return
        for p in self.folder.glob("part-*.staged"):
            if p.name in self.files:
                continue
            try:
                mtime = p.stat().st_mtime
                ids = pq.read_table(p, columns=["request_id"]).column("request_id").to_pylist()
            except (OSError, ValueError):  # committed (moved away) or still appearing: next tick
                continue
            self.files[p.name] = (mtime, ids)


def _read_rows(out_root: Path, date: str) -> list[dict]:
    import pyarrow.dataset as ds

    part = out_root / f"run_date={date}"
    if not part.is_dir():
        return []
    cols = ["request_id", "doc_id", "prompt", "output_text", "output_tokens", "prompt_tokens", "context_tokens", "e2e_s",
            "error", "prefill_s", "decode_s", "ttft_s", "compress_s", "draft_tokens", "accepted_tokens",
            "decode_steps"]
    return ds.dataset(str(part), format="parquet").to_table(columns=cols).to_pylist()


def _row_totals(rows: list[dict]) -> dict:
    ok = [r for r in rows if r["error"] is None]

    def total(k: str) -> float:
        return float(sum(r[k] or 0 for r in ok))

    drafted = total("draft_tokens")
    return {"rows_prefill_s": total("prefill_s"), "rows_decode_s": total("decode_s"),
            "rows_compress_s": total("compress_s"), "mean_ttft_s": total("ttft_s") / len(ok) if ok else None,
            "output_tokens": int(total("output_tokens")), "mean_context_tokens": total("context_tokens") / len(ok)
            if ok else None, "acceptance": total("accepted_tokens") / drafted if drafted else None,
            # rows written before schema version 5 lack the prefix cache's column
            "cached_prompt_tokens": int(sum(r.get("cached_prompt_tokens") or 0 for r in ok))}


def run_longdoc(s: JobBenchSettings, p: Prepared, variant: str, k: int, usd: float) -> tuple[dict, list[dict]]:
    """One run of a longdoc side: (figures, rows)."""
    import yaml

    from pipeline.bench.job_measure import run_measured
    from stages.layout import staging_dir

    side_dir = p.tmp / variant / f"run-{k}"
    side_dir.mkdir(parents=True, exist_ok=True)
    data = json.loads(json.dumps(p.specs[variant]))
    data["output"] = {"uri": str(side_dir / "out")}
    spec_path = side_dir / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(data, sort_keys=False))
    run_id = f"bench-{variant}-{k}"
    ray = _use_ray(s, variant, data)
    timeline_path = side_dir / "timeline.json"
    if ray:
        argv = [*_longdoc_argv(), "run", str(spec_path), "--date", s.date, "--run-id", run_id,
                "--max-failed-fraction", "1", "--runner", "ray"]
    else:
        argv = [sys.executable, "-m", "pipeline.bench.inprocess", str(spec_path), "--date", s.date,
                "--run-id", run_id, "--timeline", str(timeline_path)]
    watch = StagingWatch(Path(staging_dir(str(side_dir / "out"), s.date)) / run_id)
    load = os.getloadavg()[0]
    env = {**_env(), **next(v.env for v in s.variants if v.name == variant)}
    m = run_measured(argv, env, ROOT, side_dir / "log.txt", on_tick=watch if ray else None)
    if m.returncode != 0:
        raise RuntimeError(f"longdoc side {variant} (run {k}) exited {m.returncode}; log {side_dir / 'log.txt'}:\n"
                           f"{m.tail()}")
    rows = _read_rows(side_dir / "out", s.date)
    ok = [r for r in rows if r["error"] is None]
    where: dict = {}
    if ray:
        steady, where = _ray_steady(m, watch, rows)
    else:
        tl = json.loads(timeline_path.read_text())
        if "engine" not in tl:  # the run aborted before its engine started: say why, not KeyError
            errors = sorted({r["error"] for r in rows if r["error"]})
            raise RuntimeError(f"longdoc side {variant} (run {k}) aborted before its engine ran: "
                               f"{errors[:1] or 'no rows'}; log {side_dir / 'log.txt'}")
        steady = tl["t_last_written"] - tl["t_first_start"] if tl.get("t_first_start") else None
        eng = tl["engine"]
        before = {"interpreter_s": tl["t_start"] - m.t_start}  # the process's start, up to the first row
        if "t_imported" in tl:  # timelines written before 2026-11-27 lack these stamps
            before.update(imports_s=tl["t_imported"] - tl["t_start"], read_s=tl["read_s"],
                          tokenize_init_s=tl["tokenize_init_s"], text_stage_init_s=tl.get("text_stage_init_s", 0.0))
        where = {**before, "generate_init_s (model load + warm-up)": tl["generate_init_s"],
                 "first_row_start_s": tl["t_first_start"] - m.t_start if tl.get("t_first_start") else None,
                 "first_submit_s": tl["t_first_submit"] - m.t_start if tl.get("t_first_submit") else None,
                 "tokenize_s": tl["tokenize_s"], "text_stage_s": tl["text_stage_s"],
                 "engine_prefill_s": eng["prefill_s"], "engine_step_s": eng["step_s"], "engine_stall_s": eng["stall_s"],
                 "engine_steps": eng["steps"], "engine_max_active": eng["max_active"],
                 "engine_relayouts": eng["relayouts"], "engine": eng["describe"],
                 "last_written_s": tl["t_last_written"] - m.t_start}
    where.update({"exit_s": m.wall_s, **_row_totals(rows)})
    fig = side_figures(len(ok), len(rows) - len(ok), m.wall_s, steady, [r["e2e_s"] for r in ok], usd,
                       {"rss": m.peak_rss_bytes, "pss": m.peak_pss_bytes, "gpu": m.peak_gpu_bytes})
    fig.update(run=k, load_avg=round(load, 2), processes=m.peak_processes, strays=m.strays, where=where,
               rows=len(rows), runner="ray" if ray else "inprocess",
               first_error=next((r["error"] for r in rows if r["error"] is not None), None))
    return fig, rows


def _ray_steady(m, watch: StagingWatch, rows: list[dict]) -> tuple[float | None, dict]:
    """Steady state of a `longdoc run`: the earliest row start to the last block written."""
    e2e = {r["request_id"]: r["e2e_s"] for r in rows if r["e2e_s"] is not None}
    progress = [(t, int(mo.group(1))) for t, line in m.lines if (mo := re.match(r"\s*rows (\d+)", line))]
    ray_up = next((t for t, line in m.lines if line.startswith("longdoc: run ")), None)
    starts = [mt - max((e2e.get(i, 0.0) for i in ids), default=0.0) for mt, ids in watch.files.values()]
    ends = [mt for mt, _ in watch.files.values()]
    if progress:
        ends.append(max(t for t, n in progress if n == max(n for _, n in progress)))
    if not ends:
        return None, {}
    last = max(ends)
    first = min(starts) if starts else last - max(e2e.values(), default=0.0)
    where = {"ray_up_and_plan_s": ray_up - m.t_start if ray_up else None,
             "first_row_start_s": first - m.t_start,
             "first_block_written_s": min(mt for mt, _ in watch.files.values()) - m.t_start if watch.files else None,
             "last_written_s": last - m.t_start, "blocks_dated": len(watch.files)}
    return last - first, where


def run_peer(s: JobBenchSettings, p: Prepared, peer: str, k: int, batch: int, usd: float) -> tuple[dict, list[dict]]:
    """One timed run of a peer at ``batch``: (figures, rows)."""
    import pyarrow.parquet as pq

    from pipeline.bench.job_measure import run_measured

    d = p.tmp / peer / f"run-{k}"
    d.mkdir(parents=True, exist_ok=True)
    argv = _peer_argv(p, peer) + ["--batch-size", str(batch), "--out", str(d / "out.parquet"),
                                  "--timing", str(d / "timing.json")]
    load = os.getloadavg()[0]
    m = run_measured(argv, _env(), ROOT, d / "log.txt")
    if m.returncode != 0:
        raise RuntimeError(f"peer {peer} (run {k}) exited {m.returncode}; log {d / 'log.txt'}:\n{m.tail()}")
    t = json.loads((d / "timing.json").read_text())
    rows = pq.read_table(d / "out.parquet").to_pylist()
    gpu = t.get("peak_gpu_bytes") if m.peak_gpu_bytes is None else m.peak_gpu_bytes
    fig = side_figures(len(rows), 0, m.wall_s, t["t_written"] - t["t_first_batch"], [r["latency_s"] for r in rows],
                       usd, {"rss": m.peak_rss_bytes, "pss": m.peak_pss_bytes, "gpu": gpu})
    where = {"startup_s (interpreter)": t["t_start"] - m.t_start, "model_load_s": t["t_loaded"] - t["t_start"],
             "warm_up_s": t["warm_up_s"], "first_batch_start_s": t["t_first_batch"] - m.t_start,
             "generate_s": sum(b["seconds"] for b in t["batches"]), "batches": len(t["batches"]),
             "last_written_s": t["t_written"] - m.t_start, "exit_s": m.wall_s, "batch_size": batch,
             "static_compile": t["static_compile"], "threads": t["threads"]}
    fig.update(run=k, load_avg=round(load, 2), processes=m.peak_processes, strays=m.strays, where=where,
               rows=len(rows))
    return fig, rows


def _peer_context(c) -> tuple[tuple, bool]:
    """(the peer's context key, whether the peer reads the very context the method keeps).

    A method that cuts at tokenize time (no model) -> the same head/tail cut of
    ``target_tokens`` (key ("truncate", target, keep)); any other -> the whole document
    (key ("full",)), the same context only for the method whose prefill is the plain
    full prefill (it keeps the whole document)."""
    from stages.compression import method_for
    from stages.compression.base import CompressionMethod

    method = method_for(c)
    if method.runs_at == "tokenize":
        return ("truncate", c.target_tokens, getattr(c, "keep", "head_tail")), True
    whole = method.runs_at == "prefill" and type(method).load is CompressionMethod.load
    return ("full",), whole


def _peer_argv(p: Prepared, peer: str) -> list[str]:
    cfg = p.peers[peer]
    argv = [sys.executable, str(PEER_SCRIPT), "--requests", str(p.tmp / "requests.jsonl"), *p.peer_model_args,
            "--dtype", p.dtype, "--device", p.device_type, "--max-new-tokens", str(p.max_new_tokens)]
    if p.on_host:
        argv += ["--threads", str(p.threads)]  # what the generate actor uses (resources.num_cpus)
    if cfg["truncate"]:
        argv += ["--truncate-tokens", str(cfg["truncate"]), "--keep", cfg["keep"]]
    return argv


def probe_peer(s: JobBenchSettings, p: Prepared, peer: str) -> dict:
    """Every candidate batch size timed on the first documents (its own process)."""
    from pipeline.bench.job_measure import run_measured

    sizes = s.peer_batch_sizes
    if len(sizes) == 1:
        return {"candidates": [], "best": sizes[0], "note": "one candidate: not probed"}
    d = p.tmp / peer / "probe"
    d.mkdir(parents=True, exist_ok=True)
    n = min(p.requests, s.probe_docs or max(sizes))
    argv = _peer_argv(p, peer) + ["--probe", ",".join(map(str, sizes)), "--probe-docs", str(n),
                                  "--timing", str(d / "timing.json")]
    m = run_measured(argv, _env(), ROOT, d / "log.txt")
    if m.returncode != 0:
        raise RuntimeError(f"peer probe {peer} exited {m.returncode}; log {d / 'log.txt'}:\n{m.tail()}")
    t = json.loads((d / "timing.json").read_text())
    if t["best"] is None:
        raise RuntimeError(f"peer probe {peer}: no candidate batch size ran: {t['candidates']}")
    return {"candidates": t["candidates"], "best": t["best"], "probe_wall_s": m.wall_s, "probe_docs": n}


def agreement(p: Prepared, variant: str, rows: list[dict], peer_rows: list[dict] | None) -> dict:
    """Rows with the peer's output text, where both read the same context."""
    peer = p.peer_of.get(variant)
    if peer is None or peer_rows is None:
        return {"peer": peer, "reason": "no peer run"}
    method = p.methods[variant]
    if not p.same_context[variant]:
        return {"peer": peer, "reason": f"{method} reads another context than the peer (the whole document)"}
    theirs = {r["request_id"]: r for r in peer_rows}
    pairs = [(r, theirs[r["request_id"]]) for r in rows if r["error"] is None and r["request_id"] in theirs]
    # A stop rule the peer lacks (generation.repeat_guard, stop strings) ends a longdoc
    # row early: its text is then the start of the peer's, which is agreement up to that
    # stop ("prefix"), not a different decoding ("differs").
    verdicts = ["equal" if a["output_text"] == b["output_text"] else "prefix" if _cut_short(a, b) else "differs"
                for a, b in pairs]
    return {"peer": peer, "dtype": p.dtype, "compared": len(pairs),
            "text_equal": verdicts.count("equal"),
            "text_prefix": verdicts.count("prefix"),
            "prompt_tokens_equal": sum(a["prompt_tokens"] == b["prompt_tokens"] for a, b in pairs),
            "differs": [a["doc_id"] for v, (a, _) in zip(verdicts, pairs, strict=True) if v == "differs"][:20]}


def side_agreement(first: list[dict], other: list[dict]) -> dict:
    """Rows of another longdoc side with the first side's output text (same request ids):
    variants that must not change answers (a scheduling switch) are checked here."""
    def key(r: dict) -> tuple:  # request ids differ when the settings do: match the request itself
        return (r["doc_id"], r["prompt"])  # the prompt holds the question: a document's rows apart

    theirs = {key(r): r for r in first}
    pairs = [(r, theirs[key(r)]) for r in other if r["error"] is None and key(r) in theirs]
    return {"compared": len(pairs), "text_equal": sum(a["output_text"] == b["output_text"] for a, b in pairs),
            "differs": [a["doc_id"] for a, b in pairs if a["output_text"] != b["output_text"]][:20]}


def _cut_short(ours: dict, peer: dict) -> bool:
    """Our row stopped earlier than the peer's and its text is where the peer's begins."""
    a, b = ours["output_text"] or "", peer["output_text"] or ""
    return bool(a.strip()) and ours["output_tokens"] < peer["output_tokens"] and b.startswith(a.rstrip())


# ----------------------------------------------------------------------------- the bench
@functools.cache
def _git() -> dict:
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
            return out.stdout.strip() if out.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            return None

    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {"longdoc_commit": git("rev-parse", "HEAD"), "dirty": bool(dirty) if dirty is not None else None}


def _versions() -> dict:
    from pipeline.report.summary import package_versions

    v = package_versions()
    return {**v, "psutil": _version("psutil")}


def _version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _notes(s: JobBenchSettings, p: Prepared) -> list[str]:
    notes = [
        "wall = the side's whole process, start to exit (interpreter, imports, Ray start, model load, warm-up, "
        "every document, Parquet write); steady = first document started to last written.",
        "longdoc steady state (ray runner): the earliest row start (a staged block's write time minus its rows' "
        "e2e_s, blocks dated while the run goes) to the last block written (the last progress line); "
        "inprocess runner: its own stamps (first batch's tokenization began, last batch staged).",
        "peer: pipeline/bench/peer.py (imports only torch, transformers, pyarrow): the chat template around "
        "'Document:\\n<text>\\n\\n<instruction>', the same prompt token ids as longdoc's; truncate -> the same "
        "head/tail cut; any other method -> the whole document; batched greedy generate, left padding, rows stop "
        "at EOS; static cache + compile on CUDA (one warm-up call, outside its steady state, inside its wall time); "
        "per-document latency = its batch's generate time.",
        "The peer's batch size is the fastest candidate of a probe on the first documents (own process, not "
        "counted in any timed run).",
        "peak RSS sums the process tree (shared pages once per process: Ray's object store counts several "
        "times); PSS divides shared pages among processes.",
        f"Runs alternate: every longdoc side, then every peer, {s.runs} time(s); the tables give medians.",
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')} in the bench's environment; the peer on CPU "
        f"uses {p.threads} torch thread(s), the generate actor resources.num_cpus.",
    ]
    if p.bad_docs:
        notes.append(f"{p.bad_docs} document(s) failed to read: longdoc writes them as error rows, the peer skips them.")
    if s.synthetic_docs:
        notes.append(f"Synthetic documents: windows of {s.synthetic_source} of exactly {s.doc_tokens} tokens "
                     "(decoded and re-encoded until exact); windows overlap when the corpus is smaller than "
                     "documents x tokens.")
    return notes


def _stop_on_sigterm():
    """SIGTERM (e.g. ``timeout``) unwinds like Ctrl-C, so a running side is stopped with its
    tree; returns a function that puts the previous handler back."""
    import signal
    import threading

    def stop(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.signal(signal.SIGTERM, stop)
    return lambda: signal.signal(signal.SIGTERM, previous)


def _result(s: JobBenchSettings, p: Prepared, probes: dict[str, dict], runs_by_side: dict[str, list[dict]],
            last_rows: dict[str, list[dict]], load_start: tuple[float, ...], created: str, model: str, usd: float,
            partial: bool) -> dict:
    """The result record of the runs so far (``partial``: some sides or runs not yet measured)."""
    from pipeline.bench.job_report import LAYOUT_VERSION, medians

    longdoc_sides = [n for n in runs_by_side if n in p.methods]
    run_peers = [n for n in runs_by_side if n in p.peers]
    sides = {name: {"kind": "longdoc", "what": f"longdoc ({_runner_name(s, name, p.specs[name])}), "
                    f"compression {p.methods[name]}, speculation {p.speculative[name]}",
                    "method": p.methods[name], "speculative": p.speculative[name], "peer": p.peer_of[name],
                    "overrides": list(next(v.overrides for v in s.variants if v.name == name)),
                    "engines": _engines(s, name, p.specs[name])}
             for name in longdoc_sides}
    sides.update({peer: {"kind": "peer", "what": p.peers[peer]["what"], "batch_size": probes[peer]["best"]}
                  for peer in run_peers})
    return {
        "bench": "job", "layout_version": LAYOUT_VERSION, "command": s.command, "created_utc": created,
        **({"partial": "cut short: these sides (and runs) only"} if partial else {}),
        "versions": {**_git(), **_versions()},
        "device": {"type": p.device_type, "name": p.device_name,
                   "file_name": "cpu" if p.on_host else p.device_name},
        "host": {"cpus": os.cpu_count(), "load_avg_start": [round(x, 2) for x in load_start],
                 "load_avg_end": [round(x, 2) for x in os.getloadavg()]},
        "settings": {"spec": s.spec, "spec_name": p.spec_name, "set": list(s.overrides),
                     "variants": {v.name: list(v.overrides) for v in s.variants}, "model": model,
                     "dtype": p.dtype, "docs": p.requests, "docs_label": p.docs_label,
                     "max_new_tokens": p.max_new_tokens, "runs": s.runs,
                     "runner": ",".join(sorted({_runner_name(s, n, p.specs[n]) for n in longdoc_sides})) or "-",
                     "peer_batch_sizes": list(s.peer_batch_sizes), "probe_docs": s.probe_docs,
                     "synthetic_docs": s.synthetic_docs, "doc_tokens": s.doc_tokens, "usd_per_device_hour": usd,
                     "date": s.date, "sides": list(s.sides), "peer_threads": p.threads},
        "sides": sides,
        "peer_probe": probes,
        "runs_by_side": runs_by_side,
        "summary": {side: medians(runs) for side, runs in runs_by_side.items()},
        "agreement": {name: agreement(p, name, last_rows[name], last_rows.get(p.peer_of[name] or ""))
                      for name in longdoc_sides if p.peer_of.get(name) in run_peers},
        "agreement_sides": {name: side_agreement(last_rows[longdoc_sides[0]], last_rows[name])
                            for name in longdoc_sides[1:] if name in last_rows and longdoc_sides[0] in last_rows},
        "notes": _notes(s, p),
    }


def run_bench(s: JobBenchSettings, echo=print) -> tuple[dict, Path, Path]:
    """Run the bench (see the module docstring); returns (result, JSON path, Markdown path)."""
    specs = check_settings(s)
    restore = _stop_on_sigterm()
    tmp = Path(tempfile.mkdtemp(prefix="longdoc-bench-job-"))
    ok = False
    try:
        load_start = os.getloadavg()
        _git()  # the commit measured is the one at the start (the tree may move during a long bench)
        p = prepare(s, specs, tmp)
        first_spec = specs[0]
        usd = s.usd_per_device_hour if s.usd_per_device_hour is not None else first_spec.cost.usd_per_device_hour
        echo(f"# bench job: {p.docs_label}; device {p.device_name}; dtype {p.dtype}; temp {tmp}")
        probes: dict[str, dict] = {}
        run_peers = list(p.peers) if "peer" in s.sides else []
        for peer in run_peers:
            probes[peer] = probe_peer(s, p, peer)
            for c in probes[peer]["candidates"]:
                echo(f"# {peer} probe: batch {c['batch_size']}: "
                     + (f"{c['docs_per_s']:.3f} docs/s" if c.get("status") == "ok" else c.get("status", "?")))
            echo(f"# {peer}: batch size {probes[peer]['best']}")
        runs_by_side: dict[str, list[dict]] = {}
        last_rows: dict[str, list[dict]] = {}
        longdoc_sides = [v.name for v in s.variants] if "longdoc" in s.sides else []
        created = datetime.now(timezone.utc).isoformat(timespec="seconds")

        def write(partial: bool) -> tuple[Path, Path, dict]:
            # After every side, not only at the end: a run cut short (a device call's time
            # limit, a crash in a later side) keeps the sides it finished, marked partial.
            result = _result(s, p, probes, runs_by_side, last_rows, load_start, created,
                             first_spec.generation.model, usd, partial)
            finish(result)
            return write_results(result, s.out, s.merge)

        for k in range(1, s.runs + 1):
            for name in longdoc_sides:
                fig, rows = run_longdoc(s, p, name, k, usd)
                runs_by_side.setdefault(name, []).append(fig)
                last_rows[name] = rows
                echo(f"# run {k} {name}: wall {fig['wall_s']:.1f} s, steady {fig['steady_s'] or 0:.1f} s, "
                     f"{fig['docs']} docs, {fig['failed']} failed"
                     + (f" (first error: {fig['first_error'][:300]})" if fig["first_error"] else ""))
                write(partial=True)
            for peer in run_peers:
                fig, rows = run_peer(s, p, peer, k, probes[peer]["best"], usd)
                runs_by_side.setdefault(peer, []).append(fig)
                last_rows[peer] = rows
                echo(f"# run {k} {peer}: wall {fig['wall_s']:.1f} s, steady {fig['steady_s'] or 0:.1f} s, "
                     f"{fig['docs']} docs")
                write(partial=True)
        js, md, result = write(partial=False)
        for line in summary_lines(result):
            echo(line)
        echo(f"# results: {js} and {md}")
        ok = True
        return result, js, md
    finally:
        restore()
        if ok and not s.keep_temp:
            shutil.rmtree(tmp, ignore_errors=True)
        elif not ok:
            echo(f"# kept {tmp} (logs of each side) after the failure")


def command_line(s: JobBenchSettings) -> str:
    """The command that reproduces ``s`` (every option given, in one canonical form)."""
    import shlex

    parts = ["longdoc", "bench", "job", s.spec]
    parts += [x for o in s.overrides for x in ("--set", o)]
    if s.variants != (Variant("longdoc"),):
        parts += [x for v in s.variants for x in ("--variant", f"{v.name}:{';'.join(v.overrides)}")]
    for opt, value, default in (("--docs", s.docs, None), ("--model", s.model, None),
                                ("--synthetic-docs", s.synthetic_docs, None), ("--doc-tokens", s.doc_tokens, None),
                                ("--usd-per-device-hour", s.usd_per_device_hour, None),
                                ("--probe-docs", s.probe_docs, None), ("--runner", s.runner, "auto"),
                                ("--runs", s.runs, None), ("--out", s.out, DEFAULT_OUT)):
        if value is not None and value != default:
            parts += [opt, str(value)]
    parts += ["--peer-batch-sizes", ",".join(map(str, s.peer_batch_sizes))]
    if s.synthetic_docs and s.synthetic_source != "jobs/corpus":
        parts += ["--synthetic-source", s.synthetic_source]
    if s.sides != SIDES:
        parts += ["--sides", ",".join(s.sides)]
    if s.merge:
        parts.append("--merge")
    return " ".join(shlex.quote(p) for p in parts)


# ----------------------------------------------------------------------------- the command
def bench_job_command(
    spec: Annotated[str, typer.Argument(help="Path of the YAML job spec.")],
    set_: Annotated[Opt[list[str]], typer.Option("--set", help="Override a spec field for every side (repeatable).")] = None,  # noqa: E501
    variant: Annotated[Opt[list[str]], typer.Option(help="A longdoc side: 'NAME:key=value;key=value' (repeatable; default one side, 'longdoc'); env.NAME=value sets an environment variable of its process, runner=ray|local|auto its runner.")] = None,  # noqa: E501
    docs: Annotated[Opt[int], typer.Option(help="Only the first N documents (input.limit).")] = None,
    peer_batch_sizes: Annotated[str, typer.Option(help="Candidate batch sizes of the peer; the fastest on the first documents is timed.")] = "1,4,8,16",  # noqa: E501
    probe_docs: Annotated[Opt[int], typer.Option(help="Documents each peer candidate is timed on (default: the largest candidate).")] = None,  # noqa: E501
    runs: Annotated[int, typer.Option(help="A/B runs of every side; medians reported.")] = 2,
    out: Annotated[str, typer.Option(help="Results folder.")] = DEFAULT_OUT,
    model: Annotated[Opt[str], typer.Option(help="generation.model for every side (e.g. random:llama-8b).")] = None,
    synthetic_docs: Annotated[Opt[int], typer.Option(help="Replace the input with N synthetic documents (with --doc-tokens).")] = None,  # noqa: E501
    doc_tokens: Annotated[Opt[int], typer.Option(help="Tokens of each synthetic document, exactly.")] = None,
    synthetic_source: Annotated[str, typer.Option(help="Text the synthetic documents are cut from.")] = "jobs/corpus",
    usd_per_device_hour: Annotated[Opt[float], typer.Option(help="Price of a device hour (default: the spec's cost.usd_per_device_hour).")] = None,  # noqa: E501
    runner: Annotated[Runner, typer.Option(help="longdoc side: ray (`longdoc run --runner ray`), local (`longdoc run --runner local`, with the engine's figures), auto (what `longdoc run` picks: local for one generate actor).")] = Runner.auto,  # noqa: E501
    sides: Annotated[str, typer.Option(help="Which sides run: longdoc,peer (with --merge, a side measured in another command joins the table).")] = "longdoc,peer",  # noqa: E501
    merge: Annotated[bool, typer.Option(help="Keep an earlier file's sides that this run does not measure (same device and settings).")] = False,  # noqa: E501
    keep_temp: Annotated[bool, typer.Option(help="Keep the temporary folder (each side's spec, output and log).")] = False,  # noqa: E501
    date: Annotated[Opt[str], typer.Option(help="Run date of the longdoc side (default: today, UTC).")] = None,
) -> None:
    """The whole job end to end vs a plain-transformers script, side by side (documents/hour, $/1k docs)."""
    try:
        sizes = parse_sizes(peer_batch_sizes)
        variants = tuple(parse_variant(v) for v in variant) if variant else (Variant("longdoc"),)
        if date is not None:
            from schemas.loading import check_run_date

            check_run_date(date)
        s = JobBenchSettings(
            spec=spec, overrides=tuple(set_ or ()), variants=variants, docs=docs, peer_batch_sizes=sizes,
            probe_docs=probe_docs, runs=runs, out=out, model=model, synthetic_docs=synthetic_docs,
            doc_tokens=doc_tokens, synthetic_source=synthetic_source, usd_per_device_hour=usd_per_device_hour,
            runner=Runner(runner).value, sides=tuple(x.strip() for x in sides.split(",") if x.strip()), merge=merge,
            keep_temp=keep_temp, **({"date": date} if date else {}),
        )
        s.command = command_line(s)
        check_settings(s)
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    try:
        result, _, _ = run_bench(s, echo=typer.echo)
    except (RuntimeError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    if any(t["pass"] is False for t in result["targets"]):
        typer.echo("# a target is not met (see the FAIL line above)")


if __name__ == "__main__":
    typer.run(bench_job_command)
