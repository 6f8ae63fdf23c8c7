"""Figures, ratios, targets and files of `longdoc bench job`: JSON + Markdown under jobs/results/.

Definitions (one place; every side of every run gets the same):
- ``docs``: requests written without ``error`` (a failed row is not a document done);
- ``wall_s``: the side's whole process, start to exit (pipeline/bench/job_measure.py);
- ``steady_s``: its steady state, the first document started to the last one written
  (longdoc: the earliest row start, a staged block's write time minus its rows' ``e2e_s``,
  to the last block written; the local runner and the peer stamp both instants
  themselves); model load, Ray start, compilation and warm-up fall outside it;
- ``docs_per_hour`` = 3600 x docs / seconds and ``usd_per_1k_docs`` = 1000 x
  ``cost_usd(seconds / docs, usd_per_device_hour)`` (schemas/output.py), each for
  ``wall`` and ``steady``;
- ``latency_p50_s``/``latency_p95_s``: per document; longdoc: the ``e2e_s`` column, the
  peer: the wall time of the ``generate`` call that held the document;
- ``peak_rss_gb``/``peak_pss_gb`` (process tree), ``peak_gpu_gb`` (device, when sampled);
- ``agreement``: rows whose output text equals the peer's for the same request, only
  where both read the same context (method none vs the full document, or truncate with
  the peer's truncation), in the dtype named beside it; ``text_prefix`` counts the rows
  a stop rule the peer lacks (``generation.repeat_guard``, stop strings) ended early
  whose text is the start of the peer's.
``summary[side]`` holds the median of each figure over the runs (A/B alternated, so
noise on the machine hits every side); ``ratios`` divide each longdoc side's median
documents/hour by the peer's (and by the first longdoc side's) and, with two runs or more,
give each round's ratio to the peer (``rounds``: run k of the side over run k of the peer,
measured minutes apart); ``targets`` are the PASS/FAIL lines of the project's targets that
apply to the device (NOT JUDGED where a side's runs differ too much to be a measurement),
judged against the peer by the lower of the medians' ratio and the median round's ratio:
a machine that slows down during the command makes the medians of sides measured at
different times disagree, and the medians' ratio then overstated what
the rounds reached (measured: jobs/results/code-choices.md, "pipeline/bench/job_report.py").

Files: ``<out>/job-<device>-<spec name>-<model>[-synthetic-<n>x<tokens>].{json,md}``.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from pipeline.host_load import busy_note, cpu_label
from schemas.output import cost_usd

LAYOUT_VERSION = 1
DEFAULT_OUT = "jobs/results/bench-job"
#: CPU: longdoc's documents/hour over the peer's, whole process (the sample job's target).
CPU_TARGET = 1.5
#: GPU: finch (1k) over full context on our engine, and over the peer.
GPU_FINCH_OVER_NONE = 3.0
GPU_FINCH_OVER_PEER = 2.0
#: GPU: prompt lookup over greedy, requests queued (the engine refills as rows finish).
GPU_PLD_OVER_GREEDY = 1.3
FIGURES = ("wall_s", "steady_s", "docs_per_hour_wall", "docs_per_hour_steady", "usd_per_1k_docs_wall",
           "usd_per_1k_docs_steady", "latency_p50_s", "latency_p95_s", "peak_rss_gb", "peak_pss_gb", "peak_gpu_gb")


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-")


def quantile(values: list[float], q: float) -> float | None:
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    k = (len(vals) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (k - lo)


def throughput(docs: int, seconds: float | None, usd_per_device_hour: float) -> tuple[float | None, float | None]:
    """(documents/hour, $ per 1,000 documents) of ``docs`` done in ``seconds``."""
    if not docs or not seconds or seconds <= 0:
        return None, None
    return 3600.0 * docs / seconds, 1000.0 * cost_usd(seconds / docs, usd_per_device_hour)


def side_figures(docs: int, failed: int, wall_s: float, steady_s: float | None, latencies: list[float],
                 usd_per_device_hour: float, peaks: dict) -> dict:
    """The figures of one side in one run (see the module docstring)."""
    dph_w, usd_w = throughput(docs, wall_s, usd_per_device_hour)
    dph_s, usd_s = throughput(docs, steady_s, usd_per_device_hour)
    gb = 2.0**30
    return {
        "docs": docs, "failed": failed, "wall_s": wall_s, "steady_s": steady_s,
        "docs_per_hour_wall": dph_w, "docs_per_hour_steady": dph_s,
        "usd_per_1k_docs_wall": usd_w, "usd_per_1k_docs_steady": usd_s,
        "latency_p50_s": quantile(latencies, 0.5), "latency_p95_s": quantile(latencies, 0.95),
        "peak_rss_gb": peaks["rss"] / gb if peaks.get("rss") else None,
        "peak_pss_gb": peaks["pss"] / gb if peaks.get("pss") else None,
        "peak_gpu_gb": peaks["gpu"] / gb if peaks.get("gpu") else None,
    }


def medians(runs: list[dict]) -> dict:
    """Per figure, the median over ``runs`` (None where no run has it). Documents per hour
    are the documents over the median time (with an even number of runs the median of the
    rates is not the rate of the median time: a table gave 135.9 s and 416 docs/h for 10)."""
    out: dict = {"runs": len(runs)}
    for k in ("docs", "failed", *FIGURES):
        vals = [r[k] for r in runs if r.get(k) is not None]
        out[k] = statistics.median(vals) if vals else None
    for rate, seconds in (("docs_per_hour_wall", "wall_s"), ("docs_per_hour_steady", "steady_s")):
        if out[rate] is not None and out["docs"] and out[seconds]:
            out[rate] = 3600.0 * out["docs"] / out[seconds]
    return out


#: Runs of one side further apart than this (max over min wall time, minus one) are noted.
SPREAD_NOTED = 0.2


def spread_sides(result: dict) -> dict[str, tuple[float, float]]:
    """Sides whose runs' wall times differ by more than ``SPREAD_NOTED``: side -> (min, max)."""
    out = {}
    for side, runs in result.get("runs_by_side", {}).items():
        walls = [r["wall_s"] for r in runs if r.get("wall_s")]
        if len(walls) > 1 and max(walls) > (1 + SPREAD_NOTED) * min(walls):
            out[side] = (min(walls), max(walls))
    return out


