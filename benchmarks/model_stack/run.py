"""One measured configuration of the GPU benchmark: an engine inside the Qwen3 stack, its prompts prefilled from
the workload (untimed), its step captured in one CUDA graph (on a GPU), then replayed and timed.

    run = StackRun(shape, mode="scout", batch=12, context=65536, ...)
    row = run.measure(steps=5)   # step ms, tokens/s, the CPU part's figures, the workload's calibration
    run.close()
"""

from __future__ import annotations

import statistics
import time

import torch

from .qwen3 import Qwen3Shape, Qwen3Stack
from .workload import DeviceWorkload


SPLIT_WARMUP_STEPS = 8  # steps (each read) before an auto CPU split is timed


def synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        from scout_sglang.core.host_wait import wait_for_device

        wait_for_device(device)


class StackRun:
    """An engine of `mode` for `batch` requests of `context` tokens inside a Qwen3 stack of `shape`.

    Parameters
    ----------
    shape : Qwen3Shape (its layers are the engine's)
    mode : the engine's mode
    batch, context : requests and their prompt tokens
    steps : decode steps the run may make (sizes the stores)
    workload : "heavy" or "flat"
    block_size, token_budget : the engine's
    device : where it runs; kernel_impl : the engine's (the Triton path on the CPU under the interpreter)
    """

    def __init__(self, shape: Qwen3Shape, *, mode: str, batch: int, context: int, steps: int, workload: str,
                 block_size: int, token_budget: int, device, kernel_impl: str | None = None, seed: int = 0,
                 **config_fields):
        from scout_sglang.config import ScoutConfig
        from scout_sglang.core.engine import CoAttentionEngine
        from scout_sglang.core.shape import ModelShape

        self.shape, self.mode, self.batch, self.context = shape, mode, batch, context
        self.device = torch.device(device)
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        config = ScoutConfig(mode=mode, block_size=block_size, token_budget=token_budget, kernel_impl=kernel_impl,
                             **config_fields)
        model = ModelShape(num_layers=shape.num_layers, num_qo_heads=shape.num_qo_heads,
                           num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim)
        self.engine = CoAttentionEngine(config, model, device=self.device, dtype=dtype, max_requests=batch,
                                        max_tokens_per_request=context + steps + 2 * block_size, fixed_widths=True,
                                        track_changes=mode != "full")
        self.stack = Qwen3Stack(shape, max_batch=batch, max_position=context + steps + 1, device=self.device,
                                dtype=dtype, seed=seed)
        self.workload = DeviceWorkload(workload, num_layers=shape.num_layers, num_qo_heads=shape.num_qo_heads,
                                       num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim,
                                       block_size=block_size, batch=batch, context=context, max_new=steps + 1,
                                       device=self.device, seed=seed)
        started = time.perf_counter()
        for row in range(batch):
            self.engine.add_request(row)
            for layer in range(shape.num_layers):
                k, v = self.workload.prompt(row, layer)
                self.engine.prefill(row, layer, k.to(dtype), v.to(dtype))
        synchronize(self.device)
        self.prefill_s = time.perf_counter() - started
        self.graph = None
        self.graphs = {}  # exact path (resident-first) -> its captured step, as SGLang captures scout's variants

    def _next_inputs(self) -> None:
        """A step's inputs into the static buffers (outside a captured graph): the workload's attention inputs,
        random hidden states, the tokens' positions."""
        self.workload.next_step()
        self.stack.hidden[: self.batch].normal_()
        self.stack.set_positions(torch.full((self.batch,), self.workload.position - 1, dtype=torch.int64,
                                            device=self.device))

    def _step_body(self) -> None:
        self.stack.step(self.engine, self.batch, inject=self.workload.inject)

    def capture(self) -> bool:
        """Capture the whole step (the model and every engine call) in one CUDA graph, with a plan of padding rows
        as SGLang captures; with resident-first a second one on the exact path (the first captured, as SGLang
        captures scout's variants: sglang_adapter/graph_variants.py); False where there is no GPU (the steps then
        run eagerly)."""
        if self.device.type != "cuda":
            return False
        engine = self.engine
        for exact in (True, False) if engine.pool is not None and engine.exact_path else (False,):
            engine.begin_step([], rows=self.batch, exact_step=exact)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.no_grad(), torch.cuda.stream(stream):
                self._step_body()  # warm-up: Triton compiles, the engine's layer programs record
            torch.cuda.current_stream().wait_stream(stream)
            self.graphs[exact] = torch.cuda.CUDAGraph()
            with torch.no_grad(), torch.cuda.graph(self.graphs[exact]):
                self._step_body()
            engine.end_step(read=False)
        self.graph = self.graphs[False]
        return True

    def begin(self):
        """Plan the next step of every request -> the captured graph to replay (None: run it eagerly): the exact
        path's where it was captured and the engine says the step takes it, as SGLang's runner picks."""
        rids = list(range(self.batch))
        if self.graph is None:
            self.engine.begin_step(rids, rows=self.batch)
            return None
        exact = True in self.graphs and self.engine.exact_step_ready(rids)
        self.engine.begin_step(rids, rows=self.batch, exact_step=exact)
        return self.graphs[exact]

    def step(self) -> float:
        """One timed decode step (graph-replayed when captured) -> seconds."""
        self._next_inputs()
        synchronize(self.device)
        start = time.perf_counter()
        self._launch()
        synchronize(self.device)
        return time.perf_counter() - start

    def _launch(self) -> None:
        """Plan the next step and launch it (its graph replayed, or run eagerly), committing it unread."""
        graph = self.begin()
        if graph is not None:
            graph.replay()
        else:
            with torch.no_grad():
                self._step_body()
        self.engine.end_step(read=False)

    def steps_overlapped(self, steps: int) -> float:
        """`steps` decode steps back to back as SGLang's overlap scheduler runs them: each step's inputs and plan
        are issued while the device still runs the step before (nothing in a step waits for the device), and once
        a step is launched the host waits for the one before it, as the scheduler does to process its result: the
        host runs at most one step ahead. One wait after the last -> seconds a step. On a CPU device the work is
        synchronous, and this is the serial step."""
        on_cuda = self.device.type == "cuda"
        synchronize(self.device)
        start = time.perf_counter()
        launched = None  # the event after the step before
        for _ in range(steps):
            self._next_inputs()
            self._launch()
            if launched is not None:
                launched.synchronize()  # the step before is done: its result processed
            if on_cuda:
                from scout_sglang.core.host_wait import blocking_event

                launched = blocking_event()
                launched.record()
        synchronize(self.device)
        return (time.perf_counter() - start) / steps

    def measure(self, steps: int, *, warmup: int = 1, overlapped: bool = True) -> dict:
        """Median step of `steps` (after `warmup`), tokens/s, and what the steps did: the CPU ratio, the change rate
        and the predicted-query cosine (the workload's calibration), the CPU part's bytes, attend and worker CPU
        ms, the wait kernel's ms and the in-engine GB/s. overlapped: then `steps` more, timed back to back as SGLang's
        overlap scheduler runs them (steps_overlapped: the plan beside the previous step), as overlapped_step_ms."""
        if self.engine.cpu_split is not None and self.engine.cpu_split.share is None:
            warmup = max(warmup, SPLIT_WARMUP_STEPS)  # auto: the caps settle on what the steps measure
        for _ in range(warmup):
            self.step()
            self.engine.collect_telemetry()  # one collection a step: what the split's caps learn from
        worker = self.engine.cpu_worker
        busy0 = getattr(worker, "busy_s", 0.0)
        cpu0 = getattr(worker, "cpu_s", None)
        cosines0 = len(self.workload.cosines)
        times = [self.step() for _ in range(steps)]
        telemetry = self.engine.collect_telemetry()
        step_ms = 1e3 * statistics.median(times)
        totals = telemetry.totals() if telemetry is not None else None
        split = self.engine.cpu_split
        row = dict(mode=self.mode, batch=self.batch, context=self.context, layers=self.shape.num_layers,
                   cpu_split=self.engine.config.cpu_split, graph=self.graph is not None, step_ms=round(step_ms, 3),
                   tokens_per_s=round(self.batch / step_ms * 1e3, 1), prefill_s=round(self.prefill_s, 1),
                   workload=self.workload.kind,
                   predict_cosine=round(self.workload.predict_cosine(cosines0), 4))
        if totals is not None and self.mode != "full":
            row.update(cpu_ratio=round(totals.cpu_ratio, 4), change_rate=round(totals.change_rate, 4))
        if worker is not None and totals is not None:
            block_bytes = 2 * self.engine.block_size * self.shape.head_dim * (2 if self.device.type == "cuda" else 4)
            nbytes, busy = totals.cpu_blocks * block_bytes, worker.busy_s - busy0
            threads = len(worker.threads)
            row["cpu_part"] = dict(
                mb_per_step=round(nbytes / steps / 1e6, 3), worker_threads=threads,
                attend_ms_per_step=round(1e3 * busy / steps, 3),
                worker_cpu_ms_per_step=None if cpu0 is None else round(1e3 * (worker.cpu_s - cpu0) / steps, 3),
                wait_kernel_ms_per_step=round(1e3 * telemetry.timings.get("cpu_wait", 0.0) / steps, 3),
                in_engine_gbs=round(nbytes * threads / busy / 1e9, 2) if busy else None)
        pool = self.engine.resident_pool_state()
        if pool is not None and telemetry is not None:  # resident-first: the share of requests attended exactly
            row["resident"] = dict(pool, exact_share=round(telemetry.exact_requests / max(1, telemetry.decoded_tokens),
                                                           4), exact_path_steps=telemetry.exact_path_steps)
        if split is not None and totals is not None:  # the CPU split's shares beside the step time
            listed = totals.cpu_blocks + totals.zero_copy_blocks
            row["split"] = dict(zero_copy_share=round(totals.zero_copy_blocks / listed, 4) if listed else 0.0,
                                zero_copy_mb_per_step=round(totals.zero_copy_bytes / steps / 1e6, 3),
                                cpu_mb_per_step=round(totals.cpu_bytes / steps / 1e6, 3),
                                wait_share_of_step=round(telemetry.timings.get("cpu_wait", 0.0) / steps / step_ms * 1e3,
                                                         4),
                                zero_copy_ms_per_step=round(1e3 * totals.zero_copy_s / steps, 4),
                                zero_copy_gbs=round(totals.zero_copy_bytes / totals.zero_copy_s / 1e9, 2)
                                if totals.zero_copy_s and totals.zero_copy_bytes else None,
                                caps=split.step_caps(), source=split.source, link=split.describe()["link_source"])
        if overlapped:  # last: every figure above is the timed steps' alone
            overlapped_ms = 1e3 * self.steps_overlapped(steps)
            self.engine.collect_telemetry()  # the overlapped steps' counters, not the row's
            row.update(overlapped_step_ms=round(overlapped_ms, 3),
                       overlapped_tokens_per_s=round(self.batch / overlapped_ms * 1e3, 1))
        return row

    def close(self) -> None:
        self.engine.close()
        self.engine = self.stack = self.workload = self.graph = None
        self.graphs = {}
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
