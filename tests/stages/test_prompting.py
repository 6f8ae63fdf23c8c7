"""Chat prompts in three parts (stages/prompting.py): prefix + context + query is the
tokenizer's own chat template around the document, the question last."""

from __future__ import annotations

import copy

from stages.prompting import PromptBuilder, PromptParts, render_template, user_message

DOC = "The Danube flows through ten countries."


def test_the_parts_are_the_chat_template_around_the_document(tokenizer):
    builder = PromptBuilder(tokenizer)
    doc = builder.encode_text(DOC)
    parts = builder.build(doc, "Answer briefly.", "Which river is it?")
    assert parts.context_ids == doc and parts.full_ids == parts.prefix_ids + doc + parts.query_ids
    assert len(parts) == len(parts.full_ids)
    expected = tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Document:\n{DOC}\n\nAnswer briefly.\n\nQuestion: Which river is it?"}],
        tokenize=False, add_generation_prompt=True,
    )
    assert tokenizer.decode(parts.full_ids) == expected
    assert tokenizer.decode(parts.query_ids).startswith("\n\nAnswer briefly.\n\nQuestion: Which river is it?")


def test_summaries_have_no_question_and_the_frame_is_cached(tokenizer):
    builder = PromptBuilder(tokenizer)
    before, after = render_template(tokenizer, "Summarize.", None)
    assert "Question:" not in after and after.startswith("\n\nSummarize.")
    assert builder.frame("Summarize.", None) is builder.frame("Summarize.", None)
    prefix, query = builder.frame("Summarize.", None)
    assert builder.overhead_tokens("Summarize.", None) == len(prefix) + len(query)
    assert builder.build([], "Summarize.", None) == PromptParts(list(prefix), [], list(query))


def test_a_tokenizer_without_a_chat_template_gets_a_plain_prompt(tokenizer):
    base = copy.deepcopy(tokenizer)
    base.chat_template = None
    before, after = render_template(base, "Answer briefly.", "Which river is it?")
    assert before == "Document:\n"
    assert after == "\n\nAnswer briefly.\n\nQuestion: Which river is it?\n\nAnswer:"
    assert user_message("Summarize.", None) == "Document:\n\u27e6LONGDOC_DOCUMENT\u27e7\n\nSummarize."
