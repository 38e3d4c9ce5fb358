"""The engine keeping its full blocks in a borrowed host store: the pages of an arrival pool (token-major, as
SGLang's pool and the PD transfer lay them out), handed to the engine page by page as SGLang's paged allocator
hands them to a request. It must decode exactly as the engine with a store of its own, rewrite each full block
in place into its head-major layout, allocate no host K/V of its own and forget the pages on release."""

import random

import pytest
import torch
from oracle.driver import Driver
from support import requires_cuda, requires_sglang

from scout_sglang.config import ScoutConfig
from scout_sglang.core.engine import CoAttentionEngine
from scout_sglang.core.shape import ModelShape
from scout_sglang.core.stores import BorrowedHostStore
from scout_sglang.sglang_adapter.arrival_pages import block_pages

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SHAPE = ModelShape(num_layers=3, num_qo_heads=8, num_kv_heads=2, head_dim=32)
BLOCK = 8
POOL_PAGES = 64  # page 0 is the padding page
LENGTHS = [13, 40, 71]
STEPS = 20


class ArrivalPool:
    """SGLang's arrival pool as the engine sees it: per layer a token-major K and V buffer of POOL_PAGES pages,
    pages given out in a scrambled order, each request's token slots in req_to_token."""

    def __init__(self, seed: int = 0):
        slots, heads, dim = POOL_PAGES * BLOCK, SHAPE.num_kv_heads, SHAPE.head_dim
        self.k = {layer: torch.zeros(slots, heads, dim) for layer in range(SHAPE.num_layers)}
        self.v = {layer: torch.zeros(slots, heads, dim) for layer in range(SHAPE.num_layers)}
        self.free = list(range(1, POOL_PAGES))
        random.Random(seed).shuffle(self.free)
        self.req_to_token = torch.zeros(len(LENGTHS), 256, dtype=torch.int32)
        self.lengths = [0] * len(LENGTHS)

    def extend(self, rid: int, count: int) -> torch.Tensor:
        """Token slots for `count` more tokens of `rid` (a new page where a token starts one)."""
        for _ in range(count):
            position = self.lengths[rid]
            if position % BLOCK == 0:
                page = self.free.pop()
            else:
                page = int(self.req_to_token[rid, position - 1]) // BLOCK
            self.req_to_token[rid, position] = page * BLOCK + position % BLOCK
            self.lengths[rid] += 1
        return self.req_to_token[rid, self.lengths[rid] - count: self.lengths[rid]].long()

    def borrowed(self, layers) -> BorrowedHostStore:
        heads, dim = SHAPE.num_kv_heads, SHAPE.head_dim
        return BorrowedHostStore({l: self.k[l].view(-1, heads, BLOCK, dim) for l in layers},
                                 {l: self.v[l].view(-1, heads, BLOCK, dim) for l in layers})


def make_engine(mode: str, host_store=None) -> CoAttentionEngine:
    config = ScoutConfig(mode=mode, block_size=BLOCK, token_budget=48, sink_blocks=1, local_blocks=2, cpu_groups=1,
                         resident_blocks=2, dense_layers=(0,))
    return CoAttentionEngine(config, SHAPE, dtype=torch.float32, max_requests=len(LENGTHS),
                             max_tokens_per_request=256, total_pages=POOL_PAGES, host_store=host_store)


def run_on_pool(driver: Driver, engine: CoAttentionEngine, pool: ArrivalPool) -> torch.Tensor:
    """Driver.run with the prompts arriving in the pool and admitted from it, as the backend does."""
    rids = list(range(len(LENGTHS)))
    for b in rids:
        slots = pool.extend(b, LENGTHS[b])
        for layer in range(SHAPE.num_layers):  # the transfer lands the prompt in the pool, token-major
            pool.k[layer][slots], pool.v[layer][slots] = driver.prompts[(b, layer)]
        engine.add_request(b)
        engine.assign_pages(b, 0, block_pages(slots, BLOCK, b, partial=True))
        for layer in range(SHAPE.num_layers):
            engine.prefill(b, layer, pool.k[layer][slots], pool.v[layer][slots])

    def allocate_tokens():  # SGLang's allocator before each decode step: the batch's token slots (out_cache_loc)
        return {"token_slots": torch.cat([pool.extend(b, 1) for b in rids])}

    return driver.decode(engine, rids, allocate_tokens)


