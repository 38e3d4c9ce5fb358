"""The load ramp (resident-first serving): a server sized for `slots` requests runs 1, 2, 4, ... of them at one
context, with scout as it was (a fixed resident buffer of resident_blocks per slot), with resident-first (one pool
of the same pages, slots x resident_blocks, shared by the requests running) and with full attention (the exact
reference). Interleaved on the same inputs; per load: the CPU ratio, the share of requests attended exactly, the
step time and tokens/s.

With few requests, resident-first gives each one its blocks (all of them when they fit: exact, no CPU part); as
the load grows the shares shrink to the floor, where it decodes as scout always did. Reported, never asserted.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from .common import BLOCK_SIZE, log
from .runner import run_interleaved
from .workload import Prompts, StepInputs

# (label, mode, ScoutConfig overrides): full attention is the exact reference, and what an exact row costs
CONFIGS = (("full attention", "full", {}), ("scout", "scout", {}),
           ("scout, resident-first", "scout", {"resident_first": True}))


def loads(slots: int) -> list[int]:
    """1, 2, 4, ... up to slots (slots itself last)."""
    out, batch = [], 1
    while batch < slots:
        out.append(batch)
        batch *= 2
    return out + [slots]


def run_load_ramp(args, *, device, make_worker, layer_compute) -> dict:
    """-> the ramp's report: per load, each configuration's summary, and the pool the configuration gets."""
    context, slots = args.load_ramp_shape
    steps, warmup = args.load_ramp_steps, args.warmup
    ramp = dict(context=context, slots=slots, steps=steps, token_budget=args.token_budget, block_size=BLOCK_SIZE,
                layers=args.layers, loads=[])
    started = time.perf_counter()
    for batch_size in loads(slots):
        log(f"load ramp: {batch_size} of {slots} requests at context {context}")
        prompts = Prompts(context, batch_size, args.layers, warmup + steps, seed=args.seed + 29)
        inputs = StepInputs(prompts, batch_size, args.layers, warmup + steps, rho=args.query_rho,
                            predict_noise=args.predict_noise, seed=args.seed + 31, device=device)
        configs = [dict(mode=mode, label=label, overrides=overrides, max_requests=slots)
                   for label, mode, overrides in CONFIGS]
        rows, interleaved = run_interleaved(args, prompts, inputs, configs, batch_size=batch_size, warmup=warmup,
                                            steps=steps, make_worker=make_worker, layer_compute=layer_compute,
                                            device=device)
        for r in rows:
            log(f"  {r['label']:24s}: CPU ratio {r['cpu_ratio']:.1%}  exact {r['exact_share']:.0%}  "
                f"step {r['step_ms']:.1f} ms  {r['tokens_per_s']:.1f} tokens/s")
        ramp["loads"].append(dict(batch_size=batch_size, interleaved=interleaved,
                                  rows=[{k: v for k, v in r.items() if k != "curve"} for r in rows]))
        del prompts, inputs
    ramp["total_s"] = time.perf_counter() - started
    return ramp


def ramp_summary(ramp: dict) -> dict:
    """Per configuration: the CPU ratio and exact share at each load (the quick JSON line)."""
    out = {}
    for label, _, _ in CONFIGS:
        rows = [next(r for r in load["rows"] if r["label"] == label) for load in ramp["loads"]]
        out[label] = {str(load["batch_size"]): dict(cpu_ratio=round(r["cpu_ratio"], 4),
                                                    exact_share=round(r["exact_share"], 3))
                      for load, r in zip(ramp["loads"], rows)}
    return out


def write_ramp_report(out: Path, ramp: dict, hardware: dict) -> None:
    """load_ramp.{json,md,png} under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "load_ramp.json").write_text(json.dumps(dict(hardware=hardware, ramp=ramp), indent=2) + "\n")
    lines = ["# Load ramp: scout with and without resident-first serving", "",
             "Written by `benchmarks/bench_decode_step.py --only-load-ramp` (decode_step/load_ramp.py); "
             "random workload (a stress case, not a model), reported, never asserted.", "",
             f"Device: {hardware.get('device')}; CPU: {hardware.get('cpu_model')}. Context {ramp['context']} tokens, "
             f"a server of {ramp['slots']} request slots, budget {ramp['token_budget']} tokens in blocks of "
             f"{ramp['block_size']}, {ramp['layers']} layers (layer 0 dense), {ramp['steps']} timed steps per load "
             "(medians). Both configurations hold the same resident pages: slots x resident_blocks.", "",
             "| requests | configuration | CPU ratio | exact share | step ms | tokens/s |",
             "|---:|---|---:|---:|---:|---:|"]
    for load in ramp["loads"]:
        for r in load["rows"]:
            exact = "dense" if r["mode"] == "full" else f"{r['exact_share']:.2f}"
            lines.append(f"| {load['batch_size']} | {r['label']} | {r['cpu_ratio']:.3f} | {exact} | "
                         f"{r['step_ms']:.1f} | {r['tokens_per_s']:.2f} |")
    lines += ["", "CPU ratio: blocks attended on the CPU over the budget's blocks (per offloaded layer and step). "
              "Exact share: requests whose every block fit their quota, attended as full attention.", "",
              "On the CPU as the device, the device part runs on the same cores as everything else: an exact row "
              "costs what full attention costs plus the scoring and selection over all its blocks, and a larger "
              "quota is more device work. On a GPU the device part reads its blocks at memory speed; only a GPU run "
              "of the ramp says what resident-first buys there.", ""]
    (out / "load_ramp.md").write_text("\n".join(lines))
    _plot(out / "load_ramp.png", ramp)


def _plot(path: Path, ramp: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    batches = [load["batch_size"] for load in ramp["loads"]]
    for label, _, _ in CONFIGS:
        rows = [next(r for r in load["rows"] if r["label"] == label) for load in ramp["loads"]]
        left.plot(batches, [r["cpu_ratio"] for r in rows], marker="o", label=label)
        right.plot(batches, [r["tokens_per_s"] for r in rows], marker="o", label=label)
    left.set(xlabel="requests running", ylabel="CPU ratio", title="CPU ratio against the load", xscale="log",
             xticks=batches, xticklabels=[str(b) for b in batches])
    right.set(xlabel="requests running", ylabel="tokens/s", title="decode tokens/s", xscale="log",
              xticks=batches, xticklabels=[str(b) for b in batches])
    for axis in (left, right):
        axis.minorticks_off()
    left.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
