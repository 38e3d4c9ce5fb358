"""The CPU part computed by the layer itself when its CPU task raises or misses its deadline: the same
attention as the task's (against the reference), the same engine outputs as a run without faults, every
fallback counted by cause (once the worker failed cpu_health.FAILURES parts in a row, the rest are
"device_only": it is given no more work), and a late task's staging buffers never handed to the next
submit."""

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
from scout_sglang.cpu_worker.faults import FaultPlan, InjectedFault
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
    driver, expected = driver_and_reference
    engine = make_engine(cpu_faults=FaultPlan(delay_probability=1.0, delay_ms=60, seed=1), cpu_deadline_ms=5)
    outputs = driver.run(engine)
    torch.testing.assert_close(outputs, expected, **TOLERANCE[torch.float32])
    late = fallbacks(driver.telemetry, "deadline")
    assert late == FAILURES and late + fallbacks(driver.telemetry, "device_only") == CPU_LAYERS
    assert fallbacks(driver.telemetry, "error") == 0
    assert engine._handoff.replaced_buffer_sets > 0  # late tasks were still running at the next submit


class HeldHandle:
    """A submit whose task finishes only when the test says so."""

    def __init__(self, q, k_cache, v_cache, block_table, counts, scale, out_o, out_lse):
        self.q, self.k_cache, self.v_cache, self.block_table, self.counts = q, k_cache, v_cache, block_table, counts
        self.scale, self.out_o, self.out_lse, self.batch_size = scale, out_o, out_lse, q.shape[0]
        self.finished, self.fail = False, False

    def done(self):
        return self.finished


class HeldPool:
    """submit_batch / wait of CpuAttentionPool, with tasks that finish (or raise) on demand."""

    def __init__(self):
        self.handles = []

    def submit_batch(self, q, k_cache, v_cache, block_table, counts, *, scale, out_o, out_lse, **_):
        self.handles.append(HeldHandle(q, k_cache, v_cache, block_table, counts, scale, out_o, out_lse))
        return self.handles[-1]

    def wait(self, handle, timeout=None):
        from scout_sglang.cpu_worker.errors import CpuAttentionError

        if handle.fail:
            raise CpuAttentionError(seq_id=0, batch_index=0, layer=1, cause=InjectedFault("held"))
        if not handle.finished:
            raise TimeoutError("held")


def staged_storage(handle):
    return {t.untyped_storage().data_ptr() for t in (handle.q, handle.block_table, handle.counts, handle.out_o,
                                                      handle.out_lse)}


def test_a_late_task_keeps_its_buffers_until_it_finishes():
    generator = torch.Generator().manual_seed(0)
    num_pages, heads, head_dim, capacity, batch_size = 9, SHAPE.num_kv_heads, SHAPE.head_dim, 4, 2
    host_k = torch.randn(num_pages, heads, BLOCK, head_dim, generator=generator)
    host_v = torch.randn(num_pages, heads, BLOCK, head_dim, generator=generator)
    pool = HeldPool()
    handoff = CpuHandoff([1], max_batch=4, num_qo_heads=SHAPE.num_qo_heads, num_kv_heads=heads, head_dim=head_dim,
                         capacity=capacity, dtype=torch.float32, pool=pool, device=torch.device("cpu"),
                         deadline_s=1e-3)

    def submit():
        q = torch.randn(batch_size, SHAPE.num_qo_heads, head_dim, generator=generator)
        pages, counts = random_lists(num_pages, batch_size, heads, capacity, generator)
        handoff.submit(1, q, pages, counts, host_k, host_v, scale=head_dim**-0.5)
        return q, pages, counts

    q, pages, counts = submit()  # late: its task never finishes in time
    result = handoff.collect(1)
    expected_o, expected_lse = reference.sparse_decode(q, host_k, host_v, pages, counts, scale=head_dim**-0.5)
    assert result.fallback == "deadline"
    assert_close(result.o, expected_o, torch.float32)
    assert_close(result.lse, expected_lse, torch.float32, lse=True)
    submit()  # the late task still runs: a fresh set of buffers
    assert staged_storage(pool.handles[1]).isdisjoint(staged_storage(pool.handles[0]))
    assert handoff.replaced_buffer_sets == 1
    pool.handles[1].fail = True
    assert handoff.collect(1).fallback == "error"
    submit()  # the failed task is over: its buffers are reused
    assert staged_storage(pool.handles[2]) == staged_storage(pool.handles[1])
    pool.handles[2].finished = True
    assert handoff.collect(1).fallback is None