def noise_notes(result: dict) -> list[str]:
    """Where the machine was not quiet enough for the ratios to be a measurement: a side
    whose runs' wall times differ by more than ``SPREAD_NOTED``, a load average above the
    CPU count at the start or the end (a trial's bench printed 0.74x from runs of 54 s and
    218 s of the same setting, and nothing said so)."""
    notes = []
    for side, (lo, hi) in spread_sides(result).items():
        notes.append(f"side {side}'s runs differ by {hi / lo - 1:.0%} ({_f(lo)} s to {_f(hi)} s): its figures and "
                     "ratios are not a measurement; run again on a quiet machine, or with more --runs")
    host = result.get("host", {})
    loads = [*host.get("load_avg_start", [])[:1], *host.get("load_avg_end", [])[:1]]
    if busy := busy_note(loads, host.get("cpus")):
        notes.append(busy)
    return notes


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _rounds(side_runs: list[dict], peer_runs: list[dict]) -> list[float]:
    """Each round's documents/hour ratio (side run k over peer run k), where both ran it."""
    peer = {r.get("run"): r for r in peer_runs}
    out = []
    for r in side_runs:
        p = peer.get(r.get("run"))
        v = _ratio(r.get("docs_per_hour_wall"), p.get("docs_per_hour_wall")) if p else None
        if v is not None:
            out.append(v)
    return out


def judged(vs_peer: dict) -> float | None:
    """The ratio a target against the peer is judged by: the lower of the medians' ratio and
    the median round's ratio (the medians' alone with fewer than two rounds)."""
    wall, rounds = vs_peer.get("wall"), vs_peer.get("rounds") or []
    if wall is None or len(rounds) < 2:
        return wall
    return min(wall, statistics.median(rounds))


