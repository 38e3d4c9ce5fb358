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

Requests that share a cached prefix (SGLang's radix cache: the same host pages)
share its resident pages too (core/pool_sharing.py): a new request whose prefix
another exact row holds as its prefill wrote it (column c holds block sink + c)
points its first columns at that row's pages, which pass to the pool's SHARED
holder, and starts exact and settled. Nothing writes a shared page: only exact
rows hold one, whose columns a step never moves; a row that stops being exact
first copies them into pages of its own. A shared page counts once, and the
pages sharing saves go to the water-fill while every row holding them is exact.

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

from scout_sglang.core.host_copy import to_device
from scout_sglang.core.stores import SlotPageTable
from scout_sglang.kernels.recall_brake import FRESH, MOVED
from scout_sglang.layout import PAD_BLOCK


RECENT_REQUESTS = 64  # finished requests whose quota runs the pool keeps
SHARED = -1  # the pool allocator's holder of the pages more than one row may point at (a shared prefix's blocks)


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


def exact_row_lists(exact: list[bool], *, width: int, forced: int, topk: int, recall_quota: int,
                    num_kv_heads: int) -> dict[str, list]:
    """The step plan's fields of resident-first rows, from each request's exactness: row_topk [B] (an exact row
    selects every block: as many as its row holds plus the forced ones; the others the budget's top-k) and
    recall_quota [B, Hkv] (an exact row's fill takes its whole row at once; the others the configured quota)."""
    return dict(row_topk=[width + forced if whole else topk for whole in exact],
                recall_quota=[[width if whole else recall_quota] * num_kv_heads for whole in exact])


def exact_row_fields(exact: list[bool], *, num_kv_heads: int, **sizes) -> dict[str, torch.Tensor]:
    """exact_row_lists as tensors: [B] and [B, Hkv] (B may be 0: a step of padding rows only)."""
    lists = exact_row_lists(exact, num_kv_heads=num_kv_heads, **sizes)
    return dict(row_topk=torch.tensor(lists["row_topk"], dtype=torch.long),
                recall_quota=torch.tensor(lists["recall_quota"], dtype=torch.long).view(len(exact), num_kv_heads))


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
        # A shared prefix (pool_sharing.py): rid -> the SHARED pages of its first columns, in column order (its own
        # pages are its next columns); the rows pointing at each shared page; and rid -> its first columns that hold
        # block sink + c in every layer and KV head (its prefill wrote them, and it has been exact since).
        self.shared_pages: dict[int, list[int]] = {}
        self.references: dict[int, int] = {}
        self.pointers = 0  # the rows' shared columns: the sum of references
        # since start-up: blocks of adopted prefixes taken from another row's pages, and copied in from the host
        self.prefix_blocks_shared = self.prefix_blocks_copied = 0
        self.identity: dict[int, int] = {}
        self.owed: dict[int, int] = {}  # rid -> its first columns without a page between unshare and repay

    def quota(self, rid: int) -> int:
        return len(self.shared_pages.get(rid, ())) + self.pages.count(rid)

    def saved_pages(self, sharers: set[int] | None = None) -> int:
        """Pages that sharing saves: the rows' shared columns less the distinct pages they point at (sharers: only
        those rows')."""
        if sharers is None:
            return self.pointers - len(self.references)
        counts: dict[int, int] = {}
        for rid in sharers:
            for page in self.shared_pages.get(rid, ()):
                counts[page] = counts.get(page, 0) + 1
        return sum(counts.values()) - len(counts)

    def plan(self, needed: dict[int, int], steps: dict[int, int] | None = None, *,
             dips: bool = False) -> dict[int, int]:
        """New quotas of the requests in `needed` (rid -> blocks outside its window): every admitted request; a
        replayed one (steps: rid -> its decode steps so far) gets its runs' quota at that step (dips: the dip
        recorded before it where there is one, and every other request keeps its quota)."""
        rids = list(needed)
        demands = [min(self.width, max(self.floor, needed[rid])) for rid in rids]
        # The pages sharing saves go to everyone while every row holding them is exact; a sharer the level cuts
        # copies its shared columns into pages of its own (unshare), and the others share the rest.
        sharers, saved = {rid for rid in rids if rid in self.shared_pages}, self.saved_pages()
        while True:
            quotas = dict(zip(rids, water_fill(demands, self.pages.num_pages + saved)))
            cut = {rid for rid in sharers if quotas[rid] < needed[rid]}
            if not cut:
                break
            sharers -= cut
            saved = self.saved_pages(sharers)
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
        have = self.quota(rid)
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
        have = self.quota(rid)
        if quota >= have:
            return
        if quota < len(self.shared_pages.get(rid, ())):
            raise RuntimeError(f"resident pool: request {rid} shrinks to {quota} columns but points at "
                               f"{len(self.shared_pages[rid])} shared pages; it gives them up first (unshare)")
        self.pages.release_last(rid, have - quota)
        self.low[rid] = min(self.low.get(rid, quota), quota)
        self.table[slot, quota:have] = PAD_BLOCK
        self.mark(slot, quota, have)
        self.evicted_columns += have - quota

    def release(self, rid: int, slot: int) -> None:
        held = self.quota(rid)
        self.drop_shared(rid)
        self.pages.release(rid)
        self.identity.pop(rid, None)
        self.table[slot, :held] = PAD_BLOCK
        self.mark(slot, 0, held)

    def share(self, rid: int, slot: int, donor: int, count: int) -> list[int]:
        """New request `rid` (an empty row) points its first `count` columns at the pages of `donor`'s first
        `count` columns, which hold the same blocks (pool_sharing.share_prefix says when): those of the donor's own
        pass to SHARED. `rid`'s own pages go back (the next rebalance gives it its quota). Returns the pages."""
        theirs = self.shared_pages.setdefault(donor, [])
        if count > len(theirs):
            moved = self.pages.transfer_first(donor, count - len(theirs), SHARED)
            theirs.extend(moved)
            self.references.update(dict.fromkeys(moved, 1))
            self.pointers += len(moved)
        pages, held = theirs[:count], self.quota(rid)
        for page in pages:
            self.references[page] += 1
        self.pointers += count
        self.prefix_blocks_shared += count
        self.pages.release(rid)
        self.shared_pages[rid] = pages
        self.table[slot, :count] = torch.tensor([self.first_page + p for p in pages], dtype=torch.int32)
        self.table[slot, count:held] = PAD_BLOCK
        self.mark(slot, 0, max(count, held))
        return pages

    def unshare(self, rid: int, slot: int, quota: int) -> None:
        """`rid` stops being exact at `quota` columns: it points at no shared page. Its own pages keep their columns
        (those below `quota`); its first columns, the shared ones below `quota`, are owed pages of its own, which
        `repay` gives once every shrink has freed its pages. Host tables only: the caller then copies the blocks of
        the columns whose page changed (pool_rebalance.rebalance): the shared ones, unless the row is compacted."""
        held, shared = self.quota(rid), len(self.shared_pages.get(rid, ()))
        self.drop_shared(rid)
        self.identity.pop(rid, None)
        kept = min(quota, held)  # columns with a page once repaid: [0, owed) new, [shared, kept) its own
        self.pages.release_last(rid, self.pages.count(rid) - max(0, kept - shared))
        self.owed[rid] = min(shared, quota)
        self.table[slot, :self.owed[rid]] = PAD_BLOCK
        self.table[slot, kept:held] = PAD_BLOCK
        self.mark(slot, 0, held)
        if quota < held:
            self.low[rid] = min(self.low.get(rid, quota), quota)
            self.evicted_columns += held - quota

    def repay(self, rid: int, slot: int) -> None:
        """Pages of its own for the first columns `unshare` left without one (they come first in its row)."""
        owed = self.owed.pop(rid, 0)
        if owed:
            pages = self.pages.allocate_first(rid, owed)
            self.table[slot, :owed] = torch.tensor([self.first_page + p for p in pages], dtype=torch.int32)

    def drop_shared(self, rid: int) -> list[int]:
        """`rid` points at no shared page any more (its columns still do, until the caller rewrites them): each
        page that no other row points at goes back to the free list. Returns the pages it pointed at."""
        pages = self.shared_pages.pop(rid, [])
        self.pointers -= len(pages)
        freed = []
        for page in pages:
            self.references[page] -= 1
            if not self.references[page]:
                del self.references[page]
                freed.append(page)
        self.pages.release_pages(SHARED, freed)
        return pages

    def usage(self) -> dict:
        return {"pages": self.pages.num_pages, "used": self.pages.num_used,
                "exact_requests": sum(self.exact.values()), "requests": len(self.exact),
                "evicted_columns": self.evicted_columns, "shared_pages": len(self.references),
                "saved_pages": self.saved_pages(), "prefix_blocks_shared": self.prefix_blocks_shared,
                "prefix_blocks_copied": self.prefix_blocks_copied}


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
                 brake_state: torch.Tensor | None = None, by_recency: list[bool] | None = None,
                 dst_pages: torch.Tensor | None = None, reordered: list[bool] | None = None) -> None:
    """Before the quotas of `slots` fall to `keeps` columns: per slot and KV head, move the blocks to keep into
    columns [0, keep) (their K and V with them) and empty the rest. Kept first: the blocks of the slot's last
    selection, best first (its order); then its other held blocks, newest first (never by column: a row's column
    order depends on how it was filled). Device ops on the stream, a fixed number for all the slots of a layer,
    between steps; nothing is read back, and the host lists go over without waiting for the stream (to_device).

    resident : [slots, Hkv, R] int32 the layer's resident map; pages : [S, R] int32 (device) the slots' column
    pages before the change; last_selection : [slots, Hkv, K] int32 the layer's last selection by slot (PAD past
    it); dev_k, dev_v : [P, Hkv, S, D] the device store; max_blocks : blocks a request can have (every index is
    below); brake_state : the layer's recall brake state, whose judgement of the slots' last recall is dropped
    (their columns moved); by_recency : per slot, its last selection ignored (newest first throughout): a row
    exact in a step since its last sparse one, whose selection is stale where that step ran on the exact path;
    dst_pages : [S, R] int32 (device) the slots' column pages after the change, where they differ (a row that gives
    up its shared pages: its blocks move to its own); reordered : per slot, False: its columns keep their order
    (only their pages change; its brake state stands)."""
    device = resident.device
    index = to_device(slots, device, torch.long)
    keep = to_device(keeps, device, torch.long).view(-1, 1, 1)
    rows = resident[index]  # [S, Hkv, R]
    _, num_kv_heads, width = rows.shape
    selection = last_selection[index].long()  # [S, Hkv, K]
    topk = selection.shape[2]
    listed = selection != PAD_BLOCK
    newest = None
    if by_recency is not None and any(by_recency):
        newest = to_device(by_recency, device, torch.bool).view(-1, 1, 1)
        listed &= ~newest
    rank = torch.full((*rows.shape[:2], max_blocks + 1), -1, dtype=torch.long, device=device)  # block -> position
    positions = torch.arange(topk, device=device).expand_as(selection)
    rank.scatter_(2, torch.where(listed, selection, max_blocks), torch.where(listed, positions, -1))
    column = torch.arange(width, device=device).expand_as(rows)
    held = rows != PAD_BLOCK
    position = rank.gather(2, torch.where(held, rows.long(), max_blocks))
    key = torch.where(held & (position >= 0), position,  # the other held blocks newest first, then the empty
                      torch.where(held, topk + max_blocks - rows.long(), topk + max_blocks + column))
    if reordered is not None and not all(reordered):
        in_place = to_device([not r for r in reordered], device, torch.bool).view(-1, 1, 1)
        key = torch.where(in_place, column, key)
    order = torch.sort(key, dim=2, stable=True).indices  # [S, Hkv, R] source column of each new column
    kept = torch.where(column < keep, rows.gather(2, order), PAD_BLOCK)
    head = torch.arange(num_kv_heads, device=device).view(1, -1, 1)
    page_of = pages.long().unsqueeze(1).expand(-1, num_kv_heads, -1)  # [S, Hkv, R]
    new_page_of = page_of if dst_pages is None else dst_pages.long().unsqueeze(1).expand(-1, num_kv_heads, -1)
    src, dst = page_of.gather(2, order) * num_kv_heads + head, new_page_of * num_kv_heads + head
    scratch = (dev_k.shape[0] - 1) * num_kv_heads + head  # the store's scratch page: the rows that move nothing
    moves = (kept != PAD_BLOCK) & (src != dst)
    src, dst = torch.where(moves, src, scratch).flatten(), torch.where(moves, dst, scratch).flatten()
    for store in (dev_k, dev_v):
        flat = store.view(-1, *store.shape[2:])
        flat[dst] = flat[src]  # the right side is gathered first: overlapping moves are safe (no mask: no sync)
    resident.index_copy_(0, index, kept.to(resident.dtype))
    if brake_state is not None:
        moved = index if reordered is None else \
            to_device([slot for slot, r in zip(slots, reordered) if r], device, torch.long)
        brake_state[moved, :, MOVED] = 0
        brake_state[moved, :, FRESH:] = 0
