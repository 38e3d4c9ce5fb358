"""Recall's brake (kernels.recall_brake) on scripted selections, in the torch path and the Triton kernel: a row
whose recalls do not pay (what they bring in is not selected again) backs off (every 2^level steps, quota >>
level), the first probe that pays after the workload settles resumes it, and a block flickering into the selection for one step is never recalled.
The policy model (tests/oracle/policy.py) is run beside it on the same script."""

import pytest
import torch
from oracle import policy
from support import TRITON_DEVICE, requires_triton

from scout_sglang.config import ScoutConfig
from scout_sglang.kernels.recall_brake import LEVEL, WAIT, RecallBrake, new_runs, new_state
from scout_sglang.kernels.stage_recall import bring_in
from scout_sglang.kernels.step_counters import BACKED_OFF, NUM_COUNTERS, RECALLED, WITHHELD
from scout_sglang.layout import PAD_BLOCK

IMPLS = ["torch", pytest.param("triton", marks=[requires_triton, pytest.mark.triton_interpret])]
RESIDENT, TOPK, BLOCKS, BLOCK, DIM = 4, 6, 256, 4, 8


class Row:
    """One (request, KV head) row of scout's recall, driven step by step through kernels.stage_recall.bring_in."""

    def __init__(self, impl, *, min_selected=1, brake=True, max_backoff=3, cap=RESIDENT):
        self.impl, self.device = impl, TRITON_DEVICE if impl == "triton" else "cpu"
        dev = self.device
        self.resident = torch.full((2, 1, RESIDENT), PAD_BLOCK, dtype=torch.int32, device=dev)
        self.host_k = torch.arange(BLOCKS + 1, dtype=torch.float32).view(-1, 1, 1, 1).expand(-1, 1, BLOCK, DIM)
        self.host_k = self.host_k.contiguous().to(dev)
        self.dev_k = torch.zeros(RESIDENT + 1, 1, BLOCK, DIM, device=dev)
        self.dev_v = torch.zeros_like(self.dev_k)
        self.brake = RecallBrake(new_runs(2, 1, BLOCKS, dev), new_state(2, 1, RESIDENT, dev) if brake else None,
                                 torch.zeros(1, dtype=torch.int32, device=dev), min_selected=min_selected,
                                 max_backoff=max_backoff)
        self.cap = cap
        self.position = 100
        self.model = (policy.Brake(), {}, [policy.EMPTY] * RESIDENT)  # the policy's brake, runs and row
        self.min_selected, self.with_brake, self.max_backoff = min_selected, brake, max_backoff

    def step(self, selected: list[int]) -> int:
        """Decode one step whose selection is `selected` (best first); the CPU list is what the row does not hold.
        -> blocks recalled; checks the row, the counters and the copies against the policy."""
        dev, self.position = self.device, self.position + 1
        row = self.resident[1, 0].tolist()
        cpu = [j for j in selected if j not in row]
        pad = lambda blocks, n: torch.tensor([blocks + [PAD_BLOCK] * (n - len(blocks))], dtype=torch.int32)  # noqa: E731
        counters = torch.zeros(NUM_COUNTERS, dtype=torch.int32, device=dev)
        self.brake.positions.fill_(self.position)
        scores = -torch.arange(BLOCKS, dtype=torch.float32).view(1, 1, BLOCKS)  # lower blocks score higher
        bring_in(self.resident, torch.tensor([1], dtype=torch.int32, device=dev),
                 resident_pages=torch.arange(RESIDENT, dtype=torch.int32, device=dev).view(1, RESIDENT),
                 host_table=torch.arange(BLOCKS, dtype=torch.int32, device=dev).view(1, BLOCKS), host_k=self.host_k,
                 host_v=self.host_k, dev_k=self.dev_k, dev_v=self.dev_v,
                 selected=pad(selected, TOPK).view(1, 1, TOPK).to(dev),
                 counts=torch.tensor([[len(selected)]], dtype=torch.int32, device=dev),
                 num_full=torch.tensor([BLOCKS], dtype=torch.int32, device=dev),
                 forced_blocks=torch.full((1, 3), PAD_BLOCK, dtype=torch.int32, device=dev),
                 quota=torch.tensor([[self.cap]], dtype=torch.int32, device=dev), recall="cpu",
                 scores=scores.to(dev), cpu_blocks=pad(cpu, TOPK).view(1, 1, TOPK).to(dev),
                 cpu_counts=torch.tensor([[len(cpu)]], dtype=torch.int32, device=dev),
                 recall_due=torch.ones(1, dtype=torch.int32, device=dev), brake=self.brake, counters=counters,
                 impl=self.impl)
        after = self.resident[1, 0].tolist()
        moved = [j for j in after if j not in row]
        assert int(counters[RECALLED]) == len(moved)
        for slot, block in enumerate(after):  # each recalled block's K is its host page (value = block index)
            if block in moved:
                assert torch.all(self.dev_k[slot, 0].cpu() == block)
        model_brake, model_runs, model_row = self.model
        config = ScoutConfig(recall_min_selected=self.min_selected, recall_brake=self.with_brake,
                             recall_max_backoff=self.max_backoff)
        expected, _, _ = policy.scout_recall(model_row, config=config, brake=model_brake, runs=model_runs,
                                             selected=selected, cpu=cpu, scores=scores[0, 0], due=True, cap=self.cap,
                                             position=self.position)
        assert after == expected, f"step at {self.position}: row {after}, the policy's {expected}"
        self.model = (model_brake, model_runs, expected)
        if self.brake.state is not None:
            state = self.brake.state[1, 0].tolist()
            assert (state[LEVEL], state[WAIT]) == (model_brake.level, model_brake.wait)
            assert int(counters[BACKED_OFF]) == int(state[LEVEL] > 0)
        self.withheld = int(counters[WITHHELD])
        return len(moved)

    @property
    def level(self) -> int:
        return int(self.brake.state[1, 0, LEVEL])


