"""Nightly-job figures derived from a bench batch: documents/hour and $ per 1,000 documents.

What a nightly job of 1,000 long documents costs, from the decode bench's timed calls:
documents/hour and $ per 1,000 documents (`longdoc bench job` measures a whole job). Contract: ``nightly_figures(record, usd_per_device_hour)`` takes one
batch-size record of `bench decode --suite systems` (pipeline/bench/suite.py) and
returns, per system whose status is ok:

- ``batch_s``: seconds of the timed call(s) for the record's ``rows`` documents (B, or
  more in batches of B) = prefill_s + decode_s (their prefill of prompt_tokens-token
  prompts, then new_tokens generated per row);
- ``docs_per_hour`` = 3600 x rows / batch_s (batches of B run back to back);
- ``device_hours_per_1k`` = 1000 / docs_per_hour;
- ``usd_per_1k_docs`` = 1000 x schemas.output.cost_usd(device_s, usd_per_device_hour)
  with device_s = batch_s / B, the output column's per-row device seconds (its
  actor's batch wall time / rows in the batch).

Not included: model load and the one-off warm-up / compilation of an actor
(reported apart by the bench), reading and writing the rows, compression.
"""

from __future__ import annotations

from schemas.output import cost_usd

FORMULA = (
    "Nightly job (derived): a document = one prompt of prompt_tokens tokens generating new_tokens; "
    "batch_s = prefill_s + decode_s of the timed call for B documents (= B x new_tokens / tok_s); "
    "docs/hour = 3600 x B / batch_s; device-hours per 1k docs = 1000 / (docs/hour); "
    "$/1k docs = 1000 x cost_usd(batch_s / B, usd_per_device_hour) = device-hours per 1k x usd_per_device_hour "
    "(schemas/output.py cost_usd, the cost_usd column's model: device_s x usd_per_device_hour / 3600). "
    "Excludes model load and the one-off warm-up/compilation. For a night of 8k-token documents run "
    "with --prompt-tokens 8192."
)


def nightly_figures(record: dict, usd_per_device_hour: float) -> dict[str, dict]:
    """Per ok system of one batch record: batch_s, docs_per_hour, device_hours_per_1k, usd_per_1k_docs."""
    if usd_per_device_hour < 0:
        raise ValueError(f"--usd-per-device-hour {usd_per_device_hour}: allowed: >= 0")
    b = record.get("rows", record["batch_size"])  # documents the timed seconds covered
    out: dict[str, dict] = {}
    for system, r in record["systems"].items():
        if r.get("status") != "ok" or not r.get("seconds"):
            continue
        batch_s = r["seconds"]
        docs_per_hour = 3600.0 * b / batch_s
        out[system] = {
            "batch_s": batch_s,
            "docs_per_hour": docs_per_hour,
            "device_hours_per_1k": 1000.0 / docs_per_hour,
            "usd_per_1k_docs": 1000.0 * cost_usd(batch_s / b, usd_per_device_hour),
        }
    return out
