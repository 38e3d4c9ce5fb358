"""Decode-step benchmark: one step of a Qwen3-8B-shaped attention stack in every
mode (full, quest, infinigen, hgca, scout), its time broken down as in the
paper's Figure 11, and the layer-ahead / recall ablation of its Figure 12.

Drives CoAttentionEngine exactly as a model would (begin_step; per layer
predict(i + 1) then attend(i) then the rest of the layer; end_step) and reads
the engine's StepTelemetry timers: device_attention, select, cpu_wait, merge,
recall. The CPU worker's own time is measured beside the engine: the pool is
wrapped (same submit / wait interface) and a watcher thread records when each
submit's tasks finish, giving the wall time during which the CPU worker had
work outstanding ("CPU busy"); the worker threads' CPU seconds are read from
/proc as a second, coarser measure (10 ms ticks, summed over the timed steps).

Workload (random, seeded; nothing here comes from a real model):
  * shape: Hq 32, Hkv 8, D 128, bf16, block 32 (Qwen3-8B), `--layers` layers
    (default 4, not 36: a 2-core machine); layer 0 is dense, as in the
    engine's default `dense_layers=(0,)`, so with 4 layers the dense layer is
    1/4 of the stack instead of 1/36;
  * keys: N(0, 1) plus a per-(block, KV head) bias vector N(0, 0.5^2), so block
    digests differ and top-k selection depends on the query's direction;
    values N(0, 1); new tokens follow the same law;
  * queries: per (layer, request, head) a stationary AR(1) random walk,
    q_t = rho q_(t-1) + sqrt(1 - rho^2) eps with rho = `--query-rho` (0.99):
    slow drift, so consecutive steps select mostly the same blocks and the
    resident buffer and recall matter;
  * predicted queries (layer ahead): q + sigma eps with sigma = `--predict-noise`
    (0.33), cosine to the real query ~0.95 (the paper measures 0.93-0.97);
  * the rest of each layer (projections, FFN) is simulated after its attention
    for `--layer-compute-ms` (default 2 ms): on CUDA a bf16 matmul chain
    calibrated to that time; on the CPU a sleep, i.e. a device that is busy
    while the host cores are free (`--layer-compute matmul` burns the cores
    instead).

The modes of one shape (and the ablation's configurations) run interleaved,
one step of each in turn, so the background load of a shared machine falls on
all of them alike; one after the other only when their KV would not fit in
memory together (the report says which). One warm-up step (more for the
ablation), then the median of the timed steps. On the CPU "device" the cores
are split: torch ops get `--device-threads` (half the cores), the CPU worker
the rest.
Progress goes to stderr; the last stdout line is one JSON object. Without
--quick it writes benchmarks/results/decode_step.{md,json,png}. Benchmarks do
not assert.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import queue
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
MODES = ("full", "quest", "infinigen", "hgca", "scout")
NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 32  # Qwen3-8B
ENGINE_TIMERS = ("device_attention", "select", "cpu_wait", "merge", "recall")
BREAKDOWN = ENGINE_TIMERS + ("layer_compute", "other")  # stacked: they add up to the step
ABLATION = (  # (label, layer_ahead, recall_policy)
    ("no layer-ahead, no recall", False, "off"),
    ("layer-ahead, no recall", True, "off"),
    ("layer-ahead + recall", True, "adaptive"),
)


def log(message: str) -> None:
    print(f"[bench_decode_step] {message}", file=sys.stderr, flush=True)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- the CPU worker, watched ---------------------------------------------------------------------
class WatchedPool:
    """A CpuAttentionPool seen through its public submit / wait, with finish times.

    A watcher thread waits on every handle in submit order (the pool serves
    one FIFO queue) and records (submitted, finished) wall times; the union of
    those spans is the time the CPU worker had work outstanding.
    """

    def __init__(self, pool):
        self.pool = pool
        self._pending: queue.SimpleQueue = queue.SimpleQueue()
        self._spans: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self._submitted = 0
        self._finished = 0
        self._thread = threading.Thread(target=self._watch, name="bench-cpu-watch", daemon=True)
        self._thread.start()

    def submit(self, *args, **kwargs):
        start = time.perf_counter()
        handle = self.pool.submit(*args, **kwargs)
        self._submitted += 1
        self._pending.put((handle, start))
        return handle

    def wait(self, handle, timeout=None):
        self.pool.wait(handle, timeout)

    def _watch(self):
        while (item := self._pending.get()) is not None:
            handle, start = item
            try:
                self.pool.wait(handle)
            except Exception:  # noqa: BLE001 - the engine's own wait reports failures
                pass
            with self._lock:
                self._spans.append((start, time.perf_counter()))
                self._finished += 1

    def take_busy_s(self) -> float:
        """Seconds covered by the spans of every submit so far (then forgets them)."""
        while True:
            with self._lock:
                if self._finished >= self._submitted:
                    spans, self._spans = sorted(self._spans), []
                    break
            time.sleep(1e-4)
        busy, end = 0.0, -math.inf
        for start, finish in spans:
            if finish > end:
                busy += finish - max(start, end)
                end = finish
        return busy

    def thread_cpu_s(self) -> float | None:
        """CPU seconds consumed so far by the pool's worker threads (Linux /proc; 10 ms ticks)."""
        tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        total = 0
        try:
            for thread in self.pool.threads:
                fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, IndexError, ValueError):
            return None
        return total / tick

    def shutdown(self):
        self._pending.put(None)
        self._thread.join()
        self.pool.shutdown()


