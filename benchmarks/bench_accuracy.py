"""Exact-match retrieval accuracy of the five modes across budgets and contexts.

On held-out needle sequences (scout_sglang.retrieval.data) the committed
retrieval model answers through the engine's reference decoder for every
(mode, budget, context), and through the real SGLang server (OpenAI
completions API, --attention-backend scout with SCOUT_MODE=<mode>) at one
budget per context. Writes benchmarks/results/accuracy.{json,md,png} and
reports Scout's drop against Full and against Quest (the gap to Quest is the
cost of predicted queries on the CPU part).

    python -P benchmarks/bench_accuracy.py            # full run (several minutes)
    python -P benchmarks/bench_accuracy.py --quick    # < 1 minute, one budget and context, JSON line last
    python -P benchmarks/bench_accuracy.py --quick --dense-layers 0   # the same with layer 0 kept dense

The bundled model reaches 95% with full attention at 2048 tokens (see its
training_report.json), so the default contexts are 1024 and 2048 and the
budgets cover one eighth of each (128 and 256).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

MODES = ("full", "quest", "infinigen", "hgca", "scout")
RESULTS = Path(__file__).resolve().parent / "results"


def log(message: str) -> None:
    print(f"[accuracy] {message}", file=sys.stderr, flush=True)


def server_env(mode: str, budget: int, dense_layers: str | None = None) -> dict:
    """The settings of one (mode, budget): the tiny preset (blocks of 16, one sink and one local block,
    adaptive recall) with the mode and budget; `dense_layers` ("0", "" for none) overrides the preset's."""
    env = {"SCOUT_CONFIG": "tiny", "SCOUT_MODE": mode, "SCOUT_TOKEN_BUDGET": str(budget), "SCOUT_CPU_GROUPS": "1"}
    if dense_layers is not None:
        env["SCOUT_DENSE_LAYERS"] = dense_layers
    return env


def engine_config(mode: str, budget: int, dense_layers: str | None = None):
    """The same settings for the reference decoder, read the way the server reads them."""
    from scout_sglang.env import config_from_env

    return config_from_env(server_env(mode, budget, dense_layers))


def run_engine(model, contexts, budgets, samples_per_context, dense_layers=None) -> list[dict]:
    from scout_sglang.retrieval.evaluate import engine_run, held_out

    rows = []
    for context in contexts:
        samples = held_out(samples_per_context, context)
        full = None  # full attention ignores the budget: measured once per context
        for budget in budgets:
            for mode in MODES:
                if mode == "full" and full is not None:
                    rows.append(dict(full, budget=budget))
                    continue
                start = time.perf_counter()
                correct, cosines = engine_run(model, samples, engine_config(mode, budget, dense_layers))
                accuracy = sum(correct) / len(correct)
                rows.append({"path": "engine", "mode": mode, "context": context, "budget": budget,
                             "accuracy": accuracy, "samples": len(samples)})
                if cosines:
                    rows[-1]["query_cosine"] = {str(layer): round(value, 4) for layer, value in cosines.items()}
                full = rows[-1] if mode == "full" else full
                log(f"engine  context {context:5d}  budget {budget:5d}  {mode:9s} {accuracy:6.1%} "
                    f"({time.perf_counter() - start:.1f} s)")
    return rows


def run_server(model_dir, contexts, budget_for, samples_per_context, log_dir: Path, dense_layers=None) -> list[dict]:
    from scout_sglang.retrieval.evaluate import held_out, server_accuracy
    from scout_sglang.server.launch import launched_server

    rows = []
    log_dir.mkdir(parents=True, exist_ok=True)
    args = ("--attention-backend", "scout", "--dtype", "float32", "--max-total-tokens", "32768",
            "--max-running-requests", "8", "--disable-radix-cache")
    for mode in MODES:
        for context in contexts:
            budget = budget_for(context)
            with launched_server(model_dir, *args, env=server_env(mode, budget, dense_layers),
                                 log_path=log_dir / f"server-{mode}-{context}.log") as base:
                accuracy = server_accuracy(base, held_out(samples_per_context, context))
            rows.append({"path": "server", "mode": mode, "context": context, "budget": budget,
                         "accuracy": accuracy, "samples": samples_per_context})
            log(f"server  context {context:5d}  budget {budget:5d}  {mode:9s} {accuracy:6.1%}")
    return rows


def scout_drops(rows) -> list[dict]:
    table = {(r["path"], r["context"], r["budget"], r["mode"]): r["accuracy"] for r in rows}
    drops = []
    for (path, context, budget, mode), accuracy in sorted(table.items()):
        if mode == "scout":
            drops.append({"path": path, "context": context, "budget": budget, "scout": accuracy,
                          "drop_vs_full_points": round(100 * (table[(path, context, budget, "full")] - accuracy), 2),
                          "drop_vs_quest_points": round(100 * (table[(path, context, budget, "quest")] - accuracy), 2)})
    return drops