def ratios(summary: dict, longdoc_sides: list[str], peer_of: dict[str, str | None],
           runs_by_side: dict[str, list[dict]] | None = None) -> dict:
    """Per longdoc side: documents/hour over its peer's (medians, and per round with two runs
    or more) and over the first longdoc side's."""
    runs_by_side = runs_by_side or {}
    out: dict = {}
    first = longdoc_sides[0] if longdoc_sides else None
    for side in longdoc_sides:
        s, rec = summary.get(side), {}
        peer = peer_of.get(side)
        if s and peer and summary.get(peer):
            p = summary[peer]
            rec["vs_peer"] = {"peer": peer, "wall": _ratio(s["docs_per_hour_wall"], p["docs_per_hour_wall"]),
                              "steady": _ratio(s["docs_per_hour_steady"], p["docs_per_hour_steady"])}
            rounds = _rounds(runs_by_side.get(side, []), runs_by_side.get(peer, []))
            if len(rounds) >= 2:
                rec["vs_peer"]["rounds"] = rounds
        if s and first and side != first and summary.get(first):
            f = summary[first]
            rec["vs_first"] = {"side": first, "wall": _ratio(s["docs_per_hour_wall"], f["docs_per_hour_wall"]),
                               "steady": _ratio(s["docs_per_hour_steady"], f["docs_per_hour_steady"])}
        out[side] = rec
    return out


def prefill_bounds(result: dict) -> None:
    """Per longdoc side, ``ratios[side]["vs_peer"]["prefill_bound"]`` (with a peer) and
    ``ratios[side]["vs_first"]["prefill_bound"]`` (against the first longdoc side): the most
    documents/hour over the other side's that this side could reach if everything but its
    prompt reading were free (decode, Ray, start-up, writing): the other side's median wall
    time over this side's median ``rows_prefill_s`` (every row's prefill, compression
    included) shared among the side's ``engines`` (generate actors prefilling at once; 1
    when the side does not say), as if they split it evenly.

    Why: where prefill dominates (CPU, long prompts, few new tokens) both sides pay about
    the same FLOPs for it, so this bound, not the decode engine, caps the ratio; a target
    above it cannot be met by scheduling or decoding work. Against the first side (e.g. a
    compressed side against method none): a method that reads the whole document through
    the model (Finch) cannot beat no compression by more than this, however small its KV.

    Where the side's runs say when their first row started (``first_row_start_s``: imports,
    model load, warm-up, reading, all before any prompt is read), also ``start_s`` (its
    median) and ``start_bound``: the other side's wall time over that start plus the shared
    prefill, the most a whole-process ratio can reach if only decoding and writing were free.
    Why: on a GPU a side's start can outweigh its decoding (prompt lookup's extra captured
    graphs; measured: jobs/results/code-choices.md, "pipeline/bench/job_report.py
    prefill_bounds"), and a whole-process target above this bound needs a shorter start, not
    a faster engine.
    """
    summary = result["summary"]
    for side, rec in result["ratios"].items():
        runs = [r["where"] for r in result["runs_by_side"].get(side, []) if isinstance(r.get("where"), dict)]
        prefill = [v for w in runs if (v := w.get("rows_prefill_s"))]
        if not prefill:
            continue
        starts = [v for w in runs if (v := w.get("first_row_start_s")) is not None]
        engines = int(result["sides"].get(side, {}).get("engines", 1))
        for key, other in (("vs_peer", "peer"), ("vs_first", "side")):
            vs = rec.get(key)
            wall = summary.get(vs[other], {}).get("wall_s") if vs else None
            if wall:
                vs["prefill_s"] = statistics.median(prefill)
                vs["prefill_runs"] = len(prefill)
                vs["prefill_engines"] = engines
                vs["prefill_bound"] = wall / (vs["prefill_s"] / engines)
                if starts:
                    vs["start_s"] = statistics.median(starts)
                    vs["start_bound"] = wall / (vs["start_s"] + vs["prefill_s"] / engines)


