"""Engine set-up and timing: one CoAttentionEngine per configuration, prefilled,
stepped as a model would drive it, its StepTelemetry timers and the CPU
worker's busy time collected per step and summarized as medians; several
configurations run interleaved when their KV fits in memory together.
"""

from __future__ import annotations

import gc
import statistics
import time
from pathlib import Path

import torch

from .common import BLOCK_SIZE, BREAKDOWN, HEAD_DIM, NUM_KV_HEADS, NUM_QO_HEADS, synchronize

# Per-step values a summary keeps as curves (the recall study plots them; the paper's Figure 6).
CPU_BLOCK_BYTES = 2 * BLOCK_SIZE * HEAD_DIM * 2  # K and V of one KV head's block, bf16
IDLE_PROBE_S = 0.005  # after a timed step, how long before its worker's threads are sampled for state R
CURVES = ("step_s", "cpu_ratio", "change_rate", "recall_bytes", "recall_cap_bytes", "withheld_blocks", "backed_off")


class EngineRun:
    """One engine (mode + switches) on one shape: prefill, then steps on demand, then a summary."""

    def __init__(self, args, prompts, *, mode, batch_size, total_steps, device, worker, layer_ahead=True,
                 recall_policy="adaptive", track_changes=False, label=None, overrides=None, max_requests=None):
        from scout_sglang.config import ScoutConfig
        from scout_sglang.core.engine import CoAttentionEngine
        from scout_sglang.core.shape import ModelShape

        self.args, self.device, self.batch_size = args, device, batch_size
        self.mode, self.label = mode, label or mode
        self.layer_ahead = layer_ahead
        self.context = prompts.context
        shape = ModelShape(num_layers=args.layers, num_qo_heads=NUM_QO_HEADS, num_kv_heads=NUM_KV_HEADS,
                           head_dim=HEAD_DIM)
        fields = dict(mode=mode, block_size=BLOCK_SIZE, token_budget=args.token_budget, layer_ahead=layer_ahead,
                      recall_policy=recall_policy, kernel_impl=args.kernel_impl, cpu_impl=args.cpu_impl)
        config = ScoutConfig(**(fields | (overrides or {})))
        self.recall_policy = config.recall_policy
        self.config = config
        # max_requests: the slots the server is sized for (default: the batch); the load ramp runs fewer
        self.engine = CoAttentionEngine(config, shape, device=device, dtype=torch.bfloat16,
                                        max_requests=max_requests or batch_size,
                                        max_tokens_per_request=prompts.context + total_steps + BLOCK_SIZE,
                                        cpu_worker=worker.worker, track_changes=track_changes)  # fmt: skip
        start = time.perf_counter()
        for b in range(batch_size):
            self.engine.add_request(b)
            for layer in range(args.layers):
                self.engine.prefill(b, layer, prompts.k[b, layer].to(device), prompts.v[b, layer].to(device))
        synchronize(device)
        self.prefill_s = time.perf_counter() - start
        self.rows: list[dict] = []
        # The recall cap follows the step time the engine measures between its plans; interleaved with other
        # engines, its plans are further apart than its steps, so its clock runs only during its own steps.
        self.own_s = 0.0
        if self.engine.recall_budget is not None:
            self.engine.recall_budget.clock = lambda: self.own_s

    def step(self, inputs, s: int, *, worker, layer_compute, timed: bool) -> None:
        """Decode step s of `inputs`; recorded when `timed`."""
        engine, device, layers = self.engine, self.device, self.args.layers
        worker.take_busy_s()
        cpu_before = worker.thread_cpu_s()
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
        self.own_s += step_s
        busy_s = worker.take_busy_s()
        cpu_after = worker.thread_cpu_s()
        if not timed:
            return
        time.sleep(IDLE_PROBE_S)  # outside the timed step: the worker must be parked by now
        runnable = worker.runnable_threads()
        timings = dict(cpu_wait=telemetry.timings.get("cpu_wait", 0.0), layer_compute=layer_s)
        timings["engine"] = step_s - timings["cpu_wait"] - layer_s
        totals = telemetry.totals()
        self.rows.append(dict(
            step_s=step_s, first_layer_s=first_layer_s, cpu_busy_s=busy_s, timings=timings,
            cpu_thread_s=None if cpu_before is None or cpu_after is None else cpu_after - cpu_before,
            runnable_after=runnable, cpu_blocks=totals.cpu_blocks, worker_threads=worker.num_threads,
            cpu_ratio=totals.cpu_ratio, change_rate=totals.change_rate, recalled_blocks=totals.recalled_blocks,
            recall_bytes=totals.recall_bytes, dropped_blocks=totals.dropped_blocks,
            recall_cap_bytes=telemetry.recall_cap_bytes, withheld_blocks=totals.withheld_blocks,
            backed_off=totals.backed_off_rows / totals.recall_rows if totals.recall_rows else 0.0,
            exact_requests=telemetry.exact_requests,
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
            # worker CPU time over attend time, summed over the timed steps: what spinning and waking cost
            cpu_over_busy=None if None in threads or not sum(r["cpu_busy_s"] for r in rows) else
            sum(threads) / sum(r["cpu_busy_s"] for r in rows),
            runnable_after_step=max(r["runnable_after"] for r in rows),
            # the CPU part's K+V bytes per step, and the rate the workers read them at while attending
            cpu_part_mb_per_step=statistics.fmean(r["cpu_blocks"] for r in rows) * CPU_BLOCK_BYTES / 1e6,
            in_engine_gbs=None if not sum(r["cpu_busy_s"] for r in rows) else
            sum(r["cpu_blocks"] * CPU_BLOCK_BYTES * r["worker_threads"] for r in rows) / sum(r["cpu_busy_s"] for r in rows) / 1e9,
            idle_frac=med([r["timings"]["cpu_wait"] / r["step_s"] for r in rows]),
            cpu_ratio=statistics.fmean(r["cpu_ratio"] for r in rows),
            change_rate=statistics.fmean(r["change_rate"] for r in rows),
            recalled_blocks_per_step=statistics.fmean(r["recalled_blocks"] for r in rows),
            recall_mb_per_step=statistics.fmean(r["recall_bytes"] for r in rows) / 1e6,
            dropped_blocks_per_step=statistics.fmean(r["dropped_blocks"] for r in rows),
            exact_share=statistics.fmean(r["exact_requests"] for r in rows) / self.batch_size,
            curve={key: [r[key] for r in rows] for key in CURVES},
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


def run_interleaved(args, prompts, inputs, configs, *, batch_size, warmup, steps, make_worker, layer_compute,
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
        worker = make_worker()  # the group's engines share it (their parts have names of their own there)
        runs = [EngineRun(args, prompts, batch_size=batch_size, total_steps=total, device=device, worker=worker, **c)
                for c in group]
        for s in range(total):
            for run in runs:
                run.step(inputs, s, worker=worker, layer_compute=layer_compute, timed=s >= warmup)
        for run in runs:
            run.close()
            results.append(run.summary())
        del runs
        worker.shutdown()
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results, interleave
