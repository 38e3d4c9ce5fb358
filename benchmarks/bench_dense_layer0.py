"""Layer 0 kept dense on the device, or offloaded like the other layers: what each costs.

Offloaded, layer 0 has no previous layer to predict its query from, so the
engine selects with the real query and waits for layer 0's CPU part in the
same layer. Dense, layer 0 keeps every token of the logical capacity on the
device. Three measurements, each with dense_layers [0] and []:

  memory    device bytes per logical token and per request slot of a
            Qwen3-8B-shaped model (36 layers, 32/8 heads, head_dim 128, bf16)
            with the qwen3-8b preset (block 32, budget 2048), from the
            engine's own accounting: engines of that shape with small stores
            (two page counts x two slot counts) give engine.memory()'s device
            bytes, split by memory_report.device_parts; they are linear in
            pages and slots, and the slopes are checked against
            memory_report.planned_bytes at 1M logical tokens and 64 slots
            (the README's serving example).
  cpu_part  decode steps of the decode-step benchmark's workload
            (benchmarks/decode_step: Qwen3-8B attention, `--layers` layers,
            synthetic K/V and queries, 2 ms of simulated rest per layer), scout
            mode, both settings interleaved step by step: layer 0's CPU wait
            (StepTelemetry, per layer), the wall time to the end of layer 0's
            attention, and the step time (medians).
  accuracy  the bundled retrieval model through the reference decoder, scout
            and quest (quest has no CPU part: it separates the cost of a sparse
            layer 0 from the cost of offloading it), per sample, so that the
            two settings are compared on the same sequences.

    python -P benchmarks/bench_dense_layer0.py            # all three (~30 min on 2 busy cores)
    python -P benchmarks/bench_dense_layer0.py --quick    # memory and a short cpu_part, JSON line only

Writes benchmarks/results/dense_layer0.{json,md} (not with --quick). Benchmarks do not assert.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `python -P` leaves the script's folder off sys.path

from decode_step.common import HEAD_DIM, NUM_KV_HEADS, NUM_QO_HEADS  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SETTINGS = {"dense [0]": (0,), "offloaded []": ()}
QWEN3_LAYERS = 36
SERVING = {"logical_tokens": 1_000_000, "slots": 64}  # the README's Qwen3-8B example


def log(message: str) -> None:
    print(f"[dense_layer0] {message}", file=sys.stderr, flush=True)


def preset(dense_layers, **changes):
    from scout_sglang.config import ScoutConfig
    from scout_sglang.env import load_preset

    return ScoutConfig(**load_preset("qwen3-8b")).replace(dense_layers=dense_layers, **changes)


def measure_memory() -> dict:
    """Per setting: device bytes per logical token and per request slot, by part, and at the serving example."""
    from scout_sglang.core.engine import CoAttentionEngine
    from scout_sglang.core.shape import ModelShape
    from scout_sglang.sglang_adapter import memory_report

    shape = ModelShape(num_layers=QWEN3_LAYERS, num_qo_heads=NUM_QO_HEADS, num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM)
    pages, slots = (8, 24), (1, 2)
    out = {}
    for label, dense in SETTINGS.items():
        config = preset(dense)
        measured = {}
        for p in pages:
            for s in slots:
                engine = CoAttentionEngine(config, shape, dtype=torch.bfloat16, max_requests=s, total_pages=p,
                                           cpu_worker=False, track_changes=False)  # shape only: no CPU work
                parts = memory_report.device_parts(engine)
                parts["device_bytes_allocated"] = engine.memory()["device_bytes_allocated"]
                measured[p, s] = parts
                del engine
        keys = list(measured[pages[0], slots[0]])
        per_page = {k: (measured[pages[1], slots[0]][k] - measured[pages[0], slots[0]][k]) / (pages[1] - pages[0])
                    for k in keys}
        per_slot = {k: measured[pages[0], slots[1]][k] - measured[pages[0], slots[0]][k] for k in keys}
        # Linear in both: the fourth corner must follow from the other three.
        corner = {k: measured[pages[0], slots[0]][k] + (pages[1] - pages[0]) * per_page[k] + per_slot[k] for k in keys}
        linear = all(corner[k] == measured[pages[1], slots[1]][k] for k in keys)
        total_pages = memory_report.engine_total_pages(SERVING["logical_tokens"], config.block_size, SERVING["slots"])
        example = {k: total_pages * per_page[k] + SERVING["slots"] * per_slot[k] for k in keys}
        plan = memory_report.planned_bytes(config, num_layers=QWEN3_LAYERS, num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM,
                                           itemsize=2, total_pages=total_pages, slots=SERVING["slots"])
        out[label] = dict(
            dense_layers=list(dense), linear=linear, planned_equals_measured=all(plan[k] == example[k] for k in keys),
            bytes_per_logical_token={k: v / config.block_size for k, v in per_page.items()},
            bytes_per_request_slot=per_slot, serving_example_bytes=example,
            full_attention_bytes_per_token=2 * NUM_KV_HEADS * HEAD_DIM * 2 * QWEN3_LAYERS,
        )
        log(f"memory {label}: {out[label]['bytes_per_logical_token']['device_bytes_allocated']:.0f} B per logical "
            f"token, {per_slot['device_bytes_allocated'] / 2**20:.1f} MiB per request slot, "
            f"{example['device_bytes_allocated'] / 2**30:.2f} GiB at {SERVING}")
    return out


class LayerBusy:
    """The busy time of an engine's CPU parts per layer, as the shared worker counts it (seconds its threads
    spent attending the layer's parts): the CPU part's own work, which a GPU, whose device part is much
    shorter, would wait for."""

    def __init__(self, worker, engine):
        self.worker = worker
        ids = engine.handoff.worker_id if engine.handoff is not None else {}
        self._ids = dict(ids)
        self._marks = {layer: worker.layer_busy_s(i) for layer, i in self._ids.items()}

    def take(self) -> dict[int, float]:
        """Seconds per layer since the last call."""
        now = {layer: self.worker.layer_busy_s(i) for layer, i in self._ids.items()}
        delta = {layer: now[layer] - self._marks[layer] for layer in now}
        self._marks = now
        return delta


def measure_cpu_part(args) -> dict:
    """Scout decode steps with layer 0 dense and offloaded, interleaved; per-layer CPU wait from the telemetry."""
    from decode_step.workload import LayerCompute, Prompts, StepInputs

    from decode_step.cpu_watch import bench_cores, make_worker

    from scout_sglang.core.engine import CoAttentionEngine
    from scout_sglang.core.shape import ModelShape

    device = torch.device("cpu")
    cores = bench_cores(device)  # the CPU plays the device: half the cores for its torch ops, the rest the workers'
    worker = make_worker(0, "auto", device=device, cores=cores)
    layer_compute = LayerCompute(args.layer_compute_ms, "sleep", torch.device("cpu"))
    shape = ModelShape(num_layers=args.layers, num_qo_heads=NUM_QO_HEADS, num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM)
    steps = args.warmup + args.steps
    rows = []
    try:
        for batch in args.batches:
            prompts = Prompts(args.context, batch, args.layers, steps, seed=args.context)
            inputs = StepInputs(prompts, batch, args.layers, steps, rho=0.99, predict_noise=0.33, seed=7 * batch,
                                device=torch.device("cpu"))
            engines = {}
            for label, dense in SETTINGS.items():
                engine = CoAttentionEngine(preset(dense), shape, dtype=torch.bfloat16, max_requests=batch,
                                           max_tokens_per_request=args.context + steps + 32, cpu_worker=worker,
                                           track_changes=False)
                for b in range(batch):
                    engine.add_request(b)
                    for layer in range(args.layers):
                        engine.prefill(b, layer, prompts.k[b, layer], prompts.v[b, layer])
                engines[label] = (engine, [], LayerBusy(worker, engine))
            for s in range(steps):
                for label, (engine, samples, busy) in engines.items():
                    sample = decode_step(engine, inputs, s, args.layers, layer_compute)
                    spans = busy.take()
                    sample["layer0_cpu_part_ms"] = 1e3 * spans.get(0, 0.0)
                    sample["other_cpu_part_ms"] = 1e3 * sum(t for layer, t in spans.items() if layer)
                    if s >= args.warmup:
                        samples.append(sample)
            for label, (engine, samples, _) in engines.items():
                engine.close()
                row = {"setting": label, "context": args.context, "batch_size": batch, "layers": args.layers,
                       "steps": len(samples)}
                for key in samples[0]:
                    row[key] = statistics.median(sample[key] for sample in samples)
                rows.append(row)
                log(f"cpu part ctx {args.context} B {batch} {label:13s}: layer 0 {row['layer0_ms']:.1f} ms "
                    f"(CPU wait {row['layer0_cpu_wait_ms']:.2f} ms, CPU part {row['layer0_cpu_part_ms']:.2f} ms), "
                    "other layers' CPU wait "
                    f"{row['other_cpu_wait_ms']:.2f} ms, step {row['step_ms']:.1f} ms")
    finally:
        worker.shutdown()
    return {"rows": rows, "torch_threads": torch.get_num_threads(), "cpu_groups": len(worker.threads),
            "cores": cores.as_report(),
            "layer_compute_ms": args.layer_compute_ms, "warmup": args.warmup, "steps": args.steps}


def decode_step(engine, inputs, s, layers, layer_compute) -> dict:
    """One step driven as a model drives it (predict the next layer, attend, the rest of the layer)."""
    start = time.perf_counter()
    engine.begin_step(list(range(inputs.q.shape[2])))
    layer0 = 0.0
    for layer in range(layers):
        if engine.wants_prediction(layer + 1):
            engine.predict(layer + 1, inputs.q_pred[s, layer + 1])
        engine.attend(layer, inputs.q[s, layer], inputs.k_new[s, layer], inputs.v_new[s, layer])
        if layer == 0:
            layer0 = time.perf_counter() - start
        layer_compute()
    telemetry = engine.end_step()
    step = time.perf_counter() - start
    wait = {layer: stats.cpu_wait_s for layer, stats in telemetry.layers.items()}
    return {"step_ms": 1e3 * step, "layer0_ms": 1e3 * layer0, "layer0_cpu_wait_ms": 1e3 * wait.get(0, 0.0),
            "other_cpu_wait_ms": 1e3 * sum(v for layer, v in wait.items() if layer),
            "layer0_cpu_ratio": telemetry.layers[0].cpu_ratio if 0 in telemetry.layers else 0.0}


def measure_accuracy(args) -> dict:
    """Per (context, budget, mode): per-sample correctness with each setting, and the paired differences."""
    from bench_accuracy import engine_config

    from scout_sglang.retrieval.evaluate import engine_run, held_out, load_model

    model = load_model()
    cells = []
    for cell in args.accuracy_cells:
        context, budget = (int(x) for x in cell.split("/"))
        samples = held_out(args.samples, context)
        for mode in ("quest", "scout"):
            correct = {}
            for label, dense in SETTINGS.items():
                start = time.perf_counter()
                text = ",".join(map(str, dense))
                correct[label] = engine_run(model, samples, engine_config(mode, budget, text))[0]
                log(f"accuracy ctx {context} budget {budget} {mode:5s} {label:13s}: "
                    f"{sum(correct[label]) / len(samples):.1%} ({time.perf_counter() - start:.0f} s)")
            dense_ok, off_ok = correct["dense [0]"], correct["offloaded []"]
            cells.append({"context": context, "budget": budget, "mode": mode, "samples": len(samples),
                          "accuracy": {label: sum(c) / len(c) for label, c in correct.items()},
                          "only_dense_right": sum(d and not o for d, o in zip(dense_ok, off_ok)),
                          "only_offloaded_right": sum(o and not d for d, o in zip(dense_ok, off_ok))})
    return {"model": "needle-llama (tiny preset: block 16, 1 sink and 1 local block)", "cells": cells}


def markdown(report: dict) -> str:
    mem, lines = report["memory"], ["# Layer 0: dense on the device or offloaded", "",
                                    "Written by `benchmarks/bench_dense_layer0.py`; all numbers from one run "
                                    f"({report['hardware']}).", ""]
    lines += ["## Device memory, Qwen3-8B shape (36 layers, 8 KV heads, head_dim 128, bf16, qwen3-8b preset)", "",
              "From the engine's own accounting (engine.memory(), memory_report.device_parts) on small stores, "
              "scaled; bytes per logical token are paid for the whole `--max-total-tokens` capacity, bytes per "
              "request slot for each of `--max-running-requests`.", "",
              "| layer 0 | per logical token: digests | dense layers | total | per request slot (windows + "
              f"resident) | at {SERVING['logical_tokens']:,} tokens, {SERVING['slots']} slots |",
              "|---|---:|---:|---:|---:|---:|"]
    for label, m in mem.items():
        t, slot, ex = m["bytes_per_logical_token"], m["bytes_per_request_slot"], m["serving_example_bytes"]
        lines.append(f"| {label} | {t['digest_bytes_allocated']:.0f} B | {t['dense_layer_bytes_allocated']:.0f} B | "
                     f"{t['device_bytes_allocated']:.0f} B | {slot['device_bytes_allocated'] / 2**20:.1f} MiB | "
                     f"{ex['device_bytes_allocated'] / 2**30:.2f} GiB "
                     f"({ex['dense_layer_bytes_allocated'] / 2**30:.2f} GiB dense) |")
    first = next(iter(mem.values()))
    lines += ["", f"Full attention: {first['full_attention_bytes_per_token']} B per token. Linear in pages and "
              f"slots: {all(m['linear'] for m in mem.values())}; equal to memory_report.planned_bytes: "
              f"{all(m['planned_equals_measured'] for m in mem.values())}.", ""]
    cpu = report["cpu_part"]
    lines += ["## Layer 0's CPU part (scout, same-layer when offloaded)", "",
              f"The CPU plays the device here ({cpu['torch_threads']} torch thread(s), {cpu['cpu_groups']} CPU worker "
              f"group(s) on the same cores), {cpu['layer_compute_ms']} ms of simulated rest per layer; medians of "
              "the timed steps. Layer 0 = wall time from the start of the step to the end of layer 0's attention. "
              "CPU wait = how long the device side waited for the CPU result (StepTelemetry); CPU part = wall time "
              "from the CPU part's submit to its result, what a device whose own part is shorter would wait.",
              "", "| context | batch | layers | layer 0 | layer 0 ms | layer 0 CPU wait ms | layer 0 CPU part ms | "
              "layer 0 CPU ratio | other layers' CPU wait ms | step ms |",
              "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in cpu["rows"]:
        lines.append(f"| {r['context']} | {r['batch_size']} | {r['layers']} | {r['setting']} | {r['layer0_ms']:.1f} | "
                     f"{r['layer0_cpu_wait_ms']:.2f} | {r['layer0_cpu_part_ms']:.2f} | {r['layer0_cpu_ratio']:.1%} | "
                     f"{r['other_cpu_wait_ms']:.2f} | {r['step_ms']:.1f} |")
    acc = report.get("accuracy")
    if acc:
        lines += ["", f"## Accuracy ({acc['model']}, reference decoder)", "",
                  "| context | budget | mode | dense [0] | offloaded [] | drop (points) | only dense right | "
                  "only offloaded right |", "|---:|---:|---|---:|---:|---:|---:|---:|"]
        for c in acc["cells"]:
            a = c["accuracy"]
            lines.append(f"| {c['context']} | {c['budget']} | {c['mode']} | {100 * a['dense [0]']:.1f} | "
                         f"{100 * a['offloaded []']:.1f} | {100 * (a['dense [0]'] - a['offloaded []']):.1f} | "
                         f"{c['only_dense_right']} | {c['only_offloaded_right']} |")
    return "\n".join(lines + reading(report)) + "\n"


def reading(report: dict) -> list[str]:
    """The three costs side by side, from the numbers above."""
    dense, offloaded = (report["memory"][label] for label in SETTINGS)
    per_token = [m["bytes_per_logical_token"]["device_bytes_allocated"] for m in (dense, offloaded)]
    example = [m["serving_example_bytes"]["device_bytes_allocated"] for m in (dense, offloaded)]
    waits = [r["layer0_cpu_part_ms"] for r in report["cpu_part"]["rows"] if r["setting"] == "offloaded []"]
    lines = ["", "## Reading", "",
             f"- memory: a dense layer 0 adds {per_token[0] - per_token[1]:.0f} B per logical token "
             f"({per_token[0] / per_token[1] - 1:.0%} more than offloaded), {(example[0] - example[1]) / 2**30:.2f} GiB "
             f"({example[0] / example[1] - 1:.1%}) at {SERVING['logical_tokens']:,} tokens and {SERVING['slots']} slots;",
             f"- latency: offloaded, layer 0's CPU part runs in its own layer: {min(waits):.1f} to {max(waits):.1f} ms "
             "per step here, which a device faster than this CPU would wait for;"]
    if report.get("accuracy"):
        drops = {mode: [100 * (c["accuracy"]["dense [0]"] - c["accuracy"]["offloaded []"])
                        for c in report["accuracy"]["cells"] if c["mode"] == mode] for mode in ("scout", "quest")}
        lines.append(f"- accuracy: offloading layer 0 costs scout {min(drops['scout']):.1f} to "
                     f"{max(drops['scout']):.1f} points and quest {min(drops['quest']):.1f} to "
                     f"{max(drops['quest']):.1f} (quest has no CPU part: the loss comes from attending sparsely in "
                     "layer 0).")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="memory and 3 steps at batch 1, no accuracy, no files")
    parser.add_argument("--layers", type=int, default=4, help="layers of the cpu_part model (2 cores: not 36)")
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--layer-compute-ms", type=float, default=2.0)
    parser.add_argument("--accuracy-cells", nargs="*", default=["1024/128", "2048/128", "2048/256"],
                        metavar="CONTEXT/BUDGET", help="retrieval accuracy cells ('' or none to skip)")
    parser.add_argument("--samples", type=int, default=128, help="held-out sequences per context")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--render", type=Path, default=None, metavar="JSON",
                        help="only rewrite dense_layer0.md under --out from a dense_layer0.json of an earlier run")
    args = parser.parse_args(argv)
    if args.render is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "dense_layer0.md").write_text(markdown(json.loads(args.render.read_text())))
        return 0
    if args.quick:
        args.context, args.batches, args.warmup, args.steps, args.accuracy_cells = 4096, [1], 1, 3, []
    started = time.perf_counter()
    from decode_step.hardware import cpu_model

    report = {"hardware": f"{cpu_model()}, {len(os.sched_getaffinity(0))} cores, torch {torch.__version__}",
              "memory": measure_memory(), "cpu_part": measure_cpu_part(args)}
    cells = [c for c in args.accuracy_cells if c]
    if cells:
        args.accuracy_cells = cells
        report["accuracy"] = measure_accuracy(args)
    report["total_s"] = round(time.perf_counter() - started, 1)
    summary = {label: {"device_bytes_per_logical_token": m["bytes_per_logical_token"]["device_bytes_allocated"]}
               for label, m in report["memory"].items()}
    for r in report["cpu_part"]["rows"]:
        summary[r["setting"]][f"layer0_cpu_wait_ms_batch{r['batch_size']}"] = round(r["layer0_cpu_wait_ms"], 3)
    if not args.quick:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "dense_layer0.json").write_text(json.dumps(report, indent=1) + "\n")
        (args.out / "dense_layer0.md").write_text(markdown(report))
        log(f"wrote {args.out}/dense_layer0.{{json,md}} in {report['total_s']:.0f} s")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
