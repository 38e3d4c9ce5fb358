"""Capacity: device and host bytes of a server's K/V, and how many requests of a length it decodes together.

The scout modes are counted by the plugin's own planning code
(sglang_adapter.memory_report.planned_bytes and request_device_bytes, the same
functions the server's start-up log and start-up checks call, and
kv_pool.placeholder_tokens for SGLang's pools beside the engine). Stock
SGLang ("full") holds every token of every layer in its device pool.

Sizes, for a request of T = input + output tokens (all of them held at its
last step), B requests together, block size S:
  stock:  device = (tokens + page) x token bytes, tokens >= B x T
  scout:  logical capacity L = B x T held on the host; device = the engine's
          planned bytes for ceil(L / S) + B pages and B request slots, plus
          SGLang's placeholder pool (2 tokens per slot, plus a page)
With a prompt prefix of P tokens that every request shares (the radix cache;
scout matches it in whole blocks, so P rounds down to a multiple of S) the
prefix is held once: B x T becomes P + B x (T - P), in either pool.
"""

from __future__ import annotations

from dataclasses import dataclass

from scout_sglang.config import ScoutConfig
from scout_sglang.plan.models import ModelSpec
from scout_sglang.sglang_adapter.kv_pool import placeholder_tokens
from scout_sglang.sglang_adapter.memory_report import (engine_total_pages, planned_bytes, request_device_bytes,
                                                       resident_pool_size)

STOCK = "full"  # the baseline: SGLang's own backend and device pool


def token_bytes(spec: ModelSpec, itemsize: int) -> int:
    """K and V of one token over all layers (Qwen3-14B in bf16: 40 x 8 x 128 x 2 x 2 = 160 KiB)."""
    return spec.num_layers * 2 * spec.num_kv_heads * spec.head_dim * itemsize


def engine_device_bytes(config: ScoutConfig, spec: ModelSpec, *, itemsize: int, logical_tokens: int, slots: int,
                        page_size: int = 1) -> dict:
    """What a scout server started with --max-total-tokens `logical_tokens` and --max-running-requests `slots`
    allocates: planned_bytes() of its engine (device parts, host store) plus SGLang's placeholder pool on the
    device (`sglang_pool_device_bytes`, counted in `device_bytes_allocated` as /server_info counts it)."""
    plan = planned_bytes(config, num_layers=spec.num_layers, num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                         itemsize=itemsize, total_pages=engine_total_pages(logical_tokens, config.block_size, slots),
                         slots=slots)
    pool = (placeholder_tokens(slots, page_size) + page_size) * token_bytes(spec, itemsize)
    return {**plan, "sglang_pool_device_bytes": pool, "device_bytes_allocated": plan["device_bytes_allocated"] + pool,
            "logical_tokens": logical_tokens, "request_slots": slots}


def stock_device_bytes(spec: ModelSpec, *, itemsize: int, tokens: int, page_size: int = 1) -> int:
    """SGLang's own device pool of `tokens` token slots (plus its padding page)."""
    return (tokens + page_size) * token_bytes(spec, itemsize)


@dataclass(frozen=True)
class Capacity:
    """How many requests of `request_tokens` tokens one server holds together, and what that costs.

    Parameters
    ----------
    mode : str
    max_batch : int
        Requests of `request_tokens` held together (0: not even one fits).
    request_tokens : int
    device_bytes, host_bytes : int
        K/V bytes allocated at that batch (device: engine + SGLang's pools; host: the engine's store).
    per_request : dict
        request_device_bytes() of one request (scout modes), or the stock bytes.
    limit : str
        What stopped the batch from growing: "device memory", "host memory" or "max running requests".
    """

    mode: str
    max_batch: int
    request_tokens: int
    device_bytes: int
    host_bytes: int
    per_request: dict
    limit: str


def held_tokens(batch: int, request_tokens: int, shared_prefix: int, block_size: int) -> int:
    """Tokens a pool holds for `batch` requests of `request_tokens` tokens whose first `shared_prefix` tokens are
    one prompt prefix (stored once, in whole blocks)."""
    shared = min(shared_prefix, request_tokens) // block_size * block_size
    return shared * (batch > 0) + batch * (request_tokens - shared)


