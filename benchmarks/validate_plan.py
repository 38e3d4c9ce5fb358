"""The planner against the real CPU server: capacity (exact) and decode throughput (within 30%).

On a CPU-only machine the "device" of the step model is the CPU itself
(`host_is_device`: launches and compute take turns on one thread): its measured
memory read bandwidth stands in for HBM, the CPU worker pool's measured K/V
rate for the CPU attention, the engine's own measured host time per dispatched
op (in decode steps of the served preset) for the per-launch and per-sync
costs, the measured K/V rates of the stock and the engine's device attention
kernels for their device K/V, and a measured fp32 matmul rate for the peak FLOP
rate (engine_rates.py measures the engine's figures). The stock backend's per-request attention loop is counted
on SGLang's own code. Two figures have no count behind them: the serving
framework's per-step host cost, measured on the stock server at a short context,
and the plugin's per-step host cost beyond its counted ops, measured the same
way on the scout server (runs that are not validated). Nothing of the model is
tuned here: the predictions are `capacity.server_batch()` and
`step_model.step_time()` as they are.

1. Capacity. Three scout servers (tiny preset), each started with one setting
   changed from the first (the token budget, --max-total-tokens,
   --max-running-requests), get more requests than the planner says they admit
   from `python -m sglang.bench_serving`; the most requests decoded together
   (the servers' decode log lines, and the backend's own max_batch_size) must
   equal `server_batch()`, and the device bytes the server reports must equal
   the planner's.
2. Step time. One scout and one stock (torch_native) server, both up at once,
   decode up to three batch / context settings (after a warm-up), the two servers' runs
   interleaved, setting after setting, in three rounds (both also decode the
   two short calibration runs: the stock server's measure the framework's
   per-step host cost, the scout server's the plugin's beyond its counted ops); the
   measured decode tokens/s is the median of the per-step "gen throughput" log
   lines at the full batch (prefill excluded), in the setting's fastest round,
   beside bench_serving's output tokens/s (prefill included). The prediction is
   B / step of the step model at context input + output / 2.

The "device" is one core: both step-time servers run torch on one intra-op
thread (`OMP_NUM_THREADS`, `--device-threads`), and every device figure is
measured on one thread too. The host's other core runs what a GPU box runs on
its host: SGLang's tokenizer and detokenizer processes, the CPU worker and the
client. With two intra-op threads a server shares its cores with all of those,
and each parallel op waits for a preempted thread: whole runs then decoded at
about half speed (281-372 against 516-625 tokens/s in eight runs of one stock
server), more than the tolerance. On one thread, sixteen runs of two such
servers spread 491-639.

The host's speed also drifts by tens of percent over minutes (other work on a
shared machine): one measurement of a figure at a slow moment set against a
step at a fast one misses by that much. So every step-time figure and every
measured step is the best of three, and the servers' runs and the engine's
per-op cost are taken in turn: all of them estimate the host at its best, and a
slow spell falls on both servers alike.

Writes benchmarks/results/plan_validation.{json,md}:

    make validate-plan            # about 15 minutes on a 2-core host
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_capacity import bench_serving, peak_running, token_capacity  # noqa: E402
from engine_rates import engine_dispatch_us  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
STEP_ENV = {"SCOUT_CONFIG": "tiny"}  # the scout server of the step-time runs
STEP_TOLERANCE = 0.30  # |predicted / measured - 1| allowed for the step time
ROUNDS = 3  # every step-time figure and measured step: the best of this many, rounds taken in turn
DECODE_LINE = re.compile(r"Decode batch, #running-req: (\d+),.*?gen throughput \(token/s\): ([\d.]+)")


def log(message: str) -> None:
    print(f"[validate_plan] {message}", file=sys.stderr, flush=True)


def measure_matmul_tflops(*, size: int = 512, rounds: int = 20) -> float:
    """fp32 TFLOP/s of a square matmul on this CPU (the "device" peak of the step model)."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    start = time.perf_counter()
    for _ in range(rounds):
        torch.mm(a, b)
    return 2 * size**3 * rounds / (time.perf_counter() - start) / 1e12


