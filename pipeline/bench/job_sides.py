"""The sides of `longdoc bench job`: what every side reads (``prepare``), one run of a
longdoc side (``run_longdoc``: `longdoc run` or the in-process runner in a fresh process)
and of the peer (``run_peer``, after ``probe_peer`` picked its batch size).

Contract: each run returns (figures, rows): the figures of pipeline/bench/job_report.py
``side_figures`` plus where the time went (``where``), the rows as the side wrote them.
A side that exits non-zero raises ``RuntimeError`` with its log's tail. See
pipeline/bench/job.py for the bench these runs make up.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.bench.job_report import side_figures
from pipeline.bench.job_settings import JobBenchSettings

if TYPE_CHECKING:
    from schemas.compression import CompressionSpec
    from stages.compression.base import CompressionMethod

ROOT = Path(__file__).resolve().parents[2]
PEER_SCRIPT = Path(__file__).resolve().with_name("peer.py")


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
    dtype: str  # the peer's (the first side's model, resolved)
    peer_model_args: list[str]
    requests: int
    bad_docs: int
    docs_label: str
    threads: int
    spec_name: str
    max_new_tokens: int
    on_host: bool  # the host's CPU runs it (step backend's runs_on_host): threads matter, files say "cpu"
    side_dtypes: dict[str, str] = field(default_factory=dict)  # side -> generation.dtype, where sides differ


def dtype_label(p: Prepared) -> str:
    """The dtype the sides run in: the peer's, and each side's setting where sides differ."""
    if not p.side_dtypes:
        return p.dtype
    return f"{p.dtype} (the peer); sides: " + ", ".join(f"{n} {d}" for n, d in p.side_dtypes.items())


def prepare(s: JobBenchSettings, specs, tmp: Path) -> Prepared:
    """Synthetic corpus (if asked), absolute input, the peer's requests and model arguments."""

    from pipeline.bench.job_docs import spec_requests, write_requests, write_synthetic_corpus
    from pipeline.placement import usable_cores
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
    # One peer per distinct context: a cut the peer can make (truncate's) -> that cut; else the whole document.
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
    # One-time work (the embedded model's conversion, a random model's draw to the cache)
    # happens here, before any timed side: the first side would pay it, the others not.
    from stages.model_loading import prepare_model

    # Every side's model in its dtype (a variant in bfloat16 draws its own random weights),
    # and select's small reader.
    loads = [(sp.generation.model, sp.generation.dtype) for sp in out_specs]
    loads += [(scorer, first.generation.dtype) for sp in out_specs
              if (scorer := getattr(sp.compression, "scorer", None))]
    for model, dtype in dict.fromkeys(loads):
        prepare_model(model, dtype, device)
    dtypes = {v.name: sp.generation.dtype for v, sp in zip(s.variants, out_specs, strict=True)}
    model_args, dtype = _peer_model(first.generation.model, first.generation.dtype, device, tmp)
    return Prepared(
        tmp=tmp, specs=datas, methods=methods, same_context=same_context, speculative=speculative, peer_of=peer_of, peers=peers, device_type=device.type,
        device_name=_device_name(device), dtype=dtype, peer_model_args=model_args, requests=len(records),
        bad_docs=bad, docs_label=docs_label, threads=int(first.resources.cpus_per_actor(usable_cores(), 1)),
        spec_name=first.name, max_new_tokens=first.generation.max_new_tokens,
        on_host=device_backend(device).runs_on_host(device),
        side_dtypes=dtypes if len(set(dtypes.values())) > 1 else {},
    )


def _device_name(device) -> str:
    from pipeline.bench.roofline import device_name

    return device_name(device)


def _peer_model(name: str, dtype: str, device, tmp: Path) -> tuple[list[str], str]:
    """The peer's model options (a directory, or a random config + the tokenizer) and its dtype."""
    from stages.model_loading import (
        checkpoint_dtype,
        load_tokenizer,
        random_model_config,
        random_model_dir,
        resolve_dtype,
        resolve_model_path,
    )

    if name.startswith("random:"):
        tok = load_tokenizer(name)  # random:<shape> models share the embedded tokenizer
        cfg = random_model_config(name, tok)
        cfg.save_pretrained(tmp / "random-config")
        tok.save_pretrained(tmp / "tokenizer")
        torch_dtype = resolve_dtype(dtype, device, cfg)
        # Where longdoc reads the drawn weights from the cache, the peer reads the same files
        # (a user's script loads its model from disk); elsewhere both draw them.
        folder = random_model_dir(name, cfg, torch_dtype, device, seed=0)
        args = (["--model", str(folder)] if folder is not None else
                ["--random-config", str(tmp / "random-config"), "--seed", "0"]) + ["--tokenizer", str(tmp / "tokenizer")]
    else:
        path = resolve_model_path(name)
        torch_dtype = checkpoint_dtype(path, dtype, device)  # as load_causal_lm
        args = ["--model", path]
    return args, str(torch_dtype).removeprefix("torch.")

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
    from pipeline.placement import auto_runner

    runner = next((v.runner for v in s.variants if v.name == name and v.runner), s.runner)
    if runner != "auto":
        return runner == "ray"
    return auto_runner(spec["resources"]["actors"], None) == "ray" and importlib.util.find_spec("ray") is not None


