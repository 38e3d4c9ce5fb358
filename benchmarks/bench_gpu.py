"""`make bench-gpu`: what a lent GPU machine checks and measures, in one call (about 9 minutes on one H100; the
recall study adds up to 7).

For a machine with a CUDA torch, Triton and the project installed with `pip install --no-deps -e .` (no sglang,
no network). Each part runs on its own: a part that fails is reported with its error and the others go on.

  tests         the CUDA tests of kernels, stages, engine, capture and the CPU-part workers (pytest)
  kernels       benchmarks/bench_kernels.py --quick
  host          per layer, eager, at the Qwen3-8B attention shape: CUDA kernel launches (the profiler's
                cudaLaunchKernel / cuLaunchKernel events), host ms, and host syncs
                (torch.cuda.set_sync_debug_mode("error") over the layer loop), per offloaded and dense layer
  capture       the whole step of every mode captured in one CUDA graph (torch.cuda.graph, a step of padding
                rows), replayed for later steps against an eager engine: the largest difference
  decode        step ms of full and scout (and the other modes at one shape), eager and graph-replayed, at
                contexts 32k and 64k and batches 8, 32, 64 where they fit; the GPU's busy fraction of a
                replayed step (kernel time over wall time, from the profiler); scout / full
  equal memory  decode tokens/s at equal device K/V memory at 64k: full at the largest batch its budget
                holds, scout at the largest batch the same budget and the host hold (the planner's capacity
                code decides both), both measured
  recall        bench_decode_step's recall study at 32k tokens, batch 32, 4 layers: CPU ratio and recall traffic
                per step, step time with recall (with and without the brake) against recall off, on the
                heavy-hitter and the flat workload -> benchmarks/results/recall_<device>.{md,json,png}

Results: benchmarks/results/gpu_<device>.{json,md}. The attention stack is the Qwen3-8B shape (Hq 32, Hkv 8,
D 128, bf16, block 32) with --layers layers (default 8; layer 0 dense), no other model computation: step times
are attention only. Progress goes to stderr; the last stdout line is one JSON object. No asserts.

    python3 -P benchmarks/bench_gpu.py [--dry-run] [--parts tests,kernels,host,capture,decode,memory,recall]

--dry-run runs every part at tiny shapes on whatever device there is (the CPU: Triton's interpreter, no graph
capture), to check the script itself; its results are not written.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MODES = ("full", "quest", "infinigen", "hgca", "scout")
NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 32  # Qwen3-8B's attention
CUDA_TESTS = ("tests/test_kernels_decode.py", "tests/test_kernels_merge.py", "tests/test_kernels_selection.py",
              "tests/test_triton_kernels.py", "tests/test_stage_select.py", "tests/test_stage_split.py",
              "tests/test_stage_append.py", "tests/test_stage_recall.py", "tests/test_recall_brake.py", "tests/test_engine.py",
              "tests/test_engine_triton_path.py", "tests/test_step_capture.py", "tests/test_layer_programs.py",
              "tests/test_cpu_part_workers.py", "tests/test_cpu_fallback.py", "tests/test_train_suite.py")


def log(message: str) -> None:
    print(f"[bench_gpu] {message}", file=sys.stderr, flush=True)


class Setup:
    """Shapes of the run (the real ones, or tiny ones for --dry-run)."""

    def __init__(self, args):
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.dry = args.dry_run
        self.layers = 3 if self.dry else args.layers
        self.qo, self.kv, self.dim = (4, 2, 16) if self.dry else (NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM)
        self.block = 8 if self.dry else BLOCK
        self.budget = 32 if self.dry else 2048
        self.contexts = [64] if self.dry else [32768, 65536]
        self.batches = [2] if self.dry else [8, 32, 64]
        self.steps = 2 if self.dry else 5


def engine(setup, mode, batch, context, *, steps, kernel_impl=None, cpu_worker=None):
    from scout_sglang.config import ScoutConfig
    from scout_sglang.core.engine import CoAttentionEngine
    from scout_sglang.core.shape import ModelShape

    shape = ModelShape(num_layers=setup.layers, num_qo_heads=setup.qo, num_kv_heads=setup.kv, head_dim=setup.dim)
    config = ScoutConfig(mode=mode, block_size=setup.block, token_budget=setup.budget, kernel_impl=kernel_impl)
    eng = CoAttentionEngine(config, shape, device=setup.device, dtype=torch.bfloat16 if not setup.dry else torch.float32,
                            max_requests=batch, max_tokens_per_request=context + steps + 2 * setup.block,
                            fixed_widths=True, track_changes=False, cpu_worker=cpu_worker)
    gen = torch.Generator().manual_seed(0)
    for rid in range(batch):
        eng.add_request(rid)
        for layer in range(setup.layers):
            k = torch.randn(context, setup.kv, setup.dim, generator=gen).to(eng.dtype)
            v = torch.randn(context, setup.kv, setup.dim, generator=gen).to(eng.dtype)
            eng.prefill(rid, layer, k.to(setup.device), v.to(setup.device))
    return eng


class StepInputs:
    """Static input and output buffers of a step (what a captured graph reads and writes)."""

    def __init__(self, setup, batch, dtype, seed=0):
        gen = torch.Generator().manual_seed(seed)
        shape = (setup.layers, batch)
        self.gen, self.setup = gen, setup
        self.q = torch.zeros(*shape, setup.qo, setup.dim, dtype=dtype, device=setup.device)
        self.q_pred = torch.zeros_like(self.q)
        self.k = torch.zeros(*shape, setup.kv, setup.dim, dtype=dtype, device=setup.device)
        self.v = torch.zeros_like(self.k)
        self.out = torch.zeros_like(self.q)

    def refill(self):
        for t in (self.q, self.q_pred, self.k, self.v):
            t.copy_(torch.randn(t.shape, generator=self.gen).to(t.dtype))


def layer_loop(eng, inputs, per_layer=None):
    for layer in range(eng.shape.num_layers):
        if layer + 1 < eng.shape.num_layers and eng.wants_prediction(layer + 1):
            eng.predict(layer + 1, inputs.q_pred[layer + 1])
        eng.attend(layer, inputs.q[layer], inputs.k[layer], inputs.v[layer], out=inputs.out[layer])


def sync(setup):
    if setup.device.type == "cuda":
        torch.cuda.synchronize()


def part_tests(setup, args) -> dict:
    env = dict(os.environ, PYTHONSAFEPATH="1")
    files = CUDA_TESTS[:3] if setup.dry else CUDA_TESTS
    # not -x: one call on a lent machine should show every failure, not the first (-rf lists them at the end)
    command = [sys.executable, "-P", "-m", "pytest", "-q", "-rf", "--maxfail=20", *files]
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.tests_timeout)
        stdout, returncode = done.stdout, done.returncode
    except subprocess.TimeoutExpired as timeout:  # keep what ran: the progress dots and any failure so far
        stdout, returncode = (timeout.stdout or b"").decode() if isinstance(timeout.stdout, bytes) else \
            (timeout.stdout or ""), f"timed out after {args.tests_timeout} s"
    tail = stdout.strip().splitlines()[-1:] or [""]
    failed = [line for line in stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    return dict(returncode=returncode, summary=tail[0], failed=failed, failures=stdout[-4000:] if returncode else "")


def part_kernels(setup, args) -> dict:
    done = subprocess.run([sys.executable, "-P", str(ROOT / "benchmarks" / "bench_kernels.py"), "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def part_host(setup, args) -> dict:
    """Launches, host ms and syncs per layer of an eager step, per mode, at a short context."""
    from torch.profiler import ProfilerActivity, profile

    out = {}
    batch, context = (2, 64) if setup.dry else (8, 2048)
    for mode in MODES:
        eng = engine(setup, mode, batch, context, steps=4)
        inputs = StepInputs(setup, batch, eng.dtype)
        try:
            for _ in range(2):  # first fills; each layer's launches are recorded
                inputs.refill()
                eng.begin_step(list(range(batch)))
                layer_loop(eng, inputs)
                eng.end_step()
            inputs.refill()
            eng.begin_step(list(range(batch)))
            sync(setup)
            start = time.perf_counter()
            if setup.device.type == "cuda":
                torch.cuda.set_sync_debug_mode("error")  # a host sync in the layer loop raises
            try:
                layer_loop(eng, inputs)
            finally:
                if setup.device.type == "cuda":
                    torch.cuda.set_sync_debug_mode(0)
            host_s = time.perf_counter() - start
            eng.end_step()
            per_layer = {}
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if setup.device.type == "cuda" else [])
            inputs.refill()
            eng.begin_step(list(range(batch)))
            for layer in range(eng.shape.num_layers):
                with profile(activities=activities) as prof:
                    if layer + 1 < eng.shape.num_layers and eng.wants_prediction(layer + 1):
                        eng.predict(layer + 1, inputs.q_pred[layer + 1])
                    eng.attend(layer, inputs.q[layer], inputs.k[layer], inputs.v[layer], out=inputs.out[layer])
                    sync(setup)
                launches = sum(e.count for e in prof.key_averages()
                               if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx",
                                            "cudaLaunchKernelExC"))
                kind = "dense" if layer in eng.full_layers and layer not in eng._selects else "offloaded"
                per_layer.setdefault(kind, []).append(launches)
            eng.end_step()
            out[mode] = dict(host_ms_per_layer=round(1e3 * host_s / eng.shape.num_layers, 3), syncs_in_layer_loop=0,
                             cuda_launches_per_offloaded_layer=max(per_layer.get("offloaded", [0])),
                             cuda_launches_per_dense_layer=max(per_layer.get("dense", [0])))
        except RuntimeError as error:
            out[mode] = dict(error=str(error)[:500])
        finally:
            eng.close()
        log(f"host {mode}: {out[mode]}")
    return out


def capture_step(setup, eng, inputs, rows):
    """A CUDA graph of one whole step (padding rows only while it is captured)."""
    eng.begin_step([], rows=rows)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        layer_loop(eng, inputs)  # warm-up: each layer's launches are recorded, Triton compiles
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer_loop(eng, inputs)
    eng.end_step(read=False)
    return graph


def part_capture(setup, args) -> dict:
    """Every mode: one graph of the whole step, replayed for later steps, against an eager engine."""
    if setup.device.type != "cuda":
        return dict(skipped="no CUDA: tests/test_step_capture.py checks the same by recording launches")
    out = {}
    batch, context = 4, 2048
    for mode in MODES:
        eager, graphed = engine(setup, mode, batch, context, steps=8), engine(setup, mode, batch, context, steps=8)
        try:
            inputs = StepInputs(setup, batch, eager.dtype, seed=1)
            graph = capture_step(setup, graphed, inputs, batch)
            worst = 0.0
            for _ in range(6):
                inputs.refill()
                expected = StepInputs(setup, batch, eager.dtype)
                for name in ("q", "q_pred", "k", "v"):
                    getattr(expected, name).copy_(getattr(inputs, name))
                eager.begin_step(list(range(batch)))
                layer_loop(eager, expected)
                eager.end_step()
                graphed.begin_step(list(range(batch)), rows=batch)
                graph.replay()
                graphed.end_step(read=False)
                sync(setup)
                worst = max(worst, float((inputs.out - expected.out).abs().max()))
            out[mode] = dict(max_abs_diff=worst, replay_equals_eager=worst <= 2e-2)
        except Exception as error:  # noqa: BLE001 - reported
            out[mode] = dict(error=f"{type(error).__name__}: {error}"[:500])
        finally:
            eager.close()
            graphed.close()
        log(f"capture {mode}: {out[mode]}")
    return out


def time_steps(setup, eng, inputs, batch, *, graph=None, steps=5, watch=None) -> float:
    """Median ms of `steps` steps; `watch` (a CpuPartWatch) sees them."""
    times = []
    if watch is not None:
        watch.start(eng)
    for _ in range(steps):
        inputs.refill()
        sync(setup)
        start = time.perf_counter()
        eng.begin_step(list(range(batch)), rows=batch)
        if graph is None:
            layer_loop(eng, inputs)
        else:
            graph.replay()
        eng.end_step(read=False)
        sync(setup)
        times.append(time.perf_counter() - start)
    telemetry = eng.collect_telemetry()
    if watch is not None:
        watch.stop(eng, telemetry, steps, sum(times))
    return 1e3 * statistics.median(times)


class CpuPartWatch:
    """The CPU part of the steps timed, per step: its bytes (K+V of the (block, KV head) pairs on the CPU list), the
    workers' attend ms and their CPU ms (more than attend: spinning), the device's ms in the wait kernel, and the
    in-engine GB/s (bytes over the attend time per thread; and over the step)."""

    def __init__(self, setup):
        self.block_bytes = 2 * setup.block * setup.dim * 2  # K and V of one KV head's block, bf16
        self.figures = {}

    def start(self, eng) -> None:
        worker = eng.cpu_worker
        self._busy = getattr(worker, "busy_s", 0.0)
        self._cpu = getattr(worker, "cpu_s", None)

    def stop(self, eng, telemetry, steps: int, wall_s: float) -> None:
        worker = eng.cpu_worker
        if worker is None or telemetry is None:
            return
        totals = telemetry.totals()
        busy = worker.busy_s - self._busy
        threads = len(worker.threads)
        nbytes = totals.cpu_blocks * self.block_bytes
        cpu = None if self._cpu is None else worker.cpu_s - self._cpu
        self.figures = dict(
            cpu_part_mb_per_step=round(nbytes / steps / 1e6, 3), worker_threads=threads,
            attend_ms_per_step=round(1e3 * busy / steps, 3),
            worker_cpu_ms_per_step=None if cpu is None else round(1e3 * cpu / steps, 3),
            wait_kernel_ms_per_step=round(1e3 * telemetry.timings.get("cpu_wait", 0.0) / steps, 3),
            in_engine_gbs=round(nbytes * threads / busy / 1e9, 2) if busy else None,
            in_engine_gbs_over_step=round(nbytes / wall_s / 1e9, 2) if wall_s else None)


def busy_fraction(setup, eng, inputs, batch, graph) -> float | None:
    """Kernel time over wall time of one replayed step (the profiler's CUDA kernels)."""
    if graph is None or setup.device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    inputs.refill()
    eng.begin_step(list(range(batch)), rows=batch)
    sync(setup)
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        graph.replay()
        sync(setup)
        wall = time.perf_counter() - start
    eng.end_step(read=False)
    kernel_us = sum(e.self_device_time_total for e in prof.key_averages() if e.device_type.name == "CUDA")
    return round(kernel_us / 1e6 / wall, 3) if wall else None


def measure_mode(setup, mode, batch, context) -> dict:
    eng = engine(setup, mode, batch, context, steps=3 * setup.steps + 8)
    watch = CpuPartWatch(setup)
    try:
        inputs = StepInputs(setup, batch, eng.dtype)
        eager_ms = time_steps(setup, eng, inputs, batch, steps=setup.steps, watch=watch)
        row = dict(mode=mode, batch=batch, context=context, eager_step_ms=round(eager_ms, 3))
        if eng.cores is not None:
            row["cores"] = eng.cores.as_report()
        if setup.device.type == "cuda":
            graph = capture_step(setup, eng, inputs, batch)
            row["graph_step_ms"] = round(time_steps(setup, eng, inputs, batch, graph=graph, steps=setup.steps,
                                                    watch=watch), 3)
            row["gpu_busy_fraction"] = busy_fraction(setup, eng, inputs, batch, graph)
        if watch.figures:  # the CPU part of the last timed steps (the replayed ones on a GPU)
            row["cpu_part"] = watch.figures
        telemetry = eng.collect_telemetry()
        if telemetry is not None:
            row["cpu_ratio"] = round(telemetry.totals().cpu_ratio, 4)
        return row
    finally:
        eng.close()


def fits(setup, mode, batch, context) -> bool:
    if setup.dry:
        return True
    per_token = 2 * setup.kv * setup.dim * 2 * setup.layers
    need = batch * context * per_token * (1.0 if mode in ("full", "quest") else 0.1)
    free, _ = torch.cuda.mem_get_info()
    return need < 0.7 * free


def part_decode(setup, args) -> dict:
    rows = []
    for context in setup.contexts:
        for batch in setup.batches:
            for mode in (("full", "scout") if (context, batch) != (setup.contexts[0], setup.batches[1 % len(
                    setup.batches)]) else MODES):
                if not fits(setup, mode, batch, context):
                    rows.append(dict(mode=mode, batch=batch, context=context, skipped="does not fit the device"))
                    continue
                try:
                    rows.append(measure_mode(setup, mode, batch, context))
                except Exception as error:  # noqa: BLE001 - reported
                    rows.append(dict(mode=mode, batch=batch, context=context, error=f"{type(error).__name__}: {error}"[:400]))
                log(f"decode: {rows[-1]}")
    ratios = {}
    for row in rows:
        full = next((r for r in rows if r["mode"] == "full" and r["batch"] == row["batch"]
                     and r["context"] == row["context"] and "eager_step_ms" in r), None)
        if row["mode"] != "full" and full and "eager_step_ms" in row:
            key = f"{row['mode']}@{row['context']}x{row['batch']}"
            ratios[key] = dict(eager=round(row["eager_step_ms"] / full["eager_step_ms"], 3),
                               graph=round(row["graph_step_ms"] / full["graph_step_ms"], 3)
                               if "graph_step_ms" in row and "graph_step_ms" in full else None)
    return dict(rows=rows, step_ratio_to_full=ratios, cpu_part=cpu_part_against_standalone(setup, rows))


def cpu_part_against_standalone(setup, rows) -> dict:
    """The in-engine CPU part's GB/s against the standalone native kernel at the pool's thread count, on this host
    in this call, at the shape of the largest in-engine part measured."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from cpu_attention.standalone import standalone_native_gbs

    parts = [row for row in rows if row.get("cpu_part", {}).get("in_engine_gbs")]
    if not parts:
        return dict(note="no in-engine CPU part was measured")
    biggest = max(parts, key=lambda row: row["cpu_part"]["cpu_part_mb_per_step"])
    figures = biggest["cpu_part"]
    pairs = figures["cpu_part_mb_per_step"] * 1e6 / (2 * setup.block * setup.dim * 2) / max(setup.layers - 1, 1)
    blocks = max(1, round(pairs / (biggest["batch"] * setup.kv)))  # per list, as the engine's lists average
    standalone = standalone_native_gbs(threads=figures["worker_threads"], batch=biggest["batch"],
                                       num_kv_heads=setup.kv, group_size=setup.qo // setup.kv, head_dim=setup.dim,
                                       block_size=setup.block, blocks_per_head=blocks,
                                       store_gib=0.05 if setup.dry else 2.0, rounds=1 if setup.dry else 3)
    out = dict(at=f"{biggest['mode']}@{biggest['context']}x{biggest['batch']}", in_engine_gbs=figures["in_engine_gbs"],
               standalone=standalone)
    if standalone.get("gbs"):
        out["in_engine_over_standalone"] = round(figures["in_engine_gbs"] / standalone["gbs"], 3)
    log(f"cpu part: {out}")
    return out


def part_memory(setup, args) -> dict:
    """Decode tokens/s at equal device K/V memory at 64k (the planner's capacity code picks both batches)."""
    from scout_sglang.config import ScoutConfig
    from scout_sglang.plan.capacity import max_batch
    from scout_sglang.plan.models import load_model

    spec = load_model("Qwen3-8B")
    context = setup.contexts[-1]
    budget = (args.kv_budget_gib if not setup.dry else 0.001) * 2**30
    host = (args.host_budget_gib if not setup.dry else 0.01) * 2**30
    out = dict(context=context, device_kv_budget_gib=args.kv_budget_gib, host_budget_gib=args.host_budget_gib,
               model=spec.name, measured_layers=setup.layers)
    for mode in ("full", "scout"):
        config = ScoutConfig(mode=mode, block_size=setup.block, token_budget=setup.budget)
        capacity = max_batch(config, spec, itemsize=2, request_tokens=context + 1024, device_budget=int(budget),
                             host_budget=int(host))
        batch = max(1, capacity.max_batch) if not setup.dry else 2
        entry = dict(planned_batch=capacity.max_batch, limit=capacity.limit, measured_batch=batch)
        try:
            row = measure_mode(setup, mode, batch, context)
            step = row.get("graph_step_ms", row["eager_step_ms"])
            # The stack measured has setup.layers layers; the model has spec.num_layers: a step scales with them.
            entry.update(row, tokens_per_s=round(batch / (step * spec.num_layers / setup.layers / 1e3), 1))
        except Exception as error:  # noqa: BLE001 - reported
            entry["error"] = f"{type(error).__name__}: {error}"[:400]
        out[mode] = entry
        log(f"equal memory {mode}: {entry}")
    if "tokens_per_s" in out.get("scout", {}) and "tokens_per_s" in out.get("full", {}):
        out["scout_over_full"] = round(out["scout"]["tokens_per_s"] / out["full"]["tokens_per_s"], 2)
    return out


def part_recall(setup, args) -> dict:
    """bench_decode_step's recall study on this device (the issue's shape: 32k tokens, batch 32, 4 layers): CPU
    ratio, recall traffic against its cap and step time with recall (brake, no brake) and with recall off, per step,
    on the heavy-hitter and the flat workload -> recall_<device>.{md,json,png}."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-P", str(ROOT / "benchmarks" / "bench_decode_step.py"), "--only-recall",
                   "--device", str(setup.device), "--out", out]
        command += ["--quick"] if setup.dry else ["--recall-shape", "32768,32", "--layers", "4", "--recall-steps", "40"]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=args.recall_timeout)
        if done.returncode:
            raise RuntimeError(done.stderr[-3000:])
        if not setup.dry:
            name = torch.cuda.get_device_name().replace(" ", "_").replace("/", "_").lower()
            for suffix in ("md", "json", "png"):
                shutil.copy(Path(out) / f"recall.{suffix}", RESULTS / f"recall_{name}.{suffix}")
    return json.loads(done.stdout.strip().splitlines()[-1])["recall"]


PARTS = dict(tests=part_tests, kernels=part_kernels, host=part_host, capture=part_capture, decode=part_decode,
             memory=part_memory, recall=part_recall)


def write_report(result: dict) -> Path:
    name = result["device_name"].replace(" ", "_").replace("/", "_").lower()
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"gpu_{name}"
    path.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"# GPU run: {result['device_name']}", "", "Written by `make bench-gpu` (`benchmarks/bench_gpu.py`); every "
             f"number from one run of {result['total_s']:.0f} s. Attention stack of the Qwen3-8B shape, "
             f"{result['layers']} layers (layer 0 dense), bf16; no other model computation.", ""]
    for part, value in result["parts"].items():
        lines += [f"## {part}", "", "```", json.dumps(value, indent=1)[:6000], "```", ""]
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on any device; nothing written")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--tests-timeout", type=int, default=240)
    parser.add_argument("--recall-timeout", type=int, default=420, help="seconds the recall study may take")
    parser.add_argument("--kv-budget-gib", type=float, default=40.0, help="device K/V budget of the equal-memory run")
    parser.add_argument("--host-budget-gib", type=float, default=96.0, help="host K/V budget of the equal-memory run")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    setup = Setup(args)
    device_name = torch.cuda.get_device_name() if setup.device.type == "cuda" else "cpu"
    log(f"device {device_name}; parts {args.parts}")
    started = time.perf_counter()
    result = dict(device_name=device_name, layers=setup.layers, dry_run=setup.dry, torch=torch.__version__, parts={})
    for name in [p for p in args.parts.split(",") if p]:
        part_started = time.perf_counter()
        try:
            result["parts"][name] = PARTS[name](setup, args)
        except Exception as error:  # noqa: BLE001 - a part that fails is reported, the others go on
            result["parts"][name] = dict(error=f"{type(error).__name__}: {error}", trace=traceback.format_exc()[-2000:])
        log(f"{name} done in {time.perf_counter() - part_started:.0f} s")
    result["total_s"] = time.perf_counter() - started
    if not setup.dry:
        log(f"wrote {write_report(result)}.{{json,md}}")
    print(json.dumps(dict(device=device_name, total_s=round(result["total_s"], 1),
                          parts={k: ("error" not in v) if isinstance(v, dict) else True
                                 for k, v in result["parts"].items()})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
