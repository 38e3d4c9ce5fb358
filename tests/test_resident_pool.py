"""Resident-first serving (core/resident_pool.py): the pool's shares, its pages, the compaction of a shrinking row,
and an engine whose load ramps up and down: exact while the pool holds every block, sparse with no failure when it
does not, exact again when the load falls. Every decision through the switch: test_engine_oracle.py."""

import dataclasses
import random

import pytest
import torch

from scout_sglang import reference
from scout_sglang.config import ScoutConfig
from scout_sglang.core.engine import CoAttentionEngine
from scout_sglang.core.resident_pool import ResidentPool, compact_rows, exact_row_fields, water_fill
from scout_sglang.core.shape import ModelShape
from scout_sglang.layout import PAD_BLOCK

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_water_fill_gives_each_its_demand_or_the_level_and_no_page_twice():
    assert water_fill([3, 10, 20], 24) == [3, 10, 11]
    assert water_fill([3, 10, 20], 100) == [3, 10, 20]
    assert water_fill([9, 9, 9], 25) == [8, 8, 9]
    assert water_fill([], 10) == []
    rng = random.Random(0)
    for _ in range(300):
        demands = [rng.randrange(0, 30) for _ in range(rng.randrange(1, 9))]
        pages = rng.randrange(0, 150)
        given = water_fill(demands, pages)
        assert sum(given) == min(pages, sum(demands))
        assert all(0 <= g <= d for g, d in zip(given, demands))
        short = [g for g, d in zip(given, demands) if g < d]  # the ones the level cut: nobody has more than +1
        assert all(g >= max(given) - 1 for g in short)


def test_quotas_keep_the_floor_and_stop_at_the_row():
    pool = ResidentPool(40, first_page=0, max_requests=4, width=12, floor=6)
    quotas = pool.plan({0: 0, 1: 30, 2: 8, 3: 2})
    assert quotas == {0: 6, 1: 12, 2: 8, 3: 6}  # floor for the short ones, the row's width at most
    quotas = pool.plan({0: 20, 1: 20, 2: 20, 3: 0})
    assert quotas[3] == 6 and sum(quotas.values()) == 40 and min(quotas.values()) >= 6
    with pytest.raises(ValueError, match="fewer than max_requests x resident_blocks"):
        ResidentPool(23, first_page=0, max_requests=4, width=12, floor=6)


def test_a_quota_grows_and_shrinks_by_its_last_columns_and_frees_their_pages():
    pool = ResidentPool(10, first_page=100, max_requests=2, width=6, floor=2)
    pool.grow(7, 1, 5)
    pages = pool.table[1, :5].tolist()
    assert sorted(pages) == list(range(100, 105)) and pool.table[1, 5] == PAD_BLOCK
    pool.take_dirty()
    pool.shrink(7, 1, 2)
    assert pool.table[1, :2].tolist() == pages[:2] and set(pool.table[1, 2:].tolist()) == {PAD_BLOCK}
    assert pool.take_dirty() == {1: (2, 5)} and pool.evicted_columns == 3 and pool.pages.num_free == 8
    with pytest.raises(ValueError, match="its row has 6"):
        pool.grow(8, 0, 7)
    pool.grow(8, 0, 6)
    pool.pages.check_consistent()
    pool.release(7, 1)
    pool.release(8, 0)
    assert pool.pages.num_free == 10


