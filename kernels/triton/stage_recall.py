"""The resident-buffer stage of the decode step, one program per (request, KV head).

digest -> select -> split -> device part / CPU part -> merge -> **recall**.
Each program owns one row of the resident map (the blocks its R slots hold)
and applies, in order, the phases the launch enables:

    admit   the block leaving the local window takes the first empty slot (copied from its window page)
    fill    at the row's first selection: the selected blocks the window does not hold (slot order victims)
    recall  infinigen: the same candidates by score; scout: the CPU list, when recall is due, less what the
            brake holds back (kernels.recall_brake, whose torch rules are repeated here)

Victims of fill and recall: empty slots first, then blocks outside the current
selection by score ascending (fill: by slot), ties to the lower slot; a slot
whose page is PAD or the device store's scratch page has no page (stage_recall.py):
it takes nothing and is never a victim; the
candidates come in best first, at most `quota` of them per row and call.
Every applied move is copied right here, host page -> resident page (K and V of
this head), reading the page-locked host store through unified addressing on
CUDA: no host step, no separate copy launch.

The victim order is a rank: slot r's rank is the number of slots that sort
before it by (class, score, slot), an [R, R] comparison; candidate c goes to
the slot whose rank is c's rank among the wanted candidates. A row as wide as
a long request (resident-first; WIDE) sorts and counts instead (wide_rows.py).
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl
from scout_sglang.kernels.recall_brake import FRESH, LEVEL, MOVED, RUN_BITS, RUN_LIMIT, WAIT
from scout_sglang.kernels.step_counters import BACKED_OFF, DROPPED, RECALLED, WITHHELD
from scout_sglang.kernels.triton.lists import contains, member, place, rank_of
from scout_sglang.kernels.triton.sizes import bins_for, or_unused, p2, warps_for, wide_lists
from scout_sglang.kernels.triton.wide_rows import MOVES, SLOT_BITS, bring_in_wide, copy_moves_gathered

from scout_sglang.layout import PAD_BLOCK

RECALL_NONE, RECALL_SELECTED, RECALL_CPU = 0, 1, 2
# The widest row (and selection) the resident-first path gives the stages where they run Triton: past 256
# columns they count through histograms of block ids rather than compare all pairs (sizes.wide_lists), and each
# compiles for sm_90 at 4096 (benchmarks/results/kernel_widths.md; a test compiles them at this width). Where a
# table's ids do not fit a histogram (sizes.bins_for), rows stop at ALL_PAIRS_ROW.
WIDEST_ROW = 4096
ALL_PAIRS_ROW = 256
DUE_INTERVAL, DUE_ADAPTIVE = 0, 1


@triton.jit
def _copy_block(src_k, src_v, dst_k, dst_v, src_page, dst_page, head, stride_src_page, stride_src_head,
                stride_src_tok, stride_dst_page, stride_dst_head, stride_dst_tok, mask, s, d):
    # One (page, head) block of K and of V: [S, D] each.
    src = src_page.to(tl.int64) * stride_src_page + head * stride_src_head + s[:, None] * stride_src_tok + d[None, :]
    dst = dst_page.to(tl.int64) * stride_dst_page + head * stride_dst_head + s[:, None] * stride_dst_tok + d[None, :]
    tl.store(dst_k + dst, tl.load(src_k + src, mask=mask), mask=mask)
    tl.store(dst_v + dst, tl.load(src_v + src, mask=mask), mask=mask)


@triton.jit
def _pick(vector, lanes, i):
    return tl.sum(tl.where(lanes == i, vector, 0), axis=0)


@triton.jit
def _bring_in(row, slots_r, in_slot, candidates, selected, sel_valid, vscore, quota, PAD: tl.constexpr):
    """-> (new row, applied [C], destination slot [C]) of candidates entering the row's usable slots (in_slot)."""
    occupied = row != PAD
    wanted = (candidates != PAD) & ~contains(candidates, row, occupied)
    vclass = tl.where(in_slot & ~occupied, 0, tl.where(in_slot & ~contains(row, selected, sel_valid), 1, 2))
    # slot j sorts before slot i: by class, then score, then slot
    ci, cj = vclass[:, None], vclass[None, :]
    si, sj = vscore[:, None], vscore[None, :]
    before = (cj < ci) | ((cj == ci) & ((sj < si) | ((sj == si) & (slots_r[None, :] < slots_r[:, None]))))
    vrank = tl.sum(before.to(tl.int32), axis=1)
    num_victims = tl.sum((vclass < 2).to(tl.int32), axis=0)
    crank = rank_of(wanted)
    applied = wanted & (crank < num_victims) & (crank < quota)
    is_victim = vclass < 2
    hit = (vrank[None, :] == crank[:, None]) & is_victim[None, :]  # [C, R]
    dst = tl.sum(tl.where(hit, slots_r[None, :], 0), axis=1)
    lands = applied[:, None] & (dst[:, None] == slots_r[None, :])  # [C, R]
    gets = tl.max(lands.to(tl.int32), axis=0) > 0
    new_row = tl.where(gets, tl.sum(tl.where(lands, candidates[:, None], 0), axis=0), row)
    return new_row, applied, dst


