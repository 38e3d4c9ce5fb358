"""ScoutAttnBackend: SGLang's attention calls -> CoAttentionEngine calls.

Where the prompt's K/V goes depends on the KV pool (kv_pool.py):
  logical  this backend runs prefill itself: each chunk's K/V goes straight into
           the engine (host store of full blocks, digests, device window), and
           a continued chunk stages its prefix from the engine for one layer;
  arrival  K/V arrives in a host pool (PD transfer, or a stock prefill backend);
           with pages of one block, the pool is the engine's host store (its
           pages are assigned to the engine's blocks from req_to_token, and a
           request's first decode rewrites them in place into the engine's
           layout), otherwise the first decode copies the K/V into the engine;
  stock    (SCOUT_KV_POOL=stock) prefill is delegated to a stock backend that
           writes SGLang's device pool, copied into the engine at first decode.
A decoded token's K/V is written to the engine, and to SGLang's pool only in
the stock layout (whose radix cache may share it).
Every decode step goes through the engine: the device part reads only the
resident buffer, sink, window and tail, the rest comes from the CPU worker.
Forward pre-hooks on each layer's qkv_proj predict the next layer's query, so
its selection and CPU attention start one layer early (layer_ahead.py).
"""

from __future__ import annotations

import functools
import logging
import time

import torch

from scout_sglang.core.engine import CoAttentionEngine
from scout_sglang.core.shape import ModelShape
from scout_sglang.cpu_worker.cpu_sets import cpu_list_text
from scout_sglang.env import (
    config_from_env,
    cpu_deadline_ms,
    drain_seconds,
    injected_faults,
    max_n,
    pool_settings_from_env,
)
from scout_sglang.kernels.prefill import chunk_prefill_attention
from scout_sglang.sglang_adapter import memory_report, prefix_pages
from scout_sglang.sglang_adapter.arrival_pages import block_pages, borrowed_host_store, shares_arrival_pool
from scout_sglang.sglang_adapter.graph_variants import EXACT, SPARSE
from scout_sglang.sglang_adapter.host_batch import HostBatch
from scout_sglang.sglang_adapter.kv_pool import (LAYOUT_ATTRIBUTE, RESIDENT_POOL_ATTRIBUTE, check_engine_memory,
                                                 plan_engine, pool_layout)
from scout_sglang.sglang_adapter.layer_ahead import QueryPredictor, decoder_layers, prediction_problems
from scout_sglang.sglang_adapter.metrics import ScoutMetrics
from scout_sglang.sglang_adapter.request_failures import RequestFailures
from scout_sglang.sglang_adapter.serving_stats import ServingStats
from scout_sglang.sglang_adapter.tensor_parallel import rank_core_plan, rank_place

METRICS_INTERVAL_S = 0.5  # the longest /metrics lags the steps; a request's release always updates it

logger = logging.getLogger("scout_sglang.sglang_adapter")
_config_logged = False


def unsupported_reasons(model_runner, scout) -> list[str]:
    """Everything about this server that the scout backend cannot run (empty: fine)."""
    reasons = []
    server_args = model_runner.server_args
    if getattr(model_runner, "use_mla_backend", False):
        reasons.append("MLA attention (DeepSeek-style models): use a stock backend such as flashinfer or triton")
    config = model_runner.model_config.hf_config
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        reasons.append("sliding-window attention: use a stock backend for this model")
    if getattr(server_args, "speculative_algorithm", None):
        reasons.append("speculative decoding: run without --speculative-algorithm")
    if getattr(model_runner, "is_draft_worker", False):
        reasons.append("a draft model: use a stock backend for the draft")
    if getattr(server_args, "enable_mixed_chunk", False):
        reasons.append("--enable-mixed-chunk (decode tokens inside prefill batches): run without it")
    if getattr(server_args, "disaggregation_mode", "null") == "decode" and retraction_backup(server_args) != "none":
        # SGLang backs a retracted request up from its own pool and restores it there; under scout that pool
        # holds no decoded token's K/V, so the resumed request would decode over rows nobody wrote.
        reasons.append("a retraction backup on the PD decode instance (it would restore K/V that SGLang's pool does "
                       "not hold under scout): pass --disaggregation-decode-retraction-backup none (a retracted "
                       "request is then aborted, HTTP 503, for the client to retry)")
    if getattr(server_args, "pp_size", 1) > 1:
        reasons.append("pipeline parallelism: use --pp-size 1 (tensor parallelism is fine)")
    if not str(getattr(server_args, "kv_cache_dtype", "auto")).startswith(("auto", "bf16", "bfloat16", "float16", "fp16")):
        reasons.append(f"--kv-cache-dtype {server_args.kv_cache_dtype}: the host store and CPU kernel hold "
                       "16-bit K/V; use --kv-cache-dtype auto")
    model = getattr(model_runner, "model", None)
    if scout.mode in ("scout", "infinigen") and scout.layer_ahead and decoder_layers(model):
        # A model whose layers cannot predict (quantized weights) is refused; one without decoder layers
        # at all (SGLang's minimal test runner) runs without prediction, with a warning (ScoutAttnBackend).
        for problem in prediction_problems(model, model_runner.model_config.num_hidden_layers):
            reasons.append(f"layer-ahead prediction: {problem}; set SCOUT_LAYER_AHEAD=0 to select with the "
                           "real query in the same layer")
    return reasons