def test_compaction_keeps_the_last_selection_best_first_then_the_rest_and_moves_their_data():
    heads, width, size, dim = 2, 5, 2, 3
    resident = torch.full((3, heads, width), PAD_BLOCK, dtype=torch.int32)
    resident[1, 0] = torch.tensor([4, 9, PAD_BLOCK, 2, 7])
    resident[1, 1] = torch.tensor([5, PAD_BLOCK, 3, 8, PAD_BLOCK])
    last = torch.full((3, heads, 4), PAD_BLOCK, dtype=torch.int32)
    last[1, 0] = torch.tensor([0, 7, 2, PAD_BLOCK])  # block 0 is forced (never resident)
    last[1, 1] = torch.tensor([3, PAD_BLOCK, PAD_BLOCK, PAD_BLOCK])
    resident[2, 0] = torch.tensor([6, 1, PAD_BLOCK, PAD_BLOCK, PAD_BLOCK])  # slot 2 keeps 4 columns: all it holds
    pages = torch.tensor([10, 11, 12, 13, 14], dtype=torch.int32)
    dev_k = torch.randn(16, heads, size, dim)
    dev_v = torch.randn(16, heads, size, dim)
    k_before, v_before = dev_k.clone(), dev_v.clone()
    state = torch.ones(3, heads, 3 + width, dtype=torch.int32)
    compact_rows(resident, [1, 2], [3, 4], torch.stack([pages, torch.arange(5, 10, dtype=torch.int32)]), last, dev_k, dev_v, max_blocks=12,
                 brake_state=state)
    assert resident[2, 0].tolist() == [6, 1, PAD_BLOCK, PAD_BLOCK, PAD_BLOCK]  # nothing to move
    assert resident[1, 0].tolist() == [7, 2, 9, PAD_BLOCK, PAD_BLOCK]  # selected best first, then the newest
    assert resident[1, 1].tolist() == [3, 8, 5, PAD_BLOCK, PAD_BLOCK]
    old_column = {0: {7: 4, 2: 3, 9: 1}, 1: {3: 2, 8: 3, 5: 0}}
    for h in range(heads):
        for column, block in enumerate(resident[1, h, :3].tolist()):
            source = int(pages[old_column[h][block]])
            assert torch.equal(dev_k[int(pages[column]), h], k_before[source, h])
            assert torch.equal(dev_v[int(pages[column]), h], v_before[source, h])
    assert torch.equal(resident[0], torch.full((heads, width), PAD_BLOCK, dtype=torch.int32))  # other slots kept
    assert state[1, :, 2].tolist() == [0, 0] and state[1, :, 3:].sum() == 0 and state[0].sum() == heads * 8
    assert torch.equal(dev_k[5:10], k_before[5:10]) and torch.equal(dev_v[5:10], v_before[5:10])  # slot 2's pages


def test_compaction_of_a_row_exact_since_its_last_sparse_step_keeps_its_newest_blocks():
    """Its last selection is stale (the exact path selects nothing): such a row keeps its newest blocks, newest
    first, whatever its columns and selection say."""
    resident = torch.full((2, 1, 5), PAD_BLOCK, dtype=torch.int32)
    resident[1, 0] = torch.tensor([3, 9, 5, PAD_BLOCK, 7])
    last = torch.full((2, 1, 4), PAD_BLOCK, dtype=torch.int32)
    last[1, 0, :2] = torch.tensor([3, 5])  # stale: ignored
    pages = torch.arange(10, 15, dtype=torch.int32).view(1, -1)
    dev_k, dev_v = torch.randn(16, 1, 2, 3), torch.randn(16, 1, 2, 3)
    k_before = dev_k.clone()
    compact_rows(resident, [1], [2], pages, last, dev_k, dev_v, max_blocks=12, by_recency=[True])
    assert resident[1, 0].tolist() == [9, 7] + [PAD_BLOCK] * 3
    assert torch.equal(dev_k[10], k_before[11]) and torch.equal(dev_k[11], k_before[14])  # block 9's data, block 7's
    resident[1, 0] = torch.tensor([3, 9, 5, PAD_BLOCK, 7])
    compact_rows(resident, [1], [2], pages, last, dev_k, dev_v, max_blocks=12, by_recency=[False])
    assert resident[1, 0].tolist() == [3, 5] + [PAD_BLOCK] * 3  # the control: its last selection first


def test_exact_rows_select_every_block_and_fill_their_whole_row():
    fields = exact_row_fields([True, False], width=20, forced=3, topk=6, recall_quota=4, num_kv_heads=2)
    assert fields["row_topk"].tolist() == [23, 6]
    assert fields["recall_quota"].tolist() == [[20, 20], [4, 4]]


SHAPE = ModelShape(num_layers=3, num_qo_heads=4, num_kv_heads=2, head_dim=16)


