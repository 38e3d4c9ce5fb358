"""The recall study's files: recall.md (workloads, verdicts per configuration) and recall.png (CPU ratio and
recall traffic per step, each workload a column: the paper's Figure 6 beside the link budget)."""

from __future__ import annotations

from pathlib import Path


def write_recall_markdown(path: Path, study: dict, hardware: dict, beta: float) -> None:
    heavy, flat = study["heavy"], study["flat"]
    lines = [
        "# Recall that pays for itself: CPU ratio and recall traffic per step",
        "",
        f"Hardware: device {hardware.get('gpu', hardware.get('device', '?'))}, {hardware.get('cores', '?')} cores of "
        f"{hardware.get('cpu_model', '?')}; CPU worker: {hardware.get('cpu_pool', '?')}. Scout, context {study['context']}, batch {study['batch_size']}, "
        f"{study['steps']} decode steps from the first, every configuration interleaved on the same inputs "
        "(`benchmarks/bench_decode_step.py`, its recall study).",
        "",
        f"- **heavy hitters**: Zipf importance (rank^-{heavy['zipf']}), strength {heavy['strength']}, "
        f"{heavy['topics']} topic directions drifting at {heavy['drift']} per step, prediction error at cosine "
        f"{heavy['target_cosine']} (AR(1), as slow as the drift);",
        f"- **flat** (the stress case): random block biases, query AR(1) rho {flat['query_rho']}, fresh prediction "
        f"noise {flat['predict_noise']} per step.",
        "",
        f"\"under beta from\": the first step from which the CPU ratio, averaged over the last 8 steps, stays under "
        f"recall_beta = {beta} to the end (- : never). \"cap use\": the largest recall bytes of any step over that step's cap. \"steady step\": "
        "median of the second half of the steps; \"vs off\": recall off's steady step over this one (above 1: "
        "faster than recall off).",
        "",
    ]
    for name, section in study["workloads"].items():
        lines += [f"## {name} workload (predicted-query cosine {section['predict_cosine']:.3f})", "",
                  "| configuration | change rate | CPU ratio (2nd half) | under beta from | recall MB/step | cap use "
                  "| brake: rows backed off | steady step ms | min-max | vs off |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in section["rows"]:
            v = r["verdict"]
            backed_off = sum(r["curve"]["backed_off"]) / max(len(r["curve"]["backed_off"]), 1)
            lines.append(
                f"| {r['label']} | {v['steady_change_rate']:.1%} | {v['steady_cpu_ratio']:.1%} | "
                f"{'-' if v['converged_at'] is None else v['converged_at']} | {v['recall_mb_per_step']:.2f} | "
                f"{v['max_cap_use']:.2f} | {backed_off:.1%} | {v['steady_step_ms']:.1f} | "
                f"{v['steady_spread_ms'][0]:.0f}-{v['steady_spread_ms'][1]:.0f} | {v['speed_vs_off']:.2f}x |")
        lines += ["", "Where the step's time goes (per step, medians over the timed steps): the CPU part's K+V, the "
                  "workers' attend time and their CPU time (above attend: spinning and waking), the device's wait for "
                  "the CPU part, the layer before the first layer's end, and the workers' read rate while attending.",
                  "", "| configuration | CPU part MB | attend ms | workers' CPU ms | wait ms | layer 0 ms | in-engine GB/s |",
                  "|---|---|---|---|---|---|---|"]
        for r in section["rows"]:
            cpu_ms, gbs = r.get("cpu_thread_ms_per_step"), r.get("in_engine_gbs")
            lines.append(
                f"| {r['label']} | {r.get('cpu_part_mb_per_step', 0.0):.2f} | {r['cpu_busy_ms']:.2f} | "
                f"{'-' if cpu_ms is None else f'{cpu_ms:.2f}'} | {r['breakdown_ms'].get('cpu_wait', 0.0):.2f} | "
                f"{r['layer0_ms']:.2f} | {'-' if gbs is None else f'{gbs:.1f}'} |")
        lines.append("")
    lines += ["![recall per step](recall.png)", ""]
    path.write_text("\n".join(lines))


def write_recall_plot(path: Path, study: dict, beta: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(study["workloads"].items())
    fig, axes = plt.subplots(2, len(workloads), figsize=(6 * len(workloads), 7), squeeze=False)
    for column, (name, section) in enumerate(workloads):
        top, bottom = axes[0][column], axes[1][column]
        for r in section["rows"]:
            curve = r["curve"]
            steps = range(len(curve["cpu_ratio"]))
            top.plot(steps, curve["cpu_ratio"], label=r["label"])
            if r["label"] != "recall off":
                bottom.plot(steps, [b / 1e6 for b in curve["recall_bytes"]], label=r["label"])
        brake = next(r for r in section["rows"] if r["label"] == "recall + brake")
        bottom.plot(range(len(brake["curve"]["recall_cap_bytes"])),
                    [c / 1e6 for c in brake["curve"]["recall_cap_bytes"]], "k--", label="cap (recall + brake)")
        top.axhline(beta, color="gray", linestyle=":", label=f"recall_beta {beta}")
        top.set_title(f"{name}: CPU ratio per step")
        top.set_ylim(0, 1)
        bottom.set_title(f"{name}: recall MB per step")
        bottom.set_xlabel("decode step")
        bottom.set_yscale("symlog", linthresh=0.01)
        top.legend(fontsize=7)
        bottom.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
