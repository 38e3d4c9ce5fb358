"""The accuracy benchmark's report: markdown tables and the plot (bench_accuracy.py measures)."""

from __future__ import annotations

from pathlib import Path

MODES = ("full", "quest", "infinigen", "hgca", "scout")
ESTIMATE = "+est"
VARIANTS = ("full", *(f"{mode}{suffix}" for mode in (*MODES[1:], "oracle") for suffix in ("", ESTIMATE)))


def _pct(row) -> str:
    return f"{100 * row['accuracy']:.1f} [{100 * row['low']:.0f}, {100 * row['high']:.0f}]"


def _partial(row) -> str:
    return f"{100 * row['partial']:.1f} [{100 * row['partial_low']:.0f}, {100 * row['partial_high']:.0f}]"


def _drop(d) -> str:
    return f"{d['points']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}]"


def _variants(rows) -> list[str]:
    present = {r["mode"] for r in rows}
    return [v for v in VARIANTS if v in present]


def _cell_table(rows, path, show) -> list[str]:
    keys = sorted({(r["task"], r["context"], r["fraction"]) for r in rows if r["path"] == path})
    if not keys:
        return []
    table = {(r["task"], r["context"], r["fraction"], r["mode"]): r for r in rows if r["path"] == path}
    variants = _variants([r for r in rows if r["path"] == path])
    lines = ["| task | context | budget | " + " | ".join(variants) + " |", "|---|---:|---:|" + "---:|" * len(variants)]
    for task, context, fraction in keys:
        cells = [show(table[(task, context, fraction, v)]) if (task, context, fraction, v) in table else "-"
                 for v in variants]
        lines.append(f"| {task} | {context} | 1/{fraction} | " + " | ".join(cells) + " |")
    return lines + [""]


def _drop_table(drops, against, variants, path="engine", value=_drop) -> list[str]:
    chosen = {(d["path"], d["task"], d["context"], d["fraction"], d["mode"]): d for d in drops
              if d["against"] == against(d["mode"]) and d["path"] == path}
    variants = [v for v in variants if any(k[4] == v for k in chosen)]
    if not variants:
        return []
    lines = ["| task | context | budget | " + " | ".join(variants) + " |", "|---|---:|---:|" + "---:|" * len(variants)]
    for _, task, context, fraction in sorted({k[:4] for k in chosen}):
        cells = [value(chosen[(path, task, context, fraction, v)]) if (path, task, context, fraction, v) in chosen
                 else "-" for v in variants]
        lines.append(f"| {task} | {context} | 1/{fraction} | " + " | ".join(cells) + " |")
    return lines + [""]


def markdown(rows, drops, verdict, meta) -> str:
    variants = _variants(rows)
    lines = [f"# Long-context suite accuracy ({meta['model']}, {meta['device']})", "",
             f"{meta['samples']} held-out sequences per task and context through the engine's reference decoder "
             f"(every variant on the same sequences), {meta.get('server_samples', 0)} of them through the SGLang "
             "server. `+est`: with the estimate of the unattended blocks (SCOUT_ESTIMATE=on). `oracle`: Quest's "
             "layers selecting by each block's true attention mass (the bound of any scoring at the same budget). "
             "Cells: exact match % [95% Wilson interval]. Drops: paired, in points, positive when the variant is "
             "worse [95% interval]. Dense layers " + str(meta.get("dense_layers")) + ", blocks of 16.", ""]
    lines += ["## Engine (reference decoder): exact match", ""] + _cell_table(rows, "engine", _pct)
    lines += ["## Engine: partial credit (RULER's share of the answer's words found)", ""]
    lines += _cell_table(rows, "engine", _partial)
    server = _cell_table(rows, "server", lambda r: _pct(r) + (f" ({r['same_as_engine']}/{r['samples']})"
                                                              if "same_as_engine" in r else ""))
    if server:
        lines += ["## SGLang server, OpenAI API: exact match (answers equal to the engine's)", ""] + server
    sparse = [v for v in variants if v != "full"]
    lines += ["## Drop against Full (points, paired)", ""]
    for path in ("engine", "server"):
        table = _drop_table(drops, lambda v: "full", sparse, path)
        if table:
            lines += [f"{path}:", ""] + table
    lines += ["## Drop against Full in partial credit (points, paired)", ""]
    lines += _drop_table(drops, lambda v: "full", sparse, "engine",
                         value=lambda d: f"{d['partial_points']:+.1f} [{d['partial_low']:+.1f}, "
                                         f"{d['partial_high']:+.1f}]")
    with_estimate = [v for v in sparse if v.endswith(ESTIMATE)]
    lines += ["## What the estimate changes: each mode with it against itself without (points, paired; negative: "
              "the estimate gains)", ""]
    lines += _drop_table(drops, lambda v: v.removesuffix(ESTIMATE), with_estimate)
    lines += ["## Against Quest: plain Scout (the prediction's cost) and the oracle (Quest's scoring's cost); points, "
              "paired, positive when worse than Quest", ""]
    lines += _drop_table(drops, lambda v: "quest", ["scout", "oracle"])
    noise = [d for d in drops if d["path"] == "noise"]
    if noise:
        cosines = sorted({d["prediction_cosine"] for d in noise}, reverse=True)
        lines += [f"## Prediction-noise sweep: Scout at 1/{noise[0]['fraction']} with the real query blended with "
                  "noise to a cosine c, drop against Quest (the same-layer query; with the estimate, against Quest "
                  "with it), points", "",
                  "| task | context | variant | " + " | ".join(f"c = {c}" for c in cosines) + " |",
                  "|---|---:|---|" + "---:|" * len(cosines)]
        by = {(d["task"], d["context"], d["mode"], d["prediction_cosine"]): d for d in noise}
        for task, context, mode in sorted({(d["task"], d["context"], d["mode"]) for d in noise}):
            lines.append(f"| {task} | {context} | {mode} | " + " | ".join(
                _drop(by[(task, context, mode, c)]) if (task, context, mode, c) in by else "-" for c in cosines) + " |")
    lines += cosine_lines(rows) + ["", "## Targets (issue 47, engine path)", ""] + target_lines(verdict)
    return "\n".join(lines) + "\n"


