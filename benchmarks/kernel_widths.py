"""How wide a row the decode step's Triton stages compile for on a Hopper GPU (sm_90), here, without a GPU.

Resident-first makes a request's row, and its selection, as wide as the request's blocks outside its window:
4093 blocks at 64k tokens in blocks of 16. The stages hold a row in one program; up to 256 columns they compare
lists all pairs, wider they count through histograms of block ids and sort the victim order (kernels/triton/
lists.py, sizes.wide_lists), since an all-pairs matrix grows with the width squared and Triton refuses one past
2^20 elements. This sweep compiles each stage at each width
with Triton's real backend (nothing runs) and records the compile time, the PTX size (a proxy for the code a
program runs: sorts and loops over lists are unrolled) and the shared memory a program takes, or why it did not
compile:

  select     the select stage with each row's own k, selecting `width` blocks of a 64k table (an exact row)
  split      the split stage: `width` selected blocks against a resident row of `width` columns
  fill       the resident stage's first fill of a row of `width` columns (forced blocks: 3)
  recall     the resident stage's recall of the CPU list (64 candidates) into such a row, the brake on
  estimate   the estimate's merge: `width` selected and resident columns

Each compile runs in its own process under --timeout; a stage that timed out or was refused is not tried at a
wider width. Results: benchmarks/results/kernel_widths.{json,md}; the last stdout line is the JSON object. No asserts.

    python -P benchmarks/kernel_widths.py [--widths 128,256,512,1024,4096] [--timeout 240] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
STAGES = ("select", "split", "fill", "recall", "estimate")
TABLE_BLOCKS = 4096  # a 64k table in blocks of 16
FORCED = 3  # sink and local blocks
CPU_LIST = 64  # the CPU list's capacity: the budget's blocks
SHARED_LIMIT_KIB = 227  # shared memory a program may use on sm_90


def kernel_and_constants(stage: str, width: int):
    """(@triton.jit kernel, its constexprs) of `stage` at `width`; Qwen3-8B's shapes (D 128, blocks of 16)."""
    if stage == "select":
        from scout_sglang.kernels.triton.stage_select import _config, _select_topk_kernel
        return _select_topk_kernel, _config(width, TABLE_BLOCKS, 1, 2, 16, True, True, False, True)
    if stage == "split":
        from scout_sglang.kernels.triton.stage_split import _config, _split_lists_kernel
        return _split_lists_kernel, _config(width, FORCED, width, CPU_LIST, False, True, True, True, 4, 128, True,
                                            TABLE_BLOCKS)
    if stage in ("fill", "recall"):
        from scout_sglang.kernels.triton.stage_recall import _config, _resident_row_kernel
        return _resident_row_kernel, _config(width - FORCED, width, FORCED, CPU_LIST, 8, 16, 128, False,
                                             stage == "fill", "cpu" if stage == "recall" else None, False, True, 2,
                                             True, 4, TABLE_BLOCKS)
    if stage == "estimate":
        from scout_sglang.kernels.triton.estimate import _config, _estimate_merge_kernel
        return _estimate_merge_kernel, dict(_config(4, 128, width, width), NUM_QO_HEADS=32, SPLITS=1, CPU_PART=True,
                                            WRITE_LSE=True, ZERO_COPY=False)
    raise ValueError(f"unknown stage {stage!r}; known: {', '.join(STAGES)}")