def targets(device_type: str, sides: dict, summary: dict, rat: dict) -> list[dict]:
    """The project's targets that apply to what ran (a side it needs missing: ``pass`` None).

    CPU: every longdoc side >= CPU_TARGET x the peer. CUDA: a finch side >= GPU_FINCH_OVER_NONE
    x the side with method none and >= GPU_FINCH_OVER_PEER x the peer; a prompt-lookup side
    >= GPU_PLD_OVER_GREEDY x the side without speculation of the same method. Whole process.
    """
    longdoc = [x for x, d in sides.items() if d["kind"] == "longdoc"]

    def dph(side: str | None) -> float | None:
        return summary.get(side, {}).get("docs_per_hour_wall") if side else None

    def line(name: str, value: float | None, target: float, *compared: str | None) -> dict:
        return {"name": name, "value": value, "pass": _passed(value, target), "sides": [x for x in compared if x]}

    out = []
    if device_type == "cpu":
        for side in longdoc:
            r = judged(rat.get(side, {}).get("vs_peer", {}))
            out.append(line(f"{side}: documents/hour >= {CPU_TARGET}x the peer's (whole process, CPU)", r, CPU_TARGET,
                            side, sides[side].get("peer")))
        return out
    full = next((x for x in longdoc if sides[x].get("method") == "none"), None)
    for side in (x for x in longdoc if sides[x].get("method") == "finch"):
        if full is not None:
            out.append(line(f"{side}: documents/hour >= {GPU_FINCH_OVER_NONE}x {full}'s (whole process, GPU)",
                            _ratio(dph(side), dph(full)), GPU_FINCH_OVER_NONE, side, full))
        r = judged(rat.get(side, {}).get("vs_peer", {}))
        out.append(line(f"{side}: documents/hour >= {GPU_FINCH_OVER_PEER}x the peer's (whole process, GPU)",
                        r, GPU_FINCH_OVER_PEER, side, sides[side].get("peer")))
    for side in (x for x in longdoc if sides[x].get("speculative") not in (None, "none")):
        base = next((x for x in longdoc if sides[x].get("speculative") == "none"
                     and sides[x].get("method") == sides[side].get("method")), None)
        if base is not None:
            out.append(line(f"{side}: documents/hour >= {GPU_PLD_OVER_GREEDY}x {base}'s (speculation in a queue, GPU)",
                            _ratio(dph(side), dph(base)), GPU_PLD_OVER_GREEDY, side, base))
    return out


def judge_noise(result: dict) -> None:
    """A target whose sides' runs differ by more than ``SPREAD_NOTED`` is not judged: the noise
    note under it says those figures and ratios are not a measurement, so a PASS or FAIL beside
    it would claim what the note denies (a trial printed "PASS ... 2.03x" above "side peer's
    runs differ by 93%"). Its ``pass`` is None and ``not_judged`` says why; every target gets
    a ``verdict``: PASS, FAIL, NOT MEASURED (a side it needs did not run) or NOT JUDGED."""
    spread = spread_sides(result)
    for t in result["targets"]:
        noisy = [x for x in t.get("sides", []) if x in spread]
        if noisy and t["value"] is not None:
            t["pass"] = None
            t["not_judged"] = "noise: " + "; ".join(
                f"side {x}'s runs differ by {spread[x][1] / spread[x][0] - 1:.0%}" for x in noisy)
        t["verdict"] = _verdict(t)


def _verdict(t: dict) -> str:
    """A target's verdict: NOT JUDGED (``not_judged`` set), else PASS, FAIL or NOT MEASURED."""
    return "NOT JUDGED" if t.get("not_judged") else {True: "PASS", False: "FAIL", None: "NOT MEASURED"}[t["pass"]]


def _passed(value: float | None, target: float) -> bool | None:
    """True/False against ``target``; None when a side it needs was not measured."""
    return None if value is None else value >= target


# ----------------------------------------------------------------------------- files
def result_paths(result: dict, out_dir: str | Path) -> tuple[Path, Path]:
    s = result["settings"]
    stem = f"job-{slug(result['device']['file_name'])}-{slug(s['spec_name'])}-{slug(s['model'])}"
    if s.get("synthetic_docs"):
        stem += f"-synthetic-{s['synthetic_docs']}x{s['doc_tokens']}"
    return Path(out_dir) / f"{stem}.json", Path(out_dir) / f"{stem}.md"


_SAME = ("spec_name", "model", "docs", "max_new_tokens", "synthetic_docs", "doc_tokens", "dtype")


def _same_settings(old: dict, new: dict) -> bool:
    """Whether two results measured the same thing: the settings above and the same ``--set``
    overrides (a side measured with ``generation.compile=off`` is another engine than one
    measured with captured steps; on 2026-11-27 such a side was merged into a captured
    table before this check)."""
    return all(old.get(k) == new.get(k) for k in _SAME) and list(old.get("set") or []) == list(new.get("set") or [])


