"""Budgets that can never fit the generating model's context, found before any model loads.

Contract:
- ``model_context(name)``: the generating model's context length (positions) read from
  configuration only, never weights: ``random:<shape>`` from its shape, the embedded
  default from its known config (``EMBEDDED_CONTEXT``), a local directory from its
  ``config.json``, a Hugging Face id from the ``config.json`` in the local HF cache;
  None when nothing local says (an id never downloaded): the check is then skipped and
  the generate stage's per-row precheck stays the guard.
- A compression method declares what it holds in the context at once
  (``CompressionMethod.budgets``: ``Budget`` items, e.g. ``compression.target_tokens``
  next to the prompt's frame and ``generation.max_new_tokens``); methods that read
  documents of any length (``reads_any_length``) declare theirs too.
- ``budget_problems(spec)``: one ``field: message`` line per budget that cannot fit
  with the prompt's own tokens (chat template, instruction, the longest of
  ``task.questions``), naming the field and the largest value that fits. Questions of
  ``input.question_field`` are unknown here, so the frame is a lower bound: a refusal
  is a budget no request can ever fit, never a guess.
- Cost: no tokenizer is loaded when the budget clears the context by more than the
  frame could take (``FRAME_SLACK`` tokens plus one per byte of instruction and
  question: a byte-level tokenizer never makes more tokens than bytes); only a budget
  near the edge loads the tokenizer to count the frame exactly.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from schemas.spec import EMBEDDED_MODEL, JobSpec
from stages.compression.base import Budget  # defined beside the methods that declare budgets
from stages.model_size import estimate_parameters, kv_bytes_per_token

log = logging.getLogger("longdoc")

#: SmolLM2-135M-Instruct's ``max_position_embeddings`` (the embedded default; its config
#: is only on disk after the GGUF's first conversion, so it is written here and a test
#: checks it against the converted config).
EMBEDDED_CONTEXT = 8192
#: Its shape, for the memory checks (pipeline/memory_fit.py); a test checks it too.
EMBEDDED_SHAPE = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
                  "num_key_value_heads": 3, "head_dim": 64, "intermediate_size": 1536,
                  "vocab_size": 49152, "tie_word_embeddings": True}
#: Tokens a chat template may add around the instruction and question (system turn,
#: role headers, the "Document:" label), beyond one token per byte of those texts. A
#: budget clearing the context by more than this skips the tokenizer; a closer one
#: counts the frame exactly.
FRAME_SLACK = 256


def model_context(name: str) -> int | None:
    """The context length of generation model ``name`` from configuration alone (see module doc)."""
    if name == EMBEDDED_MODEL:
        return EMBEDDED_CONTEXT
    if name.startswith("random:"):
        from stages.random_models import SHAPES, shape_of

        return shape_of(name).max_position_embeddings if name[len("random:"):] in SHAPES else None
    data = _local_config(name)
    if data is None:
        return None
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        if isinstance(data.get(key), int) and data[key] > 0:
            return int(data[key])
    return None


def model_shape(name: str):
    """Generation model ``name``'s config from configuration alone (the sources
    ``model_context`` reads): a ``random:`` shape, the embedded default's known shape, a
    local config.json as a ``SimpleNamespace``; None when nothing local says."""
    from types import SimpleNamespace

    if name == EMBEDDED_MODEL:
        return SimpleNamespace(**EMBEDDED_SHAPE)
    if name.startswith("random:"):
        from stages.random_models import SHAPES, shape_of

        return shape_of(name) if name[len("random:"):] in SHAPES else None
    data = _local_config(name)
    return None if data is None else SimpleNamespace(**data)


def model_parameters(name: str) -> int | None:
    """The generating model's approximate parameter count from configuration alone (the
    sources ``model_context`` reads); None when nothing local says."""
    return _sized(name, estimate_parameters)


def model_kv_bytes(name: str, width: int) -> int | None:
    """KV bytes one token of generation model ``name`` takes at ``width`` bytes an element
    (stages/model_size.py ``kv_bytes_per_token``); None when nothing local says."""
    return _sized(name, lambda shape: kv_bytes_per_token(shape, width))


def _sized(name: str, size) -> int | None:
    shape = model_shape(name)
    if shape is None:
        return None
    try:
        return size(shape)
    except (TypeError, AttributeError, ZeroDivisionError):  # a config without a decoder's fields
        return None


def _local_config(name: str) -> dict | None:
    """Model ``name``'s config.json (its text model's part for a multimodal one) from a local
    folder or the local Hugging Face cache; None when nothing local holds it."""
    path = Path(name.removeprefix("file://")).expanduser()
    config = path / "config.json" if path.is_dir() else None
    if config is None and "/" in name and not name.startswith((".", "/", "~")):
        config = _cached_hub_config(name)
    if config is None or not config.is_file():
        return None
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    return data.get("text_config") or data  # multimodal configs keep the LM's under text_config


def _cached_hub_config(repo: str) -> Path | None:
    return _cached_hub_file(repo, "config.json")


def _cached_hub_file(repo: str, filename: str) -> Path | None:
    """File ``filename`` of Hugging Face id ``repo`` if the local HF cache holds it (no network)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo, filename)
    except Exception:  # a malformed id: the loader reports it where it loads
        return None
    return Path(found) if isinstance(found, str) else None


def _frame_texts(spec: JobSpec) -> tuple[str, str | None]:
    """The instruction and the longest question every request of the spec may carry."""
    questions = sorted(spec.task.questions, key=lambda q: len(q.encode()))
    return spec.task.resolved_instruction, (questions[-1] if questions else None)