class Ramp:
    """Requests that join and leave an engine; the truth of every token's K/V, for dense attention."""

    def __init__(self, engine, seed=0):
        self.engine, self.gen = engine, torch.Generator().manual_seed(seed)
        self.kv = {}

    def join(self, rid, length):
        self.engine.add_request(rid)
        for layer in range(SHAPE.num_layers):
            k, v = self._randn(length, SHAPE.num_kv_heads), self._randn(length, SHAPE.num_kv_heads)
            self.kv[rid, layer] = (k, v)
            self.engine.prefill(rid, layer, k, v)

    def join_in_chunks(self, rid, chunks):
        """A prompt prefilled in chunks of these lengths (chunked prefill), each through every layer."""
        self.engine.add_request(rid)
        length = sum(chunks)
        for layer in range(SHAPE.num_layers):
            self.kv[rid, layer] = (self._randn(length, SHAPE.num_kv_heads), self._randn(length, SHAPE.num_kv_heads))
        start = 0
        for size in chunks:
            for layer in range(SHAPE.num_layers):
                k, v = self.kv[rid, layer]
                self.engine.extend(rid, layer, start, k[start: start + size], v[start: start + size])
            start += size

    def leave(self, rid):
        self.engine.release_request(rid)

    def step(self, rids):
        """One decode step -> (per rid: its largest error against dense attention over all layers, exact or not),
        telemetry."""
        engine, batch = self.engine, len(rids)
        engine.begin_step(rids)
        exact = {rid: engine.pool.exact[rid] for rid in rids}
        errors = {rid: 0.0 for rid in rids}
        for layer in range(SHAPE.num_layers):
            q = self._randn(batch, SHAPE.num_qo_heads)
            k_new, v_new = self._randn(batch, SHAPE.num_kv_heads), self._randn(batch, SHAPE.num_kv_heads)
            if layer + 1 < SHAPE.num_layers and engine.wants_prediction(layer + 1):
                engine.predict(layer + 1, self._randn(batch, SHAPE.num_qo_heads))  # a poor prediction
            out = engine.attend(layer, q, k_new, v_new)
            for b, rid in enumerate(rids):
                k, v = self.kv[rid, layer]
                k, v = torch.cat([k, k_new[b: b + 1]]), torch.cat([v, v_new[b: b + 1]])
                self.kv[rid, layer] = (k, v)
                dense = reference.dense_decode(q[b], k, v, scale=SHAPE.softmax_scale)[0]
                errors[rid] = max(errors[rid], (out[b] - dense).abs().max().item())
        return errors, exact, engine.end_step()

    def _randn(self, *shape):
        return torch.randn(*shape, SHAPE.head_dim, generator=self.gen)


def test_a_ramp_is_exact_at_low_load_sparse_without_failure_at_full_load_and_exact_again_after():
    """Pool of 4 x 6 pages; requests of ~100 tokens need 9-12 blocks outside the window: one or two fit (exact:
    dense attention, no CPU part, though the prediction is poor; the workers are not woken, and that is no
    fallback), four do not (sparse: the CPU part works, the rows shrink to the floor); when three leave, the last is
    filled again and exact."""
    config = ScoutConfig(mode="scout", block_size=8, token_budget=48, sink_blocks=1, local_blocks=2, cpu_groups=1,
                         resident_first=True)
    engine = CoAttentionEngine(config, SHAPE, dtype=torch.float32, max_requests=4, max_tokens_per_request=256)
    ramp = Ramp(engine)
    seen = {"exact": 0, "sparse": 0, "sparse_cpu": 0}
    kicks = []
    kick = engine.cpu_worker.kick
    engine.cpu_worker.kick = lambda: (kicks.append(1), kick())[1]
    try:
        for phase, rids in enumerate([[0], [0, 1], [0, 1, 2], [0, 1, 2, 3], [3]]):
            for rid in rids:
                if rid not in engine.requests:
                    ramp.join(rid, 96 + 5 * rid)
            for rid in list(engine.requests):
                if rid not in rids:
                    ramp.leave(rid)
            for _ in range(10):
                kicked = len(kicks)
                errors, exact, telemetry = ramp.step(rids)
                all_exact = all(exact[rid] for rid in rids)
                assert telemetry.worker_free_steps == all_exact and (len(kicks) == kicked) == all_exact, phase
                assert "device_only" not in telemetry.cpu_fallbacks, telemetry.cpu_fallbacks
                for rid in rids:
                    if exact[rid]:
                        assert errors[rid] < 2e-5, (phase, rid, errors[rid])
                        seen["exact"] += 1
                    else:
                        seen["sparse"] += 1
                if all(exact.values()):
                    assert telemetry.totals().cpu_blocks == 0, phase
                elif phase == 3:
                    seen["sparse_cpu"] += telemetry.totals().cpu_blocks
                assert telemetry.exact_requests == sum(exact.values())
            quotas = [engine.pool.quota(rid) for rid in rids]
            if phase == 3:
                assert quotas == [6, 6, 6, 6] and not any(exact.values())
            if phase in (0, 4):
                assert all(exact.values())
        assert seen["exact"] > 20 and seen["sparse"] > 20 and seen["sparse_cpu"] > 0
        state = engine.resident_pool_state()
        assert state["evicted_columns"] > 0 and state["exact_requests"] == state["requests"] == 1
        ramp.leave(3)
        usage = engine.usage()
        assert usage["resident_pool_pages"] == usage["device_window_pages"] == usage["host_pages"] == 0
    finally:
        engine.close()
    engine.pool.pages.check_consistent()


