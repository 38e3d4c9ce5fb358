"""The headline of the GPU benchmark: decode tokens/s at equal device memory, full attention against scout, on the
whole Qwen3-8B stack (36 layers, layer 0 dense) at 64k tokens, each at the largest batch its memory holds.

The same device K/V budget for both (by default what full attention needs for 2 requests of 64k), and the host's
free memory for scout's store; the planner's capacity code (scout_sglang/plan/capacity.py) picks both batches, and
says what limits each. Both steps are graph-replayed on the heavy-hitter workload. Then a projection, labelled as
one, for a whole 80 GB H100 and a 1 TiB host from the measured figures (the CPU part's in-engine rate, the change
rate), by the planner's step model, beside the planner's own projection of the measured box.
"""

from __future__ import annotations

from pathlib import Path

OUTPUT_TOKENS = 1024  # what the planner's requests hold beyond their prompt
BUDGET_REQUESTS = 2  # the default device budget: full attention at this many requests of the context
# Of the host's free memory, what scout's store may take: the process holds more beside it (CUDA's runtime, torch,
# the workers, prefill's transfers). At 0.9 an H200 box (125 GiB, 124 free) was OOM-killed: a 106.7 GiB store for
# 12 requests of 64k, the process at 121.5 GiB resident.
HOST_SHARE = 0.8


def model_spec():
    from scout_sglang.plan.models import load_model

    return load_model("Qwen3-8B")


def host_free_bytes() -> int:
    """MemAvailable of this host (what scout's store may take, less a margin the benchmark keeps)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def headline_budgets(*, context: int, host_free_bytes: int, device_budget_bytes: int | None = None) -> dict:
    """The equal-memory comparison's budgets: the device's K/V bytes (default: full attention's for
    BUDGET_REQUESTS requests) and the host's (HOST_SHARE of its free memory)."""
    from scout_sglang.plan.capacity import stock_device_bytes

    request = context + OUTPUT_TOKENS
    device = device_budget_bytes or stock_device_bytes(model_spec(), itemsize=2, tokens=BUDGET_REQUESTS * request)
    return dict(request_tokens=request, device_budget_bytes=int(device),
                host_budget_bytes=int(HOST_SHARE * host_free_bytes))


def planned_batch(mode: str, budgets: dict, *, context: int, block_size: int = 32, token_budget: int = 2048):
    """The planner's capacity (max_batch, limit) of `mode` within the budgets."""
    from scout_sglang.config import ScoutConfig
    from scout_sglang.plan.capacity import max_batch

    config = ScoutConfig(mode=mode, block_size=block_size, token_budget=token_budget)
    return max_batch(config, model_spec(), itemsize=2, request_tokens=budgets["request_tokens"],
                     device_budget=budgets["device_budget_bytes"], host_budget=budgets["host_budget_bytes"])


def projection(gpu: str, *, host_gib: float, gpu_memory_gib: float | None, cpu_gbs: float | None,
               change_rate: float | None, context: int) -> dict:
    """The planner's step model for full and scout on a box: tokens/s, batches, limits, bounds (a projection)."""
    from scout_sglang.plan.planner import PlanRequest, plan

    overrides = dict(host_memory=host_gib, gpu_memory=gpu_memory_gib, cpu_attention=cpu_gbs, change_rate=change_rate)
    request = PlanRequest(model=model_spec(), gpu=gpu, context=context, output_len=OUTPUT_TOKENS,
                          modes=("full", "scout"), overrides={k: v for k, v in overrides.items() if v is not None})
    result = plan(request)
    out = {}
    for mode, entry in result["results"].items():
        capacity, step = entry["capacity"], entry["step"]
        out[mode] = dict(batch=capacity.max_batch, limit=capacity.limit, tokens_per_s=round(step.tokens_per_s, 1),
                         bound=step.bound)
    if out["full"]["tokens_per_s"]:
        out["scout_over_full"] = round(out["scout"]["tokens_per_s"] / out["full"]["tokens_per_s"], 2)
    return out


def write_plot(path: Path, headline: dict, equal_batch: dict | None) -> None:
    """tokens/s against batch at the headline's context for both modes: the equal-batch rows (scaled from their
    layers to the model's, labelled so) and the two equal-memory points, marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    context, layers = headline.get("context"), model_spec().num_layers
    for mode, marker in (("full", "o"), ("scout", "s")):
        rows = sorted((r for r in (equal_batch or {}).get("rows", []) if r.get("mode") == mode
                       and r.get("context") == context and "step_ms" in r), key=lambda r: r["batch"])
        if rows:
            scaled = [r["batch"] / (r["step_ms"] * layers / r["layers"]) * 1e3 for r in rows]
            ax.plot([r["batch"] for r in rows], scaled, marker=marker, linestyle="--",
                    label=f"{mode}, equal batch ({rows[0]['layers']} layers, scaled to {layers})")
        point = headline.get(mode, {})
        if "tokens_per_s" in point:
            ax.scatter([point["batch"]], [point["tokens_per_s"]], s=140, marker="*", zorder=5,
                       label=f"{mode} at equal device memory ({point['batch']} requests, {point.get('limit')})")
    ax.set_xlabel("batch (requests)")
    ax.set_ylabel("decode tokens/s")
    ax.set_title(f"Qwen3-8B stack, {context} tokens, heavy-hitter workload")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
