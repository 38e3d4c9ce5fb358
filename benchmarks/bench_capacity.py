"""Decode capacity at one device KV budget: the scout KV pool against SGLang's stock pool.

Both servers get the same device memory for K/V: the stock server (torch_native
on the CPU, triton on a GPU) a pool of --budget token slots; the scout server,
with the shipped preset (--scout-config), the largest logical capacity (host
memory) whose device part fits the same bytes by the plugin's own capacity
model (memory_report.planned_bytes): digests, windows, resident buffers, the
full K/V of its dense layers and its placeholder pool. The device bytes the
scout server then reports are checked against the budget. SGLang's own
`python -m sglang.bench_serving` (random token ids, fixed input and output
lengths, all requests at once) measures both; the peak number of requests
decoded together comes from the servers' decode log lines.

A third server measures the host's floor: the stock server decoding each batch
size scout decoded at, on 32-token prompts where attention costs nothing, takes
the model's and the framework's own step at that batch. From it the report
derives the most that scout's output throughput could be on this host and
workload if its engine cost nothing (`host_floor`); `--no-floor` skips it.

Writes benchmarks/results/capacity.{json,md,png}:

    python -P benchmarks/bench_capacity.py                 # CPU default: 36 layers, budget 4096, 9 x (3900 + 128)-token requests
    python -P benchmarks/bench_capacity.py --device cuda --model-path DIR --input-len 32000 ...
    python -P benchmarks/bench_capacity.py --device cuda --dtype bfloat16 --build qwen3-8b --budget 133120 \
        --input-len 65536 --output-len 256 --num-prompts 12  # a GPU box with SGLang: the headline's comparison
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
STOCK_BACKEND = {"cpu": "torch_native", "cuda": "triton"}
DEVICE_PARTS = ("digest_bytes_allocated", "window_and_resident_bytes_allocated", "dense_layer_bytes_allocated",
                "sglang_pool_device_bytes")  # scout's device bytes, by what they hold (they add up)


def log(message: str) -> None:
    print(f"[capacity] {message}", file=sys.stderr, flush=True)


FLOOR_INPUT_LEN = 32  # the floor run's prompts: short enough that their attention costs nothing


def server_args(kind: str, args) -> tuple[list[str], dict]:
    common = ["--dtype", args.dtype, "--max-running-requests", str(args.num_prompts), "--disable-radix-cache",
              "--context-length", str(args.input_len + args.output_len + 64), "--decode-log-interval", "1"]
    if kind == "stock":
        return ["--attention-backend", STOCK_BACKEND[args.device], "--max-total-tokens", str(args.budget), *common], {}
    if kind == "floor":  # the stock server with room for the largest batch scout decoded, at short prompts
        tokens = max(args.budget, max(args.floor_batches) * (FLOOR_INPUT_LEN + args.output_len + 64))
        return ["--attention-backend", STOCK_BACKEND[args.device], "--max-total-tokens", str(tokens), *common], {}
    env = {"SCOUT_CONFIG": args.scout_config}  # the preset as shipped: its dense layers count against the budget
    return ["--attention-backend", "scout", "--max-total-tokens", str(args.logical_tokens), *common], env


def fitting_capacity(budget_bytes: int, config, *, num_layers: int, num_kv_heads: int, head_dim: int, itemsize: int,
                     slots: int) -> int:
    """The largest logical capacity, in whole blocks, whose device bytes fit the budget: the engine's (planned,
    dense layers included) plus SGLang's placeholder pool of 2 tokens per request slot, and the one padding token
    that SGLang's pools add (page size 1 here)."""
    from scout_sglang.sglang_adapter.memory_report import engine_total_pages, planned_bytes

    def device(tokens: int) -> int:
        plan = planned_bytes(config, num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim,
                             itemsize=itemsize, total_pages=engine_total_pages(tokens, config.block_size, slots),
                             slots=slots)
        return plan["device_bytes_allocated"] + (2 * slots + 1) * 2 * num_kv_heads * head_dim * itemsize * num_layers

    per_block = device(config.block_size) - device(0)  # device bytes are linear in the capacity's blocks
    blocks = max(0, (budget_bytes - device(0)) // per_block)
    tokens = blocks * config.block_size
    if not device(tokens) <= budget_bytes < device(tokens + config.block_size):
        raise RuntimeError(f"capacity model not linear: {tokens} tokens need {device(tokens)} device bytes, one more "
                           f"block {device(tokens + config.block_size)}; expected the budget {budget_bytes} between")
    return tokens


def bench_serving(base: str, model_path: str, args, output: Path) -> dict:
    command = [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", base,
               "--model", model_path, "--tokenizer", model_path, "--dataset-name", "random-ids",
               "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
               "--random-range-ratio", "1.0", "--num-prompts", str(args.num_prompts), "--request-rate", "inf",
               "--tokenize-prompt", "--disable-tqdm", "--seed", "1", "--output-file", str(output)]
    environment = dict(os.environ, HF_HUB_OFFLINE="1")  # the tokenizer is local; never wait on the hub
    completed = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, env=environment)
    if completed.returncode != 0:
        raise RuntimeError(f"bench_serving failed ({completed.returncode}):\n{completed.stdout[-3000:]}\n"
                           f"{completed.stderr[-3000:]}")
    lines = [line for line in output.read_text().splitlines() if line.strip()]
    return json.loads(lines[-1])


