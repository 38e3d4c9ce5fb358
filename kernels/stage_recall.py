"""The resident-buffer stage of the decode step: window admission, first fill and recall, with their copies.

digest -> select -> split -> device part / CPU part -> merge -> **recall**.
One call runs the phases a layer needs at that point of the step, in order:

    admit   (resident modes, before the split)   the block that leaves the local window takes the first empty
                                                 slot, copied from its window page; nothing is evicted
    fill    (resident modes, before the split)   a row's first selection brings in the selected blocks that the
                                                 window does not hold; victims in slot order
    recall  "selected" (infinigen, before its attention): the same candidates, victims by score;
            "cpu" (scout, after its attention): the CPU list, when recall is due (interval: `recall_due`;
            adaptive: the CPU's share of the row's selection passed recall_beta),
            less what the brake holds back (kernels.recall_brake: hysteresis, back-off)

Victims: empty slots first, then blocks outside the current selection, lowest
score first, ties to the lower slot. A slot whose page is PAD_BLOCK or the device store's
scratch page (its last) has no page: it takes no block and is never a victim, so
a row's resident capacity is data (a request's quota of a shared page pool),
not a shape. Such a slot holds PAD_BLOCK. Candidates enter best first, at most
`quota[b, h]` of them per (request, KV head) row and phase; the others stay
where they are (on the CPU for scout). tests/oracle/policy.py writes the same
rules a second time.

On CUDA one Triton launch (triton/stage_recall.py) makes the decisions and the
copies (the host store is read through unified addressing); on the CPU a fixed
sequence of torch ops, with one row copy per store (kernels.copy_block_rows).
"""

from __future__ import annotations

import torch
from scout_sglang.kernels.block_copy import copy_block_rows
from scout_sglang.kernels.checks import check_shape, check_tensor
from scout_sglang.kernels.dispatch import select_impl
from scout_sglang.kernels.recall_brake import STATE_WORDS, RUN_LIMIT, RecallBrake, brake_candidates, note_recall
from scout_sglang.kernels.stage_split import contains
from scout_sglang.kernels.step_counters import DROPPED, NUM_COUNTERS, RECALLED

from scout_sglang.layout import PAD_BLOCK

RECALL_KINDS = (None, "selected", "cpu")


