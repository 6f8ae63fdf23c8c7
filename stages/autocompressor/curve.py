"""The training curve as a PNG: per-step loss (faint) and its running mean, from train_log.csv.

Contract: ``plot_curve(csv_path, png_path, title)`` reads the StepLog CSV (resume.LOG_FIELDS)
and writes a PNG; ValueError when the log has no rows. matplotlib (Agg) is imported lazily.
"""

from __future__ import annotations

from pathlib import Path

from stages.autocompressor.resume import read_log


def running_mean(values: list[float], window: int) -> list[float]:
    """Mean of the last ``window`` values at each index (shorter at the start)."""
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def plot_curve(csv_path: str | Path, png_path: str | Path, title: str = "") -> Path:
    rows = read_log(csv_path)
    if not rows:
        raise ValueError(f"{csv_path}: the training log has no rows to plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [int(r["step"]) for r in rows]
    loss = [float(r["loss"]) for r in rows]
    window = max(1, len(rows) // 20)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, loss, alpha=0.3, lw=0.8, label="loss per step")
    ax.plot(steps, running_mean(loss, window), lw=2, label=f"running mean ({window} steps)")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("next-token loss (nats)")
    ax.set_title(title or "AutoCompressor training")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = Path(png_path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
