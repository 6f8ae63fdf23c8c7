"""Chat prompts split into the parts that compression strategies treat differently.

Contract: a prompt is ``prefix_ids + context_ids + query_ids`` where
- ``prefix_ids``: the chat template up to the document (system turn, user header,
  the "Document:" label). Always kept whole.
- ``context_ids``: the document tokens, tokenized on their own so that truncation,
  RAG and Finch budgets are exact in the generating model's tokens.
- ``query_ids``: everything after the document: the instruction, the question (qa),
  the end of the user turn and the assistant header. Finch scores the cache with
  the attention of exactly these tokens.
Rendering uses the tokenizer's own chat template (with a plain fallback for base
models without one, whose answers end at ``PLAIN_PROMPT_STOPS``), split around a placeholder.
"""

from __future__ import annotations

from dataclasses import dataclass

_PLACEHOLDER = "\u27e6LONGDOC_DOCUMENT\u27e7"
QUESTION_LABEL = "Question: "  # the question's line in the user turn


@dataclass(frozen=True)
class PromptParts:
    prefix_ids: list[int]
    context_ids: list[int]
    query_ids: list[int]

    @property
    def full_ids(self) -> list[int]:
        return self.prefix_ids + self.context_ids + self.query_ids

    def __len__(self) -> int:
        return len(self.prefix_ids) + len(self.context_ids) + len(self.query_ids)


def user_message(instruction: str, question: str | None) -> str:
    """The user turn with the document placeholder; the question (qa) comes last."""
    body = f"Document:\n{_PLACEHOLDER}\n\n{instruction}"
    if question:
        body += f"\n\n{QUESTION_LABEL}{question}"
    return body


def query_text(tokenizer, query_ids: list[int]) -> str:
    """What a prompt asks, as text: the question of a qa prompt (the rest of the line after
    the last ``QUESTION_LABEL``), else the decoded query without special tokens (the
    instruction of a summary)."""
    text = tokenizer.decode(list(query_ids), skip_special_tokens=True)
    head, sep, tail = text.rpartition(QUESTION_LABEL)
    if sep:
        return tail.split("\n", 1)[0].strip()
    return text.strip()


#: Where an answer to the plain prompt ends (models without a chat template): a base model
#: that has answered goes on with the prompt's own pattern, a new "Question:" or "Answer:"
#: line, or another "Document:" (seen with Gemma 3 270M, answers followed by invented pairs).
PLAIN_PROMPT_STOPS = ("\nQuestion:", "\nAnswer:", "\nDocument:")


def has_chat_template(tokenizer) -> bool:
    """Whether prompts for ``tokenizer`` use its chat template (else the plain prompt)."""
    return bool(getattr(tokenizer, "chat_template", None))


def prompt_stops(tokenizer) -> tuple[str, ...]:
    """Stop strings the prompt format itself implies: ``PLAIN_PROMPT_STOPS`` for the plain
    prompt; none for a chat template (its end-of-turn token is an EOS id)."""
    return () if has_chat_template(tokenizer) else PLAIN_PROMPT_STOPS


def render_template(tokenizer, instruction: str, question: str | None) -> tuple[str, str]:
    """Return the (before, after) text around the document for this tokenizer."""
    content = user_message(instruction, question)
    if has_chat_template(tokenizer):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )
    else:  # base models: a plain completion-style prompt
        text = f"{content}\n\nAnswer:"
    before, sep, after = text.partition(_PLACEHOLDER)
    assert sep, "chat template dropped the document placeholder"
    return before, after


def adds_bos(tokenizer) -> bool:
    """Whether ``tokenizer`` starts an encoded text with its BOS token, as
    ``tokenizer(text)`` (what the model was trained and is usually run with) does. Asked of
    the tokenizer itself, not of its ``add_bos_token`` flag: a fast tokenizer may add BOS in
    its post-processor while the flag says False (Gemma 3's in transformers 5), and Gemma
    without BOS echoes its prompt."""
    bos = tokenizer.bos_token_id
    if bos is None:
        return False
    ids = list(tokenizer("a")["input_ids"])
    return bool(ids) and ids[0] == bos


class PromptBuilder:
    """Builds PromptParts for one tokenizer, caching the rendered template pieces."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._bos = tokenizer.bos_token_id if adds_bos(tokenizer) else None
        self._cache: dict[tuple[str, str | None], tuple[list[int], list[int]]] = {}

    def encode_text(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def frame(self, instruction: str, question: str | None) -> tuple[list[int], list[int]]:
        key = (instruction, question)
        if key not in self._cache:
            before, after = render_template(self.tokenizer, instruction, question)
            prefix = self.encode_text(before)
            # Templates that do not write BOS themselves get it where the tokenizer would
            # add it to a text of its own (``adds_bos``).
            if self._bos is not None and (not prefix or prefix[0] != self._bos):
                prefix = [self._bos] + prefix
            self._cache[key] = (prefix, self.encode_text(after))
        return self._cache[key]

    def build(self, context_ids: list[int], instruction: str, question: str | None) -> PromptParts:
        prefix, query = self.frame(instruction, question)
        return PromptParts(prefix_ids=list(prefix), context_ids=list(context_ids), query_ids=list(query))

    def overhead_tokens(self, instruction: str, question: str | None) -> int:
        prefix, query = self.frame(instruction, question)
        return len(prefix) + len(query)