def merge_previous(result: dict, path: Path) -> dict:
    """``result`` plus the sides of the earlier file at ``path`` that this run did not measure,
    when it was written for the same device, settings and ``--set`` overrides (``--merge``: a night measured
    side by side in separate commands under a time limit). Recomputes ratios and targets."""
    if not path.is_file():
        return result
    old = json.loads(path.read_text())
    if old.get("layout_version") != LAYOUT_VERSION or old.get("device", {}).get("name") != result["device"]["name"] \
            or not _same_settings(old["settings"], result["settings"]):
        return result
    merged = dict(result)
    for key in ("sides", "summary", "runs_by_side", "agreement", "peer_probe"):
        merged[key] = {**{k: v for k, v in old.get(key, {}).items() if k not in result.get(key, {})},
                       **result.get(key, {})}
    earlier = [] if old.get("created_utc") == result.get("created_utc") else [  # not this run's own partial write
        {"created_utc": old.get("created_utc"), "commit": old.get("versions", {}).get("longdoc_commit")}]
    merged["merged_from"] = [*old.get("merged_from", []), *earlier]
    finish(merged)
    return merged


def finish(result: dict) -> None:
    """Fill ``ratios`` and ``targets`` from ``summary`` and ``sides``."""
    sides = result["sides"]
    longdoc = [s for s, d in sides.items() if d["kind"] == "longdoc"]
    peer_of = {s: sides[s].get("peer") for s in longdoc}
    result["ratios"] = ratios(result["summary"], longdoc, peer_of, result.get("runs_by_side"))
    prefill_bounds(result)
    result["targets"] = targets(result["device"]["type"], sides, result["summary"], result["ratios"])
    judge_noise(result)


def write_results(result: dict, out_dir: str | Path, merge: bool = False) -> tuple[Path, Path, dict]:
    js, md = result_paths(result, out_dir)
    if merge:
        result = merge_previous(result, js)
    js.parent.mkdir(parents=True, exist_ok=True)
    js.write_text(json.dumps(result, indent=1, default=str) + "\n")
    md.write_text(markdown(result))
    return js, md, result


def _cpu(host: dict) -> str:
    """": GenuineIntel family 6 model 143 ...; avx2 avx512f ..." of the host's CPU, or ""."""
    label = cpu_label(host.get("cpu") or {})
    return f": {label}" if label else ""


def _f(v, digits: int = 1) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


#: Where a method's reading happens, for the time line (stages/compression/base.py RunsAt).
_READS_AT = {"tokenize": "tokenize stage, before the engine", "text_stage": "text stage, before the engine"}


def time_line(side: str, runs: list[dict], side_info: dict) -> str | None:
    """Where the engine's time went in the side's last run: the method's reading, the engine's
    prefill, and its decode steps, each figure what it says. The engine's ``stall_s`` is
    prefill time spent while other rows were decoding (stages/decoding/engine.py
    ``_account_prefill``): a part of the prefill, not of the decode steps. The rows'
    ``compress_s`` is a part of the engine's prefill only for a method that reads there
    (``runs_at`` "prefill": Finch, AutoCompressor); a text method (truncate, rag, bm25) spends
    it in the tokenize or text stage, before the engine."""
    w = runs[-1].get("where") if runs else None
    if not isinstance(w, dict) or w.get("engine_prefill_s") is None:
        return None
    read, prefill = w.get("rows_compress_s") or 0.0, w["engine_prefill_s"]
    runs_at, method = side_info.get("method_runs_at"), side_info.get("method")
    waited = f"decoding rows waited through {_f(w.get('engine_stall_s'))} s of it"
    if runs_at == "prefill":
        inside = "" if method == "none" else f"the method's reading {_f(read)} s of it; "
        parts = [f"engine prefill {_f(prefill)} s ({inside}{waited})"]
    else:
        where = _READS_AT.get(runs_at, "where it ran not recorded")
        parts = [f"method reading {_f(read)} s ({where})", f"engine prefill {_f(prefill)} s ({waited})"]
    parts.append(f"decode steps {_f(w.get('engine_step_s'))} s")
    label = f"run {runs[-1].get('run', len(runs))} of {len(runs)}, the last"
    return f"time {side} ({label}): " + ", ".join(parts)


def summary_lines(result: dict) -> list[str]:
    """The console block: per side medians (``table_lines``), the ratios and the target lines
    (``verdict_lines``)."""
    return table_lines(result) + verdict_lines(result)


