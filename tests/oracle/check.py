"""The oracle: checks every traced decision of an engine and recomputes its output from the driver's K/V.

For each step, layer, request and KV head of a DecisionTrace it checks, with
the rules of policy.py and nothing of scout_sglang.core:
- which query selected (the predicted one exactly where the mode predicts);
- the selection is a top-k of Quest scores recomputed from the driver's keys;
- the device set is the window plus the resident buffer (its selected part for
  infinigen), the CPU set is the selection minus the device set, capped; the
  two are disjoint and cover the selection;
- the resident buffer: no duplicates, no window block, window admission,
  first fill, infinigen recall and scout's recall (with its hysteresis, brake
  and per-step cap) each move exactly the blocks the policy names (recall only
  CPU-list blocks);
and recomputes the layer's output: the device part with the real query, the
CPU part with the query the CPU was given, and (estimate on) the estimate of
the full blocks that are neither selected nor attended, with the real query,
merged by natural-log LSE.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
from oracle import policy

from scout_sglang import reference

SCORE_TOLERANCE = 1e-4  # scores are sums of D products: the engine's and ours may differ in the last bits


@dataclass
class OracleReport:
    """How much the checked run exercised: a check over nothing proves nothing."""

    decisions: int = 0
    cpu_blocks: int = 0
    recalled_blocks: int = 0
    first_fills: int = 0
    admitted_blocks: int = 0
    predicted_layers: int = 0
    block_fills: int = 0
    outputs_checked: int = 0
    withheld_blocks: int = 0  # scout recall candidates the hysteresis kept on the CPU
    capped_blocks: int = 0  # scout recall candidates left for lack of cap (or of victims)
    backed_off_rows: int = 0  # (step, layer, request, head) rows whose recall brake was above level 0
    zero_copy_blocks: int = 0  # the CPU split's device share
    exact_rows: int = 0  # resident-first: (step, layer, request, head) rows that selected every block
    quota_shrinks: int = 0  # resident-first: (layer, request, head) rows compacted to a smaller quota
    exact_path_rows: int = 0  # resident-first: (step, layer, request, head) rows of steps on the exact path
    by_mode: Counter = field(default_factory=Counter)


def listed_off_device(decision, b, h) -> list[int]:
    """The whole CPU list of (request b, KV head h): the workers' share, then (with the CPU split) the device's."""
    zero_copy = decision.zero_copy_blocks[b][h] if decision.zero_copy_blocks is not None else []
    return decision.cpu_blocks[b][h] + zero_copy


def expects_offloaded(config, layer) -> bool:
    return config.mode in ("scout", "infinigen", "hgca") and layer not in config.dense_layers


def expects_prediction(config, layer) -> bool:
    return (config.layer_ahead and config.mode in ("scout", "infinigen") and layer >= 1
            and expects_offloaded(config, layer))


def check_topk(selected, scores, num_full, config, where, *, topk=None):
    """selected is a top-k of scores (k: topk, else the budget's) with the forced blocks first, best first after
    them."""
    forced = set(range(min(config.sink_blocks, num_full))) | set(range(max(num_full - config.local_blocks, 0), num_full))
    topk = config.topk_blocks if topk is None else topk
    assert len(selected) == min(topk, num_full), f"{where}: {len(selected)} blocks selected"
    assert len(set(selected)) == len(selected), f"{where}: a block selected twice: {selected}"
    assert forced <= set(selected), f"{where}: forced blocks {sorted(forced - set(selected))} not selected"
    rest = [j for j in selected if j not in forced]
    assert selected[: len(selected) - len(rest)] == sorted(forced), f"{where}: forced blocks must come first"
    others = [j for j in range(num_full) if j not in set(selected)]
    if rest and others:
        worst_in, best_out = min(float(scores[j]) for j in rest), max(float(scores[j]) for j in others)
        assert worst_in >= best_out - SCORE_TOLERANCE, (
            f"{where}: block scoring {best_out} left out while {worst_in} was selected (not a top-k)")
    for a, b in zip(rest, rest[1:]):
        assert float(scores[a]) >= float(scores[b]) - SCORE_TOLERANCE, f"{where}: selection not best first"


class Oracle:
    """Checks one engine run: call check(trace.decisions, outputs) after driver.run(engine)."""

    def __init__(self, config, shape, driver, *, element_size: int = 4):
        """element_size: bytes per K/V element of the checked engine (the recall cap counts bytes)."""
        self.config, self.shape, self.driver = config, shape, driver
        self.block_bytes = 2 * config.block_size * shape.head_dim * element_size
        self.num_offloaded = max(sum(expects_offloaded(config, layer) for layer in range(shape.num_layers)), 1)
        self.resident = {}  # (rid, layer) -> [Hkv][R] after the last step it decoded
        self.runs, self.brakes = {}, {}  # (rid, layer, head) -> {block: (position, run)} / policy.Brake
        self.filled = set()
        # resident-first (core/resident_pool.py): per (rid, layer, head) the quota and exactness last seen, and the
        # last selection (what a shrinking quota keeps first)
        self.quota, self.exact, self.last_selected = {}, {}, {}
        self.unselected = set()  # rows exact since their last sparse step: a shrink keeps their newest blocks
        self.report = OracleReport()

    def check(self, decisions, outputs) -> OracleReport:
        c, heads = self.config, range(self.shape.num_kv_heads)
        for decision in decisions:
            s, layer = decision.step, decision.layer
            predicts = expects_prediction(c, layer) and not decision.exact_path  # the exact path selects nothing
            assert bool(self.driver.was_predicted[s, layer]) == predicts, (
                f"step {s} layer {layer}: the engine asked for a prediction where the mode says otherwise")
            assert decision.offloaded == expects_offloaded(c, layer), f"layer {layer}: wrong store"
            self.report.predicted_layers += int(self.driver.was_predicted[s, layer])
            for b, rid in enumerate(decision.rids):
                where = f"step {s} layer {layer} request {rid}"
                n = decision.num_tokens[b]
                assert n == self.driver.lengths[b] + s + 1, f"{where}: {n} tokens"
                self.report.block_fills += int(n % c.block_size == 0)
                q_real = self.driver.queries[s, layer, b]
                q_select = self.driver.predicted[s, layer, b] if self.driver.was_predicted[s, layer] else q_real
                keys, values = self.driver.kv(b, layer, s)
                scores = policy.block_scores(q_select, keys, n // c.block_size, c.block_size)
                if decision.offloaded:
                    for h in heads:
                        self._check_offloaded_head(decision, b, h, n, scores[h], f"{where} head {h}")
                else:
                    for h in heads:
                        self._check_full_head(decision, b, h, n, scores[h], f"{where} head {h}")
                self._check_output(decision, b, q_real, q_select, keys, values, outputs[s, layer, b], where)
            self.report.decisions += 1
            self.report.by_mode[c.mode] += 1
        return self.report

    def _check_full_head(self, decision, b, h, n, scores, where):
        c = self.config
        num_full, tail = divmod(n, c.block_size)
        device = decision.device_blocks[b][h]
        if c.mode == "quest" and decision.layer not in c.dense_layers:
            selected = decision.selected[b][h]
            check_topk(selected, scores, num_full, c, where)
            assert device == selected + ([num_full] if tail else []), f"{where}: device blocks {device}"
        else:
            assert device == list(range(num_full + (1 if tail else 0))), f"{where}: a dense layer must see every block"
        assert decision.cpu_blocks[b][h] == [], f"{where}: a device-full layer has no CPU part"

    def _check_offloaded_head(self, decision, b, h, n, scores, where):
        c, rid, layer = self.config, decision.rids[b], decision.layer
        num_full = n // c.block_size
        window = policy.window_blocks(n, c.block_size, c.sink_blocks, c.local_blocks)
        forced = policy.forced_blocks(n, c.block_size, c.sink_blocks, c.local_blocks)
        selected = [] if decision.selected is None else decision.selected[b][h]
        exact = decision.exact is not None and decision.exact[b]  # resident-first: every block selected
        self.report.exact_rows += int(exact)
        if decision.exact_path:  # every row exact and settled: nothing selected, every block on the device
            assert exact and decision.selected is None, f"{where}: the exact path for a row that is not exact"
            self.report.exact_path_rows += 1
        elif num_full:
            assert decision.selected is not None, f"{where}: {num_full} full blocks but no selection"
            check_topk(selected, scores, num_full, c, where, topk=num_full if exact else None)
        else:
            assert selected == [], f"{where}: a selection without a full block"
        resident = self._check_resident(decision, b, h, n, selected, scores, where) if c.mode in ("scout", "infinigen") else []
        if c.mode == "infinigen":
            resident = [j for j in resident if j in set(selected)]
        device, cpu = decision.device_blocks[b][h], decision.cpu_blocks[b][h]
        assert sorted(device) == sorted(resident + window), f"{where}: device blocks {device}, expected {resident + window}"
        if decision.exact_path:
            assert sorted(device) == list(range(-(-n // c.block_size))), f"{where}: exact path attends {device}"
        if c.mode in ("scout", "hgca"):
            expected_cpu = policy.cpu_list(selected, set(device), c.cpu_capacity)
            if decision.cpu_cap is not None:  # the CPU split: the workers' share first, the device's the rest
                zero_copy = decision.zero_copy_blocks[b][h]
                workers, rest = reference.split_shares(expected_cpu, decision.cpu_cap[b])
                assert (cpu, zero_copy) == (workers, rest), (
                    f"{where}: split {cpu} | {zero_copy}, expected {workers} | {rest} at cap {decision.cpu_cap[b]}")
                self.report.zero_copy_blocks += len(zero_copy)
                cpu = cpu + zero_copy
            assert cpu == expected_cpu, f"{where}: CPU blocks {cpu}, expected {expected_cpu}"
            assert not set(cpu) & set(device), f"{where}: blocks attended twice: {sorted(set(cpu) & set(device))}"
            if len(cpu) < c.cpu_capacity:
                assert set(selected) <= set(device) | set(cpu), f"{where}: selected blocks attended nowhere"
            assert set(forced) <= set(device), f"{where}: forced blocks {forced} not all on the device"
        else:
            assert cpu == [], f"{where}: {c.mode} has no CPU part"
        self.report.cpu_blocks += len(decision.cpu_blocks[b][h])  # the workers' share

    def _check_resident(self, decision, b, h, n, selected, scores, where) -> list[int]:
        """Follow the resident row of (request, layer, head) through the step; returns its blocks at attention."""
        c, rid, layer = self.config, decision.rids[b], decision.layer
        capacity = len(decision.resident_start[b][h])
        key = (rid, layer, h)
        forced = policy.forced_blocks(n, c.block_size, c.sink_blocks, c.local_blocks)
        # resident-first: only the quota's first columns have a page; a shrinking quota keeps the last selection's
        # blocks first; a request that turns exact is filled again, with every block; one exact at its first step
        # starts with the blocks its prefill moved out of the window, block sink + c in column c
        quota = capacity if decision.quotas is None else decision.quotas[b]
        exact = decision.exact is not None and decision.exact[b]
        prefilled = max(0, (n - 1) // c.block_size - c.sink_blocks - c.local_blocks) if exact else 0
        first_row = [c.sink_blocks + i for i in range(prefilled)] + [policy.EMPTY] * (capacity - prefilled)
        before = self.resident.get(key, first_row)
        was_exact = self.exact.get(key, False)
        if quota < self.quota.get(key, quota):  # a row exact since its last sparse step keeps its newest blocks
            before = policy.compact(before, self.last_selected.get(key, []), quota, newest=key in self.unselected)
            self.report.quota_shrinks += 1
            if key in self.brakes:  # its columns moved: the last recall is not judged
                self.brakes[key].fresh = set()
        if exact and not was_exact:
            self.filled.discard(key)
        if was_exact and not exact:  # sparse again: its selection runs and brake start afresh, its row is filled
            self.runs.pop(key, None)
            self.brakes.pop(key, None)
            self.filled.add(key)
        self.quota[key], self.exact[key] = quota, exact
        (self.unselected.add if exact else self.unselected.discard)(key)
        if selected:
            self.last_selected[key] = selected
        assert all(j == policy.EMPTY for j in before[quota:]), f"{where}: blocks past the quota {quota}: {before}"
        usable, spare = before[:quota], [policy.EMPTY] * (capacity - quota)
        leaving = policy.leaving_block(n, c.block_size, c.sink_blocks, c.local_blocks)
        start = before if leaving is None else policy.admit_leaving(usable, leaving) + spare
        self.report.admitted_blocks += int(start != before)
        assert decision.resident_start[b][h] == start, (
            f"{where}: resident {decision.resident_start[b][h]} at the step's start, expected {start}")
        at_attend = start
        order = [j for j in selected if j not in set(forced)]
        if selected and key not in self.filled:
            fill_quota = quota if exact else c.recall_quota  # an exact row takes every block at once
            wanted = [j for j in order if j not in at_attend][:fill_quota]
            at_attend = policy.bring_in(at_attend[:quota], wanted, set(selected), None) + spare
            self.filled.add(key)
            self.report.first_fills += 1
        if c.mode == "infinigen" and selected:
            recalled = policy.bring_in(at_attend, order, set(selected), scores)
            self.report.recalled_blocks += sum(x != y for x, y in zip(recalled, at_attend))
            at_attend = recalled
        now = decision.resident[b][h]
        assert now == at_attend, f"{where}: resident {now} at attention, expected {at_attend}"
        blocks = [j for j in now if j != policy.EMPTY]
        assert len(now) == capacity and len(set(blocks)) == len(blocks), f"{where}: resident row {now}"
        assert not set(blocks) & set(policy.window_blocks(n, c.block_size, c.sink_blocks, c.local_blocks)), (
            f"{where}: window blocks in the resident buffer: {now}")
        after = now
        if c.mode == "scout" and decision.selected is not None and c.recall_policy != "off":
            cpu = listed_off_device(decision, b, h)
            due = bool(selected) and policy.recall_due(c, layer, decision.step, len(cpu), len(selected))
            caps = policy.recall_caps(c, block_bytes=self.block_bytes, num_layers=self.num_offloaded,
                                      batch_size=len(decision.rids), num_kv_heads=self.shape.num_kv_heads,
                                      step=decision.step)
            brake = self.brakes.setdefault(key, policy.Brake())
            after, withheld, left = policy.scout_recall(now[:quota], config=c, brake=brake,
                                        runs=self.runs.setdefault(key, {}), selected=selected,
                                        cpu=cpu, scores=scores, due=due, cap=caps[b][h],
                                        position=n)
            after = after + spare
            self.report.withheld_blocks += withheld
            self.report.capped_blocks += left
            self.report.backed_off_rows += int(brake.level > 0)
        assert decision.resident_after[b][h] == after, (
            f"{where}: resident {decision.resident_after[b][h]} after recall, expected {after}")
        recalled = [j for j in after if j not in set(now)]
        assert set(recalled) <= set(listed_off_device(decision, b, h)), f"{where}: recall moved non-CPU blocks {recalled}"
        self.report.recalled_blocks += len(recalled)
        self.resident[key] = after
        return blocks

    def _check_output(self, decision, b, q_real, q_select, keys, values, output, where):
        size, scale = self.config.block_size, self.shape.softmax_scale
        o, lse = policy.attend_blocks(q_real, keys, values, decision.device_blocks[b], block_size=size, scale=scale)
        if any(decision.cpu_blocks[b]):
            # The CPU part runs with the query it was given: the predicted one where the mode predicts.
            cpu = policy.attend_blocks(q_select, keys, values, decision.cpu_blocks[b], block_size=size, scale=scale)
            o, lse = reference.merge_states(o, lse, *cpu)
        if decision.zero_copy_blocks is not None and any(decision.zero_copy_blocks[b]):  # same query, on the device
            zero_copy = policy.attend_blocks(q_select, keys, values, decision.zero_copy_blocks[b], block_size=size,
                                             scale=scale)
            o, lse = reference.merge_states(o, lse, *zero_copy)
        if self.config.estimate and self.config.mode != "full":
            heads = range(self.shape.num_kv_heads)
            selected = decision.selected[b] if decision.selected is not None else [[] for _ in heads]
            zero_copy = decision.zero_copy_blocks[b] if decision.zero_copy_blocks is not None else [[] for _ in heads]
            attended = [set(selected[h]) | set(decision.device_blocks[b][h]) | set(decision.cpu_blocks[b][h])
                        | set(zero_copy[h]) for h in heads]
            blocks = [policy.unattended(decision.num_tokens[b] // size, held) for held in attended]
            o, lse = reference.merge_states(o, lse, *policy.estimate(q_real, keys, values, blocks, block_size=size,
                                                                     scale=scale))
        torch.testing.assert_close(output, o, atol=2e-5, rtol=2e-5, msg=lambda m: f"{where}: output differs\n{m}")
        self.report.outputs_checked += 1