def token_capacity(server_info: dict) -> int:
    """The token capacity SGLang's scheduler works with (the logical one for scout)."""
    for state in server_info.get("internal_states") or [server_info]:
        capacity = (state.get("memory_usage") or {}).get("token_capacity")
        if capacity:
            return int(capacity)
    return 0


DECODE_LINE = re.compile(r"Decode batch, #running-req: (\d+),.*?gen throughput \(token/s\): ([\d.]+)")


def decode_profile(log_text: str) -> dict:
    """Where a server's decode time went, from its per-step decode log lines (--decode-log-interval 1): per number
    of running requests, the steps and their median step time (a line's rate is its tokens over the time since the
    previous decode line, so the median leaves out the lines whose interval held a prefill); and the decode time
    these add up to, the rest of the run being prefill and the framework's time between requests."""
    steps: dict[int, list[float]] = {}
    for running, rate in DECODE_LINE.findall(log_text):
        if float(rate) > 0:
            steps.setdefault(int(running), []).append(1e3 * int(running) / float(rate))
    by_batch = {batch: {"steps": len(times), "median_step_ms": round(statistics.median(times), 2)}
                for batch, times in sorted(steps.items())}
    seconds = sum(entry["steps"] * entry["median_step_ms"] for entry in by_batch.values()) / 1e3
    return {"by_batch": by_batch, "decode_seconds": round(seconds, 3)}


def peak_running(log_text: str) -> int:
    return max((int(n) for n in re.findall(r"Decode batch[^\n]*#running-req: (\d+)", log_text)), default=0)


def run_server(kind: str, model_path: str, args, workdir: Path) -> dict:
    from scout_sglang.server.client import get_json, scout_stats
    from scout_sglang.server.launch import launched_server

    extra, env = server_args(kind, args)
    log_path = workdir / f"{kind}.log"
    log(f"{kind}: starting the server ({' '.join(extra)})")
    with launched_server(model_path, *extra, env=env, log_path=log_path, device=args.device) as base:
        start = time.perf_counter()
        result = bench_serving(base, model_path, args, workdir / f"{kind}.jsonl")
        log(f"{kind}: {result['completed']} requests in {time.perf_counter() - start:.1f} s")
        stats = scout_stats(base) if kind == "scout" else None
        info = get_json(f"{base}/server_info")
    text = log_path.read_text()
    row = {
        "server": kind,
        "attention_backend": "scout" if kind == "scout" else STOCK_BACKEND[args.device],
        "max_total_tokens": token_capacity(info),
        "peak_running_requests": peak_running(text),
        "completed": result["completed"],
        "request_throughput": result["request_throughput"],
        "output_throughput": result["output_throughput"],
        "mean_e2e_latency_ms": result["mean_e2e_latency_ms"],
        "duration_s": result["duration"],
        "decode": decode_profile(text),
    }
    if stats is not None:
        row["device_kv_bytes_allocated"] = stats["memory"]["device_bytes_allocated"]
        row["device_kv_parts"] = {key: stats["memory"][key] for key in DEVICE_PARTS}
        row["dense_layers"] = stats["memory"]["dense_layers"]
        row["host_kv_bytes_allocated"] = stats["memory"]["host_bytes_allocated"]
        row["scout_max_batch_size"] = stats["max_batch_size"]
        row["cpu_ratio"] = stats["cpu_ratio"]
    if kind == "stock":  # its pool: the budget's token slots (SGLang's start-up line rounds to 0.00 GB)
        row["device_kv_bytes_allocated"] = args.budget * args.token_bytes
    return row


