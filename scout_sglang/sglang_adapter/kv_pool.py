"""The scout KV pool: SGLang's scheduler sees a logical token capacity held in host memory.

SGLang learns its KV capacity only from the configure step of its KV cache
configurator. An AROUND hook on it (installed by
plugin.py) lets SGLang build its pools for a placeholder capacity, then hands
the scheduler an allocator over the logical capacity L: admission, waiting,
retraction and the "input too long" rejection all follow L, while the device
holds only what co-attention needs (the engine's digests, windows and
resident buffers, allocated by the backend).

Layouts, chosen from the server's arguments:
  logical  scout runs prefill and decode: nothing stands behind a logical id;
           each token's K/V lives in the engine (host store of full blocks,
           device window). SGLang's own pool is a placeholder of 2 tokens per
           request slot that nothing reads or writes.
  arrival  scout only decodes (the decode instance of a PD deployment, or a
           stock prefill backend on a CPU server): SGLang's pool is a host
           memory pool of L tokens, where transfers land and prefill writes.
           With --page-size equal to the block size its pages are the
           engine's host store (borrowed_host_store): at a request's first
           decode each full page is rewritten in place from SGLang's
           token-major layout to the engine's head-major one (a block of one
           KV head is then one contiguous run, which the CPU attention reads),
           and its digests are built; the one host copy of the K/V. With
           another page size the K/V is copied into the engine's own store
           (two host copies, logged).
SCOUT_KV_POOL=stock keeps SGLang's own device pool (every token on the device).
Under the radix cache (logical layout, --page-size = the block size) the
engine's stores are addressed by SGLang's page ids (prefix_pages.py), so a
cached prefix is stored once and SGLang's eviction frees its pages.

Before SGLang goes on, the engine's stores for L are planned
(memory_report.planned_bytes), logged, and checked against the free memory:
the host store of the offloaded layers, and on the device the digests, the
request windows and the dense layers, which hold every one of the L tokens.
"""

from __future__ import annotations

import logging
import os

from scout_sglang.env import PoolSettings, config_from_env, pool_settings_from_env
from scout_sglang.sglang_adapter.arrival_pages import shares_arrival_pool

logger = logging.getLogger("scout_sglang.sglang_adapter")
TARGET = "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator.configure"
DEFAULT_MAX_REQUESTS = 64  # request slots when --max-running-requests is not given
LAYOUT_ATTRIBUTE = "scout_layout"  # set on the pool SGLang keeps: "logical" or "arrival"
RESIDENT_POOL_ATTRIBUTE = "scout_resident_pool"  # resident-first: its sizing (memory_report.resident_pool_size)
GIB = 2**30


def selected_backends(server_args) -> tuple[str, str]:
    """(prefill backend, decode backend) names of a server."""
    default = server_args.attention_backend
    return (server_args.prefill_attention_backend or default, server_args.decode_attention_backend or default)


def pool_layout(server_args, device: str, is_draft_worker: bool, settings: PoolSettings) -> str | None:
    """Which scout pool this model runner gets (None: SGLang's own)."""
    prefill, decode = selected_backends(server_args)
    if is_draft_worker or decode != "scout" or settings.kv_pool == "stock":
        return None
    if getattr(server_args, "disaggregation_mode", "null") == "decode":
        return "arrival"
    if prefill == "scout":
        return "logical"
    if not str(device).startswith("cpu"):
        raise RuntimeError(
            f"the scout KV pool holds the prompt in host memory, which the {prefill} prefill backend cannot write on "
            f"{device}: use --attention-backend scout (scout runs prefill itself), deploy scout as the decode "
            "instance of a PD deployment, or set SCOUT_KV_POOL=stock to keep SGLang's device pool")
    return "arrival"


def pool_problems(server_args, layout: str = "logical", block_size: int | None = None) -> list[str]:
    """Server arguments the scout pool of `layout` cannot serve (empty: fine); block_size: the engine's (default:
    SCOUT_BLOCK_SIZE)."""
    problems = []
    if not server_args.disable_radix_cache:
        block_size = block_size or config_from_env().block_size
        page_size = getattr(server_args, "page_size", None) or 1
        if layout != "logical":
            problems.append("the radix cache on an instance where scout only decodes (prefix reuse needs scout to "
                            "run prefill too; a PD prefill instance keeps its own radix cache): add "
                            "--disable-radix-cache")
        elif page_size != block_size:
            problems.append(f"the radix cache with --page-size {page_size}: scout shares a cached prefix in whole "
                            f"blocks of {block_size} tokens, so SGLang's pages must be blocks: add --page-size "
                            f"{block_size} (or --disable-radix-cache)")
    if getattr(server_args, "enable_hierarchical_cache", False):
        problems.append("--enable-hierarchical-cache (the scout pool already keeps K/V in host memory): remove it")
    if getattr(server_args, "dcp_size", 1) not in (None, 1) or getattr(server_args, "attn_cp_size", 1) not in (None, 1):
        problems.append("decode context parallelism: run without it")
    if getattr(server_args, "disaggregation_mode", "null") in ("prefill", "decode") and \
            getattr(server_args, "disaggregation_transfer_backend", None) == "nixl":
        # SGLang registers every K/V buffer with NIXL as device (VRAM) memory; the scout pool's is host memory.
        problems.append("the NIXL transfer backend (it registers the scout pool's host K/V as device memory): "
                        "use --disaggregation-transfer-backend mooncake")
    return problems


