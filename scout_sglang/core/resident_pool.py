"""Resident-first serving: one device page pool for the offloaded layers' resident blocks, shared by the requests.

Without it each request slot owns a fixed resident buffer of `resident_blocks`
pages. With it (ScoutConfig.resident_first) a slot's resident row is as wide as
a request can have blocks outside its window (R, the ceiling), and only its
first `quota` columns have a page, from one pool; the others hold PAD, which
the resident-buffer stage never fills (kernels/stage_recall.py). The quota is
data in the step's tables, never a shape.

    quota(request) = water-filled share of the pool over the admitted requests,
                     each asking for max(resident_blocks, its blocks outside the window)
                     (so at least resident_blocks, at most all of its blocks)
    exact(request) = quota >= its blocks outside the window

An exact request selects every block (the select stage's row_topk) and takes
them all into its resident row at its next fill (its fill flags are cleared
when it turns exact, its fill quota is its whole row): the device part then
attends every block, as full attention does, and its CPU list is empty. When
the batch grows and the quota falls below its blocks, the request goes back to
the budget's top-k with its resident row as the cache: the row is compacted
first, per layer and KV head, keeping the blocks of its last selection best
first, then its other blocks newest first (the lowest-scoring go first,
unselected ones before any selected; a row that ran a step exact since its last
sparse one keeps its newest blocks), and the pages past the new quota return to
the pool. That copy happens between steps, on the
device; nothing else waits.

A step whose every request is exact and settled (`settled`: its row holds every
block, filled by a step or written by its prefill) runs the exact path
(core/layer_stages.attend_exact): no selection, no CPU part.

Host work per step is O(requests): the quotas are sums of host counts, and a
quota change moves its columns to the device table like any page-table change
(device_tables.py).

Each request's quotas, step by step, are kept as runs [quota, steps] while it
runs (a shrink and a regrowth between two steps as [quota, steps, low]), and of
the last RECENT_REQUESTS that finished (`recent`, on the server's
/server_info): what a reference decoder replays (`replayed`: rid -> runs, in
place of the water-fill) to decode one request alone as the server decoded it
among others.
"""

from __future__ import annotations

from collections import deque

import torch

from scout_sglang.core.stores import SlotPageTable
from scout_sglang.kernels.recall_brake import FRESH, MOVED
from scout_sglang.layout import PAD_BLOCK


RECENT_REQUESTS = 64  # finished requests whose quota runs the pool keeps


def water_fill(demands: list[int], pages: int) -> list[int]:
    """Split `pages` over requests with these demands: each gets min(demand, level), the level the highest the pages
    allow; the pages left below a whole level go one each to the largest demands' requests, the earlier first."""
    order = sorted(range(len(demands)), key=lambda i: (demands[i], i))
    given, left = [0] * len(demands), pages
    for position, i in enumerate(order):
        remaining = len(order) - position
        share = left // remaining
        if demands[i] <= share:
            given[i], left = demands[i], left - demands[i]
            continue
        extra = left - share * remaining
        for offset, j in enumerate(order[position:]):
            given[j] = share + (1 if offset >= remaining - extra else 0)
        return given
    return given


def exact_row_fields(exact: list[bool], *, width: int, forced: int, topk: int, recall_quota: int,
                     num_kv_heads: int) -> dict[str, torch.Tensor]:
    """The step plan's fields of resident-first rows, from each request's exactness: row_topk [B] (an exact row
    selects every block: as many as its row holds plus the forced ones; the others the budget's top-k) and
    recall_quota [B, Hkv] (an exact row's fill takes its whole row at once; the others the configured quota)."""
    exact_rows = torch.tensor(exact, dtype=torch.bool)
    return dict(row_topk=torch.where(exact_rows, width + forced, topk),
                recall_quota=torch.where(exact_rows.view(-1, 1), width, recall_quota).expand(-1, num_kv_heads))