def run_floor(model_path: str, args, workdir: Path, batches: list[int]) -> dict:
    """One stock server decoding each of `batches` requests at once on FLOOR_INPUT_LEN-token prompts, in turn:
    per batch size, the median step (the model's and the framework's own step at that batch)."""
    from scout_sglang.server.launch import launched_server

    args.floor_batches = batches
    extra, env = server_args("floor", args)
    log_path = workdir / "floor.log"
    log(f"floor: starting the server ({' '.join(extra)}), batches {batches}")
    steps = {}
    with launched_server(model_path, *extra, env=env, log_path=log_path, device=args.device) as base:
        for batch in batches:
            offset = len(log_path.read_text())
            workload = argparse.Namespace(**{**vars(args), "num_prompts": batch, "input_len": FLOOR_INPUT_LEN})
            bench_serving(base, model_path, workload, workdir / f"floor-{batch}.jsonl")
            entry = decode_profile(log_path.read_text()[offset:])["by_batch"].get(batch)
            steps[batch] = entry["median_step_ms"] if entry else None
            log(f"floor: {batch} requests of {FLOOR_INPUT_LEN} + {args.output_len}: {steps[batch]} ms a step")
    return {"input_len": FLOOR_INPUT_LEN, "median_step_ms_by_batch": steps}


def host_floor(stock: dict, scout: dict, floor: dict) -> dict:
    """What this host allows scout at best. The floor server's step at each batch size is the model's and the
    framework's own; a scout server whose engine cost nothing would still prefill what the stock server prefills
    and decode as many steps at each batch size as scout did (the scheduler's choice, not the engine's), each at
    the floor. Its run would take at least the stock run's time outside decoding plus those steps: the
    output-throughput ratio cannot pass the stock run's duration over that."""
    floor_ms = floor["median_step_ms_by_batch"]
    scout_steps = scout["decode"]["by_batch"]
    if any(floor_ms.get(batch) is None for batch in scout_steps):
        return {}
    stock_outside_decode = stock["duration_s"] - stock["decode"]["decode_seconds"]
    floor_decode = sum(entry["steps"] * floor_ms[batch] for batch, entry in scout_steps.items()) / 1e3
    best_duration = stock_outside_decode + floor_decode
    return {"floor_step_ms_by_batch": {batch: floor_ms[batch] for batch in scout_steps},
            "scout_step_ms_by_batch": {batch: entry["median_step_ms"] for batch, entry in scout_steps.items()},
            "stock_seconds_outside_decode": round(stock_outside_decode, 2),
            "floor_decode_seconds": round(floor_decode, 2), "best_scout_duration_s": round(best_duration, 2),
            "output_throughput_ratio_ceiling": round(stock["duration_s"] / best_duration, 3)}


