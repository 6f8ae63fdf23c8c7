"""stages/compression/lm_scoring.py: ``ConditionsContinuations`` is an optional, structural
interface: the eval finds it with ``isinstance``, on any class with ``scoring_condition``,
never by a method's name."""

from __future__ import annotations

from stages.compression import registry
from stages.compression.base import CompressionMethod
from stages.compression.lm_scoring import ConditionsContinuations


def test_isinstance_finds_exactly_the_methods_that_define_scoring_condition():
    own = {name for name, m in registry().items() if isinstance(m, ConditionsContinuations)}
    defining = {name for name, m in registry().items() if callable(getattr(type(m), "scoring_condition", None))}
    assert own == defining
    assert "finch" in own and "none" not in own  # finch's query sits in its cache; none is a plain prefill
    assert not hasattr(CompressionMethod, "scoring_condition")  # not part of every method's contract


def test_the_interface_is_structural():
    class OwnConditioning:
        def scoring_condition(self, job, device):
            return None, None

    class Plain:
        def load(self, job, device):
            return None

    assert isinstance(OwnConditioning(), ConditionsContinuations)
    assert not isinstance(Plain(), ConditionsContinuations)
