"""The planner: inputs (each a Figure) -> capacity and step time of every mode -> a recommended preset.

__main__.py turns the command line into PlanRequest; report.py prints what
plan() returns.
"""

from __future__ import annotations

import dataclasses

import json
import os
from dataclasses import dataclass, field

from scout_sglang.config import MODES, ScoutConfig
from scout_sglang.env import load_preset
from scout_sglang.plan.capacity import STOCK, max_batch, resident_pool, token_bytes
from scout_sglang.plan.figures import Figure
from scout_sglang.plan.gpus import gpu_spec
from scout_sglang.plan.host_counts import DEFAULT_PATH as HOST_OVERHEAD_PATH
from scout_sglang.plan.models import ModelSpec
from scout_sglang.plan.step_model import Hardware, Workload, parse_cpu_split, step_time
from scout_sglang.sglang_adapter.kv_pool import HOST_SHARE

GIB = 2**30
RECOMMEND_BUDGETS = (1024, 2048, 4096)  # scout token budgets the recommendation chooses among
KEEP_PRESET_MARGIN = 0.10
# A server host's CPU attention throughput when not measured: one socket of 8 DDR5-4800 channels reads 307 GB/s
# at peak; bench_cpu_attention measured the native kernel at 0.46-0.72 of the read bandwidth a sum reaches, and
# a sum reaches well under peak. A third of peak, rounded.
ASSUMED_CPU_ATTENTION_GBS = 100.0
ASSUMED_MEM_FRACTION = 0.88  # SGLang's --mem-fraction-static: weights + K/V share of device memory
ASSUMED_CHANGE_RATE = 0.15  # ScoutAttention reports < 15% of selected blocks changing between tokens
ASSUMED_LAUNCH_US, ASSUMED_SYNC_US = 5.0, 20.0
ASSUMED_MODEL_LAUNCHES = 10.0  # norms, qkv, rope, o_proj, residual, gate_up, activation, down per layer
# The plugin's launches around the engine per decode layer, as sglang_adapter/adapter_ops.py counts them (the same
# at every batch and head count; a test keeps these equal to its count): the decode wrapper in every engine
# layer, and the layer-ahead prediction (without / with a per-head q_norm) in each layer that takes one.
ADAPTER_WRAPPER_LAUNCHES = 14.0
ADAPTER_PREDICTION_LAUNCHES = {False: 22.0, True: 28.0}
FLAGS = {  # PlanRequest.overrides key -> the command-line flag that sets it
    "gpu_memory": "--gpu-mem-gib", "hbm_bandwidth": "--hbm-gbs", "pcie_bandwidth": "--pcie-gbs",
    "peak_bf16": "--tflops", "cpu_attention": "--cpu-gbs", "launch_us": "--launch-us", "sync_us": "--sync-us",
    "host_memory": "--host-mem-gib", "mem_fraction": "--mem-fraction-static", "change_rate": "--change-rate",
    "max_running_requests": "--max-running-requests",
}


@dataclass
class PlanRequest:
    """Everything plan() needs. None: look up, measure or assume (the report says which)."""

    model: ModelSpec
    gpu: str = "H100"
    context: int = 65536
    output_len: int = 1024
    shared_prefix: int = 0  # prompt tokens every request shares (a cached prefix, held once)
    scout_preset: str = "default"
    budget: int | None = None
    block_size: int | None = None
    itemsize: int = 2
    measure: bool = False
    modes: tuple[str, ...] = MODES
    overrides: dict = field(default_factory=dict)  # gpu_memory, hbm_bandwidth, pcie_bandwidth, peak_bf16,
    # cpu_attention, launch_us, sync_us, host_memory, mem_fraction, change_rate, max_running_requests
    host_overhead_path: str | None = None
    cpu_split: str | float = "off"  # scout's CPU/zero-copy split: off, auto or the CPU share (step_model)

    def problems(self) -> list[str]:
        out = []
        if self.context <= 0:
            out.append(f"--context must be > 0, got {self.context}")
        if self.output_len < 0:
            out.append(f"--output-len must be >= 0, got {self.output_len}")
        if not 0 <= self.shared_prefix <= self.context:
            out.append(f"--shared-prefix must be between 0 and --context ({self.context}), got {self.shared_prefix}")
        for name, value in self.overrides.items():
            if value is not None and value <= 0:
                out.append(f"{FLAGS.get(name, name)} must be > 0, got {value}")
        try:
            parse_cpu_split(self.cpu_split)
        except ValueError as error:
            out.append(str(error))
        unknown = [m for m in self.modes if m not in MODES]
        if unknown:
            out.append(f"unknown modes {unknown}; known: {list(MODES)}")
        return out


