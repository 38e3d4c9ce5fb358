"""Resident-first with SGLang's radix cache (core/pool_sharing.py): requests that adopt a cached prefix point their
resident rows at the pages of another exact row that holds it, so a shared prefix is resident once. They start
exact and settled (the exact path from their first step), decode as dense attention, and keep their pages when the
request that wrote them leaves; one that stops fitting copies them into pages of its own and decodes as it does
alone at its recorded quotas."""

import random

import pytest
import torch
from oracle.check import Oracle
from oracle.driver import Driver
from test_engine_oracle import SHAPES
from test_resident_pool import SHAPE, Ramp, alone_engine, recorded_step, replay_alone

from scout_sglang.config import ScoutConfig
from scout_sglang.core.engine import CoAttentionEngine
from scout_sglang.core.resident_pool import SHARED, ResidentPool, compact_rows
from scout_sglang.layout import PAD_BLOCK

pytestmark = pytest.mark.usefixtures("one_torch_thread")
BLOCK = 8
PREFIX = 12 * BLOCK  # 9 blocks outside the window (sink 1, local 2)
HOST_PAGES = 96


def test_a_shared_prefix_counts_once_and_its_pages_outlive_each_holder():
    pool = ResidentPool(16, first_page=100, max_requests=3, width=8, floor=2)
    pool.grow(0, 0, 6)
    pool.grow(1, 1, 2)  # a new request's floor, given back when it shares
    assert pool.share(1, 1, donor=0, count=4) == pool.shared_pages[0]
    assert pool.table[1, :4].tolist() == pool.table[0, :4].tolist() and pool.quota(1) == 4 and pool.quota(0) == 6
    assert pool.pages.num_used == 6 and pool.saved_pages() == 4 and pool.pages.count(SHARED) == 4
    pool.share(2, 2, donor=1, count=3)  # a third holder of the first three
    assert pool.references == {**{page: 3 for page in pool.shared_pages[2]}, pool.shared_pages[0][3]: 2}
    assert pool.saved_pages() == 7 and pool.saved_pages({0, 2}) == 3
    # 8 + 7 + 8 columns from 16 pages: with the 7 saved every row is exact; 8 + 8 + 8 are too many even then,
    # and a row the level cuts shares nothing, so the pages go as if nobody did
    assert pool.plan({0: 8, 1: 7, 2: 8}) == {0: 8, 1: 7, 2: 8}
    assert pool.plan({0: 8, 1: 8, 2: 8}) == {0: 5, 1: 5, 2: 6}
    pool.pages.check_consistent()

    pool.release(0, 0)  # the donor leaves: the pages 1 and 2 point at stay
    assert pool.pages.count(SHARED) == 4 and pool.quota(1) == 4 and pool.saved_pages() == 3
    pool.grow(1, 1, 6)  # two pages of its own, columns 4 and 5
    own = pool.table[1, 4].item()
    pool.unshare(1, 1, quota=5)  # request 1 stops fitting: its shared columns are owed pages, its own stay put
    assert pool.quota(1) == 1 and pool.owed == {1: 4} and pool.table[1, 4] == own and pool.table[1, 5] == PAD_BLOCK
    assert pool.pages.count(SHARED) == 3 and pool.saved_pages() == 0 and pool.low[1] == 5 and pool.evicted_columns == 1
    pool.repay(1, 1)
    assert pool.quota(1) == 5 and pool.table[1, 4] == own and PAD_BLOCK not in pool.table[1, :5].tolist()
    assert set(pool.table[1, :5].tolist()).isdisjoint(pool.table[2, :3].tolist())
    pool.pages.check_consistent()
    pool.release(2, 2)
    pool.release(1, 1)
    assert pool.pages.num_used == 0 and not pool.references and pool.pointers == 0
    pool.pages.check_consistent()


