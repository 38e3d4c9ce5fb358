"""Step-time model of one decode step, per layer, for full, quest, infinigen, hgca and scout.

Written out with its reasons in docs/performance_model.md; in short, for a
batch of B requests at context C (tokens), block size S, per layer:

  device  t_dev = max(HBM bytes / HBM bandwidth, FLOPs / peak bf16), the K/V part of the
          bytes at the attention kernel's rate (the HBM bandwidth unless given)
          HBM bytes = the layer's weights (read once for the batch)
                    + B x Hkv x (K/V the device attends + digests and scores)
          device K/V attended per (request, KV head):
            full       C tokens
            quest      the K selected blocks (every token stays on the device)
            infinigen  the K selected blocks, brought into the resident buffer
            hgca       the window only (sink, local, partial tail)
            scout      the window and the whole resident row (resident_blocks, or a
                       resident-first quota: `resident_row_blocks`), selected or not; a
                       row above resident_blocks scales the CPU part and the recall by the
                       share of the blocks it leaves off the device
          digests and scores (all but full): ceil(C / S) blocks x (2 D bf16 + 8)
  CPU     t_cpu = B x Hkv x CPU blocks x S x 2 D bytes / CPU attention GB/s
          CPU blocks: hgca, every selected block outside the window; scout,
          the expected CPU ratio r x K (the recall policy sets r)
  PCIe    t_pcie = (recalled blocks x block bytes + the CPU part's output) / PCIe
          recalled per step: c x K blocks (c: share of the selection that
          changes per step), scout and infinigen
  split   scout with the CPU/zero-copy split (cpu_split "auto" or a share s): the CPU
          workers attend s of the CPU list's bytes L, the device reads the rest from
          page-locked host memory over PCIe on a second stream (beside its own work,
          so only the link prices it): t_cpu = s L / CPU, t_pcie = ((1 - s) L + R) / PCIe
          (R: the recall and output bytes above); auto takes the s that balances them,
          s = CPU (L + R) / (L (CPU + PCIe)), clamped to [0, 1] (split_cpu_share)
  host    t_launch = (engine launches + the plugin's own around the engine (its decode
          wrapper; the layer-ahead prediction where a layer takes one) + the model's own)
          x per-launch cost,
          t_sync = host reads x per-sync cost (each drains the launch queue)
          stock SGLang decodes with CUDA graphs: one graph launch a step;
          without graphs its attention launches per layer are fixed + per request x B

  layer time, on a GPU (the host runs ahead of the device)
    scout, infinigen (launched one layer ahead):
          max(t_dev, t_cpu, t_pcie, t_launch) + t_sync
    hgca (CPU part in the same layer, beside the device part):
          max(t_dev + max(0, t_cpu - t_dev_attention), t_pcie, t_launch) + t_sync
    full, quest: max(t_dev, t_launch) + t_sync
  layer time where the device is the host's CPU (a CPU server): the thread that
  launches is the one that computes, so t_launch + t_dev (+ the exposed CPU part
  for hgca) + t_sync, beside the worker threads' t_cpu and t_pcie.
  dense layers (layer 0 by default) attend C tokens on the device.
  scout's exact path (resident-first, every request's blocks in the device pool:
  `exact`): each offloaded layer attends C tokens on the device as a dense one does,
  with no digests read, no CPU part and no recall; its launches and plan are the
  counts file's exact rows.
  step = sum of layer times + the output projection (vocab x hidden weights)
       + the engine's once-a-step plan (measured with the launch counts)
       + the serving framework's host work a step: fixed + per request x B
         (scheduling, sampling, the model's ops when they are not counted per layer)
       + for the engine's modes, the plugin's host work a step beyond its counted
         ops: fixed + per request x B (measured on a CPU server; 0 on a GPU box).
  under SGLang's overlap scheduler (`overlap_schedule`, a GPU), where no step reads a
  device value, the host plans step N+1 while the device runs step N:
  step = max(sum of layer times + the output projection,
             the host's per-step work above + its launches).

tokens/s = B / step. The step is bound by the resource whose summed time is
largest (HBM, compute, CPU, PCIe, host); GPU idle = 1 - device time / step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from scout_sglang.config import ScoutConfig
from scout_sglang.core.engine import RESIDENT_MODES
from scout_sglang.core.stores import ceil_div
from scout_sglang.plan.capacity import STOCK
from scout_sglang.plan.host_counts import host_counts
from scout_sglang.plan.models import ModelSpec
from scout_sglang.sglang_adapter.memory_report import layer_split

SCORE_BYTES = 8  # one fp32 score per block, written by the scoring kernel and read by top-k
LSE_BYTES = 4  # fp32, natural log
RESOURCES = ("HBM", "compute", "CPU", "PCIe", "host")


@dataclass(frozen=True)
class Hardware:
    """Rates the step model divides by (plain floats; the Figures behind them go in the report).

    Parameters
    ----------
    hbm_gbs, pcie_gbs, cpu_attention_gbs : float
        GB/s (1e9 bytes/s): device memory, host link (one direction), K/V read by the CPU attention workers.
    bf16_tflops : float
    launch_us, sync_us : float
        Host cost of one kernel launch and of one device-to-host read.
    model_launches_per_layer : float
        Launches of the model's own ops per layer (norms, projections, MLP), beside the attention engine's.
    cuda_graphs_for_stock : bool
        Stock SGLang captures decode in CUDA graphs: its per-layer host cost is zero.
    cuda_graphs_for_engine : bool
        SGLang's decode CUDA graph captures the plugin's whole step too (engine modes on a GPU): the engine's,
        the plugin's and the model's launches per layer then cost the host nothing, and what stays on the host
        is the step's plan before the replay. Without it a GPU pays the engine's Triton-path launches per layer
        (its offloaded and dense layers apart). Ignored where `host_is_device`.
    host_is_device : bool
        The device is the host's own CPU (a CPU server): launches and device work take turns on one thread
        instead of overlapping, and every dispatched op counts as a launch (views too: each costs that thread
        a dispatch); `launch_us` is then the cost of one dispatched op.
    step_host_ms, step_host_ms_per_request : float
        The serving framework's host work per decode step outside the attention backend: a fixed part and a
        part per request (0 on a GPU, where SGLang's overlap scheduler prepares a step while the previous runs).
    stock_launches_per_layer, stock_launches_per_request, stock_syncs_per_request : float
        The stock backend's attention launches and host reads per layer when it runs without CUDA graphs: a
        fixed part and a part per request (SGLang's torch_native backend loops over the requests).
    device_attention_gbs : float
        K/V bytes per second the device's attention kernel reads; 0 means the HBM bandwidth (a GPU decode
        kernel at long context runs near it). A CPU's attention kernels at small head dims run far below
        its memory bandwidth, so a CPU device gives the rate measured on its kernel.
    adapter_launches_per_layer, adapter_launches_per_predicted_layer : float
        The plugin's own launches around the engine: its decode wrapper in every layer of an engine mode, and
        the layer-ahead query prediction in each layer that takes one (scout and infinigen: the offloaded
        layers after the first), as sglang_adapter/adapter_ops.py counts them; 0: not priced.
    engine_step_host_ms, engine_step_host_ms_per_request : float
        The plugin's host work per decode step beyond its counted ops (every mode but stock): its batch
        bookkeeping around the engine's plan, the forward hooks the prediction puts on the model's layers, its
        ops running slower inside a server than where they were timed; a fixed part and a part per request.
        Measured on a CPU server at a short context (0: not measured, as on a GPU box).
    overlap_schedule : bool
        SGLang's overlap scheduler (its default on a GPU): the host plans and launches step N+1 while the device
        runs step N. It overlaps only a step that reads no device value (no sync: a read waits for the stream),
        and then the step takes the longer of the device's part and the host's (its plan, its launches), not their
        sum. Ignored where `host_is_device` (one thread does both).
    engine_attention_gbs : float
        The same for the engine's own device attention kernel (every mode but stock: its dense layers and its
        device part); 0 means `device_attention_gbs`. On a GPU both run near the HBM bandwidth; on a CPU device
        they are different torch code and are measured apart.
    """

    hbm_gbs: float
    pcie_gbs: float
    cpu_attention_gbs: float
    bf16_tflops: float
    launch_us: float
    sync_us: float
    model_launches_per_layer: float = 10.0
    cuda_graphs_for_stock: bool = True
    cuda_graphs_for_engine: bool = False
    host_is_device: bool = False
    step_host_ms: float = 0.0
    step_host_ms_per_request: float = 0.0
    stock_launches_per_layer: float = 0.0
    stock_launches_per_request: float = 0.0
    stock_syncs_per_request: float = 0.0
    device_attention_gbs: float = 0.0
    engine_attention_gbs: float = 0.0
    adapter_launches_per_layer: float = 0.0
    adapter_launches_per_predicted_layer: float = 0.0
    engine_step_host_ms: float = 0.0
    engine_step_host_ms_per_request: float = 0.0
    overlap_schedule: bool = False


@dataclass(frozen=True)
class Workload:
    """What is decoded: B requests at context C, in a dtype of `itemsize` bytes.

    Parameters
    ----------
    batch_size : int
    context : int
        Tokens each request holds at the modelled step (the planner uses input + output / 2).
    itemsize : int
        Bytes of a K/V and weight element (2: bf16).
    change_rate : float
        Share of a (request, layer, KV head)'s selected blocks that were not selected at its previous step.
    output_len : int
        Decode steps per request (the "off" recall policy's CPU share grows over them).
    resident_row_blocks : int or None
        Scout: the blocks a request's resident row holds outside its window (None: the fixed buffer,
        resident_blocks; resident-first: the request's quota). The device part attends every one of them,
        selected or not, beside the window. A row larger than resident_blocks leaves a smaller share of the
        unselected blocks off the device, (N - row) / (N - resident_blocks) of a request's N blocks outside its
        window, and the CPU part and the recall scale by it: a newly selected block is taken to be in the row
        as if the row held the unselected blocks at random (it keeps the best-scoring ones, so the model errs
        high).
    """

    batch_size: int
    context: int
    itemsize: int = 2
    change_rate: float = 0.15
    output_len: int = 1024
    resident_row_blocks: int | None = None


@dataclass
class StepEstimate:
    """One decode step of one mode: its time, what bounds it, and each resource's time summed over layers (ms)."""

    mode: str
    batch_size: int
    context: int
    step_ms: float
    tokens_per_s: float
    step_ms_without_host: float  # the same step with the host's launches and syncs hidden (CUDA graphs)
    bound: str
    gpu_idle: float
    gpu_idle_without_host: float  # GPU idle of the step with the host hidden
    cpu_ratio: float  # share of the selected blocks outside the device (the CPU list)
    resource_ms: dict = field(default_factory=dict)  # RESOURCES -> ms summed over the step
    hbm_bytes: float = 0.0
    cpu_bytes: float = 0.0
    pcie_bytes: float = 0.0  # recalls, the CPU part's output and, with the split, the zero-copy reads
    cpu_share: float = 1.0  # of the CPU list's bytes, the CPU workers' (the rest zero-copy over PCIe); 1: no split
    host_counts_source: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def expected_cpu_ratio(config: ScoutConfig, *, change_rate: float, free_share: float, output_len: int) -> float:
    """Share of the selected blocks that scout attends on the CPU, averaged over steps.

    Each step, about `change_rate` of the selection is new, and new blocks are on the host until a recall
    brings them in. So the CPU share climbs c, 2c, ... until the policy recalls:
      adaptive  recall once the share exceeds recall_beta: n = floor(beta / c) + 1 steps
      interval  recall every recall_interval steps: n = interval
      off       never: n = output_len
    and averages c (n + 1) / 2 over a cycle, at most the free (non-forced) share of the selection.
    """
    if change_rate <= 0:
        return 0.0
    steps = recall_cycle_steps(config, change_rate=change_rate, output_len=output_len)
    return min(free_share, change_rate * (steps + 1) / 2)


def recall_cycle_steps(config: ScoutConfig, *, change_rate: float, output_len: int) -> int:
    """Decode steps from one recall to the next under the configured policy (output_len: never)."""
    if config.recall_policy == "adaptive" and change_rate > 0:
        return int(config.recall_beta // change_rate) + 1
    if config.recall_policy == "interval":
        return config.recall_interval
    return output_len


def recall_share(mode: str, config: ScoutConfig, work: "Workload") -> float:
    """Share of a layer's steps that run a recall (the engine's counts differ on those steps)."""
    if mode != "scout" or config.recall_policy == "off":
        return 0.0
    return 1.0 / recall_cycle_steps(config, change_rate=work.change_rate, output_len=work.output_len)


CPU_SPLITS = ("off", "auto")  # or a fixed CPU share in [0, 1]


def parse_cpu_split(value) -> str | float:
    """`--cpu-split` as step_time takes it: "off", "auto", or the CPU workers' share of the CPU list (a float)."""
    if isinstance(value, str) and value.strip().lower() in CPU_SPLITS:
        return value.strip().lower()
    try:
        share = float(value)
    except (TypeError, ValueError):
        share = float("nan")
    if not 0.0 <= share <= 1.0:  # NaN fails too
        raise ValueError(f"--cpu-split must be off, auto or a CPU share in [0, 1], got {value!r}")
    return share


def split_cpu_share(cpu_split: str | float, *, cpu_list_bytes: float, link_bytes: float, cpu_gbs: float,
                    pcie_gbs: float) -> float:
    """Share s of a layer's CPU-list bytes L that the CPU workers attend; the device reads the rest zero-copy.

    The zero-copy reads share the link with its other bytes R (recalls, the CPU part's output), so the
    off-device part of the layer takes max(s L / cpu, ((1 - s) L + R) / pcie). The first term grows with s and
    the second falls, so the least max is where they meet:
        s L / cpu = ((1 - s) L + R) / pcie   =>   s = cpu (L + R) / (L (cpu + pcie))
    (cpu / (cpu + pcie) without other link bytes). Above 1 where the link's own bytes alone outlast the CPU on
    the whole list (R / pcie > L / cpu): then all of it stays on the CPU. "off": 1; a float: that share.
    """
    if cpu_split == "off" or cpu_list_bytes <= 0:
        return 1.0
    if cpu_split != "auto":
        return float(cpu_split)
    share = cpu_gbs * (cpu_list_bytes + link_bytes) / (cpu_list_bytes * (cpu_gbs + pcie_gbs))
    return min(1.0, max(0.0, share))


def _head_traffic(mode: str, config: ScoutConfig, spec: ModelSpec, work: Workload, *, dense: bool) -> dict:
    """Bytes and tokens of one (request, KV head) in one layer: device K/V and digests read, CPU K/V read,
    PCIe bytes, tokens attended on the device, and the CPU ratio. `dense` also for a layer on scout's exact path."""
    token = 2 * spec.head_dim * work.itemsize  # K and V of one token for one KV head
    context = work.context
    if mode == STOCK or dense:
        return dict(device_kv=context * token, digests=0.0, cpu=0.0, pcie=0.0, device_tokens=context, cpu_ratio=0.0)
    block = config.block_size
    full_blocks = context // block
    tail = context - full_blocks * block  # the partial block, always in the device window
    selected = min(config.topk_blocks, full_blocks)
    forced = min(config.sink_blocks + config.local_blocks, full_blocks)
    free = selected - forced
    digests = ceil_div(context, block) * (2 * spec.head_dim * work.itemsize + SCORE_BYTES)
    cpu_blocks, recalled = 0.0, 0.0
    device_blocks = None
    if mode == "hgca":
        cpu_blocks = free
    elif mode == "scout":
        free_share = free / selected if selected else 0.0
        outside = full_blocks - forced
        floor = config.resident_capacity
        row = min(outside, floor if work.resident_row_blocks is None else work.resident_row_blocks)
        # of the blocks outside the window, the share the row leaves off the device (none when all fit the row)
        unresident = 0.0 if outside <= floor else min(1.0, max(0.0, (outside - row) / (outside - floor)))
        cpu_blocks = selected * unresident * expected_cpu_ratio(
            config, change_rate=work.change_rate, free_share=free_share, output_len=work.output_len)
        recalled = 0.0 if config.recall_policy == "off" else unresident * work.change_rate * free
        device_blocks = forced + row  # the window and the whole row, selected or not
    elif mode == "infinigen":
        recalled = work.change_rate * free
    if device_blocks is None:
        device_blocks = selected - cpu_blocks
    group = spec.num_qo_heads // spec.num_kv_heads
    output = group * (spec.head_dim * 4 + LSE_BYTES) if cpu_blocks else 0.0  # the CPU part's o and lse, fp32
    return dict(device_kv=(device_blocks * block + tail) * token + 2 * output, digests=digests,
                cpu=cpu_blocks * block * token, pcie=recalled * block * token + output,
                device_tokens=device_blocks * block + tail, cpu_ratio=cpu_blocks / selected if selected else 0.0)


def _adapter_launches(mode: str, config: ScoutConfig, hw: Hardware, layer: int, offloaded) -> float:
    """The plugin's launches around the engine in `layer` (none for the stock backend)."""
    if mode == STOCK or (hw.cuda_graphs_for_engine and not hw.host_is_device):
        return 0.0  # no plugin, or its launches replay inside the graph
    predicted = mode in RESIDENT_MODES and config.layer_ahead and layer >= 1 and layer in offloaded
    return hw.adapter_launches_per_layer + (hw.adapter_launches_per_predicted_layer if predicted else 0.0)


def step_time(mode: str, config: ScoutConfig, spec: ModelSpec, hw: Hardware, work: Workload, *,
              host_overhead_path=None, cpu_split: str | float = "off", exact: bool = False) -> StepEstimate:
    """The modelled decode step of `mode` (config.mode is ignored: the mode is the argument).

    cpu_split : "off", "auto" or a float in [0, 1]
        Scout's CPU/zero-copy split of its CPU list (split_cpu_share); "off" is the CPU workers alone. Other
        modes, and a CPU device (no link to read over), ignore it.
    exact : bool
        Scout only: a step on resident-first's exact path (every request's blocks held in the device pool).
    """
    if exact and mode != "scout":
        raise ValueError(f"the exact path is resident-first scout's; {mode!r} has none")
    cpu_split = "off" if exact else parse_cpu_split(cpu_split)
    splits = mode == "scout" and cpu_split != "off" and not hw.host_is_device
    config = config.replace(mode="scout" if mode == STOCK else mode)
    offloaded, _ = layer_split(config, spec.num_layers)
    batch, heads, group = work.batch_size, spec.num_kv_heads, spec.num_qo_heads // spec.num_kv_heads
    layer_weights = spec.layer_params() * work.itemsize
    weight_flops = 2 * spec.layer_params() * batch
    plan_ms = 0.0
    if mode == STOCK and hw.cuda_graphs_for_stock:
        launches, syncs, counts_source = 0.0, 0.0, "stock SGLang decodes with CUDA graphs"
    elif mode == STOCK:
        launches = hw.model_launches_per_layer + hw.stock_launches_per_layer + hw.stock_launches_per_request * batch
        syncs = hw.stock_syncs_per_request * batch
        counts_source = "the stock backend's counts in Hardware (no CUDA graphs)"
    else:
        counts = host_counts(mode, batch, heads, host_overhead_path, variant="exact" if exact else "steady",
                             recall_share=recall_share(mode, config, work))
        syncs, plan_ms = counts.scalar_reads_per_layer, counts.plan_ms_per_step
        counts_source = f"{counts.how}: {counts.source}"
        if hw.host_is_device:  # a CPU device runs the torch path: every dispatched op (views too) costs its thread
            launches = counts.ops_per_layer + hw.model_launches_per_layer
        elif hw.cuda_graphs_for_engine:
            launches, syncs = 0.0, 0.0
            counts_source = f"the whole step replays in SGLang's decode CUDA graph (plan from {counts_source})"
        else:  # a GPU runs the Triton path, launched layer by layer
            launches = None
            counts_source += " (Triton path, per offloaded and per dense layer)"
    t_sync = syncs * hw.sync_us * 1e-6
    kv_rate = (0.0 if mode == STOCK else hw.engine_attention_gbs) or hw.device_attention_gbs or hw.hbm_gbs
    step_host = (hw.step_host_ms + hw.step_host_ms_per_request * batch + plan_ms) * 1e-3
    if mode != STOCK:
        step_host += (hw.engine_step_host_ms + hw.engine_step_host_ms_per_request * batch) * 1e-3
    sums = dict.fromkeys(RESOURCES, 0.0)
    totals = dict(hbm=0.0, cpu=0.0, cpu_list=0.0, pcie=0.0, device=0.0, step=0.0, without_host=0.0, launch=0.0)
    ratio = 0.0
    for layer in range(spec.num_layers):
        # quest keeps every layer on the device but attends its selection outside the dense layers
        dense = layer in config.dense_layers if mode == "quest" else (mode == STOCK or layer not in offloaded)
        layer_launches = launches if launches is not None else (
            counts.gpu_launches(dense=dense) + hw.model_launches_per_layer)
        dense = dense or exact  # the exact path reads what a dense layer does (its launches are its own)
        t_launch = (layer_launches + _adapter_launches(mode, config, hw, layer, offloaded)) * hw.launch_us * 1e-6
        head = _head_traffic(mode, config, spec, work, dense=dense)
        attention_bytes = batch * heads * (head["device_kv"] + head["digests"])
        hbm = layer_weights + attention_bytes
        kv_bytes = batch * heads * head["device_kv"]  # read by the attention kernel, at its own rate
        t_attention = kv_bytes / (kv_rate * 1e9) + (attention_bytes - kv_bytes) / (hw.hbm_gbs * 1e9)
        flops = weight_flops + batch * heads * group * 4 * spec.head_dim * head["device_tokens"]
        t_hbm, t_flops = (hbm - attention_bytes) / (hw.hbm_gbs * 1e9) + t_attention, flops / (hw.bf16_tflops * 1e12)
        t_dev = max(t_hbm, t_flops)
        cpu_list, link = batch * heads * head["cpu"], batch * heads * head["pcie"]
        share = split_cpu_share(cpu_split if splits else "off", cpu_list_bytes=cpu_list, link_bytes=link,
                                cpu_gbs=hw.cpu_attention_gbs, pcie_gbs=hw.pcie_gbs)
        cpu_bytes = share * cpu_list
        pcie_bytes = link + (cpu_list - cpu_bytes)  # the zero-copy reads share the link with the recall
        t_cpu = cpu_bytes / (hw.cpu_attention_gbs * 1e9)
        t_pcie = pcie_bytes / (hw.pcie_gbs * 1e9)
        exposed, t_cpu_ahead = 0.0, t_cpu  # the CPU part launched a layer ahead overlaps the whole layer
        if mode == "hgca" and not dense:
            exposed = max(0.0, t_cpu - t_attention)  # beside the device attention only
            t_cpu_ahead = 0.0  # what the device attention does not hide is `exposed`, on the device's path
        if hw.host_is_device:  # one thread launches and computes: nothing overlaps but the worker threads
            layer_time = max(t_launch + t_dev + exposed + t_sync, t_cpu_ahead, t_pcie)
        else:
            layer_time = max(t_dev + exposed, t_cpu_ahead, t_pcie, t_launch) + t_sync
        without_host = max(t_dev + exposed, t_cpu_ahead, t_pcie)
        for name, value in zip(RESOURCES, (t_hbm, t_flops, t_cpu, t_pcie, t_launch + t_sync)):
            sums[name] += value
        totals["hbm"] += hbm
        totals["cpu"] += cpu_bytes
        totals["cpu_list"] += cpu_list
        totals["pcie"] += pcie_bytes
        totals["device"] += t_dev
        totals["step"] += layer_time
        totals["without_host"] += without_host
        totals["launch"] += t_launch
        ratio = max(ratio, head["cpu_ratio"])
    head_bytes = spec.head_params() * work.itemsize  # the output projection, once a step
    t_head = max(head_bytes / (hw.hbm_gbs * 1e9), 2 * spec.head_params() * batch / (hw.bf16_tflops * 1e12))
    sums["HBM"] += head_bytes / (hw.hbm_gbs * 1e9)
    sums["host"] += step_host
    totals["device"] += t_head
    if hw.overlap_schedule and not hw.host_is_device and syncs == 0:  # the host runs a step ahead of the device
        totals["step"] = max(totals["step"] + t_head, step_host + totals["launch"])
        totals["without_host"] = max(totals["without_host"] + t_head, plan_ms * 1e-3)
        counts_source += "; its host work overlaps the previous step (SGLang's overlap scheduler)"
    else:
        totals["step"] += t_head + step_host
        totals["without_host"] += t_head + plan_ms * 1e-3  # CUDA graphs hide launches, not the plan before them
    totals["hbm"] += head_bytes
    step = totals["step"]
    return StepEstimate(mode=mode, batch_size=batch, context=work.context, step_ms=step * 1e3,
                        tokens_per_s=batch / step if step else 0.0, step_ms_without_host=totals["without_host"] * 1e3,
                        bound=max(sums, key=sums.get),
                        gpu_idle=max(0.0, 1.0 - totals["device"] / step) if step else 0.0,
                        gpu_idle_without_host=max(0.0, 1.0 - totals["device"] / totals["without_host"]) if step else 0.0,
                        cpu_ratio=ratio,
                        resource_ms={name: value * 1e3 for name, value in sums.items()}, hbm_bytes=totals["hbm"],
                        cpu_bytes=totals["cpu"], pcie_bytes=totals["pcie"],
                        cpu_share=totals["cpu"] / totals["cpu_list"] if totals["cpu_list"] else 1.0,
                        host_counts_source=counts_source)
