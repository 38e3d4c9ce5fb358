"""The engine's host K/V store and the arrival pool on their pages (cpu_worker/host_memory.py): on a CPU device
the store reaches 2 MiB pages as its blocks are written, and nothing calls CUDA; for a CUDA device (with a recording
stand-in for torch.cuda.cudart()) each buffer is page-locked once at its exact address and size, and neither
close() nor dropping the engine leaves a registration behind. What the engine reports (host_store_pages) and the
start-up message say the page kind and the share on 2 MiB pages."""

import gc
from types import SimpleNamespace

import pytest
import torch
from fake_cudart import FakeCudart
from support import requires_sglang

from scout_sglang.config import ScoutConfig
from scout_sglang.core import stores
from scout_sglang.core.engine import CoAttentionEngine
from scout_sglang.core.shape import ModelShape
from scout_sglang.cpu_worker import host_memory
from scout_sglang.cpu_worker.host_memory import buffers_of, thp_state, zeros_on_huge_pages
from scout_sglang.sglang_adapter import memory_report
from scout_sglang.sglang_adapter.arrival_pages import borrowed_host_store

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SHAPE = ModelShape(num_layers=3, num_qo_heads=4, num_kv_heads=2, head_dim=64)
BLOCK = 16
REQUEST_BLOCKS = 750
TOTAL_PAGES = 2 * REQUEST_BLOCKS  # two requests of REQUEST_BLOCKS full blocks fill the store
# bf16: 4 KiB per page, so each of the 4 buffers (K and V of 2 offloaded layers) is 1501 pages, 5.9 MiB: two whole
# huge pages and a partial one


def server_like_engine(device="cpu") -> CoAttentionEngine:
    """An engine built as the backend builds one (its store sized by total_pages), without CPU worker threads."""
    config = ScoutConfig(mode="scout", block_size=BLOCK, token_budget=128, sink_blocks=1, local_blocks=2,
                         dense_layers=(0,), cpu_groups=1)
    return CoAttentionEngine(config, SHAPE, device=device, dtype=torch.bfloat16, max_requests=2,
                             max_tokens_per_request=REQUEST_BLOCKS * BLOCK + 1, total_pages=TOTAL_PAGES,
                             track_changes=False, cpu_worker=False)


def store_tensors(engine) -> list[torch.Tensor]:
    return [*engine.offloaded.host_k.values(), *engine.offloaded.host_v.values()]


def prefill_the_whole_store(engine) -> None:
    generator = torch.Generator().manual_seed(0)
    for rid in range(2):
        engine.add_request(rid)
        for layer in range(SHAPE.num_layers):
            k, v = torch.randn(2, REQUEST_BLOCKS * BLOCK, SHAPE.num_kv_heads, SHAPE.head_dim, generator=generator)
            engine.prefill(rid, layer, k.to(torch.bfloat16), v.to(torch.bfloat16))


@pytest.fixture
def no_cuda(monkeypatch):
    """Every CUDA entry the host store could reach fails the test."""
    def called(*args, **kwargs):
        raise AssertionError("CUDA was called for an engine on the CPU")

    for name in ("cudart", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, called)


@pytest.fixture
def cudart(monkeypatch):
    fake = FakeCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    return fake


@pytest.mark.usefixtures("no_cuda")
def test_a_cpu_engines_store_reaches_huge_pages_as_its_blocks_are_written():
    if thp_state() not in ("always", "madvise"):
        pytest.skip(f"transparent huge pages are {thp_state()} here: the store gets 4 KiB pages")
    engine = server_like_engine()
    try:
        before = engine.host_store_pages(max_age_s=0.0)
        total = sum(t.numel() * t.element_size() for t in store_tensors(engine))
        assert before["kind"] == "thp" and before["kinds"] == {"thp": total} and before["bytes"] == total
        if before["resident_bytes"] is None:
            pytest.skip("/proc/self/smaps is not readable")
        # Not pre-faulted on a CPU device: a store sized to most of the host would cost start-up time for nothing.
        assert before["resident_bytes"] == 0 and before["huge_page_share"] == 0.0
        prefill_the_whole_store(engine)
        assert engine.offloaded.host_pages.num_used == TOTAL_PAGES
        assert engine.host_store_pages(max_age_s=30.0) == before, "measured again only when older than max_age_s"
        after = engine.host_store_pages(max_age_s=0.0)
        assert after["resident_bytes"] >= 0.99 * total
        assert after["huge_page_share"] >= 0.9, f"{after['huge_page_bytes']} of {total} bytes on 2 MiB pages"
        message = memory_report.startup_message(engine, "logical", TOTAL_PAGES * BLOCK, 4096,
                                                {"device": 0, "host": 0}, 2)
        assert f"; host store pages: thp, {100 * after['huge_page_share']:.1f}% of " in message
    finally:
        engine.close()