def placeholder_tokens(requests: int, page_size: int) -> int:
    """Token capacity SGLang builds its own pools for under the logical layout: 2 tokens per request slot (its
    request pool gets min(requests, capacity // 2) slots), rounded up to whole pages. SGLang's token pool adds one
    page of padding to it."""
    return -(-2 * requests // page_size) * page_size


def host_bytes_per_token(pool) -> int:
    """Host bytes of one token's K and V over all layers, as the engine stores them."""
    return pool.layer_num * pool.head_num * (pool.head_dim + pool.v_head_dim) * pool.dtype.itemsize


def logical_capacity(max_total_tokens: int | None, settings: PoolSettings, token_bytes: int, page_size: int,
                     local_ranks: int = 1) -> int:
    """Logical tokens from SCOUT_HOST_KV_GIB (the host memory of the whole server: each of the `local_ranks`
    tensor-parallel ranks on this host stores its heads' `token_bytes` in its part), else from
    --max-total-tokens; a multiple of the page size."""
    if settings.host_kv_gib is not None:
        tokens = int(settings.host_kv_gib * 2**30 / local_ranks // token_bytes)
    elif max_total_tokens:
        tokens = int(max_total_tokens)
    else:
        raise RuntimeError("the scout KV pool needs its logical capacity: pass --max-total-tokens N (tokens held in "
                           "host memory) or set SCOUT_HOST_KV_GIB (host memory for K/V, in GiB)")
    tokens = tokens // page_size * page_size
    if tokens < page_size:
        raise RuntimeError(f"the scout KV pool's capacity ({tokens} tokens) is below one page ({page_size} tokens)")
    return tokens


def available_host_bytes() -> int:
    """Host memory free now, in bytes."""
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


# The share of the free host memory the engine's stores may take at start-up. A CUDA server needs more beside them:
# on an H200 box (125 GiB, 124 free) a process whose 106.7 GiB store was 86% of it peaked at 121.5 GiB and was
# OOM-killed (the CUDA context, page-locked staging and the workers, about 15 GiB); at 80% it ran.
HOST_SHARE = {"cpu": 0.9, "cuda": 0.8}


def check_host_memory(host_bytes: int, tokens: int, what: str = "the scout host store", *, local_ranks: int = 1,
                      available: int | None = None, share: float = HOST_SHARE["cpu"]) -> None:
    """Refuse to start when the host store of each of the `local_ranks` ranks on this host would not fit, all
    together, in `share` of the memory available (default: now)."""
    available = available_host_bytes() if available is None else available
    needed = host_bytes * local_ranks
    if needed > share * available:
        each = f" on each of the {local_ranks} tensor-parallel ranks on this host" if local_ranks > 1 else ""
        together = f" ({needed / GIB:.1f} GiB together)" if local_ranks > 1 else ""
        raise RuntimeError(
            f"{what} for {tokens} tokens needs {host_bytes / GIB:.1f} GiB of host memory{each}{together}, but only "
            f"{available / GIB:.1f} GiB is available (the stores may take {share:.0%} of it): lower "
            f"--max-total-tokens (or SCOUT_HOST_KV_GIB)")


def check_device_memory(plan: dict, tokens: int, free_bytes: int) -> None:
    """Refuse to start when the engine's device part (digests, windows, dense layers) would not fit."""
    needed = plan["device_bytes_allocated"]
    if needed > 0.9 * free_bytes:
        dense = plan["dense_layer_bytes_allocated"]
        raise RuntimeError(
            f"the scout engine needs {needed / GIB:.2f} GiB of device memory for {tokens} logical tokens "
            f"({dense / GIB:.2f} GiB of it for the dense layers {plan['dense_layers']}, which keep every token on the "
            f"device), but only {free_bytes / GIB:.2f} GiB is free: lower --max-total-tokens (or SCOUT_HOST_KV_GIB)"
            + (" or offload every layer (SCOUT_DENSE_LAYERS=)" if dense else ""))


def check_engine_memory(plan: dict, device, tokens: int, extra_host_bytes: int = 0, place=None) -> None:
    """The engine's stores (and `extra_host_bytes`, an arrival pool) against the memory free now. On a CPU
    server the device part is host memory too. With tensor parallelism every rank measures the free host memory
    before any allocates (they gather it), and the stores of all the ranks on this host must fit in it."""
    import torch

    from scout_sglang.sglang_adapter.tensor_parallel import RankPlace, tp_gather

    place = place or RankPlace()
    available = min(tp_gather(available_host_bytes()))
    if torch.device(device).type == "cuda":
        check_host_memory(plan["host_bytes_allocated"] + extra_host_bytes, tokens, local_ranks=place.local_ranks,
                          available=available, share=HOST_SHARE["cuda"])
        check_device_memory(plan, tokens, torch.cuda.mem_get_info(torch.device(device))[0])
    else:
        check_host_memory(plan["host_bytes_allocated"] + plan["device_bytes_allocated"] + extra_host_bytes, tokens,
                          "the scout engine (host store and, on this CPU device, its device part)",
                          local_ranks=place.local_ranks, available=available)


def plan_engine(pool, tokens: int, slots: int, config=None, *, borrowed_host: bool = False) -> dict:
    """The engine's bytes for a logical capacity, from the configuration (default: SCOUT_*) and SGLang's pool
    geometry (borrowed_host: the engine keeps its blocks in the arrival pool)."""
    from scout_sglang.sglang_adapter.memory_report import engine_total_pages, planned_bytes  # imports the engine

    config = config or config_from_env()
    return planned_bytes(config, num_layers=pool.layer_num, num_kv_heads=pool.head_num, head_dim=pool.head_dim,
                         itemsize=pool.dtype.itemsize,
                         total_pages=engine_total_pages(tokens, config.block_size, slots), slots=slots,
                         borrowed_host=borrowed_host)


def configure_around(original, configurator, *args, **kwargs):
    """AROUND hook of KVCacheConfigurator.configure."""
    settings = pool_settings_from_env()
    server_args = configurator.server_args
    layout = pool_layout(server_args, configurator.device, configurator.is_draft_worker, settings)
    if layout is None:
        return original(configurator, *args, **kwargs)
    problems = pool_problems(server_args, layout)
    if problems:
        raise RuntimeError("the scout KV pool cannot serve this server:\n  - " + "\n  - ".join(problems))
    import msgspec
    from sglang.srt.runtime_context import get_schedule

    schedule = get_schedule()
    page_size = configurator.page_size
    requests = schedule.max_running_requests or DEFAULT_MAX_REQUESTS
    placeholder = placeholder_tokens(requests, page_size)
    config = config_from_env()
    # Resident-first with no pool size given: the pool takes what a stock server would give its KV cache, measured
    # as SGLang measures it, here, before its pools exist (every tensor-parallel rank measures: a collective).
    stock_kv_bytes = stock_kv_budget(configurator, kwargs) \
        if config.resident_first and config.resident_pool_blocks is None else None
    with schedule.override(max_total_tokens=placeholder, max_running_requests=requests):
        result = original(configurator, *args, **kwargs)
    pool = result.token_to_kv_pool
    token_bytes = host_bytes_per_token(pool)
    from scout_sglang.sglang_adapter.tensor_parallel import rank_place

    place = rank_place(server_args)
    logical = logical_capacity(schedule.max_total_tokens, settings, token_bytes, page_size, place.local_ranks)
    slots = result.req_to_token_pool.size  # the engine's request slots (the backend sizes it the same way)
    sizing = None
    if stock_kv_bytes is not None:
        from scout_sglang.sglang_adapter.memory_report import engine_total_pages, resident_pool_size, resident_pool_text

        sizing = resident_pool_size(config, num_layers=pool.layer_num, num_kv_heads=pool.head_num,
                                    head_dim=pool.head_dim, itemsize=pool.dtype.itemsize,
                                    total_pages=engine_total_pages(logical, config.block_size, slots), slots=slots,
                                    kv_budget_bytes=stock_kv_bytes)
        if sizing is not None:
            config = config.replace(resident_pool_blocks=sizing["pages"])
            logger.info("scout %s", resident_pool_text(sizing))
    shared = layout == "arrival" and shares_arrival_pool(page_size, config.block_size)
    plan = plan_engine(pool, logical, slots, config, borrowed_host=shared)
    arrival_bytes = logical * token_bytes if layout == "arrival" else 0  # where K/V lands (the engine's store if shared)
    check_engine_memory(plan, configurator.device, logical, arrival_bytes, place)
    if layout == "arrival":
        # When its pages are the engine's store, on a GPU it is page-locked as it is allocated (host_pool_like).
        pool = host_pool_like(pool, logical, configurator.device if shared else "cpu")
    setattr(pool, LAYOUT_ATTRIBUTE, layout)
    setattr(pool, RESIDENT_POOL_ATTRIBUTE, sizing)  # the backend builds its engine with this pool size
    allocator = allocator_over(logical, page_size, configurator.kv_cache_dtype, configurator.device, pool,
                               getattr(result.token_to_kv_pool_allocator, "need_sort", False))
    from scout_sglang.sglang_adapter.memory_report import size_text

    logger.info("scout KV pool (%s): logical capacity %d tokens, %d request slots. Host memory: %s of K/V (the "
                "engine's store of the offloaded layers%s). Device: %s for the engine (%s dense layers %s, %s digests, "
                "%s windows and resident buffers); SGLang's device pool: %s", layout, logical, slots,
                size_text(plan["host_bytes_allocated"] + arrival_bytes), arrival_text(layout, shared),
                size_text(plan["device_bytes_allocated"]), size_text(plan["dense_layer_bytes_allocated"]),
                plan["dense_layers"], size_text(plan["digest_bytes_allocated"]),
                size_text(plan["window_and_resident_bytes_allocated"]),
                "none (a host pool receives the K/V)" if layout == "arrival" else f"{placeholder}-token placeholder")
    if layout == "arrival" and not shared and plan["host_bytes_allocated"]:
        logger.warning("scout KV pool (arrival): SGLang's page size (%d) is not the block size (%d), so the K/V is "
                       "held twice in host memory (the arrival pool and the engine's store): run with --page-size %d "
                       "(on the prefill instance too) to make the arrival pool the engine's store", page_size,
                       config.block_size, config.block_size)
    return msgspec.structs.replace(result, max_total_num_tokens=logical, token_to_kv_pool=pool,
                                   token_to_kv_pool_allocator=allocator)


def stock_kv_budget(configurator, kwargs: dict) -> int:
    """The device bytes a stock server would give its KV cache: SGLang's own profile (free memory less the runtime
    slack of mem_fraction_static), taken before its pools are built."""
    profile = getattr(configurator, "_profile_available_bytes", None)
    if profile is None or "pre_model_load_memory" not in kwargs:
        raise RuntimeError("SCOUT_RESIDENT_FIRST=on sizes its pool from SGLang's KV memory profile, which this SGLang "
                           "does not expose (is this sglang 0.5.23?): set SCOUT_RESIDENT_POOL_BLOCKS to size it")
    return int(profile(kwargs["pre_model_load_memory"]))


def arrival_text(layout: str, shared: bool) -> str:
    """What the host K/V of the start-up log line is, after "the engine's store of the offloaded layers"."""
    if layout != "arrival":
        return ""
    return " in the arrival pool's pages: one copy" if shared else ", and the arrival pool: two copies"


def host_pool_like(pool, size: int, device="cpu"):
    """An MHA pool of `size` tokens in host memory, shaped like `pool` (transfer engines register its buffers).
    Its buffers come from the engine's host store allocator (host_memory.alloc_host_buffer): on transparent huge
    pages where the OS allows, and, for a CUDA `device` (the pool is then the engine's store: arrival_pages.py),
    pre-faulted and page-locked in place, each falling back to torch's page-locked allocator if that fails."""
    from scout_sglang.cpu_worker.host_memory import zeros_on_huge_pages

    # SGLang's constructor allocates the buffers with torch.zeros and derives its copy kernels' pointers from them,
    # so they are given their pages as they are made: replaced afterwards, those pointers would be stale.
    with zeros_on_huge_pages("arrival pool", device):
        return type(pool)(size=size, page_size=pool.page_size, dtype=pool.dtype, head_num=pool.head_num,
                          head_dim=pool.head_dim, layer_num=pool.layer_num, device="cpu", enable_memory_saver=False,
                          v_head_dim=pool.v_head_dim, start_layer=pool.start_layer, end_layer=pool.end_layer,
                          enable_alt_stream=False)


def allocator_over(size: int, page_size: int, dtype, device, pool, need_sort: bool):
    """SGLang's stock allocator over the logical ids 1..size."""
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator

    if page_size == 1:
        return TokenToKVPoolAllocator(size, dtype=dtype, device=device, kvcache=pool, need_sort=need_sort)
    return PagedTokenToKVPoolAllocator(size, page_size=page_size, dtype=dtype, device=device, kvcache=pool,
                                       need_sort=need_sort)