def table_lines(result: dict) -> list[str]:
    """The console's title and table of per side medians (with the QA line under its head)."""
    lines = [f"# bench job: {result['settings']['spec_name']} on {result['device']['name']} "
             f"({result['settings']['docs_label']}, {result['settings']['max_new_tokens']} new tokens, "
             f"{result['settings']['dtype']}; medians of {result['settings']['runs']} run(s))"]
    head = f"{'side':<22} {'wall s':>8} {'steady s':>9} {'docs/h':>9} {'docs/h st':>10} {'$/1k':>8} " \
           f"{'p50 s':>7} {'p95 s':>7} {'RSS GB':>7} {'GPU GB':>7} {'failed':>6}"
    lines.append(head)
    if "requests" in result["settings"]["docs_label"]:  # a QA job: a row per document and question
        lines.append("(docs = rows written, one per document and question)")
    for side, s in result["summary"].items():
        lines.append(f"{side:<22} {_f(s['wall_s']):>8} {_f(s['steady_s']):>9} {_f(s['docs_per_hour_wall'], 0):>9} "
                     f"{_f(s['docs_per_hour_steady'], 0):>10} {_f(s['usd_per_1k_docs_wall'], 3):>8} "
                     f"{_f(s['latency_p50_s'], 2):>7} {_f(s['latency_p95_s'], 2):>7} {_f(s['peak_rss_gb'], 2):>7} "
                     f"{_f(s['peak_gpu_gb'], 2):>7} {_f(s['failed'], 0):>6}")
    return lines


def verdict_lines(result: dict) -> list[str]:
    """The lines under the table: ratios, bounds, agreement, time, targets and noise notes
    (the Markdown's "Ratios and targets" section, without the table it has above)."""
    lines: list[str] = []
    for side, r in result["ratios"].items():
        for key, label in (("vs_peer", "peer"), ("vs_first", "side")):
            if key in r:
                lines.append(f"ratio {side} / {r[key][label]}: documents/hour {_f(r[key]['wall'], 2)}x whole process, "
                             f"{_f(r[key]['steady'], 2)}x steady state")
                if r[key].get("rounds"):
                    rounds = r[key]["rounds"]
                    lines.append(f"rounds {side} / {r[key][label]}: " + ", ".join(f"{_f(v, 2)}x" for v in rounds)
                                 + f" whole process (median {_f(statistics.median(rounds), 2)}x; each round's runs "
                                   "minutes apart, the targets take the lower of this and the medians' ratio)")
        for key, label in (("vs_peer", "peer"), ("vs_first", "side")):
            if r.get(key, {}).get("prefill_bound"):
                v = r[key]
                shared = f" over {v['prefill_engines']} engines" if v.get("prefill_engines", 1) > 1 else ""
                start = f"; {_f(v['start_bound'], 2)}x with its start too ({_f(v['start_s'], 1)} s before " \
                        f"its first row)" if v.get("start_bound") else ""
                n = v.get("prefill_runs", 1)
                lines.append(f"bound {side} / {v[label]}: at most {_f(v['prefill_bound'], 2)}x if all but its "
                             f"prompts' prefill ({_f(v['prefill_s'], 1)} s{shared}) were free{start} "
                             f"({'its one run' if n == 1 else f'medians of its {n} runs'})")
    for side, a in result.get("agreement", {}).items():
        cut = f", {a['text_prefix']} more stopped earlier by a stop rule the peer lacks (the start of its text)" \
            if a.get("text_prefix") else ""
        lines.append(f"agreement {side} vs {a['peer']}: {a['text_equal']}/{a['compared']} rows with equal text{cut} "
                     f"({a['dtype']}); {a['prompt_tokens_equal']}/{a['compared']} equal prompt lengths"
                     if a.get("compared") else f"agreement {side}: {a.get('reason')}")
    first = next(iter(result["summary"]), None)
    for side, a in result.get("agreement_sides", {}).items():
        lines.append(f"agreement {side} vs {first}: {a['text_equal']}/{a['compared']} rows with equal text")
    for side, runs in result.get("runs_by_side", {}).items():
        if line := time_line(side, runs, result["sides"].get(side, {})):
            lines.append(line)
    unmeasured = [t["name"] for t in result["targets"] if t["pass"] is None and t["value"] is None]
    for t in result["targets"]:
        if t["name"] not in unmeasured:
            why = f" ({t['not_judged']})" if t.get("not_judged") else ""
            lines.append(f"{_verdict(t)}{why} {t['name']}: {_f(t['value'], 2)}x")
    if unmeasured:
        lines.append(f"NOT MEASURED (their sides did not run): {'; '.join(unmeasured)}")
    lines += [f"NOTE {n}" for n in noise_notes(result)]
    return lines


