"""The markdown report (decode_step.md): hardware, workload, a summary over the
shapes, one breakdown table per shape and the ablation table.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from .common import BLOCK_SIZE, BREAKDOWN, ENGINE_TIMERS, HEAD_DIM, NUM_KV_HEADS, NUM_QO_HEADS


def fmt(value, digits=1):
    return "-" if value is None else f"{value:.{digits}f}"


def spread(row: dict) -> str:
    """Fastest-slowest timed step: the noise a ratio between two rows has to beat."""
    return f"{min(row['step_ms_all']):.0f}-{max(row['step_ms_all']):.0f}"


def sweep_table(rows: list[dict]) -> list[str]:
    head = ("| mode | step ms | min-max | tok/s | vs full | layer 0 | engine | cpu_wait | layer compute"
            " | CPU busy | CPU thread | idle | CPU ratio |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    full = next((r for r in rows if r["mode"] == "full"), None)
    for r in rows:
        b = r["breakdown_ms"]
        speedup = full["step_ms"] / r["step_ms"] if full else None
        lines.append(
            f"| {r['mode']} | {fmt(r['step_ms'])} | {spread(r)} | {fmt(r['tokens_per_s'])} | {fmt(speedup, 2)}x | {fmt(r['layer0_ms'])} | "
            + " | ".join(fmt(b[k]) for k in BREAKDOWN)
            + f" | {fmt(r['cpu_busy_ms'])} | {fmt(r['cpu_thread_ms_per_step'])} | {r['idle_frac']:.1%} | {r['cpu_ratio']:.1%} |"
        )
    return lines


def ablation_table(rows: list[dict]) -> list[str]:
    lines = ["| configuration | step ms | min-max | speedup | engine | cpu_wait | CPU busy | idle"
             " | CPU ratio | recalled blocks/step |", "|---|---|---|---|---|---|---|---|---|---|"]
    base = rows[0]["step_ms"]
    for r in rows:
        b = r["breakdown_ms"]
        lines.append(
            f"| {r['label']} | {fmt(r['step_ms'])} | {spread(r)} | {base / r['step_ms']:.2f}x | "
            + " | ".join(fmt(b[k]) for k in ENGINE_TIMERS)
            + f" | {fmt(r['cpu_busy_ms'])} | {r['idle_frac']:.1%} | {r['cpu_ratio']:.1%} | {fmt(r['recalled_blocks_per_step'])} |"
        )
    return lines


def write_markdown(path: Path, report: dict) -> None:
    hw, wl = report["hardware"], report["workload"]
    on_cpu = hw["device"] == "cpu"
    lines = [
        "# Decode step: time breakdown per mode (Figure 11) and ablation (Figure 12)",
        "",
        "Written by `benchmarks/bench_decode_step.py`; all numbers from one run.",
        "",
        "## Hardware",
        "",
        f"- CPU: {hw['cpu_model']}, {hw['cores']} cores available; host memory read bandwidth "
        f"{hw['host_read_gbs']:.1f} GB/s (measured in this run)",
        f"- torch {hw['torch']}, {hw['torch_threads']} intra-op threads; CPU worker: {hw['cpu_pool']}",
        f"- device: `{hw['device']}`" + (f" ({hw['gpu']})" if "gpu" in hw else ""),
        *([f"- core plan (cpu_worker/core_plan.py): {hw['core_plan']}"] if "core_plan" in hw else []),
        f"- load average (1 min) before / after: {report['load_before']:.2f} / {report['load_after']:.2f}"
        " (the machine is shared; other processes add noise)",
    ]
    if on_cpu:
        lines += [
            "",
            "**The \"device\" here is the CPU itself.** Device attention runs as torch ops "
            f"({hw['torch_threads']} thread) on the same {hw['cores']} cores as the CPU attention worker "
            f"({report['cpu_groups']} thread), and the \"device KV\" is host RAM. Overlap of "
            "device work with CPU work therefore competes for the same cores and the same memory bandwidth: "
            "these numbers show what the engine does per step and what its host-side bookkeeping costs, "
            "not the GPU picture (HBM vs host DRAM, a GPU that computes while the host cores attend). "
            "Ratios between modes measured here do not transfer to a GPU server. Where the CPU worker (native "
            "kernel) is faster than the torch path that plays the device, as here, modes that move work to the CPU "
            "(hgca) gain, and scout's layer-ahead window has little to hide (compare its cpu_wait with and "
            "without layer-ahead in the ablation): the opposite of the GPU regime the method is built for.",
        ]
    else:
        lines += [
            "",
            "On CUDA the engine's timers are host wall times around asynchronous launches (they include a kernel's "
            "run time only where the engine copies a result to the host); the step time is read after "
            "torch.cuda.synchronize and is exact.",
        ]
    lines += [
        "",
        "## Workload",
        "",
        f"- Qwen3-8B attention shape: Hq {NUM_QO_HEADS}, Hkv {NUM_KV_HEADS}, D {HEAD_DIM}, bf16, block {BLOCK_SIZE}; "
        f"**{wl['layers']} layers** (not 36), layer 0 dense (engine default `dense_layers=(0,)`), so the dense "
        f"layer weighs 1/{wl['layers']} of the stack instead of 1/36",
        f"- token budget {wl['token_budget']} ({wl['token_budget'] // BLOCK_SIZE} blocks per request, layer and KV head; "
        "resident buffer and CPU list capacity default to the same)",
        "- keys N(0,1) + a per-(block, KV head) bias N(0, 0.5^2); values N(0,1)",
        f"- queries: AR(1) walk per (layer, request, head), rho {wl['query_rho']} "
        f"(cosine between consecutive steps {wl['step_cosine']:.3f}); predicted query = query + "
        f"{wl['predict_noise']} N(0,1) (cosine to the real query {wl['predict_cosine']:.3f})",
        f"- rest of each layer simulated for {wl['layer_compute_ms']} ms ({wl['layer_compute_kind']}) after its attention",
        f"- per shape: {wl['warmup']} warm-up step, median of {wl['steps']} timed steps; the modes of a shape run "
        "interleaved (one step of each in turn) so background load falls on all alike; every column is its own "
        "median, so the stacked columns add up to the step time only approximately",
    ]
    if wl.get("quest_change_rate") is not None:
        lines.append(f"- selected blocks that change between consecutive steps (quest, real queries): "
                     f"{wl['quest_change_rate']:.1%} (the paper: < 15%)")
    lines += [
        "",
        "Columns (ms per step, eager: no CUDA graph): engine = the step less the wait for the CPU part and the "
        "simulated rest of the layers (the engine's stages, host and device, and its plan); cpu_wait = the wait "
        "for the CPU part (StepTelemetry); layer compute = the simulated rest of the layers. layer 0 = wall time "
        "from begin_step to the end of layer 0's attention (the dense layer plus step set-up, shown because with "
        "few layers it weighs much more than at 36). CPU busy = seconds the CPU worker's threads spent attending, "
        "summed over threads (it overlaps the other columns and is not part of the sum); CPU thread = CPU "
        "seconds of the worker threads per step (/proc, 10 ms ticks). idle = cpu_wait / step, the time the "
        "device waits for the CPU. CPU ratio = CPU-attended blocks / budget blocks.",
        "",
        "## Summary over the shapes",
        "",
        "| mode | speedup vs full (geometric mean) | range | idle (median) | idle (max) | CPU ratio (mean) |",
        "|---|---|---|---|---|---|",
    ]
    for mode in dict.fromkeys(r["mode"] for shape in report["shapes"] for r in shape["modes"]):
        speedups, idles, ratios = [], [], []
        for shape in report["shapes"]:
            full = next((r for r in shape["modes"] if r["mode"] == "full"), None)
            for r in (r for r in shape["modes"] if r["mode"] == mode):
                idles.append(r["idle_frac"])
                ratios.append(r["cpu_ratio"])
                if full:
                    speedups.append(full["step_ms"] / r["step_ms"])
        geo = math.exp(statistics.fmean(math.log(x) for x in speedups)) if speedups else None
        span = f"{min(speedups):.2f}-{max(speedups):.2f}x" if speedups else "-"
        lines.append(f"| {mode} | {fmt(geo, 2)}x | {span} | {statistics.median(idles):.1%} | {max(idles):.1%} | "
                     f"{statistics.fmean(ratios):.1%} |")
    lines += [
        "",
        "## Sweep",
    ]
    for shape in report["shapes"]:
        order = "" if shape["interleaved"] else " (modes one after the other: not enough memory to interleave)"
        lines += ["", f"### context {shape['context']}, batch {shape['batch_size']}{order}", ""]
        lines += sweep_table(shape["modes"])
    for shape in report["skipped"]:
        lines.append(f"\nSkipped: context {shape['context']}, batch {shape['batch_size']} ({shape['why']}).")
    ab = report.get("ablation")
    if ab:
        lines += [
            "",
            f"## Ablation (scout, context {ab['context']}, batch {ab['batch_size']}, {ab['warmup']} warm-up steps, "
            f"median of {ab['steps']})",
            "",
            "Speedup relative to the first row; compare it with the min-max spread of the steps before reading "
            "an effect into it. The paper (Qwen3, GPU): layer-ahead 1.39x, recall a further 1.20x.",
            "",
        ]
        lines += ablation_table(ab["rows"])
    lines += ["", "![breakdown](decode_step.png)", ""]
    path.write_text("\n".join(lines) + "\n")