# -- the rest of the layer -----------------------------------------------------------------------
class LayerCompute:
    """Stands in for a layer's projections and FFN: `ms` milliseconds of device time.

    kind "sleep": the host thread sleeps (a device busy while the host cores are
    free; the CPU default). kind "matmul": a chain of square matmuls on the
    device, calibrated to `ms` (the CUDA default; on the CPU it burns the cores).
    """

    def __init__(self, ms: float, kind: str, device: torch.device):
        self.ms, self.kind, self.device = ms, kind, device
        self.reps, self.calibrated_ms = 0, 0.0
        if ms <= 0:
            return
        if kind == "matmul":
            n = 4096 if device.type == "cuda" else 512
            dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
            self.a = torch.randn(n, n, device=device, dtype=dtype)
            self.b = torch.randn(n, n, device=device, dtype=dtype)
            self.out = torch.empty_like(self.a)
            for _ in range(3):
                torch.matmul(self.a, self.b, out=self.out)
            synchronize(device)
            trials = 20
            start = time.perf_counter()
            for _ in range(trials):
                torch.matmul(self.a, self.b, out=self.out)
            synchronize(device)
            per_rep_ms = 1e3 * (time.perf_counter() - start) / trials
            self.reps = max(1, round(ms / per_rep_ms))
            self.calibrated_ms = self.reps * per_rep_ms
            log(f"layer compute: {self.reps} x {n}x{n} matmul = {self.calibrated_ms:.2f} ms per layer")

    def __call__(self) -> float:
        """Run it; seconds it took (the calibrated time on CUDA, where the launch is asynchronous)."""
        if self.ms <= 0:
            return 0.0
        start = time.perf_counter()
        if self.kind == "sleep":
            time.sleep(self.ms * 1e-3)
            return time.perf_counter() - start
        for _ in range(self.reps):
            torch.matmul(self.a, self.b, out=self.out)
        if self.device.type == "cuda":
            return self.calibrated_ms * 1e-3
        return time.perf_counter() - start


# -- workload --------------------------------------------------------------------------------------
def block_biased(n: int, bias: torch.Tensor, gen: torch.Generator, first_token: int = 0) -> torch.Tensor:
    """[n, Hkv, D] N(0, 1) keys plus the bias [NB, Hkv, D] of each token's block."""
    blocks = torch.arange(first_token, first_token + n) // BLOCK_SIZE
    return torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=gen) + bias[blocks]


class Prompts:
    """Prompt K/V of `max_batch` requests at one context length, per layer (bf16, CPU)."""

    def __init__(self, context: int, max_batch: int, num_layers: int, max_new: int, *, seed: int):
        gen = torch.Generator().manual_seed(seed)
        num_blocks = (context + max_new) // BLOCK_SIZE + 1
        self.context = context
        self.bias, self.k, self.v = {}, {}, {}
        for b in range(max_batch):
            for layer in range(num_layers):
                bias = 0.5 * torch.randn(num_blocks, NUM_KV_HEADS, HEAD_DIM, generator=gen)
                self.bias[b, layer] = bias
                self.k[b, layer] = block_biased(context, bias, gen).to(torch.bfloat16)
                self.v[b, layer] = torch.randn(context, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16)


