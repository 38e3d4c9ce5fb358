"""Where the K/V bytes are: the startup comparison with full attention and the live usage.

Device bytes are what the engine allocated on the device (digests, window and
resident pages, or the full store of dense layers) plus SGLang's own pool when
it lives on the device; host bytes are the engine's host store plus the
arrival pool of a PD decode instance.
"""

from __future__ import annotations

from scout_sglang.core.stores import ceil_div

MIB = 2**20


def _pool_bytes(pool) -> int:
    buffers = list(getattr(pool, "k_buffer", None) or []) + list(getattr(pool, "v_buffer", None) or [])
    return sum(b.numel() * b.element_size() for b in buffers)


def sglang_pool_bytes(pool, layout: str) -> dict:
    """SGLang's own pool: {"device": bytes, "host": bytes}."""
    size = _pool_bytes(pool)
    return {"device": 0, "host": size} if layout == "arrival" else {"device": size, "host": 0}


def token_bytes_per_layer(engine) -> int:
    """K and V of one token in one layer."""
    return 2 * engine.shape.num_kv_heads * engine.shape.head_dim * engine.dtype.itemsize


def per_request_layer_bytes(engine, context: int) -> dict:
    """Device bytes one request of `context` tokens needs in one offloaded layer, next to full attention."""
    token, block = token_bytes_per_layer(engine), engine.block_size
    digests = ceil_div(context, block) * token  # min and max of K: one token's K+V worth per block
    full = context * token
    if not engine.offloaded_layers:  # full / quest: every block on the device
        device = ceil_div(context, block) * block * token + (digests if engine.config.mode == "quest" else 0)
        return {"context": context, "device": device, "window_and_resident": 0, "digests": digests, "full_attention": full}
    window = engine.offloaded.pages_per_request * block * token
    return {"context": context, "device": window + digests, "window_and_resident": window, "digests": digests,
            "full_attention": full}


def startup_message(engine, layout: str, logical_tokens: int, context: int, sglang_pool: dict, slots: int) -> str:
    per = per_request_layer_bytes(engine, context)
    memory = engine.memory()
    device = memory["device_bytes_allocated"] + sglang_pool["device"]
    full = logical_tokens * token_bytes_per_layer(engine) * engine.shape.num_layers
    dense = (f"; {len(engine.full_layers)} dense layer(s) keep every token on the device"
             if engine.offloaded_layers and engine.full_layers else "")
    return (f"scout memory ({layout} KV pool): a {context}-token request needs {per['device'] / 1024:.1f} KiB of "
            f"device memory per layer ({per['window_and_resident'] / 1024:.1f} KiB window + resident, "
            f"{per['digests'] / 1024:.1f} KiB digests) where full attention needs {per['full_attention'] / 1024:.1f} "
            f"KiB ({per['full_attention'] / max(1, per['device']):.1f}x){dense}. Device K/V allocated: "
            f"{device / MIB:.1f} MiB for {slots} request slots and {logical_tokens} tokens (full attention: {full / MIB:.1f} MiB); host K/V: "
            f"{(memory['host_bytes_allocated'] + sglang_pool['host']) / MIB:.1f} MiB")


def usage(engine, layout: str, pool) -> dict:
    """Live usage in tokens and bytes (the "memory" entry of the statistics and the metrics)."""
    memory, sglang = engine.memory(), sglang_pool_bytes(pool, layout)
    block = engine.block_size
    tokens = memory["tokens"]
    return {
        "layout": layout,
        "tokens": tokens,
        "device_token_slots_used": (engine.offloaded.device_pages.num_used + engine.full_store.pages.num_used) * block,
        "device_bytes_used": memory["device_bytes_used"] + sglang["device"],
        "device_bytes_allocated": memory["device_bytes_allocated"] + sglang["device"],
        "host_bytes_used": memory["host_bytes_used"],
        "host_bytes_allocated": memory["host_bytes_allocated"] + sglang["host"],
        "full_attention_bytes": tokens * token_bytes_per_layer(engine) * engine.shape.num_layers,
        "token_bytes": token_bytes_per_layer(engine) * engine.shape.num_layers,  # K and V of a token, all layers
    }
