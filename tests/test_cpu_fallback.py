"""The CPU part computed by the layer itself when its CPU task raises or misses its deadline: the same
attention as the task's (against the reference), the same engine outputs as a run without faults, every
fallback counted by cause (once the worker failed cpu_health.FAILURES parts in a row, the rest are
"device_only": it is given no more work), and a late or stale answer never merged."""

from types import SimpleNamespace

import pytest
import torch
from oracle.driver import Driver
from support import TOLERANCE, assert_close

from scout_sglang import reference
from scout_sglang.config import ScoutConfig
from scout_sglang.core.cpu_fallback import attend_listed_host_blocks
from scout_sglang.core.cpu_handoff import CpuHandoff
from scout_sglang.core.cpu_health import FAILURES
from scout_sglang.core.engine import CoAttentionEngine
from scout_sglang.core.shape import ModelShape
from scout_sglang.cpu_worker.faults import FaultPlan
from scout_sglang.handoff_words import DONE, ROWS, STATUS, STATUS_DEADLINE, STATUS_ERROR, STATUS_OK
from scout_sglang.layout import PAD_BLOCK

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SHAPE = ModelShape(num_layers=3, num_qo_heads=8, num_kv_heads=2, head_dim=32)
BLOCK = 8
STEPS = 8


def random_lists(num_pages, batch_size, num_kv_heads, capacity, generator):
    """Page lists [B, Hkv, C] int32 with PAD past counts [B, Hkv]; one list empty, one full."""
    counts = torch.randint(0, capacity + 1, (batch_size, num_kv_heads), generator=generator, dtype=torch.int32)
    counts[0, 0], counts[-1, -1] = 0, capacity
    pages = torch.stack([torch.randperm(num_pages, generator=generator)[:capacity]
                         for _ in range(batch_size * num_kv_heads)]).view(batch_size, num_kv_heads, capacity)
    past = torch.arange(capacity).view(1, 1, -1) >= counts.unsqueeze(-1)
    return torch.where(past, PAD_BLOCK, pages).to(torch.int32), counts


@pytest.mark.parametrize("gather", [False, True])  # True: the CUDA path's row copy into a scratch store
@pytest.mark.parametrize("group_size", [1, 4])
def test_the_fallback_attends_the_listed_host_blocks_like_the_reference(gather, group_size):
    generator = torch.Generator().manual_seed(group_size)
    num_pages, num_kv_heads, batch_size, capacity, head_dim = 11, 2, 3, 5, 16
    host_k = torch.randn(num_pages, num_kv_heads, BLOCK, head_dim, generator=generator)
    host_v = torch.randn(num_pages, num_kv_heads, BLOCK, head_dim, generator=generator)
    q = torch.randn(batch_size, num_kv_heads * group_size, head_dim, generator=generator)
    pages, counts = random_lists(num_pages, batch_size, num_kv_heads, capacity, generator)
    o, lse = attend_listed_host_blocks(q, host_k, host_v, pages, counts, scale=head_dim**-0.5, device="cpu",
                                       gather=gather)
    expected_o, expected_lse = reference.sparse_decode(q, host_k, host_v, pages, counts, scale=head_dim**-0.5)
    assert o.dtype == lse.dtype == torch.float32
    assert_close(o, expected_o, torch.float32)
    assert_close(lse, expected_lse, torch.float32, lse=True)
    assert torch.isneginf(lse[0, :group_size]).all()  # the empty list


def make_engine(**overrides):
    config = ScoutConfig(mode="scout", block_size=BLOCK, token_budget=48, sink_blocks=1, local_blocks=2,
                         cpu_groups=1)
    return CoAttentionEngine(config, SHAPE, dtype=torch.float32, max_requests=4, max_tokens_per_request=512,
                             **overrides)


def fallbacks(telemetry, cause):
    return sum(step.cpu_fallbacks.get(cause, 0) for step in telemetry)


@pytest.fixture(scope="module")
def driver_and_reference():
    """A sparse budget that leaves blocks to the CPU, and the outputs of a run without faults."""
    driver = Driver(SHAPE, [150, 90, 200], STEPS, seed=1)
    reference_outputs = driver.run(make_engine())
    assert sum(step.totals().cpu_blocks for step in driver.telemetry) > 0
    assert fallbacks(driver.telemetry, "error") == fallbacks(driver.telemetry, "deadline") == 0
    return driver, reference_outputs


CPU_LAYERS = STEPS * (SHAPE.num_layers - 1)  # layer 0 is dense: every other layer launches a CPU part per step


@pytest.mark.parametrize("raise_probability", [0.3, 1.0])
def test_cpu_tasks_that_raise_cost_no_output_and_are_counted(driver_and_reference, raise_probability):
    driver, expected = driver_and_reference
    outputs = driver.run(make_engine(cpu_faults=FaultPlan(raise_probability=raise_probability, seed=1)))
    torch.testing.assert_close(outputs, expected, **TOLERANCE[torch.float32])
    counted = fallbacks(driver.telemetry, "error")
    assert 0 < counted <= CPU_LAYERS and fallbacks(driver.telemetry, "deadline") == 0
    if raise_probability == 1.0:
        assert counted == FAILURES and counted + fallbacks(driver.telemetry, "device_only") == CPU_LAYERS