def scout_config(request: PlanRequest) -> ScoutConfig:
    fields = load_preset(request.scout_preset)
    if request.budget is not None:
        fields["token_budget"] = request.budget
    if request.block_size is not None:
        fields["block_size"] = request.block_size
    return ScoutConfig(**fields)


def _given_or(request: PlanRequest, name: str, unit: str, fallback: Figure) -> Figure:
    value = request.overrides.get(name)
    return fallback if value is None else Figure(float(value), unit, "given", "on the command line")


def _host_overhead_assumptions(path) -> dict:
    try:
        return json.loads(open(path).read()).get("assumptions", {})
    except (OSError, ValueError):
        return {}


def gather_inputs(request: PlanRequest) -> dict[str, Figure]:
    """Every rate and size the models use, labelled."""
    figures = {}
    if request.gpu.lower() == "custom":
        missing = [n for n in ("gpu_memory", "hbm_bandwidth", "pcie_bandwidth", "peak_bf16")
                   if request.overrides.get(n) is None]
        if missing:
            raise ValueError("--gpu custom needs " + ", ".join(FLAGS[n] for n in missing))
    else:
        figures.update(gpu_spec(request.gpu).figures())
    units = {"gpu_memory": "GiB", "hbm_bandwidth": "GB/s", "pcie_bandwidth": "GB/s", "peak_bf16": "TFLOP/s"}
    for name, unit in units.items():
        if request.overrides.get(name) is not None:
            figures[name] = Figure(float(request.overrides[name]), unit, "given", "on the command line")
    path = request.host_overhead_path or HOST_OVERHEAD_PATH
    recorded = _host_overhead_assumptions(path)
    launch = Figure(float(recorded.get("launch_us", ASSUMED_LAUNCH_US)), "us", "assumed",
                    "the cost bench_host_overhead assumes per CUDA launch" if "launch_us" in recorded
                    else "a typical CUDA kernel launch")
    sync = Figure(float(recorded.get("sync_us", ASSUMED_SYNC_US)), "us", "assumed",
                  "the cost bench_host_overhead assumes per device-to-host read" if "sync_us" in recorded
                  else "a device-to-host read that drains the launch queue")
    cpu = Figure(ASSUMED_CPU_ATTENTION_GBS, "GB/s", "assumed", "a server host: a third of one DDR5 socket's peak")
    if request.measure:
        from scout_sglang.plan import measure

        figures["host_read_bandwidth"] = measure.measure_read_bandwidth()
        cpu = measure.measure_cpu_attention()
        figures["host_dispatch"] = measure.measure_dispatch_us()
        # A CUDA launch costs the host's dispatch plus the driver's submission; the latter is not measurable here.
        launch = Figure(round(figures["host_dispatch"].value + ASSUMED_LAUNCH_US, 2), "us", "measured",
                        f"this host's dispatch ({figures['host_dispatch'].value} us) + {ASSUMED_LAUNCH_US} us "
                        "assumed for the driver")
    figures["cpu_attention"] = _given_or(request, "cpu_attention", "GB/s", cpu)
    figures["launch_us"] = _given_or(request, "launch_us", "us", launch)
    figures["sync_us"] = _given_or(request, "sync_us", "us", sync)
    host = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / GIB
    figures["host_memory"] = _given_or(request, "host_memory", "GiB",
                                       Figure(round(host, 1), "GiB", "measured", "this host's physical memory"))
    figures["mem_fraction"] = _given_or(request, "mem_fraction", "", Figure(
        ASSUMED_MEM_FRACTION, "", "assumed", "SGLang's --mem-fraction-static (it picks one by GPU memory)"))
    figures["change_rate"] = _given_or(request, "change_rate", "", Figure(
        ASSUMED_CHANGE_RATE, "", "assumed", "ScoutAttention: < 15% of selected blocks change per token"))
    figures["model_launches_per_layer"] = Figure(ASSUMED_MODEL_LAUNCHES, "", "assumed",
                                                 "the model's own ops per layer when decode is not graph-captured")
    figures["engine_cuda_graphs"] = Figure(1.0, "", "assumed", (
        "1: SGLang's decode CUDA graph captures the plugin's whole step (its default; checked by capture and replay "
        "on a CPU, not yet timed on a GPU): no launches per layer on the host"))
    figures["overlap_schedule"] = Figure(1.0, "", "assumed", (
        "1: SGLang's overlap scheduler (its default) plans and launches step N+1 while the GPU runs step N; the "
        "plugin's planning reads no device value (sglang_adapter/host_batch.py, checked on a CPU server), so its "
        "plan overlaps the previous step (not yet timed on a GPU)"))
    counted = "as sglang_adapter/adapter_ops.py counts them on this version (the same at any batch)"
    figures["adapter_launches_per_layer"] = Figure(ADAPTER_WRAPPER_LAUNCHES, "", "assumed",
                                                   f"the plugin's decode wrapper per engine layer, {counted}")
    figures["adapter_launches_per_predicted_layer"] = Figure(
        ADAPTER_PREDICTION_LAUNCHES[request.model.qk_norm], "", "assumed",
        f"the layer-ahead query prediction{' with q_norm' if request.model.qk_norm else ''} per layer that takes "
        f"one, {counted}")
    return figures