def retraction_backup(server_args) -> str | None:
    """A PD decode instance's retraction backup as SGLang 0.5.23 resolves it: as given, except that a host
    receive threshold below 1 makes it host_pool (None: SGLang picks one later, host_pool or cpu_tensor)."""
    if getattr(server_args, "disaggregation_decode_host_receive_threshold", 1) < 1:
        return "host_pool"
    return getattr(server_args, "disaggregation_decode_retraction_backup", None)


def stops_the_server(what: str):
    """Decorates a backend entry point: an exception escaping it concerns no single request (those are given
    up alone: request_failures.py), so SGLang's scheduler will stop the server; say first what failed."""
    def decorate(method):
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            try:
                return method(self, *args, **kwargs)
            except Exception as error:
                logger.critical("scout: the attention backend failed while %s and cannot go on, so the server stops "
                                "(%s: %s)", what, type(error).__name__, error)
                raise
        return wrapper
    return decorate


def stock_backend(model_runner):
    """The backend that runs prefill: torch_native on CPU, triton on CUDA."""
    if model_runner.device == "cpu" or str(model_runner.device).startswith("cpu"):
        from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

        return TorchNativeAttnBackend(model_runner)
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    return TritonAttnBackend(model_runner)


class ScoutAttnBackend:
    """The `scout` attention backend (an SGLang AttentionBackend by duck typing
    and by subclassing at import time below)."""

    def __init__(self, model_runner):
        self.config = config_from_env()
        max_n(), drain_seconds()  # read by the HTTP front (guards.py): a bad value stops the server here
        reasons = unsupported_reasons(model_runner, self.config)
        if reasons:
            raise RuntimeError("the scout attention backend cannot run this server:\n  - " + "\n  - ".join(reasons))
        global _config_logged
        if not _config_logged:
            logger.info("scout attention backend configuration:\n%s", self.config.describe())
            _config_logged = True
        self.device = model_runner.device
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.allocator = getattr(model_runner, "token_to_kv_pool_allocator", None)
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        pool = self.token_to_kv_pool
        self.layout = getattr(pool, LAYOUT_ATTRIBUTE, "stock")
        expected = pool_layout(model_runner.server_args, self.device, getattr(model_runner, "is_draft_worker", False),
                               pool_settings_from_env()) or "stock"
        if self.layout != expected:
            raise RuntimeError(f"the scout KV pool should be {expected!r} but SGLang built {self.layout!r}: the hook on "
                               "its KV cache configurator did not attach (is this sglang 0.5.23?)")
        self.inner = stock_backend(model_runner) if self.layout == "stock" else None
        # Resident-first: the pool the KV pool's hook sized from the stock KV budget (kv_pool.py), or None
        self.pool_sizing = getattr(pool, RESIDENT_POOL_ATTRIBUTE, None)
        if self.pool_sizing is not None:
            self.config = self.config.replace(resident_pool_blocks=self.pool_sizing["pages"])
        self.place = rank_place(model_runner.server_args)
        # Layer count, heads and dtype come from the KV pool (what SGLang's minimal runners also have).
        self.shape = ModelShape(num_layers=pool.layer_num,
                                num_qo_heads=model_runner.model_config.num_attention_heads // self.place.attn_tp_size,
                                num_kv_heads=pool.head_num, head_dim=pool.head_dim)
        if self.config.mode in ("scout", "infinigen") and self.config.layer_ahead:
            problems = prediction_problems(getattr(model_runner, "model", None), self.shape.num_layers)
            if problems:  # the model is what a full server has; without it, select in the same layer
                logger.warning("scout: layer-ahead prediction is off (%s); each layer selects with its real query "
                               "(SCOUT_LAYER_AHEAD=0 says so explicitly)", "; ".join(problems))
                self.config = self.config.replace(layer_ahead=False)
        max_requests = self.req_to_token_pool.size
        logical_tokens = getattr(model_runner, "max_total_num_tokens", None) or pool.size
        total_pages = memory_report.engine_total_pages(logical_tokens, self.config.block_size, max_requests)
        if self.layout == "stock":  # the scout pool checked the engine's memory when it was sized
            check_engine_memory(plan_engine(pool, logical_tokens, max_requests, self.config), self.device,
                                logical_tokens, place=self.place)
        context = min(model_runner.model_config.context_len, logical_tokens)
        faults = injected_faults()
        if faults is not None:
            logger.warning("scout: SCOUT_TEST_FAULTS injects faults: %s", faults)
        self.host_store = None  # the arrival pool's pages, when they are the engine's host store
        # Under SGLang's radix cache every block lives in the page SGLang gave it, shared by the requests whose
        # prompts start with it (prefix_pages.py; kv_pool.py checked that a page is one block)
        self.shares_prefixes = self.layout == "logical" and not model_runner.server_args.disable_radix_cache
        offloaded = memory_report.layer_split(self.config, self.shape.num_layers)[0]
        if self.layout == "arrival" and offloaded and shares_arrival_pool(pool.page_size, self.config.block_size):
            self.host_store = borrowed_host_store(pool, offloaded, self.config.block_size, self.device)
        # The rank's CPUs split between the host and the CPU workers; the engine applies it (cpu_worker/factory.py)
        self.cores = rank_core_plan(self.place, self.device)
        self.engine = CoAttentionEngine(self.config, self.shape, device=self.device, dtype=pool.dtype,
                                        max_requests=max_requests, max_tokens_per_request=context + 1,
                                        total_pages=total_pages, track_changes=False,
                                        cpu_deadline_ms=cpu_deadline_ms(),
                                        cpu_faults=faults if faults is not None and faults.cpu_faults else None,
                                        cores=self.cores, host_store=self.host_store,
                                        assigned_pages=self.shares_prefixes)
        if self.place.tp_size > 1:
            cpus = (self.engine.cpu_worker_state() or {}).get("cpus")
            logger.info("scout: tensor-parallel rank %d of %d (process %d of %d on this host): %d query and %d KV "
                        "heads; CPU worker threads on CPUs %s", self.place.tp_rank, self.place.tp_size,
                        self.place.local_rank, self.place.local_ranks, self.shape.num_qo_heads,
                        self.shape.num_kv_heads, cpu_list_text(cpus) if cpus else "none (no CPU part)")
        self.failures = RequestFailures(faults.request_state if faults is not None else None)
        self.last_telemetry = None
        self.stats = ServingStats()
        self.host_batch = HostBatch()  # planning's reads of the batch, from host copies (host_batch.py)
        self._predicted: dict[int, torch.Tensor] = {}
        # A GPU's eager steps leave their counters on the device, read at intervals as a graph's are: a read at each
        # step's end would make the host wait for the step, and SGLang's overlap scheduler could not plan the next
        # one meanwhile. Where the device is the host's CPU every step is read (nothing runs ahead there).
        self.read_each_step = torch.device(self.device).type != "cuda"
        self._graph_step = False  # the planned step is a captured graph's: its host commits it later, unread
        self._graph_variant = None  # the captured graph graph_variant() picked for the next replay
        self._collected = float("-inf")  # time.monotonic() of the last read of a graph's telemetry
        self._last_rids: list[int] = []
        self._extend_plan: list[tuple[int, int, int, bool]] = []  # (slot, prefix, length, store in the engine)
        self._prefilling: dict[int, str | None] = {}  # slot -> id of the request whose prefill the engine admitted
        self.predictor = None
        if self.config.mode in ("scout", "infinigen") and self.config.layer_ahead:
            self.predictor = QueryPredictor(model_runner.model, self.shape.head_dim, self.engine.wants_prediction,
                                            self._on_prediction)
        logger.info("%s", memory_report.startup_message(self.engine, self.layout, logical_tokens, context,
                                                        memory_report.sglang_pool_bytes(pool, self.layout), max_requests))
        self.metrics = ScoutMetrics.create(model_runner.server_args, self.place.tp_rank)
        self._metrics_updated = float("-inf")  # time.monotonic() of the last metrics update at a step's end

    # -- AttentionBackend interface -------------------------------------------
    @stops_the_server("planning a forward")
    def init_forward_metadata(self, forward_batch):
        self._finish_graph_step()
        if self.inner is not None:
            self.inner.init_forward_metadata(forward_batch)
        decoding = forward_batch.forward_mode.is_decode() and forward_batch.batch_size > 0
        if decoding:  # before the model runs: layer 0's pre-hook already predicts layer 1
            self._begin_step(forward_batch)
        elif self.layout == "logical" and forward_batch.forward_mode.is_extend() and forward_batch.batch_size > 0:
            self._begin_extend(forward_batch)
        if self.predictor is not None:
            self.predictor.active = decoding
            self.predictor.positions = forward_batch.positions if decoding else None

    # -- decode CUDA graphs (SGLang's graph runner protocol, its default full graph) ------------------
    def init_cuda_graph_state(self, max_bs, max_num_tokens):
        """Called once before capture. The engine's buffers are preallocated at max_requests rows, the step's
        plan lives in one static buffer, and every per-layer call is kernels only: SGLang's full decode graph
        captures the whole step (the CPU part is handed off by kernels that ring and wait on page-locked words)."""
        if max_bs > self.engine.max_requests:
            raise RuntimeError(f"decode graphs captured up to batch {max_bs}, beyond the engine's "
                               f"{self.engine.max_requests} request slots")
        self.engine.fixed_widths = True  # a replay reads the plan at the addresses and widths of its capture

    @stops_the_server("planning a decode graph's replay")
    def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
        """Host-side planning of a graph step, into the engine's static plan buffer: at capture a step of padding
        rows only (SGLang captures with a dummy batch); on replay `forward_batch` is SGLang's replay view, padded
        to the captured size, and its first `batch_size - num_padding` rows are the step's requests."""
        self._finish_graph_step()
        if not forward_batch.forward_mode.is_decode():
            return
        padded = forward_batch.batch_size
        rows = 0 if in_capture else padded - (getattr(forward_batch, "num_padding", 0) or 0)
        # The graph this step replays (graph_variants.py): at capture the label being captured, at replay what
        # graph_variant() picked; without scout's variants always the selecting path's.
        from sglang.srt.model_executor.runner_utils.capture_mode import get_capture_attention_variant

        variant = get_capture_attention_variant() if in_capture else self._graph_variant
        self._graph_variant = None
        self._begin_step(forward_batch, rows=rows, padded=padded, exact_step=variant == EXACT)
        self._graph_step = True
        if self.predictor is not None:
            self.predictor.active = True
            self.predictor.positions = forward_batch.positions  # the graph's static buffer: every row

    def graph_variant(self, forward_batch) -> str:
        """The captured decode graph a replay of this batch takes (graph_variants.py), from its host copies: the
        exact path's where the engine holds every request at its length, none given up, and each is exact and
        settled (no device read); else the selecting path's. The last replayed step is committed first (its
        requests hold one more token), as the planning that follows would."""
        self._finish_graph_step()
        rows = forward_batch.batch_size
        rids = self.host_batch.ints(forward_batch, "req_pool_indices", rows)
        seq_lens = self.host_batch.ints(forward_batch, "seq_lens", rows)
        requests = self.engine.requests
        known = all(rid in requests and requests[rid].num_tokens == seq_len - 1 and rid not in self.failures.given_up
                    for rid, seq_len in zip(rids, seq_lens))
        self._graph_variant = EXACT if known and self.engine.exact_step_ready(rids) else SPARSE
        return self._graph_variant

    def init_forward_metadata_in_graph(self, forward_batch):
        """Nothing: a step's metadata is the engine's plan, built out of the graph (an inner stock backend
        runs prefill only, which decode graphs never capture)."""

    @stops_the_server("computing a layer's attention")
    def forward(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        if forward_batch.forward_mode.is_decode():
            return self.forward_decode(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache)
        return self.forward_extend(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kwargs)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        if self.inner is not None:
            return self.inner.forward_extend(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kwargs)
        if self.layout != "logical":
            raise RuntimeError(f"the scout backend got a prefill batch with the {self.layout} KV pool, where another "
                               "backend or instance runs prefill")
        self._check_scale(layer)
        heads, head_dim, layer_id = self.shape.num_qo_heads, self.shape.head_dim, layer.layer_id
        q = q.reshape(-1, heads, head_dim)
        k = k.reshape(-1, self.shape.num_kv_heads, head_dim)
        v = v.reshape(-1, self.shape.num_kv_heads, head_dim)
        out = torch.empty_like(q)
        offset = 0
        for rid, prefix, length, store in self._extend_plan:
            rows = slice(offset, offset + length)
            offset += length
            keys, values = k[rows], v[rows]
            if prefix:  # a continued chunk: stage its prefix from the engine for this layer
                prefix_k, prefix_v = self.engine.gather(rid, layer_id, prefix)
                keys = torch.cat([prefix_k.to(k.dtype), keys])
                values = torch.cat([prefix_v.to(v.dtype), values])
            out[rows] = chunk_prefill_attention(q[rows], keys, values, scale=layer.scaling)
            if store:
                self.engine.extend(rid, layer_id, prefix, k[rows], v[rows])
        return out.reshape(-1, heads * head_dim)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        from sglang.srt.mem_cache.memory_pool import KVWriteLoc

        # The stock layout keeps SGLang's pool whole: its radix cache shares a finished request's decoded
        # tokens with later requests, and a rebuilt request is read back from it. The scout pools hold no
        # decoded token's K/V (the engine does).
        if save_kv_cache and k is not None and self.layout == "stock":
            self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc(forward_batch.out_cache_loc, None), k, v)
        self._check_scale(layer)
        return self.decode_into(layer.layer_id, q, k, v)

    def decode_into(self, layer_id: int, q, k, v):
        """One layer of the planned step over every row of q [rows, Hq * D] (a captured graph's padding rows
        included: they attend nothing) -> out [rows, Hq * D]; an eager step's last layer ends it."""
        rows, heads, kv_heads, head_dim = q.shape[0], self.shape.num_qo_heads, self.shape.num_kv_heads, self.shape.head_dim
        out = q.new_empty(rows, heads * head_dim)
        if self.engine.plan is None:  # no decode step planned (another backend's batch)
            return out.zero_()
        q = q.reshape(rows, heads, head_dim)
        predicted = None if self._graph_step else self._predicted.pop(layer_id, None)
        if predicted is not None:  # eager steps only: a graph's host reads nothing back
            self.stats.add_cosines(torch.nn.functional.cosine_similarity(predicted.float().flatten(1),
                                                                         q.float().flatten(1), dim=-1))
        self.engine.attend(layer_id, q, k.reshape(rows, kv_heads, head_dim), v.reshape(rows, kv_heads, head_dim),
                           out=out.view(rows, heads, head_dim))
        if layer_id == self.shape.num_layers - 1 and not self._graph_step:
            self._add_telemetry(self.engine.end_step(read=self.read_each_step))
        return out

    def _add_telemetry(self, telemetry) -> None:
        """A step's (after graph steps: several steps') telemetry into the statistics and the metrics."""
        if telemetry is None:
            return
        self.last_telemetry = telemetry
        self.stats.add_step(telemetry)
        for slot, message in telemetry.bad_page_requests.items():  # a corrupt page table costs its request only
            if slot in self.engine.requests:
                self._give_up(slot, None, "decode", message)
        now = time.monotonic()
        if self.metrics is not None and now - self._metrics_updated >= METRICS_INTERVAL_S:
            self._metrics_updated = now  # a report reads the device once and walks the pools: not every step
            self.metrics.update(self.report())

    def _finish_graph_step(self, *, collect: bool = False) -> None:
        """Commit a replayed graph's step, which its host never waits for (it launched the graph and moved on):
        the requests' token counts now; its counters stay on the device, read at most every METRICS_INTERVAL_S
        (one device read then), or now when `collect`."""
        if self._graph_step and self.engine.plan is not None:
            self.engine.end_step(read=False)
        self._graph_step = False
        now = time.monotonic()
        if self.engine.plan is None and (collect or now - self._collected >= METRICS_INTERVAL_S):
            self._collected = now
            self._add_telemetry(self.engine.collect_telemetry(self._last_rids))

    def get_cuda_graph_seq_len_fill_value(self):
        return 1

    def _check_scale(self, layer) -> None:
        if abs(layer.scaling - self.shape.softmax_scale) > 1e-6 * self.shape.softmax_scale:
            raise RuntimeError(f"the scout backend assumes the softmax scale head_dim**-0.5 "
                               f"({self.shape.softmax_scale}); this model uses {layer.scaling}")

    def support_triton(self):
        return False

    # -- layer-ahead ---------------------------------------------------------------
    def _on_prediction(self, layer: int, q_pred: torch.Tensor) -> None:
        if self.engine.plan is None:  # no decode step planned (another backend's batch)
            return
        if not self._graph_step:
            self._predicted[layer] = q_pred
        self.engine.predict(layer, q_pred)

    # -- requests and statistics ----------------------------------------------------
    def report(self) -> dict:
        """Co-attention statistics since start-up, the current page usage and the memory in bytes and tokens."""
        if self._graph_step or (self.engine.telemetry is not None and self.engine.plan is None):
            self._finish_graph_step(collect=True)  # between forwards: a launched graph's step may be committed
        report = self.stats.report(self.engine.usage())
        report["tp_rank"], report["tp_size"] = self.place.tp_rank, self.place.tp_size
        report["request_failures"] = dict(self.failures.counts)
        report["planning_device_reads"] = self.host_batch.device_reads  # 0: no step's planning waits for the device
        report["cpu_worker"] = self.engine.cpu_worker_state()
        pool = self.engine.resident_pool_state()  # resident-first serving, or None
        report["resident_pool"] = None if pool is None else pool | {
            "recent_exact_share": self.stats.recent_exact_share(),
            "recent_exact_path_share": self.stats.recent_exact_path_share(), "sized_by": self._pool_sized_by(),
            "recent_requests": list(self.engine.pool.recent),  # their quota runs, what a reference decoder replays
            "stock_kv_bytes": (self.pool_sizing or {}).get("stock_kv_bytes")}
        report["cores"] = self.cores.as_report()
        report["host_store_pages"] = self.engine.host_store_pages()  # page kind, share on 2 MiB pages (<= 30 s old)
        report["memory"] = memory_report.usage(self.engine, self.layout, self.token_to_kv_pool,
                                               self.req_to_token_pool.size, self._pool_pages_used())
        return report

    def _pool_sized_by(self) -> str:
        """What set the resident-first pool's size: the stock KV budget (or its floor or ceiling), the setting, or the
        default of a fixed buffer's pages per slot (SCOUT_KV_POOL=stock)."""
        if self.pool_sizing is not None:
            return self.pool_sizing["limit"]
        return "SCOUT_RESIDENT_POOL_BLOCKS" if self.config.resident_pool_blocks is not None else \
            "resident_blocks per request slot"

    def _pool_pages_used(self) -> int | None:
        """Under the radix cache: the pages SGLang's allocator has given out (requests' and the tree's)."""
        allocator = self.allocator if self.shares_prefixes else None
        if allocator is None:
            return None
        return (allocator.size - allocator.available_size()) // self.config.block_size

    def close(self) -> None:
        """The server exits: stop and join the engine's CPU worker threads (idempotent)."""
        threads = len(self.engine.cpu_worker.threads) if self.engine.cpu_worker is not None else 0
        self.engine.close()
        logger.info("scout: engine closed, %d CPU worker threads joined", threads)

    def release(self, req_pool_idx: int) -> None:
        self.failures.given_up.discard(req_pool_idx)
        self._prefilling.pop(req_pool_idx, None)
        if req_pool_idx in self.engine.requests:
            self.stats.released_requests += 1
        self.engine.release_request(req_pool_idx)
        if self.metrics is not None:
            self.metrics.update(self.report())

    def _begin_step(self, forward_batch, rows: int | None = None, padded: int | None = None,
                    exact_step: bool | None = None) -> None:
        """Plan a decode step of the batch's first `rows` requests, run over `padded` rows (a captured graph's
        batch size), from the batch's host-side copies (no device read on a GPU); exact_step: the path of the
        captured graph it replays (None: eager, the engine decides)."""
        self._predicted.clear()
        rows = forward_batch.batch_size if rows is None else rows
        rids = self.host_batch.ints(forward_batch, "req_pool_indices", rows)
        seq_lens = self.host_batch.ints(forward_batch, "seq_lens", rows)
        request_ids = (getattr(forward_batch, "rids", None) or [None] * rows)[:rows]
        self.failures.inject(self.engine, rids, request_ids)
        for rid, seq_len, request_id in zip(rids, seq_lens, request_ids):
            known = self.engine.requests.get(rid)
            if self.layout == "logical" and (known is None or known.num_tokens != seq_len - 1):
                self._give_up(rid, request_id, "decode",
                              f"request slot {rid} decodes at token {seq_len - 1}, but the scout engine holds "
                              f"{known.num_tokens if known else 'no'} tokens of it: its K/V is nowhere else with "
                              "the scout KV pool")
                continue
            if self.layout == "arrival" and known is not None and known.num_tokens != seq_len - 1:
                # the arrival pool holds what arrived, never a decoded token: a rebuild would read rows nobody wrote
                self._give_up(rid, request_id, "decode",
                              f"request slot {rid} decodes at token {seq_len - 1}, but the scout engine holds "
                              f"{known.num_tokens} tokens of it: the arrival pool holds no decoded token's K/V to "
                              "rebuild it from")
                continue
            if known is not None and known.num_tokens != seq_len - 1:
                logger.warning("request slot %d changed owner or was retracted (%d tokens known, %d in the batch): "
                               "rebuilding its state", rid, known.num_tokens, seq_len - 1)
                self.engine.release_request(rid)
                known = None
            if known is None:
                self._admit(rid, seq_len - 1)
        # Where SGLang's allocator picks the pages (the radix cache; the arrival pool as the host store), the page
        # of a block a token starts is its token slot // block size: the engine takes it on the device from the
        # batch's out_cache_loc, so planning reads no device value (a given-up request's stand-in writes the
        # scratch page instead, assigned here on the host).
        assigned = self.shares_prefixes or self.host_store is not None
        if self.shares_prefixes:
            self._assign_given_up_blocks(rids)
        self.engine.begin_step(rids, rows=max(rows, padded or 0),
                               token_slots=forward_batch.out_cache_loc if assigned else None, exact_step=exact_step)
        self._last_rids = rids

    def _assign_given_up_blocks(self, rids: list[int]) -> None:
        """Under the radix cache: a request given up writes its stand-in's token into the scratch page, never into a
        page SGLang may share: the block its token starts is assigned the scratch page on the host."""
        size = self.config.block_size
        for rid in rids:
            if rid in self.failures.given_up:
                tokens = self.engine.requests[rid].num_tokens
                if tokens % size == 0:
                    self.engine.assign_scratch(rid, tokens // size, 1)

    def _give_up(self, slot: int, request_id: str | None, stage: str, message: str) -> None:
        """The request in `slot` cannot go on (request_failures.py): free its engine state, put an empty
        stand-in in its row for this step, and leave its abort to the scheduler hook."""
        self.failures.fail(slot, request_id, stage, message)
        self.engine.release_request(slot)
        self.engine.add_request(slot)

    def _begin_extend(self, forward_batch) -> None:
        """Admit the requests whose prefill starts (under the radix cache, with the cached prefix they start
        with); check that continued chunks continue what the engine holds (a chunk that does not is given up,
        and computed over itself alone)."""
        prefixes, lengths = list(forward_batch.extend_prefix_lens_cpu), forward_batch.extend_seq_lens_cpu
        rids = self.host_batch.ints(forward_batch, "req_pool_indices", len(prefixes))
        request_ids = getattr(forward_batch, "rids", None) or [None] * len(rids)
        continued = [row for row, prefix in enumerate(prefixes) if prefix]
        self.failures.inject(self.engine, [rids[row] for row in continued], [request_ids[row] for row in continued],
                             continued_chunks=True)
        stores, adopting = [True] * len(rids), set()
        for row, (rid, prefix) in enumerate(zip(rids, prefixes)):
            known = self.engine.requests.get(rid)
            if prefix and known is not None and known.num_tokens == prefix:
                continue  # a continued chunk
            if prefix == 0 or self._adopts(rid, request_ids[row], prefix, known):
                if known is not None:
                    logger.warning("request slot %d starts a prefill while holding %d tokens: releasing them",
                                   rid, known.num_tokens)
                    self.engine.release_request(rid)
                self.engine.add_request(rid)
                self.stats.admitted_requests += 1
                self._prefilling[rid] = request_ids[row]
                if prefix:
                    adopting.add(row)  # a radix-cache hit: the prefix's pages hold its K/V
                continue
            self._give_up(rid, request_ids[row], "prefill",
                          f"request slot {rid} continues a prefill at token {prefix}, but the scout engine holds "
                          f"{known.num_tokens if known else 'no'} tokens of it")
            prefixes[row] = 0
            # under the radix cache the stand-in writes nothing: its rows are the request's, which the tree may keep
            stores[row] = not self.shares_prefixes
        if self.shares_prefixes:
            self._assign_chunk_pages(rids, prefixes, lengths, stores, adopting)
        self._extend_plan = list(zip(rids, prefixes, lengths, stores))

    def _adopts(self, slot: int, request_id: str | None, prefix: int, known) -> bool:
        """Whether a prefill starting at token `prefix` is a new request matching a cached prefix (under the
        radix cache, in whole blocks): the engine holds nothing in its slot, and the slot's last admitted prefill
        was another request's (or was released since: a retracted request comes back). A continued chunk whose
        state the engine lost is not one: its rows past the tree's may never have been written."""
        return (self.shares_prefixes and prefix % self.config.block_size == 0 and known is None
                and slot not in self.failures.given_up
                and (slot not in self._prefilling or self._prefilling[slot] != request_id or request_id is None))

    def _assign_chunk_pages(self, rids, prefixes, lengths, stores, adopting) -> None:
        """Under the radix cache: the pages of the blocks each chunk writes, and the cached prefix's pages for the
        requests that adopt one, from req_to_token (one read for the batch)."""
        size = self.config.block_size
        rows = [row for row in range(len(rids)) if stores[row]]
        wanted = [(rids[row], 0 if row in adopting else self.engine.held_blocks(rids[row]),
                   -(-(prefixes[row] + lengths[row]) // size)) for row in rows]
        for row, (rid, first, _), pages in zip(rows, wanted, prefix_pages.block_pages(
                self.req_to_token_pool.req_to_token, wanted, size)):
            if row in adopting:
                cached = prefixes[row] // size
                self.engine.adopt_prefix(rid, prefixes[row], pages[:cached],
                                         filling_to=prefixes[row] + lengths[row])
                self.stats.add_prefix_hit(prefixes[row])
                first, pages = cached, pages[cached:]
            self.engine.assign_pages(rid, first, pages)

    def rebind_from_pool(self, slot: int, cached_tokens: int) -> None:
        """SGLang checkpointed the running request in `slot`: its first `cached_tokens` tokens are in the radix
        tree now, which may have moved it onto the tree's pages for blocks it computed itself (the same K/V) and
        freed its own: the engine's tables follow (one read of req_to_token)."""
        if not self.shares_prefixes or slot not in self.engine.requests or slot in self.failures.given_up:
            return
        blocks = min(cached_tokens // self.config.block_size, self.engine.held_blocks(slot))
        if blocks:
            pages = prefix_pages.block_pages(self.req_to_token_pool.req_to_token, [(slot, 0, blocks)],
                                             self.config.block_size)[0]
            self.engine.rebind_pages(slot, pages)

    def _admit(self, rid: int, num_tokens: int) -> None:
        """Move a request's prompt (and earlier tokens) from SGLang's pool into the engine: with a borrowed host
        store its full blocks stay in their pages (rewritten in the engine's layout), else they are copied."""
        self.engine.add_request(rid)
        self.stats.admitted_requests += 1
        slots = self.req_to_token_pool.req_to_token[rid, :num_tokens].long()
        slots = slots.to(self.token_to_kv_pool.get_key_buffer(0).device)
        if self.host_store is not None:  # its blocks' pages, the partial last one's too (its later tokens go there)
            self.engine.assign_pages(rid, 0, block_pages(slots, self.config.block_size, rid, partial=True))
        for layer_id in range(self.shape.num_layers):
            k = self.token_to_kv_pool.get_key_buffer(layer_id)[slots]
            v = self.token_to_kv_pool.get_value_buffer(layer_id)[slots]
            self.engine.prefill(rid, layer_id, k, v)


def _as_attention_backend():
    """Make ScoutAttnBackend a real AttentionBackend subclass (sglang imported lazily)."""
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

    global ScoutAttnBackend
    if not issubclass(ScoutAttnBackend, AttentionBackend):
        ScoutAttnBackend = type("ScoutAttnBackend", (ScoutAttnBackend, AttentionBackend), {})
    return ScoutAttnBackend