class ResidentPool(SlotPageTable):
    """The pool's pages and each slot's resident columns (host table [slots, R], PAD past the quota), kept on the
    device by a DeviceTable like any page table.

    Parameters
    ----------
    num_pages : the pool's pages; the device store's pages [first_page, first_page + num_pages) are the pool's
    first_page : where the pool starts in the device store
    max_requests, width : request slots and R, the resident columns of each (the ceiling)
    floor : resident_blocks, the pages every admitted request keeps
    """

    def __init__(self, num_pages: int, *, first_page: int, max_requests: int, width: int, floor: int):
        super().__init__(num_pages, max_requests, width, name="resident pool pages")
        self.first_page, self.width, self.floor = first_page, width, floor
        if num_pages < max_requests * floor:
            raise ValueError(f"the resident pool holds {num_pages} pages, fewer than max_requests x resident_blocks "
                             f"({max_requests} x {floor}): every admitted request keeps resident_blocks")
        self.exact: dict[int, bool] = {}  # rid -> attended over all its blocks
        # exact requests whose rows hold every block: a step ran with them exact (its fill took them all), or they
        # were exact since admission and their prefill wrote each block it moved out of the window
        self.settled: set[int] = set()
        self.unselected: set[int] = set()  # requests that ran a step exact since their last sparse one (stale selection)
        self.evicted_columns = 0  # resident columns given back by quota shrinkage (each: a block per layer and head)
        self.runs: dict[int, dict] = {}  # rid -> {"prompt_tokens", "quota_runs": [[quota, steps], ...]} while it runs
        self.recent: deque[dict] = deque(maxlen=RECENT_REQUESTS)  # the same, of the last requests that finished
        self.replayed: dict[int, list[list[int]]] = {}  # rid -> quota runs that replace its water-filled share
        self.low: dict[int, int] = {}  # rid -> the lowest quota it had since its last step (a dip, when regrown)

    def quota(self, rid: int) -> int:
        return self.pages.count(rid)

    def plan(self, needed: dict[int, int], steps: dict[int, int] | None = None, *,
             dips: bool = False) -> dict[int, int]:
        """New quotas of the requests in `needed` (rid -> blocks outside its window): every admitted request; a
        replayed one (steps: rid -> its decode steps so far) gets its runs' quota at that step (dips: the dip
        recorded before it where there is one, and every other request keeps its quota)."""
        rids = list(needed)
        demands = [min(self.width, max(self.floor, needed[rid])) for rid in rids]
        quotas = dict(zip(rids, water_fill(demands, self.pages.num_pages)))
        if dips:  # only the dipping ones move
            lows = {rid: dip_at(self.replayed.get(rid, []), (steps or {}).get(rid, 0)) for rid in quotas}
            return {rid: self.quota(rid) if low is None else min(self.width, low) for rid, low in lows.items()}
        for rid in self.replayed.keys() & quotas.keys():
            quotas[rid] = min(self.width, quota_at(self.replayed[rid], (steps or {}).get(rid, 0)))
        return quotas

    def dips_due(self, steps: dict[int, int]) -> bool:
        """Whether a replayed request of `steps` (rid -> its decode steps so far) dipped before this step."""
        return any(dip_at(self.replayed[rid], step) is not None for rid, step in steps.items() if rid in self.replayed)

    def record(self, rid: int, prompt_tokens: int) -> None:
        """The next decode step of `rid` runs at its quota now. A quota that fell below it since the last step and
        grew back (another request came and went between two steps) starts a run [quota, 1, low]: the row was
        compacted to `low` columns, which a replay repeats. Dips before the first step change nothing a replay
        sees (the row of a request that stops fitting before its first step is emptied)."""
        quota, low = self.quota(rid), self.low.pop(rid, None)
        runs = self.runs.setdefault(rid, {"prompt_tokens": prompt_tokens, "quota_runs": []})["quota_runs"]
        if runs and low is not None and low < quota:
            runs.append([quota, 1, low])
        elif runs and runs[-1][0] == quota:
            runs[-1][1] += 1
        else:
            runs.append([quota, 1])

    def finish(self, rid: int) -> None:
        """`rid` leaves: its quota runs go to `recent`."""
        self.low.pop(rid, None)
        runs = self.runs.pop(rid, None)
        if runs is not None:
            self.recent.append(runs)

    def grow(self, rid: int, slot: int, quota: int) -> None:
        if quota > self.width:
            raise ValueError(f"resident pool: request {rid} cannot hold {quota} resident columns, its row has "
                             f"{self.width}")
        have = self.pages.count(rid)
        if quota <= have:
            return
        new = self.pages.allocate(rid, quota - have)
        self.table[slot, have:quota] = torch.tensor([self.first_page + p for p in new], dtype=torch.int32)
        self.mark(slot, have, quota)

    def held_columns(self, rid: int, steps: int) -> int:
        """The first columns of `rid`'s row that may hold a block: after its first step, the lowest quota it had
        since its last step (between steps a decoding row only loses blocks); before it, all it has (its prefill
        writes its row)."""
        have = self.quota(rid)
        runs = self.runs.get(rid)
        if not steps or runs is None:
            return have
        return min(have, runs["quota_runs"][-1][0], self.low.get(rid, have))

    def shrink(self, rid: int, slot: int, quota: int) -> None:
        have = self.pages.count(rid)
        if quota >= have:
            return
        self.pages.release_last(rid, have - quota)
        self.low[rid] = min(self.low.get(rid, quota), quota)
        self.table[slot, quota:have] = PAD_BLOCK
        self.mark(slot, quota, have)
        self.evicted_columns += have - quota

    def usage(self) -> dict:
        return {"pages": self.pages.num_pages, "used": self.pages.num_used,
                "exact_requests": sum(self.exact.values()), "requests": len(self.exact),
                "evicted_columns": self.evicted_columns}