def memory_budgets(request: PlanRequest, figures: dict[str, Figure]) -> dict:
    """Device bytes for K/V (weights out of SGLang's static share) and host bytes for the engine's store."""
    weights = request.model.total_params() * request.itemsize
    device = figures["gpu_memory"].value * GIB * figures["mem_fraction"].value - weights
    host = figures["host_memory"].value * GIB * HOST_SHARE["cuda"]  # what a GPU server's start-up check allows
    if device <= 0:
        raise ValueError(f"{request.model.name}'s weights ({weights / GIB:.1f} GiB) do not fit "
                         f"{figures['mem_fraction'].value:g} of {figures['gpu_memory'].value:.1f} GiB")
    return {"weights": weights, "device_kv": int(device), "host_kv": int(host)}


def hardware(figures: dict[str, Figure]) -> Hardware:
    return Hardware(hbm_gbs=figures["hbm_bandwidth"].value, pcie_gbs=figures["pcie_bandwidth"].value,
                    cpu_attention_gbs=figures["cpu_attention"].value, bf16_tflops=figures["peak_bf16"].value,
                    launch_us=figures["launch_us"].value, sync_us=figures["sync_us"].value,
                    model_launches_per_layer=figures["model_launches_per_layer"].value,
                    cuda_graphs_for_engine=bool(figures["engine_cuda_graphs"].value),
                    overlap_schedule=bool(figures["overlap_schedule"].value),
                    adapter_launches_per_layer=figures["adapter_launches_per_layer"].value,
                    adapter_launches_per_predicted_layer=figures["adapter_launches_per_predicted_layer"].value)


def evaluate(mode: str, config: ScoutConfig, request: PlanRequest, figures: dict, budgets: dict,
             context: int | None = None) -> dict:
    """Capacity and step time of one mode at one input length."""
    context = request.context if context is None else context
    mode_config = ScoutConfig(mode=STOCK) if mode == STOCK else config.replace(mode=mode)
    capacity = max_batch(mode_config, request.model, itemsize=request.itemsize,
                         request_tokens=context + request.output_len, device_budget=budgets["device_kv"],
                         host_budget=budgets["host_kv"], max_requests=request.overrides.get("max_running_requests"),
                         shared_prefix=min(request.shared_prefix, context))
    work = Workload(batch_size=capacity.max_batch, context=context + request.output_len // 2,
                    itemsize=request.itemsize, change_rate=figures["change_rate"].value, output_len=request.output_len)
    step = step_time(mode, config, request.model, hardware(figures), work,
                     host_overhead_path=request.host_overhead_path, cpu_split=request.cpu_split)
    pool = resident_pool(mode_config, request.model, itemsize=request.itemsize, capacity=capacity,
                         device_budget=budgets["device_kv"], shared_prefix=min(request.shared_prefix, context)) \
        if mode == "scout" else None
    return {"capacity": capacity, "step": step, "resident_pool": pool}


