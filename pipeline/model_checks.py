"""Whether the models a spec names can be loaded from here, before any model loads
(`validate` and `run`, through pipeline/preflight.py; also the eval's checks).

Contract:
- ``model_problems(spec)``: one line per model the run loads (``generation.model``, and a
  method's ``compression.scorer`` or ``compression.embedder``: schemas/loading.py
  ``named_models``) that cannot be found from this machine, naming the field and the fix;
  then the readers a method runs Finch's attention with, when of a model type it cannot
  read (only when every model was found).
- ``model_problem(field, name, kind)``: that line for one model. Found: an embedded or
  ``random:`` name, a Hugging Face id in the local cache or one the hub answers for within
  the connect timeout, or a local model folder with a config.json, its weights (a
  safetensors file's header and size agreeing: a copy or download cut short is named) and,
  for a generating model or scorer, its tokenizer's files.
A name found nowhere used to cost the model load's retries and end in transformers'
traceback-like network error; a folder saved without its tokenizer ended every generate
actor in a 600-line Ray traceback. A cluster's nodes have their own disks and caches, so a
run on one leaves the check to them. Imports neither Ray nor torch.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from pipeline.local_write import write_error
from schemas.checks import shown
from schemas.environment import looks_local, named_models
from schemas.spec import EMBEDDED_MODEL, EMBEDDED_NAMES, JobSpec
from stages.cache_paths import cache_dir, embedded_model_folder

#: Seconds to wait for the Hugging Face hub to answer about a model id.
HUB_TIMEOUT_S = 2.0
#: Files that hold a model's weights, one of which a local model folder needs.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
#: Files a tokenizer is loaded from, any one of which counts (a fast tokenizer's JSON, its
#: config, SentencePiece and tiktoken models, BPE and WordPiece vocabularies): the check is
#: for a folder saved without its tokenizer at all, never a refusal of a family's layout.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "merges.txt")
TOKENIZER_SUFFIXES = (".model", ".tiktoken")  # spiece.model, sentencepiece.bpe.model, qwen.tiktoken


def model_problems(spec: JobSpec) -> list[str]:
    """Lines for the models ``spec`` loads that cannot be loaded from here (module contract)."""
    # A checkpoint folder here has its own layout: its method reads it (``problems``); one
    # that is no folder here is a hub id, found like a model (a missing local path with ./
    # or / is the spec check's, schemas/loading.py).
    from stages.compression import method_for

    problems = [p for field, name, key in named_models(spec)
                if (key != "checkpoint" or not Path(name.removeprefix("file://")).expanduser().exists())
                and (p := model_problem(field, name, key))]
    return problems or method_for(spec.compression).problems(spec) or _reader_problems(spec)


def _reader_problems(spec: JobSpec) -> list[str]:
    """The models a method reads with Finch's attention (``attention_readers``) are of a model
    type it runs on, where their config.json is on this machine (else the generate actor
    checks at its start). Before: a Gemma generator under select passed `validate` and every
    row of the run failed, as retryable, after the model loaded."""
    from stages.compression import method_for
    from stages.finch.config import FINCH_MODEL_TYPES

    problems = []
    method_type = method_for(spec.compression)
    for field, name in method_type.attention_readers(spec):
        kind = _model_type(name)
        if kind is None or kind in FINCH_MODEL_TYPES:
            continue
        method = spec.compression.method
        fix = method_type.reader_fix(spec, field, name)
        problems.append(f"{field}: {shown(name)} is a {kind!r} model; compression.method {method} reads with "
                        f"Finch's attention, which runs on {', '.join(FINCH_MODEL_TYPES)} models; fix: {fix}, "
                        "or another method (truncate, bm25, rag)")
    return problems


def _model_type(name: str) -> str | None:
    """``model_type`` of model ``name`` from its config.json on this machine (a local folder or
    the Hugging Face cache; the embedded and ``random:`` models are Llamas); None when its
    config is not here."""
    if name.startswith(("embedded:", "random:")):
        return "llama"
    path = Path(name.removeprefix("file://")).expanduser() / "config.json"
    if not path.is_file():
        import huggingface_hub

        cached = huggingface_hub.try_to_load_from_cache(name, "config.json") if "/" in name else None
        if not isinstance(cached, str):
            return None
        path = Path(cached)
    try:
        kind = json.loads(path.read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None  # the model load will say what is wrong with it
    return kind if isinstance(kind, str) else None


def model_problem(field: str, name: str, kind: str = "model") -> str | None:
    """One line when model ``name`` (the spec's ``field``; ``kind`` ``model``, ``scorer`` or
    ``embedder``) cannot be found from this machine, else None (see the module doc)."""
    if name.startswith(("embedded:", "random:")):
        # Shipped packages / built here (the spec already checked the names); the bundled
        # generator is converted into the cache first.
        return _cache_problem(field, name)
    shipped = ", ".join(EMBEDDED_NAMES.get(kind, ()))
    fix = (f"fix: a local model folder (config.json and weights), a Hugging Face id downloaded where the "
           f"job runs, or the shipped {shipped}" if kind != "checkpoint" else
           "fix: a folder saved by `longdoc train-autocompressor`, a published AutoCompressor (a Hugging Face "
           "id downloaded where the job runs), or no compression.checkpoint for the shipped one")

    path = Path(name.removeprefix("file://")).expanduser()
    if path.exists():
        if path.is_dir() and any((path / f).is_file() for f in ("config.json", "modules.json")):
            return _folder_problem(field, name, path, kind)
        what = "a folder without config.json" if path.is_dir() else "a file, not a model folder"
        return f"{field}: {shown(name)} is {what}; {fix}"
    if looks_local(name) or name.count("/") > 1:
        return f"{field}: no folder {shown(name)} on this machine; {fix}"
    ids = [name] + ([f"sentence-transformers/{name}"] if kind == "embedder" and "/" not in name else [])
    import huggingface_hub

    if any(isinstance(huggingface_hub.try_to_load_from_cache(i, "config.json"), str) for i in ids):
        return None
    meant = [e for e in EMBEDDED_NAMES.get(kind, ()) if e.removeprefix("embedded:") == name.lower()]
    if meant:  # the shipped model's name without its prefix (and not downloaded under it)
        return f"{field}: {shown(name)} is not downloaded here; the shipped model of that name is {meant[0]}"
    if any(os.environ.get(v) not in (None, "", "0") for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")):
        return (f"{field}: {shown(name)} is not a local folder and not in the Hugging Face cache, and the hub "
                f"is switched off (HF_HUB_OFFLINE); {fix}")
    from huggingface_hub.utils import RepositoryNotFoundError

    try:
        huggingface_hub.model_info(ids[-1], timeout=HUB_TIMEOUT_S)
        return None
    except RepositoryNotFoundError:
        return (f"{field}: {shown(name)} is not a local folder and the Hugging Face hub has no such model "
                f"(a private or gated one needs `hf auth login`); {fix}")
    except Exception as e:  # noqa: BLE001 - no network, a proxy, a timeout: one line each
        first = (str(e).strip().splitlines() or [""])[0][:200]
        return (f"{field}: {shown(name)} is not a local folder and not in the Hugging Face cache, and the hub "
                f"cannot be reached ({type(e).__name__}: {first}); {fix}")




def _cache_problem(field: str, name: str) -> str | None:
    """One line when the bundled generator must first be converted into the cache
    (``stages/cache_paths.py`` ``embedded_model_folder``, not there yet) for ``name`` and the
    cache's ``models/`` folder cannot be made or written, else None. The bundled generator is
    converted for its weights; a ``random:`` draw for its tokenizer (the bundled one), unless
    that is there. Before: `validate` passed, and `run` loaded, then aborted with a bare
    "FileNotFoundError: '/proc/nope'" naming neither the variable nor the fix. A ``random:``
    draw's own weights are kept in the cache when it can be written, else drawn for the
    process only (stages/model_loading.py ``random_model_dir``)."""
    needs = {EMBEDDED_MODEL: "model.safetensors"}.get(name, "tokenizer.json" if name.startswith("random:") else None)
    if needs is None or (embedded_model_folder() / needs).is_file():
        return None  # another shipped name (read from its package), or converted already: only read
    _, e = write_error(embedded_model_folder().parent)  # models/, or its nearest existing folder
    if e is not None:
        what = "its weights" if name == EMBEDDED_MODEL else "its tokenizer, the bundled one"
        return (f"{field}: {shown(name)} needs the bundled model converted into the cache folder first ({what}), "
                f"and {shown(str(cache_dir()))} "
                f"(LONGDOC_CACHE, default ~/.cache/longdoc) cannot be written ({e.strerror or type(e).__name__}); "
                "fix: set LONGDOC_CACHE to a writable folder, or unset it")
    return None


def _folder_problem(field: str, name: str, path: Path, kind: str) -> str | None:
    """A local model folder (config.json found) without weights, with a damaged safetensors
    file, or (a generating model or scorer) without a tokenizer; None when it looks whole.
    A sentence-transformers folder (modules.json) keeps its parts in subfolders: not looked into."""
    if (path / "modules.json").is_file():
        return None
    try:
        names = [f.name for f in path.iterdir() if f.is_file()]
    except OSError as e:
        return f"{field}: {shown(name)} cannot be listed ({e.strerror or e}); fix: make the folder readable"
    weights = sorted(path / n for n in names if n.endswith(WEIGHT_SUFFIXES))
    if not weights:
        return (f"{field}: {shown(name)} has a config.json but no weights ({', '.join('*' + s for s in WEIGHT_SUFFIXES)}); "
                "fix: save the model into it (model.save_pretrained(folder)) or finish the download")
    for f in weights:
        if f.suffix == ".safetensors" and (why := _damaged_safetensors(f)):
            return (f"{field}: {shown(name)}: its weights file {f.name} is damaged ({why}); fix: copy or "
                    "download it again")
    has_tokenizer = any(n in TOKENIZER_FILES or n.endswith(TOKENIZER_SUFFIXES) for n in names)
    if kind in ("model", "scorer") and not has_tokenizer:
        return (f"{field}: {shown(name)} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}, "
                f"{', '.join('*' + s for s in TOKENIZER_SUFFIXES)}); fix: save "
                "the tokenizer beside the model (tokenizer.save_pretrained(folder)), as the model was")
    return None


def _damaged_safetensors(path: Path) -> str | None:
    """Why a safetensors file cannot be whole, read from its header alone (8 bytes of
    header length, a JSON header, then the tensors it places): None when the size agrees."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if 8 + n > size:
                return f"{size} bytes, shorter than its own header says"
            header = json.loads(f.read(n))
    except (OSError, ValueError, struct.error, UnicodeDecodeError):
        return "its header cannot be read"
    if not isinstance(header, dict):
        return "its header is not a table of tensors"
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)
            and isinstance(v.get("data_offsets"), list) and len(v["data_offsets"]) == 2
            and isinstance(v["data_offsets"][1], int)]
    if ends and 8 + n + max(ends) > size:
        return f"{size} bytes where its tensors need {8 + n + max(ends)}: cut short"
    return None
