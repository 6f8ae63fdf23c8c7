"""Decoding: the prefill->decode contract (state.py), the plain reference decoder
(reference.py), and the batched speculative engine: one decode loop (engine.py; its
request type in request.py, admission in scheduler.py, drafters in drafters/) over the step
backend of its device (backends/: the contract in backends/base.py, one module per device)."""