@triton.jit
def _any_listed(candidates, PAD: tl.constexpr):
    return tl.sum((candidates != PAD).to(tl.int32), axis=0) > 0


@triton.jit
def _bring_in_and_copy(row, r, usable, candidates, selected, sel_valid, vscore, quota, pages, lanes, host_row,
                       host_k_ptr, host_v_ptr, dev_k_ptr, dev_v_ptr, head, stride_host_page, stride_host_head,
                       stride_host_tok, stride_dev_page, stride_dev_head, stride_dev_tok, tile, s, d,
                       PAD: tl.constexpr, WIDE: tl.constexpr, SLOT_BITS: tl.constexpr, BINS: tl.constexpr,
                       MOVES: tl.constexpr):
    """-> (new row, applied [C]): the candidates brought into the row and their blocks copied, all pairs or, for a
    WIDE row, by wide_rows.py. Without a candidate nothing runs: the steady state of an exact row (resident-first),
    whose fill is done and whose CPU list is empty, and of every row between recalls."""
    new_row = row
    applied = candidates != candidates  # none
    if _any_listed(candidates, PAD):
        if WIDE:
            new_row, applied, dst = bring_in_wide(row, r, usable, candidates, selected, sel_valid, vscore, quota,
                                                  PAD, SLOT_BITS, BINS)
            copy_moves_gathered(candidates, applied, dst, pages, lanes, host_row, host_k_ptr, host_v_ptr, dev_k_ptr,
                                dev_v_ptr, head, stride_host_page, stride_host_head, stride_host_tok,
                                stride_dev_page, stride_dev_head, stride_dev_tok, tile, s, d, MOVES)
        else:
            new_row, applied, dst = _bring_in(row, r, usable, candidates, selected, sel_valid, vscore, quota, PAD)
            _copy_moves(candidates, applied, dst, pages, r, lanes, host_row, host_k_ptr, host_v_ptr, dev_k_ptr,
                        dev_v_ptr, head, stride_host_page, stride_host_head, stride_host_tok, stride_dev_page,
                        stride_dev_head, stride_dev_tok, tile, s, d)
    return new_row, applied