def bring_in(resident: torch.Tensor, slots: torch.Tensor, *, resident_pages: torch.Tensor, host_table: torch.Tensor,
             host_k: torch.Tensor, host_v: torch.Tensor, dev_k: torch.Tensor, dev_v: torch.Tensor,
             selected: torch.Tensor, counts: torch.Tensor, num_full: torch.Tensor, forced_blocks: torch.Tensor,
             quota: torch.Tensor, admit: bool = False, leaving_block: torch.Tensor | None = None,
             leaving_page: torch.Tensor | None = None, fill: bool = False, ready: torch.Tensor | None = None,
             recall: str | None = None, scores: torch.Tensor | None = None, cpu_blocks: torch.Tensor | None = None,
             cpu_counts: torch.Tensor | None = None, recall_due: torch.Tensor | None = None,
             recall_beta: float = 0.0, brake: RecallBrake | None = None, counters: torch.Tensor | None = None,
             impl: str | None = None, validate: bool = True) -> None:
    """Update the resident rows of a batch and copy the blocks that enter them.

    Parameters
    ----------
    resident : [slots, Hkv, R] int32 blocks held per request slot (PAD: empty), updated in place
    slots : [B] int32/int64 each request's slot
    resident_pages : [B, R] int32 device pages of the slots; PAD_BLOCK or dev_k's last page (its scratch page): no
        page, the slot is unused
    host_table : [B, NB] int32 host page of each logical block
    host_k, host_v : [H, Hkv, S, D] host store (page-locked on CUDA); dev_k, dev_v : [P, Hkv, S, D] device store
    selected, counts : [B, Hkv, K] int32 the current selection and [B, Hkv] int32 its counts
    num_full : [B] int32 full blocks; forced_blocks : [B, W] int32 the window's full blocks (PAD elsewhere)
    quota : [B, Hkv] int32 moves allowed per row and phase
    admit, leaving_block, leaving_page : the admission phase: [B] int32 the block leaving the window (PAD: none)
        and its window page
    fill, ready : the first-fill phase: [slots, Hkv] int8/bool, set once a row has been filled
    recall, scores, cpu_blocks, cpu_counts, recall_due, recall_beta : the recall phase (RECALL_KINDS):
        scores [B, Hkv, NB] fp32; "cpu" also takes cpu_blocks [B, Hkv, C] int32, cpu_counts [B, Hkv] int32 and
        either recall_due [B] (interval; nonzero: due) or recall_beta (adaptive)
    brake : recall "cpu" only: the hysteresis and back-off of kernels.recall_brake (None: neither); the quota is
        then the row's recall cap this step
    counters : optional [NUM_COUNTERS] int32 row: RECALLED (recall), DROPPED (recall "selected": candidates left
        out), WITHHELD and BACKED_OFF (brake) are added
    validate : check the arguments (the decode step checks its static buffers once and passes False)
    """
    if validate:
        _check(resident, slots, resident_pages, host_table, host_k, dev_k, selected, counts, num_full, forced_blocks,
               quota, admit, leaving_block, leaving_page, fill, ready, recall, scores, cpu_blocks, cpu_counts,
               brake, counters)
    if select_impl("bring_in", dev_k.device.type, impl) == "triton":
        from scout_sglang.kernels.triton.stage_recall import resident_row_triton

        resident_row_triton(resident, slots, resident_pages=resident_pages, host_table=host_table, host_k=host_k,
                            host_v=host_v, dev_k=dev_k, dev_v=dev_v, selected=selected, counts=counts,
                            num_full=num_full, forced_blocks=forced_blocks, quota=quota,
                            leaving_block=leaving_block if admit else None, leaving_page=leaving_page if admit else None,
                            ready=ready if fill else None, scores=scores if recall else None,
                            cpu_blocks=cpu_blocks if recall == "cpu" else None,
                            cpu_counts=cpu_counts if recall == "cpu" else None,
                            recall_due=recall_due if recall == "cpu" else None, recall_beta=recall_beta,
                            brake=brake if recall == "cpu" else None, admit=admit, fill=fill, recall=recall,
                            counters=counters)
        return
    slots = slots.long()
    rows = resident[slots]  # [B, Hkv, R]
    usable = ((resident_pages >= 0) & (resident_pages < dev_k.shape[0] - 1)).unsqueeze(1)  # [B, 1, R]: it has a page
    valid = torch.arange(selected.shape[2], device=selected.device) < counts.unsqueeze(-1)
    selected = torch.where(valid, selected, PAD_BLOCK)
    if fill or recall == "selected":  # the selection less its forced blocks: what a fill or infinigen brings in
        forced = forced_blocks.unsqueeze(1).expand(-1, rows.shape[1], -1)
        unforced = torch.where(contains(selected, forced), PAD_BLOCK, selected)
    if admit:
        rows = _admit(rows, usable, leaving_block, leaving_page, resident_pages, dev_k, dev_v)
    if fill:
        flags = ready[slots]  # [B, Hkv]
        pending = (flags == 0) & (num_full > 0).unsqueeze(1)
        candidates = torch.where(pending.unsqueeze(-1), unforced, PAD_BLOCK)
        rows, _ = _bring_in_and_copy(rows, usable, candidates, selected, None, quota, host_table, resident_pages,
                                     host_k, host_v, dev_k, dev_v)
        ready.index_copy_(0, slots, ((flags != 0) | pending).to(ready.dtype))
    if recall is not None:
        state = None
        if recall == "selected":
            candidates = unforced
        else:
            cpu_counts = cpu_counts.to(counts.device, non_blocking=True)  # on a GPU the hand-off's page-locked copy
            if recall_due is not None:
                due = (recall_due != 0).view(-1, 1)
            else:  # each row's own share: a row decides alone (and a tensor-parallel rank, holding some heads, alike)
                share = cpu_counts.double() / counts.clamp(min=1).double()
                due = (counts > 0) & (share > recall_beta)
            listed = torch.arange(cpu_blocks.shape[2], device=cpu_blocks.device) < cpu_counts.unsqueeze(-1)
            candidates = torch.where(listed & due.unsqueeze(-1), cpu_blocks, PAD_BLOCK)
            if brake is not None:
                candidates, quota, state = brake_candidates(candidates, quota, brake=brake, slots=slots, rows=rows,
                                                            selected=selected, valid=valid, counters=counters)
        before = rows
        rows, moved = _bring_in_and_copy(rows, usable, candidates, selected, scores, quota, host_table,
                                         resident_pages, host_k, host_v, dev_k, dev_v)
        if brake is not None:
            note_recall(brake, slots, state, before, rows, moved)
        if counters is not None:
            counters[RECALLED] += moved.sum(dtype=torch.int32)
            if recall == "selected":
                left_out = (candidates != PAD_BLOCK) & ~contains(candidates, rows)
                counters[DROPPED] += left_out.sum(dtype=torch.int32)
    resident.index_copy_(0, slots, rows)


