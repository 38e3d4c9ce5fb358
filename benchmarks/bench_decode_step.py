"""Decode-step benchmark: one step of a Qwen3-8B-shaped attention stack in every
mode (full, quest, infinigen, hgca, scout), its time broken down as in the
paper's Figure 11, and the layer-ahead / recall ablation of its Figure 12.

Drives CoAttentionEngine exactly as a model would (begin_step; per layer
predict(i + 1) then attend(i) then the rest of the layer; end_step), eagerly,
and splits each step into the engine's stages, the wait for the CPU part (the
engine's cpu_wait telemetry) and the rest of the layers. The CPU worker's own
time is measured beside the engine: its busy time ("CPU busy": seconds its
threads spent attending, summed over threads, as the worker counts them) and
its threads' CPU seconds from /proc, a second, coarser measure (10 ms ticks,
summed over the timed steps).

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
ablation), then the median of the timed steps. The cores follow the engine's
core plan (cpu_worker/core_plan.py, printed and in the report): on the CPU
"device" torch ops and the host thread get `--device-threads` CPUs (half), the
CPU worker one pinned thread per physical core of the rest. After each timed
step, 5 ms later, the worker's threads are sampled: none may still be runnable
(they park once a step's parts are done); the worker's CPU time over its attend
time says what spinning costs.
Recall study (decode_step/recall_study.py; --only-recall runs it alone): scout
on the heavy-hitter workload (Zipf-like block importance over drifting topics,
--drift, a slow prediction error at --target-cosine) and on the flat one above,
with recall and its brake, with a hysteresis of 2, without the brake and off,
interleaved from the first decode step at --recall-shape: the CPU ratio, the
selection's change rate and the recall traffic against its cap per step.

Progress goes to stderr; the last stdout line is one JSON object. Without
--quick it writes benchmarks/results/decode_step.{md,json,png} and
recall.{md,json,png}, and load_ramp.{md,json,png}.
Load ramp (decode_step/load_ramp.py; --only-load-ramp runs it alone): a server of --load-ramp-shape's slots runs
1, 2, 4, ... requests, scout with and without resident-first: the CPU ratio and the exact share against the load.
Benchmarks do not assert.
"""

# The parts live in the decode_step package beside this script (see its __init__).

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from scout_sglang.config import ScoutConfig
from scout_sglang.cpu_worker.cpu_sets import cpu_list_text

