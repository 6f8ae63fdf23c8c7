"""Decoding: the prefill->decode contract (state.py), the plain reference decoder
(reference.py), and the batched prompt-lookup speculative engine: one decode loop
(engine.py) over a per-actor state (engine_state.py) and a device step backend
(backend.py; CPU: cpu_backend.py with the measured kernel plan of linear_plan.py)."""
