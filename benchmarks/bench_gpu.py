"""`make bench-gpu`: what a lent GPU machine measures and checks, in one call of at most 8 minutes (--budget-s).

For a machine with a CUDA torch, Triton and the project installed with `pip install --no-deps -e .` (no sglang,
no network). The parts run in this order, the headline first; each writes the results as it finishes (a call cut
short keeps what finished), a part that fails is reported with its error and the others go on, and the parts that
the time budget leaves no room for say so:

  headline      decode tokens/s at equal device memory at 64k tokens, on the whole Qwen3-8B stack (36 layers,
                layer 0 dense: the model's GEMMs, norms, RoPE and MLP around the engine's attention,
                benchmarks/model_stack/): full attention at the largest batch the device K/V budget holds, scout at
                the largest batch that budget and the host's free memory hold (the planner's capacity code decides
                both), graph-replayed, on the heavy-hitter workload; then a projection (labelled) for an 80 GB H100
                and a 1 TiB host from the measured figures; then scout at its batch with the CPU split
  resident      first the exact path's decode kernel alone against torch's fused SDPA at 32k and 64k, batches 1
                and 8 (model_stack/decode_kernels.py: both full attention here and the exact path run the engine's
                kernel, a stock server a vendor's); then resident-first scout against full attention at 32k and
                64k, batches 1, 8, 32, 64 where full
                attention fits, on the equal-batch stack, the pool sized as a server sizes it on this device: scout's
                tokens/s over full's (target at least 0.95), the share of requests attended exactly, the step's
                costliest kernels; then resident-first scout at the headline's equal-memory shape (target at least
                3x); last, per context, the largest batch full attention ran at with a pool one request short
                (every request sparse, its row most of it); written after every row (model_stack/low_load.py)
  equal_batch   full and scout at 32k and 64k, batches 8, 32, 64 where they fit, on a stack of --equal-batch-layers
                layers of the same shape: step ms, the GPU's busy share with and without the wait kernel, the wait
                kernel's ms, the CPU ratio and the CPU part's in-engine GB/s; the other modes at one shape; the flat
                workload at one shape; the in-engine CPU part against the standalone native kernel at the pool's
                thread count, on this host in this call
  zero_copy     the decode kernel over the page-locked host store (zero-copy over PCIe) against a device store, and
                the link's copy rate (bench_zero_copy.py)
  estimate_cost the estimate's kernel time beyond the merge it replaces, against the budget's decode
                (bench_estimate_cost.py)
  host          per layer, eager, attention only: CUDA kernel launches, host ms and host syncs
  capture       the whole step of every mode captured in one CUDA graph, replayed against an eager engine
  recall        bench_decode_step's recall study at 32k tokens, batch 32, 4 layers -> recall_<device>.*
  tests         the CUDA tests of kernels, stages, engine, capture, the CPU-part workers and the model stack
  kernels       benchmarks/bench_kernels.py --quick

The weights are random and the selection pattern is synthetic (benchmarks/model_stack/workload.py): what is
measured is the cost of a step, not what a model answers. Results: benchmarks/results/gpu_<device>.{json,md,png};
the md opens with the headline and a plot of tokens/s against batch at 64k. Progress goes to stderr; the last stdout
line is one JSON object. No asserts.

    python3 -P benchmarks/bench_gpu.py [--dry-run] [--parts headline,equal_batch,...] [--budget-s 480]

--dry-run runs every part at tiny shapes on whatever device there is (the CPU: Triton's interpreter, no graph
capture), to check the script itself; nothing is written.
"""

from __future__ import annotations