def test_cpu_tasks_past_their_deadline_cost_no_output_and_are_counted(driver_and_reference):
    """Late parts keep running into buffers the merge no longer reads (its fallback has its own), and the next
    step's ring makes them stale: the outputs are those of a run without faults."""
    driver, expected = driver_and_reference
    engine = make_engine(cpu_faults=FaultPlan(delay_probability=1.0, delay_ms=60, seed=1), cpu_deadline_ms=5)
    outputs = driver.run(engine)
    torch.testing.assert_close(outputs, expected, **TOLERANCE[torch.float32])
    late = fallbacks(driver.telemetry, "deadline")
    assert late == FAILURES and late + fallbacks(driver.telemetry, "device_only") == CPU_LAYERS
    assert fallbacks(driver.telemetry, "error") == 0


class HeldWorker:
    """A worker whose parts are answered (or not) when the test says so, through the same words."""

    def __init__(self):
        self.parts = {}

    def register_layer(self, index, part):
        self.parts[index] = part

    def kick(self):
        pass

    def wait_done(self, index, seq, timeout_s):
        words = self.parts[index].words
        return int(words[STATUS]) if int(words[DONE]) == seq else STATUS_DEADLINE

    def answer(self, index, seq, *, status=STATUS_OK, garbage=False):
        part, rows = self.parts[index], int(self.parts[index].words[ROWS])
        if garbage:
            part.out_o.fill_(1e4)
            part.out_lse.fill_(50.0)
        else:
            o, lse = reference.sparse_decode(part.q[:rows], part.k_cache, part.v_cache, part.pages[:rows],
                                             part.counts[:rows], scale=part.scale)
            part.out_o[:rows], part.out_lse[:rows] = o, lse
        part.words[STATUS] = status
        part.words[DONE] = seq


def test_a_late_part_never_reaches_the_merge_and_a_stale_answer_is_not_taken_for_a_later_step():
    generator = torch.Generator().manual_seed(0)
    num_pages, heads, head_dim, capacity, batch_size = 9, SHAPE.num_kv_heads, SHAPE.head_dim, 4, 2
    host_k = torch.randn(num_pages, heads, BLOCK, head_dim, generator=generator)
    host_v = torch.randn(num_pages, heads, BLOCK, head_dim, generator=generator)
    worker, scale = HeldWorker(), head_dim**-0.5
    handoff = CpuHandoff([1], max_batch=4, num_qo_heads=SHAPE.num_qo_heads, num_kv_heads=heads, head_dim=head_dim,
                         capacity=capacity, dtype=torch.float32, device=torch.device("cpu"), host_k={1: host_k},
                         host_v={1: host_v}, scale=scale, worker=worker, deadline_s=1e-3)

    part = handoff.worker_id[1]  # the layer's name with the worker

    def step(seq):
        """Stage a part and ring it -> (the plan, the device part (o, lse), the expected merged output)."""
        q = torch.randn(batch_size, SHAPE.num_qo_heads, head_dim, generator=generator)
        pages, counts = random_lists(num_pages, batch_size, heads, capacity, generator)
        handoff.q[1][:batch_size], handoff.pages[1][:batch_size], handoff.counts[1][:batch_size] = q, pages, counts
        plan = SimpleNamespace(rows=batch_size, seq=seq, bypass=False)
        handoff.ring(1, plan)
        o_dev = torch.randn(batch_size, SHAPE.num_qo_heads, head_dim, generator=generator)
        lse_dev = torch.randn(batch_size, SHAPE.num_qo_heads, generator=generator)
        cpu_o, cpu_lse = reference.sparse_decode(q, host_k, host_v, pages, counts, scale=scale)
        return plan, o_dev, lse_dev, reference.merge_states(o_dev, lse_dev, cpu_o, cpu_lse)[0]

    def resolve(plan, o_dev, lse_dev):
        out = torch.empty_like(o_dev)
        handoff.resolve(1, plan, o_dev, lse_dev, out)
        return out, int(handoff.status[0])

    plan, o_dev, lse_dev, expected = step(seq=1)  # never answered in time: computed by the layer
    out, status = resolve(plan, o_dev, lse_dev)
    assert status == STATUS_DEADLINE
    assert_close(out, expected, torch.float32)
    worker.answer(part, 1, garbage=True)  # the late part lands afterwards: nothing reads it
    plan, o_dev, lse_dev, expected = step(seq=2)
    worker.answer(part, 2)
    out, status = resolve(plan, o_dev, lse_dev)
    assert status == STATUS_OK
    assert_close(out, expected, torch.float32)
    plan, o_dev, lse_dev, expected = step(seq=3)
    worker.answer(part, 2, garbage=True)  # an answer for the previous step, during this one: not this step's
    out, status = resolve(plan, o_dev, lse_dev)
    assert status == STATUS_DEADLINE
    assert_close(out, expected, torch.float32)
    plan, o_dev, lse_dev, expected = step(seq=4)
    worker.answer(part, 4, status=STATUS_ERROR, garbage=True)  # a failed part: its outputs are never read
    out, status = resolve(plan, o_dev, lse_dev)
    assert status == STATUS_ERROR
    assert_close(out, expected, torch.float32)
    assert handoff.outcomes[0].tolist() == [1, 1, 2, 0]  # parts by status: ok, error, deadline, device-only
    assert handoff.record_outcomes(handoff.outcomes.tolist(), [10, 11]) == {"error": 1, "deadline": 2}