@pytest.mark.parametrize("lengths", [(96, 70), (96, 101, 106, 111)])
def test_requests_prefilled_together_layer_by_layer_keep_their_quotas_and_exact_rows_are_exact(lengths):
    """SGLang stores a prefill batch layer by layer: each request's chunk in layer 0, then each in layer 1, ... While
    the second is rebalanced the first is mid-chunk, and counts at its chunk's end: counted at its committed 0
    tokens, it was shrunk to the floor yet stayed exact, and its later layers' prefill wrote blocks into columns
    with no page (an exact row 0.28 off dense attention). Two requests fit the pool (exact, dense attention's
    outputs); four do not (sparse, with a CPU part, and no write past a quota)."""
    config = ScoutConfig(mode="scout", block_size=8, token_budget=48, sink_blocks=1, local_blocks=2, cpu_groups=1,
                         resident_first=True)
    engine = CoAttentionEngine(config, SHAPE, dtype=torch.float32, max_requests=4, max_tokens_per_request=256)
    ramp = Ramp(engine)
    rids = list(range(len(lengths)))
    try:
        for rid in rids:
            engine.add_request(rid)
        for layer in range(SHAPE.num_layers):
            for rid, length in zip(rids, lengths):
                k, v = ramp._randn(length, SHAPE.num_kv_heads), ramp._randn(length, SHAPE.num_kv_heads)
                ramp.kv[rid, layer] = (k, v)
                engine.prefill(rid, layer, k, v)
        if len(rids) == 2:  # each fits: its prefill wrote every block outside its window into its columns
            for rid, length in zip(rids, lengths):
                outside = length // config.block_size - config.sink_blocks - config.local_blocks
                for layer in engine.offloaded_layers:
                    row = engine.offloaded.resident_map[layer][engine.requests[rid].slot]
                    assert row[:, :outside].tolist() == [list(range(1, outside + 1))] * SHAPE.num_kv_heads, rid
        cpu_blocks = 0
        for _ in range(10):
            errors, exact, telemetry = ramp.step(rids)
            assert all(exact.values()) == (len(rids) == 2) and any(exact.values()) == (len(rids) == 2)
            for rid in rids:
                if exact[rid]:
                    assert errors[rid] < 2e-5, (rid, errors[rid])
            cpu_blocks += telemetry.totals().cpu_blocks
        assert (cpu_blocks > 0) == (len(rids) == 4)
        assert sum(engine.pool.quota(rid) for rid in rids) <= engine.pool.pages.num_pages
    finally:
        engine.close()


def test_a_prefill_write_past_a_quota_is_refused_and_the_row_filled_at_the_first_step(caplog):
    """The guard behind the batch prefill's fix: a request counted exact while its quota is below its blocks (here a
    rebalance is given its committed 0 tokens, as the bug did) gets no block written past its quota, an error in the
    log, and its row filled from the host at its first step, where it equals dense attention."""
    config = ScoutConfig(mode="scout", block_size=8, token_budget=48, sink_blocks=1, local_blocks=2, cpu_groups=1,
                         resident_first=True)
    engine = CoAttentionEngine(config, SHAPE, dtype=torch.float32, max_requests=4, max_tokens_per_request=256)
    ramp = Ramp(engine)
    try:
        engine.add_request(0)
        first, last = engine.offloaded_layers[0], engine.offloaded_layers[-1]
        for layer in range(SHAPE.num_layers):
            ramp.kv[0, layer] = (ramp._randn(96, SHAPE.num_kv_heads), ramp._randn(96, SHAPE.num_kv_heads))
            engine.prefill(0, layer, *ramp.kv[0, layer])
            if layer == first:
                assert engine.pool.quota(0) == 9 and engine.pool.exact[0]
                engine._rebalance_pool({0: 0})  # as if its chunk were not being stored: the floor, still "exact"
                assert engine.pool.quota(0) == 6 and engine.pool.exact[0]
        assert "its prefill moves block 9 out of its window" in caplog.text and not engine.pool.exact[0]
        assert (engine.offloaded.resident_map[last][engine.requests[0].slot] == PAD_BLOCK).all()  # nothing written
        errors, exact, telemetry = ramp.step([0])
        assert exact[0] and errors[0] < 2e-5 and telemetry.totals().cpu_blocks == 0
    finally:
        engine.close()


