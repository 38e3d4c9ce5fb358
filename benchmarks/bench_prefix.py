"""Prefix reuse: scout under SGLang's radix cache against scout without it, on a shared-prefix workload.

SGLang's own `python -m sglang.bench_serving --dataset-name generated-shared-prefix` (groups of requests that
share a long system prompt, each with its own question; all sent at once) drives three servers, one after
the other, in the same run:

  scout-radix     --attention-backend scout --page-size <block size>   (the radix cache on, SGLang's default)
  scout-no-radix  --attention-backend scout --disable-radix-cache
  stock-radix     the stock backend (torch_native on the CPU, triton on a GPU), radix cache on
  scout-radix-resident  scout with SCOUT_RESIDENT_FIRST=on and a pool of --resident-pool-blocks (radix cache on)

Reported per server: request and output throughput, mean and median time to first token, the prompt tokens
prefilled (SGLang's prompt tokens minus its cached tokens, from /metrics) and, for scout, its prefix hits and
the host bytes the radix cache held at the end. The two scout servers' answers (greedy, token ids) must be
identical: the run fails otherwise. The target: scout-radix at least 1.5x scout-no-radix's throughput.
For the resident-first server: the share of its recent decoded tokens attended exactly, the prefix blocks its
adopting requests took from a running request's resident row (held once) or copied from the host store, and how
many of its answers equal the stock server's (every exact answer does; a request that went sparse may not).

Writes benchmarks/results/prefix.{json,md,png}:

    python -P benchmarks/bench_prefix.py                  # CPU default: a random 8-layer Llama (hidden 256), 4 x 8 requests
    python -P benchmarks/bench_prefix.py --quick          # CI: 2 x 3 requests, prints one JSON line, writes nothing
    python -P benchmarks/bench_prefix.py --device cuda --model-path DIR --system-prompt-len 8192 ...
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
STOCK_BACKEND = {"cpu": "torch_native", "cuda": "triton"}
SERVERS = ("scout-radix", "scout-no-radix", "stock-radix", "scout-radix-resident")
TARGET = 1.5  # scout-radix over scout-no-radix, output throughput


def log(message: str) -> None:
    print(f"[prefix] {message}", file=sys.stderr, flush=True)


def server_args(kind: str, args) -> tuple[list[str], dict]:
    common = ["--dtype", args.dtype, "--max-running-requests", str(args.max_running), "--max-total-tokens",
              str(args.max_total_tokens), "--enable-metrics", "--page-size", str(args.block_size)]
    if kind == "stock-radix":
        return ["--attention-backend", STOCK_BACKEND[args.device], *common], {}
    env = {"SCOUT_CONFIG": args.scout_config, "SCOUT_CPU_GROUPS": "1"}
    if kind == "scout-radix-resident":
        env |= {"SCOUT_RESIDENT_FIRST": "on", "SCOUT_RESIDENT_POOL_BLOCKS": str(args.resident_pool_blocks)}
    radix = ["--disable-radix-cache"] if kind == "scout-no-radix" else []
    return ["--attention-backend", "scout", *common, *radix], env


def bench_serving(base: str, model_path: str, args, output: Path) -> dict:
    command = [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", base,
               "--model", model_path, "--tokenizer", model_path, "--dataset-name", "generated-shared-prefix",
               "--gsp-num-groups", str(args.groups), "--gsp-prompts-per-group", str(args.prompts_per_group),
               "--gsp-system-prompt-len", str(args.system_prompt_len), "--gsp-question-len", str(args.question_len),
               "--gsp-output-len", str(args.output_len), "--request-rate", "inf", "--disable-tqdm", "--seed", "1",
               "--output-file", str(output), "--output-details"]
    environment = dict(os.environ, HF_HUB_OFFLINE="1")  # the tokenizer is local; never wait on the hub
    completed = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, env=environment,
                               cwd=output.parent)  # its generated-prompt cache goes under the work directory
    if completed.returncode != 0:
        raise RuntimeError(f"bench_serving failed ({completed.returncode}):\n{completed.stdout[-3000:]}\n"
                           f"{completed.stderr[-3000:]}")
    lines = [line for line in output.read_text().splitlines() if line.strip()]
    return json.loads(lines[-1])


def metric_total(text: str, name: str) -> float:
    """Sum of a Prometheus series over its labels."""
    return sum(float(value) for value in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M))


def run_server(kind: str, model_path: str, args, workdir: Path) -> dict:
    import urllib.request

    from scout_sglang.server.client import scout_stats
    from scout_sglang.server.launch import launched_server

    extra, env = server_args(kind, args)
    log(f"{kind}: starting the server ({' '.join(extra)})")
    with launched_server(model_path, *extra, env=env, log_path=workdir / f"{kind}.log", device=args.device) as base:
        start = time.perf_counter()
        samples, stop = [], threading.Event()
        watcher = threading.Thread(target=watch_pool, args=(base, stop, samples))
        if kind == "scout-radix-resident":
            watcher.start()
        try:
            result = bench_serving(base, model_path, args, workdir / f"{kind}.jsonl")
        finally:
            stop.set()
            if watcher.is_alive():
                watcher.join()
        log(f"{kind}: {result['completed']} requests in {time.perf_counter() - start:.1f} s, "
            f"{result['output_throughput']:.1f} output tokens/s")
        time.sleep(1.0)  # the last request's metrics land
        with urllib.request.urlopen(base + "/metrics", timeout=60) as response:
            metrics = response.read().decode()
        stats = scout_stats(base) if kind != "stock-radix" else None
    prompt, cached = metric_total(metrics, "sglang:prompt_tokens_total"), metric_total(metrics, "sglang:cached_tokens_total")
    row = {
        "server": kind,
        "completed": result["completed"],
        "request_throughput": round(result["request_throughput"], 4),
        "output_throughput": round(result["output_throughput"], 3),
        "mean_ttft_ms": round(result["mean_ttft_ms"], 1),
        "median_ttft_ms": round(result["median_ttft_ms"], 1),
        "duration_s": round(result["duration"], 2),
        "prompt_tokens": int(prompt),
        "prefill_tokens_computed": int(prompt - cached),
        "texts": result.get("generated_texts", []),
    }
    if stats is not None:
        row["prefix_hits"] = stats["prefix"]["hits"]
        row["prefill_tokens_saved"] = stats["prefix"]["prefill_tokens_saved"]
        row["host_bytes_cached"] = stats["memory"]["host_bytes_cached"]
        row["request_failures"] = sum(stats["request_failures"].values())
        row["cpu_blocks"] = stats["cpu_blocks"]
    if stats is not None and stats["resident_pool"] is not None:
        pool = stats["resident_pool"]
        row |= {"recent_exact_share": pool["recent_exact_share"], "pool_pages": pool["pages"],
                "prefix_blocks_shared": pool["prefix_blocks_shared"], "prefix_blocks_copied": pool["prefix_blocks_copied"]}
        busiest = max(samples, key=lambda sample: (sample["requests"], sample["used"]), default=None)
        row["busiest"] = busiest  # the pool when it held the most requests (every 0.3 s): how many were exact
    return row


def watch_pool(base: str, stop: threading.Event, samples: list) -> None:
    """The resident pool's use every 0.3 s while the workload runs."""
    from scout_sglang.server.client import scout_stats

    while not stop.is_set():
        pool = scout_stats(base)["resident_pool"]
        samples.append({key: pool[key] for key in ("requests", "exact_requests", "used", "shared_pages",
                                                   "saved_pages")})
        stop.wait(0.3)