@pytest.mark.usefixtures("no_cuda")
def test_nothing_calls_cuda_for_an_engine_on_the_cpu():
    engine = server_like_engine()
    engine.add_request(0)
    for layer in range(SHAPE.num_layers):
        k = torch.randn(3 * BLOCK + 5, SHAPE.num_kv_heads, SHAPE.head_dim, dtype=torch.bfloat16)
        engine.prefill(0, layer, k, k)
    pages = engine.host_store_pages()
    assert "registered" not in pages["kind"] and pages["thp"] == thp_state()
    assert "host store pages: " in memory_report.startup_message(engine, "logical", 4096, 4096,
                                                                 {"device": 0, "host": 0}, 2)
    engine.close()
    engine.close()
    del engine
    gc.collect()


def test_close_and_dropping_an_engine_leave_no_registration_behind(monkeypatch, cudart):
    # The store as a CUDA engine allocates it; the rest of the engine stays on the CPU (no GPU here).
    allocate = stores.alloc_store_tensor
    monkeypatch.setattr(stores, "alloc_store_tensor",
                        lambda shape, dtype, *, device: allocate(shape, dtype, device="cuda"))
    closed, dropped = [], []
    for engine in (closed, dropped):
        calls = len(cudart.calls)
        engine.append(server_like_engine())
        assert {(t.data_ptr(), t.numel() * t.element_size()) for t in store_tensors(engine[0])} == \
            {(address, nbytes) for _, address, nbytes, _ in cudart.calls[calls:]}, "each buffer, exactly"
        pages = engine[0].host_store_pages(max_age_s=0.0)
        assert pages["kind"] in ("thp+registered", "4k+registered")
        assert pages["resident_bytes"] in (None, pages["bytes"]), "pre-faulted before it was registered"
    assert len(cudart.of("register")) == 8 and len(cudart.registered) == 8  # each buffer once
    (closed,), (dropped,) = closed, dropped
    closed_addresses = {t.data_ptr() for t in store_tensors(closed)}
    closed.close()
    assert not closed_addresses & set(cudart.registered), "close() unregistered the engine's store"
    assert all(still_mapped for _, _, still_mapped in cudart.of("unregister"))
    closed.close()
    assert len(cudart.of("unregister")) == 4, "once each"
    del dropped, engine
    gc.collect()
    assert cudart.registered == {}, "dropping the engine unregistered its store"
    assert all(still_mapped for _, _, still_mapped in cudart.of("unregister")), "unregistered before the unmap"
    del closed
    gc.collect()
    assert len(cudart.of("unregister")) == 8


class HostPool:
    """SGLang's host pool as borrowed_host_store sees it: per layer a token-major K and V buffer, allocated with
    torch.zeros as SGLang's constructor does."""

    def __init__(self, tokens: int):
        self.head_num, self.head_dim = SHAPE.num_kv_heads, SHAPE.head_dim
        shape = (tokens, self.head_num, self.head_dim)
        self.k = [torch.zeros(shape, dtype=torch.bfloat16) for _ in range(SHAPE.num_layers)]
        self.v = [torch.zeros(shape, dtype=torch.bfloat16) for _ in range(SHAPE.num_layers)]
        self.small = torch.zeros(16)  # a pool's bookkeeping: under a huge page, torch's own

    def get_key_buffer(self, layer):
        return self.k[layer]

    def get_value_buffer(self, layer):
        return self.v[layer]


