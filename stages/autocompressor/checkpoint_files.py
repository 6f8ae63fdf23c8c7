"""What an AutoCompressor checkpoint folder says, read without torch: its format, its base
model, its summary form, which checkpoint a job uses and why one cannot serve it.

Why apart from checkpoint.py (which loads and saves the weights): `validate` and `run` ask
these before any model loads, and importing torch would cost them seconds. The format
itself is described in checkpoint.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from schemas.spec import EMBEDDED_MODEL

FORMAT = "longdoc-autocompressor"
CONFIG_FILE = "autocompressor.json"
SHIPPED_DIR = Path(__file__).parent / "checkpoints"
SUMMARY_FORMS = ("vectors", "kv")  # model.ACConfig.summary_form; the first is the default
SHIPPED: dict[str, dict[str, str]] = {
    EMBEDDED_MODEL: {"vectors": "smollm2-135m-instruct", "kv": "smollm2-135m-instruct-kv"},
}


def shipped_checkpoint(model: str, form: str = "vectors") -> Path | None:
    """The checkpoint of summary form ``form`` shipped for base model ``model``, or None."""
    name = SHIPPED.get(model, {}).get(form)
    return SHIPPED_DIR / name if name and is_own_checkpoint(SHIPPED_DIR / name) else None


def checkpoint_form(checkpoint: str) -> str:
    """The summary form of a checkpoint: ours say it (absent before the kv form: vectors);
    the published princeton-nlp checkpoints are summary vectors."""
    if is_own_checkpoint(checkpoint):
        return str(read_own_config(checkpoint).get("summary_form", "vectors"))
    return "vectors"


def resolve_checkpoint(checkpoint: str | None, model: str, form: str | None = None) -> str:
    """``checkpoint`` when given (ValueError when ``form`` is given and the checkpoint is of
    another form), else the shipped one of ``form`` (default vectors) for ``model`` (the
    generating model); ValueError naming ``compression.checkpoint`` when neither exists."""
    if form is not None and form not in SUMMARY_FORMS:
        raise ValueError(f"summary_form {form!r}; allowed: {', '.join(SUMMARY_FORMS)}")
    if checkpoint:
        got = checkpoint_form(checkpoint)
        if form is not None and got != form:
            raise ValueError(
                f"compression.checkpoint {checkpoint!r} is of summary form {got!r}, but "
                f"compression.summary_form is {form!r}; allowed: set summary_form to {got!r} "
                "or leave it unset (the checkpoint's own form is used)"
            )
        return checkpoint
    form = form or SUMMARY_FORMS[0]
    shipped = shipped_checkpoint(model, form)
    if shipped is None:
        have = ", ".join(f"{m} ({f})" for m, forms in SHIPPED.items() for f in forms if shipped_checkpoint(m, f)) or "none"
        raise ValueError(
            f"compression.checkpoint is not set and no AutoCompressor checkpoint of summary form "
            f"{form!r} ships for generation.model {model!r} (shipped for: {have}); allowed: set "
            "compression.checkpoint to a directory saved by `longdoc train-autocompressor` "
            "or a published princeton-nlp AutoCompressor"
        )
    return str(shipped)


def checkpoint_problems(checkpoint: str | None, model: str, form: str | None = None) -> list[str]:
    """Why the checkpoint ``resolve_checkpoint`` picks cannot serve generation.model ``model``,
    read from its files before any model loads (one line each, naming the fix; [] when it
    can or when it is not a folder here: a hub id is the model checks')."""
    try:
        chosen = resolve_checkpoint(checkpoint, model, form)
    except ValueError as e:
        return [str(e)]
    path = Path(chosen).expanduser()
    if not path.is_dir():
        return []
    field = f"compression.checkpoint {chosen!r}"
    if is_own_checkpoint(path):
        base = str(read_own_config(path).get("base_model", ""))
        if same_model(base, model):
            return []  # generation.model's own checks say whether it loads from here
        if not _model_here(base) and (model.endswith("/" + base) or not _hub_like(base)):
            # generation.model names the same folder by another path: the checkpoint loads its
            # base from the path it holds, which is not found from here
            return [f"{field}: its base model {base!r} is not on this machine (not a folder from here: a "
                    "relative path is read from the folder longdoc runs in; nor in the Hugging Face cache), "
                    "and the checkpoint loads its base from there; fix: run from the folder it was trained "
                    f"in, or write the model's absolute path (or hub id) into {path / CONFIG_FILE}'s base_model"]
        return [f"{field} was trained on {base!r}, but generation.model is {model!r}: the checkpoint's "
                f"model is the one that generates, and the rows would name another; fix: --set "
                f"generation.model={base}"]
    if (path / "last").is_dir():
        return [f"{field} is an unfinished training run (only its resumable state, in last/); fix: finish it "
                f"with `longdoc train-autocompressor --out {chosen} --resume` (its other settings as before), "
                f"or copy what it has with `--out {chosen} --export DIR` and name DIR"]
    config = path / "config.json"
    try:
        published = config.is_file() and "summary_length" in json.loads(config.read_text())
    except (OSError, ValueError):
        published = False
    if not published:
        return [f"{field} is neither a folder saved by `longdoc train-autocompressor` ({CONFIG_FILE}) nor a "
                "published AutoCompressor (config.json with summary_length); fix: name one of those, or leave "
                "compression.checkpoint unset for the shipped one"]
    return []


def _model_here(name: str) -> bool:
    """Whether model ``name`` loads from here without a download: shipped or built, a folder,
    or a hub id in the Hugging Face cache."""
    if name.startswith(("embedded:", "random:")) or Path(name).expanduser().exists():
        return True
    from huggingface_hub import try_to_load_from_cache

    return _hub_like(name) and isinstance(try_to_load_from_cache(name, "config.json"), str)


def _hub_like(name: str) -> bool:
    """Whether ``name`` reads as a Hugging Face id (``org/name``), not as a path."""
    return name.count("/") == 1 and not name.startswith((".", "/", "~")) and "://" not in name


def same_model(a: str, b: str) -> bool:
    """Whether two model names name one model: equal, or local paths to one folder."""
    if a == b:
        return True
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()


def is_own_checkpoint(path: str | Path) -> bool:
    return (Path(path) / CONFIG_FILE).is_file()


def tokenizer_source(checkpoint: str) -> str:
    """Where the checkpoint's tokenizer comes from: our format names its base model;
    a published checkpoint ships its own tokenizer."""
    return read_own_config(checkpoint)["base_model"] if is_own_checkpoint(checkpoint) else checkpoint


# ----------------------------------------------------------------------------- our format


def read_own_config(path: str | Path) -> dict[str, Any]:
    meta = json.loads((Path(path) / CONFIG_FILE).read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(
            f"{path}: {CONFIG_FILE} is not a {FORMAT} file (format={meta.get('format')!r})"
        )
    return meta