def low_load(request: PlanRequest, config: ScoutConfig, figures: dict, budgets: dict, results: dict) -> dict | None:
    """Resident-first up to full attention's largest batch (the low load a plugin must cost nothing at): how many
    requests of this length scout's pool keeps exact together (its sizing at scout's largest batch, what the server
    runs; past that many the pool's pages are shared evenly and every request runs sparse), the most request slots
    a server may have and keep full attention's largest batch exact (exact_slots), and the step of the most that
    run exact, on the exact path, against full attention's at the same batch and context. Past the exact batch, up
    to full attention's largest, scout's sparse step against full attention's (ratios_sparse: each request with
    its even share of the pool as its resident row, quota()); lowest_ratio: the least of every ratio with the plan overlapped,
    the issue's target at every batch full attention fits.
    None without both modes or a pool."""
    scout, stock = results.get("scout"), results.get(STOCK)
    if not scout or not stock or not scout["resident_pool"] or stock["capacity"].max_batch < 1:
        return None
    full_batch = stock["capacity"].max_batch
    batch = min(full_batch, scout["resident_pool"]["exact_requests"])
    slots = exact_slots(request, config, budgets, full_batch, scout["capacity"].max_batch)
    # past the exact batch: sparse, by doubling from the first sparse batch to full attention's largest
    sparse_sizes = sorted({batch + 1, full_batch, *(2**i for i in range(full_batch.bit_length())
                                                    if batch < 2**i < full_batch)}) if batch < full_batch else []
    sparse = {size: _ratio(exact_and_full_steps(request, config, figures, size, exact=False,
                                                resident_row_blocks=quota(config, scout["resident_pool"], size)))
              for size in sparse_sizes}
    if batch < 1:
        return {"full_batch": full_batch, "exact_batch": 0, "exact_slots": slots, "ratios_sparse": sparse,
                "lowest_ratio": _lowest(sparse)}
    # every batch up to it, by doubling: the engine's plan weighs most at one request
    sizes = sorted({*(2**i for i in range(batch.bit_length()) if 2**i < batch), batch})
    steps = {size: exact_and_full_steps(request, config, figures, size) for size in sizes}
    ratios = {size: _ratio(pair) for size, pair in steps.items()}
    serial = {size: _ratio(exact_and_full_steps(request, config, figures, size, overlap=False)) for size in sizes}
    scout, full = steps[batch]
    return {"full_batch": full_batch, "exact_batch": batch, "exact_slots": slots, "scout_exact": scout,
            "full": full, "ratio": ratios[batch], "ratios": ratios, "ratios_plan_in_series": serial,
            "ratios_sparse": sparse, "lowest_ratio": _lowest({**ratios, **sparse})}


def quota(config: ScoutConfig, pool: dict, batch: int) -> int:
    """A request's resident row when `batch` requests of the planned length share the pool as the engine shares it
    (resident_pool.water_fill; the least share where the pages do not divide evenly), at least resident_blocks."""
    from scout_sglang.core.resident_pool import water_fill

    return max(config.resident_capacity, min(water_fill([pool["request_pages"]] * max(1, batch), pool["pages"])))


def _ratio(steps: tuple) -> float:
    """Scout's tokens/s over full attention's, of a (scout, full) pair of steps."""
    scout, full = steps
    return round(scout.tokens_per_s / full.tokens_per_s, 4)


def _lowest(ratios: dict) -> dict | None:
    """The batch whose ratio is the least, and that ratio (None without any)."""
    if not ratios:
        return None
    size = min(ratios, key=ratios.get)
    return {"batch": size, "ratio": ratios[size]}


def exact_and_full_steps(request: PlanRequest, config: ScoutConfig, figures: dict, batch: int, *,
                         overlap: bool | None = None, exact: bool = True,
                         resident_row_blocks: int | None = None) -> tuple:
    """(scout's step on the exact path, or its sparse step where not `exact`, with the planned CPU split and a
    resident row of `resident_row_blocks` (Workload); full attention's step) of `batch` requests at the planned
    length; overlap: whether the host runs a step ahead (SGLang's overlap scheduler; None: as the figures say)."""
    work = Workload(batch_size=batch, context=request.context + request.output_len // 2, itemsize=request.itemsize,
                    change_rate=figures["change_rate"].value, output_len=request.output_len,
                    resident_row_blocks=resident_row_blocks)
    box = hardware(figures)
    if overlap is not None:
        box = dataclasses.replace(box, overlap_schedule=overlap)
    return tuple(step_time(mode, config, request.model, box, work, exact=exact and mode == "scout",
                           host_overhead_path=request.host_overhead_path,
                           cpu_split="off" if exact else request.cpu_split) for mode in ("scout", STOCK))


