"""Chat prompts in three parts (stages/prompting.py): prefix + context + query is the
tokenizer's own chat template around the document, the question last."""

from __future__ import annotations

import copy

from stages.prompting import PromptBuilder, PromptParts, adds_bos, render_template, user_message

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


def test_bos_leads_the_prompt_when_the_tokenizer_adds_it_to_a_text_whatever_its_flag_says(tokenizer):
    """Gemma 3's fast tokenizer (transformers 5) adds BOS in its post-processor and reports
    ``add_bos_token`` False; without BOS the model echoes its prompt."""
    from tokenizers.processors import TemplateProcessing

    assert not adds_bos(tokenizer)  # SmolLM2: neither its flag nor its encoder adds BOS
    before, _ = render_template(tokenizer, "Answer briefly.", None)
    assert PromptBuilder(tokenizer).frame("Answer briefly.", None)[0] == tokenizer(before, add_special_tokens=False)[
        "input_ids"]  # nothing added where the tokenizer adds nothing
    gemma_like = copy.deepcopy(tokenizer)
    gemma_like.chat_template = None
    bos, name = gemma_like.bos_token_id, gemma_like.bos_token
    gemma_like.backend_tokenizer.post_processor = TemplateProcessing(
        single=f"{name} $A", pair=f"{name} $A $B", special_tokens=[(name, bos)])
    assert getattr(gemma_like, "add_bos_token", False) is False
    assert gemma_like("a")["input_ids"][0] == bos and adds_bos(gemma_like)
    prefix, _ = PromptBuilder(gemma_like).frame("Answer briefly.", None)
    assert prefix[0] == bos and prefix[1:] == gemma_like("Document:\n", add_special_tokens=False)["input_ids"]