def markdown(rows, drops, meta) -> str:
    lines = [f"# Retrieval accuracy ({meta['model']}, {meta['samples']} held-out sequences per context, "
             f"8 needles, {meta['device']}, dense layers {meta.get('dense_layers', [0])})", "",
             "| path | context | budget | " + " | ".join(MODES) + " |", "|---|---:|---:|" + "---:|" * len(MODES)]
    keys = sorted({(r["path"], r["context"], r["budget"]) for r in rows})
    table = {(r["path"], r["context"], r["budget"], r["mode"]): r["accuracy"] for r in rows}
    for path, context, budget in keys:
        cells = [f"{100 * table[(path, context, budget, m)]:.1f}" if (path, context, budget, m) in table else "-"
                 for m in MODES]
        lines.append(f"| {path} | {context} | {budget} | " + " | ".join(cells) + " |")
    lines += ["", "Scout's drop in points (positive: Scout is worse):", "",
              "| path | context | budget | vs full | vs quest |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {d['path']} | {d['context']} | {d['budget']} | {d['drop_vs_full_points']:.1f} | "
              f"{d['drop_vs_quest_points']:.1f} |" for d in drops]
    return "\n".join(lines + cosine_lines(rows)) + "\n"


def cosine_lines(rows) -> list[str]:
    """Scout's predicted-vs-real query cosine per layer (mean over decode steps), one row per engine cell."""
    scout = [r for r in rows if r["path"] == "engine" and r["mode"] == "scout" and r.get("query_cosine")]
    if not scout:
        return []
    layers = sorted({layer for r in scout for layer in r["query_cosine"]}, key=int)
    lines = ["", "Layer-ahead predicted query vs the real one (cosine, Scout, mean over decode steps):", "",
             "| context | budget | " + " | ".join(f"layer {layer}" for layer in layers) + " |",
             "|---:|---:|" + "---:|" * len(layers)]
    for r in scout:
        lines.append(f"| {r['context']} | {r['budget']} | "
                     + " | ".join(f"{r['query_cosine'].get(layer, float('nan')):.3f}" for layer in layers) + " |")
    return lines


def plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    contexts = sorted({r["context"] for r in rows if r["path"] == "engine"})
    figure, axes = plt.subplots(1, len(contexts), figsize=(5 * len(contexts), 4), squeeze=False)
    for axis, context in zip(axes[0], contexts):
        for mode in MODES:
            points = sorted((r["budget"], r["accuracy"]) for r in rows
                            if r["path"] == "engine" and r["context"] == context and r["mode"] == mode)
            axis.plot([b for b, _ in points], [100 * a for _, a in points], marker="o", label=mode)
            served = [(r["budget"], r["accuracy"]) for r in rows
                      if r["path"] == "server" and r["context"] == context and r["mode"] == mode]
            if served:
                axis.scatter([b for b, _ in served], [100 * a for _, a in served], marker="x", color="black")
        axis.set_xscale("log", base=2)
        axis.set_title(f"context {context} (x: through the SGLang server)")
        axis.set_xlabel("token budget")
        axis.set_ylabel("exact match (%)")
        axis.set_ylim(-2, 102)
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one context and budget, engine only, JSON line last")
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--budgets", type=int, nargs="+", default=[64, 128, 256, 512])
    parser.add_argument("--samples", type=int, default=128, help="held-out sequences per context")
    parser.add_argument("--no-server", action="store_true", help="skip the SGLang server path")
    parser.add_argument("--model", type=Path, default=None, help="model directory (default: the bundled one)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--dense-layers", default=None, metavar="LIST",
                        help="layers kept dense, as SCOUT_DENSE_LAYERS ('0', '' for none; default: the preset's)")
    args = parser.parse_args(argv)

    import torch

    from scout_sglang.retrieval.evaluate import bundled_model_dir, load_model

    model_dir = args.model or bundled_model_dir()
    if args.quick:
        args.contexts, args.budgets, args.samples, args.no_server = [2048], [256], 128, True
    model = load_model(model_dir)
    dense_layers = list(engine_config("scout", args.budgets[0], args.dense_layers).dense_layers)
    log(f"model {model_dir}; contexts {args.contexts}, budgets {args.budgets}, {args.samples} sequences each, "
        f"dense layers {dense_layers}")
    rows = run_engine(model, args.contexts, args.budgets, args.samples, args.dense_layers)
    if not args.no_server:
        rows += run_server(model_dir, args.contexts, lambda context: context // 8, args.samples,
                           args.out / "server-logs", args.dense_layers)
    drops = scout_drops(rows)
    meta = {"model": model_dir.name, "samples": args.samples, "device": "cpu (engine and server)",
            "dense_layers": dense_layers, "torch": torch.__version__}
    if args.quick:
        print(json.dumps({"context": args.contexts[0], "budget": args.budgets[0], "dense_layers": dense_layers,
                          "accuracy": {r["mode"]: r["accuracy"] for r in rows}, **drops[0]}))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "accuracy.json").write_text(json.dumps({"meta": meta, "rows": rows, "scout_drops": drops}, indent=1))
    (args.out / "accuracy.md").write_text(markdown(rows, drops, meta))
    plot(rows, args.out / "accuracy.png")
    log(f"wrote {args.out}/accuracy.{{json,md,png}}")
    print(json.dumps({"scout_drops": drops}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
