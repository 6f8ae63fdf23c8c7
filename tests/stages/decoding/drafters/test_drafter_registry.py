"""The drafter registry: every module is found, names are what the spec accepts, and a new
drafter is one module (shown by adding one on the fly)."""

from __future__ import annotations

import sys
import textwrap

import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from schemas.generation_spec import SpeculativeSpec, speculative_methods
from stages.decoding import drafters
from stages.decoding.config import DecodeConfig
from stages.decoding.drafters import NONE, drafter_for, drafter_names, registry
from stages.decoding.drafters.base import Draft, Drafter
from stages.decoding.drafters.prompt_lookup import PromptLookup
from stages.decoding.drafters.suffix import SuffixDrafter


def test_every_drafter_is_registered_and_the_spec_accepts_exactly_them():
    found = dict(registry())  # the shipped ones, and any drafter module added since
    assert found["prompt_lookup"] is PromptLookup and found["suffix"] is SuffixDrafter
    assert all(issubclass(cls, Drafter) and cls.name == name for name, cls in found.items())
    assert drafter_names() == (NONE, *found) == speculative_methods()
    assert drafter_for(DecodeConfig(max_new_tokens=4, eos_ids=frozenset())) is None
    made = drafter_for(DecodeConfig(max_new_tokens=4, eos_ids=frozenset(), speculative="suffix"))
    assert isinstance(made, SuffixDrafter)
    with pytest.raises(ValueError, match="allowed: none, prompt_lookup, suffix"):  # at least these
        SpeculativeSpec(method="medusa")


def test_adding_a_drafter_is_adding_a_module(tmp_path, monkeypatch):
    """A module dropped into the package is picked up by the registry and the spec."""
    mod = tmp_path / "repeat_last.py"
    mod.write_text(textwrap.dedent('''
        from stages.decoding.drafters.base import Draft, Drafter

        class RepeatLast(Drafter):
            name = "repeat_last"
            summary = "the last token again"

            def __init__(self, config):
                super().__init__(config)
                self.last = {}

            def begin(self, row, lookup_ids):
                self.last[row] = lookup_ids[-1]

            def extend(self, row, tokens):
                self.last[row] = tokens[-1]

            def propose(self, rows, limits):
                return [Draft([self.last[r]] * k, 1) for r, k in zip(rows, limits)]
    '''))
    monkeypatch.setattr(drafters, "__path__", [*drafters.__path__, str(tmp_path)])
    registry.cache_clear()
    try:
        assert "repeat_last" in registry() and SpeculativeSpec(method="repeat_last").method == "repeat_last"
        # ... and `longdoc methods` shows it with its summary: the one place users find drafters
        shown = CliRunner().invoke(app, ["methods"], env={"COLUMNS": "200"})
        assert shown.exit_code == 0 and "repeat_last" in shown.output and "the last token again" in shown.output
    finally:
        registry.cache_clear()
        sys.modules.pop("stages.decoding.drafters.repeat_last", None)


def test_a_drafter_must_implement_propose_and_drafts_carry_a_level():
    class Incomplete(Drafter):
        name = "incomplete"
        summary = "no propose"

    with pytest.raises(TypeError, match="propose"):
        Incomplete(DecodeConfig(max_new_tokens=4, eos_ids=frozenset()))
    assert Draft.none() == Draft([], 0) and Draft([5], ("outputs", 2)).level == ("outputs", 2)


def test_the_drafters_are_listed_by_the_registry_not_by_hand():
    """The spec's description and the job docs listed `prompt_lookup` and `suffix` by hand: a
    new drafter was accepted but named nowhere a user reads. They point to `longdoc methods`."""
    description = SpeculativeSpec.model_fields["method"].description or ""
    assert [name for name in registry() if name in description] == []
    assert "longdoc methods" in description
    shown = CliRunner().invoke(app, ["methods"], env={"COLUMNS": "200"})
    assert all(f" {name} " in shown.output for name in drafter_names()), shown.output
    assert all(cls.summary.split(" (")[0] in shown.output for cls in registry().values())