def test_random_shares_shrinks_and_releases_keep_every_row_and_count_in_step():
    """Random sequences of what a rebalance does (share with a running row, unshare and repay, shrink, grow,
    release): after each, every row's columns are its shared pages then its own, PAD past its quota, each shared
    page counted once per row pointing at it, and no page lost or held twice."""
    rng = random.Random(3)
    for _ in range(20):
        pool, slots = ResidentPool(40, first_page=7, max_requests=6, width=12, floor=1), {}
        for _ in range(60):
            free = sorted(set(range(6)) - set(slots.values()))
            action = rng.choice(["join", "share", "unshare", "resize", "release"])
            if action in ("join", "share") and free:
                rid = max(slots, default=-1) + 1
                slots[rid] = free[0]
                pool.grow(rid, slots[rid], rng.randrange(1, 3) if pool.pages.num_free > 2 else 0)
                donors = [d for d in slots if d != rid and pool.quota(d)]
                if action == "share" and donors:
                    donor = rng.choice(donors)
                    pool.share(rid, slots[rid], donor, rng.randrange(1, pool.quota(donor) + 1))
            elif action == "unshare" and pool.shared_pages:
                rid = rng.choice(list(pool.shared_pages))
                # a quota its owed pages can be repaid at (the water-fill sees to it in the engine)
                pool.unshare(rid, slots[rid], rng.randrange(0, min(pool.quota(rid), pool.pages.num_free) + 1))
                pool.repay(rid, slots[rid])
            elif action == "resize" and slots:
                rid = rng.choice(list(slots))
                low = len(pool.shared_pages.get(rid, ()))
                quota = rng.randrange(low, min(pool.width, low + pool.pages.num_free + pool.pages.count(rid)) + 1)
                pool.shrink(rid, slots[rid], quota)
                pool.grow(rid, slots[rid], quota)
            elif action == "release" and slots:
                rid = rng.choice(list(slots))
                pool.release(rid, slots.pop(rid))
            assert_pool_in_step(pool, slots)
        for rid, slot in list(slots.items()):
            pool.release(rid, slot)
        assert pool.pages.num_used == 0 and not pool.references and pool.pointers == 0


def assert_pool_in_step(pool, slots):
    counts = {}
    for rid, slot in slots.items():
        shared, own = pool.shared_pages.get(rid, []), pool.pages.table(rid)
        row = pool.table[slot].tolist()
        assert row[:len(shared) + len(own)] == [pool.first_page + p for p in shared + own], (rid, row)
        assert set(row[len(shared) + len(own):]) <= {PAD_BLOCK}, (rid, row)
        for page in shared:
            counts[page] = counts.get(page, 0) + 1
    assert pool.references == counts and pool.pointers == sum(counts.values())
    assert sorted(pool.pages.table(SHARED)) == sorted(counts)
    pool.pages.check_consistent()


def test_giving_up_shared_pages_moves_a_row_to_new_pages_in_the_same_copy_as_a_compaction():
    """Slot 1 is compacted to 2 columns; slot 2 only changes pages (it keeps its columns, its brake state stands),
    and its new first page is one slot 1 gives up, whose block slot 1 moves out in the same copy."""
    resident = torch.full((3, 1, 4), PAD_BLOCK, dtype=torch.int32)
    resident[1, 0] = torch.tensor([4, 9, 2, 7])
    resident[2, 0] = torch.tensor([3, 5, 6, PAD_BLOCK])
    last = torch.full((3, 1, 2), PAD_BLOCK, dtype=torch.int32)
    last[1, 0] = torch.tensor([2, 7])
    before = torch.tensor([[10, 11, 12, 13], [20, 21, 22, PAD_BLOCK]], dtype=torch.int32)
    after = torch.tensor([[10, 11, PAD_BLOCK, PAD_BLOCK], [12, 13, 24, 25]], dtype=torch.int32)
    dev_k, dev_v = torch.randn(30, 1, 2, 3), torch.randn(30, 1, 2, 3)
    k_before = dev_k.clone()
    state = torch.ones(3, 1, 3 + 4, dtype=torch.int32)
    compact_rows(resident, [1, 2], [2, 4], before, last, dev_k, dev_v, max_blocks=12, brake_state=state,
                 dst_pages=after, reordered=[True, False])
    assert resident[1, 0].tolist() == [2, 7, PAD_BLOCK, PAD_BLOCK] and resident[2, 0].tolist() == [3, 5, 6, PAD_BLOCK]
    for page, source in ((10, 12), (11, 13), (12, 20), (13, 21), (24, 22)):
        assert torch.equal(dev_k[page], k_before[source]), (page, source)
    assert state[1].sum() < state[2].sum() == 7