# `python -P` (and running from another directory) leaves the script's own directory off sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_step.common import MODES, log, parse_ints  # noqa: E402
from decode_step.cpu_watch import WatchedWorker, bench_cores, make_worker  # noqa: E402
from decode_step.hardware import hardware  # noqa: E402
from decode_step.load_ramp import ramp_summary, run_load_ramp, write_ramp_report  # noqa: E402
from decode_step.plot import write_plot  # noqa: E402
from decode_step.recall_report import write_recall_markdown, write_recall_plot  # noqa: E402
from decode_step.recall_study import recall_summary, rejudge, run_recall_study  # noqa: E402
from decode_step.report import write_markdown  # noqa: E402
from decode_step.sweep import quick_summary, run_sweep  # noqa: E402
from decode_step.workload import LayerCompute  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def parse_args() -> argparse.Namespace:
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
                        help="CPU worker threads; default: one per physical core of the core plan's workers")
    parser.add_argument("--device-threads", type=int, default=None,
                        help="on the CPU device, the CPUs (and torch threads) that play the device; default: half")
    parser.add_argument("--cpu-impl", default="auto", choices=("auto", "native", "torch"))
    parser.add_argument("--kernel-impl", default=None, choices=(None, "flashinfer", "triton", "torch"))
    parser.add_argument("--recall-shape", type=parse_ints, default=[16384, 4],
                        help="context,batch of the recall study (CPU ratio and recall traffic per step)")
    parser.add_argument("--recall-steps", type=int, default=48, help="decode steps of the recall study")
    parser.add_argument("--drift", type=float, default=0.16, help="heavy-hitter workload: topic drift per step")
    parser.add_argument("--target-cosine", type=float, default=0.95,
                        help="heavy-hitter workload: cosine of the predicted to the real query")
    parser.add_argument("--only-recall", action="store_true",
                        help="run the recall study alone (writes recall.*, leaves decode_step.* as they are)")
    parser.add_argument("--load-ramp-shape", type=parse_ints, default=[8192, 8],
                        help="context,slots of the load ramp (scout with and without resident-first at 1, 2, 4, "
                             "... of slots requests)")
    parser.add_argument("--load-ramp-steps", type=int, default=5, help="timed steps per load of the ramp")
    parser.add_argument("--only-load-ramp", action="store_true",
                        help="run the load ramp alone (writes load_ramp.{md,json,png})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--render", type=Path, default=None, metavar="JSON",
                        help="only rewrite decode_step.md and .png under --out from a decode_step.json of an earlier run")
    parser.add_argument("--render-recall", type=Path, default=None, metavar="JSON",
                        help="only rewrite recall.md and .png under --out from a recall.json of an earlier run")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    if args.render_recall is not None:
        saved = json.loads(args.render_recall.read_text())
        beta = ScoutConfig().recall_beta
        rejudge(saved["study"], beta)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "recall.json").write_text(json.dumps(saved, indent=2) + "\n")
        write_recall_markdown(args.out / "recall.md", saved["study"], saved["hardware"], beta)
        write_recall_plot(args.out / "recall.png", saved["study"], beta)
        log(f"rendered {args.out}/recall.{{md,png}} from {args.render_recall}")
        return 0
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
        args.recall_shape, args.recall_steps = [4096, 2], 8
        args.load_ramp_shape, args.load_ramp_steps = [2048, 2], 2
    args.recall_beta = ScoutConfig().recall_beta

    device = torch.device(args.device)
    if args.max_tokens is None:
        args.max_tokens = 1 << 40
    modes = [m for m in args.modes.split(",") if m]
    kind = args.layer_compute if args.layer_compute != "auto" else ("matmul" if device.type == "cuda" else "sleep")
    cores = bench_cores(device, args.device_threads)
    args.device_threads = torch.get_num_threads() if device.type == "cpu" else args.device_threads
    log(f"cores: {cores.why} (workers {cpu_list_text(cores.workers)}, host {cpu_list_text(cores.host)})")
    threads = args.cpu_groups or 0  # 0: one per physical core of the plan's workers
    probe = WatchedWorker(make_worker(threads, args.cpu_impl, device=device, cores=cores,
                                      kernel_impl=args.kernel_impl))  # named in the report, then stopped
    worker_name = repr(probe)
    threads = probe.num_threads
    probe.shutdown()
    load_before = os.getloadavg()[0]
    hw = hardware(device, worker_name) | {"core_plan": cores.as_report()}
    log(f"hardware: {hw}")
    layer_compute = LayerCompute(args.layer_compute_ms, kind, device)
    report = dict(hardware=hw, shapes=[], skipped=[], ablation=None, load_before=load_before, cpu_groups=threads)
    started = time.perf_counter()
    watched = lambda: WatchedWorker(make_worker(threads, args.cpu_impl, device=device, cores=cores,  # noqa: E731
                                                kernel_impl=args.kernel_impl))
    ramp = run_load_ramp(args, device=device, make_worker=watched, layer_compute=layer_compute)
    if args.only_load_ramp:
        if not args.quick:
            write_ramp_report(args.out, ramp, hw)
            log(f"wrote {args.out}/load_ramp.{{md,json,png}}")
        print(json.dumps({"load_ramp": ramp_summary(ramp)}))
        return 0
    if not args.only_recall:
        run_sweep(args, report, modes=modes, kind=kind, device=device, make_worker=watched,
                  layer_compute=layer_compute)
    study = run_recall_study(args, device=device, make_worker=watched, layer_compute=layer_compute)
    report["load_after"] = os.getloadavg()[0]
    report["total_s"] = time.perf_counter() - started
    log(f"done in {report['total_s']:.0f} s")

    summary = quick_summary(report, args, device) | {"recall": recall_summary(study), "load_ramp": ramp_summary(ramp)}
    if not args.quick:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "recall.json").write_text(json.dumps(dict(hardware=hw, study=study), indent=2) + "\n")
        write_recall_markdown(args.out / "recall.md", study, hw, args.recall_beta)
        write_recall_plot(args.out / "recall.png", study, args.recall_beta)
        log(f"wrote {args.out}/recall.{{md,json,png}}")
        write_ramp_report(args.out, ramp, hw)
        log(f"wrote {args.out}/load_ramp.{{md,json,png}}")
        if not args.only_recall:
            (args.out / "decode_step.json").write_text(json.dumps(report, indent=2) + "\n")
            write_markdown(args.out / "decode_step.md", report)
            write_plot(args.out / "decode_step.png", report)
            log(f"wrote {args.out}/decode_step.{{md,json,png}}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