class StepInputs:
    """Queries, predicted queries and new K/V of `num_steps` steps, [steps, layers, B, ...] bf16."""

    def __init__(self, prompts: Prompts, batch_size: int, num_layers: int, num_steps: int, *, rho: float,
                 predict_noise: float, seed: int, device: torch.device):
        gen = torch.Generator().manual_seed(seed)
        shape_q = (num_layers, batch_size, NUM_QO_HEADS, HEAD_DIM)
        state = torch.randn(*shape_q, generator=gen)
        q, q_pred, k_new, v_new = [], [], [], []
        for s in range(num_steps):
            state = rho * state + math.sqrt(1 - rho**2) * torch.randn(*shape_q, generator=gen)
            q.append(state)
            q_pred.append(state + predict_noise * torch.randn(*shape_q, generator=gen))
            position = prompts.context + s
            k_new.append(torch.stack([
                torch.stack([block_biased(1, prompts.bias[b, layer], gen, position)[0] for b in range(batch_size)])
                for layer in range(num_layers)
            ]))  # fmt: skip
            v_new.append(torch.randn(num_layers, batch_size, NUM_KV_HEADS, HEAD_DIM, generator=gen))
        self.q = torch.stack(q).to(device, torch.bfloat16)  # [steps, L, B, Hq, D]
        self.q_pred = torch.stack(q_pred).to(device, torch.bfloat16)  # [steps, L, B, Hq, D]
        self.k_new = torch.stack(k_new).to(device, torch.bfloat16)  # [steps, L, B, Hkv, D]
        self.v_new = torch.stack(v_new).to(device, torch.bfloat16)  # [steps, L, B, Hkv, D]
        qf, pf = self.q.float(), self.q_pred.float()
        self.predict_cosine = float(torch.nn.functional.cosine_similarity(qf, pf, dim=-1).mean())
        self.step_cosine = 1.0
        if num_steps > 1:
            self.step_cosine = float(torch.nn.functional.cosine_similarity(qf[1:], qf[:-1], dim=-1).mean())


# -- one engine, several steps ---------------------------------------------------------------------
class EngineRun:
    """One engine (mode + switches) on one shape: prefill, then steps on demand, then a summary."""

    def __init__(self, args, prompts, *, mode, batch_size, total_steps, device, pool, layer_ahead=True,
                 recall_policy="adaptive", track_changes=False, label=None):
        from scout_sglang.config import ScoutConfig
        from scout_sglang.core.engine import CoAttentionEngine
        from scout_sglang.core.shape import ModelShape

        self.args, self.device, self.batch_size = args, device, batch_size
        self.mode, self.label = mode, label or mode
        self.layer_ahead, self.recall_policy = layer_ahead, recall_policy
        self.context = prompts.context
        shape = ModelShape(num_layers=args.layers, num_qo_heads=NUM_QO_HEADS, num_kv_heads=NUM_KV_HEADS,
                           head_dim=HEAD_DIM)
        config = ScoutConfig(mode=mode, block_size=BLOCK_SIZE, token_budget=args.token_budget, layer_ahead=layer_ahead,
                             recall_policy=recall_policy, kernel_impl=args.kernel_impl, cpu_impl=args.cpu_impl)
        self.engine = CoAttentionEngine(config, shape, device=device, dtype=torch.bfloat16, max_requests=batch_size,
                                        max_tokens_per_request=prompts.context + total_steps + BLOCK_SIZE,
                                        cpu_pool=pool, track_changes=track_changes)  # fmt: skip
        start = time.perf_counter()
        for b in range(batch_size):
            self.engine.add_request(b)
            for layer in range(args.layers):
                self.engine.prefill(b, layer, prompts.k[b, layer].to(device), prompts.v[b, layer].to(device))
        synchronize(device)
        self.prefill_s = time.perf_counter() - start
        self.rows: list[dict] = []

    def step(self, inputs, s: int, *, pool, layer_compute, timed: bool) -> None:
        """Decode step s of `inputs`; recorded when `timed`."""
        engine, device, layers = self.engine, self.device, self.args.layers
        pool.take_busy_s()
        cpu_before = pool.thread_cpu_s()
        synchronize(device)
        start = time.perf_counter()
        engine.begin_step(list(range(self.batch_size)))
        layer_s, first_layer_s = 0.0, 0.0
        for layer in range(layers):
            if engine.wants_prediction(layer + 1):
                engine.predict(layer + 1, inputs.q_pred[s, layer + 1])
            engine.attend(layer, inputs.q[s, layer], inputs.k_new[s, layer], inputs.v_new[s, layer])
            if layer == 0:
                synchronize(device)
                first_layer_s = time.perf_counter() - start
            layer_s += layer_compute()
        telemetry = engine.end_step()
        synchronize(device)
        step_s = time.perf_counter() - start
        busy_s = pool.take_busy_s()
        cpu_after = pool.thread_cpu_s()
        if not timed:
            return
        timings = {key: telemetry.timings.get(key, 0.0) for key in ENGINE_TIMERS}
        timings["layer_compute"] = layer_s
        timings["other"] = step_s - sum(timings.values())
        totals = telemetry.totals()
        self.rows.append(dict(
            step_s=step_s, first_layer_s=first_layer_s, cpu_busy_s=busy_s, timings=timings,
            cpu_thread_s=None if cpu_before is None or cpu_after is None else cpu_after - cpu_before,
            cpu_ratio=totals.cpu_ratio, change_rate=totals.change_rate, recalled_blocks=totals.recalled_blocks,
            recall_bytes=totals.recall_bytes, dropped_blocks=totals.dropped_blocks,
        ))  # fmt: skip

    def close(self) -> None:
        self.engine.close()
        self.engine = None

    def summary(self) -> dict:
        rows, med = self.rows, statistics.median
        step_ms = 1e3 * med([r["step_s"] for r in rows])
        threads = [r["cpu_thread_s"] for r in rows]
        return dict(
            mode=self.mode, label=self.label, context=self.context, batch_size=self.batch_size,
            layers=self.args.layers, layer_ahead=self.layer_ahead, recall_policy=self.recall_policy,
            timed_steps=len(rows), prefill_s=round(self.prefill_s, 3),
            step_ms=step_ms,
            step_ms_all=[round(1e3 * r["step_s"], 3) for r in rows],
            tokens_per_s=self.batch_size / (step_ms * 1e-3),
            layer0_ms=1e3 * med([r["first_layer_s"] for r in rows]),
            breakdown_ms={key: 1e3 * med([r["timings"][key] for r in rows]) for key in BREAKDOWN},
            cpu_busy_ms=1e3 * med([r["cpu_busy_s"] for r in rows]),
            cpu_thread_ms_per_step=None if None in threads else 1e3 * statistics.fmean(threads),
            idle_frac=med([r["timings"]["cpu_wait"] / r["step_s"] for r in rows]),
            cpu_ratio=statistics.fmean(r["cpu_ratio"] for r in rows),
            change_rate=statistics.fmean(r["change_rate"] for r in rows),
            recalled_blocks_per_step=statistics.fmean(r["recalled_blocks"] for r in rows),
            recall_mb_per_step=statistics.fmean(r["recall_bytes"] for r in rows) / 1e6,
            dropped_blocks_per_step=statistics.fmean(r["dropped_blocks"] for r in rows),
        )  # fmt: skip