import argparse
import json
import os
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
CUDA_TESTS = ("tests/test_model_stack.py", "tests/test_kernels_decode.py", "tests/test_kernels_merge.py", "tests/test_kernels_selection.py",
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
    from scout_sglang.core.host_wait import wait_for_device

    wait_for_device(setup.device)  # a blocking-sync event: the host sleeps, the workers keep their cores


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


def script_part(script: str, setup, timeout: int = 150) -> dict:
    """Run benchmarks/<script> (tiny shapes with --dry-run) -> the JSON of its last stdout line."""
    command = [sys.executable, "-P", str(ROOT / "benchmarks" / script), *(["--dry-run"] if setup.dry else [])]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def part_zero_copy(setup, args) -> dict:
    """The decode kernel's zero-copy reads of the page-locked host store against a device store, and the link's
    copy rate (bench_zero_copy.py -> zero_copy_<device>.*): the device's own off-device rate."""
    return script_part("bench_zero_copy.py", setup)


def part_estimate_cost(setup, args) -> dict:
    """The estimate's kernel time beyond the merge it replaces, against the budget's sparse decode
    (bench_estimate_cost.py -> estimate_cost_<device>.*)."""
    return script_part("bench_estimate_cost.py", setup)


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


def part_headline(setup, args, deadline) -> dict:
    """Tokens/s at equal device memory on the whole stack (model_stack/parts.py)."""
    from model_stack.parts import part_headline as headline

    return headline(setup, args, deadline)


def part_resident(setup, args, deadline) -> dict:
    """Resident-first scout against full attention at the batches full attention fits (model_stack/low_load.py)."""
    from model_stack.low_load import part_resident as resident

    return resident(setup, args, deadline)


def part_equal_batch(setup, args, deadline) -> dict:
    """Full and scout at equal batch on the stack, the other modes at one shape, and the in-engine CPU part against
    the standalone kernel."""
    from model_stack.parts import part_equal_batch as equal_batch

    out = equal_batch(setup, args, deadline)
    out["cpu_part"] = cpu_part_against_standalone(setup, out["rows"], out["layers"])
    return out


def cpu_part_against_standalone(setup, rows, layers: int) -> dict:
    """The in-engine CPU part's GB/s against the standalone native kernel at the pool's thread count, on this host
    in this call, at the shape of the largest in-engine part measured."""
    from cpu_attention.standalone import standalone_native_gbs
    from scout_sglang.cpu_worker.core_plan import worker_cpus
    from scout_sglang.cpu_worker.factory import default_cores

    parts = [row for row in rows if (row.get("cpu_part") or {}).get("in_engine_gbs")]
    if not parts:
        return dict(note="no in-engine CPU part was measured")
    biggest = max(parts, key=lambda row: row["cpu_part"]["mb_per_step"])
    figures = biggest["cpu_part"]
    pairs = figures["mb_per_step"] * 1e6 / (2 * setup.block * setup.dim * 2) / max(layers - 1, 1)
    blocks = max(1, round(pairs / (biggest["batch"] * setup.kv)))  # per list, as the engine's lists average
    standalone = standalone_native_gbs(threads=figures["worker_threads"], batch=biggest["batch"],
                                       num_kv_heads=setup.kv, group_size=setup.qo // setup.kv, head_dim=setup.dim,
                                       block_size=setup.block, blocks_per_head=blocks,
                                       store_gib=0.05 if setup.dry else 2.0, rounds=1 if setup.dry else 3,
                                       cpus=worker_cpus(default_cores(setup.device.type == "cpu"),
                                                        figures["worker_threads"]))  # the workers' cores
    out = dict(at=f"{biggest['mode']}@{biggest['context']}x{biggest['batch']}", in_engine_gbs=figures["in_engine_gbs"],
               standalone=standalone)
    if standalone.get("gbs"):
        out["in_engine_over_standalone"] = round(figures["in_engine_gbs"] / standalone["gbs"], 3)
    log(f"cpu part: {out}")
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


PARTS = dict(headline=part_headline, resident=part_resident, equal_batch=part_equal_batch, zero_copy=part_zero_copy,
             estimate_cost=part_estimate_cost, host=part_host, capture=part_capture, recall=part_recall,
             tests=part_tests, kernels=part_kernels)
# The least time each part needs to be worth starting (seconds of the call left).
MIN_SECONDS = dict(headline=60, resident=60, equal_batch=60, zero_copy=40, estimate_cost=30, host=30, capture=30, recall=120, tests=60, kernels=40)


def write_report(result: dict) -> Path:
    """gpu_<device>.{json,md,png}: the md opens with the headline and its plot, then every part's figures."""
    from model_stack.headline import write_plot

    name = result["device_name"].replace(" ", "_").replace("/", "_").lower()
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"gpu_{name}"
    path.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    parts = result["parts"]
    lines = [f"# GPU run: {result['device_name']}", "",
             "Written by `make bench-gpu` (`benchmarks/bench_gpu.py`), every number from one call of "
             f"{result['total_s']:.0f} s (budget {result['budget_s']} s). The model is Qwen3-8B's decoder with "
             "random weights; the attention's selection pattern is synthetic (the heavy-hitter workload, "
             "`benchmarks/model_stack/workload.py`): a step's cost is measured, not what a model answers.", ""]
    headline = parts.get("headline")
    if isinstance(headline, dict) and "full" in headline:
        lines += headline_text(headline, parts.get("resident"))
        if not headline.get("error"):
            write_plot(path.with_suffix(".png"), headline, parts.get("equal_batch"))
            lines += [f"![tokens/s against batch]({path.with_suffix('.png').name})", ""]
    if isinstance(parts.get("resident"), dict) and "rows" in parts["resident"]:
        from model_stack.low_load import resident_text

        lines += resident_text(parts["resident"])
    for part, value in parts.items():
        lines += [f"## {part}", "", "```", json.dumps(value, indent=1)[:8000], "```", ""]
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return path


def headline_text(headline: dict, resident: dict | None = None) -> list[str]:
    """The report's headline: full against scout at equal device memory, scout resident-first (the resident part's
    last row) and with the CPU split."""
    rows, resident = [], (resident or {}).get("equal_memory") or {}
    full = headline.get("full", {})
    ratio = round(resident["tokens_per_s"] / full["tokens_per_s"], 2) if "tokens_per_s" in resident and \
        "tokens_per_s" in full else "not measured"
    for mode in ("full", "scout", "scout_resident", "scout_split"):
        entry = resident if mode == "scout_resident" else headline.get(mode, {})
        if mode == "scout_split" and entry:
            mode = f"scout, CPU split auto (zero-copy share {(entry.get('split') or {}).get('zero_copy_share', '-')})"
        if mode == "scout_resident" and entry:
            mode = (f"scout, resident-first (pool {(entry.get('pool') or {}).get('pages', '-')} pages, exact share "
                    f"{(entry.get('resident') or {}).get('exact_share', '-')})")
        rows.append(f"| {mode} | {entry.get('batch', '-')} | {entry.get('limit', '-')} | {entry.get('step_ms', '-')} "
                    f"| {entry.get('tokens_per_s', '-')} | {entry.get('cpu_ratio', '-')} "
                    f"| {(entry.get('gpu_busy') or {}).get('wait_kernel_ms', '-')} "
                    f"| {entry.get('skipped') or entry.get('error') or ''} |")
    return ["## Headline: decode tokens/s at equal device memory", "",
            f"{headline['model']}, {headline['layers']} layers (layer 0 dense), {headline['context']} tokens per "
            f"request; device K/V budget {headline['device_kv_budget_gib']} GiB for both, host K/V budget "
            f"{headline['host_kv_budget_gib']} GiB for scout; graph-replayed steps. **scout / full: "
            f"{headline.get('scout_over_full', 'not measured')}** (target: at least 3); resident-first: "
            f"**{ratio}**; with the CPU split: "
            f"**{headline.get('scout_split_over_full', 'not measured')}**.", "",
            "| mode | batch | what limits it | step ms | tokens/s | CPU ratio | wait kernel ms | note |",
            "|---|---:|---|---:|---:|---:|---:|---|", *rows, ""]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on any device; nothing written")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    parser.add_argument("--budget-s", type=float, default=480.0, help="the whole call's time, seconds (default 8 min)")
    parser.add_argument("--layers", type=int, default=8, help="layers of the attention-only stack of host, capture")
    parser.add_argument("--equal-batch-layers", type=int, default=8, help="layers of the equal-batch part's stack")
    parser.add_argument("--tests-timeout", type=int, default=240)
    parser.add_argument("--recall-timeout", type=int, default=420, help="seconds the recall study may take")
    parser.add_argument("--kv-budget-gib", type=float, default=None,
                        help="device K/V budget of the headline (default: full attention's at 2 requests)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        from scout_sglang.triton_interpreter import interpret_without_gpu

        interpret_without_gpu()  # Triton's interpreter, sped up
    sys.path.insert(0, str(ROOT / "benchmarks"))  # model_stack, cpu_attention, decode_step
    setup = Setup(args)
    device_name = torch.cuda.get_device_name() if setup.device.type == "cuda" else "cpu"
    log(f"device {device_name}; parts {args.parts}; budget {args.budget_s:.0f} s")
    started = time.perf_counter()
    deadline = started + args.budget_s
    result = dict(device_name=device_name, layers=setup.layers, dry_run=setup.dry, torch=torch.__version__,
                  budget_s=args.budget_s, parts={})
    for name in [p for p in args.parts.split(",") if p]:
        part_started, left = time.perf_counter(), deadline - time.perf_counter()
        if left < MIN_SECONDS[name] and not setup.dry:
            result["parts"][name] = dict(skipped=f"{left:.0f} s of the call's budget left, the part needs "
                                                 f"{MIN_SECONDS[name]}")
            continue
        args.checkpoint = None if setup.dry else checkpoint_of(result, name)
        args.tests_timeout = int(min(args.tests_timeout, max(30, left - 10)))
        args.recall_timeout = int(min(args.recall_timeout, max(60, left - 10)))
        try:
            part = PARTS[name]
            result["parts"][name] = part(setup, args, deadline - 20) if name in ("headline", "resident", "equal_batch") else \
                part(setup, args)
        except Exception as error:  # noqa: BLE001 - a part that fails is reported, the others go on
            result["parts"][name] = dict(error=f"{type(error).__name__}: {error}", trace=traceback.format_exc()[-2000:])
        log(f"{name} done in {time.perf_counter() - part_started:.0f} s")
        result["total_s"] = time.perf_counter() - started
        if not setup.dry:  # each part's results as it finishes: a call cut short keeps them
            log(f"wrote {write_report(result)}.{{json,md}}")
    result["total_s"] = time.perf_counter() - started
    print(json.dumps(dict(device=device_name, total_s=round(result["total_s"], 1),
                          parts={k: first_error(v) is None for k, v in result["parts"].items()},
                          errors={k: first_error(v) for k, v in result["parts"].items() if first_error(v)})))
    return 0


def checkpoint_of(result: dict, name: str):
    """A part's hook for its results so far: they go into the report at once, so a call cut short keeps them."""
    def checkpoint(partial: dict) -> None:
        result["parts"][name] = dict(partial, unfinished=True)
        write_report(result)
    return checkpoint


def first_error(value) -> str | None:
    """The first error a part's result holds anywhere (the part's own, or one of its rows'), or None."""
    if isinstance(value, dict):
        if value.get("error"):
            return str(value["error"])[:300]
        value = list(value.values())
    if isinstance(value, list):
        return next((error for error in map(first_error, value) if error), None)
    return None


if __name__ == "__main__":
    sys.exit(main())