def cpu_figures(spec, config, *, device_threads: int) -> dict:
    """The step model's Hardware figures with the CPU as the device, each with where it came from; the serving
    framework's and the plugin's per-step host costs are added by `calibrated_figures` once the servers have
    been measured.
    `config` is the preset the scout servers run (the engine's own figures are measured on it); the device
    figures are measured on `device_threads` threads, the servers' intra-op threads (this process runs torch on
    as many: main() sets it)."""
    from engine_rates import engine_attention_gbs
    from scout_sglang.plan import measure
    from scout_sglang.sglang_adapter.adapter_ops import adapter_decode_counts
    from scout_sglang.sglang_adapter.stock_attention_ops import measure_stock_attention_gbs, stock_decode_counts

    log("measuring this host: read bandwidth, CPU attention, the engine's dispatch, matmul, stock attention ops")
    read = measure.measure_read_bandwidth(num_threads=device_threads)
    attention = measure.measure_cpu_attention()
    # Each figure is the host's best of ROUNDS, as each measured step is (the host's speed drifts by tens of
    # percent over minutes: a figure measured once at a slow moment would be set against steps at a fast one)
    dispatch = min((engine_dispatch_us(config, spec) for _ in range(ROUNDS)), key=lambda d: d["value"])
    dispatch["how"] += f", best of {ROUNDS}, {device_threads} torch thread(s)"
    engine_rate = max((engine_attention_gbs(spec, block_size=config.block_size) for _ in range(ROUNDS)),
                      key=lambda r: r["value"])
    engine_rate["how"] += f", best of {ROUNDS}"
    tflops = max(measure_matmul_tflops() for _ in range(ROUNDS))
    stock = stock_decode_counts(num_qo_heads=spec.num_qo_heads, num_kv_heads=spec.num_kv_heads,
                                head_dim=spec.head_dim)
    stock_how = "counted: SGLang's torch_native decode loop, on this model's shapes (batches 2 and 3)"
    shape = dict(num_qo_heads=spec.num_qo_heads, num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim)
    stock_rates = [measure_stock_attention_gbs(**shape) for _ in range(3)]
    adapter = adapter_decode_counts(spec.shape(), spec.hidden_size, q_norm=spec.qk_norm)
    adapter_how = ("counted: the plugin's {} on this model's shapes (sglang_adapter/adapter_ops.py), every "
                   "dispatched op (on a CPU device each costs the thread a dispatch)")
    return {
        "hbm_gbs": [read.value, f"measured: {read.source}"],
        "pcie_gbs": [read.value, "the host read bandwidth: a recall is a copy within the same memory"],
        "cpu_attention_gbs": [attention.value, f"measured: {attention.source}"],
        "bf16_tflops": [round(tflops, 4), f"measured: fp32 512 x 512 matmul on {device_threads} thread(s) of this "
                        f"CPU (the servers run fp32), best of {ROUNDS}"],
        "launch_us": [dispatch["value"], dispatch["how"]],
        "sync_us": [dispatch["value"], "as launch_us (a host read on the CPU waits on no queue)"],
        "model_launches_per_layer": [0.0, "the model's own ops are inside the per-step host cost below"],
        "cuda_graphs_for_stock": [False, "the CPU server decodes without graphs (its log: cpu graph: False)"],
        "host_is_device": [True, "the CPU is the device: launches and compute take turns on one thread"],
        "stock_launches_per_layer": [stock.ops_fixed, stock_how],
        "stock_launches_per_request": [stock.ops_per_request, stock_how],
        "stock_syncs_per_request": [stock.scalar_reads_per_request, stock_how],
        "device_attention_gbs": [round(max(stock_rates), 2), "measured: SGLang's torch_native decode loop on this "
                                 "model's shapes, batch 4, K/V of 2048 over 256 tokens a request, median of 20 "
                                 f"calls, best of 3 runs, {device_threads} torch thread(s)"],
        "engine_attention_gbs": [engine_rate["value"], engine_rate["how"] + f", {device_threads} torch thread(s)"],
        "adapter_launches_per_layer": [float(adapter.wrapper_ops), adapter_how.format("decode wrapper per layer")],
        "adapter_launches_per_predicted_layer": [float(adapter.prediction_ops), adapter_how.format(
            "layer-ahead query prediction per layer that takes one")],
    }


def hardware_of(figures: dict):
    from scout_sglang.plan.step_model import Hardware

    return Hardware(**{key: value for key, (value, _) in figures.items()})


