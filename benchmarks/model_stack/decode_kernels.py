"""The decode kernel of resident-first's exact path against a vendor's, at the resident part's low-load shapes.

The benchmark's full attention and scout's exact path decode with the same kernel (the engine's Triton decode over
every page of the request), so their ratio cannot show whether that kernel is as fast as the one a stock SGLang
server runs (FlashInfer or FlashAttention, which do not fit the lent machine). This measures it on its own: one layer
of Qwen3-8B's attention at each (context, batch), the engine's kernel over a page table of the whole context against
torch's scaled_dot_product_attention over the same K/V laid out contiguously (the fastest of its fused backends that
runs), both against the device's copy bandwidth measured in the same call. On a GPU each kernel is timed as a
CUDA graph of REPEAT calls (as a served step replays it: no host launch between them). Every output is compared
with an fp32 reference, so a table that skipped a page, or a backend that is wrong, shows (`agrees`).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

SHAPES = ((32768, 1), (32768, 8), (65536, 1), (65536, 8))  # (context, batch): low load, where a pool holds all
DRY_SHAPES = ((64, 2),)
REPEAT = 20
AGREE = 2e-2  # the largest difference from the fp32 reference a bf16 output may have (fp32: 1e-4)
SPLIT_SWEEP = (1, 8, 16, 32, 64, 128)  # KV splits per list the engine's decode is also timed at
COPY_BYTES = 1 << 30


def decode_kernel_rates(setup, deadline: float) -> dict:
    """Per shape: the engine's decode and torch's SDPA in ms and GB/s of K/V read, and their ratio; the device's
    copy bandwidth (read + write) once."""
    qo, kv, dim = (setup.qo, setup.kv, setup.dim)
    out = dict(copy_gbs=round(copy_gbs(setup.device), 1), rows=[])
    for context, batch in (DRY_SHAPES if setup.dry else SHAPES):
        if time.perf_counter() > deadline:
            out["rows"].append(dict(context=context, batch=batch, skipped="the call's time budget ran out"))
            continue
        try:
            row = one_shape(setup.device, batch=batch, context=context, num_qo_heads=qo, num_kv_heads=kv,
                            head_dim=dim, block_size=setup.block)
        except Exception as error:  # noqa: BLE001 - reported in the row, the part goes on
            row = dict(context=context, batch=batch, error=f"{type(error).__name__}: {error}"[:400])
        if "engine_gbs" in row:
            row["engine_of_copy"] = round(row["engine_gbs"] / out["copy_gbs"], 3)
        out["rows"].append(row)
        if setup.device.type == "cuda":
            torch.cuda.empty_cache()  # the rows after this measure the device's free memory
    return out


def one_shape(device, *, batch: int, context: int, num_qo_heads: int, num_kv_heads: int, head_dim: int,
              block_size: int, impl: str = "triton", dtype: torch.dtype | None = None) -> dict:
    """One layer's decode at (batch, context): the engine's kernel (impl: its Triton path, as the engine runs on a
    GPU) over its page table, torch's SDPA over the same K/V contiguous; each output's largest difference from an
    fp32 reference (dtype: bf16 on a GPU, fp32 on the CPU, unless given)."""
    from scout_sglang import kernels
    from scout_sglang.kernels.triton.decode import split_plan, workspace_size

    device = torch.device(device)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    blocks = context // block_size
    if blocks * block_size != context:
        raise ValueError(f"context {context} is not a multiple of the block size {block_size}")
    gen = torch.Generator(device=device).manual_seed(0)
    pages = batch * blocks
    k_cache = torch.randn(pages, num_kv_heads, block_size, head_dim, generator=gen, device=device, dtype=dtype)
    v_cache = torch.randn(pages, num_kv_heads, block_size, head_dim, generator=gen, device=device, dtype=dtype)
    # request r's blocks are pages r*blocks .. (r+1)*blocks - 1, in order, for every KV head
    table = torch.arange(pages, dtype=torch.int32, device=device).view(batch, 1, blocks)
    table = table.expand(batch, num_kv_heads, blocks).contiguous()
    counts = torch.full((batch, num_kv_heads), blocks, dtype=torch.int32, device=device)
    q = torch.randn(batch, num_qo_heads, head_dim, generator=gen, device=device, dtype=dtype)
    scale = head_dim ** -0.5
    out, lse = torch.empty_like(q), torch.empty(batch, num_qo_heads, device=device)
    words = workspace_size(batch, num_qo_heads, num_kv_heads, head_dim, block_size, [blocks])
    workspace = torch.empty(max(words, 1), device=device) if impl == "triton" else None  # static, as the engine's

    def engine() -> None:
        kernels.sparse_decode(q, k_cache, v_cache, table, counts, scale=scale, out=out, out_lse=lse, impl=impl,
                              validate=False, workspace=workspace)

    engine_ms = time_ms(engine, device)

    def contiguous(cache):  # the same K/V as [batch, Hkv, context, D]
        return cache.view(batch, blocks, num_kv_heads, block_size, head_dim).transpose(1, 2).reshape(
            batch, num_kv_heads, context, head_dim)

    k, v = contiguous(k_cache), contiguous(v_cache)
    q4 = q.unsqueeze(2)
    reference = F.scaled_dot_product_attention(q4.float(), k.float(), v.float(), scale=scale,
                                               enable_gqa=True).squeeze(2)
    agree = AGREE if dtype != torch.float32 else 1e-4

    def difference(output) -> float:
        return float((output.float() - reference).abs().max())

    sdpa_ms, backend, sdpa_out = vendor_decode(q4, k, v, scale, device, reference, agree)
    del k, v
    kv_bytes = 2 * batch * num_kv_heads * context * head_dim * q.element_size()
    row = dict(context=context, batch=batch, dtype=str(dtype).removeprefix("torch."), engine_ms=engine_ms,
               sdpa_ms=sdpa_ms, sdpa_backend=backend, engine_gbs=kv_bytes / engine_ms / 1e6,
               sdpa_gbs=kv_bytes / sdpa_ms / 1e6, engine_over_sdpa=sdpa_ms / engine_ms,
               max_abs_diff=difference(out), sdpa_max_abs_diff=difference(sdpa_out))
    if impl == "triton":
        row["engine_ms_by_splits"], sweep_out = split_sweep(q, k_cache, v_cache, table, counts, scale, device)
        row["sweep_max_abs_diff"] = max(difference(o) for o in sweep_out)
        row["default_splits"] = split_plan(blocks, batch, num_kv_heads, head_dim, block_size)[0]  # the engine's
    row["agrees"] = all(row[key] <= agree for key in ("max_abs_diff", "sdpa_max_abs_diff", "sweep_max_abs_diff")
                        if key in row)
    return row


def split_sweep(q, k_cache, v_cache, table, counts, scale: float, device) -> tuple[dict, list]:
    """The Triton decode's time at each KV split count of SPLIT_SWEEP (the splits it used -> ms) and its output at
    each: the split
    heuristic (kernels/triton/decode.py default_num_splits) is not yet tuned on a GPU, and the exact path at low
    load (a few long lists) is where it decides the most."""
    from scout_sglang.kernels.triton.decode import sparse_decode_triton, split_plan

    batch, num_qo_heads, head_dim = q.shape
    _, num_kv_heads, block_size, _ = k_cache.shape
    capacity = table.shape[2]
    out, lse = torch.empty_like(q), torch.empty(batch, num_qo_heads, device=device)
    workspace = (torch.empty(batch, num_qo_heads, max(SPLIT_SWEEP), head_dim, device=device),
                 torch.empty(batch, num_qo_heads, max(SPLIT_SWEEP), device=device))
    times, outputs = {}, []
    for asked in SPLIT_SWEEP:
        used, _ = split_plan(capacity, batch, num_kv_heads, head_dim, block_size, asked)
        if used in times:
            continue
        times[used] = time_ms(lambda: sparse_decode_triton(q, k_cache, v_cache, table, counts, None, out, lse,
                                                           scale=scale, num_splits=asked, workspace=workspace), device)
        outputs.append(out.clone())
    return times, outputs


def vendor_decode(q, k, v, scale: float, device, reference, agree: float) -> tuple[float, str, torch.Tensor]:
    """The fastest of torch's fused SDPA backends that runs this decode and agrees with the fp32 reference within
    `agree` (any backend on the CPU) -> (ms, its name, output [B, Hq, D])."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def call():
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)

    if device.type != "cuda":
        return time_ms(call, device), "default", call().squeeze(2)
    best, refused = None, []
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        try:
            with sdpa_kernel(backend):
                output = call().squeeze(2)
                ms = time_ms(call, device)
        except RuntimeError as error:
            if "No available kernel" not in str(error):
                raise  # a fault, not a refusal: the device may be unusable after it
            refused.append(backend.name.lower())
            continue
        if float((output.float() - reference).abs().max()) > agree:
            refused.append(f"{backend.name.lower()} (disagrees)")
            continue
        if best is None or ms < best[0]:
            best = (ms, backend.name.lower(), output)
    if best is None:
        raise RuntimeError(f"none of torch's fused SDPA backends runs this decode correctly: {refused}")
    return best