def exact_slots(request: PlanRequest, config: ScoutConfig, budgets: dict, target: int, most: int) -> int:
    """The most request slots (--max-running-requests, at most `most`) a resident-first scout server may be
    started with and still keep `target` requests of this length exact together: its other device stores grow
    with the slots and its pool shrinks. 0 where not even `target` slots do."""
    def keeps(slots: int) -> bool:
        return (pool_at(request, config, budgets, slots) or {}).get("exact_requests", 0) >= target

    if most < target or not keeps(target):
        return 0
    low, high = target, most  # keeps(low); the largest slots that keep: binary search
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if keeps(middle) else (low, middle - 1)
    return low


def pool_at(request: PlanRequest, config: ScoutConfig, budgets: dict, slots: int) -> dict | None:
    """The resident pool of a scout server started with `slots` request slots (as evaluate() sizes it)."""
    mode_config = config.replace(mode="scout")
    request_tokens = request.context + request.output_len
    shared = min(request.shared_prefix, request.context)
    capacity = max_batch(mode_config, request.model, itemsize=request.itemsize, request_tokens=request_tokens,
                         device_budget=budgets["device_kv"], host_budget=budgets["host_kv"], max_requests=slots,
                         shared_prefix=shared)
    return resident_pool(mode_config, request.model, itemsize=request.itemsize, capacity=capacity,
                         device_budget=budgets["device_kv"], shared_prefix=shared)


def recommend(request: PlanRequest, config: ScoutConfig, figures: dict, budgets: dict) -> dict:
    """The scout budget of RECOMMEND_BUDGETS with the most tokens/s with the host's launches hidden (the budget
    moves the device, CPU and PCIe terms; the host's counts, read per batch, do not depend on it). The preset's
    own budget is kept unless another is more than KEEP_PRESET_MARGIN faster: the model knows nothing of
    accuracy, which the preset's budget was measured at."""
    results = {}
    for budget in sorted({*RECOMMEND_BUDGETS, config.token_budget}):
        try:
            candidate = config.replace(token_budget=budget)
        except ValueError:
            continue  # not a multiple of the block size, or below the forced blocks
        results[budget] = (candidate, evaluate("scout", candidate, request, figures, budgets))
    best = max(results, key=lambda b: (round(key_rate(results[b][1]["step"]), 6), b))
    own = key_rate(results[config.token_budget][1]["step"])
    if own * (1 + KEEP_PRESET_MARGIN) >= key_rate(results[best][1]["step"]):
        best = config.token_budget
    chosen, result = results[best]
    return {"token_budget": chosen.token_budget, "block_size": chosen.block_size, "recall_policy": chosen.recall_policy,
            "recall_beta": chosen.recall_beta, "cpu_groups": "0 (one per core of the host)",
            "max_batch": result["capacity"].max_batch, "tokens_per_s": result["step"].tokens_per_s,
            "tokens_per_s_host_hidden": key_rate(result["step"]), "expected_cpu_ratio": result["step"].cpu_ratio,
            "env": f"SCOUT_CONFIG={request.scout_preset} SCOUT_TOKEN_BUDGET={chosen.token_budget} SCOUT_CPU_GROUPS=0"}


def key_rate(step) -> float:
    """Tokens/s of a step with the host's launches and syncs hidden."""
    return step.batch_size / step.step_ms_without_host * 1e3 if step.step_ms_without_host else 0.0


def plan(request: PlanRequest) -> dict:
    """The whole plan: inputs, budgets, and per mode its capacity and step; then the recommendation."""
    problems = request.problems()
    if problems:
        raise ValueError("\n".join(problems))
    config = scout_config(request)
    figures = gather_inputs(request)
    budgets = memory_budgets(request, figures)
    results = {mode: evaluate(mode, config, request, figures, budgets) for mode in request.modes}
    return {"model": request.model, "gpu": request.gpu, "config": config, "figures": figures, "budgets": budgets,
            "token_bytes": token_bytes(request.model, request.itemsize), "results": results,
            "low_load": low_load(request, config, figures, budgets, results),
            "recommendation": recommend(request, config, figures, budgets), "request": request}
