"""Accuracy of the five modes on the long-context suite, paired, with confidence intervals.

The bundled suite model (ruler-llama, 8 layers) answers held-out sequences of the four tasks of
scout_sglang.retrieval.tasks (niah, values, chain, common):
- through the engine's reference decoder, for every mode at budgets of 1/4, 1/8, 1/16 and 1/32 of the
  context, every mode on the same sequences (paired);
- with the predicted query replaced by the real one blended with noise to cosines 0.95, 0.9, 0.8 and 0.6
  (Scout at 1/16), against Quest (the same-layer query) on the same sequences;
- through the real SGLang server (OpenAI completions API, --attention-backend scout, SCOUT_MODE=<mode>)
  at 1/8 of the context, on a subset of the same sequences.
Per cell: accuracy with a 95% Wilson interval; per comparison: the paired difference in points with a 95%
interval (normal approximation over per-sequence differences). Writes
benchmarks/results/accuracy.{json,md,png}; the checks of the suite (does it separate the modes, is Scout
within 1 point of Full at 1/8 and 3 at 1/16) are reported, not asserted.

    python -P benchmarks/bench_accuracy.py            # full run (about 20 minutes on 2 cores)
    python -P benchmarks/bench_accuracy.py --quick    # a few minutes: 2048 tokens, 1/8 and 1/16, JSON line last
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

MODES = ("full", "quest", "infinigen", "hgca", "scout")
SPARSE = ("quest", "infinigen", "hgca")
RESULTS = Path(__file__).resolve().parent / "results"
EVAL_SEED = 40_000_000  # far from the training seeds of train_suite


def log(message: str) -> None:
    print(f"[accuracy] {message}", file=sys.stderr, flush=True)


def server_env(mode: str, budget: int, dense_layers: str | None = None) -> dict:
    """One (mode, budget) on the tiny preset: blocks of 16, one sink and one local block, layer 0 dense
    (`dense_layers`, as SCOUT_DENSE_LAYERS, overrides that: "0", "" for none)."""
    env = {"SCOUT_CONFIG": "tiny", "SCOUT_MODE": mode, "SCOUT_TOKEN_BUDGET": str(budget), "SCOUT_CPU_GROUPS": "1"}
    if dense_layers is not None:
        env["SCOUT_DENSE_LAYERS"] = dense_layers
    return env


def engine_config(mode: str, budget: int, dense_layers: str | None = None):
    """The same settings for the reference decoder, read the way the server reads them."""
    from scout_sglang.env import config_from_env

    return config_from_env(server_env(mode, budget, dense_layers))


def suite_samples(task: str, count: int, context: int) -> list:
    from scout_sglang.retrieval import tasks

    return tasks.make_batch(task, count, context, seed=EVAL_SEED + 1009 * context + tasks.TASKS.index(task))


def wilson(correct: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion."""
    if total == 0:
        return 0.0, 1.0
    p = correct / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_drop(base: list[bool], other: list[bool], z: float = 1.96) -> dict:
    """base minus other, in points, over the same sequences, with a 95% interval."""
    if len(base) != len(other) or not base:
        raise ValueError("a paired comparison needs the same, non-empty set of sequences")
    diffs = [int(a) - int(b) for a, b in zip(base, other)]
    mean = sum(diffs) / len(diffs)
    spread = math.sqrt(sum((d - mean) ** 2 for d in diffs) / max(1, len(diffs) - 1) / len(diffs))
    return {"points": round(100 * mean, 2), "low": round(100 * (mean - z * spread), 2),
            "high": round(100 * (mean + z * spread), 2)}


def cell(path: str, task: str, mode: str, context: int, fraction: int, correct: list[bool], **extra) -> dict:
    low, high = wilson(sum(correct), len(correct))
    return {"path": path, "task": task, "mode": mode, "context": context, "fraction": fraction,
            "budget": context // fraction, "accuracy": sum(correct) / len(correct), "low": round(low, 4),
            "high": round(high, 4), "samples": len(correct), "correct": "".join("1" if c else "0" for c in correct),
            **extra}


