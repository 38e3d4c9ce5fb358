"""Resident-first: each admitted request's quota of the pool, re-planned when the requests or their lengths change,
and what a quota's change does to the request's resident rows (core/resident_pool.py says why).

Called by the engine at admission, at each prefill chunk (its first offloaded layer) and before each step. Host
counts only; a shrinking quota's compaction is a fixed number of device ops per layer, between steps.
"""

from __future__ import annotations

from scout_sglang.core.host_copy import to_device
from scout_sglang.core.resident_pool import compact_rows
from scout_sglang.layout import PAD_BLOCK


def rebalance(engine, tokens: dict[int, int], *, dips: bool = False) -> None:
    """Resident-first: every admitted request's quota of the pool (resident_pool.py), from its blocks outside
    the window after `tokens` (rid -> tokens; the others: what they hold). Shrinking quotas first: their rows
    are compacted (the blocks of the last selection kept, best first, then the newest; a row that ran a step exact
    since its last sparse one: the newest) and their pages go back; a row that stops being exact gives up the
    shared pages of a cached prefix (pool_sharing.py), its blocks moved to pages of its own in the same copy; then
    the growing ones. A request that turns exact has its fill flags cleared, so its next fill takes every block;
    one that stops fitting before its first step starts from an empty row, as any sparse request does. dips: a
    replay's quotas before a step whose run recorded a dip (resident_pool.ResidentPool.record)."""
    pool, store = engine.pool, engine.offloaded
    needed, quotas = pool_quotas(engine, tokens, dips=dips)
    shrinking = [(rid, quota) for rid, quota in quotas.items() if quota < pool.quota(rid)]
    # Between steps a decoding request's row only loses blocks: the columns past the lowest quota it had since its
    # last step are empty, and a shrink that keeps those columns frees pages without a compaction (a quota that
    # grew and fell back before the request's next step leaves its row as it was).
    compacted = {rid for rid, quota in shrinking if quota < pool.held_columns(rid, engine.requests[rid].steps)}
    # A row pointing at shared pages that stops being exact (or is compacted: a replay's quota) moves its blocks to
    # pages of its own, in the same copy; a compacted row no longer holds its blocks in block order.
    unsharing = {rid for rid, quota in quotas.items()
                 if rid in pool.shared_pages and (quota < needed[rid] or rid in compacted)}
    for rid in compacted:
        pool.identity.pop(rid, None)
    # A row that stops fitting before its first step is emptied below: nothing of it needs moving.
    emptied = {rid for rid, quota in quotas.items() if not engine.requests[rid].steps and quota < needed[rid]}
    moving = [rid for rid in quotas if (rid in compacted or rid in unsharing) and rid not in emptied]
    slots = [engine.requests[rid].slot for rid in moving]
    before = store.resident_page_table[slots].clone() if moving else None
    for rid in unsharing:
        pool.unshare(rid, engine.requests[rid].slot, quotas[rid])
    for rid, quota in quotas.items():  # every shrink first, its pages back: the compacted rows' and the others'
        pool.shrink(rid, engine.requests[rid].slot, quota)
    for rid in unsharing:  # their first columns' pages, after every shrink freed its pages
        pool.repay(rid, engine.requests[rid].slot)
    for rid, quota in quotas.items():
        pool.grow(rid, engine.requests[rid].slot, quota)
    if moving:  # one set of ops per layer for all of them, after every page changed hands (a page one row frees
        # may be one another moves into: the copy reads every source before it writes)
        src = to_device(before, engine.device)  # page-locked snapshots: no wait for the stream
        dst = to_device(store.resident_page_table[slots], engine.device)
        # A row that ran a step exact since its last sparse one keeps its newest blocks: its last selection is
        # stale where that step ran on the exact path, which depends on its batch (a replay alone must compact it
        # alike). A row only unsharing keeps its columns' order.
        by_recency = [rid in pool.unselected for rid in moving]
        for layer in engine.offloaded_layers:
            compact_rows(store.resident_map[layer], slots, [quotas[rid] for rid in moving], src,
                         engine.previous[layer], store.dev_k[layer], store.dev_v[layer],
                         max_blocks=engine.max_blocks, brake_state=store.recall_state.get(layer), by_recency=by_recency,
                         dst_pages=dst, reordered=[rid in compacted for rid in moving])
    for rid, quota in quotas.items():
        slot = engine.requests[rid].slot
        exact = quota >= needed[rid]
        if exact != pool.exact.get(rid, False):
            pool.settled.discard(rid)
        if exact and not pool.exact.get(rid, False):
            for layer in engine.offloaded_layers:
                store.resident_ready[layer][slot] = 0
        elif not exact and pool.exact.get(rid, False):
            pool.identity.pop(rid, None)
            # Sparse again: after steps run exact, its selection runs and recall brake start afresh and its row
            # counts as filled, whatever path those steps took (the exact path fills nothing and keeps no runs).
            if rid in pool.unselected:
                store.reset_recall_rows(slot)
            started = engine.requests[rid].steps > 0
            for layer in engine.offloaded_layers:
                store.resident_ready[layer][slot] = int(started)
                if not started:  # its prefill's blocks are dropped: its first fill picks by score
                    store.resident_map[layer][slot] = PAD_BLOCK
        pool.exact[rid] = exact


def pool_quotas(engine, tokens: dict[int, int], *, dips: bool = False) -> tuple[dict[int, int], dict[int, int]]:
    """Resident-first: (rid -> blocks outside its window, rid -> quota) of every admitted request, from `tokens`
    (rid -> tokens; the others: what they hold). Reads host counts only."""
    forced = engine.config.sink_blocks + engine.config.local_blocks
    # A request whose chunk is being stored counts at its end: SGLang stores a batch's chunks layer by layer,
    # so the others of its batch are mid-chunk when one of them is rebalanced.
    needed = {rid: max(0, tokens.get(rid, max(state.num_tokens, state.filling_to)) // engine.block_size - forced)
              for rid, state in engine.requests.items()}
    quotas = engine.pool.plan(needed, {rid: state.steps for rid, state in engine.requests.items()}
                              if engine.pool.replayed else None, dips=dips)
    return needed, quotas
