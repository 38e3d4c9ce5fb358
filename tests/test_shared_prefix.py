"""Requests sharing a cached prefix (SGLang's radix cache): the engine's stores addressed by page ids that a
SGLang-like allocator picks, a later request adopting the pages an earlier one wrote. Each must decode exactly
as the engine that prefilled every prompt whole into pages of its own, the shared blocks stored once."""

import random

import pytest
import torch
from oracle.driver import Driver

from scout_sglang.config import ScoutConfig
from scout_sglang.core.engine import CoAttentionEngine
from scout_sglang.core.shape import ModelShape

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SHAPE = ModelShape(num_layers=3, num_qo_heads=8, num_kv_heads=2, head_dim=32)
BLOCK = 8
PREFIX = 5 * BLOCK  # whole blocks (SGLang's page size is the block size), past the window: its local ring wraps
LENGTHS = [PREFIX + 5, PREFIX + 19, PREFIX + 8]
STEPS = 20
PAGES = 64


class PagedPool:
    """SGLang's paged allocator and req_to_token as the engine sees them: pages 1.. in a scrambled order."""

    def __init__(self, seed: int = 0):
        self.free = list(range(1, PAGES))
        random.Random(seed).shuffle(self.free)
        self.pages: dict[int, list[int]] = {}

    def share(self, rid: int, owner: int, blocks: int) -> list[int]:
        """`rid` starts with the first `blocks` pages of `owner` (a radix-tree match)."""
        self.pages[rid] = self.pages[owner][:blocks]
        return list(self.pages[rid])

    def grow(self, rid: int, tokens: int) -> list[int]:
        """Pages for a request of `tokens` tokens; returns the new ones."""
        have = self.pages.setdefault(rid, [])
        new = [self.free.pop() for _ in range(-(-tokens // BLOCK) - len(have))]
        have.extend(new)
        return new


def make_engine(mode: str, assigned: bool) -> CoAttentionEngine:
    config = ScoutConfig(mode=mode, block_size=BLOCK, token_budget=48, sink_blocks=1, local_blocks=2, cpu_groups=1,
                         resident_blocks=2, dense_layers=(0,))
    return CoAttentionEngine(config, SHAPE, dtype=torch.float32, max_requests=len(LENGTHS),
                             max_tokens_per_request=256, total_pages=PAGES, assigned_pages=assigned)


def sharing_driver() -> Driver:
    """Requests 1 and 2 start with request 0's first PREFIX tokens (the same K/V in every layer)."""
    driver = Driver(SHAPE, LENGTHS, STEPS, seed=7)
    for b in (1, 2):
        for layer in range(SHAPE.num_layers):
            k, v = driver.prompts[(b, layer)]
            k0, v0 = driver.prompts[(0, layer)]
            driver.prompts[(b, layer)] = (torch.cat([k0[:PREFIX], k[PREFIX:]]), torch.cat([v0[:PREFIX], v[PREFIX:]]))
    return driver


def prefill(engine, pool, driver, rid: int, start: int) -> None:
    engine.assign_pages(rid, start // BLOCK, pool.grow(rid, LENGTHS[rid]))
    for layer in range(SHAPE.num_layers):
        k, v = driver.prompts[(rid, layer)]
        engine.extend(rid, layer, start, k[start:], v[start:])


def decode(engine, pool, driver, rids: list[int]) -> torch.Tensor:
    """Driver.decode, each block's page assigned when the step's token starts it (as SGLang allocates)."""
    def assign_started_blocks():
        for rid in rids:
            tokens = engine.requests[rid].num_tokens
            if tokens % BLOCK == 0:
                engine.assign_pages(rid, tokens // BLOCK, pool.grow(rid, tokens + 1))

    return driver.decode(engine, rids, assign_started_blocks)


@pytest.mark.parametrize("mode", ["scout", "hgca", "infinigen", "quest", "full"])
def test_requests_adopting_a_cached_prefix_decode_as_if_they_had_prefilled_it(mode):
    driver = sharing_driver()
    expected = driver.run(make_engine(mode, assigned=False))
    engine, pool = make_engine(mode, assigned=True), PagedPool()
    try:
        engine.add_request(0)
        prefill(engine, pool, driver, 0, 0)
        for rid in (1, 2):
            engine.add_request(rid)
            engine.adopt_prefix(rid, PREFIX, pool.share(rid, 0, PREFIX // BLOCK))
            prefill(engine, pool, driver, rid, PREFIX)
        actual = decode(engine, pool, driver, [0, 1, 2])
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)

        for store in ([engine.offloaded.host_tables] if engine.offloaded_layers else []) + \
                ([engine.full_store.tables] if engine.full_layers else []):
            store.pages.check_consistent()
            assert store.pages.num_shared == PREFIX // BLOCK
            private = sum(-(-(n + STEPS) // BLOCK) - PREFIX // BLOCK for n in LENGTHS)
            assert store.pages.num_used == PREFIX // BLOCK + private  # the prefix once, each tail's page included
    finally:
        engine.close()
    for rid in range(len(LENGTHS)):
        engine.release_request(rid)
    assert engine.usage()["host_pages"] == 0 and engine.usage()["device_full_pages"] == 0


def test_the_prefix_outlives_its_first_owner_and_a_rebound_request_reads_only_the_shared_pages():
    """Request 0 finishes before request 1 decodes (SGLang's tree keeps its pages). Request 2 prefilled the
    prefix into pages of its own, then SGLang moved it onto the tree's copy and freed its own (rebind): its
    former pages are overwritten by someone else, and its answers must not change."""
    driver = sharing_driver()
    expected = driver.run(make_engine("scout", assigned=False))[:, :, 1:]
    engine, pool = make_engine("scout", assigned=True), PagedPool()
    try:
        engine.add_request(0)
        prefill(engine, pool, driver, 0, 0)
        engine.add_request(1)
        engine.adopt_prefix(1, PREFIX, pool.share(1, 0, PREFIX // BLOCK))
        prefill(engine, pool, driver, 1, PREFIX)
        engine.add_request(2)
        prefill(engine, pool, driver, 2, 0)
        own = pool.pages[2]
        duplicates = own[:PREFIX // BLOCK]
        assert engine.rebind_pages(2, pool.share(2, 0, PREFIX // BLOCK)) == PREFIX // BLOCK
        pool.pages[2] += own[PREFIX // BLOCK:]
        engine.release_request(0)
        poison(engine, duplicates)  # the freed duplicates go to another request
        driver.lengths, driver.predicted = driver.lengths[1:], driver.predicted[:, :, 1:]
        driver.queries, driver.new_k, driver.new_v = (t[:, :, 1:] for t in (driver.queries, driver.new_k,
                                                                              driver.new_v))
        actual = decode(engine, pool, driver, [1, 2])
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    finally:
        engine.close()


def poison(engine, pages: list[int]) -> None:
    """What another request writes into pages SGLang freed and gave it: K/V and digests nothing may read now."""
    for layer in engine.offloaded_layers:
        for store, value in ((engine.offloaded.host_k, 1e3), (engine.offloaded.host_v, -1e3),
                             (engine.offloaded.digest_min, -1e3), (engine.offloaded.digest_max, 1e3)):
            store[layer][pages] = value
    for layer in engine.full_layers:
        engine.full_store.k[layer][pages], engine.full_store.v[layer][pages] = 1e3, -1e3


def test_adopting_needs_assigned_pages_and_whole_blocks():
    owning = make_engine("scout", assigned=False)
    engine = make_engine("scout", assigned=True)
    try:
        owning.add_request(0)
        with pytest.raises(RuntimeError, match="assigned_pages"):
            owning.adopt_prefix(0, BLOCK, [1])
        engine.add_request(0)
        with pytest.raises(ValueError, match="whole blocks"):
            engine.adopt_prefix(0, BLOCK + 3, [1])
        with pytest.raises(ValueError, match="outside"):
            engine.adopt_prefix(0, BLOCK, [PAGES + 5])
    finally:
        owning.close()
        engine.close()