def summarize(rows: list[dict], args) -> dict:
    by = {row["server"]: row for row in rows}
    radix, plain = by["scout-radix"], by["scout-no-radix"]
    identical = radix["texts"] == plain["texts"] and len(radix["texts"]) == args.groups * args.prompts_per_group
    speedup = radix["output_throughput"] / plain["output_throughput"] if plain["output_throughput"] else 0.0
    return {
        "workload": {"groups": args.groups, "prompts_per_group": args.prompts_per_group,
                     "system_prompt_len": args.system_prompt_len, "question_len": args.question_len,
                     "output_len": args.output_len, "device": args.device, "model_layers": args.num_layers,
                     "model_hidden": args.hidden,
                     "scout_config": args.scout_config, "max_running_requests": args.max_running,
                     "host_cpus": len(os.sched_getaffinity(0))},
        "rows": [{key: value for key, value in row.items() if key != "texts"} for row in rows],
        "scout_radix_over_no_radix": round(speedup, 3),
        "scout_radix_over_stock_radix": round(radix["output_throughput"] / by["stock-radix"]["output_throughput"], 3)
        if by.get("stock-radix", {}).get("output_throughput") else None,
        "identical_answers": identical,
        "resident_answers_equal_to_stock": sum(a == b for a, b in zip(by["scout-radix-resident"]["texts"],
                                                                      by["stock-radix"]["texts"])),
        "target": TARGET,
        "meets_target": speedup >= TARGET and identical,
    }