def time_ms(fn, device) -> float:
    """Milliseconds of one fn() call. On a GPU: REPEAT calls captured in one CUDA graph (as a served step replays
    them: no host launch between calls), the median of 5 replays over REPEAT; where capture fails, REPEAT calls
    back to back between two events. On the CPU: the median of REPEAT timed calls. After 3 warm-up calls."""
    for _ in range(3):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(REPEAT):
                    fn()
            run = graph.replay
        except RuntimeError:
            torch.cuda.synchronize(device)

            def run():
                for _ in range(REPEAT):
                    fn()
        times = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / REPEAT)
        return sorted(times)[len(times) // 2]
    times = []
    for _ in range(REPEAT):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1e3)
    return sorted(times)[len(times) // 2]


def copy_gbs(device) -> float:
    """Device-to-device copy rate, read plus write bytes per second (GB/s): the memory's practical limit."""
    device = torch.device(device)
    size = COPY_BYTES if device.type == "cuda" else COPY_BYTES >> 6
    src = torch.empty(size // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device)
    return 2 * src.numel() / ms / 1e6


def decode_kernels_text(part: dict | None) -> list[str]:
    """The report's lines: per shape, the two kernels' GB/s and their ratio."""
    if not part:
        return []
    lines = ["### The exact path's decode kernel against a vendor's", "",
             "One layer of Qwen3-8B's attention: the engine's decode (what the exact path and this benchmark's full "
             "attention run) over the page table of the whole context, against torch's fastest fused SDPA over the "
             "same K/V laid out contiguously, each timed as a CUDA graph of 20 calls; outputs against an fp32 "
             f"reference. Device copy rate (read + write): {part.get('copy_gbs')} GB/s.", "",
             "| context | batch | engine ms | engine GB/s | of copy rate | SDPA ms | SDPA GB/s | SDPA backend "
             "| engine / SDPA speed | agrees with fp32 | engine ms by KV splits (default) |",
             "|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---|"]
    for row in part.get("rows", []):
        if "engine_ms" not in row:
            lines.append(f"| {row['context']} | {row['batch']} | {row.get('skipped') or row.get('error')} "
                         "| | | | | | | | |")
            continue
        lines.append(f"| {row['context']} | {row['batch']} | {row['engine_ms']:.3f} | {row['engine_gbs']:.0f} "
                     f"| {row.get('engine_of_copy', '-')} | {row['sdpa_ms']:.3f} | {row['sdpa_gbs']:.0f} "
                     f"| {row['sdpa_backend']} | {row['engine_over_sdpa']:.3f} "
                     f"| {'yes' if row['agrees'] else 'NO'} ({row['max_abs_diff']:.2g}) | {sweep_text(row)} |")
    return lines + [""]


def sweep_text(row: dict) -> str:
    sweep = row.get("engine_ms_by_splits") or {}
    return ", ".join(f"{splits}: {ms:.3f}" for splits, ms in sweep.items()) + \
        (f" ({row['default_splits']})" if "default_splits" in row else "")