def max_batch(config: ScoutConfig, spec: ModelSpec, *, itemsize: int, request_tokens: int, device_budget: int,
              host_budget: int, page_size: int = 1, max_requests: int | None = None,
              shared_prefix: int = 0) -> Capacity:
    """The largest batch of requests of `request_tokens` tokens whose K/V fits `device_budget` device bytes and
    `host_budget` host bytes, in config.mode ("full": the stock pool). Each request gets a request slot and
    its tokens in the logical capacity, as a server started with exactly these settings would; the first
    `shared_prefix` tokens of every request are one cached prefix, held once."""
    if request_tokens < 1:
        raise ValueError(f"request_tokens must be >= 1, got {request_tokens}")
    if shared_prefix < 0:
        raise ValueError(f"shared_prefix must be >= 0, got {shared_prefix}")
    mode = config.mode

    def sizes(batch: int) -> tuple[int, int]:
        tokens = held_tokens(batch, request_tokens, shared_prefix, config.block_size)
        if mode == STOCK:
            return stock_device_bytes(spec, itemsize=itemsize, tokens=tokens, page_size=page_size), 0
        plan = engine_device_bytes(config, spec, itemsize=itemsize, logical_tokens=tokens,
                                   slots=max(1, batch), page_size=page_size)
        return plan["device_bytes_allocated"], plan["host_bytes_allocated"]

    def fits(batch: int) -> bool:
        device, host = sizes(batch)
        return device <= device_budget and host <= host_budget

    cap = max_requests if max_requests is not None else float("inf")
    high = 1
    while high <= cap and fits(high):
        high *= 2
    high = int(min(high, cap + 1))  # does not fit, or is one past the request slots
    low = 0
    while high - low > 1:  # sizes grow with the batch: bisect for the last that fits
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    if low == cap:
        limit = "max running requests"
    else:
        limit = "device memory" if sizes(low + 1)[0] > device_budget else "host memory"
    device, host = sizes(low)
    return Capacity(mode, low, request_tokens, device, host, request_bytes(config, spec, itemsize=itemsize,
                                                                          request_tokens=request_tokens), limit)


def request_bytes(config: ScoutConfig, spec: ModelSpec, *, itemsize: int, request_tokens: int) -> dict:
    """Device bytes of one request: request_device_bytes() for the engine's modes, every token for stock."""
    if config.mode == STOCK:
        full = request_tokens * token_bytes(spec, itemsize)
        return {"context": request_tokens, "device": full, "full_attention": full}
    return request_device_bytes(config, num_layers=spec.num_layers, num_kv_heads=spec.num_kv_heads,
                                head_dim=spec.head_dim, itemsize=itemsize, context=request_tokens)


def server_batch(config: ScoutConfig, spec: ModelSpec, *, itemsize: int, request_tokens: int, max_total_tokens: int,
                 max_running_requests: int, page_size: int = 1) -> Capacity:
    """What a server started with these settings admits: requests of `request_tokens` tokens decoded together
    (SGLang admits while the token capacity holds every running request's tokens, up to the request slots), and
    the bytes it allocates. The form the planner is checked in against a real server."""
    tokens = max_total_tokens // page_size * page_size
    batch = min(max_running_requests, tokens // request_tokens)
    limit = "max running requests" if batch == max_running_requests else "token capacity"
    per = request_bytes(config, spec, itemsize=itemsize, request_tokens=request_tokens)
    if config.mode == STOCK:
        device = stock_device_bytes(spec, itemsize=itemsize, tokens=tokens, page_size=page_size)
        return Capacity(STOCK, batch, request_tokens, device, 0, per, limit)
    plan = engine_device_bytes(config, spec, itemsize=itemsize, logical_tokens=tokens, slots=max_running_requests,
                               page_size=page_size)
    return Capacity(config.mode, batch, request_tokens, plan["device_bytes_allocated"], plan["host_bytes_allocated"],
                    per, limit)


def resident_pool(config: ScoutConfig, spec: ModelSpec, *, itemsize: int, capacity: Capacity, device_budget: int,
                  shared_prefix: int = 0, page_size: int = 1) -> dict | None:
    """Resident-first (SCOUT_RESIDENT_FIRST=on) at scout's largest batch: the pool the server sizes from the
    device budget (memory_report.resident_pool_size, less SGLang's placeholder pool, as the server sees it), and
    how many requests of this length it holds exactly together (each needs its blocks outside the window).
    None when scout holds no request."""
    batch = capacity.max_batch
    if batch < 1:
        return None
    tokens = held_tokens(batch, capacity.request_tokens, shared_prefix, config.block_size)
    placeholder = (placeholder_tokens(batch, page_size) + page_size) * token_bytes(spec, itemsize)
    sizing = resident_pool_size(config.replace(resident_first=True, resident_pool_blocks=None),
                                num_layers=spec.num_layers, num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                                itemsize=itemsize, total_pages=engine_total_pages(tokens, config.block_size, batch),
                                slots=batch, kv_budget_bytes=device_budget - placeholder)
    if sizing is None:
        return None
    outside = capacity.request_tokens // config.block_size - config.sink_blocks - config.local_blocks
    each = max(config.resident_capacity, outside)
    return {**sizing, "request_pages": each, "exact_requests": min(batch, sizing["pages"] // each)}
