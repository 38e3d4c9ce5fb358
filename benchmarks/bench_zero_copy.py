"""The device's own reads of the page-locked host store (zero-copy over the PCIe link), against the same decode
kernel over a device-resident store and the link's copy rate, measured in one call on one device.

Issue 45 splits a layer's off-device blocks between the CPU workers and the device's zero-copy reads: its caps need
the rate at which the device attends blocks it reads from host memory. This measures it with the kernel the engine
already launches on that memory (the CPU part's gated fallback, kernels/triton/decode.py) over a store allocated as
the engine allocates it (cpu_worker.host_memory: pre-faulted, huge pages, page-locked in place), on Qwen3-8B's
attention shape (32 query heads, 8 KV heads, head_dim 128, 32-token blocks, bf16):

  zero_copy_gbs   K/V bytes the decode reads from the host store per second, by list length (blocks per list)
  device_gbs      the same kernel and lists over a device copy of the store
  h2d_copy_gbs    one bulk host-to-device copy from the same page-locked memory (the link's rate for a copy)

The lists are random pages of the store (no two reads of a page in one list): a stress case for the link, the
pattern of a flat selection. Results: benchmarks/results/zero_copy_<device>.{json,md}; the last stdout line is the
JSON. No asserts.

    python3 -P benchmarks/bench_zero_copy.py [--dry-run] [--store-gib 2] [--batch 32]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 32


def log(message: str) -> None:
    print(f"[bench_zero_copy] {message}", file=sys.stderr, flush=True)


def timed_ms(fn, device: torch.device, *, warmup: int = 2, repeat: int = 10) -> float:
    """Median milliseconds of fn(): CUDA events on a GPU, the wall clock elsewhere."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            start = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - start))
    return sorted(times)[len(times) // 2]


def host_store(pages: int, heads: int, block: int, dim: int, device: torch.device):
    """K and V page stores in host memory as the engine allocates them, filled with random bf16/fp32 values."""
    from scout_sglang.cpu_worker.host_memory import alloc_host_buffer

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    stores = []
    gen = torch.Generator().manual_seed(0)
    for name in ("k", "v"):
        tensor, _ = alloc_host_buffer((pages, heads, block, dim), dtype, device=device, what=f"zero-copy {name}")
        for start in range(0, pages, 1024):  # in slices: no full-size temporary
            chunk = tensor[start:start + 1024]
            chunk.copy_(torch.randn(chunk.shape, generator=gen).to(dtype))
        stores.append(tensor)
    return stores


def measure(args) -> dict:
    from scout_sglang.core.layer_stages import ZERO_COPY_PROGRAMS
    from scout_sglang.kernels.triton.decode import sparse_decode_triton

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    qo, kv, dim, block = (4, 2, 16, 8) if args.dry_run else (NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK)
    batch = 2 if args.dry_run else args.batch
    lengths = [2, 4] if args.dry_run else [8, 32, 128]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    page_bytes = kv * block * dim * torch.empty((), dtype=dtype).element_size()  # one of K or V
    pages = 64 if args.dry_run else int(args.store_gib * 2**30 // (2 * page_bytes))
    started = time.perf_counter()
    k_host, v_host = host_store(pages, kv, block, dim, device)
    log(f"host store: {pages} pages, {2 * pages * page_bytes / 2**30:.2f} GiB in {time.perf_counter() - started:.1f} s")
    k_dev, v_dev = k_host.to(device), v_host.to(device)
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(batch, qo, dim, generator=gen).to(dtype).to(device)
    out, lse = torch.empty_like(q), torch.empty(batch, qo, device=device)
    rows = []
    for length in lengths:
        table = torch.stack([torch.randperm(pages, generator=gen)[:length] for _ in range(batch * kv)])
        table = table.view(batch, kv, length).to(torch.int32).to(device)
        counts = torch.full((batch, kv), length, dtype=torch.int32, device=device)
        nbytes = 2 * batch * kv * length * block * dim * q.element_size()
        row = dict(blocks_per_list=length, mb_per_call=round(nbytes / 1e6, 2))
        runs = (("zero_copy", (k_host, v_host), None), ("device", (k_dev, v_dev), None),
                ("zero_copy_bounded", (k_host, v_host), ZERO_COPY_PROGRAMS))  # the engine's: one split, bounded
        for name, (k, v), programs in runs:
            ms = timed_ms(lambda: sparse_decode_triton(q, k, v, table, counts, None, out, lse, scale=dim**-0.5,
                                                       num_splits=1 if programs else None, programs=programs),
                          device)
            row[f"{name}_ms"], row[f"{name}_gbs"] = round(ms, 4), round(nbytes / (ms * 1e-3) / 1e9, 2)
        rows.append(row)
        log(f"{row}")
    copy_ms = timed_ms(lambda: k_dev.copy_(k_host, non_blocking=True), device, repeat=5)
    return dict(device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu (dry run)",
                batch=batch, store_gib=round(2 * pages * page_bytes / 2**30, 2), rows=rows,
                h2d_copy_gbs=round(pages * page_bytes / (copy_ms * 1e-3) / 1e9, 2))


def write(result: dict) -> None:
    name = result["device"].lower().replace(" ", "_").replace("-", "_")
    lines = [f"# Zero-copy reads of the host store: {result['device']}", "",
             f"`python3 -P benchmarks/bench_zero_copy.py`: the Triton sparse decode (the CPU part's fallback kernel) "
             f"over a page-locked host store of {result['store_gib']} GiB (the engine's allocation) and over a device "
             f"copy of it; batch {result['batch']}, Qwen3-8B's attention shape, bf16, random pages. One bulk "
             f"host-to-device copy from the same memory: **{result['h2d_copy_gbs']} GB/s**.", "",
             "The engine's zero-copy share (the CPU split) runs with one split on a bounded number of programs that "
             "walk the lists in turn: its column below.", "",
             "| blocks per list | MB per call | zero-copy ms | zero-copy GB/s | device ms | device GB/s | "
             "bounded zero-copy GB/s |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['blocks_per_list']} | {r['mb_per_call']} | {r['zero_copy_ms']} | {r['zero_copy_gbs']} | "
              f"{r['device_ms']} | {r['device_gbs']} | {r.get('zero_copy_bounded_gbs', '-')} |" for r in result["rows"]]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"zero_copy_{name}.md").write_text("\n".join(lines) + "\n")
    (RESULTS / f"zero_copy_{name}.json").write_text(json.dumps(result, indent=1) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on any device; nothing is written")
    parser.add_argument("--store-gib", type=float, default=2.0, help="host store size (K and V together)")
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    if args.dry_run and not torch.cuda.is_available():
        from scout_sglang.triton_interpreter import interpret_without_gpu

        interpret_without_gpu()  # Triton's interpreter, sped up
    result = measure(args)
    if not args.dry_run:
        write(result)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