def _admit(rows, usable, leaving, leaving_page, resident_pages, dev_k, dev_v):
    batch_size, num_kv_heads, num_slots = rows.shape
    empty = (rows == PAD_BLOCK) & usable
    leaving = leaving.view(-1, 1, 1)
    admitted = (leaving != PAD_BLOCK).view(-1, 1) & ~(rows == leaving).any(dim=-1) & empty.any(dim=-1)  # [B, Hkv]
    first_empty = empty.to(torch.int8).argmax(dim=-1)  # [B, Hkv]
    staged = torch.cat([rows, torch.full_like(rows[..., :1], PAD_BLOCK)], dim=-1)
    staged.scatter_(-1, torch.where(admitted, first_empty, num_slots).unsqueeze(-1),
                    leaving.to(rows.dtype).expand(batch_size, num_kv_heads, 1))
    head = torch.arange(num_kv_heads, device=rows.device).view(1, num_kv_heads)
    src = leaving_page.long().view(-1, 1) * num_kv_heads + head
    dst = resident_pages.long().gather(1, first_empty) * num_kv_heads + head
    _copy(admitted, src, dst, dev_k, dev_v, dev_k, dev_v)
    return staged[..., :num_slots]


def _bring_in_and_copy(rows, usable, candidates, selected, scores, quota, host_table, resident_pages, host_k, host_v,
                       dev_k, dev_v):
    """Decide which candidates enter which slots (module docstring), copy them -> (new rows, moves [B, Hkv])."""
    batch_size, num_kv_heads, num_slots = rows.shape
    if num_slots == 0:
        return rows, torch.zeros(batch_size, num_kv_heads, dtype=torch.int32, device=rows.device)
    wanted = (candidates != PAD_BLOCK) & ~contains(candidates, rows)
    empty = (rows == PAD_BLOCK) & usable
    victim_class = torch.where(empty, 0, torch.where(contains(rows, selected) | ~usable, 2, 1))  # 2: never a victim
    order = torch.arange(num_slots, device=rows.device).expand_as(rows)
    if scores is not None:
        score = scores.gather(-1, rows.clamp(min=0).long()).masked_fill(empty, 0.0)
        order = torch.sort(score, dim=-1, stable=True).indices
    order = order.gather(-1, torch.sort(victim_class.gather(-1, order), dim=-1, stable=True).indices)
    num_victims = (victim_class < 2).sum(dim=-1, keepdim=True)
    rank = torch.cumsum(wanted.to(torch.int32), dim=-1) - 1
    applied = wanted & (rank < num_victims) & (rank < quota.unsqueeze(-1))
    dst_slot = order.gather(-1, rank.clamp(min=0, max=num_slots - 1).long())
    staged = torch.cat([rows, torch.full_like(rows[..., :1], PAD_BLOCK)], dim=-1)
    staged.scatter_(-1, torch.where(applied, dst_slot, num_slots), candidates)
    head = torch.arange(num_kv_heads, device=rows.device).view(1, num_kv_heads, 1)
    src_page = host_table.gather(1, candidates.clamp(min=0).reshape(batch_size, -1).long()).view_as(candidates)
    dst_page = resident_pages.gather(1, dst_slot.reshape(batch_size, -1)).view_as(candidates)
    _copy(applied, src_page.long() * num_kv_heads + head, dst_page.long() * num_kv_heads + head, host_k, host_v,
          dev_k, dev_v)
    return staged[..., :num_slots], applied.sum(dim=-1, dtype=torch.int32)


def _copy(applied, src_rows, dst_rows, src_k, src_v, dst_k, dst_v):
    """Row copies (page * Hkv + head) of the applied entries; the rest aim at the device store's scratch row
    (its last page), which nothing reads."""
    num_kv_heads = dst_k.shape[1]
    scratch = (dst_k.shape[0] - 1) * num_kv_heads
    flat = applied.flatten()
    src = torch.where(flat, src_rows.flatten(), 0)
    dst = torch.where(flat, dst_rows.flatten(), scratch)
    for source, target in ((src_k, dst_k), (src_v, dst_v)):
        copy_block_rows(source.flatten(0, 1), src, target.flatten(0, 1), dst, skip_row=scratch)


