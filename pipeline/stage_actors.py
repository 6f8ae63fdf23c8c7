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
"""

from __future__ import annotations

import importlib
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
    """stages.generate.GenerateStage, imported in the generate actor."""

    target = "stages.generate:GenerateStage"
