"""Planning a decode step is O(batch) host work that reads no device value (core/step_plan.py,
core/device_tables.py, the backend's _begin_step): under the radix cache and on a PD decode instance no read of
SGLang's req_to_token and no scalar read; the same host-to-device bytes per step at 4k and 32k tokens; on the
host no op over a tensor as large as torch's OpenMP grain; on the device only ops into static buffers."""

from types import SimpleNamespace

import pytest
import torch
from test_prefix_pages_glue import RadixPool, glue, prefill
from test_shared_prefix import BLOCK, LENGTHS, SHAPE, make_engine, sharing_driver
from torch.utils._python_dispatch import TorchDispatchMode

from scout_sglang.config import ScoutConfig
from scout_sglang.core.engine import CoAttentionEngine
from scout_sglang.core.op_counter import OpCounter
from scout_sglang.core.shape import ModelShape

pytestmark = pytest.mark.usefixtures("one_torch_thread")
GRAIN = 32768  # at::internal::GRAIN_SIZE: an op over fewer elements runs on the calling thread, no OpenMP region


class Untouchable(torch.Tensor):
    """A tensor any op on which fails: what SGLang's req_to_token is to a step's planning."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        raise AssertionError(f"the step's planning read req_to_token ({getattr(func, '__name__', func)})")


class LargestOperand(TorchDispatchMode):
    """The most elements any tensor of any op dispatched on this thread had, and that op."""

    def __init__(self):
        super().__init__()
        self.largest, self.op = 0, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in (*args, *(kwargs or {}).values(), out):
            if isinstance(value, torch.Tensor) and value.numel() > self.largest:
                self.largest, self.op = value.numel(), str(func)
        return out


@pytest.mark.parametrize("layout", ["radix", "arrival"])
def test_steps_under_assigned_pages_read_no_device_value_and_no_req_to_token(layout):
    """The backend's _begin_step where SGLang picks the pages (the radix cache; a PD decode instance's arrival pool
    as the host store, its branch driven here by the same engine): the pages of blocks the tokens start come from
    the batch's token slots on the device; req_to_token is untouchable and no scalar is read, step after step
    (blocks start among them), and the tables on the device are SGLang's pages."""
    driver = sharing_driver()
    engine, pool = make_engine("scout", assigned=True), RadixPool()
    backend = glue(engine, pool)
    backend.host_store, backend.inner, backend._predicted, backend.predictor = None, None, {}, None
    backend.failures.inject = lambda *args, **kwargs: None
    try:
        for slot, request in enumerate("abc"):
            pool.fill(slot, 0, LENGTHS[slot])
            prefill(backend, driver, slot, request, 0)
        if layout == "arrival":  # the arrival pool's branch: its pages are the host store's
            backend.layout, backend.shares_prefixes, backend.host_store = "arrival", False, engine.offloaded
        rids = [0, 1, 2]
        starts = 0
        for s in range(2 * BLOCK):
            tokens = [engine.requests[rid].num_tokens for rid in rids]
            for rid, n in zip(rids, tokens):
                pool.fill(rid, n, n + 1)
            starts += sum(n % BLOCK == 0 for n in tokens)
            batch = SimpleNamespace(batch_size=3, req_pool_indices_cpu=torch.tensor(rids),
                                    seq_lens_cpu=torch.tensor([n + 1 for n in tokens]), rids=list("abc"),
                                    out_cache_loc=pool.req_to_token[rids, tokens])
            real = pool.req_to_token
            backend.req_to_token_pool.req_to_token = real.as_subclass(Untouchable)
            try:
                with OpCounter() as counter:
                    backend._begin_step(batch)
            finally:
                backend.req_to_token_pool.req_to_token = real
            assert counter.scalar_reads == 0 and backend.host_batch.device_reads == 0
            for layer in range(SHAPE.num_layers):
                engine.attend(layer, driver.queries[s, layer], driver.new_k[s, layer], driver.new_v[s, layer])
            engine.end_step()
        assert starts >= 3  # every request started a block
        for rid in rids:
            blocks, slot = -(-engine.requests[rid].num_tokens // BLOCK), engine.requests[rid].slot
            assert engine.device_tables["host"].table[slot, :blocks].tolist() == pool.pages(rid, blocks)
    finally:
        engine.close()


def steady_engine(context: int, mode: str, *, batch: int = 4, head_dim: int = 16) -> CoAttentionEngine:
    shape = ModelShape(num_layers=2, num_qo_heads=4, num_kv_heads=2, head_dim=head_dim)
    config = ScoutConfig(mode=mode, block_size=16, token_budget=64, cpu_groups=1)
    engine = CoAttentionEngine(config, shape, dtype=torch.float32, max_requests=batch,
                               max_tokens_per_request=context + 64, cpu_worker=False)
    gen = torch.Generator().manual_seed(0)
    for rid in range(batch):
        length = context - (5, 3, 16, 1)[rid % 4]
        k, v = torch.randn(length, 2, head_dim, generator=gen), torch.randn(length, 2, head_dim, generator=gen)
        engine.add_request(rid)
        for layer in range(shape.num_layers):
            engine.prefill(rid, layer, k, v)
    return engine


def run_steps(engine, steps: int) -> None:
    batch, shape = len(engine.requests), engine.shape
    q = torch.randn(batch, shape.num_qo_heads, shape.head_dim)
    kv = torch.randn(batch, shape.num_kv_heads, shape.head_dim)
    for _ in range(steps):
        engine.begin_step(sorted(engine.requests))
        for layer in range(shape.num_layers):
            engine.attend(layer, q, kv, kv)
        engine.end_step()


def planned_bytes(engine) -> int:
    return engine._plan_buffer.bytes_moved + sum(table.bytes_copied for table in engine.device_tables.values())


@pytest.mark.parametrize("mode", ["scout", "quest"])
def test_a_step_moves_the_same_bytes_to_the_device_at_4k_and_32k_tokens(mode):
    """Steady decode steps (blocks completing among them, at both lengths alike): the plan's one copy and the
    table changes it carries are O(batch), whatever the context."""
    moved = {}
    for context in (4096, 32768):
        engine = steady_engine(context, mode)
        run_steps(engine, 1)  # the prefill's table rows move with the first step
        before = planned_bytes(engine)
        run_steps(engine, 20)
        moved[context] = planned_bytes(engine) - before
        engine.close()
    assert moved[4096] == moved[32768] > 0, moved


def test_planning_a_large_batch_at_a_long_context_stays_under_the_openmp_grain():
    """64 requests of 16k tokens (1025 blocks each: their page tables are 65600 entries): the host's part of
    planning (plan_fields, the plan buffer's layout) touches no tensor of GRAIN elements, so it never starts an
    OpenMP region, which cannot start while every core is held by a spinning worker."""
    import scout_sglang.core.engine as engine_module

    engine = steady_engine(16384, "scout", batch=64, head_dim=4)
    largest = LargestOperand()
    plan_fields, write = engine_module.plan_fields, engine._plan_buffer.write

    def measured(function):
        def call(*args, **kwargs):
            with largest:
                return function(*args, **kwargs)
        return call

    engine_module.plan_fields, engine._plan_buffer.write = measured(plan_fields), measured(write)
    try:
        run_steps(engine, 3)
    finally:
        engine_module.plan_fields = plan_fields
        engine.close()
    assert 0 < largest.largest < GRAIN, (largest.largest, largest.op)


def test_the_device_side_of_planning_writes_static_buffers_only():
    """StepTables.apply (the device's part of planning: the changes, the gathers, the pages the step writes) runs
    only ops into existing tensors: nothing it does allocates on the device, and a CUDA graph finds the same
    addresses."""
    engine = steady_engine(512, "quest")
    allowed = {"aten.copy_.default", "aten.index_put_.default", "aten.index_select.out", "aten.div.out_mode",
               "aten.slice.Tensor", "aten.select.int", "aten.view.default", "aten.alias.default"}
    original = engine.step_tables.apply
    seen = set()

    def counted(*args, **kwargs):
        with OpCounter() as counter:
            out = original(*args, **kwargs)
        seen.update(counter.ops)
        return out

    engine.step_tables.apply = counted
    try:
        for _ in range(BLOCK + 1):
            engine.begin_step([0, 1, 2, 3], token_slots=torch.arange(4) * 16)
            engine.end_step()
    finally:
        engine.close()
    assert seen and seen <= allowed, seen - allowed
