"""Device-op benchmark on CUDA: sparse decode GB/s against the GPU's memory
bandwidth measured in the same run, and block scoring + top-k latency at
batch 64 with 64k-token contexts. On a machine without a GPU it says so and
exits 0. Prints progress to stderr and one JSON line last; writes
benchmarks/results/kernels.{json,md} unless --quick.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def log(message: str) -> None:
    print(f"[bench_kernels] {message}", file=sys.stderr, flush=True)


def cuda_time_ms(fn, *, warmup: int = 3, repeat: int = 20) -> float:
    """Median milliseconds of fn() measured with CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def copy_bandwidth_gbs(num_bytes: int = 2 << 30) -> float:
    """Device-to-device copy: read + write bytes per second (the HBM limit)."""
    src = torch.empty(num_bytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = cuda_time_ms(lambda: dst.copy_(src))
    return 2 * src.numel() / (ms * 1e-3) / 1e9


def bench_sparse_decode(impl, *, batch_size, blocks_per_head, num_pages, dtype=torch.bfloat16):
    from scout_sglang import kernels
    from scout_sglang.testing import random_paged_kv

    num_qo_heads, num_kv_heads, block_size, head_dim = 32, 8, 32, 128
    k_cache, v_cache = random_paged_kv(num_pages, num_kv_heads, block_size, head_dim, dtype=dtype, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    table = torch.randint(0, num_pages, (batch_size, num_kv_heads, blocks_per_head), generator=gen, device="cuda")
    table = table.to(torch.int32)
    counts = torch.full((batch_size, num_kv_heads), blocks_per_head, dtype=torch.int32, device="cuda")
    q = torch.randn(batch_size, num_qo_heads, head_dim, device="cuda", dtype=dtype)
    out, out_lse = torch.empty_like(q), torch.empty(batch_size, num_qo_heads, device="cuda")
    ms = cuda_time_ms(
        lambda: kernels.sparse_decode(q, k_cache, v_cache, table, counts, scale=head_dim**-0.5, out=out, out_lse=out_lse, impl=impl)
    )
    kv_bytes = 2 * batch_size * num_kv_heads * blocks_per_head * block_size * head_dim * k_cache.element_size()
    return ms, kv_bytes / (ms * 1e-3) / 1e9


def bench_topk(*, batch_size=64, context=65536, topk_blocks=64, dtype=torch.bfloat16):
    from scout_sglang import kernels

    num_qo_heads, num_kv_heads, block_size, head_dim = 32, 8, 32, 128
    num_blocks = context // block_size
    num_pages = batch_size * num_blocks
    digest_min = torch.randn(num_pages, num_kv_heads, head_dim, device="cuda", dtype=dtype)
    digest_max = digest_min + torch.rand_like(digest_min)
    table = torch.arange(num_pages, dtype=torch.int32, device="cuda").view(batch_size, num_blocks)
    lengths = torch.full((batch_size,), num_blocks, dtype=torch.int32, device="cuda")
    q = torch.randn(batch_size, num_qo_heads, head_dim, device="cuda", dtype=dtype)
    scores = torch.empty(batch_size, num_kv_heads, num_blocks, device="cuda")

    def step():
        kernels.score_blocks(q, digest_min, digest_max, table, lengths, out=scores)
        kernels.select_topk(scores, lengths, topk=topk_blocks, num_sink_blocks=1, num_local_blocks=2)

    score_ms = cuda_time_ms(lambda: kernels.score_blocks(q, digest_min, digest_max, table, lengths, out=scores))
    return score_ms, cuda_time_ms(step)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer shapes, no result files")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        log("no CUDA GPU on this machine: the device-op benchmark needs one; nothing to measure")
        print(json.dumps({"cuda": False}))
        return 0
    from scout_sglang.kernels.dispatch import is_available

    device_name = torch.cuda.get_device_name()
    log(f"device: {device_name}")
    bandwidth = copy_bandwidth_gbs()
    log(f"copy bandwidth {bandwidth:.0f} GB/s")
    rows = []
    batches = [8, 64] if args.quick else [8, 32, 64, 128]
    for impl in [i for i in ("flashinfer", "triton", "torch") if is_available(i, "cuda")]:
        for batch_size in batches:
            for blocks in (64, 256):
                num_pages = max(4 * batch_size * blocks, 8192)
                ms, gbs = bench_sparse_decode(impl, batch_size=batch_size, blocks_per_head=blocks, num_pages=num_pages)
                rows.append(dict(impl=impl, batch=batch_size, blocks_per_head=blocks, ms=ms, gbs=gbs, frac_of_bw=gbs / bandwidth))
                log(f"sparse_decode {impl:10s} B={batch_size:3d} blocks={blocks:3d}: {ms:.3f} ms {gbs:.0f} GB/s")
    score_ms, select_ms = bench_topk()
    log(f"score 64x64k: {score_ms:.3f} ms; score + top-k: {select_ms:.3f} ms")
    summary = dict(
        cuda=True,
        device=device_name,
        copy_bw_gbs=bandwidth,
        best_sparse_decode_frac_of_bw=max(r["frac_of_bw"] for r in rows),
        score_ms_b64_64k=score_ms,
        score_topk_ms_b64_64k=select_ms,
        sparse_decode=rows,
    )
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "kernels.json").write_text(json.dumps(summary, indent=2))
        lines = [f"# Device ops on {device_name}", "", f"Copy bandwidth: {bandwidth:.0f} GB/s", ""]
        lines += ["| impl | batch | blocks/head | ms | GB/s | of bandwidth |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['impl']} | {r['batch']} | {r['blocks_per_head']} | {r['ms']:.3f} | {r['gbs']:.0f} | {r['frac_of_bw']:.0%} |" for r in rows]
        lines += ["", f"Scoring at batch 64, 64k tokens: {score_ms:.3f} ms; scoring + top-k: {select_ms:.3f} ms"]
        (RESULTS / "kernels.md").write_text("\n".join(lines) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "sparse_decode"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