def engine_bytes(args, context: int, batch_size: int, total_steps: int) -> int:
    """Rough host memory of one engine: every layer's KV once (device store or host store)."""
    pages = batch_size * ((context + total_steps + BLOCK_SIZE) // BLOCK_SIZE + 1)
    return 2 * args.layers * pages * NUM_KV_HEADS * BLOCK_SIZE * HEAD_DIM * 2  # K and V, bf16


def available_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def run_interleaved(args, prompts, inputs, configs, *, batch_size, warmup, steps, pool, layer_compute,
                    device) -> tuple[list[dict], bool]:
    """Run several engine configurations on the same inputs, one step of each in turn.

    Interleaving puts every configuration under the same background load (the
    machine is shared); when their KV together would not fit in memory
    (device or host), they run one after the other instead. Returns the
    summaries and whether they were interleaved.
    """
    total = warmup + steps
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        budget = 0.6 * free
    else:
        avail = available_bytes()
        budget = 0.5 * avail if avail else 0
    interleave = len(configs) * engine_bytes(args, prompts.context, batch_size, total) <= budget
    groups = [configs] if interleave else [[c] for c in configs]
    results = []
    for group in groups:
        runs = [EngineRun(args, prompts, batch_size=batch_size, total_steps=total, device=device, pool=pool, **c)
                for c in group]
        for s in range(total):
            for run in runs:
                run.step(inputs, s, pool=pool, layer_compute=layer_compute, timed=s >= warmup)
        for run in runs:
            run.close()
            results.append(run.summary())
        del runs
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results, interleave


# -- hardware --------------------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or "unknown"


def host_read_bandwidth_gbs(num_bytes: int = 512 << 20) -> float:
    """Host memory read bandwidth, a sum over a large buffer (median of 5)."""
    buf = torch.ones(num_bytes // 4, dtype=torch.float32)
    times = []
    for _ in range(6):
        start = time.perf_counter()
        buf.sum()
        times.append(time.perf_counter() - start)
    return num_bytes / statistics.median(times[1:]) / 1e9


def hardware(device: torch.device, pool) -> dict:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info = dict(cpu_model=cpu_model(), cores=cores, torch=torch.__version__, torch_threads=torch.get_num_threads(),
                host_read_gbs=host_read_bandwidth_gbs(), cpu_pool=repr(pool.pool), device=str(device))
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


# -- reports ---------------------------------------------------------------------------------------
def fmt(value, digits=1):
    return "-" if value is None else f"{value:.{digits}f}"


def spread(row: dict) -> str:
    """Fastest-slowest timed step: the noise a ratio between two rows has to beat."""
    return f"{min(row['step_ms_all']):.0f}-{max(row['step_ms_all']):.0f}"


def sweep_table(rows: list[dict]) -> list[str]:
    head = ("| mode | step ms | min-max | tok/s | vs full | layer 0 | device attn | select | cpu_wait | merge | recall | layer compute"
            " | other (host) | CPU busy | CPU thread | idle | CPU ratio |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    full = next((r for r in rows if r["mode"] == "full"), None)
    for r in rows:
        b = r["breakdown_ms"]
        speedup = full["step_ms"] / r["step_ms"] if full else None
        lines.append(
            f"| {r['mode']} | {fmt(r['step_ms'])} | {spread(r)} | {fmt(r['tokens_per_s'])} | {fmt(speedup, 2)}x | {fmt(r['layer0_ms'])} | "
            + " | ".join(fmt(b[k]) for k in BREAKDOWN)
            + f" | {fmt(r['cpu_busy_ms'])} | {fmt(r['cpu_thread_ms_per_step'])} | {r['idle_frac']:.1%} | {r['cpu_ratio']:.1%} |"
        )
    return lines


def ablation_table(rows: list[dict]) -> list[str]:
    lines = ["| configuration | step ms | min-max | speedup | device attn | select | cpu_wait | merge | recall | CPU busy | idle"
             " | CPU ratio | recalled blocks/step |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    base = rows[0]["step_ms"]
    for r in rows:
        b = r["breakdown_ms"]
        lines.append(
            f"| {r['label']} | {fmt(r['step_ms'])} | {spread(r)} | {base / r['step_ms']:.2f}x | "
            + " | ".join(fmt(b[k]) for k in ENGINE_TIMERS)
            + f" | {fmt(r['cpu_busy_ms'])} | {r['idle_frac']:.1%} | {r['cpu_ratio']:.1%} | {fmt(r['recalled_blocks_per_step'])} |"
        )
    return lines


def write_markdown(path: Path, report: dict) -> None:
    hw, wl = report["hardware"], report["workload"]
    on_cpu = hw["device"] == "cpu"
    lines = [
        "# Decode step: time breakdown per mode (Figure 11) and ablation (Figure 12)",
        "",
        "Written by `benchmarks/bench_decode_step.py`; all numbers from one run.",
        "",
        "## Hardware",
        "",
        f"- CPU: {hw['cpu_model']}, {hw['cores']} cores available; host memory read bandwidth "
        f"{hw['host_read_gbs']:.1f} GB/s (measured in this run)",
        f"- torch {hw['torch']}, {hw['torch_threads']} intra-op threads; CPU worker: {hw['cpu_pool']}",
        f"- device: `{hw['device']}`" + (f" ({hw['gpu']})" if "gpu" in hw else ""),
        f"- load average (1 min) before / after: {report['load_before']:.2f} / {report['load_after']:.2f}"
        " (the machine is shared; other processes add noise)",
    ]
    if on_cpu:
        lines += [
            "",
            "**The \"device\" here is the CPU itself.** Device attention runs as torch ops "
            f"({hw['torch_threads']} thread) on the same {hw['cores']} cores as the CPU attention worker "
            f"({report['cpu_groups']} thread), and the \"device KV\" is host RAM. Overlap of "
            "device work with CPU work therefore competes for the same cores and the same memory bandwidth: "
            "these numbers show what the engine does per step and what its host-side bookkeeping costs, "
            "not the GPU picture (HBM vs host DRAM, a GPU that computes while the host cores attend). "
            "Ratios between modes measured here do not transfer to a GPU server. Where the CPU worker (native "
            "kernel) is faster than the torch path that plays the device, as here, modes that move work to the CPU "
            "(hgca) gain, and scout's layer-ahead window has little to hide (compare its cpu_wait with and "
            "without layer-ahead in the ablation): the opposite of the GPU regime the method is built for.",
        ]
    else:
        lines += [
            "",
            "On CUDA the engine's timers are host wall times around asynchronous launches (they include a kernel's "
            "run time only where the engine copies a result to the host); the step time is read after "
            "torch.cuda.synchronize and is exact.",
        ]
    lines += [
        "",
        "## Workload",
        "",
        f"- Qwen3-8B attention shape: Hq {NUM_QO_HEADS}, Hkv {NUM_KV_HEADS}, D {HEAD_DIM}, bf16, block {BLOCK_SIZE}; "
        f"**{wl['layers']} layers** (not 36), layer 0 dense (engine default `dense_layers=(0,)`), so the dense "
        f"layer weighs 1/{wl['layers']} of the stack instead of 1/36",
        f"- token budget {wl['token_budget']} ({wl['token_budget'] // BLOCK_SIZE} blocks per request, layer and KV head; "
        "resident buffer and CPU list capacity default to the same)",
        "- keys N(0,1) + a per-(block, KV head) bias N(0, 0.5^2); values N(0,1)",
        f"- queries: AR(1) walk per (layer, request, head), rho {wl['query_rho']} "
        f"(cosine between consecutive steps {wl['step_cosine']:.3f}); predicted query = query + "
        f"{wl['predict_noise']} N(0,1) (cosine to the real query {wl['predict_cosine']:.3f})",
        f"- rest of each layer simulated for {wl['layer_compute_ms']} ms ({wl['layer_compute_kind']}) after its attention",
        f"- per shape: {wl['warmup']} warm-up step, median of {wl['steps']} timed steps; the modes of a shape run "
        "interleaved (one step of each in turn) so background load falls on all alike; every column is its own "
        "median, so the stacked columns add up to the step time only approximately",
    ]
    if wl.get("quest_change_rate") is not None:
        lines.append(f"- selected blocks that change between consecutive steps (quest, real queries): "
                     f"{wl['quest_change_rate']:.1%} (the paper: < 15%)")
    lines += [
        "",
        "Columns (ms per step): device attn, select, cpu_wait, merge, recall are the engine's own timers "
        "(StepTelemetry); layer compute is the simulated rest of the layers; other = step - all of those "
        "(host bookkeeping: block tables, splits, copies, Python). layer 0 = wall time from begin_step to the end of "
        "layer 0's attention (the dense layer plus step set-up; part of the other columns, shown because with few "
        "layers it weighs much more than at 36). CPU busy = wall time the CPU worker had "
        "a submit outstanding (it overlaps the other columns and is not part of the sum); CPU thread = CPU "
        "seconds of the worker threads per step (/proc, 10 ms ticks). idle = cpu_wait / step, the time the "
        "device waits for the CPU. CPU ratio = CPU-attended blocks / budget blocks.",
        "",
        "## Summary over the shapes",
        "",
        "| mode | speedup vs full (geometric mean) | range | idle (median) | idle (max) | CPU ratio (mean) |",
        "|---|---|---|---|---|---|",
    ]
    for mode in dict.fromkeys(r["mode"] for shape in report["shapes"] for r in shape["modes"]):
        speedups, idles, ratios = [], [], []
        for shape in report["shapes"]:
            full = next((r for r in shape["modes"] if r["mode"] == "full"), None)
            for r in (r for r in shape["modes"] if r["mode"] == mode):
                idles.append(r["idle_frac"])
                ratios.append(r["cpu_ratio"])
                if full:
                    speedups.append(full["step_ms"] / r["step_ms"])
        geo = math.exp(statistics.fmean(math.log(x) for x in speedups)) if speedups else None
        span = f"{min(speedups):.2f}-{max(speedups):.2f}x" if speedups else "-"
        lines.append(f"| {mode} | {fmt(geo, 2)}x | {span} | {statistics.median(idles):.1%} | {max(idles):.1%} | "
                     f"{statistics.fmean(ratios):.1%} |")
    lines += [
        "",
        "## Sweep",
    ]
    for shape in report["shapes"]:
        order = "" if shape["interleaved"] else " (modes one after the other: not enough memory to interleave)"
        lines += ["", f"### context {shape['context']}, batch {shape['batch_size']}{order}", ""]
        lines += sweep_table(shape["modes"])
    for shape in report["skipped"]:
        lines.append(f"\nSkipped: context {shape['context']}, batch {shape['batch_size']} ({shape['why']}).")
    ab = report.get("ablation")
    if ab:
        lines += [
            "",
            f"## Ablation (scout, context {ab['context']}, batch {ab['batch_size']}, {ab['warmup']} warm-up steps, "
            f"median of {ab['steps']})",
            "",
            "Speedup relative to the first row; compare it with the min-max spread of the steps before reading "
            "an effect into it. The paper (Qwen3, GPU): layer-ahead 1.39x, recall a further 1.20x.",
            "",
        ]
        lines += ablation_table(ab["rows"])
    lines += ["", "![breakdown](decode_step.png)", ""]
    path.write_text("\n".join(lines) + "\n")


def write_plot(path: Path, report: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = report["shapes"]
    colors = dict(device_attention="#4c72b0", select="#dd8452", cpu_wait="#c44e52", merge="#8172b3",
                  recall="#55a868", layer_compute="#937860", other="#bbbbbb")  # fmt: skip
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


# -- main ------------------------------------------------------------------------------------------
def parse_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> int:
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="context 4096, batch 2, 2 layers, 3 timed steps; no files")
    parser.add_argument("--device", default=default_device, help=f"engine device (default {default_device})")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--contexts", type=parse_ints, default=[4096, 8192, 16384])
    parser.add_argument("--batches", type=parse_ints, default=[1, 4, 8])
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="skip shapes with batch x context above this (default: no limit)")
    parser.add_argument("--token-budget", type=int, default=2048)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per shape and mode")
    parser.add_argument("--layer-compute-ms", type=float, default=2.0, help="simulated rest of each layer, per step")
    parser.add_argument("--layer-compute", choices=("auto", "sleep", "matmul"), default="auto",
                        help="auto: matmul on CUDA, sleep on the CPU")
    parser.add_argument("--query-rho", type=float, default=0.99, help="AR(1) coefficient of the query walk")
    parser.add_argument("--predict-noise", type=float, default=0.33, help="std of the noise added to predicted queries")
    parser.add_argument("--ablation-shape", default="8192,4", help="context,batch of the ablation ('' to skip)")
    parser.add_argument("--ablation-warmup", type=int, default=6)
    parser.add_argument("--ablation-steps", type=int, default=6)
    parser.add_argument("--cpu-groups", type=int, default=None,
                        help="CPU worker groups (1 thread each); default: 1 on the CPU device, one per core on CUDA")
    parser.add_argument("--device-threads", type=int, default=None,
                        help="torch intra-op threads; default: 1 on the CPU device (the other cores are the worker's)")
    parser.add_argument("--cpu-impl", default="auto", choices=("auto", "native", "torch"))
    parser.add_argument("--kernel-impl", default=None, choices=(None, "flashinfer", "triton", "torch"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--render", type=Path, default=None, metavar="JSON",
                        help="only rewrite decode_step.md and .png under --out from a decode_step.json of an earlier run")
    args = parser.parse_args()
    if args.render is not None:
        report = json.loads(args.render.read_text())
        args.out.mkdir(parents=True, exist_ok=True)
        write_markdown(args.out / "decode_step.md", report)
        write_plot(args.out / "decode_step.png", report)
        log(f"rendered {args.out}/decode_step.{{md,png}} from {args.render}")
        return 0
    if args.quick:
        args.contexts, args.batches, args.layers, args.steps, args.warmup = [4096], [2], 2, 3, 1
        args.ablation_shape, args.ablation_warmup, args.ablation_steps = "4096,2", 2, 3

    from scout_sglang.cpu_worker import CpuAttentionPool

    device = torch.device(args.device)
    if args.max_tokens is None:
        args.max_tokens = 1 << 40
    modes = [m for m in args.modes.split(",") if m]
    kind = args.layer_compute if args.layer_compute != "auto" else ("matmul" if device.type == "cuda" else "sleep")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if device.type == "cpu":
        # The CPU plays the device: split the cores between "device" torch ops and the worker
        # instead of oversubscribing them (two OpenMP threads + two worker threads on two cores
        # made steps 10x slower and erratic in trials here).
        args.device_threads = args.device_threads or max(1, cores // 2)
        args.cpu_groups = args.cpu_groups or max(1, cores - args.device_threads)
    if args.device_threads:
        torch.set_num_threads(args.device_threads)
    pool = WatchedPool(CpuAttentionPool(args.cpu_groups or cores, 1, impl=args.cpu_impl))
    load_before = os.getloadavg()[0]
    hw = hardware(device, pool)
    log(f"hardware: {hw}")
    layer_compute = LayerCompute(args.layer_compute_ms, kind, device)
    ablation_shape = parse_ints(args.ablation_shape) if args.ablation_shape else None
    steps_total = max(args.warmup + args.steps, (args.ablation_warmup + args.ablation_steps) if ablation_shape else 0)

    report = dict(hardware=hw, shapes=[], skipped=[], ablation=None, load_before=load_before,
                  cpu_groups=pool.pool.num_groups)
    workload = dict(layers=args.layers, token_budget=args.token_budget, query_rho=args.query_rho,
                    predict_noise=args.predict_noise, layer_compute_ms=args.layer_compute_ms,
                    layer_compute_kind=kind, warmup=args.warmup, steps=args.steps, quest_change_rate=None)  # fmt: skip
    contexts = sorted(set(args.contexts) | ({ablation_shape[0]} if ablation_shape else set()))
    started = time.perf_counter()
    for context in contexts:
        batches = [b for b in args.batches if context in args.contexts]
        fits = [b for b in batches if b * context <= args.max_tokens]
        for b in batches:
            if b not in fits:
                report["skipped"].append(dict(context=context, batch_size=b,
                                              why=f"batch x context > --max-tokens {args.max_tokens}"))
        needs_ablation = ablation_shape is not None and ablation_shape[0] == context
        max_batch = max(fits + ([ablation_shape[1]] if needs_ablation else []), default=0)
        if not max_batch:
            continue
        log(f"context {context}: generating prompts for {max_batch} requests x {args.layers} layers")
        prompts = Prompts(context, max_batch, args.layers, steps_total, seed=args.seed + context)
        for batch_size in fits:
            inputs = StepInputs(prompts, batch_size, args.layers, args.warmup + args.steps, rho=args.query_rho,
                                predict_noise=args.predict_noise, seed=args.seed + 7 * batch_size, device=device)
            workload["predict_cosine"], workload["step_cosine"] = inputs.predict_cosine, inputs.step_cosine
            rows, interleaved = run_interleaved(
                args, prompts, inputs, [dict(mode=m) for m in modes], batch_size=batch_size, warmup=args.warmup,
                steps=args.steps, pool=pool, layer_compute=layer_compute, device=device)
            for r in rows:
                log(f"ctx {context} B {batch_size} {r['mode']:9s}: step {r['step_ms']:8.1f} ms  "
                    f"idle {r['idle_frac']:.1%}  CPU busy {r['cpu_busy_ms']:.1f} ms  cpu ratio {r['cpu_ratio']:.1%}")
            order = "interleaved" if interleaved else "one mode after the other"
            log(f"({order}; {time.perf_counter() - started:.0f} s so far)")
            report["shapes"].append(dict(context=context, batch_size=batch_size, interleaved=interleaved, modes=rows))
        if needs_ablation:
            batch_size = ablation_shape[1]
            n = args.ablation_warmup + args.ablation_steps
            inputs = StepInputs(prompts, batch_size, args.layers, n, rho=args.query_rho,
                                predict_noise=args.predict_noise, seed=args.seed + 11, device=device)
            configs = [dict(mode="scout", label=label, layer_ahead=ahead, recall_policy=policy)
                       for label, ahead, policy in ABLATION]
            rows, interleaved = run_interleaved(
                args, prompts, inputs, configs, batch_size=batch_size, warmup=args.ablation_warmup,
                steps=args.ablation_steps, pool=pool, layer_compute=layer_compute, device=device)
            for r in rows:
                log(f"ablation {r['label']:28s}: step {r['step_ms']:8.1f} ms  idle {r['idle_frac']:.1%}  "
                    f"cpu ratio {r['cpu_ratio']:.1%}  recalled {r['recalled_blocks_per_step']:.0f} blocks/step")
            report["ablation"] = dict(context=context, batch_size=batch_size, warmup=args.ablation_warmup,
                                      steps=args.ablation_steps, interleaved=interleaved, rows=rows)
            if not args.quick:  # how much the selection moves: quest with the real queries, change tracking on
                (r,), _ = run_interleaved(
                    args, prompts, inputs, [dict(mode="quest", track_changes=True)], batch_size=batch_size, warmup=1,
                    steps=n - 1, pool=pool, layer_compute=LayerCompute(0, "sleep", device), device=device)
                workload["quest_change_rate"] = r["change_rate"]
                log(f"quest selection change rate between steps: {r['change_rate']:.1%}")
        del prompts
        gc.collect()
    pool.shutdown()
    report["workload"] = workload
    report["load_after"] = os.getloadavg()[0]
    report["total_s"] = time.perf_counter() - started
    log(f"done in {report['total_s']:.0f} s")

    summary_shape = report["shapes"][-1] if report["shapes"] else None
    summary = dict(
        device=device.type,
        layers=args.layers,
        shape=None if summary_shape is None else {k: summary_shape[k] for k in ("context", "batch_size")},
        layer_compute_ms=args.layer_compute_ms,
        modes={} if summary_shape is None else {
            r["mode"]: dict(step_ms=round(r["step_ms"], 2), idle_frac=round(r["idle_frac"], 4),
                            cpu_busy_ms=round(r["cpu_busy_ms"], 2)) for r in summary_shape["modes"]},
        ablation=None if not report["ablation"] else {
            r["label"]: dict(step_ms=round(r["step_ms"], 2), idle_frac=round(r["idle_frac"], 4))
            for r in report["ablation"]["rows"]},
    )  # fmt: skip
    if not args.quick:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "decode_step.json").write_text(json.dumps(report, indent=2) + "\n")
        write_markdown(args.out / "decode_step.md", report)
        write_plot(args.out / "decode_step.png", report)
        log(f"wrote {args.out}/decode_step.{{md,json,png}}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
