"""An optional interface for the eval's language-model scoring: ``ConditionsContinuations``.

Why apart from ``CompressionMethod`` (base.py): a runtime needs a method's settings, its
place in the pipeline and its prefill; continuation NLL (`longdoc eval --metrics nll`,
pipeline/eval/nll.py) is an eval-only way of conditioning a model. The eval conditions
every method the same way by default (pipeline/eval/conditioning.py: the method's text
compression of the earlier text, then its own prefill with an empty query). A method
whose conditioned state is something else implements this interface; the eval checks
for it with ``isinstance`` and never branches on method names.

Contract of ``scoring_condition(job, device) -> (loaded, condition)``: load the model and
a conditioner. ``condition(start_ids, earlier_ids, query_tokens)`` conditions
``loaded.model`` on ``start_ids`` (kept whole, not counted) plus ``earlier_ids`` (a
document's earlier text) compressed by this method at the job's settings, and on nothing
else; the returned state's ``last_logits`` predict the continuation's first token and
``forward_step`` continues it. ``context_tokens`` = entries (or summary vectors) derived
from ``earlier_ids``, ``compress_s`` = seconds. The query of a query-guided method is
the last ``query_tokens`` tokens of ``earlier_ids`` (no question exists in LM scoring).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from schemas.spec import JobSpec
    from stages.compression.base import Loaded
    from stages.decoding.state import CompressedPrefill

#: (start_ids, earlier_ids, query_tokens) -> CompressedPrefill whose state's next token
#: is the continuation's first.
Condition = Callable[[list[int], list[int], int], "CompressedPrefill"]


@runtime_checkable
class ConditionsContinuations(Protocol):
    """A method that conditions LM scoring its own way (see the module contract)."""

    def scoring_condition(self, job: JobSpec, device: torch.device) -> tuple[Loaded, Condition]: ...