@triton.jit
def _resident_row_kernel(
    resident_ptr, slots_ptr, resident_pages_ptr, host_table_ptr, host_k_ptr, host_v_ptr, dev_k_ptr, dev_v_ptr,
    selected_ptr, counts_ptr, num_full_ptr, forced_ptr, quota_ptr, leaving_block_ptr, leaving_page_ptr, ready_ptr,
    scores_ptr, cpu_blocks_ptr, cpu_counts_ptr, due_ptr, runs_ptr, brake_ptr, positions_ptr, counters_ptr,
    stride_res_slot, stride_res_head, stride_slots, stride_res_pages_batch, stride_host_table_batch,
    stride_host_page, stride_host_head, stride_host_tok, stride_dev_page, stride_dev_head, stride_dev_tok,
    stride_sel_batch, stride_sel_head, stride_counts_batch, stride_num_full, stride_forced_batch, stride_quota_batch,
    stride_leaving_block, stride_leaving_page, stride_ready_slot, stride_scores_batch, stride_scores_head,
    stride_cpu_blocks_batch, stride_cpu_blocks_head, stride_cpu_counts_batch, stride_due, stride_runs_slot,
    stride_runs_head, stride_brake_slot, stride_brake_head, stride_positions,
    recall_beta, scratch_page,
    R: tl.constexpr, R_P2: tl.constexpr, TOPK_P2: tl.constexpr, WIDTH: tl.constexpr, WIDTH_P2: tl.constexpr,
    CAPACITY: tl.constexpr, CAPACITY_P2: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEADS_P2: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, SIZE_P2: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_P2: tl.constexpr,
    ADMIT: tl.constexpr, FILL: tl.constexpr, RECALL: tl.constexpr, DUE: tl.constexpr, PAD: tl.constexpr,
    HYSTERESIS: tl.constexpr, MIN_SELECTED: tl.constexpr, BRAKE: tl.constexpr, MAX_BACKOFF: tl.constexpr,
    RUN_BITS: tl.constexpr, RUN_LIMIT: tl.constexpr, LEVEL_WORD: tl.constexpr, WAIT_WORD: tl.constexpr,
    MOVED_WORD: tl.constexpr, FRESH_WORD: tl.constexpr, RECALLED_COL: tl.constexpr, DROPPED_COL: tl.constexpr,
    WITHHELD_COL: tl.constexpr, BACKED_OFF_COL: tl.constexpr, WIDE: tl.constexpr, SLOT_BITS: tl.constexpr,
    MOVES: tl.constexpr, BINS: tl.constexpr,
):  # fmt: skip
    # grid: (B, Hkv).
    batch = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    slot = tl.load(slots_ptr + batch * stride_slots).to(tl.int64)
    r = tl.arange(0, R_P2)
    row_ptr = resident_ptr + slot * stride_res_slot + head * stride_res_head + r
    row = tl.load(row_ptr, mask=r < R, other=PAD)
    pages = tl.load(resident_pages_ptr + batch * stride_res_pages_batch + r, mask=r < R, other=0)
    usable = (r < R) & (pages >= 0) & (pages < scratch_page)  # a slot without a page takes nothing
    s = tl.arange(0, SIZE_P2)
    d = tl.arange(0, DIM_P2)
    tile = (s < BLOCK_SIZE)[:, None] & (d < HEAD_DIM)[None, :]
    k = tl.arange(0, TOPK_P2)
    count = tl.load(counts_ptr + batch * stride_counts_batch + head)
    sel_valid = k < count
    selected = tl.load(selected_ptr + batch * stride_sel_batch + head * stride_sel_head + k, mask=sel_valid, other=PAD)
    columns = tl.arange(0, WIDTH_P2)
    forced = tl.load(forced_ptr + batch * stride_forced_batch + columns, mask=columns < WIDTH, other=PAD)
    unforced = tl.where(sel_valid & ~contains(selected, forced, forced != PAD), selected, PAD)
    quota = tl.load(quota_ptr + batch * stride_quota_batch + head)
    host_row = host_table_ptr + batch * stride_host_table_batch

    if ADMIT:  # the block leaving the local window: first empty slot, nothing evicted
        leaving = tl.load(leaving_block_ptr + batch * stride_leaving_block)
        window_page = tl.load(leaving_page_ptr + batch * stride_leaving_page)
        empty = (row == PAD) & usable
        first_empty = tl.min(tl.where(empty, r, R_P2), axis=0)
        admit = (leaving != PAD) & (first_empty < R) & (tl.sum((row == leaving).to(tl.int32), axis=0) == 0)
        row = tl.where((r == first_empty) & admit, leaving, row)
        _copy_block(dev_k_ptr, dev_v_ptr, dev_k_ptr, dev_v_ptr, window_page, _pick(pages, r, first_empty), head,
                    stride_dev_page, stride_dev_head, stride_dev_tok, stride_dev_page, stride_dev_head,
                    stride_dev_tok, tile & (s * 0 + admit.to(tl.int32) != 0)[:, None], s, d)

    if FILL:  # the row's first selection: victims in slot order
        ready = tl.load(ready_ptr + slot * stride_ready_slot + head)
        pending = (ready == 0) & (tl.load(num_full_ptr + batch * stride_num_full) > 0)
        candidates = tl.where((k * 0 + pending.to(tl.int32)) != 0, unforced, PAD)
        unscored = tl.zeros((R_P2,), tl.float32)
        row, applied = _bring_in_and_copy(row, r, usable, candidates, selected, sel_valid, unscored, quota, pages,
                                          k, host_row, host_k_ptr, host_v_ptr, dev_k_ptr, dev_v_ptr, head,
                                          stride_host_page, stride_host_head, stride_host_tok, stride_dev_page,
                                          stride_dev_head, stride_dev_tok, tile, s, d, PAD, WIDE, SLOT_BITS, BINS, MOVES)
        tl.store(ready_ptr + slot * stride_ready_slot + head, (ready != 0) | pending)

    if RECALL != 0:  # 1: infinigen's selected blocks; 2: scout's CPU list, when due
        occupied = (row != PAD) & (r < R)
        vscore = tl.load(scores_ptr + batch * stride_scores_batch + head * stride_scores_head + row, mask=occupied,
                         other=0.0)
        if RECALL == 1:
            candidates = unforced
            lanes = k
        else:
            lanes = tl.arange(0, CAPACITY_P2)
            cpu_count = tl.load(cpu_counts_ptr + batch * stride_cpu_counts_batch + head)
            if DUE == 0:
                due = tl.load(due_ptr + batch * stride_due) != 0
            else:  # adaptive: the CPU's share of the row's selection passed beta
                share = cpu_count.to(tl.float64) / tl.maximum(count, 1).to(tl.float64)
                due = (count > 0) & (share > recall_beta)
            listed = (lanes < cpu_count) & ((lanes * 0 + due.to(tl.int32)) != 0)
            candidates = tl.load(cpu_blocks_ptr + batch * stride_cpu_blocks_batch + head * stride_cpu_blocks_head
                                 + lanes, mask=listed, other=PAD)
            if BRAKE:  # kernels.recall_brake: judge the last recall; wait, or recall at most quota >> level
                brake_row = brake_ptr + slot * stride_brake_slot + head * stride_brake_head
                level = tl.load(brake_row + LEVEL_WORD)
                wait = tl.load(brake_row + WAIT_WORD)
                moved = tl.load(brake_row + MOVED_WORD)
                fresh = tl.load(brake_row + FRESH_WORD + r, mask=r < R, other=0)
                hits = moved * 0
                if moved > 0:  # the last recall moved blocks: how many of them the selection took (its judgement)
                    hits = tl.sum(((fresh != 0) & (r < R) & member(row, selected, sel_valid, WIDE, BINS)).to(tl.int32),
                                  axis=0)
                judged = moved > 0
                paid = 2 * hits >= moved
                level = tl.where(judged, tl.where(paid, 0, tl.minimum(level + 1, MAX_BACKOFF)), level)
                wait = tl.where(judged, (1 << level) - 1, tl.maximum(wait - 1, 0))
                candidates = tl.where((lanes * 0 + wait) == 0, candidates, PAD)
                quota = tl.where(level > 0, tl.where(quota > 0, tl.maximum(quota >> level, 1), 0), quota)
                tl.atomic_add(counters_ptr + BACKED_OFF_COL, (level > 0).to(tl.int32))
            if HYSTERESIS:  # each selected block's run of consecutive selections; candidates need MIN_SELECTED
                position = tl.load(positions_ptr + batch * stride_positions).to(tl.int32)
                runs_row = runs_ptr + slot * stride_runs_slot + head * stride_runs_head
                word = tl.load(runs_row + selected, mask=sel_valid, other=-1)
                run = tl.where((word >> RUN_BITS) == position - 1, tl.minimum((word & RUN_LIMIT) + 1, RUN_LIMIT), 1)
                if WIDE:  # a candidate's run: the same update of its word, read before the store (selected ones)
                    lasting = candidates != candidates
                    if _any_listed(candidates, PAD):
                        listed_word = tl.load(runs_row + candidates, mask=candidates != PAD, other=-1)
                        listed_run = tl.where((listed_word >> RUN_BITS) == position - 1,
                                              tl.minimum((listed_word & RUN_LIMIT) + 1, RUN_LIMIT), 1)
                        lasting = member(candidates, selected, sel_valid, WIDE, BINS) & (listed_run >= MIN_SELECTED)
                tl.store(runs_row + selected, (position << RUN_BITS) | run, mask=sel_valid)
                if not WIDE:
                    match = (candidates[:, None] == selected[None, :]) & sel_valid[None, :]  # [C, K]
                    lasting = tl.sum(tl.where(match, run[None, :], 0), axis=1) >= MIN_SELECTED
                withheld = (candidates != PAD) & ~lasting
                tl.atomic_add(counters_ptr + WITHHELD_COL, tl.sum(withheld.to(tl.int32), axis=0))
                candidates = tl.where(lasting, candidates, PAD)
        row_before = row
        row, applied = _bring_in_and_copy(row, r, usable, candidates, selected, sel_valid, vscore, quota, pages,
                                          lanes, host_row, host_k_ptr, host_v_ptr, dev_k_ptr, dev_v_ptr, head,
                                          stride_host_page, stride_host_head, stride_host_tok, stride_dev_page,
                                          stride_dev_head, stride_dev_tok, tile, s, d, PAD, WIDE, SLOT_BITS, BINS, MOVES)
        num_applied = tl.sum(applied.to(tl.int32), axis=0)
        tl.atomic_add(counters_ptr + RECALLED_COL, num_applied)
        if RECALL == 2 and BRAKE:  # remembered for the next step's judgement
            tl.store(brake_row + LEVEL_WORD, level)
            tl.store(brake_row + WAIT_WORD, wait)
            tl.store(brake_row + MOVED_WORD, num_applied)
            tl.store(brake_row + FRESH_WORD + r, (row != row_before).to(tl.int32), mask=r < R)
        if RECALL == 1:
            left_out = (candidates != PAD) & ~member(candidates, row, row != PAD, WIDE, BINS)
            tl.atomic_add(counters_ptr + DROPPED_COL, tl.sum(left_out.to(tl.int32), axis=0))

    tl.store(row_ptr, row, mask=r < R)


