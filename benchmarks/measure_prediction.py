"""Prediction and recall measurements with the reference decoder (paper section 3):

  1. predicted-vs-real query cosine per layer (the paper's Table 1): layer i's
     input X_i through layer i+1's q_proj (+ q_norm) and RoPE, against layer
     i+1's real query, per request and decode step;
  2. block change rate: the share of the selected blocks of a layer that were
     not selected at the previous step (paper: under 15%), with the predicted
     query (scout's selection) and with the real query (quest mode);
  3. CPU compute ratio (CPU tokens / budget) per layer and decode step, with
     recall off, adaptive (recall when the ratio exceeds beta) and interval
     (per-layer intervals from scout_sglang.profiler, profiled on held-out
     prompts) (the paper's Figure 6a/6b).

Default models: random-weight tiny Qwen3 and Llama (tiny_model, init_std 0.02)
on uniform random token prompts. Random weights say little about trained
models: the report states it next to every comparison with the paper.
`--model-dir` takes a locally saved transformers Llama/Qwen3 model instead.

Progress goes to stderr; the last stdout line is one JSON object. `--quick`
(about a minute) writes nothing else; the full mode writes
benchmarks/results/prediction.{md,json} and prediction_{cpu_ratio,cosine}.png.
Benchmarks do not assert.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from scout_sglang.config import ScoutConfig
from scout_sglang.env import load_preset
from scout_sglang.hf.reference_decoder import ReferenceDecoder
from scout_sglang.profiler import (
    collect_ratios,
    file_prompts,
    load_model,
    mean_curve,
    profile_intervals,
    random_prompts,
    ratios_from_telemetry,
)

RESULTS = Path(__file__).resolve().parent / "results"
PAPER = {
    "cosine": "0.93-0.97 (Qwen3-8B 0.94, Llama-3.1-8B 0.96)",
    "change_rate": "< 15%",
    "cpu_ratio_with_recall": "8.2% on average",
    "cpu_ratio_without_recall": "low at first, rising steadily",
    "mean_interval": "8.7 steps",
}

FULL = dict(layers=8, hidden=256, heads=8, kv_heads=2, head_dim=32, vocab=2048, prompts=4, profile_prompts=2,
            prompt_len=2048, steps=128, block_size=16, max_interval=32)
QUICK = dict(layers=4, hidden=128, heads=4, kv_heads=2, head_dim=32, vocab=1024, prompts=2, profile_prompts=1,
             prompt_len=1024, steps=32, block_size=16, max_interval=16)


def log(message: str) -> None:
    print(f"[measure_prediction] {message}", file=sys.stderr, flush=True)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# -- one decoding run ------------------------------------------------------------
def run(model, config: ScoutConfig, prompts, steps: int, label: str) -> dict:
    """Decode the prompts as one batch; per-layer telemetry series and query cosines."""
    num_layers = model.config.num_hidden_layers
    longest = max(len(p) for p in prompts) + steps + 2 * config.block_size
    decoder = ReferenceDecoder(model, config, max_requests=len(prompts), max_tokens_per_request=longest)
    start = time.perf_counter()
    try:
        result = decoder.generate(prompts, steps + 1)
    finally:
        decoder.close()
    elapsed = time.perf_counter() - start
    telemetry = result.telemetry

    def per_layer_sum(name):
        return [sum(getattr(s.layers[l], name) for s in telemetry if l in s.layers) for l in range(num_layers)]

    changed, compared = per_layer_sum("changed_blocks"), per_layer_sum("compared_blocks")
    cpu, budget = per_layer_sum("cpu_blocks"), per_layer_sum("budget_blocks")
    out = {
        "label": label,
        "seconds": round(elapsed, 1),
        "ratios": ratios_from_telemetry(telemetry, num_layers),  # [steps][layers]
        "cpu_ratio_per_layer": [c / b if b else None for c, b in zip(cpu, budget)],
        "change_rate_per_layer": [c / n if n else None for c, n in zip(changed, compared)],
        "recalled_blocks_per_step": [s.totals().recalled_blocks for s in telemetry],
        "recall_bytes": sum(s.totals().recall_bytes for s in telemetry),
        "cosine_per_layer": {int(l): sum(v) / len(v) for l, v in sorted(result.query_cosine.items()) if v},
        "cosine_min_per_layer": {int(l): min(v) for l, v in sorted(result.query_cosine.items()) if v},
    }
    log(f"{label}: {len(prompts)} x {steps} steps in {elapsed:.1f} s")
    return out


def mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


@torch.no_grad()
def update_to_stream(model, prompt) -> list[float]:
    """Per layer i: mean over positions of |X_(i+1) - X_i| / |X_i| on the residual stream (one prompt).

    The last layer is left out: transformers returns its output after the final norm.
    """
    hidden = model(input_ids=torch.tensor([prompt]), output_hidden_states=True).hidden_states
    return [float(((hidden[i + 1] - hidden[i]).norm(dim=-1) / hidden[i].norm(dim=-1)).mean())
            for i in range(len(hidden) - 2)]


def measure_model(model, description: str, config: ScoutConfig, *, eval_prompts, profile_prompts, steps: int,
                  max_interval: int, quick: bool) -> dict:
    num_layers = model.config.num_hidden_layers
    offloaded = [l for l in range(num_layers) if l not in config.dense_layers]
    log(f"{description}: profiling recall intervals on {len(profile_prompts)} held-out prompt(s)")
    start = time.perf_counter()
    per_request = collect_ratios(model, config, profile_prompts, steps)
    intervals = profile_intervals(per_request, beta=config.recall_beta, max_interval=max_interval,
                                  dense_layers=config.dense_layers, default_interval=config.recall_interval)
    profile_curve = mean_curve(per_request)
    log(f"intervals {intervals} ({time.perf_counter() - start:.1f} s)")

    runs = {
        "off": run(model, config.replace(recall_policy="off"), eval_prompts, steps, "scout, recall off"),
        "adaptive": run(model, config.replace(recall_policy="adaptive"), eval_prompts, steps, "scout, recall adaptive"),
        "interval": run(model, config.replace(recall_policy="interval", recall_intervals=tuple(intervals)),
                        eval_prompts, steps, "scout, recall at profiled intervals"),
    }
    if not quick:
        runs["quest"] = run(model, config.replace(mode="quest"), eval_prompts, steps, "quest (real-query selection)")

    off = runs["off"]
    forced_share = (config.sink_blocks + config.local_blocks) / config.topk_blocks

    def over_offloaded(values):
        return mean([values[l] for l in offloaded])

    def step_means(name):
        return [mean([row[l] for l in offloaded]) for row in runs[name]["ratios"]]

    summary = {
        "model": description,
        "cosine_per_layer": {l: round(v, 4) for l, v in off["cosine_per_layer"].items()},
        "cosine_min_per_layer": {l: round(v, 4) for l, v in off["cosine_min_per_layer"].items()},
        "cosine_mean": round(mean(off["cosine_per_layer"].values()), 4),
        "change_rate_predicted": round(over_offloaded(off["change_rate_per_layer"]), 4),
        "change_rate_predicted_per_layer": [None if v is None else round(v, 4) for v in off["change_rate_per_layer"]],
        "forced_share_of_selection": round(forced_share, 4),
        "intervals": intervals,
        "mean_interval": round(mean([intervals[l] for l in offloaded]), 2),
        "update_to_stream_per_layer": [round(v, 3) for v in update_to_stream(model, eval_prompts[0])],
        "profile_curve_mean_per_step": [round(mean([row[l] for l in offloaded]), 4) for row in profile_curve],
    }
    for name in ("off", "adaptive", "interval"):
        summary[f"cpu_ratio_{name}"] = round(over_offloaded(runs[name]["cpu_ratio_per_layer"]), 4)
        summary[f"cpu_ratio_{name}_per_layer"] = [None if v is None else round(v, 4)
                                                  for v in runs[name]["cpu_ratio_per_layer"]]
        summary[f"cpu_ratio_{name}_per_step"] = [round(v, 4) for v in step_means(name)]
        summary[f"recalled_blocks_{name}"] = sum(runs[name]["recalled_blocks_per_step"])
        summary[f"recall_bytes_{name}"] = runs[name]["recall_bytes"]
        summary[f"seconds_{name}"] = runs[name]["seconds"]
    if "quest" in runs:
        summary["change_rate_real"] = round(over_offloaded(runs["quest"]["change_rate_per_layer"]), 4)
        summary["change_rate_real_per_layer"] = [None if v is None else round(v, 4)
                                                 for v in runs["quest"]["change_rate_per_layer"]]
    return summary


# -- report ----------------------------------------------------------------------
def fmt(value, pct=False):
    if value is None:
        return "-"
    return f"{100 * value:.1f}%" if pct else f"{value:.3f}"


def write_plots(results: dict, beta: float, out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(1, len(names), figsize=(6.5 * len(names), 4.2), squeeze=False)
    for ax, name in zip(axes[0], names):
        r = results[name]
        for key, color, label in (("off", "tab:red", "recall off"), ("adaptive", "tab:blue", "recall adaptive"),
                                  ("interval", "tab:green", "recall at profiled intervals")):
            series = r[f"cpu_ratio_{key}_per_step"]
            ax.plot(range(len(series)), series, color=color, label=f"{label} (mean {100 * r[f'cpu_ratio_{key}']:.1f}%)")
        ax.axhline(beta, color="black", linestyle="--", linewidth=1, label=f"beta = {beta:g}")
        ax.set_title(f"{name}: CPU ratio, mean over offloaded layers")
        ax.set_xlabel("decode step")
        ax.set_ylabel("CPU tokens / budget")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=8, loc="upper right", ncol=2)
    fig.suptitle("Random-weight tiny models: not representative of trained models", fontsize=9)
    fig.tight_layout()
    fig.savefig(out_dir / "prediction_cpu_ratio.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        per_layer = results[name]["cosine_per_layer"]
        layers = sorted(int(l) for l in per_layer)
        ax.bar([l + (k - (len(names) - 1) / 2) * width for l in layers], [per_layer[l] for l in layers], width,
               label=name)
    ax.axhspan(0.93, 0.97, color="grey", alpha=0.25, label="paper, trained 7-12B models (0.93-0.97)")
    ax.set_xlabel("layer (predicted from the previous layer's input)")
    ax.set_ylabel("mean cosine(predicted query, real query)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
    ax.set_title("Layer-ahead query prediction (random-weight tiny models: not representative)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out_dir / "prediction_cosine.png", dpi=120)
    plt.close(fig)


def write_markdown(results: dict, setup: dict, out_dir: Path) -> None:
    lines = ["# Query prediction, block change rate and CPU compute ratio", ""]
    lines += [
        f"Measured with `benchmarks/measure_prediction.py` on {setup['hardware']}. Reference decoder "
        "(transformers model + CoAttentionEngine, fp32, torch fallbacks). "
        f"Models: {'; '.join(r['model'] for r in results.values())}. "
        f"Prompts: {setup['prompts']}. Budget {setup['token_budget']} tokens, block {setup['block_size']} "
        f"({setup['topk_blocks']} blocks selected per request, layer and KV head, of which sink {setup['sink_blocks']} "
        f"and local {setup['local_blocks']} are forced), dense layers {setup['dense_layers']}, "
        f"beta {setup['beta']}, {setup['steps']} decode steps, greedy.",
        "",
        f"**{setup['caveat']}**",
        "",
        "## 1. Predicted-vs-real query cosine (paper Table 1)",
        "",
        "| layer | " + " | ".join(f"{n} mean | {n} min" for n in results) + " |",
        "|---|" + "---|---|" * len(results),
    ]
    layers = sorted({int(l) for r in results.values() for l in r["cosine_per_layer"]})
    for layer in layers:
        cells = []
        for r in results.values():
            cells += [fmt(r["cosine_per_layer"].get(layer)), fmt(r["cosine_min_per_layer"].get(layer))]
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    lines.append("| all | " + " | ".join(f"{fmt(r['cosine_mean'])} | " for r in results.values()) + " |")
    lines += ["", f"Paper: {PAPER['cosine']}.", "", "## 2. Selected blocks that change between consecutive tokens",
              "",
              "The engine counts a selected block as changed when it was not selected at the previous step of the "
              "same request, layer and KV head; the forced sink and local blocks are part of the selection, "
              "so the share of the *free* choices that change is about rate / (1 - forced share).",
              "", "| model | predicted query (scout) | real query (quest) | forced share | "
              "predicted, free choices only (approx.) |", "|---|---|---|---|---|"]
    for name, r in results.items():
        free = r["change_rate_predicted"] / (1 - r["forced_share_of_selection"])
        lines.append(f"| {name} | {fmt(r['change_rate_predicted'], True)} | {fmt(r.get('change_rate_real'), True)} | "
                     f"{fmt(r['forced_share_of_selection'], True)} | {fmt(free, True)} |")
    lines += ["", f"Paper: {PAPER['change_rate']}.", "", "Per layer (predicted query):", "",
              "| layer | " + " | ".join(results) + " |", "|---|" + "---|" * len(results)]
    for layer in layers:
        lines.append(f"| {layer} | " + " | ".join(fmt(r["change_rate_predicted_per_layer"][layer], True)
                                                 for r in results.values()) + " |")
    lines += ["", "## 3. CPU compute ratio (paper Figure 6)", "",
              "CPU tokens / budget tokens, mean over decode steps and offloaded layers. Intervals were profiled "
              "with `scout_sglang.profiler` (recall off, mean ratio curve over held-out prompts, largest interval "
              f"with the ratio <= beta, capped at {setup['max_interval']}).", "",
              "| model | recall off | recall adaptive | recall at intervals | mean interval | recalled blocks "
              "(adaptive / interval) |", "|---|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {fmt(r['cpu_ratio_off'], True)} | {fmt(r['cpu_ratio_adaptive'], True)} | "
                     f"{fmt(r['cpu_ratio_interval'], True)} | {r['mean_interval']} | "
                     f"{r['recalled_blocks_adaptive']} / {r['recalled_blocks_interval']} |")
    lines += ["", f"Paper: {PAPER['cpu_ratio_with_recall']} with recall, {PAPER['cpu_ratio_without_recall']} "
              f"without; mean interval {PAPER['mean_interval']}.", ""]
    for name, r in results.items():
        lines += [f"Per layer, {name} (off / adaptive / interval, interval):", "",
                  "| layer | off | adaptive | interval | profiled interval |", "|---|---|---|---|---|"]
        for layer in range(len(r["intervals"])):
            lines.append(f"| {layer} | {fmt(r['cpu_ratio_off_per_layer'][layer], True)} | "
                         f"{fmt(r['cpu_ratio_adaptive_per_layer'][layer], True)} | "
                         f"{fmt(r['cpu_ratio_interval_per_layer'][layer], True)} | {r['intervals'][layer]} |")
        curve = r["cpu_ratio_off_per_step"]
        marks = [0, 1, 2, 4, 8, 16, 32, 64, len(curve) - 1]
        lines += ["", "Recall off, mean over layers at steps " + ", ".join(
            f"{s}: {fmt(curve[s], True)}" for s in sorted(set(m for m in marks if m < len(curve)))) + ".", ""]
    lines += ["![CPU ratio](prediction_cpu_ratio.png)", "", "![cosine](prediction_cosine.png)", "",
              "## Comparison with the paper", "", comparison_paragraph(results, setup), ""]
    (out_dir / "prediction.md").write_text("\n".join(lines))


def comparison_paragraph(results: dict, setup: dict) -> str:
    cos = ", ".join(f"{n} {r['cosine_mean']:.2f}" for n, r in results.items())
    chg = ", ".join(f"{n} {100 * r['change_rate_predicted']:.0f}%" for n, r in results.items())
    real = ", ".join(f"{n} {100 * r['change_rate_real']:.0f}%" for n, r in results.items() if "change_rate_real" in r)
    off = ", ".join(f"{n} {100 * r['cpu_ratio_off']:.0f}%" for n, r in results.items())
    rec = ", ".join(f"{n} {100 * r['cpu_ratio_adaptive']:.0f}% adaptive / {100 * r['cpu_ratio_interval']:.0f}% "
                    f"interval" for n, r in results.items())
    intervals = ", ".join(f"{n} {r['mean_interval']}" for n, r in results.items())
    text = (
        f"Measured: mean predicted-vs-real query cosine {cos} (paper 0.93-0.97); changed selected blocks per token "
        f"{chg} with the predicted query" + (f" and {real} with the real query" if real else "") +
        f" (paper under 15%); CPU ratio {off} without recall and {rec} with recall (paper 8.2% with recall); "
        f"mean profiled interval {intervals} (paper 8.7). "
    )
    if setup["random_weights"]:
        depth = "; ".join(
            f"{n} {min(r['cosine_per_layer'].values()):.2f}-{max(r['cosine_per_layer'].values()):.2f} over layers "
            f"{min(r['cosine_per_layer'])}-{max(r['cosine_per_layer'])}" for n, r in results.items())
        text += (
            "These models have random weights and read uniform random tokens, so none of these numbers says how "
            "a trained model behaves, and the gaps to the paper are expected rather than findings. Layer-ahead "
            "prediction relies on each layer's update being small next to the residual stream it is added to; "
            "at initialisation (std 0.02) a layer's update is of the order of the stream itself ("
            + "; ".join(f"{n}: |X_(i+1) - X_i| / |X_i| = {min(r['update_to_stream_per_layer']):.2f}-"
                        f"{max(r['update_to_stream_per_layer']):.2f}" for n, r in results.items())
            + "), so X_i and X_(i+1) differ a lot and so do the predicted and real queries "
            f"(per layer: {depth}). "
        )
        if all(r["cosine_per_layer"][max(r["cosine_per_layer"])] > r["cosine_per_layer"][min(r["cosine_per_layer"])]
               for r in results.values()):
            text += "The cosine is higher in deeper layers, where the accumulated stream is larger. "
        rates = [r["change_rate_predicted"] for r in results.values()]
        text += (
            "Attention logits of a random model are close to zero and block scores differ by little, so the "
            "top-k selection is fragile"
            + (f": two random draws of the same size already differ {max(rates) / min(rates):.1f}-fold in change "
               "rate" if len(rates) > 1 and max(rates) > 1.5 * min(rates) else "")
            + ". Without recall the resident buffer is stale within a step or two of its fill: the CPU ratio "
            "jumps at the first steps and then keeps rising slowly (the shape of the paper's Figure 6a, at a "
            "much higher level, since nothing here resembles the strong locality of trained attention). "
            "The profiled intervals follow: an offloaded layer stays under beta for at most a step or two, so "
            "both recall policies recall at (nearly) every step, their curves nearly coincide, and recall can "
            "only bring the ratio down to about the per-step change of the selection: "
            + ", ".join(f"{n} {100 * r['cpu_ratio_interval']:.0f}%" for n, r in results.items())
            + f" against beta {100 * setup['beta']:.0f}% and the paper's 8.2%. "
        )
        text += (
            "What the run does show is that the measurement chain works end to end (prediction hooks, "
            "selection, CPU/device split, telemetry, profiler, interval policy) and how the three recall "
            "policies compare on one workload; rerun with `--model-dir` on a trained model for numbers "
            "comparable with the paper's."
        )
    else:
        text += "The model is a trained checkpoint; prompts and sizes still differ from the paper's (see setup)."
    return text


# -- driver ----------------------------------------------------------------------
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, about a minute, JSON line only")
    parser.add_argument("--model-dir", help="a locally saved transformers Llama/Qwen3 model (default: tiny random)")
    parser.add_argument("--arch", nargs="+", default=["qwen3", "llama"], choices=("qwen3", "llama"),
                        help="tiny random models to measure when no --model-dir is given")
    parser.add_argument("--prompt-file", help="with --model-dir: text file, one prompt per line")
    parser.add_argument("--steps", type=int, help="decode steps per run")
    parser.add_argument("--prompt-len", type=int, help="tokens per prompt")
    parser.add_argument("--budget-fraction", type=float, default=1 / 8, help="token budget / prompt length")
    parser.add_argument("--out-dir", default=str(RESULTS))
    parser.add_argument("--from-json", help="re-render prediction.md and the plots from a saved prediction.json")
    args = parser.parse_args(argv)
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        results = {name: {key: ({int(l): v for l, v in value.items()} if key.startswith("cosine_") and
                                isinstance(value, dict) else value) for key, value in r.items()}
                   for name, r in saved["results"].items()}
        out_dir = Path(args.out_dir)
        write_markdown(results, saved["setup"], out_dir)
        write_plots(results, saved["setup"]["beta"], out_dir)
        log(f"re-rendered {out_dir}/prediction.md and plots from {args.from_json}")
        return 0

    sizes = dict(QUICK if args.quick else FULL)
    if args.steps:
        sizes["steps"] = args.steps
    if args.prompt_len:
        sizes["prompt_len"] = args.prompt_len
    block = sizes["block_size"]
    budget = max(4 * block, int(sizes["prompt_len"] * args.budget_fraction) // block * block)
    base = load_preset("default")
    base.update(block_size=block, token_budget=budget, sink_blocks=1, local_blocks=2, cpu_groups=1)
    config = ScoutConfig(**base)
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))

    models = []
    if args.model_dir:
        model, description = load_model(args.model_dir, None, {})
        models.append((model.config.model_type, model, description))
    else:
        for seed, arch in enumerate(args.arch):  # one independent random draw per architecture
            tiny_kwargs = dict(num_layers=sizes["layers"], hidden=sizes["hidden"], num_heads=sizes["heads"],
                               num_kv_heads=sizes["kv_heads"], head_dim=sizes["head_dim"], vocab=sizes["vocab"],
                               init_std=0.02, seed=seed, max_positions=2 * (sizes["prompt_len"] + sizes["steps"]))
            model, description = load_model(None, arch, tiny_kwargs)
            models.append((arch, model, description))

    results = {}
    total = time.perf_counter()
    for name, model, description in models:
        vocab = model.config.vocab_size
        if args.prompt_file:
            prompts = file_prompts(args.prompt_file, args.model_dir, sizes["prompt_len"],
                                   sizes["prompts"] + sizes["profile_prompts"])
            eval_prompts, profile_prompts = prompts[: sizes["prompts"]], prompts[sizes["prompts"]:]
        else:
            eval_prompts = random_prompts(sizes["prompts"], sizes["prompt_len"], vocab, seed=101)
            profile_prompts = random_prompts(sizes["profile_prompts"], sizes["prompt_len"], vocab, seed=202)
        results[name] = measure_model(model, description, config, eval_prompts=eval_prompts,
                                      profile_prompts=profile_prompts or eval_prompts, steps=sizes["steps"],
                                      max_interval=sizes["max_interval"], quick=args.quick)
    log(f"all runs: {time.perf_counter() - total:.0f} s")

    random_weights = not args.model_dir
    caveat = ("Random-weight tiny models on random tokens: these numbers test the measurement, "
              "they say little about trained models." if random_weights else
              "A locally saved model; sizes and prompts differ from the paper's.")
    line = {"quick": args.quick, "caveat": caveat, "beta": config.recall_beta, "models": {
        name: {
            "cosine_per_layer": r["cosine_per_layer"],
            "change_rate": r["change_rate_predicted"],
            "cpu_ratio_off": r["cpu_ratio_off"],
            "cpu_ratio_adaptive": r["cpu_ratio_adaptive"],
            "cpu_ratio_interval": r["cpu_ratio_interval"],
            "intervals": r["intervals"],
        } for name, r in results.items()}}
    if not args.quick:
        out_dir = Path(args.out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        setup = {
            "hardware": f"{cpu_name()}, {len(os.sched_getaffinity(0))} CPUs, no GPU" if not torch.cuda.is_available()
            else f"{cpu_name()} + {torch.cuda.get_device_name()}",
            "prompts": (f"{sizes['prompts']} evaluation + {sizes['profile_prompts']} held-out profiling prompts of "
                        f"{sizes['prompt_len']} tokens" + (" (uniform random tokens)" if not args.prompt_file
                                                            else f" from {Path(args.prompt_file).name}")),
            "token_budget": config.token_budget, "block_size": config.block_size, "topk_blocks": config.topk_blocks,
            "sink_blocks": config.sink_blocks, "local_blocks": config.local_blocks,
            "dense_layers": list(config.dense_layers), "beta": config.recall_beta, "steps": sizes["steps"],
            "max_interval": sizes["max_interval"], "random_weights": random_weights, "caveat": caveat,
        }
        (out_dir / "prediction.json").write_text(json.dumps({"setup": setup, "paper": PAPER, "results": results},
                                                            indent=1))
        write_markdown(results, setup, out_dir)
        write_plots(results, config.recall_beta, out_dir)
        log(f"wrote {out_dir}/prediction.md, prediction.json, prediction_cpu_ratio.png, prediction_cosine.png")
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
