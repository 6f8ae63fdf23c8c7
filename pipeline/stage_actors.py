"""The classes the plan hands Ray Data for the model stages' actor pools.

Why: Ray Data takes a callable class for an actor pool and pickles it by reference, so
whoever builds the plan imports the module that defines it. stages/tokenize.py and
stages/generate.py reach torch, transformers and the decode engine (~4 s of CPU on the
2-core development machine, more while Ray starts beside it, and the memory they hold),
which the driver never uses. Each class here names its stage and imports it only in
the actor's constructor, inside the Ray worker that runs it.

The classes keep the stages' names (``TokenizeStage``, ``GenerateStage``): Ray names
operators and actors after the class (``MapWorker(MapBatches(GenerateStage))``), and
operators, tests and logs find the pools by those names.

Contract: ``cls(**fn_constructor_kwargs)`` builds the stage named by ``cls.target``
(``"module:Class"``) with the same keyword arguments; calling the instance calls the
stage's ``__call__`` with the batch and returns its result unchanged. Importing this
module imports no torch (tests/pipeline/test_stage_actors.py).

``GenerateStage`` also takes ``engine_board``, the name of the run's engine board
(pipeline/engine_board.py; the Ray runner passes it, the stage never sees it): the actor
then posts its engine's numbers there from a daemon thread, for the driver's progress
line, until the actor ends. A board that is gone or never answers fails no row.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any, ClassVar


class _StageInActor:
    target: ClassVar[str]  # "module:Class" of the stage, imported in the actor

    def __init__(self, **kwargs: Any) -> None:
        module, _, name = self.target.partition(":")
        self.stage = getattr(importlib.import_module(module), name)(**kwargs)

    def __call__(self, batch: Any) -> Any:
        return self.stage(batch)


class TokenizeStage(_StageInActor):
    """stages.tokenize.TokenizeStage, imported in the tokenize actor."""

    target = "stages.tokenize:TokenizeStage"


class GenerateStage(_StageInActor):
    """stages.generate.GenerateStage, imported in the generate actor; it reports its engine
    to ``engine_board`` when named (module docstring)."""

    target = "stages.generate:GenerateStage"

    def __init__(self, engine_board: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reports_stop = threading.Event()  # set: the reporting thread ends (the actor's end ends it too)
        if engine_board:
            from pipeline.engine_board import post_reports

            # The engine exists once the stage is made (its model loaded, warmed up): the
            # first report says what it holds, not that a model loads.
            threading.Thread(target=post_reports, args=(engine_board, self.stage.engine.snapshot, self.reports_stop),
                             name="longdoc-engine-reports", daemon=True).start()
