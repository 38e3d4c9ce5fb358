"""The figure (decode_step.png): stacked per-step time breakdown of every mode
and shape, with the CPU worker's busy time marked, and the ablation below.
"""

from __future__ import annotations

from pathlib import Path

from .common import BREAKDOWN


def write_plot(path: Path, report: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = report["shapes"]
    colors = dict(engine="#4c72b0", cpu_wait="#c44e52", layer_compute="#937860")
    contexts = sorted({s["context"] for s in shapes})
    ncols = max(1, len(contexts))
    fig = plt.figure(figsize=(5.5 * ncols, 9))
    grid = fig.add_gridspec(2, ncols, height_ratios=[3, 2])

    def stacked(ax, labels, rows, title):
        x = range(len(rows))
        bottom = [0.0] * len(rows)
        for key in BREAKDOWN:
            values = [max(0.0, r["breakdown_ms"][key]) for r in rows]
            ax.bar(x, values, bottom=bottom, color=colors[key], label=key, width=0.8)
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.scatter(x, [r["cpu_busy_ms"] for r in rows], marker="_", s=200, color="black", zorder=3,
                   label="CPU worker busy (overlapped)")
        ax.set_xticks(list(x), labels, rotation=90, fontsize=7)
        ax.set_ylabel("ms per decode step")
        ax.set_title(title, fontsize=9)

    for col, context in enumerate(contexts):
        ax = fig.add_subplot(grid[0, col])
        rows, labels = [], []
        for shape in (s for s in shapes if s["context"] == context):
            for r in shape["modes"]:
                rows.append(r)
                labels.append(f"B{shape['batch_size']} {r['mode']}")
        stacked(ax, labels, rows, f"context {context}")
        if col == 0:
            ax.legend(fontsize=7)
    ab = report.get("ablation")
    if ab:
        ax = fig.add_subplot(grid[1, :])
        stacked(ax, [r["label"] for r in ab["rows"]], ab["rows"],
                f"ablation: scout, context {ab['context']}, batch {ab['batch_size']}")
        for tick in ax.get_xticklabels():
            tick.set_rotation(0)
    device = report["hardware"]["device"]
    fig.suptitle(f"Decode step breakdown, {report['workload']['layers']} layers, device={device}"
                 + (" (the device is the CPU: not the GPU picture)" if device == "cpu" else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