def _check(resident, slots, resident_pages, host_table, host_k, dev_k, selected, counts, num_full, forced_blocks,
           quota, admit, leaving_block, leaving_page, fill, ready, recall, scores, cpu_blocks, cpu_counts, brake,
           counters):
    index, rows = (torch.int32,), "rows"
    check_tensor("resident", resident, ndim=3, dtypes=index, contiguous=rows)
    device = resident.device
    check_tensor("selected", selected, ndim=3, dtypes=index, device=device, contiguous=rows)
    batch_size, num_kv_heads, _ = selected.shape
    num_resident = resident.shape[2]
    if resident.shape[1] != num_kv_heads:
        raise ValueError(f"resident must be [slots, {num_kv_heads}, R], got {tuple(resident.shape)}")
    for name, t, shape in (("counts", counts, (batch_size, num_kv_heads)), ("quota", quota, (batch_size, num_kv_heads)),
                           ("resident_pages", resident_pages, (batch_size, num_resident))):
        check_tensor(name, t, dtypes=index, device=device, contiguous=rows)
        check_shape(name, t, shape)
    for name, t in (("slots", slots), ("num_full", num_full)):
        check_tensor(name, t, ndim=1, dtypes=(torch.int32, torch.int64), device=device, contiguous=False)
        check_shape(name, t, (batch_size,))
    for name, t in (("host_table", host_table), ("forced_blocks", forced_blocks)):
        check_tensor(name, t, ndim=2, dtypes=index, device=device, contiguous=rows)
        if t.shape[0] != batch_size:
            raise ValueError(f"{name} must have {batch_size} rows, got {t.shape[0]}")
    check_tensor("dev_k", dev_k, ndim=4)
    check_tensor("host_k", host_k, ndim=4, dtypes=(dev_k.dtype,))
    if host_k.shape[1:] != dev_k.shape[1:] or dev_k.shape[1] != num_kv_heads:
        raise ValueError(f"host store {tuple(host_k.shape)} and device store {tuple(dev_k.shape)} must share "
                         f"[{num_kv_heads}, S, D] pages")
    if admit and (leaving_block is None or leaving_page is None):
        raise ValueError("admit needs leaving_block and leaving_page")
    if fill:
        if ready is None:
            raise ValueError("fill needs ready")
        check_tensor("ready", ready, ndim=2, device=device)
        if ready.shape != resident.shape[:2]:
            raise ValueError(f"ready must be {tuple(resident.shape[:2])}, got {tuple(ready.shape)}")
    if recall not in RECALL_KINDS:
        raise ValueError(f"recall must be one of {RECALL_KINDS}, got {recall!r}")
    if recall is not None:
        if scores is None:
            raise ValueError("recall needs scores")
        check_tensor("scores", scores, ndim=3, dtypes=(torch.float32,), device=device, contiguous=rows)
        if recall == "cpu" and (cpu_blocks is None or cpu_counts is None):
            raise ValueError('recall "cpu" needs cpu_blocks and cpu_counts')
    if brake is not None:
        _check_brake(brake, resident, host_table, batch_size, device)
    if counters is not None:
        check_tensor("counters", counters, dtypes=index, device=device)
        check_shape("counters", counters, (NUM_COUNTERS,))


def _check_brake(brake, resident, host_table, batch_size, device):
    if brake.runs is not None:
        check_tensor("brake.runs", brake.runs, ndim=3, dtypes=(torch.int32,), device=device, contiguous="rows")
        if brake.runs.shape[:2] != resident.shape[:2] or brake.runs.shape[2] < host_table.shape[1] + 1:
            raise ValueError(f"brake.runs must be [{resident.shape[0]}, {resident.shape[1]}, >= NB + 1 = "
                             f"{host_table.shape[1] + 1}], got {tuple(brake.runs.shape)}")
        if not 1 <= brake.min_selected <= RUN_LIMIT:
            raise ValueError(f"brake.min_selected must be in [1, {RUN_LIMIT}], got {brake.min_selected}")
    if brake.state is not None:
        check_tensor("brake.state", brake.state, ndim=3, dtypes=(torch.int32,), device=device, contiguous="rows")
        check_shape("brake.state", brake.state, (*resident.shape[:2], STATE_WORDS + resident.shape[2]))
        if brake.max_backoff < 0:
            raise ValueError(f"brake.max_backoff must be >= 0, got {brake.max_backoff}")
    check_tensor("brake.positions", brake.positions, ndim=1, dtypes=(torch.int32, torch.int64), device=device,
                 contiguous=False)
    check_shape("brake.positions", brake.positions, (batch_size,))
