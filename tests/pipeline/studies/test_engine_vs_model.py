"""The engine-against-the-model study: a sliding-window model saved to a folder, prompts longer
than its window; every prompt's engine text equals the model's own."""

from __future__ import annotations

from tiny_models import windowed_lm

from pipeline.studies.engine_vs_model import main


def test_a_windowed_model_from_a_folder_decodes_as_itself(tmp_path, qa_set, tokenizer, capsys):
    folder = tmp_path / "gemma3-tiny"
    windowed_lm(len(tokenizer), "gemma3").save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    main(["--model", str(folder), "--input", str(qa_set), "--lengths", "40,25,9", "--new-tokens", "8",
          "--chunk", "16"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith(f"model {folder}: prompts of [40, 25, 9] tokens, 8 greedy tokens each")
    assert lines[1:] == [
        "engine, speculative none, prefill chunks of 16: 3/3 prompts equal; equal tokens [8, 8, 8]",
        "engine, speculative prompt_lookup, prefill chunks of 16: 3/3 prompts equal; equal tokens [8, 8, 8]",
    ]
