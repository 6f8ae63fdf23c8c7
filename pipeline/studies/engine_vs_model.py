"""Does the decode engine continue a model's prompts as the model itself does?

For a model a user brings (any id or path ``load_causal_lm`` takes), prompts are cut from the
first document of a JSONL (``text`` field) at the given token counts; each is continued
greedily by the model's own forwards (the whole sequence each step, no cache, no mask:
transformers builds every layer's mask itself, sliding windows included) and by the engine
(stages/decoding/engine.py: its slots, chunked prefill and attention), without drafts and
with prompt-lookup drafts. Prints one line per engine setting: the prompts whose tokens
are all equal, and the equal tokens of each. A model whose layers attend within a window
shorter than the longest prompt (Gemma 3: 512) checks the engine's windows
(stages/decoding/forward.py ``windowed``).

    python -m pipeline.studies.engine_vs_model --model /path/to/model \\
        [--input jobs/sample-qa.jsonl] [--lengths 1300,700,300] [--new-tokens 24] [--chunk 256]

Results: jobs/results/code-choices.md ("stages/decoding/forward.py windowed").
"""

from __future__ import annotations

import argparse
import json


def compare(model_name: str, input_path: str, lengths: list[int], new_tokens: int, chunk: int,
            dtype: str = "float32") -> list[str]:
    """One line per engine setting (see the module doc)."""
    import torch

    from stages.decoding.config import DecodeConfig
    from stages.decoding.engine import Engine
    from stages.decoding.request import Request
    from stages.model_loading import load_causal_lm
    from stages.prompting import PromptParts

    model, tok = load_causal_lm(model_name, dtype)
    with open(input_path) as f:
        text = json.loads(f.readline())["text"]
    ids = tok(text, add_special_tokens=False)["input_ids"]
    if len(ids) < max(lengths):
        raise ValueError(f"the first document has {len(ids)} tokens, fewer than --lengths' {max(lengths)}")
    prompts = [ids[:n] for n in lengths]
    own = []
    with torch.inference_mode():
        for p in prompts:
            seq = torch.tensor([p])
            for _ in range(new_tokens):
                seq = torch.cat([seq, model(seq, logits_to_keep=1).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
            own.append(seq[0, len(p):].tolist())
    lines = [f"model {model_name}: prompts of {lengths} tokens, {new_tokens} greedy tokens each"]
    for speculative in ("none", "prompt_lookup"):
        cfg = DecodeConfig(max_new_tokens=new_tokens, eos_ids=frozenset({-1}), speculative=speculative,
                           num_draft_tokens=4, adaptive=False)
        engine = Engine(model, cfg, slots=len(prompts), expected_tokens=max(lengths) + new_tokens,
                        chunk_tokens=chunk)
        requests = [Request(i, PromptParts([], list(p), []), list(p), 0) for i, p in enumerate(prompts)]
        got = [o.result.tokens for o in engine.run(requests)]
        same = [sum(a == b for a, b in zip(g, r, strict=True)) for g, r in zip(got, own, strict=True)]
        equal = sum(g == r for g, r in zip(got, own, strict=True))
        lines.append(f"engine, speculative {speculative}, prefill chunks of {chunk}: "
                     f"{equal}/{len(prompts)} prompts equal; equal tokens {same}")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--input", default="jobs/sample-qa.jsonl")
    ap.add_argument("--lengths", default="1300,700,300", help="prompt lengths in tokens, comma-separated")
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--chunk", type=int, default=256, help="the engine's prefill chunk")
    args = ap.parse_args(argv)
    lengths = [int(n) for n in args.lengths.split(",")]
    print("\n".join(compare(args.model, args.input, lengths, args.new_tokens, args.chunk)))


if __name__ == "__main__":
    main()