def test_a_request_replayed_alone_at_its_recorded_quotas_decodes_as_it_did_among_others():
    """The quota runs the pool records per request (served on /server_info) are what a reference decoder replays:
    each request of a ramp through exact, sparse and exact again, decoded alone with the same inputs at its runs,
    gives the outputs it had among the others, and records the same runs. Alone at its water-filled share (no
    replay) the requests that went sparse decode otherwise: the control."""
    config = ScoutConfig(mode="scout", block_size=8, token_budget=48, sink_blocks=1, local_blocks=2, cpu_groups=1,
                         resident_first=True)
    engine = CoAttentionEngine(config, SHAPE, dtype=torch.float32, max_requests=4, max_tokens_per_request=256)
    ramp, prompts, steps = Ramp(engine), {}, {rid: [] for rid in range(4)}
    try:
        for rids in ([0], [0, 1, 2, 3], [3]):
            for rid in rids:
                if rid not in engine.requests:
                    ramp.join(rid, 96 + 5 * rid)
                    prompts[rid] = [ramp.kv[rid, layer] for layer in range(SHAPE.num_layers)]
            for rid in list(engine.requests):
                if rid not in rids:
                    ramp.leave(rid)
            for _ in range(6):
                for rid, layers in recorded_step(engine, ramp, rids)[0].items():
                    steps[rid].append(layers)
        for rid in list(engine.requests):
            ramp.leave(rid)
        recorded = {(runs["prompt_tokens"] - 96) // 5: runs for runs in engine.pool.recent}
    finally:
        engine.close()
    assert sorted(recorded) == [0, 1, 2, 3]
    assert all(len({quota for quota, _ in recorded[rid]["quota_runs"]}) > 1 for rid in (0, 3)), recorded
    differs = 0
    for rid, runs in recorded.items():
        alone = CoAttentionEngine(dataclasses.replace(config, resident_pool_blocks=24), SHAPE, dtype=torch.float32,
                                  max_requests=1, max_tokens_per_request=256)
        replayed = replay_alone(alone, rid, prompts[rid], steps[rid], runs["quota_runs"])
        assert alone.pool.recent[0] == runs
        for step, (layers, outs) in enumerate(zip(steps[rid], replayed)):
            for layer, ((*_, out), again) in enumerate(zip(layers, outs)):
                torch.testing.assert_close(again, out, atol=1e-5, rtol=1e-5, msg=f"request {rid} step {step} layer {layer}")
        water_filled = CoAttentionEngine(config, SHAPE, dtype=torch.float32, max_requests=1, max_tokens_per_request=256)
        outs = replay_alone(water_filled, rid, prompts[rid], steps[rid], None)
        differs += any(not torch.allclose(again, layers[layer][-1], atol=1e-5)
                       for layers, step_outs in zip(steps[rid], outs) for layer, again in enumerate(step_outs))
    assert differs >= 2


def test_a_request_exact_beside_a_sparse_one_decodes_as_alone_on_the_exact_path():
    """The exact path runs only when every request of the step is exact, so one request may take either path for
    the same step: exact beside a sparse request it is selected and split like any row, alone it skips both.
    Request 0 runs exact with a short one (the exact path), exact beside a sparse one (the selecting path), then
    its quota shrinks and it is sparse; replayed alone at its quotas (the exact path wherever it is exact) it gives the same
    outputs at every step and layer, also after it went sparse (a row exact since its last sparse step keeps its
    first columns, its selection runs and brake start afresh: neither depends on the path)."""
    config = ScoutConfig(mode="scout", block_size=8, token_budget=48, sink_blocks=1, local_blocks=2, cpu_groups=1,
                         resident_first=True)
    engine = CoAttentionEngine(config, SHAPE, dtype=torch.float32, max_requests=4, max_tokens_per_request=256)
    ramp, steps, paths = Ramp(engine), [], []
    try:
        for rid, length in ((0, 96), (2, 60)):
            ramp.join(rid, length)
        prompt = [ramp.kv[0, layer] for layer in range(SHAPE.num_layers)]
        for rids, count in (([0, 2], 4), ([0, 1, 2], 3), ([0, 1, 2, 3], 6)):
            for rid, length in ((1, 130), (3, 60)):
                if rid in rids and rid not in engine.requests:
                    ramp.join(rid, length)
            for _ in range(count):
                kept, exact_path = recorded_step(engine, ramp, rids)
                steps.append(kept[0])
                paths.append("exact path" if exact_path else "exact" if engine.pool.exact.get(0) else "sparse")
        ramp.leave(0)
        runs = engine.pool.recent[-1]
    finally:
        engine.close()
    quotas = [quota for quota, count in runs["quota_runs"] for _ in range(count)]
    assert quotas[0] > quotas[-1] and {"exact path", "exact", "sparse"} <= set(paths), (paths, runs)
    assert_replayed_alone(config, prompt, steps, runs, paths)


def test_a_dip_between_two_steps_is_recorded_and_replayed():
    """Another request comes and goes between two steps: request 0's quota shrinks (its row compacted) and grows
    back before its next step, which runs at the quota it had. The pool records the dip as a run [quota, 1, low],
    and a replay alone repeats it (outputs equal at every step); replayed without it, the row keeps blocks the
    server's compaction dropped and the outputs differ (the control)."""
    config = ScoutConfig(mode="scout", block_size=8, token_budget=48, sink_blocks=1, local_blocks=2, cpu_groups=1,
                         resident_first=True)
    engine = CoAttentionEngine(config, SHAPE, dtype=torch.float32, max_requests=4, max_tokens_per_request=256)
    ramp, steps = Ramp(engine), []
    try:
        for rid, length in ((0, 96), (1, 110), (2, 130)):
            ramp.join(rid, length)
        prompt = [ramp.kv[0, layer] for layer in range(SHAPE.num_layers)]
        for step in range(8):
            if step == 4:  # between steps 3 and 4: a fourth request is admitted, prefilled and aborted
                ramp.join(3, 60)
                ramp.leave(3)
            steps.append(recorded_step(engine, ramp, [0, 1, 2])[0][0])
        ramp.leave(0)
        runs = engine.pool.recent[-1]
    finally:
        engine.close()
    dips = [run for run in runs["quota_runs"] if len(run) == 3]
    assert len(dips) == 1 and dips[0][2] < dips[0][0], runs
    assert_replayed_alone(config, prompt, steps, runs)
    no_dip = replay_alone(alone_engine(config), 0, prompt, steps, [run[:2] for run in runs["quota_runs"]])
    assert any(not torch.allclose(replayed, layers[layer][-1], atol=1e-5)
               for layers, again in zip(steps, no_dip) for layer, replayed in enumerate(again))


def test_exact_path_steps_count_no_fallback_when_the_workers_are_bypassed():
    """With the CPU workers bypassed (device-only after failures) a step on the selecting path computes each CPU
    part itself and counts a device-only fallback per CPU layer; a step on the exact path has no CPU part, so it
    counts none (it was once subtracted from the planned ones, which made one up per layer)."""
    config = ScoutConfig(mode="scout", block_size=8, token_budget=48, sink_blocks=1, local_blocks=2, cpu_groups=1,
                         resident_first=True)
    engine = CoAttentionEngine(config, SHAPE, dtype=torch.float32, max_requests=4, max_tokens_per_request=256)
    ramp = Ramp(engine)
    try:
        engine.handoff.use_worker = lambda: False
        ramp.join(0, 96)
        for _ in range(3):
            errors, exact, telemetry = ramp.step([0])
            assert exact[0] and errors[0] < 2e-5 and telemetry.exact_path_steps == 1
            assert telemetry.cpu_fallbacks == {}, telemetry.cpu_fallbacks
        engine.exact_path = False  # the control: the selecting path, bypassed, counts its device-only parts
        errors, exact, telemetry = ramp.step([0])
        assert telemetry.exact_path_steps == 0 and telemetry.cpu_fallbacks == {"device_only": len(engine.handoff.layers)}
    finally:
        engine.close()


def test_a_peak_between_two_steps_leaves_the_row_as_it_was():
    """Between two steps one request leaves and a longer one arrives: at its admission the newcomer asks only the
    floor, so request 0's quota grows past its blocks (it turns exact), and the newcomer's prefill takes the pages
    back (sparse again) before request 0's next step. Its row has gained nothing in between: no compaction, no
    reset of its selection runs or brake, and no dip in its runs; replayed alone at them, it decodes as it did."""
    config = ScoutConfig(mode="scout", block_size=8, token_budget=48, sink_blocks=1, local_blocks=2, cpu_groups=1,
                         resident_first=True)
    engine = CoAttentionEngine(config, SHAPE, dtype=torch.float32, max_requests=4, max_tokens_per_request=256)
    ramp, steps, exact_between = Ramp(engine), [], []
    try:
        for rid, length in ((0, 96), (1, 110), (2, 130)):
            ramp.join(rid, length)
        prompt = [ramp.kv[0, layer] for layer in range(SHAPE.num_layers)]
        rids = [0, 1, 2]
        for step in range(10):
            if step == 4:  # between steps 3 and 4: request 2 finishes, request 3 arrives
                ramp.leave(2)
                engine.add_request(3)
                exact_between.append(engine.pool.exact[0])
                engine.release_request(3)
                ramp.join(3, 110)
                rids = [0, 1, 3]
            steps.append(recorded_step(engine, ramp, rids)[0][0])
        ramp.leave(0)
        runs = engine.pool.recent[-1]
    finally:
        engine.close()
    assert exact_between == [True] and not any(len(run) == 3 for run in runs["quota_runs"]), runs
    assert_replayed_alone(config, prompt, steps, runs)


def alone_engine(config):
    """An engine for one request, its pool as large as the ramps' (what a replay at their quotas needs)."""
    return CoAttentionEngine(dataclasses.replace(config, resident_pool_blocks=24), SHAPE, dtype=torch.float32,
                             max_requests=1, max_tokens_per_request=256)


def assert_replayed_alone(config, prompt, steps, runs, labels=None):
    """Request 0 replayed alone at its recorded quota runs records the same runs and gives the recorded outputs at
    every step and layer (labels: a name per step, for the message)."""
    alone = alone_engine(config)
    replayed = replay_alone(alone, 0, prompt, steps, runs["quota_runs"])
    assert alone.pool.recent[0] == runs
    for step, (layers, again) in enumerate(zip(steps, replayed)):
        where = f"step {step}" + (f" ({labels[step]})" if labels else "")
        for layer, ((*_, out), replayed_out) in enumerate(zip(layers, again)):
            torch.testing.assert_close(replayed_out, out, atol=1e-5, rtol=1e-5, msg=f"{where} layer {layer}")


def recorded_step(engine, ramp, rids):
    """Ramp.step that keeps each request's inputs and outputs -> (rid -> per layer (q, k_new, v_new, prediction of
    the next layer or None, out), whether the step ran the exact path)."""
    batch = len(rids)
    exact_path = engine.begin_step(rids).exact_step
    kept = {rid: [] for rid in rids}
    for layer in range(SHAPE.num_layers):
        q = ramp._randn(batch, SHAPE.num_qo_heads)
        k_new, v_new = ramp._randn(batch, SHAPE.num_kv_heads), ramp._randn(batch, SHAPE.num_kv_heads)
        predicted = None
        if layer + 1 < SHAPE.num_layers and engine.wants_prediction(layer + 1):
            predicted = ramp._randn(batch, SHAPE.num_qo_heads)
            engine.predict(layer + 1, predicted)
        out = engine.attend(layer, q, k_new, v_new)
        for b, rid in enumerate(rids):
            kept[rid].append((q[b], k_new[b], v_new[b], None if predicted is None else predicted[b], out[b].clone()))
    engine.end_step()
    return kept, exact_path


def replay_alone(engine, rid, prompt, steps, quota_runs):
    """Decode `rid` alone in `engine` from its prompt K/V through the recorded steps' inputs, at `quota_runs` (None:
    its water-filled share) -> per step, per layer, its output."""
    outs = []
    try:
        if quota_runs is not None:
            engine.pool.replayed[rid] = quota_runs
        engine.add_request(rid)
        for layer, (k, v) in enumerate(prompt):
            engine.prefill(rid, layer, k, v)
        for layers in steps:
            engine.begin_step([rid])
            step_outs = []
            for layer, (q, k_new, v_new, predicted, _) in enumerate(layers):
                if predicted is not None:
                    engine.predict(layer + 1, predicted[None])
                step_outs.append(engine.attend(layer, q[None], k_new[None], v_new[None])[0].clone())
            engine.end_step()
            outs.append(step_outs)
        engine.release_request(rid)
    finally:
        engine.close()
    return outs


@pytest.mark.parametrize("chunks", [(101,), (13, 30, 21, 37)])
def test_prefill_writes_a_fitting_request_to_the_pool_and_its_first_step_reads_nothing_from_the_host(chunks):
    """A request that fits its quota gets the blocks its prefill moves out of the window in its pool columns (block
    sink + c in column c; from an earlier chunk, out of the window pages), so its first step attends them all on
    the device: with its host blocks poisoned, it still equals dense attention. When more requests join before it
    decodes and it no longer fits, its row is emptied (its first fill picks by score)."""
    config = ScoutConfig(mode="scout", block_size=8, token_budget=48, sink_blocks=1, local_blocks=2, cpu_groups=1,
                         resident_first=True)
    engine = CoAttentionEngine(config, SHAPE, dtype=torch.float32, max_requests=4, max_tokens_per_request=256)
    ramp = Ramp(engine, seed=3)
    try:
        ramp.join_in_chunks(0, chunks)
        store, slot, size = engine.offloaded, engine.requests[0].slot, config.block_size
        outside = sum(chunks) // size - config.sink_blocks - config.local_blocks
        assert engine.pool.exact[0] and outside == 9
        for layer in engine.offloaded_layers:
            row = store.resident_map[layer][slot]
            assert row[:, :outside].tolist() == [list(range(1, outside + 1))] * SHAPE.num_kv_heads
            assert (row[:, outside:] == PAD_BLOCK).all()
            k, v = ramp.kv[0, layer]
            pages = engine.pool.table[slot, :outside].long()
            for truth, stored in ((k, store.dev_k[layer]), (v, store.dev_v[layer])):
                blocks = truth[size: (outside + 1) * size].reshape(outside, size, SHAPE.num_kv_heads, -1)
                assert torch.equal(stored[pages], blocks.transpose(1, 2))
            host = torch.tensor(store.host_pages.table(0)[: sum(chunks) // size], dtype=torch.long)
            store.host_k[layer][host] = float("nan")
            store.host_v[layer][host] = float("nan")
        errors, exact, telemetry = ramp.step([0])
        assert exact[0] and errors[0] < 2e-5 and telemetry.totals().cpu_blocks == 0
        ramp.leave(0)
        ramp.join_in_chunks(0, chunks)
        assert (store.resident_map[engine.offloaded_layers[0]][engine.requests[0].slot] != PAD_BLOCK).any()
        for rid in (1, 2, 3):
            ramp.join(rid, 100)
        assert not any(engine.pool.exact.values()) and [engine.pool.quota(rid) for rid in range(4)] == [6] * 4
        for layer in engine.offloaded_layers:
            assert (store.resident_map[layer][engine.requests[0].slot] == PAD_BLOCK).all()
    finally:
        engine.close()


@pytest.mark.parametrize("table_fits_a_histogram", [True, False])
def test_where_the_stages_are_triton_a_row_holds_at_most_what_they_compile_for(table_fits_a_histogram, monkeypatch):
    """Triton's stages compile for rows of WIDEST_ROW columns (kernels/triton/stage_recall.py; past 256 they look
    blocks up through a histogram of block ids); where a table's ids do not fit one, rows of ALL_PAIRS_ROW. There
    a resident-first row is at most that many blocks with the forced ones, and a longer request stays sparse
    however large the pool; the torch stage takes the whole row."""
    from scout_sglang.kernels.triton import sizes
    from scout_sglang.kernels.triton.stage_recall import ALL_PAIRS_ROW, WIDEST_ROW

    if not table_fits_a_histogram:
        monkeypatch.setattr(sizes, "MAX_BINS", 1024)
    tokens = 8 * 2 * WIDEST_ROW  # a table of twice the widest row's blocks (8193 ids: 16384 bins)
    config = ScoutConfig(mode="scout", block_size=8, token_budget=48, sink_blocks=1, local_blocks=2, cpu_groups=1,
                         resident_first=True, resident_pool_blocks=9000)
    rows = {}
    for impl in ("torch", "triton"):
        engine = CoAttentionEngine(config.replace(kernel_impl=impl), SHAPE, dtype=torch.float32, max_requests=4,
                                   max_tokens_per_request=tokens, cpu_worker=False)
        rows[impl] = engine.offloaded.resident_width
        assert engine.select_width == rows[impl] + 3 and engine.resident_pool_state()["row_blocks"] == rows[impl]
        assert engine.pool.plan({0: 6000}) == {0: min(6000, rows[impl])}  # exact only on the torch stage
        engine.close()
    widest = WIDEST_ROW if table_fits_a_histogram else ALL_PAIRS_ROW
    assert rows == {"torch": tokens // 8 + 1 - 3, "triton": widest - 3}