def calibrated_figures(figures: dict, calibration: list[dict], spec, config, *, mode: str, keys: tuple[str, str],
                       server: str, output_len: int) -> dict:
    """A host cost per step that nothing counts, as `fixed + per request x B`: a server's measured step at a short
    context minus what the step model gives that step without it, at two batch sizes. Measured on runs that are
    not validated. The stock server's is the serving framework's own (scheduler, batch metadata, sampling, the
    model's ops); the scout server's, on top of it, is the plugin's beyond its counted ops."""
    from scout_sglang.plan.step_model import Workload, step_time

    hardware = hardware_of(figures)
    points = []
    for run in calibration:
        batch, context = run["batch_size"], run["model_context"]
        modelled = step_time(mode, config, spec, hardware, Workload(batch_size=batch, context=context, itemsize=4,
                                                                    output_len=output_len))
        points.append((batch, run["measured_step_ms"] - modelled.step_ms))
    (b0, rest0), (b1, rest1) = sorted(points)
    per_request = (rest1 - rest0) / (b1 - b0)
    fixed = rest0 - per_request * b0
    how = (f"measured: the {server} server's decode step at " + ", ".join(
        f"B={r['batch_size']} ({r['measured_step_ms']:.2f} ms)" for r in calibration)
        + f", context {calibration[0]['model_context']}, less the modelled step; not a validated setting")
    return {**figures, keys[0]: [round(fixed, 3), how], keys[1]: [round(per_request, 3), how]}


def server_args(kind: str, *, max_total_tokens: int, max_running: int, context_length: int) -> list[str]:
    backend = "scout" if kind == "scout" else "torch_native"
    return ["--attention-backend", backend, "--dtype", "float32", "--max-total-tokens", str(max_total_tokens),
            "--max-running-requests", str(max_running), "--disable-radix-cache", "--context-length",
            str(context_length), "--decode-log-interval", "1"]


def decode_rate(log_text: str, batch: int) -> tuple[float, int]:
    """Median per-step gen throughput of the decode log lines at `batch` running requests, and their count."""
    rates = [float(rate) for running, rate in DECODE_LINE.findall(log_text) if int(running) == batch]
    rates = rates[1:] if len(rates) > 2 else rates  # the first line's interval includes the prefill
    return (statistics.median(rates) if rates else 0.0), len(rates)


@contextlib.contextmanager
def served(kind: str, model_path: str, workdir: Path, *, name: str, env: dict, max_total_tokens: int,
           max_running: int, context_length: int):
    """A running server of `kind` ("scout" or "stock"), as a handle for bench_on()."""
    from scout_sglang.server.launch import launched_server

    extra = server_args(kind, max_total_tokens=max_total_tokens, max_running=max_running,
                        context_length=context_length)
    log_path = workdir / f"{name}.log"
    log(f"{name}: starting the {kind} server ({' '.join(extra)}; env {env})")
    with launched_server(model_path, *extra, env=env, log_path=log_path, device="cpu") as base:
        yield SimpleNamespace(kind=kind, name=name, base=base, log_path=log_path, benches=0)


def bench_on(server, model_path: str, workdir: Path, bench: dict, timeout: int) -> dict:
    """One bench_serving run (num_prompts, input_len, output_len) on `server`: the log text it produced and
    bench_serving's result."""
    offset = len(server.log_path.read_text())
    start = time.perf_counter()
    result = bench_serving(server.base, model_path, SimpleNamespace(timeout=timeout, **bench),
                           workdir / f"{server.name}-{server.benches}.jsonl")
    server.benches += 1
    text = server.log_path.read_text()[offset:]
    log(f"{server.name}: {bench['num_prompts']} x ({bench['input_len']} + {bench['output_len']}) in "
        f"{time.perf_counter() - start:.1f} s, peak running {peak_running(text)}")
    return {"bench": bench, "log": text, "result": result}


def run_benches(kind: str, model_path: str, workdir: Path, *, name: str, env: dict, max_total_tokens: int,
                max_running: int, benches: list[dict], timeout: int) -> tuple[list[dict], dict | None, dict]:
    """Start one server, run each bench in turn, and return per bench the log text it produced and
    bench_serving's result, with the scout stats and server_info at the end."""
    from scout_sglang.server.client import get_json, scout_stats

    context_length = max(b["input_len"] + b["output_len"] for b in benches) + 64
    with served(kind, model_path, workdir, name=name, env=env, max_total_tokens=max_total_tokens,
                max_running=max_running, context_length=context_length) as server:
        out = [bench_on(server, model_path, workdir, bench, timeout) for bench in benches]
        stats = scout_stats(server.base) if kind == "scout" else None
        info = get_json(f"{server.base}/server_info")
    return out, stats, info


