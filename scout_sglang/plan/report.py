"""What the planner prints: the inputs with their labels, a table per mode, the recommendation; or JSON;
or a plot of throughput against context (the shape of ScoutAttention's Figure 8)."""

from __future__ import annotations

import dataclasses

from scout_sglang.plan.capacity import STOCK
from scout_sglang.plan.step_model import parse_cpu_split

GIB, MIB = 2**30, 2**20


def _full_tokens_per_s(results: dict) -> float | None:
    full = results.get(STOCK)
    return full["step"].tokens_per_s if full and full["step"].tokens_per_s else None


def text_report(plan: dict) -> str:
    request, model, budgets = plan["request"], plan["model"], plan["budgets"]
    lines = [f"scout plan: {model.name} ({model.total_params() / 1e9:.2f} B parameters, {model.num_layers} layers, "
             f"{model.num_kv_heads} KV heads x {model.head_dim}) on {plan['gpu']}; {request.context} input + "
             f"{request.output_len} output tokens per request" + (
                 f", the first {request.shared_prefix} shared by every request (held once)"
                 if request.shared_prefix else ""),
             f"K/V of one token, all layers: {plan['token_bytes'] / 1024:g} KiB. Device memory for K/V: "
             f"{budgets['device_kv'] / GIB:.1f} GiB (after {budgets['weights'] / GIB:.1f} GiB of weights); host "
             f"memory for the engine's store: {budgets['host_kv'] / GIB:.1f} GiB", "", "inputs:"]
    for name, figure in plan["figures"].items():
        lines.append(f"  {name:<26} {figure.text()}")
    config = plan["config"]
    lines += ["", f"scout settings: preset {request.scout_preset}, budget {config.token_budget} tokens, block "
              f"{config.block_size}, dense layers {list(config.dense_layers)}, recall {config.recall_policy}"
              f" (beta {config.recall_beta}), CPU split {_split_text(request)}", ""]
    header = ("mode", "max batch", "limit", "step ms", "tokens/s", "x full", "bound", "GPU idle", "CPU ratio",
              "host hidden: step ms", "GPU idle")
    rows = [header]
    full = _full_tokens_per_s(plan["results"])
    for mode, result in plan["results"].items():
        capacity, step = result["capacity"], result["step"]
        ratio = f"{step.tokens_per_s / full:.2f}" if full else "-"
        rows.append((mode if mode != STOCK else "full (stock)", str(capacity.max_batch), capacity.limit,
                     f"{step.step_ms:.1f}", f"{step.tokens_per_s:.0f}", ratio, step.bound, f"{step.gpu_idle:.0%}",
                     f"{step.cpu_ratio:.0%}", f"{step.step_ms_without_host:.1f}", f"{step.gpu_idle_without_host:.0%}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for index, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths)))
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    lines += _split_lines(plan) + _pool_lines(plan)
    rec = plan["recommendation"]
    lines += ["", f"recommended: {rec['env']} (budget {rec['token_budget']}, block {rec['block_size']}, recall "
              f"{rec['recall_policy']} beta {rec['recall_beta']}, CPU groups {rec['cpu_groups']}): max batch "
              f"{rec['max_batch']}, {rec['tokens_per_s']:.0f} tokens/s ({rec['tokens_per_s_host_hidden']:.0f} with the host "
              f"hidden), expected CPU ratio "
              f"{rec['expected_cpu_ratio']:.0%}",
              "", "A projection from the model in docs/performance_model.md: decode steps only (no prefill), every "
              "request at its mid-output length. Host counts: " + next(
                  (r["step"].host_counts_source for m, r in plan["results"].items() if m == "scout"), "-")]
    return "\n".join(lines)


def _split_text(request) -> str:
    split = parse_cpu_split(request.cpu_split)
    return split if isinstance(split, str) else f"CPU share {split:g}"


def _split_lines(plan: dict) -> list[str]:
    """Where scout's CPU list went (nothing when the split is off or scout is not planned: the split is its own)."""
    scout = plan["results"].get("scout")
    if parse_cpu_split(plan["request"].cpu_split) == "off" or scout is None:
        return []
    step = scout["step"]
    return ["", f"scout's CPU list, split ({_split_text(plan['request'])}): {step.cpu_share:.0%} on the CPU workers, "
            f"the rest read by the GPU zero-copy over PCIe; a step moves {step.cpu_bytes / MIB:.0f} MiB on the CPU "
            f"and {step.pcie_bytes / MIB:.0f} MiB over PCIe (recalls and the CPU part's output included)"]


def _pool_lines(plan: dict) -> list[str]:
    """Resident-first at scout's largest batch: the pool and how many requests it keeps exact."""
    scout = plan["results"].get("scout")
    pool = scout and scout.get("resident_pool")
    if not pool:
        return []
    from scout_sglang.sglang_adapter.memory_report import resident_pool_text

    return ["", f"with SCOUT_RESIDENT_FIRST=on at scout's max batch: {resident_pool_text(pool)}; a request of this "
            f"length needs {pool['request_pages']} pages: up to {pool['exact_requests']} such requests run exactly "
            "together (full attention's tokens, no CPU part)"] + _low_load_lines(plan.get("low_load"))


def _low_load_lines(low: dict | None) -> list[str]:
    """Resident-first up to full attention's largest batch: how many run exact, and the exact path's step against
    full attention's there."""
    if not low:
        return []
    full_batch, exact_batch = low["full_batch"], low["exact_batch"]
    slots = (f"a server started with --max-running-requests {low['exact_slots']} or fewer keeps all {full_batch} "
             "exact" if low["exact_slots"] else
             f"no server keeps all {full_batch} exact (scout's other device stores leave too small a pool)")
    if not exact_batch:
        return [f"up to full attention's max batch ({full_batch}): the pool keeps no request of this length exact; "
                f"{slots}"] + _sparse_lines(low)
    held = ("every batch up to it runs exact" if exact_batch == full_batch else
            f"up to {exact_batch} requests run exact together; from {exact_batch + 1} the pool's pages are shared "
            f"evenly and every request runs sparse")
    scout, full = low["scout_exact"], low["full"]
    return [f"up to full attention's max batch ({full_batch} requests): {held}; {slots}. {exact_batch} on the exact "
            f"path take {scout.step_ms:.2f} ms a step ({scout.tokens_per_s:.0f} tokens/s) against full attention's "
            f"{full.step_ms:.2f} ms at that batch: {low['ratio']:.3f}x its tokens/s; at "
            + ", ".join(f"{size}: {ratio:.3f}x" for size, ratio in low["ratios"].items())
            + f" (exact-path counts: {scout.host_counts_source}); with the plan in series (--disable-overlap-schedule):"
            " " + ", ".join(f"{size}: {ratio:.3f}x" for size, ratio in low["ratios_plan_in_series"].items())
            ] + _sparse_lines(low)


def _sparse_lines(low: dict) -> list[str]:
    """Past the exact batch up to full attention's largest: scout's sparse step against full attention's, and the
    least ratio of every batch full attention fits."""
    sparse, lowest = low.get("ratios_sparse") or {}, low.get("lowest_ratio")
    lines = []
    if sparse:
        first, last = min(sparse), max(sparse)
        where = f"at {first} request{'s' if first > 1 else ''}" if first == last else \
            f"from {first} to {last} requests"
        lines.append(f"{where} (sparse, each request with its even share of the pool as its resident row, "
                     "which the device part attends whole, selected or not), scout's tokens/s over full "
                     "attention's: " + ", ".join(f"{size}: {ratio:.3f}x" for size, ratio in sparse.items()))
    if lowest:
        lines.append(f"least of every batch full attention fits, plan overlapped: {lowest['ratio']:.3f}x at "
                     f"{lowest['batch']} (issue target: at least 0.95x)")
    return lines


def json_report(plan: dict) -> dict:
    request = plan["request"]
    return {
        "model": dataclasses.asdict(plan["model"]), "gpu": plan["gpu"], "context": request.context,
        "shared_prefix": request.shared_prefix, "cpu_split": parse_cpu_split(request.cpu_split),
        "output_len": request.output_len, "scout_config": {k: v for k, v in dataclasses.asdict(plan["config"]).items()
                                                          if k != "extra"},
        "inputs": {name: figure.as_dict() for name, figure in plan["figures"].items()},
        "budgets": plan["budgets"], "token_bytes": plan["token_bytes"],
        "modes": {mode: {"capacity": dataclasses.asdict(r["capacity"]), "step": r["step"].as_dict(),
                         "resident_pool": r.get("resident_pool")} for mode, r in plan["results"].items()},
        "recommendation": plan["recommendation"],
        "low_load": _low_load_json(plan.get("low_load")),
    }


def _low_load_json(low: dict | None) -> dict | None:
    if not low or not low["exact_batch"]:
        return low
    return {**low, "scout_exact": low["scout_exact"].as_dict(), "full": low["full"].as_dict()}


def plot(plan: dict, path: str, contexts=(4096, 8192, 16384, 32768, 65536, 131072)) -> None:
    """Throughput (tokens/s at each mode's largest batch) against input length, one line per mode; dashed: the
    same with the host's per-layer launches and syncs hidden."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from scout_sglang.plan.planner import evaluate, key_rate, memory_budgets

    request, config, figures = plan["request"], plan["config"], plan["figures"]
    budgets = memory_budgets(request, figures)
    figure, axis = plt.subplots(figsize=(7, 4.2))
    for mode in request.modes:
        results = [evaluate(mode, config, request, figures, budgets, context) for context in contexts]
        rates = [r["step"].tokens_per_s or float("nan") for r in results]  # nan: not one request fits
        line, = axis.plot(contexts, rates, marker="o", label=mode)
        hidden = [key_rate(r["step"]) or float("nan") for r in results]
        axis.plot(contexts, hidden, linestyle="--", color=line.get_color(), alpha=0.6)
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xlabel("input tokens per request")
    axis.set_ylabel("decode tokens / s (largest batch that fits)")
    axis.set_title(f"{plan['model'].name} on {plan['gpu']}: projection (dashed: host overhead hidden)", fontsize=10)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
