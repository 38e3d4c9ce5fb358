"""The sweep: every (context, batch) shape with all modes interleaved, then the
layer-ahead / recall ablation (and, outside --quick, quest's selection change
rate) on the ablation's shape; it fills the report that the markdown, JSON and
plot are written from. Also the one-line JSON summary printed last.
"""

from __future__ import annotations

import gc
import time

from .common import ABLATION, log, parse_ints
from .runner import run_interleaved
from .workload import LayerCompute, Prompts, StepInputs


def run_sweep(args, report: dict, *, modes: list[str], kind: str, device, make_worker, layer_compute) -> None:
    """Fill report["shapes"], ["skipped"], ["ablation"] and ["workload"] (kind: the layer compute's)."""
    ablation_shape = parse_ints(args.ablation_shape) if args.ablation_shape else None
    steps_total = max(args.warmup + args.steps, (args.ablation_warmup + args.ablation_steps) if ablation_shape else 0)
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
                steps=args.steps, make_worker=make_worker, layer_compute=layer_compute, device=device)
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
                steps=args.ablation_steps, make_worker=make_worker, layer_compute=layer_compute, device=device)
            for r in rows:
                log(f"ablation {r['label']:28s}: step {r['step_ms']:8.1f} ms  idle {r['idle_frac']:.1%}  "
                    f"cpu ratio {r['cpu_ratio']:.1%}  recalled {r['recalled_blocks_per_step']:.0f} blocks/step")
            report["ablation"] = dict(context=context, batch_size=batch_size, warmup=args.ablation_warmup,
                                      steps=args.ablation_steps, interleaved=interleaved, rows=rows)
            if not args.quick:  # how much the selection moves: quest with the real queries, change tracking on
                (r,), _ = run_interleaved(
                    args, prompts, inputs, [dict(mode="quest", track_changes=True)], batch_size=batch_size, warmup=1,
                    steps=n - 1, make_worker=make_worker, layer_compute=LayerCompute(0, "sleep", device), device=device)
                workload["quest_change_rate"] = r["change_rate"]
                log(f"quest selection change rate between steps: {r['change_rate']:.1%}")
        del prompts
        gc.collect()
    report["workload"] = workload


def quick_summary(report: dict, args, device) -> dict:
    """The last stdout line: the last shape's modes and the ablation, rounded."""
    summary_shape = report["shapes"][-1] if report["shapes"] else None
    return dict(
        device=device.type,
        layers=args.layers,
        shape=None if summary_shape is None else {k: summary_shape[k] for k in ("context", "batch_size")},
        layer_compute_ms=args.layer_compute_ms,
        modes={} if summary_shape is None else {
            r["mode"]: dict(step_ms=round(r["step_ms"], 2), idle_frac=round(r["idle_frac"], 4),
                            cpu_busy_ms=round(r["cpu_busy_ms"], 2),
                            cpu_over_busy=None if r["cpu_over_busy"] is None else round(r["cpu_over_busy"], 3),
                            runnable_after_step=r["runnable_after_step"]) for r in summary_shape["modes"]},
        ablation=None if not report["ablation"] else {
            r["label"]: dict(step_ms=round(r["step_ms"], 2), idle_frac=round(r["idle_frac"], 4))
            for r in report["ablation"]["rows"]},
    )  # fmt: skip
