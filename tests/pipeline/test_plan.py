"""The plan's pieces that need no Ray: the column chain and how many batches a generate actor holds."""

from __future__ import annotations

import pytest

from pipeline.plan import (
    ROWS_IN_FLIGHT,
    StageColumns,
    check_chain,
    generate_batches_in_flight,
    stage_chain,
)
from schemas.loading import spec_from_dict


def _spec(**resources):
    return spec_from_dict({"name": "p", "input": {"uri": "/unused"}, "resources": resources})


def test_an_actor_holds_enough_batches_to_keep_its_engine_full():
    # auto slots on CPU: 64 rows in flight -> 16 batches of 4, plus one waiting.
    assert generate_batches_in_flight(_spec(batch_size=4)) == ROWS_IN_FLIGHT["cpu"] // 4 + 1
    assert generate_batches_in_flight(_spec(batch_size=4, num_gpus=1)) == 64  # 256 rows: capped
    assert generate_batches_in_flight(_spec(batch_size=8, decode_slots=16)) == 3  # 2 batches + 1 waiting
    assert generate_batches_in_flight(_spec(batch_size=512)) == 2  # never fewer than 2


def test_the_chain_is_checked_before_anything_runs():
    check_chain(stage_chain(_spec()))
    with pytest.raises(ValueError, match="stage b needs columns \\['x'\\]"):
        check_chain([StageColumns("a", (), ("y",)), StageColumns("b", ("x",), ())])