def assert_decodes_as_alone(config, rid, prompt, steps, quota_runs):
    """`rid` decoded alone from its whole prompt (no prefix adopted, nothing shared) at `quota_runs` gives the
    outputs it had (recorded_step's) at every step and layer."""
    outs = replay_alone(alone_engine(config), rid, prompt, steps, quota_runs)
    for step, (layers, again) in enumerate(zip(steps, outs)):
        for layer, ((*_, out), replayed) in enumerate(zip(layers, again)):
            torch.testing.assert_close(replayed, out, atol=1e-5, rtol=1e-5, msg=f"request {rid} step {step} layer {layer}")


class RadixPages:
    """SGLang's paged allocator as the engine sees it: host pages 1.. in a scrambled order; a request that adopts
    a prefix starts with its owner's pages (a radix-tree match)."""

    def __init__(self, seed=0):
        self.free = list(range(1, HOST_PAGES))
        random.Random(seed).shuffle(self.free)
        self.pages: dict[int, list[int]] = {}

    def grow(self, rid, tokens):
        have = self.pages.setdefault(rid, [])
        new = [self.free.pop() for _ in range(-(-tokens // BLOCK) - len(have))]
        have.extend(new)
        return new


def make_engine(pool_blocks, max_requests=3):
    config = ScoutConfig(mode="scout", block_size=BLOCK, token_budget=48, sink_blocks=1, local_blocks=2,
                         cpu_groups=1, resident_blocks=2, resident_first=True, resident_pool_blocks=pool_blocks)
    return CoAttentionEngine(config, SHAPE, dtype=torch.float32, max_requests=max_requests,
                             max_tokens_per_request=256, total_pages=HOST_PAGES, assigned_pages=True)


def join(ramp, radix, rid, length, owner=None, prefix=PREFIX):
    """Request `rid` of `length` tokens; with `owner` (running or finished), its first `prefix` tokens are the
    owner's (the same K/V in every layer), adopted from the radix cache, and only the rest is prefilled."""
    engine = ramp.engine
    engine.add_request(rid)
    start = 0
    if owner is not None:
        radix.pages[rid] = radix.pages[owner][:prefix // BLOCK]
        engine.adopt_prefix(rid, prefix, list(radix.pages[rid]), filling_to=length)
        start = prefix
    engine.assign_pages(rid, start // BLOCK, radix.grow(rid, length))
    for layer in range(SHAPE.num_layers):
        k, v = ramp._randn(length, SHAPE.num_kv_heads), ramp._randn(length, SHAPE.num_kv_heads)
        if owner is not None:
            k0, v0 = ramp.kv[owner, layer]
            k, v = torch.cat([k0[:prefix], k[prefix:]]), torch.cat([v0[:prefix], v[prefix:]])
        ramp.kv[rid, layer] = (k, v)
        engine.extend(rid, layer, start, k[start:], v[start:])


def poison_free_pages(engine):
    """Garbage in every pool page no request holds (what a freed page holds once another request takes it)."""
    pool = engine.pool
    held = {page for holder in pool.pages.requests() for page in pool.pages.table(holder)}
    free = [pool.first_page + page for page in range(pool.pages.num_pages) if page not in held]
    for layer in engine.offloaded_layers:
        engine.offloaded.dev_k[layer][free], engine.offloaded.dev_v[layer][free] = 1e3, -1e3


def assign_started_blocks(engine, radix, rids):
    """The page of each block a step's token starts, as SGLang allocates it before the step."""
    for rid in rids:
        tokens = engine.requests[rid].num_tokens
        if tokens % BLOCK == 0:
            engine.assign_pages(rid, tokens // BLOCK, radix.grow(rid, tokens + 1))


@pytest.mark.parametrize("sharing", [True, False])
def test_adopters_share_the_prefix_rows_start_on_the_exact_path_and_outlive_the_donor(sharing, monkeypatch):
    """A pool of 16 pages; three requests want 9 + 12 + 10 columns, 9 of each the same prefix. Shared, the
    prefix counts once (13 pages): all three are exact from their first step (the exact path: the adopters' rows
    hold the prefix without a fill) and decode as dense attention, also after the donor leaves. Not shared (the
    control) they do not fit."""
    if not sharing:
        monkeypatch.setattr("scout_sglang.core.pool_sharing.share_prefix", lambda *args: 0)
    engine, radix = make_engine(16), RadixPages()
    ramp = Ramp(engine)
    try:
        join(ramp, radix, 0, PREFIX + 5)
        join(ramp, radix, 1, PREFIX + 24, owner=0)
        join(ramp, radix, 2, PREFIX + 10, owner=0)
        pool = engine.pool
        if not sharing:
            assert not pool.shared_pages and not all(pool.exact.values())
            return
        assert pool.shared_pages[1] == pool.shared_pages[2] == pool.shared_pages[0] and len(pool.shared_pages[0]) == 9
        assert pool.saved_pages() == 18 and pool.pages.num_used == 9 + 0 + 3 + 1
        assert pool.settled == {0, 1, 2} and engine.exact_step_ready([0, 1, 2])
        rids = [0, 1, 2]
        for step in range(6):
            if step == 3:
                ramp.leave(0)  # the donor: the pages 1 and 2 point at stay
                poison_free_pages(engine)
                rids = [1, 2]
                assert pool.pages.count(0) == 0 and pool.pages.count(SHARED) == 9
            assign_started_blocks(engine, radix, rids)
            errors, exact, telemetry = ramp.step(rids)
            assert all(exact.values()) and telemetry.exact_path_steps == 1, (step, exact)
            assert max(errors.values()) < 1e-4, (step, errors)
        for rid in rids:
            ramp.leave(rid)
        assert pool.pages.num_used == 0 and not pool.references
        pool.pages.check_consistent()
    finally:
        engine.close()


def test_a_sharer_that_stops_fitting_copies_the_prefix_into_its_own_pages_and_decodes_as_alone():
    """Requests 0 and 1 share a prefix and run exact; request 2 joins and the pool cannot hold them all: 0 and 1
    give their shared pages up (their blocks copied into their own, in the compaction's copy) and go sparse. Each,
    decoded alone from its whole prompt at its recorded quotas (no sharing), gives the outputs it had at every
    step and layer."""
    engine, radix = make_engine(16), RadixPages()
    ramp, steps = Ramp(engine), {rid: [] for rid in range(3)}
    try:
        join(ramp, radix, 0, PREFIX + 5)
        join(ramp, radix, 1, PREFIX + 24, owner=0)
        assert engine.pool.saved_pages() == 9
        prompts = {rid: [ramp.kv[rid, layer] for layer in range(SHAPE.num_layers)] for rid in (0, 1)}
        paths = []
        for rids, count in (([0, 1], 3), ([0, 1, 2], 5), ([0, 1], 2)):
            if 2 in rids and 2 not in engine.requests:
                join(ramp, radix, 2, 130)
                assert not engine.pool.shared_pages and not engine.pool.exact[0] and not engine.pool.exact[1]
            if 2 not in rids and 2 in engine.requests:
                ramp.leave(2)
            for _ in range(count):
                assign_started_blocks(engine, radix, rids)
                kept, exact_path = recorded_step(engine, ramp, rids)
                paths.append(exact_path)
                for rid, layers in kept.items():
                    steps[rid].append(layers)
        runs = {rid: engine.pool.runs[rid] for rid in (0, 1)}
        engine.pool.pages.check_consistent()
    finally:
        engine.close()
    assert paths[:3] == [True] * 3 and not any(paths[3:8]), paths
    for rid in (0, 1):
        quotas = [quota for quota, count, *_ in runs[rid]["quota_runs"] for _ in range(count)]
        assert quotas[0] > quotas[3], runs[rid]
        assert_decodes_as_alone(engine.config, rid, prompts[rid], steps[rid], runs[rid]["quota_runs"])


def test_a_prefix_whose_writer_finished_is_copied_into_the_first_adopter_row_and_shared_by_the_next():
    """Request 0 wrote the prefix and finished (the radix tree keeps its host pages). Request 1 adopts it: no row
    holds it, so its row is filled from the host pages at adoption, in block order (settled: the exact path from
    its first step, no fill); request 2 then shares request 1's row. When request 3 joins, both stop fitting and
    go sparse; each decodes throughout as it does alone from its whole prompt at its recorded quotas."""
    engine, radix = make_engine(16), RadixPages()
    ramp, steps, paths = Ramp(engine), {rid: [] for rid in (1, 2, 3)}, []
    try:
        join(ramp, radix, 0, PREFIX + 5)
        ramp.leave(0)
        poison_free_pages(engine)  # what its pool pages held: nothing may read it now
        join(ramp, radix, 1, PREFIX + 24, owner=0)
        pool = engine.pool
        slot = engine.requests[1].slot
        assert pool.identity[1] == 12 and 1 in pool.settled and not pool.shared_pages  # the prefix, then its own
        for layer in engine.offloaded_layers:
            assert engine.offloaded.resident_map[layer][slot, :, :12].tolist() == [list(range(1, 13))] * 2
        join(ramp, radix, 2, PREFIX + 10, owner=0)
        assert pool.shared_pages[2] == pool.shared_pages[1] and pool.saved_pages() == 9
        prompts = {rid: [ramp.kv[rid, layer] for layer in range(SHAPE.num_layers)] for rid in (1, 2)}
        for rids, count in (([1, 2], 3), ([1, 2, 3], 4)):
            if 3 in rids and 3 not in engine.requests:
                join(ramp, radix, 3, 130)
            for _ in range(count):
                assign_started_blocks(engine, radix, rids)
                kept, exact_path = recorded_step(engine, ramp, rids)
                paths.append(exact_path)
                for rid, layers in kept.items():
                    steps[rid].append(layers)
        runs = {rid: engine.pool.runs[rid] for rid in (1, 2)}
    finally:
        engine.close()
    assert paths == [True] * 3 + [False] * 4
    for rid in (1, 2):
        assert_decodes_as_alone(engine.config, rid, prompts[rid], steps[rid], runs[rid]["quota_runs"])


@pytest.mark.parametrize("pool_blocks", [40, 16])
def test_adopted_prefixes_through_the_switch_match_the_oracle(pool_blocks):
    """The oracle (tests/oracle) follows every decision and output of three requests that share a 12-block prefix
    (two adopt it): with a pool of 40 they are exact throughout, each on the exact path from its first step (the
    adopters' rows hold the prefix in block order, as a prefill writes it), and equal dense attention; with 16 they
    fit only shared, outgrow it as they decode, give the shared pages up and go sparse, every row through the
    switch as the oracle has it."""
    shape, lengths = SHAPES["llama"], [PREFIX + 5, PREFIX + 24, PREFIX + 10]
    driver = Driver(shape, lengths, 16, seed=5)
    for rid in (1, 2):
        for layer in range(shape.num_layers):
            (k, v), (k0, v0) = driver.prompts[(rid, layer)], driver.prompts[(0, layer)]
            driver.prompts[(rid, layer)] = (torch.cat([k0[:PREFIX], k[PREFIX:]]), torch.cat([v0[:PREFIX], v[PREFIX:]]))
    config = ScoutConfig(mode="scout", block_size=BLOCK, token_budget=48, sink_blocks=1, local_blocks=2,
                         cpu_groups=1, resident_blocks=2, dense_layers=(0,), recall_policy="adaptive",
                         resident_first=True, resident_pool_blocks=pool_blocks)
    engine = CoAttentionEngine(config, shape, dtype=torch.float32, max_requests=3, max_tokens_per_request=256,
                               total_pages=HOST_PAGES, assigned_pages=True, trace=True)
    radix = RadixPages()
    try:
        for rid, length in enumerate(lengths):
            engine.add_request(rid)
            start = 0 if rid == 0 else PREFIX
            if rid:
                radix.pages[rid] = radix.pages[0][:PREFIX // BLOCK]
                engine.adopt_prefix(rid, PREFIX, list(radix.pages[rid]), filling_to=length)
            engine.assign_pages(rid, start // BLOCK, radix.grow(rid, length))
            for layer in range(shape.num_layers):
                k, v = driver.prompts[(rid, layer)]
                engine.extend(rid, layer, start, k[start:], v[start:])
        assert engine.pool.saved_pages() == 18 and engine.pool.settled == {0, 1, 2}
        outputs = driver.decode(engine, [0, 1, 2], lambda: assign_started_blocks(engine, radix, [0, 1, 2]))
    finally:
        engine.close()
    report = Oracle(config, shape, driver).check(engine.trace.decisions, outputs)
    rows = 16 * len(engine.offloaded_layers) * len(lengths) * shape.num_kv_heads
    if pool_blocks == 40:
        torch.testing.assert_close(outputs, driver.dense(), atol=2e-5, rtol=2e-5)
        assert report.exact_path_rows == report.exact_rows == rows and report.cpu_blocks == 0
    else:
        assert 0 < report.exact_rows < rows and report.cpu_blocks > 0 and report.quota_shrinks > 0
        assert report.exact_path_rows > 0


def test_a_donor_cut_beside_an_adopter_that_stays_exact_gives_its_shared_pages_up():
    """Request 0 (the donor, 21 blocks outside its window) and request 1 (9, all of them the shared prefix) fit a
    pool of 23 only shared. Request 2 joins: the level cuts the donor, not the adopter. The donor gives up its
    shared pages (the adopter keeps them, their only holder now) for pages of its own; the adopter stays exact,
    on the selecting path beside a sparse row. Each decodes throughout as it does alone at its recorded quotas."""
    engine, radix = make_engine(23), RadixPages()
    ramp, steps = Ramp(engine), {rid: [] for rid in range(3)}
    try:
        join(ramp, radix, 0, PREFIX + 100)
        join(ramp, radix, 1, PREFIX + 5, owner=0)
        pool = engine.pool
        assert pool.saved_pages() == 9 and pool.exact == {0: True, 1: True}
        prompts = {rid: [ramp.kv[rid, layer] for layer in range(SHAPE.num_layers)] for rid in (0, 1)}
        for rids, count in (([0, 1], 2), ([0, 1, 2], 4)):
            if 2 in rids and 2 not in engine.requests:
                join(ramp, radix, 2, 48)
                assert pool.exact == {0: False, 1: True, 2: True} and 0 not in pool.shared_pages
                assert pool.references == dict.fromkeys(pool.shared_pages[1], 1) and pool.saved_pages() == 0
                donor = pool.table[engine.requests[0].slot, :pool.quota(0)].tolist()
                assert set(donor).isdisjoint(pool.shared_pages[1])
            for _ in range(count):
                assign_started_blocks(engine, radix, rids)
                kept, _ = recorded_step(engine, ramp, rids)
                for rid, layers in kept.items():
                    steps[rid].append(layers)
        runs = {rid: engine.pool.runs[rid] for rid in (0, 1)}
        pool.pages.check_consistent()
    finally:
        engine.close()
    for rid in (0, 1):
        assert_decodes_as_alone(engine.config, rid, prompts[rid], steps[rid], runs[rid]["quota_runs"])


def test_an_adopter_that_cannot_be_exact_shares_nothing():
    """A pool of 12 holds the donor's 9 columns; the adopter's prefill chunk makes it 24 blocks, 9 of them the
    shared prefix, more than its share of the pool with them: it shares nothing (the donor's pages stay its own)
    and starts sparse, its row empty."""
    engine, radix = make_engine(12), RadixPages()
    ramp = Ramp(engine)
    try:
        join(ramp, radix, 0, PREFIX + 5)
        join(ramp, radix, 1, PREFIX + 120, owner=0)
        pool = engine.pool
        assert not pool.shared_pages and pool.pages.count(SHARED) == 0 and pool.prefix_blocks_shared == 0
        assert not pool.exact[1] and 1 not in pool.settled
        slot = engine.requests[1].slot
        assert all((engine.offloaded.resident_map[layer][slot] == PAD_BLOCK).all() for layer in engine.offloaded_layers)
        assign_started_blocks(engine, radix, [0, 1])
        ramp.step([0, 1])
    finally:
        engine.close()


def test_a_prefix_partly_held_by_a_running_row_is_shared_that_far_and_copied_for_the_rest():
    """Request 0 wrote 16 blocks; request 1 adopted its first 12 (11 outside the window once its prefill moves its
    window's two out) and went on with its own; request 0 finished. Request 2 adopts request 0's first 16 blocks:
    request 1's row holds the first 11 outside the window in block order, the next two only the host store has.
    Request 2 shares 11 and copies 2, starts settled on the exact path, and decodes as dense attention."""
    engine, radix = make_engine(40), RadixPages()
    ramp = Ramp(engine)
    try:
        join(ramp, radix, 0, 16 * BLOCK + 5)
        join(ramp, radix, 1, PREFIX + 24, owner=0)
        ramp.leave(0)
        poison_free_pages(engine)
        join(ramp, radix, 2, 16 * BLOCK + 9, owner=0, prefix=16 * BLOCK)
        pool = engine.pool
        assert len(pool.shared_pages[2]) == 11 and pool.shared_pages[2] == pool.shared_pages[1][:11]
        assert pool.prefix_blocks_copied == 2 and pool.settled >= {1, 2}
        for _ in range(3):
            assign_started_blocks(engine, radix, [1, 2])
            errors, exact, telemetry = ramp.step([1, 2])
            assert all(exact.values()) and telemetry.exact_path_steps == 1
            assert max(errors.values()) < 1e-4, errors
    finally:
        engine.close()