def quota_at(runs: list[list[int]], step: int) -> int:
    """The quota of decode step `step` in runs [[quota, steps(, low)], ...] (past their end: the last quota)."""
    for quota, count, *_ in runs:
        if step < count:
            return quota
        step -= count
    return runs[-1][0]


def dip_at(runs: list[list[int]], step: int) -> int | None:
    """The quota a request dipped to before decode step `step` (a run [quota, steps, low] starting there), or
    None."""
    for run in runs:
        if step == 0:
            return run[2] if len(run) > 2 else None
        if step < run[1]:
            return None
        step -= run[1]
    return None


def compact_rows(resident: torch.Tensor, slots: list[int], keeps: list[int], pages: torch.Tensor,
                 last_selection: torch.Tensor, dev_k: torch.Tensor, dev_v: torch.Tensor, *, max_blocks: int,
                 brake_state: torch.Tensor | None = None, by_recency: list[bool] | None = None) -> None:
    """Before the quotas of `slots` fall to `keeps` columns: per slot and KV head, move the blocks to keep into
    columns [0, keep) (their K and V with them) and empty the rest. Kept first: the blocks of the slot's last
    selection, best first (its order); then its other held blocks, newest first (never by column: a row's column
    order depends on how it was filled). Device ops on the stream, a fixed number for all the slots of a layer,
    between steps; nothing is read back.

    resident : [slots, Hkv, R] int32 the layer's resident map; pages : [S, R] int32 (device) the slots' column
    pages before the change; last_selection : [slots, Hkv, K] int32 the layer's last selection by slot (PAD past
    it); dev_k, dev_v : [P, Hkv, S, D] the device store; max_blocks : blocks a request can have (every index is
    below); brake_state : the layer's recall brake state, whose judgement of the slots' last recall is dropped
    (their columns moved); by_recency : per slot, its last selection ignored (newest first throughout): a row
    exact in a step since its last sparse one, whose selection is stale where that step ran on the exact path."""
    device = resident.device
    index = torch.tensor(slots, dtype=torch.long, device=device)
    keep = torch.tensor(keeps, dtype=torch.long, device=device).view(-1, 1, 1)
    rows = resident[index]  # [S, Hkv, R]
    _, num_kv_heads, width = rows.shape
    selection = last_selection[index].long()  # [S, Hkv, K]
    topk = selection.shape[2]
    listed = selection != PAD_BLOCK
    newest = None
    if by_recency is not None and any(by_recency):
        newest = torch.tensor(by_recency, dtype=torch.bool, device=device).view(-1, 1, 1)
        listed &= ~newest
    rank = torch.full((*rows.shape[:2], max_blocks + 1), -1, dtype=torch.long, device=device)  # block -> position
    positions = torch.arange(topk, device=device).expand_as(selection)
    rank.scatter_(2, torch.where(listed, selection, max_blocks), torch.where(listed, positions, -1))
    column = torch.arange(width, device=device).expand_as(rows)
    held = rows != PAD_BLOCK
    position = rank.gather(2, torch.where(held, rows.long(), max_blocks))
    key = torch.where(held & (position >= 0), position,  # the other held blocks newest first, then the empty
                      torch.where(held, topk + max_blocks - rows.long(), topk + max_blocks + column))
    order = torch.sort(key, dim=2, stable=True).indices  # [S, Hkv, R] source column of each new column
    kept = torch.where(column < keep, rows.gather(2, order), PAD_BLOCK)
    head = torch.arange(num_kv_heads, device=device).view(1, -1, 1)
    page_of = pages.long().unsqueeze(1).expand(-1, num_kv_heads, -1)  # [S, Hkv, R]
    src, dst = page_of.gather(2, order) * num_kv_heads + head, page_of * num_kv_heads + head
    scratch = (dev_k.shape[0] - 1) * num_kv_heads + head  # the store's scratch page: the rows that move nothing
    moves = (kept != PAD_BLOCK) & (src != dst)
    src, dst = torch.where(moves, src, scratch).flatten(), torch.where(moves, dst, scratch).flatten()
    for store in (dev_k, dev_v):
        flat = store.view(-1, *store.shape[2:])
        flat[dst] = flat[src]  # the right side is gathered first: overlapping moves are safe (no mask: no sync)
    resident.index_copy_(0, index, kept.to(resident.dtype))
    if brake_state is not None:
        brake_state[index, :, MOVED] = 0
        brake_state[index, :, FRESH:] = 0