def _frame_upper_bound(spec: JobSpec) -> int:
    instruction, question = _frame_texts(spec)
    return FRAME_SLACK + len(instruction.encode()) + len((question or "").encode())


def _frame_exact(spec: JobSpec, tokenizer_source: str) -> int:
    """The prompt's frame in the generating model's tokens (the tokenizer, never the model).

    From the tokenizer's local files with the ``tokenizers`` library and the chat
    template rendered by jinja2 as transformers renders it (well under a second), else
    through transformers (seconds: its import and the tokenizer's load). A test checks
    both agree with ``stages.prompting.PromptBuilder`` on the embedded tokenizer.
    """
    instruction, question = _frame_texts(spec)
    files = tokenizer_files(tokenizer_source)
    if files is not None:
        try:
            return frame_tokens_from_files(files, instruction, question)
        except Exception:  # noqa: BLE001 - an unusual template or file: the slow path below is exact
            log.debug("the frame from %s's files failed; counting through transformers", tokenizer_source,
                      exc_info=True)
    from stages.model_loading import load_tokenizer
    from stages.prompting import PromptBuilder

    return PromptBuilder(load_tokenizer(tokenizer_source)).overhead_tokens(instruction, question)


def tokenizer_files(name: str) -> Path | None:
    """A local folder holding ``tokenizer.json`` for model ``name``, without converting or
    downloading anything; None when there is none."""
    if name == EMBEDDED_MODEL or name.startswith("random:"):
        from stages.cache_paths import embedded_model_folder  # torch-free: a refusal must be quick

        folder = embedded_model_folder()
    else:
        folder = Path(name.removeprefix("file://")).expanduser()
        if not folder.is_dir():
            cached = _cached_hub_file(name, "tokenizer.json")
            folder = cached.parent if cached is not None else folder
    return folder if (folder / "tokenizer.json").is_file() else None


def frame_tokens_from_files(folder: Path, instruction: str, question: str | None) -> int:
    """Tokens of the prompt around the document (stages.prompting's prefix + query) counted
    with ``tokenizers`` over ``folder``'s tokenizer.json and its chat template."""
    import jinja2.sandbox
    from tokenizers import Tokenizer

    from stages.prompting import _PLACEHOLDER, user_message

    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    template = config.get("chat_template")
    if (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text()
    content = user_message(instruction, question)
    if template:
        if not isinstance(template, str):
            raise ValueError("a list of named chat templates")  # the slow path knows which one
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        specials = {k: v for k, v in config.items() if k.endswith("_token") and isinstance(v, str)}
        text = env.from_string(template).render(
            messages=[{"role": "user", "content": content}], add_generation_prompt=True, **specials)
    else:
        text = f"{content}\n\nAnswer:"
    before, sep, after = text.partition(_PLACEHOLDER)
    if not sep:
        raise ValueError("the chat template dropped the document")
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    prefix = tok.encode(before, add_special_tokens=False).ids
    bos = tok.token_to_id(config["bos_token"]) if isinstance(config.get("bos_token"), str) else None
    if bos is not None and config.get("add_bos_token", False) and (not prefix or prefix[0] != bos):
        prefix = [bos, *prefix]
    return len(prefix) + len(tok.encode(after, add_special_tokens=False).ids)


def over_context(doc_id: str, prompt_tokens: int, max_new_tokens: int, context: int) -> str | None:
    """The error of a request whose whole prompt (``prompt_tokens``) and answer cannot fit the
    model's ``context``, else None: a method that prefills documents whole (none) fails such
    a row in the tokenize stage, and the generate stage checks again (its own prompt count)."""
    if prompt_tokens + max_new_tokens <= context:
        return None
    from stages.compression import budgeted_names

    *most, last = budgeted_names()
    return (f"document {doc_id!r} needs {prompt_tokens} prompt tokens + {max_new_tokens} new tokens, more than "
            f"the model's context of {context}; use compression.method {', '.join(most)} or {last}")


def _need(b: Budget, frame_tokens: int, max_new_tokens: int) -> int:
    return (b.value + b.alongside + (frame_tokens if b.frame else 0)
            + (max_new_tokens if b.generation else 0))


def budget_problems(spec: JobSpec) -> list[str]:
    """``field: message`` per budget of ``spec`` that can never fit the model's context."""
    from stages.compression import method_for

    context = model_context(spec.generation.model)
    if context is None:
        return []
    method = method_for(spec.compression)
    max_new = spec.generation.max_new_tokens
    # max_new_tokens is a budget of every method: the answer with at least one context token.
    budgets = [*method.budgets(spec),
               Budget("generation.max_new_tokens", max_new, alongside=1, generation=False,
                      why="the document (at least one)")]
    near = [b for b in budgets if _need(b, _frame_upper_bound(spec), max_new) > context]
    if not near:
        return []
    frame = _frame_exact(spec, method.tokenizer_source(spec))
    problems = []
    for b in near:
        if _need(b, frame, max_new) <= context:
            continue
        largest = b.largest(context, frame, max_new)
        held = [f"the prompt's own {frame} tokens"] if b.frame else []
        if b.alongside:
            held.append(f"{b.alongside} token(s) of {b.why}")
        if b.generation:
            held.append(f"generation.max_new_tokens {max_new}")
        fix = (f"allowed: at most {largest}, the largest that fits" if largest >= 1 else
               "no value fits; lower generation.max_new_tokens" if b.generation else
               "no value fits; lower what it is held with")
        problems.append(
            f"{b.field}: got {b.value}, which cannot fit the context of {spec.generation.model} "
            f"({context} positions) together with {' + '.join(held) or 'nothing else'}; {fix}"
        )
    return problems
