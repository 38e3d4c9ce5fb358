"""The recall cap (core/recall_budget.py): from the link and the measured step time, or fixed; split over layers
and rows so that a step's recall never moves more than the cap, every row getting its turn."""

import pytest

from scout_sglang.config import ScoutConfig
from scout_sglang.core.recall_budget import STEP_S_GUESS, RecallBudget, row_caps

BLOCK_BYTES = 16384  # 32 tokens x 128 dims x K and V x bf16


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def budget(clock=None, **fields):
    config = ScoutConfig(**fields)
    return RecallBudget(config, block_bytes=BLOCK_BYTES, num_layers=4, clock=clock or Clock())


def test_the_cap_follows_the_link_and_the_measured_step_time():
    clock = Clock()
    cap = budget(clock, recall_link_gbps=25.0, recall_link_share=0.1)
    assert cap.bytes_per_step() == int(25e9 * 0.1 * STEP_S_GUESS)  # before any step: the guess
    for _ in range(60):  # steps of 50 ms
        cap.observe_step()
        clock.now += 0.05
    assert cap.step_s == pytest.approx(0.05, rel=1e-3)
    assert cap.bytes_per_step() == pytest.approx(25e9 * 0.1 * 0.05, rel=1e-3)
    clock.now += 60.0  # the server idled a minute: counted as twice the estimate at most
    cap.observe_step()
    assert cap.step_s == pytest.approx(0.05 * 1.2, rel=1e-3)
    for _ in range(40):  # a slower regime (steps of 2 s, a CPU server at a large batch) is followed
        clock.now += 2.0
        cap.observe_step()
    assert cap.step_s == pytest.approx(2.0, rel=0.01)
    assert cap.blocks_per_layer() == cap.bytes_per_step() // (BLOCK_BYTES * 4)
    many = 10**6  # rows whose quotas do not bind
    assert cap.cap_bytes(many) <= cap.bytes_per_step() < cap.cap_bytes(many) + BLOCK_BYTES * 4
    assert cap.cap_bytes(2) == min(cap.blocks_per_layer(), 2 * cap.quota) * BLOCK_BYTES * 4  # quotas bind


def test_a_fixed_cap_ignores_the_clock():
    clock = Clock()
    cap = budget(clock, recall_bytes_per_step=10 * BLOCK_BYTES * 4 + 5)
    cap.observe_step()
    clock.now += 3.0
    cap.observe_step()
    assert cap.blocks_per_layer() == 10 and cap.cap_bytes(64) == 10 * BLOCK_BYTES * 4


@pytest.mark.parametrize("blocks", [0, 3, 8, 19, 1000, 1 << 60])
def test_row_caps_never_exceed_the_layer_cap_and_rotate(blocks):
    batch, heads, quota = 2, 4, 16
    seen = [0] * (batch * heads)
    for step in range(batch * heads):
        caps = row_caps(blocks, batch, heads, step, quota)
        assert caps.shape == (batch, heads)
        assert int(caps.sum()) == min(blocks, batch * heads * quota)
        assert int(caps.max()) - int(caps.min()) <= 1 or int(caps.max()) == quota
        for r, cap in enumerate(caps.flatten().tolist()):
            seen[r] += cap
    assert len(set(seen)) == 1  # over a full turn every row got the same


def test_an_empty_step_has_no_rows():
    assert row_caps(5, 0, 4, 0, 8).shape == (0, 4)


def test_a_step_that_decodes_nothing_is_not_a_step_time():
    clock = Clock()
    cap = budget(clock)
    for _ in range(10):  # a graph capture 1 ms after each real step, 50 ms apart
        cap.observe_step()
        clock.now += 0.001
        cap.observe_step(decodes=False)
        clock.now += 0.049
    assert cap.step_s == STEP_S_GUESS  # no interval was next to two decoding steps
    cap.observe_step()
    clock.now += 0.03
    cap.observe_step()
    assert cap.step_s == pytest.approx(STEP_S_GUESS + 0.2 * (0.03 - STEP_S_GUESS))
