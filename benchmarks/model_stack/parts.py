"""The GPU benchmark's parts on the model stack: the headline (tokens/s at equal device memory) and equal batch.

Each returns a dict for the report and stops starting new measurements when the call's deadline comes near
(`deadline`: a time.perf_counter() value); what did not run says why.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from .headline import headline_budgets, host_free_bytes, model_spec, planned_batch, projection
from .qwen3 import TINY, Qwen3Shape
from .run import SPLIT_WARMUP_STEPS, StackRun

GIB = 2**30
TOP_KERNELS = 6  # the kernels of a replayed step a row names, by device time


def stack_shape(setup, layers: int | None = None) -> Qwen3Shape:
    """Qwen3-8B's layer (or the dry run's tiny one) with `layers` layers (default: the model's 36)."""
    if setup.dry:
        return TINY
    spec = model_spec()
    return Qwen3Shape(num_layers=layers or spec.num_layers, hidden_size=spec.hidden_size,
                      intermediate_size=spec.intermediate_size, num_qo_heads=spec.num_qo_heads,
                      num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim)


def stack_steps(steps: int) -> int:
    """The decode steps a configuration timed over `steps` makes (its stores are sized for them): a warm-up, the
    timed steps, as many overlapped (StackRun.measure), and the GPU-busy replays (busy_without_wait)."""
    return 2 * steps + 3


def run_config(setup, shape, mode, batch, context, *, workload="heavy", steps=None, kernel_impl=None,
               cpu_split="off", **config_fields) -> dict:
    """Build, prefill, capture and time one configuration -> its row (or its error). cpu_split: the engine's
    SCOUT_CPU_SPLIT (scout: the device reads a share of each CPU list from the host store itself); config_fields:
    other ScoutConfig fields (resident_first, resident_pool_blocks)."""
    steps = steps or setup.steps
    started = time.perf_counter()
    run = None
    try:
        warmup = SPLIT_WARMUP_STEPS if cpu_split == "auto" else 0  # measure() settles an auto split's caps first
        run = StackRun(shape, mode=mode, batch=batch, context=context, steps=stack_steps(steps) + warmup,
                       workload=workload,
                       block_size=setup.block, token_budget=setup.budget, device=setup.device,
                       kernel_impl=kernel_impl or ("triton" if setup.dry else None), cpu_split=cpu_split,
                       **config_fields)
        run.capture()
        row = run.measure(steps)
        row["gpu_busy"] = busy_without_wait(run) if run.graph is not None else None
        row["seconds"] = round(time.perf_counter() - started, 1)
        row["host_peak_rss_gib"] = host_peak_rss_gib()
        fields = dict(config_fields, **({} if cpu_split == "off" else {"cpu_split": cpu_split}))
        log(f"{mode} x{batch} at {context}{' ' + str(fields) if fields else ''}: {row['step_ms']} ms a step, "
            f"{row['seconds']} s in all")
        return row
    except Exception as error:  # noqa: BLE001 - reported in the row, the part goes on
        log(f"{mode} x{batch} at {context}: {type(error).__name__}: {error}"[:300])
        return dict(mode=mode, batch=batch, context=context, cpu_split=cpu_split, **config_fields,
                    error=f"{type(error).__name__}: {error}"[:400])
    finally:
        if run is not None:
            run.close()


def log(message: str) -> None:
    """Progress on stderr, a line a measured configuration (a lent machine's call shows how far it got)."""
    print(f"[bench_gpu] {message}", file=sys.stderr, flush=True)


def host_peak_rss_gib() -> float | None:
    """The process's peak resident host memory so far (VmHWM), GiB: what the host budget must leave room for."""
    try:
        line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return None
    return round(int(line.split()[1]) * 1024 / GIB, 2)


def busy_without_wait(run) -> dict | None:
    """The GPU's kernel time over one replayed step's wall time, with and without the wait kernel (the device
    waiting for the CPU part), from the profiler."""
    from torch.profiler import ProfilerActivity, profile

    run._next_inputs()
    graph = run.begin()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    run.engine.end_step(read=False)
    kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    total = sum(e.self_device_time_total for e in kernels) / 1e6
    wait = sum(e.self_device_time_total for e in kernels if "wait" in e.key.lower()) / 1e6
    top = sorted(kernels, key=lambda e: -e.self_device_time_total)[:TOP_KERNELS]
    return dict(busy=round(total / wall, 3), busy_without_wait=round((total - wait) / wall, 3),
                wait_kernel_ms=round(1e3 * wait, 3),
                top_kernels_ms={e.key[:60]: round(e.self_device_time_total / 1e3, 3) for e in top}) if wall else None


HEADLINE_ENTRIES = ("full", "scout", "scout_split")  # measured in this order until the call's time runs out


def planned_pool(capacity, budgets: dict) -> dict:
    """Resident-first's pool at scout's batch within the device budget, as a server sizes it (the planner's
    capacity.resident_pool): the budget less scout's other device stores, in pages of one block of every offloaded
    layer."""
    from scout_sglang.config import ScoutConfig
    from scout_sglang.plan.capacity import resident_pool

    config = ScoutConfig(mode="scout", block_size=32, token_budget=2048)
    sizing = resident_pool(config, model_spec(), itemsize=2, capacity=capacity,
                           device_budget=budgets["device_budget_bytes"])
    if sizing is None:
        raise RuntimeError("scout holds no request in the device budget, so there is no resident pool to size")
    return {key: sizing[key] for key in ("pages", "limit", "request_pages", "exact_requests")}


def equal_memory(setup, args) -> dict:
    """The equal-memory comparison's shape: context, budgets, and each mode's (batch, limit) and capacity by the
    planner (the dry run: tiny fixed figures, no capacities)."""
    context = setup.contexts[-1]
    if setup.dry:
        budgets = dict(request_tokens=context + 16, device_budget_bytes=2 * (context + 16) * 2 * TINY.num_layers *
                       TINY.num_kv_heads * TINY.head_dim * 4, host_budget_bytes=2**26)
        return dict(context=context, budgets=budgets, batches={"full": (2, "dry run"), "scout": (3, "dry run")},
                    capacities=None)
    budgets = headline_budgets(context=context, host_free_bytes=host_free_bytes(),
                               device_budget_bytes=int(args.kv_budget_gib * GIB) if args.kv_budget_gib else None)
    capacities = {mode: planned_batch(mode, budgets, context=context) for mode in ("full", "scout")}
    return dict(context=context, budgets=budgets, capacities=capacities,
                batches={mode: (capacity.max_batch, capacity.limit) for mode, capacity in capacities.items()})


def part_headline(setup, args, deadline: float) -> dict:
    """Tokens/s at equal device memory at the longest context: full at the largest batch the device budget holds,
    scout at the largest the same budget and the host hold, both measured on the whole stack; then scout at that
    batch with the CPU split (resident-first at that batch is the resident part's last row: its first step
    compiles for minutes)."""
    plan = equal_memory(setup, args)
    context, budgets, batches = plan["context"], plan["budgets"], plan["batches"]
    out = dict(context=context, model="Qwen3-8B" if not setup.dry else "tiny", layers=stack_shape(setup).num_layers,
               device_kv_budget_gib=round(budgets["device_budget_bytes"] / GIB, 2),
               host_kv_budget_gib=round(budgets["host_budget_bytes"] / GIB, 1),
               weights="random (bf16)", selection="synthetic: the heavy-hitter workload")
    batches["scout_split"] = batches["scout"]  # the same batch, with the CPU split on (SCOUT_CPU_SPLIT=auto)
    for entry in HEADLINE_ENTRIES:
        batch, limit = batches[entry]
        if batch < 1:
            out[entry] = dict(batch=0, limit=limit, skipped="not even one request fits")
            continue
        if time.perf_counter() > deadline:
            out[entry] = dict(batch=batch, limit=limit, skipped="the call's time budget ran out")
            continue
        mode, split = ("scout", "auto") if entry == "scout_split" else (entry, "off")
        out[entry] = dict(batch=batch, limit=limit) | run_config(setup, stack_shape(setup), mode, batch, context,
                                                                 cpu_split=split)
    full = out.get("full", {})
    for entry, key in (("scout", "scout_over_full"), ("scout_split", "scout_split_over_full")):
        if "tokens_per_s" in full and "tokens_per_s" in out.get(entry, {}):
            out[key] = round(out[entry]["tokens_per_s"] / full["tokens_per_s"], 2)
    # the dry run projects a 128 GiB host at its tiny context: the same code, so a slip in it shows here
    host_gib = 128 if setup.dry else budgets["host_budget_bytes"] / 0.9 / GIB
    out["projection"] = projections(setup, out.get("scout", {}), host_gib, context)
    return out


def projections(setup, scout: dict, host_gib: float, context: int) -> dict:
    """The planner's step model (a projection), fed the measured CPU part's in-engine rate and change rate: for
    this box (to set against the measurement) and for a whole 80 GB H100 with a 1 TiB host."""
    measured_gbs = (scout.get("cpu_part") or {}).get("in_engine_gbs")
    change = scout.get("change_rate")
    gpu = "H200" if setup.device.type == "cuda" and "H200" in torch.cuda.get_device_name() else "H100"
    out = dict(label="projection: the planner's step model (scout_sglang.plan) with the measured in-engine CPU GB/s "
                     f"({measured_gbs}) and change rate ({change}), not a measurement")
    try:
        out["this_box"] = projection(gpu, host_gib=host_gib, gpu_memory_gib=None,
                                     cpu_gbs=measured_gbs, change_rate=change, context=context)
        out["h100_80gb_1tib_host"] = projection("H100", host_gib=1024, gpu_memory_gib=None, cpu_gbs=measured_gbs,
                                                change_rate=change, context=context)
    except Exception as error:  # noqa: BLE001 - reported
        out["error"] = f"{type(error).__name__}: {error}"[:400]
    return out


def fits(setup, mode: str, shape, batch: int, context: int) -> tuple[bool, str]:
    """Whether a configuration's K/V fits: full's on the device beside the weights, scout's store in the host."""
    if setup.dry:
        return True, ""
    per_token = 2 * shape.num_kv_heads * shape.head_dim * 2  # K and V of one layer, bf16
    weights = shape.num_layers * shape.weight_bytes()
    if mode in ("full", "quest"):
        need, free = batch * context * per_token * shape.num_layers + weights, torch.cuda.mem_get_info()[0]
        return need < 0.85 * free, f"{need / GIB:.0f} GiB of device memory, {free / GIB:.0f} free"
    need, free = batch * context * per_token * (shape.num_layers - 1), host_free_bytes()
    return need < 0.8 * free, f"{need / GIB:.0f} GiB of host memory, {free / GIB:.0f} free"


def part_equal_batch(setup, args, deadline: float) -> dict:
    """Scout and full at each context and batch that fits, on a stack of `--equal-batch-layers` layers of Qwen3-8B's
    shape (its per-layer costs: 36 layers at batch 32 would need 150 GB of K/V); the other three modes at one
    shape; the flat workload (the stress case) for scout at one shape."""
    shape = stack_shape(setup, args.equal_batch_layers)
    configs = [(mode, batch, context, "heavy") for context in setup.contexts for batch in setup.batches
               for mode in ("full", "scout")]
    configs += [(mode, setup.batches[0], setup.contexts[0], "heavy") for mode in ("quest", "infinigen", "hgca")]
    configs += [("scout", setup.batches[0], setup.contexts[0], "flat")]
    configs = [config + ("off",) for config in configs]
    # the CPU split against off, at the second batch (32 on a GPU), on both workloads
    batch = setup.batches[min(1, len(setup.batches) - 1)]
    configs += [("scout", batch, setup.contexts[0], workload, "auto") for workload in ("heavy", "flat")]
    if (("scout", batch, setup.contexts[0], "flat", "off")) not in configs:
        configs.append(("scout", batch, setup.contexts[0], "flat", "off"))
    rows = []
    for mode, batch, context, workload, split in configs:
        ok, why = fits(setup, mode, shape, batch, context)
        if not ok:
            rows.append(dict(mode=mode, batch=batch, context=context, workload=workload, skipped=f"does not fit: {why}"))
            continue
        if time.perf_counter() > deadline:
            rows.append(dict(mode=mode, batch=batch, context=context, workload=workload,
                             skipped="the call's time budget ran out"))
            continue
        rows.append(run_config(setup, shape, mode, batch, context, workload=workload, cpu_split=split))
    ratios = {}
    for row in rows:
        full = next((r for r in rows if r.get("mode") == "full" and r.get("batch") == row.get("batch")
                     and r.get("context") == row.get("context") and "step_ms" in r), None)
        split = "" if row.get("cpu_split", "off") == "off" else "+split"
        if row.get("mode") != "full" and full and "step_ms" in row and row.get("workload") == "heavy":
            ratios[f"{row['mode']}{split}@{row['context']}x{row['batch']}"] = round(row["step_ms"] / full["step_ms"], 3)
    return dict(layers=shape.num_layers, rows=rows, step_ratio_to_full=ratios, split_against_off=split_ratios(rows))


def split_ratios(rows) -> dict:
    """Scout's step with the CPU split on over the same configuration with it off, per workload and shape."""
    out = {}
    for row in rows:
        if row.get("cpu_split", "off") == "off" or "step_ms" not in row:
            continue
        off = next((r for r in rows if r.get("mode") == row["mode"] and r.get("cpu_split", "off") == "off"
                    and (r.get("batch"), r.get("context"), r.get("workload")) ==
                    (row["batch"], row["context"], row["workload"]) and "step_ms" in r), None)
        if off is not None:
            out[f"{row['workload']}@{row['context']}x{row['batch']}"] = round(row["step_ms"] / off["step_ms"], 3)
    return out
