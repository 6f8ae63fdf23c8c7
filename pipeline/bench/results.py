"""Writing `bench decode` results: JSON + Markdown under jobs/results/.

JSON layout (``layout_version`` 2; pipeline/bench/suite.py fills it):
- ``device``: type, name, torch_threads, bandwidth_measured_GBps (copy, read + write),
  bandwidth_nominal_GBps (data sheet, GPUs only), clock.
- ``versions``: torch, transformers, python, longdoc_commit. ``model``: name,
  parameters, dtype, weight_bytes_per_step, kv_bytes_per_token. ``settings``: the
  options (incl. ``tasks`` and ``usd_per_device_hour``). ``warm_up_s``: making the one
  engine and warming it up (CPU kernel plan; compiled steps on CUDA); ``engine``: its
  ``describe()``. ``notes``: how to read the figures. ``cpu_checks`` (CPU runs): the
  CPU comparisons with ``passed`` true/false/null (null: not measured in this run).
- ``systems``: per system name (SYSTEMS) ``status`` ok | skipped | error, with ``reason``.
- ``results``: one record per (task, batch size): ``task``, ``batch_size``,
  ``prefill_s`` (ours), ``hf_prefill_s``, ``systems`` (per system: status, tokens,
  seconds, prefill_s, tok_s, decode_tok_s, ms_per_step, steps, first_call_s (wall
  seconds of the warm-up call: for hf-static-compiled, compilation), peak_memory_GB
  (CUDA only); our drafting systems also drafted, accepted, acceptance), ``step_ms``
  (our loop by width: ms, mean_width), ``agreement_with_longdoc`` (per other system:
  rows, rows_identical, first_divergence, first_divergence_by_row) with
  ``agreement_dtype``, ``ratio_vs_hf_static_compiled``, ``decode_ratio_vs_hf_dynamic``,
  ``pld_over_greedy``, ``suffix_over_greedy``, ``pld_over_hf_pld_decode``, ``roofline``
  (weights_tok_s, weights_kv_tok_s, bytes_per_step), ``nightly`` (per ok system:
  batch_s, docs_per_hour, device_hours_per_1k, usd_per_1k_docs; pipeline/bench/nightly.py).

Files: ``<out>/decode-<device name>-<model>.json`` and ``.md`` (names slugged), so a
rerun on the same device and model replaces its table and git keeps the history.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from pipeline.host_load import cpu_label

#: The compared systems, in table order (names are part of the JSON layout).
SYSTEMS = ("longdoc", "longdoc-pld", "longdoc-suffix", "hf-dynamic", "hf-static-compiled", "hf-pld")

DEFAULT_OUT = "jobs/results/bench-decode"


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def result_paths(result: dict, out_dir: str | Path) -> tuple[Path, Path]:
    stem = f"decode-{slug(result['device']['name'])}-{slug(result['model']['name'])}"
    if result.get("settings", {}).get("dtype", "auto") != "auto":  # an fp32 and a bf16 run do not collide
        stem += f"-{slug(result['settings']['dtype'])}"
    out = Path(out_dir)
    return out / f"{stem}.json", out / f"{stem}.md"


# What must match for records of an earlier run to join this run's table.
_SAME = (("device", "name"), ("model", "name"), ("model", "dtype"), ("settings", "prompt_tokens"),
         ("settings", "new_tokens"), ("settings", "ignore_eos"), ("settings", "corpus"), ("settings", "tasks"))


def merge_previous(result: dict, path: Path) -> dict:
    """``result`` plus the records of the file at ``path`` for batch sizes this run lacks,
    when that file was written for the same device, model and settings (``--merge``:
    a table whose batch sizes were run in separate commands, e.g. under a time limit).
    Each record keeps its own ``created_utc`` and ``longdoc_commit``."""
    if not path.is_file():
        return result
    old = json.loads(path.read_text())
    if old.get("layout_version") != result["layout_version"] or any(
        old.get(a, {}).get(b) != result[a].get(b) for a, b in _SAME
    ):
        return result
    have = {_key(r) for r in result["results"]}
    kept = [r for r in old.get("results", []) if _key(r) not in have]
    return dict(result, results=sorted(kept + result["results"], key=_key))


def _key(rec: dict) -> tuple[str, int]:
    return rec.get("task", "summarize"), rec["batch_size"]


def _label(rec: dict) -> str:
    """A record's row label: its batch size, with its task when not a summary."""
    task = rec.get("task", "summarize")
    return f"{rec['batch_size']}" if task == "summarize" else f"{task} {rec['batch_size']}"


def write_results(result: dict, out_dir: str | Path, merge: bool = False) -> tuple[Path, Path]:
    """Write the JSON and the Markdown table (``merge``: see merge_previous); returns their paths."""
    js, md = result_paths(result, out_dir)
    if merge:
        result = merge_previous(result, js)
    js.parent.mkdir(parents=True, exist_ok=True)
    js.write_text(json.dumps(result, indent=1) + "\n")
    md.write_text(markdown(result))
    return js, md