def target_lines(verdict) -> list[str]:
    def mark(ok):
        return "not measured" if ok is None else "met" if ok else "NOT met"

    worst_estimate, worst_quest = verdict.get("estimate_worst_cell"), verdict.get("scout_worst_against_quest")
    return [
        f"- separates the modes at 1/16 (a sparse mode without the estimate > 3 points below Full): "
        f"{'not measured' if verdict['separates_at_1_16'] is None else verdict['separates_at_1_16'] or 'no'}",
        f"- Scout with the estimate within 2 points of Full at 1/8 on niah, values, chain: "
        f"{mark(verdict['scout_est_within_2_at_1_8'])} ({verdict['scout_est_drop_points'].get(8)})",
        f"- ... within 4 points at 1/16: {mark(verdict['scout_est_within_4_at_1_16'])} "
        f"({verdict['scout_est_drop_points'].get(16)})",
        f"- `common` with Scout and the estimate, at least 90% at 1/8: {mark(verdict['common_at_least_90_at_1_8'])}; "
        f"at least 80% at 1/16: {mark(verdict['common_at_least_80_at_1_16'])} (by budget: "
        f"{verdict['common_scout_est']})",
        f"- Scout with the estimate never more than one sequence in 64 below Scout without it: "
        f"{mark(verdict['estimate_never_costs_more_than_1_in_64'])} (largest drop, points, task, budget: "
        f"{worst_estimate})",
        f"- plain Scout within 2 points of Quest in every cell: {mark(verdict['scout_within_2_of_quest'])} "
        f"(largest drop, points, task, budget: {worst_quest})",
    ]


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
    figure, axes = plt.subplots(1, len(task_list) + 1, figsize=(4.2 * (len(task_list) + 1), 4.2), squeeze=False)
    colors = {mode: f"C{i}" for i, mode in enumerate((*MODES, "oracle"))}
    for axis, task in zip(axes[0], task_list):
        for variant in _variants(engine):
            mode = variant.removesuffix(ESTIMATE)
            points = sorted((r["fraction"], r["accuracy"], r["low"], r["high"]) for r in engine
                            if r["task"] == task and r["mode"] == variant and r["context"] == context)
            if not points:
                continue
            xs = [1 / f for f, *_ in points]
            ys = [100 * a for _, a, _, _ in points]
            errors = [[100 * (a - lo) for _, a, lo, _ in points], [100 * (hi - a) for _, a, _, hi in points]]
            axis.errorbar(xs, ys, yerr=errors, marker="o" if variant.endswith(ESTIMATE) else "x", capsize=2,
                          label=variant, color=colors[mode], linestyle="-" if variant.endswith(ESTIMATE) else ":",
                          linewidth=1.2, markersize=4)
        axis.set_xscale("log", base=2)
        axis.set_title(f"{task}, {context} tokens")
        axis.set_xlabel("budget (share of the context)")
        axis.set_ylabel("exact match (%)")
        axis.set_ylim(-2, 102)
    axes[0][0].legend(fontsize=7, ncol=2)
    axis = axes[0][-1]
    noise = [d for d in drops if d["path"] == "noise" and d["context"] == context]
    for task, mode in sorted({(d["task"], d["mode"]) for d in noise}):
        points = sorted((d["prediction_cosine"], d["points"]) for d in noise if d["task"] == task and d["mode"] == mode)
        axis.plot([c for c, _ in points], [p for _, p in points], marker="o" if mode.endswith(ESTIMATE) else "x",
                  linestyle="-" if mode.endswith(ESTIMATE) else ":", label=f"{task} {mode}")
    axis.axhline(0, color="gray", linewidth=0.8)
    axis.invert_xaxis()
    axis.set_title("Scout vs Quest as prediction worsens")
    axis.set_xlabel("cosine of the predicted query to the real one")
    axis.set_ylabel("Scout's drop against Quest (points)")
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