@pytest.mark.parametrize("mode", ["scout", "hgca", "infinigen"])
def test_a_borrowed_store_decodes_exactly_as_an_own_store_and_holds_the_blocks_in_its_layout(mode):
    driver = Driver(SHAPE, LENGTHS, STEPS, seed=4)
    owning = make_engine(mode)
    expected = driver.run(owning)
    pool = ArrivalPool()
    engine = make_engine(mode, pool.borrowed(owning.offloaded_layers))
    try:
        actual = run_on_pool(driver, engine, pool)
        torch.testing.assert_close(actual, expected, atol=1e-6, rtol=1e-6)

        # every full block, prompt or decoded, is in its own pool page, head-major
        heads, dim = SHAPE.num_kv_heads, SHAPE.head_dim
        for b in range(len(LENGTHS)):
            tokens = LENGTHS[b] + STEPS
            # the device assigned the pages of blocks decoding started: read its table, as the layers do
            pages = engine.device_tables["host"].table[b, : tokens // BLOCK].tolist()
            assert pages == pool.req_to_token[b, : tokens // BLOCK * BLOCK: BLOCK].div(BLOCK).int().tolist()
            for layer in engine.offloaded_layers:
                k, _ = driver.kv(b, layer, STEPS - 1)
                stored = pool.k[layer].view(-1, heads, BLOCK, dim)[pages]
                assert torch.equal(stored, k[: len(pages) * BLOCK].view(-1, BLOCK, heads, dim).transpose(1, 2))

        memory = engine.memory()
        assert memory["host_bytes_allocated"] == 0 and owning.memory()["host_bytes_allocated"] > 0
        # the pool's pages also hold each request's partial last block (SGLang allocated them): one more each
        partial = sum((length + STEPS) % BLOCK > 0 for length in LENGTHS)
        assert memory["host_bytes_used"] == owning.memory()["host_bytes_used"] + partial * memory["host_page_bytes"]
    finally:
        engine.close()
    for b in range(len(LENGTHS)):
        engine.release_request(b)
    assert engine.usage()["host_pages"] == 0


def host_kv_bytes(*tensor_groups) -> int:
    """Bytes of the distinct allocations under the tensors (a view of a buffer counts once)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for group in tensor_groups for t in group}
    return sum(storages.values())


def test_the_arrival_pool_is_the_one_host_copy():
    pool = ArrivalPool()
    borrowing = make_engine("scout", pool.borrowed(range(1, SHAPE.num_layers)))
    owning = make_engine("scout")
    try:
        pool_tensors = [*pool.k.values(), *pool.v.values()]
        token_bytes = SHAPE.num_layers * 2 * SHAPE.num_kv_heads * SHAPE.head_dim * 4
        capacity = POOL_PAGES * BLOCK
        one = host_kv_bytes(pool_tensors, borrowing.offloaded.host_k.values(), borrowing.offloaded.host_v.values())
        two = host_kv_bytes(pool_tensors, owning.offloaded.host_k.values(), owning.offloaded.host_v.values())
        assert one <= 1.05 * capacity * token_bytes
        assert two > 1.5 * capacity * token_bytes  # the same measure sees the engine's own store
    finally:
        borrowing.close()
        owning.close()


def test_a_block_without_a_page_and_a_misshapen_store_are_refused():
    pool = ArrivalPool()
    engine = make_engine("scout", pool.borrowed(range(1, SHAPE.num_layers)))
    try:
        engine.add_request(0)
        k = torch.randn(2 * BLOCK, SHAPE.num_kv_heads, SHAPE.head_dim)
        with pytest.raises(RuntimeError, match="needs 2 full blocks, 0 were assigned a page by the pool's owner"):
            engine.prefill(0, 1, k, k)
        with pytest.raises(ValueError, match="outside 1..63"):
            engine.assign_pages(0, 0, [0])
    finally:
        engine.close()
    bad = pool.borrowed(range(1, SHAPE.num_layers))
    bad.k[2] = bad.k[2].transpose(1, 2)
    with pytest.raises(ValueError, match="not contiguous"):
        make_engine("scout", bad)


def test_token_slots_that_are_not_whole_pages_are_refused():
    slots = torch.arange(BLOCK, 3 * BLOCK)
    assert block_pages(slots, BLOCK, 0) == [1, 2]
    with pytest.raises(RuntimeError, match="not whole pages of 8 in order"):
        block_pages(slots.flip(0), BLOCK, 0)


@requires_cuda
def test_on_cuda_the_arrival_pool_is_page_locked_in_place_for_the_recall_copies():
    from types import SimpleNamespace

    from scout_sglang.sglang_adapter.arrival_pages import borrowed_host_store

    pool = ArrivalPool()
    fake = SimpleNamespace(head_num=SHAPE.num_kv_heads, head_dim=SHAPE.head_dim,
                           get_key_buffer=pool.k.__getitem__, get_value_buffer=pool.v.__getitem__)
    store = borrowed_host_store(fake, [1, 2], BLOCK, "cuda")
    assert all(t.is_pinned() for t in (*store.k.values(), *store.v.values()))
    assert store.k[1].data_ptr() == pool.k[1].data_ptr()  # in place, not a pinned copy


def test_the_start_up_plan_of_a_borrowing_engine_is_what_it_allocates():
    from scout_sglang.sglang_adapter import memory_report

    pool = ArrivalPool()
    engine = make_engine("scout", pool.borrowed(range(1, SHAPE.num_layers)))
    try:
        plan = memory_report.planned_bytes(engine.config, num_layers=SHAPE.num_layers,
                                           num_kv_heads=SHAPE.num_kv_heads, head_dim=SHAPE.head_dim, itemsize=4,
                                           total_pages=POOL_PAGES, slots=len(LENGTHS), borrowed_host=True)
        memory = engine.memory()
        assert plan["host_bytes_allocated"] == memory["host_bytes_allocated"] == 0
        assert plan["device_bytes_allocated"] == memory["device_bytes_allocated"]
    finally:
        engine.close()


@requires_sglang
def test_the_arrival_pool_sglang_builds_is_on_huge_pages_where_the_system_allows():
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    from scout_sglang.cpu_worker.host_memory import HUGE_PAGE_BYTES, anon_huge_kib, thp_state
    from scout_sglang.sglang_adapter.kv_pool import host_pool_like

    template = MHATokenToKVPool(size=64, page_size=16, dtype=torch.float32, head_num=2, head_dim=16, layer_num=2,
                                device="cpu", enable_memory_saver=False, v_head_dim=16, start_layer=0, end_layer=1,
                                enable_alt_stream=False)
    zeros = torch.zeros
    pool = host_pool_like(template, 16384)  # 2 MiB of K and V per layer
    buffers = [*pool.k_buffer, *pool.v_buffer]
    assert all(torch.count_nonzero(b) == 0 for b in buffers) and pool.k_buffer[0].shape == (16384 + 16, 2, 16)
    assert torch.zeros is zeros  # torch's own again after the build
    if thp_state() not in ("always", "madvise"):
        pytest.skip(f"transparent huge pages are {thp_state()} here")
    storage = pool.k_buffer[0].untyped_storage()
    assert storage.data_ptr() % HUGE_PAGE_BYTES == 0  # a mapping of its own, aligned for huge pages
    pool.k_buffer[0].fill_(1.0)  # first touch faults the pages in
    huge = anon_huge_kib([(storage.data_ptr(), storage.nbytes())])
    if huge is None:
        pytest.skip("/proc/self/smaps is not readable")
    assert huge >= HUGE_PAGE_BYTES // 1024
