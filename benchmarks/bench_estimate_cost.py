"""What the estimate of the unattended blocks costs the device in a decode step, against what scout's attention
costs there, measured in one call on one device.

The estimate (kernels/estimate.py, issue 47) takes the place of the CPU part's merge: a Triton launch that reads,
per (request, KV head), the digest and the value summary of every full block and merges the estimate with the
device and CPU parts, preceded, for tables of more than SPLIT_BLOCKS blocks, by one launch that walks them in
slices (`splits` in the results). Its cost on a step is what it takes beyond the merge it replaces. Timed with CUDA events,
kernel by kernel, on Qwen3-8B's attention shape (32 query heads, 8 KV heads, head_dim 128, 32-token blocks, bf16),
budget 2048 tokens (64 blocks per list):

  merge_ms       the CPU part's merge alone (kernels/cpu_part.py), what a step launches without the estimate
  estimate_ms    the estimate and the merge (kernels/triton/estimate.py)
  decode_ms      the sparse decode of the budget's 64 blocks per list from a device store (the attention the
                 estimate is added to; scout splits these between the device and the CPU part)
  extra_over_decode   (estimate_ms - merge_ms) / decode_ms

The summaries and the selection are random (a stress case: the cost does not depend on the values). Results:
benchmarks/results/estimate_cost_<device>.{json,md}; the last stdout line is the JSON. No asserts.

    python3 -P benchmarks/bench_estimate_cost.py [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_zero_copy import RESULTS, timed_ms  # noqa: E402

NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK, BUDGET_BLOCKS = 32, 8, 128, 32, 64
VALUE_ROWS = 3


def log(message: str) -> None:
    print(f"[bench_estimate_cost] {message}", file=sys.stderr, flush=True)


def one_shape(batch: int, context: int, *, dry: bool, device: torch.device) -> dict:
    from scout_sglang.kernels.cpu_part import merge_cpu_part
    from scout_sglang.kernels.estimate import CpuPartResult, UnattendedBlocks, merge_with_estimate
    from scout_sglang.kernels.triton.decode import sparse_decode_triton
    from scout_sglang.kernels.triton.estimate import estimate_splits, workspace_words

    qo, kv, dim, block, topk = (4, 2, 16, 8, 4) if dry else (NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK,
                                                              BUDGET_BLOCKS)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    blocks_per_row = context // block
    pages = batch * blocks_per_row
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*shape, dt=dtype):
        return torch.randn(*shape, generator=gen, device=device).to(dt)

    low = rand(pages, kv, dim)
    unattended = UnattendedBlocks(
        digest_min=low, digest_max=low + rand(pages, kv, dim).abs(), value_summary=rand(pages, kv, VALUE_ROWS, dim),
        block_table=torch.arange(pages, dtype=torch.int32, device=device).view(batch, blocks_per_row),
        num_full=torch.full((batch,), blocks_per_row, dtype=torch.int32, device=device),
        selected=torch.rand(batch, kv, blocks_per_row, generator=gen, device=device).topk(topk, dim=-1).indices.to(
            torch.int32),
        counts=torch.full((batch, kv), topk, dtype=torch.int32, device=device), resident=None, slots=None,
        block_size=block, scale=dim**-0.5)
    words = workspace_words(batch, qo, dim, blocks_per_row)  # a static buffer, as the engine's
    unattended.workspace = torch.empty(words, device=device) if words else None
    q, o = rand(batch, qo, dim), rand(batch, qo, dim)
    lse = rand(batch, qo, dt=torch.float32)
    cpu = CpuPartResult(rand(batch, qo, dim, dt=torch.float32), rand(batch, qo, dt=torch.float32),
                        rand(batch, qo, dim, dt=torch.float32), rand(batch, qo, dt=torch.float32),
                        torch.zeros(1, dtype=torch.int32, device=device))
    out = torch.empty_like(o)
    merge_ms = timed_ms(lambda: merge_cpu_part(o, lse, cpu.cpu_o, cpu.cpu_lse, cpu.fb_o, cpu.fb_lse, cpu.status, out,
                                               impl="triton"), device)
    estimate_ms = timed_ms(lambda: merge_with_estimate(q, o, lse, out, blocks=unattended, cpu=cpu, impl="triton",
                                                       validate=False), device)
    store_pages = min(pages, 4096 if not dry else 64)
    k, v = rand(store_pages, kv, block, dim), rand(store_pages, kv, block, dim)
    table = torch.randint(0, store_pages, (batch, kv, topk), generator=gen, device=device, dtype=torch.int32)
    counts = torch.full((batch, kv), topk, dtype=torch.int32, device=device)
    d_out, d_lse = torch.empty_like(q), torch.empty(batch, qo, device=device)
    decode_ms = timed_ms(lambda: sparse_decode_triton(q, k, v, table, counts, None, d_out, d_lse, scale=dim**-0.5),
                         device)
    item = torch.empty((), dtype=dtype).element_size()
    summary_bytes = batch * kv * blocks_per_row * (2 + VALUE_ROWS) * dim * item
    return dict(batch=batch, context=context, splits=estimate_splits(blocks_per_row), merge_ms=round(merge_ms, 4), estimate_ms=round(estimate_ms, 4),
                decode_ms=round(decode_ms, 4),
                extra_over_decode=round((estimate_ms - merge_ms) / decode_ms, 3),
                estimate_gbs=round(summary_bytes / (estimate_ms * 1e-3) / 1e9, 1),
                summary_mb=round(summary_bytes / 1e6, 1))


def write(result: dict) -> None:
    name = result["device"].lower().replace(" ", "_").replace("-", "_")
    lines = [f"# The estimate's device cost: {result['device']}", "",
             "`python3 -P benchmarks/bench_estimate_cost.py`: kernel by kernel, CUDA events, Qwen3-8B's attention "
             "shape, bf16, budget 64 blocks per list, random summaries and selection. `extra / decode` is what the "
             "estimate adds beyond the merge it replaces, over the sparse decode of the budget's blocks.", "",
             "| batch | context | merge ms | estimate + merge ms | decode ms (64 blocks) | extra / decode | "
             "estimate GB/s | summaries MB |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['batch']} | {r['context']} | {r['merge_ms']} | {r['estimate_ms']} | {r['decode_ms']} | "
              f"{r['extra_over_decode']} | {r['estimate_gbs']} | {r['summary_mb']} |" for r in result["rows"]]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"estimate_cost_{name}.md").write_text("\n".join(lines) + "\n")
    (RESULTS / f"estimate_cost_{name}.json").write_text(json.dumps(result, indent=1) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on any device; nothing is written")
    args = parser.parse_args()
    if args.dry_run and not torch.cuda.is_available():
        from scout_sglang.triton_interpreter import interpret_without_gpu

        interpret_without_gpu()  # Triton's interpreter, sped up
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shapes = [(2, 64)] if args.dry_run else [(8, 32768), (32, 32768), (32, 65536), (64, 65536)]
    rows = []
    for batch, context in shapes:
        rows.append(one_shape(batch, context, dry=args.dry_run, device=device))
        log(f"{rows[-1]}")
    result = dict(device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu (dry run)", rows=rows)
    if not args.dry_run:
        write(result)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