def write_results(rows: list[dict], args, token_bytes: int, floor: dict | None = None) -> dict:
    stock, scout = rows
    summary = {
        "device": args.device, "num_layers": args.num_layers, "scout_config": args.scout_config,
        "budget_tokens": args.budget, "budget_bytes": args.budget * token_bytes, "logical_tokens": args.logical_tokens,
        "input_len": args.input_len, "output_len": args.output_len, "num_prompts": args.num_prompts,
        "total_context": args.num_prompts * (args.input_len + args.output_len),
        "peak_concurrency_ratio": round(scout["peak_running_requests"] / max(1, stock["peak_running_requests"]), 2),
        "request_throughput_ratio": round(scout["request_throughput"] / stock["request_throughput"], 3),
        "output_throughput_ratio": round(scout["output_throughput"] / stock["output_throughput"], 3),
        "scout_device_bytes_within_budget": scout["device_kv_bytes_allocated"] <= args.budget * token_bytes,
        "rows": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    lines = [f"# Decode capacity at one device KV budget ({args.device})", "",
             f"Model: a random-weight Llama of {args.num_layers} layers (2 KV heads of 16 dims, {args.dtype}) unless "
             f"--model-path was given. Device K/V budget: {args.budget} token slots "
             f"({args.budget * token_bytes / 2**20:.1f} MiB); scout's logical capacity: {args.logical_tokens} tokens "
             f"({args.logical_tokens / args.budget:.1f}x). "
             f"{args.num_prompts} requests of {args.input_len} input + {args.output_len} output tokens "
             f"({summary['total_context']} tokens of context, {summary['total_context'] / args.budget:.1f}x the "
             "budget), sent at once by `python -m sglang.bench_serving` (random-ids).", "",
             "| server | logical tokens | device K/V MiB | peak running | req/s | output tok/s | mean e2e s |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['attention_backend']} | {row['max_total_tokens']} | "
                     f"{row.get('device_kv_bytes_allocated', 0) / 2**20:.2f} | {row['peak_running_requests']} | "
                     f"{row['request_throughput']:.3f} | {row['output_throughput']:.1f} | "
                     f"{row['mean_e2e_latency_ms'] / 1e3:.1f} |")
    lines += ["", "Where the time went (from the servers' per-step decode log lines; the rest of each run is prefill "
              "and the time between requests):", "",
              "| server | duration s | decode s (steps x median step) | decode steps by running requests: count, "
              "median step ms |", "|---|---|---|---|"]
    for row in rows:
        profile = row["decode"]
        steps = "; ".join(f"{batch}: {entry['steps']} x {entry['median_step_ms']:.1f}"
                          for batch, entry in profile["by_batch"].items())
        lines.append(f"| {row['attention_backend']} | {row['duration_s']:.1f} | {profile['decode_seconds']:.1f} | "
                     f"{steps} |")
    stock_busiest = max(stock["decode"]["by_batch"].items(), key=lambda item: item[1]["steps"])
    scout_busiest = max(scout["decode"]["by_batch"].items(), key=lambda item: item[1]["steps"] * item[0])
    rate = {name: batch / entry["median_step_ms"] for name, (batch, entry) in
            (("stock", stock_busiest), ("scout", scout_busiest))}
    summary["decode_rate_ratio"] = round(rate["scout"] / rate["stock"], 3)
    lines += ["", f"A decode step of scout's {scout_busiest[0]} requests took {scout_busiest[1]['median_step_ms']:.1f} ms, "
              f"one of the stock server's {stock_busiest[0]} request{'s' if stock_busiest[0] > 1 else ''} "
              f"{stock_busiest[1]['median_step_ms']:.1f} ms: while decoding, "
              f"scout made {summary['decode_rate_ratio']}x the stock server's tokens per second."]
    if floor is not None:
        summary["floor"] = floor
        summary["host_floor"] = bound = host_floor(stock, scout, floor)
        if bound:
            steps = "; ".join(f"{batch}: {bound['floor_step_ms_by_batch'][batch]:.1f} against scout's "
                              f"{bound['scout_step_ms_by_batch'][batch]:.1f}" for batch in bound["floor_step_ms_by_batch"])
            lines += ["", f"The host's floor: the stock server decoding the same batch sizes on {FLOOR_INPUT_LEN}-token "
                      f"prompts (no long-context attention), the model's and the framework's own step, in ms by "
                      f"batch: {steps}. A scout engine that cost nothing would still prefill what the stock server "
                      f"prefilled ({bound['stock_seconds_outside_decode']:.1f} s of its run was not decoding) and "
                      f"decode scout's steps at the floor ({bound['floor_decode_seconds']:.1f} s): at least "
                      f"{bound['best_scout_duration_s']:.1f} s, so scout's output tokens/s can be at most "
                      f"**{bound['output_throughput_ratio_ceiling']}x** the stock server's on this host and workload."]
    (RESULTS / "capacity.json").write_text(json.dumps(summary, indent=1) + "\n")
    parts = scout["device_kv_parts"]
    lines += ["", f"Scout's device K/V, by part ({args.scout_config} preset, dense layers {scout['dense_layers']}): "
              + ", ".join(f"{key.replace('_bytes_allocated', '').replace('_bytes', '').replace('_', ' ')} "
                          f"{value / 2**20:.2f} MiB" for key, value in parts.items()) + "."]
    lines += ["", f"Scout / stock: peak concurrency {summary['peak_concurrency_ratio']}x, request throughput "
              f"{summary['request_throughput_ratio']}x, output tokens/s {summary['output_throughput_ratio']}x. "
              f"Scout's device K/V within the budget: {summary['scout_device_bytes_within_budget']}."]
    if args.device == "cpu":
        lines += ["", "On a CPU-only machine the \"device\" is the same CPU and memory as the host, and the model is "
                  "tiny: the throughput ratio shows the cost of co-attention's per-step work (selection, CPU part, "
                  "merge) at a batch the stock server could not hold, not a GPU's gain. What carries over is the "
                  f"accounting: the same device bytes held {summary['peak_concurrency_ratio']}x the requests at once."]
    (RESULTS / "capacity.md").write_text("\n".join(lines) + "\n")
    plot(rows, args)
    return summary


def plot(rows, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [row["attention_backend"] for row in rows]
    metrics = [("peak_running_requests", "peak requests decoded together"), ("request_throughput", "requests / s"),
               ("output_throughput", "output tokens / s")]
    figure, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    for axis, (key, title) in zip(axes, metrics):
        values = [row[key] for row in rows]
        axis.bar(names, values, color=["#999999", "#2a7ab9"])
        axis.set_title(title, fontsize=10)
        for x, value in enumerate(values):
            axis.text(x, value, f"{value:.3g}", ha="center", va="bottom", fontsize=9)
    figure.suptitle(f"Same device K/V budget ({args.budget} token slots), {args.num_prompts} x {args.input_len}-token "
                    f"requests ({args.device})", fontsize=10)
    figure.tight_layout()
    figure.savefig(RESULTS / "capacity.png", dpi=110)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", help="a model directory (default: a random-weight model built here, --build)")
    parser.add_argument("--build", choices=("tiny-llama", "qwen3-8b"), default="tiny-llama",
                        help="the model built when no --model-path is given: a tiny Llama of --num-layers layers (the "
                             "CPU default), or Qwen3-8B's shape with random bf16 weights (a GPU box: no download)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--budget", type=int, default=4096, help="device K/V token slots of the stock server")
    parser.add_argument("--logical-tokens", type=int, default=None,
                        help="scout's logical capacity (host); default: the largest whose device part fits the budget")
    parser.add_argument("--num-layers", type=int, default=36,
                        help="layers of the built tiny Llama: Qwen3-8B's 36 by default, so that a dense layer weighs "
                             "in the device bytes what it weighs there")
    parser.add_argument("--input-len", type=int, default=3900, help="each request fits the stock pool alone")
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--num-prompts", type=int, default=9)
    parser.add_argument("--scout-config", default="tiny")
    parser.add_argument("--timeout", type=int, default=1800)
    parser.add_argument("--no-floor", dest="floor", action="store_false",
                        help="skip the third server (the stock backend at scout's batch sizes on short prompts) that "
                             "measures the host's floor")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        model_path = args.model_path
        if model_path is None:
            from scout_sglang.hf.tiny_models import save_tiny_model

            positions = max(16384, args.input_len + args.output_len + 64)
            if args.build == "qwen3-8b":  # Qwen3-8B's config.json shape, random weights made on the GPU
                import torch

                log("building a random-weight Qwen3-8B-shaped checkpoint (16 GB) in place")
                model_path = str(save_tiny_model(workdir / "model", "qwen3", num_layers=36, hidden=4096,
                                                 intermediate=12288, num_heads=32, num_kv_heads=8, head_dim=128,
                                                 max_positions=positions, dtype=torch.bfloat16,
                                                 device="cuda" if torch.cuda.is_available() else None))
            else:
                model_path = str(save_tiny_model(workdir / "model", "llama", num_layers=args.num_layers, hidden=64,
                                                 num_heads=4, num_kv_heads=2, head_dim=16, max_positions=positions))
        from transformers import AutoConfig

        from scout_sglang.env import config_from_env

        config = AutoConfig.from_pretrained(model_path)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        itemsize = 4 if args.dtype == "float32" else 2
        token_bytes = config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * itemsize
        args.token_bytes = token_bytes
        args.num_layers = config.num_hidden_layers
        if args.logical_tokens is None:
            args.logical_tokens = fitting_capacity(
                args.budget * token_bytes, config_from_env({"SCOUT_CONFIG": args.scout_config}),
                num_layers=config.num_hidden_layers, num_kv_heads=config.num_key_value_heads, head_dim=head_dim,
                itemsize=itemsize, slots=args.num_prompts)
            log(f"scout's logical capacity: {args.logical_tokens} tokens ({args.logical_tokens / args.budget:.1f}x "
                f"the budget), the most whose device part fits {args.budget * token_bytes / 2**20:.1f} MiB")
        rows = [run_server(kind, model_path, args, workdir) for kind in ("stock", "scout")]
        floor = None
        if args.floor:
            floor = run_floor(model_path, args, workdir, sorted(rows[1]["decode"]["by_batch"]))
        for row in rows + [floor] * (floor is not None):
            log(json.dumps(row))
        summary = write_results(rows, args, token_bytes, floor)
        (RESULTS / "server-logs").mkdir(parents=True, exist_ok=True)
        for kind in ("stock", "scout") + ("floor",) * (floor is not None):
            (RESULTS / "server-logs" / f"capacity-{kind}.log").write_text((workdir / f"{kind}.log").read_text())
    print(json.dumps({key: value for key, value in summary.items() if key != "rows"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
