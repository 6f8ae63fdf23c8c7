"""Decoding: the prefill->decode contract (state.py), the plain reference decoder
(reference.py) and the batched prompt-lookup speculative engine (engine.py)."""