def _f(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _cell(rec: dict, system: str) -> str:
    r = rec["systems"].get(system, {})
    if r.get("status") == "ok":
        return _f(r["tok_s"])
    return r.get("status", "–")


def markdown(result: dict) -> str:
    """The results as Markdown: throughput, step cost, agreement, notes."""
    d, m, s = result["device"], result["model"], result["settings"]
    v = result["versions"]
    lines = [
        f"# bench decode: {m['name']} on {d['name']}",
        "",
        f"{m['parameters'] / 1e9:.3f}B parameters, {m['dtype']}; {s['prompt_tokens']}-token prompts, "
        f"{s['new_tokens']} new tokens, greedy. torch {v['torch']}, transformers {v['transformers']}, "
        f"longdoc {v['longdoc_commit']}, {result['created_utc']}. Engine: {result.get('engine')}"
        + (f", warmed up (steps compiled) in {result['warm_up_s']:.1f} s." if result.get("warm_up_s") is not None else "."),
        f"Memory bandwidth: {_f(d['bandwidth_measured_GBps'], 0)} GB/s measured (copy, read + write)"
        + (f", {_f(d['bandwidth_nominal_GBps'], 0)} GB/s nominal" if d.get("bandwidth_nominal_GBps") else "")
        + f"; {m['weight_bytes_per_step'] / 1e9:.3f} GB of weights per step. Clock: {d['clock']}."
        + (f" CPU: {cpu}." if (cpu := cpu_label(d.get("cpu") or {})) else ""),
        "",
        f"Command: `{result['command']}`",
        "",
        "## Output tokens/s (prefill + decode)",
        "",
        "| batch | " + " | ".join(SYSTEMS) + " | roofline (weights) | roofline (weights+KV) "
        "| longdoc / hf-static-compiled | longdoc-pld / longdoc |",
        "|---" * (len(SYSTEMS) + 5) + "|",
    ]
    for rec in result["results"]:
        ratio = rec.get("ratio_vs_hf_static_compiled") or {}
        lines.append(
            f"| {_label(rec)} | " + " | ".join(_cell(rec, x) for x in SYSTEMS)
            + f" | {_f(rec['roofline']['weights_tok_s'])} | {_f(rec['roofline']['weights_kv_tok_s'])}"
            + f" | {_f(ratio.get('longdoc'), 2)} | {_f(rec.get('pld_over_greedy'), 2)} |"
        )
    lines += ["", "## Decode only: tokens/s and ms per step (prefill subtracted)", "",
              "| batch | " + " | ".join(SYSTEMS) + " |", "|---" * (len(SYSTEMS) + 1) + "|"]
    for rec in result["results"]:
        cells = []
        for x in SYSTEMS:
            r = rec["systems"].get(x, {})
            cells.append(f"{_f(r.get('decode_tok_s'))} ({_f(r.get('ms_per_step'), 2)} ms)"
                         if r.get("status") == "ok" else r.get("status", "–"))
        lines.append(f"| {_label(rec)} | " + " | ".join(cells) + " |")
    lines += ["", "## First (warm-up) call seconds, hf-static-compiled's includes compilation "
              "(the static engine's warm-up is in the header); peak GPU memory GB",
              "", "| batch | " + " | ".join(SYSTEMS) + " |", "|---" * (len(SYSTEMS) + 1) + "|"]
    for rec in result["results"]:
        cells = []
        for x in SYSTEMS:
            r = rec["systems"].get(x, {})
            mem = f"; {r['peak_memory_GB']:.1f} GB" if r.get("peak_memory_GB") is not None else ""
            warm = f" + {_f(r['warm_up_s'])} s warm-up" if r.get("warm_up_s") is not None else ""
            cells.append(f"{_f(r.get('first_call_s'))} s{warm}{mem}" if r.get("status") == "ok"
                         else r.get("status", "–"))
        lines.append(f"| {_label(rec)} | " + " | ".join(cells) + " |")
    widths = sorted({int(w) for rec in result["results"] for w in rec.get("step_ms", {})})
    if widths:
        lines += ["", "## Our decode loop: ms per step by verify width (mean fed width)", "",
                  "| batch | " + " | ".join(f"w={w}" for w in widths) + " |", "|---" * (len(widths) + 1) + "|"]
        for rec in result["results"]:
            sm = rec.get("step_ms", {})
            cells = [
                f"{_f(sm[str(w)]['ms'], 2)} ({_f(sm[str(w)]['mean_width'], 1)})" if "ms" in sm.get(str(w), {})
                else "–" for w in widths
            ]
            lines.append(f"| {_label(rec)} | " + " | ".join(cells) + " |")
    dtypes = sorted({r["agreement_dtype"] for r in result["results"] if r.get("agreement_dtype")}) or [m["dtype"]]
    lines += ["", f"## Agreement with longdoc greedy in {', '.join(dtypes)} (rows identical; first divergence, tokens)",
              "",
              "| batch | " + " | ".join(SYSTEMS[1:]) + " | PLD acceptance |", "|---" * len(SYSTEMS) + "|---|"]
    for rec in result["results"]:
        ag = rec.get("agreement_with_longdoc", {})
        cells = [f"{ag[x]['rows_identical']:.0%}; {_f(ag[x]['first_divergence'], 0)}" if x in ag else "–"
                 for x in SYSTEMS[1:]]
        acc = rec["systems"].get("longdoc-pld", {}).get("acceptance")
        lines.append(f"| {_label(rec)} | " + " | ".join(cells) + f" | {_f(acc, 2)} |")
    lines += _nightly_lines(result)
    earlier = [r for r in result["results"] if r.get("created_utc", result["created_utc"]) != result["created_utc"]]
    if earlier:
        lines += ["", "Merged from earlier runs (--merge): " + "; ".join(
            f"{_label(r)} ({r['created_utc']}, longdoc {r.get('longdoc_commit')})" for r in earlier) + "."]
    not_ok = {x: r for x, r in result["systems"].items() if r["status"] != "ok"}
    if not_ok:
        lines += ["", "## Systems not run or failed", ""]
        lines += [f"- {x}: {r['status']} ({r.get('reason', '')})" for x, r in not_ok.items()]
    if result.get("cpu_checks"):
        lines += ["", "## CPU checks (decode-only tokens/s, side by side in this run)", ""]
        lines += [f"- {_verdict(c['passed'])} {c['check']}" for c in result["cpu_checks"]]
    lines += ["", "## Notes", ""] + [f"- {n}" for n in result.get("notes", [])]
    return "\n".join(lines) + "\n"


def _nightly_lines(result: dict) -> list[str]:
    """The derived nightly-job table (pipeline/bench/nightly.py; its formula is in the notes)."""
    s = result["settings"]
    if not any(r.get("nightly") for r in result["results"]):
        return []
    price = s.get("usd_per_device_hour") or 0
    # No price given (the decode bench has no spec: CostSpec's default is 0): every cell said
    # "$0.000", as if the night were free; say there is no price instead.
    at = f"at ${price:g}/device-hour" if price else "not priced (no --usd-per-device-hour given)"
    lines = ["", f"## Nightly job (derived): documents/hour; $ per 1,000 documents {at} "
             f"({s['prompt_tokens']}-token documents, {s['new_tokens']} new tokens each)", "",
             "| batch | " + " | ".join(SYSTEMS) + " |", "|---" * (len(SYSTEMS) + 1) + "|"]
    for rec in result["results"]:
        ni = rec.get("nightly", {})
        cells = [f"{ni[x]['docs_per_hour']:,.0f}; {_usd(ni[x]['usd_per_1k_docs']) if price else '$ –'}"
                 if x in ni else "–" for x in SYSTEMS]
        lines.append(f"| {_label(rec)} | " + " | ".join(cells) + " |")
    return lines


def _usd(v: float) -> str:
    """Dollars with three significant digits below $1 (a cheap night is not "$0.000")."""
    return f"${v:,.2f}" if v >= 1 else f"${v:.3g}"


def _verdict(passed: bool | None) -> str:
    return {True: "PASS", False: "FAIL", None: "n/a "}[passed]


def summary_lines(rec: dict) -> list[str]:
    """Short console lines for one (task, batch size) record."""
    parts = [f"{x} {_cell(rec, x)}" for x in SYSTEMS if rec["systems"].get(x, {}).get("status") != "skipped"]
    line = (f"{rec.get('task', 'summarize')} B={rec['batch_size']}: tok/s " + ", ".join(parts)
            + f" | roofline {_f(rec['roofline']['weights_tok_s'])}")
    ag = rec.get("agreement_with_longdoc", {}).get("longdoc-pld")
    extra = f"  PLD=greedy rows {ag['rows_identical']:.0%}" if ag else ""
    dec = rec.get("decode_ratio_vs_hf_dynamic") or {}
    ratios = ", ".join(f"{x} {v:.2f}" for x, v in dec.items() if x != "hf-dynamic")
    return [line + extra] + ([f"  decode-only vs hf-dynamic: {ratios}"] if ratios else [])


def check_lines(result: dict) -> list[str]:
    """PASS/FAIL lines of the CPU checks, for the console."""
    if not result.get("cpu_checks"):
        return []
    return ["# CPU checks (decode-only tokens/s, side by side in this run):"] + [
        f"  {_verdict(c['passed'])} {c['check']}" for c in result["cpu_checks"]]
