"""The backend's glue under the radix cache, without a server: ScoutAttnBackend's prefill admission
(_begin_extend), checkpoint rebinding (rebind_from_pool) and decode page assignment (from the step's token slots)
driven by a req_to_token that behaves as SGLang's paged allocator and radix tree make it. Requests sharing a
prefix, one of them moved onto the tree's copy after computing its own (whose pages then go to someone else),
must decode exactly as an engine that prefilled every prompt whole; a continued chunk whose engine state was
lost is given up, while the same request back after a release (retraction) adopts its cached prefix."""

import random
from types import SimpleNamespace

import pytest
import torch
from oracle.driver import Driver
from test_shared_prefix import (
    BLOCK,
    LENGTHS,
    PAGES,
    PREFIX,
    SHAPE,
    make_engine,
    poison,
    sharing_driver,
)

from scout_sglang.sglang_adapter.backend import ScoutAttnBackend
from scout_sglang.sglang_adapter.host_batch import HostBatch
from scout_sglang.sglang_adapter.request_failures import RequestFailures
from scout_sglang.sglang_adapter.serving_stats import ServingStats

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class RadixPool:
    """req_to_token [slots, 256] filled page by page from a scrambled free list, as SGLang's paged allocator does."""

    def __init__(self, seed: int = 1):
        self.free = list(range(1, PAGES))
        random.Random(seed).shuffle(self.free)
        self.req_to_token = torch.zeros(len(LENGTHS), 256, dtype=torch.int64)

    def fill(self, slot: int, start: int, end: int) -> None:
        """Token slots for positions [start, end) of `slot`: a new page where a position starts one."""
        for position in range(start, end):
            page = self.free.pop() if position % BLOCK == 0 else int(self.req_to_token[slot, position - 1]) // BLOCK
            self.req_to_token[slot, position] = page * BLOCK + position % BLOCK

    def pages(self, slot: int, blocks: int) -> list[int]:
        return (self.req_to_token[slot, : blocks * BLOCK: BLOCK] // BLOCK).tolist()


def glue(engine, pool) -> ScoutAttnBackend:
    """The backend's state that admission, rebinding and page assignment use (no model runner, no server)."""
    backend = ScoutAttnBackend.__new__(ScoutAttnBackend)
    backend.engine, backend.config, backend.layout, backend.shares_prefixes = engine, engine.config, "logical", True
    backend.req_to_token_pool = SimpleNamespace(req_to_token=pool.req_to_token)
    backend.failures, backend.stats, backend._prefilling, backend.metrics = RequestFailures(), ServingStats(), {}, None
    backend.host_batch = HostBatch()
    return backend


def prefill(backend, driver: Driver, slot: int, request_id: str, prefix: int) -> None:
    """One prefill forward of `slot` from token `prefix` to its prompt's end, as forward_extend stores it."""
    batch = SimpleNamespace(req_pool_indices_cpu=torch.tensor([slot]), extend_prefix_lens_cpu=[prefix],
                            extend_seq_lens_cpu=[LENGTHS[slot] - prefix], rids=[request_id])
    backend._begin_extend(batch)
    for rid, start, length, store in backend._extend_plan:
        for layer in range(SHAPE.num_layers):
            k, v = driver.prompts[(rid, layer)]
            if store:
                backend.engine.extend(rid, layer, start, k[start:start + length], v[start:start + length])


def test_shared_rebound_and_adopting_requests_decode_exactly_and_never_read_freed_pages():
    driver = sharing_driver()
    expected = driver.run(make_engine("scout", assigned=False))
    engine, pool = make_engine("scout", assigned=True), RadixPool()
    backend = glue(engine, pool)
    try:
        pool.fill(0, 0, LENGTHS[0])
        prefill(backend, driver, 0, "a", 0)
        pool.fill(1, 0, LENGTHS[1])  # prefilled at the same time as "a": its own copy of the prefix
        prefill(backend, driver, 1, "b", 0)
        # SGLang's checkpoint of "b": the tree already holds the prefix ("a"'s pages), so b's row now names them
        # and b's own copies are freed, then handed to another request that writes them
        duplicates = pool.pages(1, PREFIX // BLOCK)
        pool.req_to_token[1, :PREFIX] = pool.req_to_token[0, :PREFIX]
        backend.rebind_from_pool(1, PREFIX)
        poison(engine, duplicates)
        # "c" matches the cached prefix: its row starts with the tree's slots, prefill runs from PREFIX
        pool.req_to_token[2, :PREFIX] = pool.req_to_token[0, :PREFIX]
        pool.fill(2, PREFIX, LENGTHS[2])
        prefill(backend, driver, 2, "c", PREFIX)
        assert backend.stats.prefix_hits == 1 and backend.stats.prefix_tokens == PREFIX

        rids = [0, 1, 2]

        def allocate_and_assign():  # SGLang's decode allocation (out_cache_loc), then the backend's planning
            slots = []
            for rid in rids:
                tokens = engine.requests[rid].num_tokens
                pool.fill(rid, tokens, tokens + 1)
                slots.append(int(pool.req_to_token[rid, tokens]))
            backend._assign_given_up_blocks(rids)
            return {"token_slots": torch.tensor(slots)}

        outputs = driver.decode(engine, rids, allocate_and_assign)
        torch.testing.assert_close(outputs, expected, atol=1e-5, rtol=1e-5)
        for rid in rids:  # the engine's tables on the device are SGLang's rows, page for page
            blocks, slot = -(-engine.requests[rid].num_tokens // BLOCK), engine.requests[rid].slot
            assert engine.device_tables["host"].table[slot, :blocks].tolist() == pool.pages(rid, blocks)
            assert engine.device_tables["full"].table[slot, :blocks].tolist() == pool.pages(rid, blocks)
    finally:
        engine.close()


def test_a_lost_continued_chunk_is_given_up_and_a_released_request_adopts_its_prefix_again():
    driver = sharing_driver()
    engine, pool = make_engine("scout", assigned=True), RadixPool()
    backend = glue(engine, pool)
    try:
        pool.fill(0, 0, LENGTHS[0])
        batch = SimpleNamespace(req_pool_indices_cpu=torch.tensor([0]), extend_prefix_lens_cpu=[0], extend_seq_lens_cpu=[2 * BLOCK],
                                rids=["a"])
        backend._begin_extend(batch)  # a first chunk of two blocks
        for layer in range(SHAPE.num_layers):
            k, v = driver.prompts[(0, layer)]
            engine.extend(0, layer, 0, k[:2 * BLOCK], v[:2 * BLOCK])
        engine.release_request(0)  # the engine loses the request's state between its chunks
        prefill(backend, driver, 0, "a", 2 * BLOCK)
        assert backend.failures.given_up == {0} and backend.stats.prefix_hits == 0
        assert backend._extend_plan[0][3] is False and engine.requests[0].num_tokens == 0  # the stand-in stores nothing
        backend.release(0)  # SGLang releases it (a retraction would too); back later, it matches its first chunk
        prefill(backend, driver, 0, "a", 2 * BLOCK)
        assert backend.failures.given_up == set() and backend.stats.prefix_hits == 1
        assert engine.requests[0].num_tokens == LENGTHS[0]
        assert engine.offloaded.host_pages.table(0) == pool.pages(0, -(-LENGTHS[0] // BLOCK))
    finally:
        engine.close()