def churn(step: int) -> list[int]:
    """A selection of fresh blocks every step (never seen before, up to step 39): whatever recall brings in is gone
    from the next selection."""
    return [16 + TOPK * step + i for i in range(TOPK)]


@pytest.mark.parametrize("impl", IMPLS)
def test_a_row_whose_recalls_do_not_pay_backs_off_and_resumes_when_the_selection_settles(impl, lookup):
    row = Row(impl, max_backoff=3)
    recalls = {t: row.step(churn(t)) for t in range(30)}
    # Level n waits 2^n - 1 steps after its failed recall is judged: recalls at 0, 2, 6, 14, then every 8 steps.
    assert [t for t, moved in recalls.items() if moved] == [0, 2, 6, 14, 22]
    assert [recalls[t] for t in (0, 2, 6, 14, 22)] == [4, 2, 1, 1, 1]  # the cap (4) halved per level, at least 1
    assert row.level == 3
    settled = [1, 2, 3, 5, 8, 13]
    moves = [row.step(settled) for _ in range(12)]
    first = next(i for i, moved in enumerate(moves) if moved)
    assert first <= 7  # the next probe, within 2^3 steps
    assert row.level == 0  # it paid: what it brought in is selected again
    assert sum(moves[first + 1:]) == RESIDENT - 1  # back to full speed: the buffer filled at once


@pytest.mark.parametrize("impl", IMPLS)
def test_without_the_brake_a_churning_row_recalls_every_step(impl):
    row = Row(impl, brake=False)
    assert [row.step(churn(t)) for t in range(8)] == [RESIDENT] * 8


@pytest.mark.parametrize("impl", IMPLS)
def test_a_block_is_recalled_only_once_selected_in_consecutive_steps(impl, lookup):
    row = Row(impl, min_selected=2, brake=False)
    assert row.step([1, 2]) == 0 and row.withheld == 2  # selected once: withheld
    assert row.step([3, 4]) == 0 and row.withheld == 2  # 1 and 2 left; 3 and 4 are new
    assert row.step([1, 3]) == 1 and row.withheld == 1  # 3 ran two steps: recalled; 1 came back, its run restarts
    assert row.step([1, 3]) == 1 and row.withheld == 0  # 1 now ran two steps
    assert row.step([1, 3, 9]) == 0 and row.withheld == 1  # both held; 9 is new
    assert row.resident[1, 0].tolist()[:2] == [3, 1]


@pytest.mark.parametrize("impl", IMPLS)
def test_the_cap_bounds_every_recall(impl):
    row = Row(impl, brake=False, cap=1)
    assert [row.step(churn(t)) for t in range(5)] == [1] * 5
    row = Row(impl, brake=False, cap=0)
    assert [row.step(churn(t)) for t in range(3)] == [0] * 3


def test_the_hysteresis_refuses_contexts_its_positions_cannot_count():
    from scout_sglang.core.engine import CoAttentionEngine
    from scout_sglang.core.shape import ModelShape

    shape = ModelShape(num_layers=2, num_qo_heads=2, num_kv_heads=1, head_dim=8)
    with pytest.raises(ValueError, match="23 bits"):  # checked before anything is allocated
        CoAttentionEngine(ScoutConfig(recall_min_selected=2), shape, max_tokens_per_request=1 << 23)
