"""KV storage of the engine: the device-full store and the offloaded store.

Where each block of each request lives, per layer (layout: scout_sglang.layout):

  device-full layers (modes full/quest, and dense layers in every mode)
      every block on the device: k/v[layer][page], page table `table[slot]`
  offloaded layers (modes scout/infinigen/hgca)
      host:   host_k/host_v[layer][host page]   every FULL block
      device: digest_min/max[layer][host page]  digests of every full block
              value_summary[layer][host page]      its value summary (with the estimate on)
              window pages per request:
                [sink_0 .. sink_{s-1}] [ring_0 .. ring_L] [res_0 .. res_{R-1}]
                 first blocks           last L full      resident buffer,
                                        blocks + tail    per KV head
              resident_map[layer][slot, head, r] = logical block in res_r
              (-1: empty), so each KV head keeps its own blocks

Per-request state is indexed by request slot, as SGLang's req_to_token is:
page tables are host tensors [max_requests, max_blocks] (PAD_BLOCK past the
allocated pages) that a step's plan gathers for its batch in one op. Every
store has one extra page at index `scratch_page`: fixed-shape writes of the
decode step send the rows that have nothing to write there (a request whose
token completes no block, a recall move past the capacity), so the number of
ops never depends on the data. Nothing reads the scratch page.

Pages are allocated per request, once for all layers of a kind.

The host store may be borrowed (BorrowedHostStore): on a PD decode instance
the pages where the transfer engine lands a request's K/V are the store
itself. Their owner (SGLang's allocator) allocates and frees them; the engine
is told which page holds each block (AssignedPageTable), and the first write of
a full block, at admission, turns the page from the token-major layout it
arrived in into the engine's head-major one in place.

Under SGLang's radix cache (assigned pages) the engine owns its stores but
SGLang's allocator picks every page: block j of a request lives in page
req_to_token[j * S] // S of the host store (offloaded layers) and of the
device-full store (dense layers). Requests that share a cached prefix are
assigned the same pages, and so share the blocks, their digests (a digest row
per host page) and their fill; the radix tree decides when a page is free.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scout_sglang import kernels
from scout_sglang.core.host_wait import wait_for_device
from scout_sglang.core.page_allocator import OutOfPagesError, PageAllocator
from scout_sglang.core.shape import ModelShape
from scout_sglang.core.step_plan import window_geometry
from scout_sglang.cpu_worker.host_memory import PageSurvey, alloc_store_tensor, buffers_of
from scout_sglang.kernels.recall_brake import NO_RUN, new_runs, new_state
from scout_sglang.layout import PAD_BLOCK, VALUE_SUMMARY_ROWS


# Host markers of pages only the device knows are below this (AssignedPages.assign_unknown).
DEVICE_ONLY = -(2**30)
POOL_OWNER = -1  # the device page allocator's holder of the resident pool's pages


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def write_tokens(k_store, v_store, pages: torch.Tensor, offsets: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """Scatter tokens [N, Hkv, D] into pages[N] at offsets[N] of HND stores."""
    k_store[pages, :, offsets] = k.to(k_store.dtype)
    v_store[pages, :, offsets] = v.to(v_store.dtype)


class SlotPageTable:
    """Pages of each request slot's logical blocks: an allocator plus a host tensor [max_requests, max_blocks].

    The tensor has a device copy (device_tables.DeviceTable) that a step gathers for its batch; every change of
    the tensor is recorded as a dirty column range per slot, which the next step moves to the device. The
    allocator owns the free list and checks for leaks.
    """

    def __init__(self, num_pages: int, max_requests: int, max_blocks: int, *, name: str):
        self.pages = PageAllocator(num_pages, name=name)
        self.max_blocks = max_blocks
        self.table = torch.full((max_requests, max_blocks), PAD_BLOCK, dtype=torch.int32)  # [slots, NB] CPU
        self.dirty: dict[int, tuple[int, int]] = {}  # slot -> columns [lo, hi) changed since the last step

    def mark(self, slot: int, lo: int, hi: int) -> None:
        """Columns [lo, hi) of `slot` changed on the host."""
        if hi <= lo:
            return
        old = self.dirty.get(slot)
        self.dirty[slot] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))

    def take_dirty(self) -> dict[int, tuple[int, int]]:
        dirty, self.dirty = self.dirty, {}
        return dirty

    def ensure(self, rid: int, slot: int, num_blocks: int) -> None:
        """Allocate pages so that logical blocks [0, num_blocks) of `rid` have one (all layers)."""
        have = self.pages.count(rid)
        if num_blocks <= have:
            return
        if num_blocks > self.max_blocks:
            raise OutOfPagesError(f"{self.pages.name}: request {rid} needs {num_blocks} blocks, more than the "
                                  f"{self.max_blocks} per request this engine was sized for (max_tokens_per_request)")
        new = self.pages.allocate(rid, num_blocks - have)
        self.table[slot, have:num_blocks] = torch.tensor(new, dtype=torch.int32)
        self.mark(slot, have, num_blocks)

    def release(self, rid: int, slot: int) -> None:
        held = self.pages.count(rid)
        self.pages.release(rid)
        self.table[slot, :held] = PAD_BLOCK
        self.mark(slot, 0, held)

    def page_list(self, rid: int) -> list[int]:
        return self.pages.table(rid)


class AssignedPages:
    """PageAllocator's bookkeeping for pages someone else allocates: which pages each request's blocks were
    assigned, in order. It allocates and frees nothing. Requests that share a cached prompt prefix (SGLang's
    radix cache) are assigned the same pages for the same blocks: a page is counted once, and is `shared` while
    more than one request holds it."""

    def __init__(self, num_pages: int, *, name: str, scratch_page: int | None = None):
        self.num_pages, self.name, self.scratch_page = num_pages, name, scratch_page
        self._tables: dict[int, list[int]] = {}
        self._holders: dict[int, int] = {}  # page -> requests that hold it (the scratch page is never counted)

    @property
    def num_used(self) -> int:
        """Distinct pages held by requests."""
        return len(self._holders)

    @property
    def num_shared(self) -> int:
        """Pages held by more than one request (a shared prefix's blocks)."""
        return sum(1 for holders in self._holders.values() if holders > 1)

    def count(self, rid: int) -> int:
        return len(self._tables.get(rid, ()))

    def table(self, rid: int) -> list[int]:
        """The pages of `rid`'s blocks; a block whose page only the device knows (assign_unknown) raises: the host
        reads a request's pages outside decode steps (prefill, a prefix's window), where every page is known."""
        pages = list(self._tables.get(rid, ()))
        if any(page <= DEVICE_ONLY for page in pages):
            raise RuntimeError(f"{self.name}: request {rid} has blocks whose page only the device knows (assigned "
                               "from a decode step's token slots); rebind it from the pool's table first")
        return pages

    def span(self, rid: int, first: int, count: int) -> list[int]:
        """The pages of `rid`'s blocks [first, first + count) as recorded: a block whose page only the device knows
        has its marker, which equals no page (a comparison of two requests' prefixes)."""
        return self._tables.get(rid, [])[first: first + count]

    def assign_unknown(self, rid: int, block: int, key: int) -> None:
        """Block `block` of `rid` (the next) has a page the host does not know: a marker unique to (slot, block)
        (`key`) holds its place, counted as one page in use until a rebind names it."""
        self.assign(rid, block, [DEVICE_ONLY - 1 - key])

    def assign(self, rid: int, first_block: int, pages: list[int]) -> None:
        have = self._tables.setdefault(rid, [])
        if first_block != len(have):
            raise ValueError(f"{self.name}: request {rid} holds {len(have)} blocks, block {first_block} cannot be "
                             "assigned next")
        self._check_range(rid, pages)
        have.extend(pages)
        for page in pages:
            self._hold(page)

    def rebind(self, rid: int, pages: list[int]) -> int:
        """Blocks 0, 1, ... of `rid` now live in `pages` (SGLang moved a request onto the radix tree's copy of its
        prefix and freed its own); returns how many blocks changed page."""
        have = self._tables.get(rid, [])
        if len(pages) > len(have):
            raise ValueError(f"{self.name}: request {rid} holds {len(have)} blocks, {len(pages)} cannot be rebound")
        self._check_range(rid, pages)
        changed = 0
        for block, page in enumerate(pages):
            if have[block] != page:
                self._drop(have[block])
                self._hold(page)
                have[block], changed = page, changed + 1
        return changed

    def release(self, rid: int) -> int:
        pages = self._tables.pop(rid, [])
        for page in pages:
            self._drop(page)
        return len(pages)

    def check_consistent(self) -> None:
        """No page holds two different blocks: a page two requests share is the same block of both (a prefix)."""
        block_of: dict[int, int] = {}
        for pages in self._tables.values():
            assert len(pages) == len(set(pages)), f"{self.name}: a request holds a page twice"
            for block, page in enumerate(pages):
                if page != self.scratch_page:
                    assert block_of.setdefault(page, block) == block, f"{self.name}: page {page} holds two blocks"

    def _check_range(self, rid: int, pages: list[int]) -> None:
        # page 0 is SGLang's padding page; the scratch page stands in for a request that writes nothing kept;
        # markers below DEVICE_ONLY stand for pages only the device knows
        bad = [page for page in pages if not 0 < page < self.num_pages and page != self.scratch_page
               and page > DEVICE_ONLY]
        if bad:
            raise ValueError(f"{self.name}: pages {bad[:4]} of request {rid} are outside 1..{self.num_pages - 1}")

    def _hold(self, page: int) -> None:
        if page != self.scratch_page:
            self._holders[page] = self._holders.get(page, 0) + 1

    def _drop(self, page: int) -> None:
        if page == self.scratch_page:
            return
        self._holders[page] -= 1
        if not self._holders[page]:
            del self._holders[page]


class AssignedPageTable(SlotPageTable):
    """SlotPageTable over pages someone else allocates (a borrowed host store, or SGLang's page ids under its
    radix cache): `assign` records which page holds each block (the pool's owner allocated it); `ensure` only
    checks that it did; release forgets the pages and frees none."""

    def __init__(self, num_pages: int, max_requests: int, max_blocks: int, *, name: str,
                 scratch_page: int | None = None):
        self.pages = AssignedPages(num_pages, name=name, scratch_page=scratch_page)
        self.max_blocks = max_blocks
        self.table = torch.full((max_requests, max_blocks), PAD_BLOCK, dtype=torch.int32)  # [slots, NB] CPU
        self.dirty: dict[int, tuple[int, int]] = {}

    def assign(self, rid: int, slot: int, first_block: int, pages: list[int]) -> None:
        """Blocks first_block, first_block + 1, ... of `rid` live in `pages` (assigned in order, once)."""
        if first_block + len(pages) > self.max_blocks:
            raise OutOfPagesError(f"{self.pages.name}: request {rid} needs {first_block + len(pages)} blocks, more "
                                  f"than the {self.max_blocks} per request this engine was sized for "
                                  "(max_tokens_per_request)")
        self.pages.assign(rid, first_block, pages)
        self.table[slot, first_block:first_block + len(pages)] = torch.tensor(pages, dtype=torch.int32)
        self.mark(slot, first_block, first_block + len(pages))

    def assign_on_device(self, rid: int, slot: int, block: int) -> None:
        """Block `block` of `rid` (the next to assign) gets its page on the device, from a decode step's token slot
        (device_tables.py): the host holds a marker in its place, and its table cell stays as it is (nothing to
        move: the device wrote the page)."""
        if block >= self.max_blocks:
            raise OutOfPagesError(f"{self.pages.name}: request {rid} needs {block + 1} blocks, more than the "
                                  f"{self.max_blocks} per request this engine was sized for (max_tokens_per_request)")
        self.pages.assign_unknown(rid, block, slot * self.max_blocks + block)

    def rebind(self, rid: int, slot: int, pages: list[int]) -> int:
        """Blocks 0, 1, ... of `rid` now live in `pages` (AssignedPages.rebind); returns how many changed."""
        changed = self.pages.rebind(rid, pages)
        if changed:
            self.table[slot, :len(pages)] = torch.tensor(pages, dtype=torch.int32)
            self.mark(slot, 0, len(pages))
        return changed

    def ensure(self, rid: int, slot: int, num_blocks: int) -> None:
        if num_blocks > self.pages.count(rid):
            raise RuntimeError(f"{self.pages.name}: request {rid} needs {num_blocks} full blocks, "
                               f"{self.pages.count(rid)} were assigned a page by the pool's owner")


def consecutive_runs(pages: list[int]) -> list[tuple[int, int]]:
    """(index of its first entry, length) of each run of consecutive values in `pages`, in order."""
    runs: list[tuple[int, int]] = []
    for i, page in enumerate(pages):
        if runs and page == pages[i - 1] + 1:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


@dataclass
class BorrowedHostStore:
    """Host K/V pages the engine stores its full blocks in without owning them.

    k, v : {layer: [P, Hkv, S, D] contiguous} for every offloaded layer (views of the owner's buffers);
    page 0 is the scratch page (SGLang's padding page: nothing reads it)."""

    k: dict
    v: dict
    scratch_page: int = 0


class DeviceFullStore:
    """Every block of every request on the device, for the given layers (with digests: quest's; with value
    summaries too: quest's estimate of the blocks it leaves out)."""

    def __init__(self, layers, *, num_pages: int, max_requests: int, max_blocks: int, shape: ModelShape,
                 block_size: int, dtype, device, with_digests: bool, with_value_summaries: bool = False,
                 assigned_pages: bool = False):
        self.layers = tuple(layers)
        self.block_size = block_size
        self.scratch_page = num_pages
        page_shape = (num_pages + 1, shape.num_kv_heads, block_size, shape.head_dim)
        self.k = {layer: torch.zeros(page_shape, dtype=dtype, device=device) for layer in self.layers}
        self.v = {layer: torch.zeros(page_shape, dtype=dtype, device=device) for layer in self.layers}
        digest_shape = (num_pages + 1, shape.num_kv_heads, shape.head_dim)
        self.digest_min = {layer: torch.zeros(digest_shape, dtype=dtype, device=device) for layer in self.layers} if with_digests else {}
        self.digest_max = {layer: torch.zeros(digest_shape, dtype=dtype, device=device) for layer in self.layers} if with_digests else {}
        summary_shape = (num_pages + 1, shape.num_kv_heads, VALUE_SUMMARY_ROWS, shape.head_dim)
        self.value_summary = {layer: torch.zeros(summary_shape, dtype=dtype, device=device)
                              for layer in self.layers} if with_digests and with_value_summaries else {}
        name = "device full-KV pages"
        self.tables = AssignedPageTable(num_pages, max_requests, max_blocks, name=name, scratch_page=num_pages) \
            if assigned_pages else SlotPageTable(num_pages, max_requests, max_blocks, name=name)
        self.pages = self.tables.pages
        self.assigned = assigned_pages
        self.device = device

    def ensure_tokens(self, rid: int, slot: int, num_tokens: int) -> None:
        """Allocate pages so that `num_tokens` tokens of `rid` fit (all layers)."""
        self.tables.ensure(rid, slot, ceil_div(num_tokens, self.block_size))

    def page_table(self, rid: int) -> list[int]:
        return self.tables.page_list(rid)

    def write(self, layer: int, rids: list[int], positions: list[int], k: torch.Tensor, v: torch.Tensor) -> None:
        """Write one token per entry: (rids[i], positions[i]) <- k[i], v[i] ([N, Hkv, D])."""
        tables = {rid: self.pages.table(rid) for rid in set(rids)}
        pages = torch.tensor([tables[r][p // self.block_size] for r, p in zip(rids, positions)], device=self.device)
        offsets = torch.tensor([p % self.block_size for p in positions], device=self.device)
        write_tokens(self.k[layer], self.v[layer], pages, offsets, k, v)

    def update_digest(self, layer: int, page_ids: list[int]) -> None:
        """Digests of the pages that just filled (quest mode keeps digests of its device-full layers)."""
        if not self.digest_min or not page_ids:
            return
        index = torch.tensor(page_ids, dtype=torch.int32, device=self.device)
        means = layer in self.value_summary
        kernels.update_digests(self.k[layer], index, self.digest_min[layer], self.digest_max[layer],
                               v_cache=self.v[layer] if means else None, value_summary=self.value_summary.get(layer))

    def release(self, rid: int, slot: int) -> None:
        self.tables.release(rid, slot)


class OffloadedStore:
    """Host store of full blocks plus device digests, window and resident buffer."""

    def __init__(self, layers, *, num_host_pages: int, max_requests: int, max_blocks: int, shape: ModelShape,
                 block_size: int, sink_blocks: int, local_blocks: int, resident_blocks: int, dtype, device,
                 borrowed: BorrowedHostStore | None = None, assigned_pages: bool = False, selection_runs: bool = False,
                 recall_brake: bool = False, value_summaries: bool = False, resident_pool: int | None = None,
                 resident_row_limit: int | None = None):
        self.layers = tuple(layers)
        self.block_size = block_size
        self.sink_blocks = sink_blocks
        self.local_blocks = local_blocks
        self.resident_blocks = resident_blocks
        self.window_width = sink_blocks + local_blocks + 1  # W: sink, local ring and the tail
        # Resident-first serving (resident_pool.py): a row as wide as a request's blocks outside its window, its
        # pages from one pool of `resident_pool` pages at the start of the device store; else resident_blocks
        # pages per slot, allocated with its window.
        pooled = resident_pool is not None
        # (The widest a row can be where the resident stage is Triton's: resident_row_limit.)
        self.resident_width = max(resident_blocks, max_blocks - sink_blocks - local_blocks) if pooled \
            else resident_blocks
        if pooled and resident_row_limit is not None:
            self.resident_width = min(self.resident_width, max(resident_blocks, resident_row_limit))
        self.pages_per_request = self.window_width + (0 if pooled else resident_blocks)
        self.device = device
        num_kv_heads, head_dim = shape.num_kv_heads, shape.head_dim
        self.borrowed = borrowed is not None
        self.assigned = self.borrowed or assigned_pages  # the pool's owner assigns each block's host page
        if borrowed is None:
            self.host_scratch_page = num_host_pages
            host_shape = (num_host_pages + 1, num_kv_heads, block_size, head_dim)
            # On 2 MiB pages where the OS allows (fewer TLB misses on a store of many GiB); on CUDA page-locked in
            # place, so copies to the GPU are async and its kernels read it (host_memory.py). Logged once.
            allocated = {(name, layer): alloc_store_tensor(host_shape, dtype, device=device)
                         for name in ("k", "v") for layer in self.layers}
            self.host_k = {layer: allocated["k", layer][0] for layer in self.layers}
            self.host_v = {layer: allocated["v", layer][0] for layer in self.layers}
            self.host_buffers = [buffer for _, buffer in allocated.values()]
            self.host_tables = AssignedPageTable(num_host_pages, max_requests, max_blocks, name="host KV pages",
                                                 scratch_page=num_host_pages) if assigned_pages else \
                SlotPageTable(num_host_pages, max_requests, max_blocks, name="host KV pages")
        else:
            check_borrowed(borrowed, self.layers, (num_kv_heads, block_size, head_dim), dtype)
            self.host_scratch_page = borrowed.scratch_page
            self.host_k = {layer: borrowed.k[layer] for layer in self.layers}
            self.host_v = {layer: borrowed.v[layer] for layer in self.layers}
            num_borrowed = next(iter(self.host_k.values())).shape[0] if self.layers else 1
            if num_borrowed > num_host_pages + 1:  # digests have a row per host page
                raise ValueError(f"the borrowed host store has {num_borrowed} pages, more than the {num_host_pages} "
                                 "(and a scratch page) this engine was sized for (total_pages)")
            self.host_tables = AssignedPageTable(num_borrowed, max_requests, max_blocks, name="borrowed host KV pages")
            self.host_buffers = buffers_of([*self.host_k.values(), *self.host_v.values()], device)
        self.host_pages_survey = PageSurvey(self.host_buffers)
        digest_shape = (num_host_pages + 1, num_kv_heads, head_dim)
        self.digest_min = {layer: torch.zeros(digest_shape, dtype=dtype, device=device) for layer in self.layers}
        self.digest_max = {layer: torch.zeros(digest_shape, dtype=dtype, device=device) for layer in self.layers}
        # The estimate of the unattended blocks (kernels/estimate.py): three more vectors per block and KV head.
        summary_shape = (num_host_pages + 1, num_kv_heads, VALUE_SUMMARY_ROWS, head_dim)
        self.value_summary = {layer: torch.zeros(summary_shape, dtype=dtype, device=device)
                              for layer in (self.layers if value_summaries else ())}
        num_device_pages = max_requests * self.pages_per_request + (resident_pool or 0)
        self.device_scratch_page = num_device_pages
        device_shape = (num_device_pages + 1, num_kv_heads, block_size, head_dim)
        self.dev_k = {layer: torch.zeros(device_shape, dtype=dtype, device=device) for layer in self.layers}
        self.dev_v = {layer: torch.zeros(device_shape, dtype=dtype, device=device) for layer in self.layers}
        self.host_pages = self.host_tables.pages
        self.device_pages = PageAllocator(num_device_pages, name="device window/resident pages")
        self.pool = None
        if pooled:  # its pages come first, held by the pool for good; windows are allocated after them
            from scout_sglang.core.resident_pool import ResidentPool

            self.device_pages.allocate(POOL_OWNER, resident_pool)
            self.pool = ResidentPool(resident_pool, first_page=0, max_requests=max_requests,
                                     width=self.resident_width, floor=resident_blocks)
        # Device pages of each slot's window (sink, ring) and resident slots, set at admission (pooled: by quota).
        self.window_page_table = torch.full((max_requests, self.window_width), PAD_BLOCK, dtype=torch.int32)
        self.resident_page_table = self.pool.table if pooled else \
            torch.full((max_requests, resident_blocks), PAD_BLOCK, dtype=torch.int32)
        # Per request slot, and one more: the padding slot of a step's padding rows (a captured graph's batch
        # size past its requests), whose row stays empty.
        self.padding_slot = max_requests
        self.resident_map = {
            layer: torch.full((max_requests + 1, num_kv_heads, self.resident_width), PAD_BLOCK, dtype=torch.int32,
                              device=device)
            for layer in self.layers
        }
        # 1 once a (slot, KV head) row has had its first fill: one word per row, so each program owns its own.
        self.resident_ready = {layer: torch.zeros(max_requests + 1, num_kv_heads, dtype=torch.int8, device=device)
                               for layer in self.layers}
        # Recall's brake (kernels.recall_brake), per (slot, KV head) row: each block's run of selections, and the
        # row's back-off state.
        self.recall_runs = {layer: new_runs(max_requests + 1, num_kv_heads, max_blocks, device)
                            for layer in (self.layers if selection_runs else ())}
        self.recall_state = {layer: new_state(max_requests + 1, num_kv_heads, self.resident_width, device)
                             for layer in (self.layers if recall_brake else ())}

    # -- per-request pages -------------------------------------------------
    def admit(self, rid: int, slot: int) -> None:
        pages = self.device_pages.allocate(rid, self.pages_per_request)
        self.window_page_table[slot] = torch.tensor(pages[: self.window_width], dtype=torch.int32)
        if self.pool is None:
            self.resident_page_table[slot] = torch.tensor(pages[self.window_width:], dtype=torch.int32)
        for layer in self.layers:
            self.resident_map[layer][slot] = PAD_BLOCK
            self.resident_ready[layer][slot] = 0
        self.reset_recall_rows(slot)

    def reset_recall_rows(self, slot: int) -> None:
        """The slot's selection runs and recall brake as a new request's: nothing selected, free to recall."""
        for runs in self.recall_runs.values():
            runs[slot] = NO_RUN
        for state in self.recall_state.values():
            state[slot] = 0

    def release(self, rid: int, slot: int) -> None:
        self.host_tables.release(rid, slot)
        self.device_pages.release(rid)
        if self.pool is not None:
            self.pool.release(rid, slot)
            self.pool.exact.pop(rid, None)

    def ensure_full_blocks(self, rid: int, slot: int, num_full: int) -> None:
        self.host_tables.ensure(rid, slot, num_full)

    def assign_host_pages(self, rid: int, slot: int, first_block: int, pages: list[int]) -> None:
        """The assigned pages of blocks first_block, first_block + 1, ... of `rid`."""
        if not self.assigned:
            raise RuntimeError("host pages are assigned only when the pool's owner allocates them; this engine "
                               "allocates its own")
        self.host_tables.assign(rid, slot, first_block, pages)

    def window_page(self, rid: int, block: int) -> int:
        """Device page of a sink, local or tail block."""
        pages = self.device_pages.table(rid)
        if block < self.sink_blocks:
            return pages[block]
        return pages[self.sink_blocks + (block - self.sink_blocks) % (self.local_blocks + 1)]

    def resident_page(self, rid: int, slot_index: int) -> int:
        if self.pool is not None:  # a shared prefix's pages first (pool_sharing.py), then its own
            return self.pool.first_page + (self.pool.shared_pages.get(rid, []) + self.pool.page_list(rid))[slot_index]
        return self.device_pages.table(rid)[self.window_width + slot_index]

    def window_blocks(self, num_tokens: int) -> list[int]:
        """Logical blocks held in the window for a request of `num_tokens`, ascending (the decode step's
        window_geometry, for one request)."""
        blocks, _, valid = window_geometry(torch.tensor([num_tokens]), block_size=self.block_size,
                                           sink_blocks=self.sink_blocks, local_blocks=self.local_blocks)
        return blocks[valid].tolist()

    def forced_blocks(self, num_tokens: int) -> list[int]:
        """Full blocks that the window always holds (sink + local): never resident, never CPU."""
        num_full = num_tokens // self.block_size
        return [j for j in self.window_blocks(num_tokens) if j < num_full]

    # -- data movement outside the decode step (prefill, chunk staging) -----------
    def write_window(self, layer: int, rids: list[int], positions: list[int], k: torch.Tensor, v: torch.Tensor) -> None:
        """Write token i (k[i], v[i] of [N, Hkv, D]) of request rids[i] at positions[i] into its window page."""
        pages = torch.tensor([self.window_page(r, p // self.block_size) for r, p in zip(rids, positions)],
                             device=self.device)
        offsets = torch.tensor([p % self.block_size for p in positions], device=self.device)
        write_tokens(self.dev_k[layer], self.dev_v[layer], pages, offsets, k, v)

    def fill_window_from_host(self, layer: int, rid: int, num_tokens: int) -> None:
        """Copy the full blocks the window of a request of `num_tokens` tokens holds from its host pages (an
        adopted prefix: whole blocks, nothing in the tail)."""
        blocks = [j for j in self.window_blocks(num_tokens) if j < num_tokens // self.block_size]
        if not blocks:
            return
        table = self.host_pages.table(rid)
        window = torch.tensor([self.window_page(rid, j) for j in blocks], device=self.device)
        self.load_from_host(layer, [table[j] for j in blocks], window)

    def load_from_host(self, layer: int, host: list[int], into: torch.Tensor) -> None:
        """Device pages `into` ([n] on the device) take host pages `host` (n of them), one copy per run of
        consecutive host pages: page-locked slices on a GPU, no bounce buffer and no gather on the host."""
        for first, count in consecutive_runs(host):
            pages = into[first:first + count]
            self.dev_k[layer][pages] = self.host_k[layer][host[first]:host[first] + count].to(self.device,
                                                                                              non_blocking=True)
            self.dev_v[layer][pages] = self.host_v[layer][host[first]:host[first] + count].to(self.device,
                                                                                              non_blocking=True)

    def copy_blocks_to_host(self, layer: int, rid: int, blocks: list[int], k_blocks: torch.Tensor,
                            v_blocks: torch.Tensor) -> None:
        """Host copy of full blocks; k_blocks/v_blocks [n, Hkv, S, D] on the device."""
        table = self.host_pages.table(rid)
        pages = [table[j] for j in blocks]
        # One copy per run of consecutive host pages, straight into the store (page-locked on a GPU: a DMA at the
        # link's rate, no pageable bounce buffer and no scatter on the host thread, which had held a 64k prompt's
        # prefill to 0.4 GB/s): queued without a wait each, then one wait, since CPU threads read the store next.
        k_blocks, v_blocks = k_blocks.contiguous(), v_blocks.contiguous()  # once, not per run
        for first, count in consecutive_runs(pages):
            page = pages[first]
            self.host_k[layer][page:page + count].copy_(k_blocks[first:first + count], non_blocking=True)
            self.host_v[layer][page:page + count].copy_(v_blocks[first:first + count], non_blocking=True)
        wait_for_device(self.device)

    def write_digests(self, layer: int, rid: int, blocks: list[int], k_blocks: torch.Tensor,
                      v_blocks: torch.Tensor) -> None:
        """Digests of full blocks (k_blocks, v_blocks [n, Hkv, S, D] on the device), in the rows of their host pages:
        min and max of K, and the value summary where the store keeps it."""
        table = self.host_pages.table(rid)
        rows = torch.tensor([table[j] for j in blocks], dtype=torch.int32, device=self.device)
        dtype, means = self.digest_min[layer].dtype, layer in self.value_summary
        kernels.digest_blocks(k_blocks.to(dtype).contiguous(), rows, self.digest_min[layer], self.digest_max[layer],
                              v_blocks=v_blocks.to(dtype).contiguous() if means else None,
                              value_summary=self.value_summary.get(layer))

    def host_bytes_owned(self) -> int:
        """Host bytes this store allocated (none when borrowed)."""
        return 0 if self.borrowed else sum(t.numel() * t.element_size()
                                           for store in (self.host_k, self.host_v) for t in store.values())

    def close(self) -> None:
        """Unregister the page-locked host store this store allocated (its memory stays until the store is
        dropped): after the device's queued copies, which may still read it. Nothing calls CUDA on a CPU device."""
        own = [] if self.borrowed else [buffer for buffer in self.host_buffers if buffer.registered]
        if own:
            wait_for_device(self.device)
        for buffer in own:
            buffer.unregister()

    def block_bytes_per_head(self, layer: int) -> int:
        k = self.host_k[layer]
        return 2 * k.shape[2] * k.shape[3] * k.element_size()


def check_borrowed(borrowed: BorrowedHostStore, layers, page_shape: tuple[int, int, int], dtype) -> None:
    """A borrowed store has a contiguous [P, Hkv, S, D] tensor of the engine's dtype for K and V of each layer."""
    for layer in layers:
        for name, store in (("k", borrowed.k), ("v", borrowed.v)):
            t = store.get(layer)
            if t is None:
                raise ValueError(f"the borrowed host store has no {name} pages for offloaded layer {layer}")
            if t.dim() != 4 or tuple(t.shape[1:]) != page_shape or t.dtype != dtype or not t.is_contiguous():
                raise ValueError(f"the borrowed host store's {name} pages of layer {layer} are {tuple(t.shape)} "
                                 f"{t.dtype}{'' if t.is_contiguous() else ' (not contiguous)'}; the engine needs "
                                 f"contiguous [pages, {', '.join(map(str, page_shape))}] {dtype}")