def write_results(summary: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "prefix.json").write_text(json.dumps(summary, indent=2) + "\n")
    w = summary["workload"]
    lines = ["# Prefix reuse: scout under SGLang's radix cache", "",
             f"`python -P benchmarks/bench_prefix.py` on {w['device']}: SGLang's `bench_serving` "
             f"(`generated-shared-prefix`), {w['groups']} groups x {w['prompts_per_group']} requests, a "
             f"{w['system_prompt_len']}-token system prompt per group, {w['question_len']}-token questions, "
             f"{w['output_len']} output tokens, all sent at once; a random {w['model_layers']}-layer Llama of hidden "
             f"size {w['model_hidden']} "
             f"(SCOUT_CONFIG={w['scout_config']}), at most {w['max_running_requests']} running requests; "
             f"{w['host_cpus']} host CPUs. Servers run one after the other.", "",
             "| server | requests/s | output tok/s | mean TTFT ms | median TTFT ms | prompt tokens | prefilled | "
             "prefix hits |", "|---|---|---|---|---|---|---|---|"]
    for row in summary["rows"]:
        lines.append(f"| {row['server']} | {row['request_throughput']:.3f} | {row['output_throughput']:.1f} | "
                     f"{row['mean_ttft_ms']:.0f} | {row['median_ttft_ms']:.0f} | {row['prompt_tokens']} | "
                     f"{row['prefill_tokens_computed']} | {row.get('prefix_hits', '-')} |")
    lines += ["", f"- scout with the radix cache: **{summary['scout_radix_over_no_radix']:.2f}x** the output "
              f"throughput of scout without it (target {summary['target']}x: "
              f"{'met' if summary['meets_target'] else 'NOT met'}); "
              f"{summary['scout_radix_over_stock_radix']}x the stock backend with its radix cache.",
              f"- Answers of the two scout servers identical: {summary['identical_answers']}."]
    resident = next(row for row in summary["rows"] if row["server"] == "scout-radix-resident")
    busiest = resident["busiest"] or {}
    lines += [f"- Resident-first under the radix cache (a pool of {resident['pool_pages']} pages): at its busiest, "
              f"{busiest.get('exact_requests')} of {busiest.get('requests')} running requests exact in "
              f"{busiest.get('used')} pages, {busiest.get('saved_pages')} more saved by sharing (each group's prefix "
              f"held once in {busiest.get('shared_pages')} shared pages); "
              f"{resident['recent_exact_share']:.2f} of the recent decoded tokens attended exactly, "
              f"{resident['cpu_blocks']} blocks attended on the CPU; the adopting requests took "
              f"{resident['prefix_blocks_shared']} prefix blocks from a running request's resident row (held once) "
              f"and copied {resident['prefix_blocks_copied']} from the host store; "
              f"{summary['resident_answers_equal_to_stock']} of {resident['completed']} answers equal the stock "
              "server's.", ""]
    (RESULTS / "prefix.md").write_text("\n".join(lines))
    plot(summary)