@triton.jit
def _copy_moves(candidates, applied, dst, pages, r, lanes, host_row, host_k_ptr, host_v_ptr, dev_k_ptr, dev_v_ptr,
                head, stride_host_page, stride_host_head, stride_host_tok, stride_dev_page, stride_dev_head,
                stride_dev_tok, tile, s, d):
    # The applied moves, compacted, then one block copy each (host page -> resident page).
    order = rank_of(applied)
    num_moves = tl.sum(applied.to(tl.int32), axis=0)
    blocks = place(candidates, order, applied, lanes.shape[0])
    slots = place(dst, order, applied, lanes.shape[0])
    for i in range(num_moves):
        src_page = tl.load(host_row + _pick(blocks, lanes, i))
        _copy_block(host_k_ptr, host_v_ptr, dev_k_ptr, dev_v_ptr, src_page, _pick(pages, r, _pick(slots, lanes, i)),
                    head, stride_host_page, stride_host_head, stride_host_tok, stride_dev_page, stride_dev_head,
                    stride_dev_tok, tile, s, d)


@functools.cache
def _config(num_resident, topk, width, capacity, num_kv_heads, block_size, head_dim, admit, fill, recall, interval,
            hysteresis, min_selected, brake, max_backoff, num_blocks):
    # num_blocks: the block ids' bound (the host table's width), for the wide rows' histogram lookups
    if num_resident > 1 << SLOT_BITS:
        raise ValueError(f"a resident row of {num_resident} columns is wider than the victim order's key takes "
                         f"({1 << SLOT_BITS})")
    return dict(R=num_resident, R_P2=p2(num_resident), TOPK_P2=p2(topk), WIDTH=width, WIDTH_P2=p2(width),
                CAPACITY=capacity, CAPACITY_P2=p2(capacity), NUM_KV_HEADS=num_kv_heads, HEADS_P2=p2(num_kv_heads),
                BLOCK_SIZE=block_size, SIZE_P2=p2(block_size), HEAD_DIM=head_dim, DIM_P2=p2(head_dim), ADMIT=admit,
                FILL=fill, RECALL={None: RECALL_NONE, "selected": RECALL_SELECTED, "cpu": RECALL_CPU}[recall],
                DUE=DUE_INTERVAL if interval else DUE_ADAPTIVE, PAD=PAD_BLOCK, HYSTERESIS=hysteresis,
                MIN_SELECTED=min_selected, BRAKE=brake, MAX_BACKOFF=max_backoff, RUN_BITS=RUN_BITS,
                RUN_LIMIT=RUN_LIMIT, LEVEL_WORD=LEVEL, WAIT_WORD=WAIT, MOVED_WORD=MOVED, FRESH_WORD=FRESH,
                RECALLED_COL=RECALLED, DROPPED_COL=DROPPED, WITHHELD_COL=WITHHELD,
                BACKED_OFF_COL=BACKED_OFF, WIDE=wide_lists(num_resident, topk) and bins_for(num_blocks) > 0,
                SLOT_BITS=SLOT_BITS, MOVES=MOVES, BINS=bins_for(num_blocks))


