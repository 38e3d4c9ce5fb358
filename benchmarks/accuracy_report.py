"""The accuracy benchmark's report: markdown tables and the plot (bench_accuracy.py measures)."""

from __future__ import annotations

from pathlib import Path

MODES = ("full", "quest", "infinigen", "hgca", "scout")


def _pct(row) -> str:
    return f"{100 * row['accuracy']:.1f} [{100 * row['low']:.0f}, {100 * row['high']:.0f}]"


def _drop(d) -> str:
    return f"{d['points']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}]"


def markdown(rows, drops, verdict, meta) -> str:
    lines = [f"# Long-context suite accuracy ({meta['model']}, {meta['device']})", "",
             f"{meta['samples']} held-out sequences per task and context through the engine's reference decoder "
             f"(every mode on the same sequences), {meta.get('server_samples', 0)} of them through the SGLang "
             "server. Cells: exact match % [95% Wilson interval]. Drops: paired, in points, positive when the mode "
             "is worse [95% interval]. Dense layers " + str(meta.get("dense_layers")) + ", blocks of 16.", ""]
    for path, title in (("engine", "Engine (reference decoder)"), ("server", "SGLang server, OpenAI API")):
        keys = sorted({(r["task"], r["context"], r["fraction"]) for r in rows if r["path"] == path})
        if not keys:
            continue
        table = {(r["task"], r["context"], r["fraction"], r["mode"]): r for r in rows if r["path"] == path}
        lines += [f"## {title}", "", "| task | context | budget | " + " | ".join(MODES) + " |",
                  "|---|---:|---:|" + "---:|" * len(MODES)]
        for task, context, fraction in keys:
            cells = [_pct(table[(task, context, fraction, m)]) if (task, context, fraction, m) in table else "-"
                     for m in MODES]
            lines.append(f"| {task} | {context} | 1/{fraction} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Drop against Full (points, paired)", "", "| path | task | context | budget | " +
              " | ".join(MODES[1:]) + " |", "|---|---|---:|---:|" + "---:|" * (len(MODES) - 1)]
    against_full = {(d["path"], d["task"], d["context"], d["fraction"], d["mode"]): d for d in drops
                    if d["against"] == "full"}
    for path, task, context, fraction in sorted({k[:4] for k in against_full}):
        cells = [_drop(against_full[(path, task, context, fraction, m)])
                 if (path, task, context, fraction, m) in against_full else "-" for m in MODES[1:]]
        lines.append(f"| {path} | {task} | {context} | 1/{fraction} | " + " | ".join(cells) + " |")
    noise = [d for d in drops if d["path"] == "noise"]
    if noise:
        cosines = sorted({d["prediction_cosine"] for d in noise}, reverse=True)
        lines += ["", f"## Prediction-noise sweep: Scout at 1/{noise[0]['fraction']} with the real query blended "
                  "with noise to a cosine c, drop against Quest (the same-layer query), points", "",
                  "| task | context | " + " | ".join(f"c = {c}" for c in cosines) + " |",
                  "|---|---:|" + "---:|" * len(cosines)]
        by = {(d["task"], d["context"], d["prediction_cosine"]): d for d in noise}
        for task, context in sorted({(d["task"], d["context"]) for d in noise}):
            lines.append(f"| {task} | {context} | " + " | ".join(_drop(by[(task, context, c)]) if (task, context, c)
                                                                  in by else "-" for c in cosines) + " |")
    lines += cosine_lines(rows) + ["", "## Checks", "",
                                   f"- separates the modes at 1/16 (a sparse mode > 3 points below Full): "
                                   f"{verdict['separates_at_1_16'] or 'no'}",
                                   f"- Scout within 1 point of Full at 1/8 on every task: {verdict['scout_within_1_at_1_8']}",
                                   f"- Scout within 3 points of Full at 1/16 on every task: {verdict['scout_within_3_at_1_16']}",
                                   f"- Scout's drops (points): {verdict['scout_drop_points']}"]
    return "\n".join(lines) + "\n"


def cosine_lines(rows) -> list[str]:
    """Scout's layer-ahead predicted query against the real one (mean cosine over decode steps), per layer."""
    scout = [r for r in rows if r["path"] == "engine" and r["mode"] == "scout" and r.get("query_cosine")]
    if not scout:
        return []
    layers = sorted({layer for r in scout for layer in r["query_cosine"]}, key=int)
    lines = ["", "## Layer-ahead predicted query vs the real one (Scout, mean cosine over decode steps)", "",
             "| task | context | budget | " + " | ".join(f"layer {layer}" for layer in layers) + " | mean |",
             "|---|---:|---:|" + "---:|" * (len(layers) + 1)]
    for r in scout:
        values = [r["query_cosine"].get(layer, float("nan")) for layer in layers]
        lines.append(f"| {r['task']} | {r['context']} | 1/{r['fraction']} | "
                     + " | ".join(f"{v:.3f}" for v in values) + f" | {sum(values) / len(values):.3f} |")
    return lines


def plot(rows, drops, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    engine = [r for r in rows if r["path"] == "engine"]
    task_list = sorted({r["task"] for r in engine})
    context = max(r["context"] for r in engine)
    figure, axes = plt.subplots(1, len(task_list) + 1, figsize=(4 * (len(task_list) + 1), 3.8), squeeze=False)
    for axis, task in zip(axes[0], task_list):
        for mode in MODES:
            points = sorted((r["fraction"], r["accuracy"], r["low"], r["high"]) for r in engine
                            if r["task"] == task and r["mode"] == mode and r["context"] == context)
            if not points:
                continue
            xs = [1 / f for f, *_ in points]
            ys = [100 * a for _, a, _, _ in points]
            errors = [[100 * (a - lo) for _, a, lo, _ in points], [100 * (hi - a) for _, a, _, hi in points]]
            axis.errorbar(xs, ys, yerr=errors, marker="o", capsize=2, label=mode)
        axis.set_xscale("log", base=2)
        axis.set_title(f"{task}, {context} tokens")
        axis.set_xlabel("budget (share of the context)")
        axis.set_ylabel("exact match (%)")
        axis.set_ylim(-2, 102)
    axes[0][0].legend(fontsize=8)
    axis = axes[0][-1]
    noise = [d for d in drops if d["path"] == "noise" and d["context"] == context]
    for task in sorted({d["task"] for d in noise}):
        points = sorted((d["prediction_cosine"], d["points"]) for d in noise if d["task"] == task)
        axis.plot([c for c, _ in points], [p for _, p in points], marker="o", label=task)
    axis.axhline(0, color="gray", linewidth=0.8)
    axis.invert_xaxis()
    axis.set_title("Scout vs Quest as prediction worsens")
    axis.set_xlabel("cosine of the predicted query to the real one")
    axis.set_ylabel("Scout's drop against Quest (points)")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