def plot(summary: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["rows"]
    names = [row["server"] for row in rows]
    fig, axes = plt.subplots(1, 4, figsize=(18, 3.8))
    for ax, key, title in zip(axes, ("output_throughput", "mean_ttft_ms", "prefill_tokens_computed"),
                              ("output tokens/s", "mean time to first token (ms)", "prompt tokens prefilled")):
        ax.bar(names, [row[key] for row in rows], color=["tab:green", "tab:gray", "tab:blue", "tab:olive"][:len(rows)])
        ax.set_title(title)
        ax.tick_params(axis="x", labelrotation=15)
    busiest = next((row["busiest"] for row in rows if row.get("busiest")), None)
    if busiest:  # the resident pool at its busiest: what sharing held, what a copy per request would have taken
        axes[3].bar(["prefixes once", "a copy each"], [busiest["used"], busiest["used"] + busiest["saved_pages"]],
                    color=["tab:olive", "tab:gray"])
        axes[3].set_title(f"resident pool pages, {busiest['exact_requests']} of {busiest['requests']} exact")
    fig.suptitle(f"shared-prefix workload: scout radix on / off = {summary['scout_radix_over_no_radix']:.2f}x")
    fig.tight_layout()
    fig.savefig(RESULTS / "prefix.png", dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", help="a model directory (default: a random-weight tiny Llama built here)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--num-layers", type=int, default=8, help="layers of the built tiny Llama")
    parser.add_argument("--hidden", type=int, default=256,
                        help="hidden size of the built Llama (4 query heads of hidden/4, 2 KV heads): big enough that "
                             "a prompt's prefill costs what it costs next to a decode step's fixed overhead")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--prompts-per-group", type=int, default=8)
    parser.add_argument("--system-prompt-len", type=int, default=2048)
    parser.add_argument("--question-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--max-running", type=int, default=16)
    parser.add_argument("--max-total-tokens", type=int, default=65536)
    parser.add_argument("--scout-config", default="tiny")
    parser.add_argument("--resident-pool-blocks", type=int, default=1536,
                        help="the resident-first server's pool, in blocks of every offloaded layer: 16 running "
                             "requests of the default workload (about 3,750 tokens each, some 3,500 of them their "
                             "group's prefix) take about 1,300 with each group's prefix once, 3,750 with a copy each")
    parser.add_argument("--timeout", type=int, default=1800)
    parser.add_argument("--quick", action="store_true", help="2 groups x 3 requests, 1k-token system prompts; "
                        "prints one JSON line, writes nothing")
    args = parser.parse_args(argv)
    if args.quick:
        args.groups, args.prompts_per_group, args.system_prompt_len, args.output_len = 2, 3, 1024, 8
        args.num_layers, args.hidden = min(args.num_layers, 4), 64
    from scout_sglang.env import config_from_env

    args.block_size = config_from_env({"SCOUT_CONFIG": args.scout_config}).block_size
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        model_path = args.model_path
        if model_path is None:
            from scout_sglang.hf.tiny_models import save_tiny_model

            model_path = str(save_tiny_model(workdir / "model", "llama", num_layers=args.num_layers,
                                             hidden=args.hidden, num_heads=4, num_kv_heads=2,
                                             head_dim=args.hidden // 4, max_positions=16384))
        rows = [run_server(kind, model_path, args, workdir) for kind in SERVERS]
        summary = summarize(rows, args)
        if not args.quick:
            write_results(summary)
            (RESULTS / "server-logs").mkdir(parents=True, exist_ok=True)
            for kind in SERVERS:
                (RESULTS / "server-logs" / f"prefix-{kind}.log").write_text((workdir / f"{kind}.log").read_text())
    print(json.dumps({key: value for key, value in summary.items() if key != "rows"}))
    if not summary["identical_answers"]:
        log("the scout servers with and without the radix cache answered differently")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
