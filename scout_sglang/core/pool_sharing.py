"""Resident-first: a cached prefix's resident blocks kept once on the device for every request that shares it.

SGLang's radix cache gives requests that start with the same tokens the same host pages (engine.adopt_prefix).
With resident-first (core/resident_pool.py) each exact request also holds every block outside its window in its
resident row; without this module a second request with a 30k-token shared prefix takes 30k tokens of the pool
again, and starts unsettled, its first step filling its row from the host.

Here a request that adopts a prefix points its first columns at the pages of another request's row that holds the
same blocks, when that row is exact and was written by its prefill in block order (`identity`: column c holds
block sink + c in every layer and KV head, and the request has been exact since). The pages pass to the pool's
SHARED holder, each counted once. Nothing writes them while shared:

- a shared column is in an exact row, whose held blocks a step never moves (its fill and admission take empty
  columns, its CPU list is empty, so nothing is recalled);
- prefill and admission write a row's columns past its prefix;
- a row that stops being exact gives its shared pages up first: its shared columns get pages of its own and
  their blocks move in the same device copy as any compaction (pool_rebalance.rebalance), so its row ends as it
  would have without sharing, and a replay alone at its quotas decodes as it did.

A request shares only if its quota, with the pages sharing saves it, covers its blocks at the end of the prefill
chunk it is about to store (engine.adopt_prefix's filling_to); else it would give them up at once.

A request that adopts a prefix no running row holds (the requests that wrote it have finished) copies its blocks
outside the window from its host pages into its row, in block order, when it fits: it starts settled, its first
step needs no fill, and the next request adopting the prefix shares its row.

Host work: a scan of the admitted requests' prefix pages at adoption (a prefill event), nothing per step.
"""

from __future__ import annotations

import torch

from scout_sglang.core.host_copy import to_device
from scout_sglang.core.pool_rebalance import pool_quotas, rebalance


def adopt_rows(engine, rid: int, num_tokens: int) -> None:
    """New request `rid` adopted a cached prefix of `num_tokens` tokens (its host pages and window in place): its
    quota counts the prefix, and when the prefix's blocks outside the window fit it (exact), its row holds them in
    block order, another row's pages shared where one holds them, the others copied from its host pages; it
    starts settled. Else its first fill picks its blocks by score."""
    pool, store = engine.pool, engine.offloaded
    sink = engine.config.sink_blocks
    outside = num_tokens // engine.block_size - sink - engine.config.local_blocks
    if outside <= 0:
        return
    shared = share_prefix(engine, rid, outside)
    rebalance(engine, {})
    if not pool.exact[rid]:
        pool.settled.discard(rid)
        return
    slot = engine.requests[rid].slot
    if shared < outside:
        host = store.host_pages.span(rid, sink + shared, outside - shared)
        pages = to_device(pool.table[slot, shared:outside], engine.device, torch.long)  # no wait for the stream
        for layer in engine.offloaded_layers:
            store.load_from_host(layer, host, pages)
            store.resident_map[layer][slot, :, shared:outside] = torch.arange(
                sink + shared, sink + outside, dtype=torch.int32, device=engine.device)
    pool.prefix_blocks_copied += outside - shared
    pool.identity[rid] = outside
    pool.settled.add(rid)


def share_prefix(engine, rid: int, outside: int) -> int:
    """New request `rid` adopted a cached prefix with `outside` blocks outside its window (its host pages
    assigned): point its resident row's first columns at the longest run of them that another exact row holds in
    block order, if with them it can be exact (else sharing would only be given up again). Returns the blocks
    shared (0: none)."""
    pool, store = engine.pool, engine.offloaded
    sink = engine.config.sink_blocks
    if outside > pool.width:
        return 0
    mine = store.host_pages.span(rid, sink, outside)
    best, donor = 0, None
    for other in engine.requests:
        held = min(outside, pool.identity.get(other, 0)) if other != rid and pool.exact.get(other, False) else 0
        if held <= best:
            continue
        theirs = store.host_pages.span(other, sink, held)
        run = next((c for c, (a, b) in enumerate(zip(mine, theirs)) if a != b), held)
        if run > best:
            best, donor = run, other
    # Its share of the pool as if it shared nothing, plus what sharing saves it: short of its blocks, it would not
    # be exact (a guess: the level moves with the saving; either way nothing is lost, only a copy)
    if not best:
        return 0
    needed, quotas = pool_quotas(engine, {})
    if quotas[rid] + best < needed[rid]:
        return 0
    slot = engine.requests[rid].slot
    pool.share(rid, slot, donor, best)
    blocks = torch.arange(sink, sink + best, dtype=torch.int32, device=engine.device)
    for layer in engine.offloaded_layers:
        store.resident_map[layer][slot, :, :best] = blocks
    pool.identity[rid] = best
    return best