def resident_row_triton(resident, slots, *, resident_pages, host_table, host_k, host_v, dev_k, dev_v, selected,
                        counts, num_full, forced_blocks, quota, leaving_block, leaving_page, ready, scores,
                        cpu_blocks, cpu_counts, recall_due, recall_beta, brake, admit, fill, recall, counters) -> None:
    """Launch the resident-buffer stage; arguments as stage_recall.bring_in (validated there)."""
    batch_size, num_kv_heads, topk = selected.shape
    if batch_size == 0:
        return
    runs, state = (None, None) if brake is None else (brake.runs, brake.state)
    config = _config(resident.shape[2], topk, forced_blocks.shape[1], 0 if cpu_blocks is None else cpu_blocks.shape[2],
                     num_kv_heads, dev_k.shape[2], dev_k.shape[3], admit, fill, recall, recall_due is not None,
                     runs is not None, 1 if brake is None else brake.min_selected, state is not None,
                     0 if brake is None else brake.max_backoff, host_table.shape[1])
    (leaving_block, s_lb), (leaving_page, s_lp), (ready, s_ready) = (
        or_unused(leaving_block, counts, 1), or_unused(leaving_page, counts, 1), or_unused(ready, counts, 1))
    (scores, s_scores), (cpu_blocks, s_cpu_b), (cpu_counts, s_cpu_c), (recall_due, s_due) = (
        or_unused(scores, counts, 2), or_unused(cpu_blocks, counts, 2), or_unused(cpu_counts, counts, 1),
        or_unused(recall_due, counts, 1))
    (runs, s_runs), (state, s_state), (positions, s_positions) = (
        or_unused(runs, counts, 2), or_unused(state, counts, 2),
        or_unused(None if brake is None else brake.positions, counts, 1))
    _resident_row_kernel[(batch_size, num_kv_heads)](
        resident, slots, resident_pages, host_table, host_k, host_v, dev_k, dev_v, selected, counts, num_full,
        forced_blocks, quota, leaving_block, leaving_page, ready, scores, cpu_blocks, cpu_counts, recall_due, runs,
        state, positions, counters,
        *resident.stride()[:2], slots.stride(0), resident_pages.stride(0), host_table.stride(0),
        *host_k.stride()[:3], *dev_k.stride()[:3], *selected.stride()[:2], counts.stride(0), num_full.stride(0),
        forced_blocks.stride(0), quota.stride(0), *s_lb, *s_lp, *s_ready, *s_scores, *s_cpu_b, *s_cpu_c, *s_due,
        *s_runs, *s_state, *s_positions, float(recall_beta), dev_k.shape[0] - 1, num_warps=warps_for(config), **config)
