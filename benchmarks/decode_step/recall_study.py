"""The recall study: scout's CPU ratio and recall traffic step by step (the paper's Figure 6), on the heavy-hitter
and the flat workload, with the brake (the defaults: back-off and cap, no hysteresis), with a hysteresis of 2 steps
on top, without it (recall as it was: no back-off, no cap), and with recall off; all four interleaved on the same inputs from the
first decode step, so the curves show convergence and not only a steady state.

Verdicts (reported, never asserted): the first step from which the CPU ratio, averaged over the last WINDOW steps
(adaptive recall lets a row's share reach beta before it recalls, so single steps straddle it), stays under
recall_beta; the most
recall bytes of any step against that step's cap; the steady-state step time (median of the second half) of each
configuration against recall off.
"""

from __future__ import annotations

import statistics
import time

from .common import log
from .runner import run_interleaved
from .workload import HeavyHitters, Prompts, StepInputs

UNCAPPED = 1 << 62
WINDOW = 8  # converged: the CPU ratio's mean over the last WINDOW steps stays under recall_beta from then on
CONFIGS = (  # (label, ScoutConfig overrides)
    ("recall + brake", {}),
    ("recall + brake + hysteresis 2", {"recall_min_selected": 2}),
    ("recall without brake", {"recall_min_selected": 1, "recall_brake": False, "recall_bytes_per_step": UNCAPPED}),
    ("recall off", {"recall_policy": "off"}),
)
WORKLOADS = ("heavy", "flat")


def run_recall_study(args, *, device, make_worker, layer_compute) -> dict:
    """-> the study's report section: per workload, each configuration's summary (with its curves) and verdicts."""
    context, batch_size = args.recall_shape
    steps, heavy = args.recall_steps, HeavyHitters(drift=args.drift, target_cosine=args.target_cosine)
    study = dict(context=context, batch_size=batch_size, steps=steps, workloads={}, heavy=heavy.describe(),
                 flat=dict(kind="flat", query_rho=args.query_rho, predict_noise=args.predict_noise))
    started = time.perf_counter()
    for name in WORKLOADS:
        log(f"recall study, {name} workload: context {context}, batch {batch_size}, {steps} steps")
        prompts = Prompts(context, batch_size, args.layers, steps, seed=args.seed + 13,
                          heavy=heavy if name == "heavy" else None)
        inputs = StepInputs(prompts, batch_size, args.layers, steps, rho=args.query_rho,
                            predict_noise=args.predict_noise, seed=args.seed + 17, device=device)
        configs = [dict(mode="scout", label=label, overrides=overrides, track_changes=True)
                   for label, overrides in CONFIGS]
        rows, interleaved = run_interleaved(args, prompts, inputs, configs, batch_size=batch_size, warmup=0,
                                            steps=steps, make_worker=make_worker, layer_compute=layer_compute,
                                            device=device)
        beta = args.recall_beta
        baseline = next(r for r in rows if r["label"] == "recall off")
        for r in rows:
            r["verdict"] = verdict(r, beta, baseline)
            v = r["verdict"]
            log(f"  {r['label']:30s}: change {r['change_rate']:.1%}  CPU ratio {r['cpu_ratio']:.1%}  "
                f"under beta from step {v['converged_at']}  recall {r['recall_mb_per_step']:.2f} MB/step "
                f"(at most {v['max_cap_use']:.2f} of the cap)  steady step {v['steady_step_ms']:.1f} ms "
                f"({v['speed_vs_off']:.2f}x recall off)")
        study["workloads"][name] = dict(interleaved=interleaved, predict_cosine=inputs.predict_cosine,
                                        rows=rows)
        del prompts, inputs
    study["total_s"] = time.perf_counter() - started
    return study


def verdict(row: dict, beta: float, baseline: dict) -> dict:
    """Convergence step, cap use and steady-state speed of one configuration's curves."""
    curve = row["curve"]
    ratios = curve["cpu_ratio"]
    window = [sum(ratios[max(0, s - WINDOW + 1): s + 1]) / len(ratios[max(0, s - WINDOW + 1): s + 1])
              for s in range(len(ratios))]
    converged_at = next((s for s in range(len(window)) if all(r < beta for r in window[s:])), None)
    uses = [b / c for b, c in zip(curve["recall_bytes"], curve["recall_cap_bytes"]) if c]
    half = len(ratios) // 2
    steady_ms = 1e3 * statistics.median(curve["step_s"][half:])
    baseline_ms = 1e3 * statistics.median(baseline["curve"]["step_s"][half:])
    steady = [1e3 * t for t in curve["step_s"][half:]]
    return dict(converged_at=converged_at, max_cap_use=max(uses, default=0.0), steady_step_ms=steady_ms,
                steady_spread_ms=[min(steady), max(steady)], speed_vs_off=baseline_ms / steady_ms, steady_cpu_ratio=statistics.fmean(ratios[half:]),
                steady_change_rate=statistics.fmean(curve["change_rate"][half:]),
                recall_mb_per_step=statistics.fmean(curve["recall_bytes"]) / 1e6)


def recall_summary(study: dict) -> dict:
    """The study's verdicts, rounded, for the benchmark's last stdout line."""
    return {name: {r["label"]: {key: (round(value, 4) if isinstance(value, float) else value)
                                for key, value in r["verdict"].items()} for r in section["rows"]}
            for name, section in study["workloads"].items()}


def rejudge(study: dict, beta: float) -> None:
    """Recompute every verdict from the stored curves (a report rendered again from its JSON)."""
    for section in study["workloads"].values():
        baseline = next(r for r in section["rows"] if r["label"] == "recall off")
        for r in section["rows"]:
            r["verdict"] = verdict(r, beta, baseline)