def run_engine(model, tasks_, contexts, fractions, count, cosines, noise_fraction) -> list[dict]:
    from scout_sglang.retrieval.evaluate import engine_run

    rows = []
    for context in contexts:
        for task in tasks_:
            samples = suite_samples(task, count, context)
            start = time.perf_counter()
            full, _ = engine_run(model, samples, engine_config("full", context))
            for fraction in fractions:
                rows.append(cell("engine", task, "full", context, fraction, full))
                for mode in MODES[1:]:
                    correct, layer_cosine = engine_run(model, samples, engine_config(mode, context // fraction))
                    extra = {"query_cosine": {str(k): round(v, 4) for k, v in layer_cosine.items()}} if layer_cosine else {}
                    rows.append(cell("engine", task, mode, context, fraction, correct, **extra))
            for cosine in cosines:
                correct, _ = engine_run(model, samples, engine_config("scout", context // noise_fraction),
                                        prediction_cosine=cosine)
                rows.append(cell("noise", task, "scout", context, noise_fraction, correct, prediction_cosine=cosine))
            summary = {r["mode"] + f"/{r['fraction']}": round(100 * r["accuracy"], 1) for r in rows
                       if r["task"] == task and r["context"] == context and r["path"] == "engine"}
            log(f"engine  {task:6s} context {context}: {summary}  ({time.perf_counter() - start:.0f} s)")
    return rows


def run_server(model_dir, tasks_, context, fraction, count, log_dir: Path) -> list[dict]:
    from scout_sglang.retrieval.evaluate import server_correct
    from scout_sglang.server.launch import launched_server

    rows = []
    log_dir.mkdir(parents=True, exist_ok=True)
    args = ("--attention-backend", "scout", "--dtype", "float32", "--max-total-tokens", str(8 * (context + 64)),
            "--max-running-requests", "8", "--disable-radix-cache")
    for mode in MODES:
        with launched_server(model_dir, *args, env=server_env(mode, context // fraction),
                             log_path=log_dir / f"server-{mode}-{context}.log") as base:
            for task in tasks_:
                correct = server_correct(base, suite_samples(task, count, context))
                rows.append(cell("server", task, mode, context, fraction, correct))
                log(f"server  {task:6s} context {context} 1/{fraction} {mode:9s} {100 * rows[-1]['accuracy']:.1f}%")
    return rows


def comparisons(rows) -> list[dict]:
    """Each sparse mode against Full, and the noise sweep against Quest, paired on the same sequences."""
    table = {(r["path"], r["task"], r["context"], r["fraction"], r["mode"], r.get("prediction_cosine")): r
             for r in rows}

    def bits(row):
        return [c == "1" for c in row["correct"]]

    out = []
    for (path, task, context, fraction, mode, cosine), row in sorted(table.items(), key=str):
        if path == "noise":
            quest = table.get(("engine", task, context, fraction, "quest", None))
            n = min(len(row["correct"]), len(quest["correct"])) if quest else 0
            if n:
                out.append({"path": path, "task": task, "context": context, "fraction": fraction, "mode": mode,
                            "prediction_cosine": cosine, "against": "quest",
                            **paired_drop(bits(quest)[:n], bits(row)[:n])})
        elif mode != "full":
            full = table.get((path, task, context, fraction, "full", None))
            if full:
                out.append({"path": path, "task": task, "context": context, "fraction": fraction, "mode": mode,
                            "against": "full", **paired_drop(bits(full), bits(row))})
    return out


def checks(drops) -> dict:
    """The suite's own checks, over the engine path: does it separate the modes at 1/16; is Scout within
    1 point of Full at 1/8 and within 3 at 1/16 on every task."""
    engine = [d for d in drops if d["path"] == "engine" and d["against"] == "full"]
    separating = [d for d in engine if d["fraction"] == 16 and d["mode"] in SPARSE and d["points"] > 3]
    scout = {f: {d["task"]: d["points"] for d in engine if d["mode"] == "scout" and d["fraction"] == f} for f in (8, 16)}
    return {"separates_at_1_16": sorted({(d["mode"], d["task"]) for d in separating}),
            "scout_within_1_at_1_8": bool(scout[8]) and all(p <= 1 for p in scout[8].values()),
            "scout_within_3_at_1_16": bool(scout[16]) and all(p <= 3 for p in scout[16].values()),
            "scout_drop_points": scout}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="2048 tokens, budgets 1/8 and 1/16, 16 sequences per task, one noise cosine, engine only")
    parser.add_argument("--tasks", nargs="+", default=None, help="default: all four")
    parser.add_argument("--contexts", type=int, nargs="+", default=[2048])
    parser.add_argument("--fractions", type=int, nargs="+", default=[4, 8, 16, 32], help="budget = context / fraction")
    parser.add_argument("--samples", type=int, default=64, help="held-out sequences per task and context")
    parser.add_argument("--cosines", type=float, nargs="+", default=[0.95, 0.9, 0.8, 0.6])
    parser.add_argument("--noise-fraction", type=int, default=16, help="the budget of the noise sweep")
    parser.add_argument("--server-samples", type=int, default=16, help="sequences per task through the server")
    parser.add_argument("--no-server", action="store_true", help="skip the SGLang server path")
    parser.add_argument("--model", type=Path, default=None, help="model directory (default: the bundled ruler-llama)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    import torch

    from scout_sglang.retrieval import tasks
    from scout_sglang.retrieval.evaluate import bundled_model_dir, load_model

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from accuracy_report import markdown, plot

    tasks_ = args.tasks or list(tasks.TASKS)
    if args.quick:
        args.contexts, args.fractions, args.samples, args.cosines, args.no_server = [2048], [8, 16], 8, [0.8], True
    unknown = sorted(set(tasks_) - set(tasks.TASKS))
    if unknown or any(f < 1 for f in args.fractions) or any(not 0 <= c <= 1 for c in args.cosines):
        parser.error(f"tasks must be among {tasks.TASKS}, fractions >= 1, cosines in [0, 1]")
    model_dir = args.model or bundled_model_dir("ruler-llama")
    model = load_model(model_dir)
    dense_layers = list(engine_config("scout", 256).dense_layers)
    log(f"model {model_dir.name}: tasks {tasks_}, contexts {args.contexts}, budgets 1/{args.fractions}, "
        f"{args.samples} sequences each, noise cosines {args.cosines} at 1/{args.noise_fraction}")
    started = time.perf_counter()
    rows = run_engine(model, tasks_, args.contexts, args.fractions, args.samples, args.cosines, args.noise_fraction)
    if not args.no_server:
        rows += run_server(model_dir, tasks_, args.contexts[0], 8, min(args.server_samples, args.samples),
                           args.out / "server-logs")
    drops = comparisons(rows)
    verdict = checks(drops)
    meta = {"model": model_dir.name, "samples": args.samples, "device": "cpu (engine and server)",
            "server_samples": 0 if args.no_server else min(args.server_samples, args.samples),
            "dense_layers": dense_layers, "torch": torch.__version__,
            "seconds": round(time.perf_counter() - started, 1)}
    if args.quick:
        print(json.dumps({"accuracy": {f"{r['task']}/{r['mode']}/1/{r['fraction']}" + (
            f"/c{r['prediction_cosine']}" if r["path"] == "noise" else ""): r["accuracy"] for r in rows},
            **verdict}))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "accuracy.json").write_text(json.dumps({"meta": meta, "rows": rows, "drops": drops,
                                                        "checks": verdict}, indent=1))
    (args.out / "accuracy.md").write_text(markdown(rows, drops, verdict, meta))
    plot(rows, drops, args.out / "accuracy.png")
    log(f"wrote {args.out}/accuracy.{{json,md,png}}")
    print(json.dumps(verdict))
    return 0


if __name__ == "__main__":
    sys.exit(main())
