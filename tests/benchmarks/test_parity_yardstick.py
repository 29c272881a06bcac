"""The yardstick the device parity runs judge kern by (kern_models.common.random_checkpoint):
kern's logits against transformers fp32 count as right only within transformers' own bf16
spread, and only where that spread is narrow enough to tell anything; the random checkpoints'
sharpening factors carried from a tiny shape's width to a real one."""

from __future__ import annotations

import pytest

from kern_models.common.random_checkpoint import for_width, judge


def row(kl: float, agree: float) -> dict:
    return {"mean_kl": kl, "agree_decisive": agree}


@pytest.mark.parametrize("spread, ours, judgeable, within", [
    (row(0.02, 0.97), row(0.02, 0.97), True, True),      # as close as bf16
    (row(0.02, 0.97), row(0.039, 0.951), True, True),    # at the edges: twice the KL, 2 points less
    (row(0.02, 0.97), row(0.05, 0.97), True, False),     # KL past twice the spread's
    (row(0.02, 0.97), row(0.02, 0.94), True, False),     # agreement 3 points below
    (row(1.85, 0.785), row(1.71, 0.775), False, False),  # a chaotic model's spread passes nothing
])
def test_parity_is_judged_within_the_spread_and_only_where_the_spread_is_narrow(spread, ours, judgeable, within):
    assert judge(spread, ours) == {"judgeable": judgeable, "within_spread": within}


def test_a_factor_is_itself_at_the_tiny_width_and_keeps_a_projection_as_large_elsewhere():
    assert for_width(20.0, 64, 64) == 20.0  # the CI shapes' weights unchanged, bit for bit
    assert for_width(20.0, 64, 2304) == pytest.approx(20.0 / 6)  # outputs grow as sqrt(width)