def validate_capacity(model_path: str, spec, workdir: Path, args) -> list[dict]:
    from scout_sglang.env import config_from_env
    from scout_sglang.plan.capacity import server_batch

    request_tokens = args.cap_input_len + args.cap_output_len
    settings = [  # (what changed, token budget, --max-total-tokens, --max-running-requests)
        ("token budget 128, 4.5 requests of tokens", 128, 4 * request_tokens + request_tokens // 2, 8),
        ("token budget 64, 6.5 requests of tokens", 64, 6 * request_tokens + request_tokens // 2, 8),
        ("token budget 128, 3 request slots", 128, 16 * request_tokens, 3),
    ][: args.capacity_settings]
    rows = []
    for index, (changed, budget, total, running) in enumerate(settings):
        env = {"SCOUT_CONFIG": "tiny", "SCOUT_TOKEN_BUDGET": str(budget)}
        config = config_from_env(env)
        predicted = server_batch(config, spec, itemsize=4, request_tokens=request_tokens, max_total_tokens=total,
                                 max_running_requests=running)
        prompts = predicted.max_batch + 2  # more than it should admit: the server's own limit must show
        bench = dict(num_prompts=prompts, input_len=args.cap_input_len, output_len=args.cap_output_len)
        (run,), stats, info = run_benches("scout", model_path, workdir, name=f"capacity-{index}", env=env,
                                          max_total_tokens=total, max_running=running, benches=[bench],
                                          timeout=args.timeout)
        measured_log = peak_running(run["log"])
        measured_device = stats["memory"]["device_bytes_allocated"]
        row = {
            "setting": changed, "token_budget": budget, "max_total_tokens": total, "max_running_requests": running,
            "request_tokens": request_tokens, "num_prompts": prompts,
            "server_token_capacity": token_capacity(info),
            "predicted_max_batch": predicted.max_batch, "predicted_limit": predicted.limit,
            "measured_peak_running_log": measured_log, "measured_scout_max_batch_size": stats["max_batch_size"],
            "predicted_device_bytes": predicted.device_bytes, "measured_device_bytes": measured_device,
            "predicted_host_bytes": predicted.host_bytes,
            "measured_host_bytes": stats["memory"]["host_bytes_allocated"],
            "completed": run["result"]["completed"],
        }
        row["batch_exact"] = predicted.max_batch == measured_log == stats["max_batch_size"]
        row["device_bytes_exact"] = predicted.device_bytes == measured_device
        row["passed"] = row["batch_exact"] and row["device_bytes_exact"]
        log(f"capacity {changed}: predicted {predicted.max_batch} ({predicted.limit}), server {measured_log} "
            f"(log) / {stats['max_batch_size']} (scout), device bytes {predicted.device_bytes} vs {measured_device}")
        rows.append(row)
    return rows


def measured_runs(runs: list[dict], output_len: int) -> list[dict]:
    """Per bench of one server: its batch, context (input + output / 2), measured decode rate and step."""
    out = []
    for run in runs:
        bench = run["bench"]
        batch = bench["num_prompts"]
        measured, lines = decode_rate(run["log"], batch)
        out.append({"batch_size": batch, "input_len": bench["input_len"], "model_context":
                    bench["input_len"] + output_len // 2, "measured_decode_tokens_per_s": round(measured, 2),
                    "measured_decode_lines": lines,
                    "measured_step_ms": round(batch / measured * 1e3, 3) if measured else None,
                    "bench_output_tokens_per_s": round(run["result"]["output_throughput"], 2),
                    "peak_running": peak_running(run["log"])})
    return out


def fastest_rounds(runs: list[dict], num_settings: int) -> list[dict]:
    """Per setting, its fastest round (the host's best, as every figure of the model is), with every round's
    decode tokens/s beside it. `runs` holds the settings in turn, round after round."""
    out = []
    for index in range(num_settings):
        rounds = runs[index::num_settings]
        best = max(rounds, key=lambda r: r["measured_decode_tokens_per_s"])
        out.append({**best, "rounds_decode_tokens_per_s": [r["measured_decode_tokens_per_s"] for r in rounds]})
    return out


def validate_step(model_path: str, spec, figures: dict, workdir: Path, args) -> tuple[list[dict], dict, list]:
    """Runs the stock and the scout server (the first two benches of each round calibrate the framework's and the
    plugin's per-step host costs), then predicts every validated setting; returns the rows, the final figures and
    the calibration runs of each server."""
    from scout_sglang.env import config_from_env
    from scout_sglang.plan.capacity import STOCK
    from scout_sglang.plan.step_model import Workload, step_time

    settings = [(1, 480), (4, 480), (4, 1984)][: args.step_settings]  # (batch, input length)
    calibration_settings = [(1, args.calibration_input_len), (4, args.calibration_input_len)]
    output_len = args.step_output_len
    bench = lambda batch, input_len: dict(num_prompts=batch, input_len=input_len, output_len=output_len)  # noqa: E731
    total = max(b * (i + output_len) for b, i in settings) * 2
    running = max(b for b, _ in settings + calibration_settings)
    device_env = {"OMP_NUM_THREADS": str(args.device_threads)}  # the servers' "device": this many intra-op threads
    env = {**STEP_ENV, **device_env}
    config = config_from_env(STEP_ENV)
    warmup = bench(running, args.calibration_input_len)  # a server's first requests run slower: not measured
    context_length = max(i for _, i in settings + calibration_settings) + output_len + 64
    runs, dispatch = {"stock": [], "scout": []}, []
    with contextlib.ExitStack() as stack:
        # Both servers up at once (an idle one sleeps), their benches interleaved, round after round: a slow
        # spell of the host falls on both servers and on the calibration alike
        servers = {kind: stack.enter_context(served(
            kind, model_path, workdir, name=f"step-{kind}", env=env if kind == "scout" else device_env,
            max_total_tokens=total, max_running=running, context_length=context_length))
            for kind in ("stock", "scout")}
        for server in servers.values():
            bench_on(server, model_path, workdir, warmup, args.timeout)
        for round_index in range(args.rounds):
            log(f"step round {round_index + 1} of {args.rounds}")
            for b, i in calibration_settings:
                for kind, server in servers.items():
                    runs[kind].append(bench_on(server, model_path, workdir, bench(b, i), args.timeout))
            for b, i in settings:
                for kind, server in servers.items():
                    runs[kind].append(bench_on(server, model_path, workdir, bench(b, i), args.timeout))
            dispatch.append(engine_dispatch_us(config, spec))  # the engine's per-op cost, beside the rounds
    measured = {kind: fastest_rounds(measured_runs(kind_runs, output_len), len(settings) + len(calibration_settings))
                for kind, kind_runs in runs.items()}
    best = min(dispatch, key=lambda d: d["value"])
    if best["value"] < figures["launch_us"][0]:
        figures = {**figures, "launch_us": [best["value"], best["how"]],
                   "sync_us": [best["value"], figures["sync_us"][1]]}
    figures["launch_us"][1] += f" (the best of {ROUNDS} before the servers and {len(dispatch)} between their rounds)"
    calibration = {kind: measured[kind][: len(calibration_settings)] for kind in measured}
    # first the framework's cost (the stock server), then the plugin's on top of it (the scout server)
    figures = calibrated_figures(figures, calibration["stock"], spec, config, mode=STOCK, server="stock",
                                 keys=("step_host_ms", "step_host_ms_per_request"), output_len=output_len)
    figures = calibrated_figures(figures, calibration["scout"], spec, config, mode="scout", server="scout",
                                 keys=("engine_step_host_ms", "engine_step_host_ms_per_request"),
                                 output_len=output_len)
    for key in ("step_host_ms", "step_host_ms_per_request", "engine_step_host_ms", "engine_step_host_ms_per_request"):
        log(f"  {key} = {figures[key][0]} ({figures[key][1]})")
    hardware = hardware_of(figures)
    rows = []
    for kind, mode in (("scout", "scout"), ("stock", STOCK)):
        runs = measured[kind][len(calibration_settings):]
        for run in runs:
            work = Workload(batch_size=run["batch_size"], context=run["model_context"], itemsize=4,
                            output_len=output_len)
            estimate = step_time(mode, config, spec, hardware, work)
            rate = run["measured_decode_tokens_per_s"]
            ratio = estimate.tokens_per_s / rate if rate else float("inf")
            row = {"mode": mode, "server": "scout" if kind == "scout" else "torch_native", **run,
                   "output_len": output_len, "predicted_tokens_per_s": round(estimate.tokens_per_s, 2),
                   "predicted_step_ms": round(estimate.step_ms, 3), "predicted_bound": estimate.bound,
                   "predicted_resource_ms": {k: round(v, 3) for k, v in estimate.resource_ms.items()},
                   "predicted_cpu_ratio": round(estimate.cpu_ratio, 3),
                   "host_counts_source": estimate.host_counts_source,
                   "ratio_predicted_to_measured": round(ratio, 3)}
            row["passed"] = abs(ratio - 1) <= STEP_TOLERANCE
            log(f"step {mode} B={run['batch_size']} ctx={work.context}: predicted {estimate.tokens_per_s:.1f} tok/s "
                f"({estimate.bound}-bound), measured {rate:.1f} tok/s, ratio {ratio:.2f}")
            rows.append(row)
    return rows, figures, calibration


def write_results(summary: dict) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "plan_validation.json").write_text(json.dumps(summary, indent=1) + "\n")
    spec, cap, step = summary["model"], summary["capacity"], summary["step"]
    lines = ["# The planner against the real CPU server", "",
             f"Model: a random-weight Llama of {spec['num_layers']} layers ({spec['num_qo_heads']} query heads, "
             f"{spec['num_kv_heads']} KV heads of {spec['head_dim']} dims, hidden {spec['hidden_size']}, vocab "
             f"{spec['vocab_size']}, float32), served on this CPU by `sglang.launch_server` (scout: the tiny preset); "
             "requests from `python -m sglang.bench_serving` (random-ids, all at once). Host: "
             f"{summary['host']['cpus']} CPUs; the step-time servers' device: "
             f"{summary['host'].get('device_threads', 'all')} intra-op thread(s) (`OMP_NUM_THREADS`), the device "
             f"figures measured on as many. Run time {summary['run_seconds'] / 60:.1f} min.", "",
             "## 1. Capacity: `server_batch()` against the server (must be exact)", "",
             "| setting | token budget | --max-total-tokens | --max-running-requests | request tokens | prompts sent | "
             "predicted batch (limit) | server peak (log) | server max_batch_size | predicted device B | "
             "server device B | pass |", "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|"]
    for r in cap:
        lines.append(f"| {r['setting']} | {r['token_budget']} | {r['max_total_tokens']} | {r['max_running_requests']} "
                     f"| {r['request_tokens']} | {r['num_prompts']} | {r['predicted_max_batch']} "
                     f"({r['predicted_limit']}) | {r['measured_peak_running_log']} | "
                     f"{r['measured_scout_max_batch_size']} | {r['predicted_device_bytes']} | "
                     f"{r['measured_device_bytes']} | {'yes' if r['passed'] else 'NO'} |")
    lines += ["", "## 2. Step time: `step_time()` with the CPU as the device (within 30%)", "",
              "The device figures, each measured on this host or stated:", ""]
    lines += [f"- `{key}` = {value}: {how}" for key, (value, how) in summary["hardware"].items()]
    lines += ["", "Measured decode tokens/s: the median of the server's per-step `gen throughput` log lines at the "
              "full batch (prefill excluded), in the fastest of the setting's rounds (each round's beside it); "
              "bench_serving's output tokens/s (prefill included) of that round.", "",
              "| mode | B | input + output | model context | predicted tok/s | predicted step ms | bound | "
              "measured decode tok/s | rounds (tok/s) | measured step ms | bench_serving tok/s | predicted / measured "
              "| pass |",
              "|---|---:|---|---:|---:|---:|---|---:|---|---:|---:|---:|---|"]
    for r in step:
        lines.append(f"| {r['mode']} | {r['batch_size']} | {r['input_len']} + {r['output_len']} | "
                     f"{r['model_context']} | {r['predicted_tokens_per_s']:.1f} | {r['predicted_step_ms']:.2f} | "
                     f"{r['predicted_bound']} | {r['measured_decode_tokens_per_s']:.1f} | "
                     f"{', '.join(f'{x:.0f}' for x in r.get('rounds_decode_tokens_per_s', []))} | "
                     f"{r['measured_step_ms'] if r['measured_step_ms'] is None else round(r['measured_step_ms'], 2)} "
                     f"| {r['bench_output_tokens_per_s']:.1f} | {r['ratio_predicted_to_measured']:.2f} | "
                     f"{'yes' if r['passed'] else 'NO'} |")
    lines += ["", "Predicted time per resource, summed over the step (ms):", "",
              "| mode | B | context | " + " | ".join(step[0]["predicted_resource_ms"]) + " |",
              "|---|---:|---:|" + "---:|" * len(step[0]["predicted_resource_ms"])]
    for r in step:
        lines.append(f"| {r['mode']} | {r['batch_size']} | {r['model_context']} | "
                     + " | ".join(f"{v:.3f}" for v in r["predicted_resource_ms"].values()) + " |")
    lines += ["", "## Verdict", ""] + [f"- {line}" for line in summary["verdict"]]
    lines += calibration_lines(summary["calibration"], summary["hardware"])
    lines += misses(step)
    lines += ["", "## Limits of this comparison", "",
              "- The planner has no CPU \"device\" in its GPU table; the step model's `Hardware` is built here from "
              "this host's measured figures (above) and `step_time()` called directly, as `--gpu custom` would with "
              "the same numbers. Capacity needs no device figures: `server_batch()` takes the server's settings.",
              "- The serving framework's per-step host cost (SGLang's scheduling, batch metadata, sampling and the "
              "model's own ops) has no count the model could price: it is measured on the stock server at a short "
              "context, on runs that are not validated, and carried over to both servers. The plugin's host work "
              "beyond its counted ops (its batch bookkeeping, the forward hooks on the model's layers, its ops "
              "running slower inside the server than where they were timed) is measured the same way on the scout "
              "server, on top of the framework's. The rows therefore check the model's scaling in batch and context "
              "from those short-context points: the K/V each mode reads, scout's CPU part, recall and plan.",
              "- The engine's ops, host reads and plan per step come from `benchmarks/results/host_overhead.json` "
              "(counted on this engine at its measured batches, at the measured number of KV heads nearest the "
              "model's), not from this run. The plugin's own ops around the engine (its decode wrapper, the "
              "layer-ahead prediction) are counted on its code at this model's shapes; its per-step batch "
              "bookkeeping outside the layers, and the forward hooks' cost to the model's own layers, are not.",
              "- The engine's per-op host cost is measured in its decode steps on the served preset (its recall "
              "policy and CPU part included, the CPU worker beside it) at a short context, apart from the servers; "
              "the K/V rates of both attention kernels are the median call, measured apart from the servers "
              "too.",
              "- One run on a 2-core host; each step-time figure and each measured step is the best of "
              f"{ROUNDS} (a measured step: the median of a round's decode steps)."]
    (RESULTS / "plan_validation.md").write_text("\n".join(lines) + "\n")


def calibration_lines(calibration: dict, figures: dict) -> list[str]:
    lines = ["", "## The per-step host costs nothing counts (measured, not validated)", "",
             "| server | B | input + output | measured step ms |", "|---|---:|---|---:|"]
    for kind, runs in calibration.items():
        for r in runs:
            lines.append(f"| {'torch_native' if kind == 'stock' else kind} | {r['batch_size']} | {r['input_len']} + "
                         f"{2 * (r['model_context'] - r['input_len'])} | {r['measured_step_ms']:.2f} |")
    lines += ["", f"-> `step_host_ms` = {figures['step_host_ms'][0]} ms, `step_host_ms_per_request` = "
              f"{figures['step_host_ms_per_request'][0]} ms (the stock server's steps less the modelled stock step: "
              "the serving framework's own work)."]
    if "engine_step_host_ms" in figures:
        lines += [f"-> `engine_step_host_ms` = {figures['engine_step_host_ms'][0]} ms, "
                  f"`engine_step_host_ms_per_request` = {figures['engine_step_host_ms_per_request'][0]} ms (the scout "
                  "server's steps less the modelled scout step, the framework's figures above included: the "
                  "plugin's work beyond its counted ops)."]
    return lines


def misses(step: list[dict]) -> list[str]:
    """Per setting, the stock step and what scout adds over it, measured and predicted (no fitting)."""
    pairs = [(s, f) for s in step if s["mode"] == "scout" for f in step
             if f["mode"] != "scout" and (f["batch_size"], f["input_len"]) == (s["batch_size"], s["input_len"])]
    if not pairs or any(r["measured_step_ms"] is None for pair in pairs for r in pair):
        return []
    lines = ["", "## Scout over stock, per setting", "",
             "| B | context | full: measured ms | full: predicted ms | scout - full: measured ms | "
             "scout - full: predicted ms |", "|---:|---:|---:|---:|---:|---:|"]
    for s, f in pairs:
        lines.append(f"| {s['batch_size']} | {s['model_context']} | {f['measured_step_ms']:.2f} | "
                     f"{f['predicted_step_ms']:.2f} | {s['measured_step_ms'] - f['measured_step_ms']:.2f} | "
                     f"{s['predicted_step_ms'] - f['predicted_step_ms']:.2f} |")
    return lines


def verdict(cap: list[dict], step: list[dict]) -> list[str]:
    out = []
    for r in cap:
        out.append(f"capacity, {r['setting']}: predicted {r['predicted_max_batch']}, server "
                   f"{r['measured_peak_running_log']} (log) / {r['measured_scout_max_batch_size']} (max_batch_size): "
                   f"batch {'exact' if r['batch_exact'] else 'NOT exact'}; device bytes "
                   f"{'equal' if r['device_bytes_exact'] else 'NOT equal'} -> {'PASS' if r['passed'] else 'FAIL'}")
    for r in step:
        out.append(f"step time, {r['mode']} B={r['batch_size']} context {r['model_context']}: predicted / measured "
                   f"{r['ratio_predicted_to_measured']:.2f} -> {'PASS' if r['passed'] else 'FAIL'} (within 30%: "
                   f"{'yes' if r['passed'] else 'no'})")
    out.append(f"capacity: {sum(r['passed'] for r in cap)} of {len(cap)} settings pass; step time: "
               f"{sum(r['passed'] for r in step)} of {len(step)} pass.")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-layers", type=int, default=4, help="layers of the built tiny Llama")
    parser.add_argument("--cap-input-len", type=int, default=224)
    parser.add_argument("--cap-output-len", type=int, default=32)
    parser.add_argument("--step-output-len", type=int, default=64)
    parser.add_argument("--calibration-input-len", type=int, default=32,
                        help="input tokens of the stock runs that measure the framework's per-step host cost")
    parser.add_argument("--capacity-settings", type=int, default=3, help="how many capacity settings to run (1-3)")
    parser.add_argument("--step-settings", type=int, default=3, help="how many batch / context settings (1-3)")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help="rounds of the step-time settings per server; each setting's fastest round is kept")
    parser.add_argument("--device-threads", type=int, default=1,
                        help="torch intra-op threads of the step-time servers and of the device figures' measurements "
                             "(the CPU \"device\"); the other cores run the framework's processes, the CPU worker and "
                             "the client")
    parser.add_argument("--timeout", type=int, default=600)
    args = parser.parse_args(argv)
    if not 1 <= args.device_threads <= len(os.sched_getaffinity(0)):
        parser.error(f"--device-threads must be between 1 and the {len(os.sched_getaffinity(0))} usable CPUs, "
                     f"got {args.device_threads}")
    # before sglang is imported: its rotary embedding (counted with the plugin's ops) is the CPU server's
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        from scout_sglang.hf.tiny_models import save_tiny_model
        from scout_sglang.plan.models import load_model

        model_path = str(save_tiny_model(workdir / "model", "llama", num_layers=args.num_layers, hidden=64,
                                         num_heads=4, num_kv_heads=2, head_dim=16, max_positions=16384))
        spec = load_model(model_path)
        from scout_sglang.env import config_from_env

        import torch

        torch.set_num_threads(args.device_threads)  # the device figures are measured as the servers run
        figures = cpu_figures(spec, config_from_env(STEP_ENV), device_threads=args.device_threads)
        cap = validate_capacity(model_path, spec, workdir, args)
        step, figures, calibration = validate_step(model_path, spec, figures, workdir, args)
        (RESULTS / "server-logs").mkdir(parents=True, exist_ok=True)
        for path in sorted(workdir.glob("*.log")):
            (RESULTS / "server-logs" / f"plan-validation-{path.name}").write_text(path.read_text())
    summary = {
        "model": {key: getattr(spec, key) for key in ("num_layers", "num_qo_heads", "num_kv_heads", "head_dim",
                                                       "hidden_size", "intermediate_size", "vocab_size")},
        "host": {"cpus": len(os.sched_getaffinity(0)), "device_threads": args.device_threads},
        "hardware": figures, "calibration": calibration, "capacity": cap, "step": step,
        "verdict": verdict(cap, step),
        "run_seconds": round(time.perf_counter() - started, 1),
    }
    write_results(summary)
    for line in summary["verdict"]:
        log(line)
    print(json.dumps({"verdict": summary["verdict"], "run_seconds": summary["run_seconds"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
