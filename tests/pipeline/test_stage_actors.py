"""pipeline/stage_actors.py: the model stages as Ray gets them, imported inside the actor.

The driver that builds the plan must not import torch or transformers; the classes keep
the stages' names (Ray names the pools after them) and behave as the stages do."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np

from pipeline import stage_actors
from stages import tokenize


def test_building_a_plan_imports_no_model_stack() -> None:
    code = ("import sys, pipeline.plan, pipeline.runner, pipeline.cli; "
            "print(','.join(m for m in ('torch', 'transformers') if m in sys.modules) or 'none')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "none"


def test_the_classes_keep_the_stage_names_ray_shows() -> None:
    assert stage_actors.GenerateStage.__name__ == "GenerateStage"
    assert stage_actors.TokenizeStage.__name__ == "TokenizeStage"
    for cls in (stage_actors.GenerateStage, stage_actors.TokenizeStage):
        module, _, name = cls.target.partition(":")
        assert name == cls.__name__ and module.startswith("stages.")


def test_an_actor_class_builds_its_stage_and_returns_what_the_stage_returns(tiny_model_dir) -> None:
    spec = {"name": "t", "input": {"uri": "/unused"}, "generation": {"model": str(tiny_model_dir)},
            "compression": {"method": "truncate", "target_tokens": 8}}
    actor = stage_actors.TokenizeStage(spec=spec)
    direct = tokenize.TokenizeStage(spec=spec)
    assert isinstance(actor.stage, tokenize.TokenizeStage)
    batch = {"request_id": np.array(["r1"]), "text": np.array(["one two three four five six seven eight nine ten"]),
             "error": np.array([None], dtype=object), "error_kind": np.array([None], dtype=object),
             "prompt": np.array(["Summarize."]), "question": np.array([None], dtype=object)}
    got, want = actor(dict(batch)), direct(dict(batch))
    assert got.keys() == want.keys()
    for key in set(want) - {"compress_s"}:  # a timing, not a result
        assert [list(x) if isinstance(x, (list, np.ndarray)) else x for x in got[key]] == \
               [list(x) if isinstance(x, (list, np.ndarray)) else x for x in want[key]], key


def test_the_generate_actor_reports_its_engine_to_the_board_it_is_named(ray_session, tiny_model_dir) -> None:
    """The wrapper takes the board's name (the stage never sees it) and, once the engine is
    made, posts its numbers there from a thread of its own (pipeline/engine_board.py)."""
    from pipeline.engine_board import board_name, open_board

    spec = {"name": "t", "input": {"uri": "/unused"}, "generation": {"model": str(tiny_model_dir)}}
    view = open_board(board_name("t-actor"), stale_s=30.0)
    actor = None
    try:
        actor = ray_session.remote(num_cpus=0, max_restarts=0)(stage_actors.GenerateStage).remote(
            spec=spec, engine_board=view.name)
        deadline = time.monotonic() + 120.0
        while not view.snapshots() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert view.activity() == "engine: 0 decoding (0 tokens), 0 prefilling, 0 queued"
        assert view.progress()[:4] == (0, 0, 0, 0)  # nothing done or decoding yet
    finally:
        if actor is not None:
            ray_session.kill(actor)
        view.close()