def markdown(result: dict) -> str:
    s, d, v = result["settings"], result["device"], result["versions"]
    out = [
        f"# `longdoc bench job`: {s['spec_name']} on {d['name']}",
        "",
        f"Command: `{result['command']}`  ",
        *([f"**Partial** ({result['partial']}): the command ended before its last side.  "] if result.get("partial") else []),
        f"Created {result['created_utc']} at commit {v.get('longdoc_commit')}; load average "
        f"{result['host']['load_avg_start']} at the start, {result['host']['load_avg_end']} at the end "
        f"({result['host']['cpus']} CPUs{_cpu(result['host'])}).  ",
        "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if k != "longdoc_commit") + ".",
        "",
        f"Settings: {s['docs_label']}, {s['max_new_tokens']} new tokens, model `{s['model']}` in {s['dtype']}"
        + ("" if not s.get("side_dtypes") else
           " (the peer; sides: " + ", ".join(f"{n} {d}" for n, d in s["side_dtypes"].items()) + ")") + ", "
        f"runner `{s['runner']}`, {s['runs']} run(s) alternated A/B, $/device-hour {s['usd_per_device_hour']}.",
        "",
        "## Medians",
        "",
        "| side | what | wall s | steady s | docs/h (wall) | docs/h (steady) | $/1k docs (wall) | $/1k docs (steady) "
        "| p50 s | p95 s | peak RSS GB | peak PSS GB | peak GPU GB | failed |",
        "|---|---|" + "---:|" * 12,
    ]
    for side, m in result["summary"].items():
        what = result["sides"][side]["what"]
        out.append(f"| {side} | {what} | {_f(m['wall_s'])} | {_f(m['steady_s'])} | {_f(m['docs_per_hour_wall'], 0)} | "
                   f"{_f(m['docs_per_hour_steady'], 0)} | {_f(m['usd_per_1k_docs_wall'], 4)} | "
                   f"{_f(m['usd_per_1k_docs_steady'], 4)} | {_f(m['latency_p50_s'], 2)} | {_f(m['latency_p95_s'], 2)} | "
                   f"{_f(m['peak_rss_gb'], 2)} | {_f(m['peak_pss_gb'], 2)} | {_f(m['peak_gpu_gb'], 2)} | "
                   f"{_f(m['failed'], 0)} |")
    out += ["", "## Ratios and targets", ""]
    out += [f"- {line}" for line in verdict_lines(result)]
    if result.get("peer_probe"):
        out += ["", "## Peer batch sizes (probe: the first documents, every candidate)", "",
                "| peer | batch | docs | seconds | docs/s | warm-up s | status |", "|---|---:|---:|---:|---:|---:|---|"]
        for peer, pr in result["peer_probe"].items():
            for c in pr.get("candidates", []):
                out.append(f"| {peer} | {c['batch_size']} | {c.get('docs')} | {_f(c.get('seconds'), 2)} | "
                           f"{_f(c.get('docs_per_s'), 3)} | {_f(c.get('warm_up_s'), 1)} | {c.get('status')} |")
            out.append(f"| {peer} | best: {pr.get('best')} | | | | | |")
        out += [""] + [f"{peer}: {pr['note']}." for peer, pr in result["peer_probe"].items() if pr.get("note")]
    if noise := noise_notes(result):
        out += [""] + [f"**Note:** {n}." for n in noise]
    out += ["", "## Every run", "", "| run | side | wall s | steady s | docs | failed | load avg |",
            "|---:|---|---:|---:|---:|---:|---|"]
    for side, runs in result["runs_by_side"].items():
        for r in runs:
            out.append(f"| {r['run']} | {side} | {_f(r['wall_s'])} | {_f(r['steady_s'])} | {r['docs']} | "
                       f"{r['failed']} | {r.get('load_avg')} |")
    diag = {side: runs[-1].get("where") for side, runs in result["runs_by_side"].items() if runs and runs[-1].get("where")}
    if diag:
        out += ["", "## Where the time goes (last run of each side; seconds)", ""]
        for side, w in diag.items():
            out.append(f"- {side}: " + ", ".join(f"{k} {_f(val, 2) if isinstance(val, float) else val}"
                                                  for k, val in w.items()))
    out += ["", "## Notes", ""] + [f"- {n}" for n in result["notes"]] + [""]
    return "\n".join(out)
