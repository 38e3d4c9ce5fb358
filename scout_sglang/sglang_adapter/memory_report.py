"""Where the K/V bytes are: the plan checked before the engine exists, the start-up
comparison with full attention, and the live usage.

Device bytes are what the engine allocates on the device, in three parts, plus
SGLang's own pool when it lives on the device:
  digests              min/max of K for every full block of the logical capacity
                       (offloaded layers; quest's device-full layers too), and
                       its value summary with the estimate on (SCOUT_ESTIMATE)
  window_and_resident  per request slot and offloaded layer: sink, last full
                       blocks, the partial tail and the resident buffer
  dense_layer          layers that keep every token on the device (dense_layers,
                       or every layer in modes full and quest), for the whole
                       logical capacity
Host bytes are the engine's host store (offloaded layers) plus the arrival pool
of a PD decode instance; when the arrival pool's pages are blocks (page size =
block size) the engine borrows them as its store, and the pool is the one copy.
"""

from __future__ import annotations

from scout_sglang.core.engine import CPU_MODES, RESIDENT_MODES
from scout_sglang.core.stores import ceil_div
from scout_sglang.cpu_worker.host_memory import page_text
from scout_sglang.layout import VALUE_SUMMARY_ROWS

MIB = 2**20
GIB = 2**30
DEVICE_PARTS = ("digest_bytes_allocated", "window_and_resident_bytes_allocated", "dense_layer_bytes_allocated")


def size_text(num_bytes: float) -> str:
    """Bytes for a log line: GiB from 1 GiB, else MiB."""
    return f"{num_bytes / GIB:.2f} GiB" if num_bytes >= GIB else f"{num_bytes / MIB:.1f} MiB"


def digest_vectors(config) -> int:
    """Vectors of D elements the device keeps per full block and KV head where it keeps digests: min and max of K,
    and the value summary (mean value, slope, axis) when the estimate of the unattended blocks is on (every sparse
    mode)."""
    return 2 + VALUE_SUMMARY_ROWS if config.estimate and config.mode != "full" else 2


def engine_total_pages(logical_tokens: int, block_size: int, slots: int) -> int:
    """Pages of the engine's stores for a logical capacity: its full blocks plus a partial block per request slot."""
    return ceil_div(logical_tokens, block_size) + slots