def compile_once(stage: str, width: int, warps: int = 0) -> dict:
    """In the child: compile (at `warps`, 0: the engine's) and report seconds, PTX size, shared memory and warps as
    the last stdout line."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from hopper_compile import compiled_for_hopper

    kernel, constants = kernel_and_constants(stage, width)
    started = time.perf_counter()
    compiled = compiled_for_hopper(kernel, constants, num_warps=warps or None)
    return {"seconds": round(time.perf_counter() - started, 1), "ptx_kb": round(len(compiled.asm["ptx"]) / 1000),
            "shared_kib": round(compiled.metadata.shared / 1024, 1), "warps": compiled.metadata.num_warps}


def engine_warps(stage: str, width: int) -> int:
    """The warps the engine launches `stage` with at `width` (sizes.warps_for)."""
    from scout_sglang.kernels.triton.sizes import warps_for

    return warps_for(kernel_and_constants(stage, width)[1])


def measured(stage: str, width: int, timeout: float, warps: int = 0) -> dict:
    """One compile (at `warps`, 0: the engine's) in a child process without the interpreter: status compiled,
    refused (with the reason) or timeout."""
    row = {"stage": stage, "width": width}
    cache = tempfile.mkdtemp(prefix="kernel-widths-")  # a cold compile: Triton's cache would answer a rerun
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"} | {"TRITON_CACHE_DIR": cache}
    command = [sys.executable, "-P", __file__, "--child", stage, str(width), str(warps)]
    started = time.perf_counter()
    try:
        child = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**row, "status": "timeout", "seconds": round(time.perf_counter() - started, 1)}
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if child.returncode == 0:
        return {**row, "status": "compiled", **json.loads(child.stdout.splitlines()[-1])}
    lines = child.stderr.splitlines()
    reasons = [line for line in lines if "exceeds" in line] or [line for line in lines if "Error" in line]
    return {**row, "status": "refused", "seconds": round(time.perf_counter() - started, 1),
            "reason": (reasons[-1] if reasons else child.stderr[-300:]).strip()}


def sweep(widths: list[int], timeout: float, stages=STAGES) -> list[dict]:
    """Each stage at each width at the engine's warps, and where those are more than Triton's default, at the
    default too (what the engine launched before: the compile time the wider programs save)."""
    from scout_sglang.kernels.triton.sizes import DEFAULT_WARPS

    rows = []
    for stage in stages:
        for width in widths:
            warps = engine_warps(stage, width)
            tried = [measured(stage, width, timeout)]
            if warps != DEFAULT_WARPS:
                tried.append(dict(measured(stage, width, timeout, DEFAULT_WARPS), default_warps=True))
            for row in tried:
                print(f"{stage:9s} {width:5d}  {row['status']:9s} {row.get('seconds', '')} s  "
                      f"{row.get('ptx_kb', '')} kB  {row.get('shared_kib', '')} KiB shared  "
                      f"{row.get('warps', '')} warps  {row.get('reason', '')}", flush=True)
            rows += tried
            if tried[0]["status"] != "compiled":  # wider only gets worse
                break
    return rows


def cell(row: dict) -> str:
    """A table cell: compile time, PTX size, shared memory and warps, or why it did not compile."""
    if row["status"] != "compiled":
        return f"{row['status']} ({row['seconds']} s)"
    return f"{row['seconds']} s, {row['ptx_kb']} kB, {row['shared_kib']} KiB, {row['warps']} warps"


def totals(rows: list[dict], widths: list[int]) -> dict:
    """width -> the stages' compile seconds summed at the engine's warps, and at the default where it differs."""
    out = {}
    for width in widths:
        engine = [row for row in rows if row["width"] == width and not row.get("default_warps")]
        if not engine or any(row["status"] != "compiled" for row in engine):
            continue
        default = {row["stage"]: row for row in rows if row["width"] == width and row.get("default_warps")}
        text = f"{sum(row['seconds'] for row in engine):.0f} s"
        if default and all(row["status"] == "compiled" for row in default.values()):
            before = sum(default.get(row["stage"], row)["seconds"] for row in engine)
            text += f" ({before:.0f} s at the default)"
        out[width] = text
    return out


def markdown(rows: list[dict], widths: list[int], timeout: float, version: str = "") -> str:
    lines = ["# How wide a row the Triton stages compile for (sm_90, compiled here without a GPU)", "",
             "`python -P benchmarks/kernel_widths.py`: each stage compiled at each row width with Triton's real "
             f"backend (nothing runs), {timeout:g} s allowed per compile; a stage is not tried wider after a "
             "timeout or a refusal. Each cell: compile time, PTX size, shared memory per program (an H100 or "
             f"H200 gives a program up to {SHARED_LIMIT_KIB} KiB). A table of {TABLE_BLOCKS} blocks (64k tokens at "
             "blocks of 16): a 64k request has 4093 blocks outside its window. Up to 256 columns the stages "
             "compare lists all pairs; wider, they count through histograms of block ids and sort the victim "
             "order (the split's lists at 256 are already wider: the row and the window). A program holding such a "
             "wide row launches with more warps than Triton's default (kernels/triton/sizes.warps_for): the second "
             f"line of a stage is the same compile at the default, what the engine launched before. Compiled with Triton "
             f"{version}: the compile times depend on its version.",
             "", "| stage | warps | " + " | ".join(str(width) for width in widths) + " |",
             "|---|---|" + "---:|" * len(widths)]
    for stage in dict.fromkeys(row["stage"] for row in rows):
        for default in (False, True):
            picked = {row["width"]: row for row in rows
                      if row["stage"] == stage and bool(row.get("default_warps")) == default}
            if default and not picked:
                continue
            cells = ["not tried" if width not in picked else cell(picked[width]) for width in widths]
            label = "the default (4)" if default else "the engine's"
            lines.append(f"| {stage} | {label} | " + " | ".join(cells) + " |")
    lines += ["", "All five stages' first compile, one after another (as a process compiles them), at each width: "
              + "; ".join(f"{width}: {total}" for width, total in totals(rows, widths).items()) + "."]
    reasons = {row["reason"] for row in rows if row.get("reason")}
    if reasons:
        lines += ["", "Refused because: " + "; ".join(sorted(reasons))]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", default="128,256,512,1024,4096")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds allowed per compile")
    parser.add_argument("--quick", action="store_true", help="width 32, select and split only; writes nothing")
    parser.add_argument("--out", default=str(RESULTS), help="folder for kernel_widths.{json,md}")
    parser.add_argument("--child", nargs=3, metavar=("STAGE", "WIDTH", "WARPS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(compile_once(args.child[0], int(args.child[1]), int(args.child[2]))))
        return 0
    try:
        widths = sorted({int(width) for width in args.widths.split(",")})
    except ValueError:
        parser.error(f"--widths must be comma-separated integers, got {args.widths!r}")
    if not widths or widths[0] <= FORCED:
        parser.error(f"--widths must be > {FORCED} (the forced blocks), got {args.widths!r}")
    if args.quick:
        rows = sweep([32], args.timeout, ("select", "split"))
    else:
        rows = sweep(widths, args.timeout)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        import triton

        (out / "kernel_widths.json").write_text(json.dumps({"timeout_s": args.timeout, "triton": triton.__version__,
                                                            "rows": rows}, indent=1))
        (out / "kernel_widths.md").write_text(markdown(rows, widths, args.timeout, triton.__version__))
    print(json.dumps({"timeout_s": args.timeout, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