def test_the_arrival_pool_is_page_locked_as_it_is_allocated_by_the_same_code_and_not_again(cudart):
    tokens = (TOTAL_PAGES + 1) * BLOCK
    with zeros_on_huge_pages("arrival pool", "cuda"):
        pool = HostPool(tokens)
    buffers = [*pool.k, *pool.v]
    assert cudart.of("register") == [("register", t.data_ptr(), t.numel() * t.element_size(), 0) for t in buffers]
    store = borrowed_host_store(pool, [1, 2], BLOCK, "cuda")
    assert len(cudart.of("register")) == len(buffers), "borrowing registers nothing twice"
    assert store.k[1].data_ptr() == pool.k[1].data_ptr()
    kinds = {b.kind for b in buffers_of([*store.k.values(), *store.v.values()], "cuda")}
    assert kinds <= {"thp+registered", "4k+registered"} and len(kinds) == 1
    assert not pool.small.data_ptr() in cudart.registered
    del pool, store, buffers
    gc.collect()
    assert cudart.registered == {}


def test_a_borrowed_store_is_reported_with_the_pages_of_its_owner():
    tokens = (TOTAL_PAGES + 1) * BLOCK
    with zeros_on_huge_pages("arrival pool"):
        pool = HostPool(tokens)
    config = ScoutConfig(mode="scout", block_size=BLOCK, token_budget=128, sink_blocks=1, local_blocks=2,
                         dense_layers=(0,), cpu_groups=1)
    engine = CoAttentionEngine(config, SHAPE, dtype=torch.bfloat16, max_requests=2, max_tokens_per_request=4096,
                               total_pages=TOTAL_PAGES, cpu_worker=False,
                               host_store=borrowed_host_store(pool, [1, 2], BLOCK, "cpu"))
    pages = engine.host_store_pages()
    expected = "thp" if thp_state() in ("always", "madvise") else "4k"
    assert pages["kind"] == expected and pages["bytes"] == 4 * tokens * SHAPE.num_kv_heads * SHAPE.head_dim * 2
    assert engine.memory()["host_bytes_allocated"] == 0
    engine.close()


def test_a_failed_registration_is_reported_as_torch_page_locked_memory(monkeypatch):
    monkeypatch.setattr(torch.cuda, "cudart", lambda: FakeCudart(fail_with=2))
    monkeypatch.setattr(host_memory, "_torch_pinned_zeros", lambda shape, dtype: torch.zeros(shape, dtype=dtype))
    allocate = stores.alloc_store_tensor
    monkeypatch.setattr(stores, "alloc_store_tensor",
                        lambda shape, dtype, *, device: allocate(shape, dtype, device="cuda"))
    engine = server_like_engine()
    pages = engine.host_store_pages()
    assert pages["kind"] == "pinned (torch)" and pages["kinds"] == {"pinned (torch)": pages["bytes"]}
    engine.close()


@requires_sglang
def test_the_arrival_pool_sglang_builds_for_a_gpu_is_page_locked_in_place(cudart):
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    from scout_sglang.sglang_adapter.kv_pool import host_pool_like

    template = MHATokenToKVPool(size=64, page_size=16, dtype=torch.float32, head_num=2, head_dim=16, layer_num=2,
                                device="cpu", enable_memory_saver=False, v_head_dim=16, start_layer=0, end_layer=1,
                                enable_alt_stream=False)
    pool = host_pool_like(template, 16384, "cuda")  # 2 MiB of K and V per layer
    # SGLang allocates each layer's K and V as one buffer: that allocation is registered
    allocations = {(b.untyped_storage().data_ptr(), b.untyped_storage().nbytes())
                   for b in [*pool.k_buffer, *pool.v_buffer]}
    assert len(allocations) == 2 and all(nbytes == 2 * (16384 + 16) * 2 * 16 * 4 for _, nbytes in allocations)
    assert sorted((address, nbytes) for _, address, nbytes, _ in cudart.of("register")) == sorted(allocations)
    borrowed_host_store(pool, [0, 1], 16, "cuda")
    assert len(cudart.of("register")) == len(allocations), "borrowing registers nothing twice"


def test_consecutive_runs_cover_every_page_once_in_order():
    from scout_sglang.core.stores import consecutive_runs

    assert consecutive_runs([]) == []
    assert consecutive_runs([7]) == [(0, 1)]
    assert consecutive_runs([3, 4, 5, 9, 10, 2, 1]) == [(0, 3), (3, 2), (5, 1), (6, 1)]