def runner_name(s: JobBenchSettings, name: str, spec: dict) -> str:
    return "ray" if _use_ray(s, name, spec) else "inprocess"


def engines(s: JobBenchSettings, name: str, spec: dict) -> int:
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


def read_rows(out_root: Path, date: str) -> list[dict]:
    import pyarrow.dataset as ds

    part = out_root / f"run_date={date}"
    if not part.is_dir():
        return []
    cols = ["request_id", "doc_id", "prompt", "output_text", "output_tokens", "prompt_tokens", "context_tokens", "e2e_s",
            "error", "prefill_s", "decode_s", "ttft_s", "compress_s", "draft_tokens", "accepted_tokens",
            "decode_steps"]
    dataset = ds.dataset(str(part), format="parquet")
    # The prefix cache's column (schema version 5 on): row_totals sums it; older outputs lack it.
    cols += [c for c in ("cached_prompt_tokens",) if c in dataset.schema.names]
    return dataset.to_table(columns=cols).to_pylist()


def row_totals(rows: list[dict]) -> dict:
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
    rows = read_rows(side_dir / "out", s.date)
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
    where.update({"exit_s": m.wall_s, **row_totals(rows)})
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


def _peer_context(c: CompressionSpec, method: CompressionMethod | None = None) -> tuple[tuple, bool]:
    """(the peer's context key, whether the peer reads the very context the method keeps).

    ``method``: the registered method of ``c`` unless given. A method whose cut the peer
    reproduces (``CompressionMethod.peer_cut``: truncate) -> that cut (key ("truncate",
    target, keep)); any other -> the whole document (key ("full",)), the same context only
    for the method whose prefill is the plain full prefill (it keeps the whole document).
    Asked of the method, not of where it runs: a tokenize-time method that keeps other
    tokens than truncate's (sentences, say) is not the peer's head/tail cut."""
    from stages.compression import method_for
    from stages.compression.base import CompressionMethod

    method = method if method is not None else method_for(c)
    cut = method.peer_cut(c)
    if cut is not None:
        return ("truncate", *cut), True
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
    sizes, note = probe_sizes(sizes, n)
    argv = _peer_argv(p, peer) + ["--probe", ",".join(map(str, sizes)), "--probe-docs", str(n),
                                  "--timing", str(d / "timing.json")]
    m = run_measured(argv, _env(), ROOT, d / "log.txt")
    if m.returncode != 0:
        raise RuntimeError(f"peer probe {peer} exited {m.returncode}; log {d / 'log.txt'}:\n{m.tail()}")
    t = json.loads((d / "timing.json").read_text())
    if t["best"] is None:
        raise RuntimeError(f"peer probe {peer}: no candidate batch size ran: {t['candidates']}")
    return {"candidates": t["candidates"], "best": t["best"], "probe_wall_s": m.wall_s, "probe_docs": n,
            **({"note": note} if note else {})}


def probe_sizes(sizes: tuple[int, ...], docs: int) -> tuple[tuple[int, ...], str | None]:
    """The candidates a probe on ``docs`` documents can tell apart, and a note when some were
    clamped: a batch larger than the documents runs them all in one batch, the same work as
    batch ``docs`` (check_settings refuses a --probe-docs below a candidate; this is the job
    with fewer documents than a candidate, where a batch that large cannot occur in its runs
    either)."""
    big = [b for b in sizes if b > docs]
    if not big:
        return tuple(sizes), None
    kept = tuple(dict.fromkeys(min(b, docs) for b in sizes))
    return kept, (f"batch size {','.join(map(str, big))} above the {docs} documents probed (all the job has): "
                  f"timed as batch {docs}, the most its runs can batch")