def layer_split(config, num_layers: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(offloaded layers, layers that keep every token on the device), as CoAttentionEngine splits them."""
    offloads = config.mode in RESIDENT_MODES + CPU_MODES
    offloaded = tuple(l for l in range(num_layers) if offloads and l not in config.dense_layers)
    return offloaded, tuple(l for l in range(num_layers) if l not in offloaded)


def planned_bytes(config, *, num_layers: int, num_kv_heads: int, head_dim: int, itemsize: int, total_pages: int,
                  slots: int, borrowed_host: bool = False) -> dict:
    """What CoAttentionEngine(config, ...) allocates for `total_pages` pages and `slots` requests, before it is
    built: the start-up checks need it while SGLang sizes its pools. Equal to device_parts() and the host
    store of the built engine (tested). borrowed_host: the engine keeps its blocks in a borrowed host store
    (the arrival pool) and allocates none."""
    offloaded, full = layer_split(config, num_layers)
    block = config.block_size
    page = 2 * num_kv_heads * block * head_dim * itemsize  # K and V of one block
    digest_row = digest_vectors(config) * num_kv_heads * head_dim * itemsize  # min, max (and value summary) of a block
    resident = config.resident_capacity if config.mode in RESIDENT_MODES else 0
    # resident-first (core/resident_pool.py): one pool instead of a buffer per slot; by default as many pages
    resident_pages = slots * resident
    if config.resident_first and config.resident_pool_blocks is not None and offloaded:
        resident_pages = config.resident_pool_blocks
    # Every store has one scratch page for the decode step's fixed-shape writes (core/stores.py).
    pages = total_pages + 1
    window_pages = slots * (config.sink_blocks + config.local_blocks + 1) + resident_pages + 1
    quest_digests = len(full) * pages * digest_row if config.mode == "quest" else 0
    parts = {
        "digest_bytes_allocated": len(offloaded) * pages * digest_row + quest_digests,
        "window_and_resident_bytes_allocated": len(offloaded) * window_pages * page,
        "dense_layer_bytes_allocated": len(full) * pages * page,
    }
    return {**parts, "device_bytes_allocated": sum(parts.values()),
            "host_bytes_allocated": 0 if borrowed_host else len(offloaded) * pages * page, "dense_layers": list(full)}


def resident_pool_size(config, *, num_layers: int, num_kv_heads: int, head_dim: int, itemsize: int,
                       total_pages: int, slots: int, kv_budget_bytes: int) -> dict | None:
    """Resident-first (core/resident_pool.py) without SCOUT_RESIDENT_POOL_BLOCKS: the pool takes the device memory a
    stock server would give its KV cache (`kv_budget_bytes`, SGLang's own profile of it), less the engine's other
    device stores (digests, windows, dense layers), in pages of one block of every offloaded layer. At least the
    floor (resident_blocks per request slot: what the engine holds without the pool), at most every block of the
    logical capacity (`total_pages`: a larger pool is never used). None where resident-first is off.

    -> pages, page_bytes, bytes, stock_kv_bytes, other_device_bytes, floor, ceiling, limit (what set the size)"""
    offloaded, _ = layer_split(config, num_layers)
    if not (config.resident_first and offloaded):
        return None
    page_bytes = len(offloaded) * 2 * num_kv_heads * config.block_size * head_dim * itemsize
    others = planned_bytes(config.replace(resident_pool_blocks=0), num_layers=num_layers, num_kv_heads=num_kv_heads,
                           head_dim=head_dim, itemsize=itemsize, total_pages=total_pages,
                           slots=slots)["device_bytes_allocated"]
    floor = slots * config.resident_capacity
    ceiling = max(floor, total_pages)
    fitting = max(0, kv_budget_bytes - others) // page_bytes
    pages = min(max(floor, fitting), ceiling)
    limit = "the floor" if fitting <= floor else "the logical capacity" if fitting >= ceiling else \
        "the stock KV budget"
    return {"pages": pages, "page_bytes": page_bytes, "bytes": pages * page_bytes, "stock_kv_bytes": kv_budget_bytes,
            "other_device_bytes": others, "floor": floor, "ceiling": ceiling, "limit": limit}


def resident_pool_text(sizing: dict) -> str:
    """One line of the start-up log and the planner: the pool and what set its size."""
    return (f"resident-first pool: {sizing['pages']} pages ({size_text(sizing['bytes'])}), set by {sizing['limit']} "
            f"(stock KV budget {size_text(sizing['stock_kv_bytes'])}, less {size_text(sizing['other_device_bytes'])} "
            f"of scout's other device stores; floor {sizing['floor']}, ceiling {sizing['ceiling']} pages)")


def device_parts(engine) -> dict:
    """Device bytes the built engine allocated, by part (they add up to engine.memory()'s device bytes)."""
    full, off = engine.full_store, engine.offloaded
    return {
        "digest_bytes_allocated": _nbytes(off.digest_min, off.digest_max, off.value_summary, full.digest_min,
                                          full.digest_max, full.value_summary),
        "window_and_resident_bytes_allocated": _nbytes(off.dev_k, off.dev_v),
        "dense_layer_bytes_allocated": _nbytes(full.k, full.v),
    }


def _pool_bytes(pool) -> int:
    buffers = list(getattr(pool, "k_buffer", None) or []) + list(getattr(pool, "v_buffer", None) or [])
    return sum(b.numel() * b.element_size() for b in buffers)


def _nbytes(*stores: dict) -> int:
    return sum(t.numel() * t.element_size() for store in stores for t in store.values())


def sglang_pool_bytes(pool, layout: str) -> dict:
    """SGLang's own pool: {"device": bytes, "host": bytes}."""
    size = _pool_bytes(pool)
    return {"device": 0, "host": size} if layout == "arrival" else {"device": size, "host": 0}


def token_bytes_per_layer(engine) -> int:
    """K and V of one token in one layer."""
    return 2 * engine.shape.num_kv_heads * engine.shape.head_dim * engine.dtype.itemsize


def per_request_bytes(engine, context: int) -> dict:
    """Device bytes one request of `context` tokens needs, per layer of each kind and over all layers,
    next to full attention."""
    return request_device_bytes(engine.config, num_layers=engine.shape.num_layers,
                                num_kv_heads=engine.shape.num_kv_heads, head_dim=engine.shape.head_dim,
                                itemsize=engine.dtype.itemsize, context=context)


def request_device_bytes(config, *, num_layers: int, num_kv_heads: int, head_dim: int, itemsize: int,
                         context: int) -> dict:
    """per_request_bytes() of the engine CoAttentionEngine(config, ...) would build, before it is built (the
    planner needs it for models it never loads). Equal to per_request_bytes of the built engine (tested)."""
    offloaded, full = layer_split(config, num_layers)
    block = config.block_size
    token = 2 * num_kv_heads * head_dim * itemsize  # K and V of one token in one layer
    blocks = ceil_div(context, block)
    digests = blocks * digest_vectors(config) * num_kv_heads * head_dim * itemsize  # min and max of K (value summary)
    dense = blocks * block * token + (digests if config.mode == "quest" else 0)
    resident = config.resident_capacity if config.mode in RESIDENT_MODES else 0
    pages_per_request = config.sink_blocks + config.local_blocks + 1 + resident  # as OffloadedStore sizes them
    window = pages_per_request * block * token if offloaded else 0
    per_offloaded = {"window_and_resident": window, "digests": digests, "device": window + digests}
    return {"context": context, "offloaded_layers": len(offloaded), "dense_layers": len(full),
            "offloaded_layer": per_offloaded if offloaded else None, "dense_layer": dense if full else None,
            "device": len(offloaded) * per_offloaded["device"] + len(full) * dense,
            "full_attention": context * token * num_layers}


def startup_message(engine, layout: str, logical_tokens: int, context: int, sglang_pool: dict, slots: int) -> str:
    per = per_request_bytes(engine, context)
    memory, parts = engine.memory(), device_parts(engine)
    device = memory["device_bytes_allocated"] + sglang_pool["device"]
    full = logical_tokens * token_bytes_per_layer(engine) * engine.shape.num_layers
    kinds = []
    if per["offloaded_layer"]:
        off = per["offloaded_layer"]
        kinds.append(f"{off['device'] / 1024:.1f} KiB in each of {per['offloaded_layers']} offloaded layers "
                     f"({off['window_and_resident'] / 1024:.1f} KiB window + resident, {off['digests'] / 1024:.1f} "
                     "KiB digests)")
    if per["dense_layer"]:
        kinds.append(f"{per['dense_layer'] / 1024:.1f} KiB in each of {per['dense_layers']} dense layers "
                     f"{list(engine.full_layers)} (every token)")
    return (f"scout memory ({layout} KV pool): a {context}-token request needs {per['device'] / MIB:.2f} MiB of "
            f"device memory over its {engine.shape.num_layers} layers: {'; '.join(kinds)}; full attention needs "
            f"{per['full_attention'] / MIB:.2f} MiB ({per['full_attention'] / max(1, per['device']):.1f}x). Device "
            f"K/V allocated: {size_text(device)} for {slots} request slots and {logical_tokens} tokens "
            f"({size_text(parts['dense_layer_bytes_allocated'])} dense layers, "
            f"{size_text(parts['digest_bytes_allocated'])} digests, "
            f"{size_text(parts['window_and_resident_bytes_allocated'])} windows and resident buffers, "
            f"{size_text(sglang_pool['device'])} SGLang's pool; full attention: {size_text(full)}); host K/V: "
            f"{size_text(memory['host_bytes_allocated'] + sglang_pool['host'])}{host_pages_text(engine)}")


def host_pages_text(engine) -> str:
    """The host store's page kind and share on 2 MiB pages, for the start-up message (measured now)."""
    pages = engine.host_store_pages(max_age_s=0.0)
    if not pages["bytes"]:
        return ""
    return f"; host store pages: {page_text(pages)} (transparent huge pages: {pages['thp']})"


def usage(engine, layout: str, pool, slots: int | None = None, pool_pages_used: int | None = None) -> dict:
    """Live usage in tokens and bytes (the "memory" entry of the statistics and the metrics); `slots`: the
    engine's request slots; `pool_pages_used`: under the radix cache, the pages SGLang's allocator has given
    out (those no running request holds are the radix tree's cache)."""
    memory, sglang = engine.memory(), sglang_pool_bytes(pool, layout)
    page, held = memory["host_page_bytes"], engine.offloaded.host_pages.num_used if engine.offloaded_layers else 0
    block = engine.block_size
    tokens = memory["tokens"]
    return {
        "layout": layout,
        "tokens": tokens,
        "request_slots": slots,
        # What the stores are sized for: the logical capacity plus a partial block per request slot. Digests
        # cover these token slots in every offloaded layer, and each dense layer holds K and V for all of them.
        "token_slots": engine.full_store.pages.num_pages * block,
        "device_token_slots_used": (engine.offloaded.device_pages.num_used + engine.full_store.pages.num_used) * block,
        "device_bytes_used": memory["device_bytes_used"] + sglang["device"],
        "device_bytes_allocated": memory["device_bytes_allocated"] + sglang["device"],
        **device_parts(engine),  # the engine's part of device_bytes_allocated, by what it holds
        "sglang_pool_device_bytes": sglang["device"],
        "dense_layers": list(engine.full_layers),
        "host_bytes_used": memory["host_bytes_used"],
        "host_bytes_shared": memory["host_bytes_shared"],
        "host_page_bytes": page,  # one block of every offloaded layer
        "host_bytes_private": memory["host_bytes_used"] - memory["host_bytes_shared"],
        "host_bytes_cached": max(0, pool_pages_used - held) * page
        if pool_pages_used is not None and engine.offloaded_layers else 0,
        "host_bytes_allocated": memory["host_bytes_allocated"] + sglang["host"],
        "full_attention_bytes": tokens * token_bytes_per_layer(engine) * engine.shape.num_layers,
        "token_bytes": token_bytes_per_layer(engine) * engine.shape.num_layers,  # K and V of a token, all layers
    }
