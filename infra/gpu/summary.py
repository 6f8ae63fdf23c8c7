"""The GPU session's figures against their targets (decode speed, AutoCompressor NLL, Finch), as Markdown.

Reads what ``infra/gpu/session.sh`` leaves in its work folder (whatever is there: a part
cut short simply has no line) and prints one section per part:
- a: every ``decode-*.json`` under ``WORK/a-*`` (pipeline/bench/results.py layout):
  per batch size tok/s of each system, prompt lookup / greedy (target at B=8: >= 1.5x,
  never < 0.95x) and the rows where prompt lookup equals greedy (the dtype's agreement);
- b: ``WORK/ac-run/train_log.csv`` (steps, first/last loss) and ``WORK/nll_heldout.json``
  (pipeline/studies/autocompressor_heldout.py; target: recovered >= 0.40 of the gap);
- c: ``WORK/finch-e2e.json`` (infra/gpu/finch_e2e.py; target <= 0.7x).

Standard library only.  ``python3 infra/gpu/summary.py WORK``
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path


def decode_lines(work: Path) -> list[str]:
    lines = []
    for js in sorted(work.glob("a-*/decode-*.json")):
        d = json.loads(js.read_text())
        lines += [f"### {js.parent.name}: {d['model']['name']} {d['model']['dtype']} on {d['device']['name']}",
                  f"engine: {d.get('engine', '?')}; warm-up {d.get('warm_up_s', '–')} s", ""]
        for r in d["results"]:
            tok_s = ", ".join(f"{k} {v['tok_s']:.1f}" if v.get("status") == "ok" else f"{k} {v.get('status')}"
                              for k, v in r["systems"].items())
            ag = r.get("agreement_with_longdoc", {}).get("longdoc-pld")
            pog = r.get("pld_over_greedy")
            b = r["batch_size"]
            verdict = ""
            if pog is not None:
                need = 1.5 if b == 8 else 0.95
                verdict = f" ({'met' if pog >= need else 'NOT met'}: target >= {need}x)"
            lines.append(f"- B={b}: tok/s {tok_s}")
            lines.append(f"  - prompt lookup / greedy: {pog:.2f}x{verdict}" if pog is not None else
                         "  - prompt lookup / greedy: –")
            if ag:
                lines.append(f"  - PLD == greedy rows: {ag['rows_identical']:.0%} of {ag['rows']} "
                             f"(first divergence {ag['first_divergence']})")
        lines.append("")
    return lines


def train_lines(work: Path) -> list[str]:
    lines = []
    log = work / "ac-run" / "train_log.csv"
    if log.is_file():
        rows = list(csv.DictReader(log.open()))
        if rows:
            n = max(1, min(20, len(rows) // 5))
            first = sum(float(r["loss"]) for r in rows[:n]) / n
            last = sum(float(r["loss"]) for r in rows[-n:]) / n
            lines.append(f"- AutoCompressor training: {rows[-1]['step']} steps, {int(float(rows[-1]['tokens'])):,} "
                         f"tokens in {float(rows[-1]['elapsed_s']):.0f} s; loss (mean of {n}) {first:.3f} -> {last:.3f}")
    nll = work / "nll_heldout.json"
    if nll.is_file():
        m = json.loads(nll.read_text())
        mean = m["mean"]
        rec = mean["recovered"]
        lines.append(f"- held-out NLL ({m['docs']} docs, {m['compression']:.2f}x): none {mean['none']:.3f}, "
                     f"full {mean['full']:.3f}, trunc {mean['trunc']:.3f}, ac_none {mean['ac_none']:.3f}, "
                     f"ac {mean['ac']:.3f} -> recovered {rec:.0%} of the gap "
                     f"({'met' if rec >= 0.4 else 'NOT met'}: target >= 40% at >= 8x)")
    return lines


def finch_lines(work: Path) -> list[str]:
    js = work / "finch-e2e.json"
    if not js.is_file():
        return []
    d = json.loads(js.read_text())
    med = d["median"]
    return [f"- Finch {d['prompt_tokens']} -> {d['target']} + decode {d['new_tokens']} ({d['engine']}): "
            f"full {med['full']['e2e_s']:.3f} s (prefill {med['full']['prefill_s']:.3f}), finch "
            f"{med['finch']['e2e_s']:.3f} s (compress {med['finch']['prefill_s']:.3f}) -> "
            f"{d['finch_over_full_e2e']:.2f}x ({'met' if d['target_met'] else 'NOT met'}: target <= 0.7x)"]


def summary(work: str | Path) -> str:
    work = Path(work)
    out = ["# GPU session figures", ""]
    for title, lines in (("a: bench decode, embedded model", decode_lines(work)),
                         ("b: AutoCompressor on the GPU", train_lines(work)),
                         ("c: Finch end to end", finch_lines(work))):
        out += [f"## {title}", ""] + (lines or ["(no result)"]) + [""]
    return "\n".join(out)


if __name__ == "__main__":
    print(summary(sys.argv[1] if len(sys.argv) > 1 else ".bench/device/work"))
