"""A small toolkit for code that reads or edits a model's KV cache directly.

Finch (stages/finch/) and the AutoCompressor (stages/autocompressor/) both run a
causal LM's decoder themselves and reshape what it cached; these are the parts they
share, each with one job:

- model_parts.py: the decoder stack inside a causal LM (through wrappers such as
  PEFT's), its attention modules and its rotary embedding;
- rope.py: moving cached keys to other positions (RoPE re-rotation), and which RoPE
  variants allow it;
- slots.py: keeping some cache slots of every layer, gathering slots per KV head,
  and stacking per-row caches into one left-padded batch;
- queries.py: capturing the post-RoPE queries of a pass's last rows without eager
  attention.

Nothing here knows about compression methods; stages.decoding.state owns the
PrefillState contract these caches end up in.
"""
