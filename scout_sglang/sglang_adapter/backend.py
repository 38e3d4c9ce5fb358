"""ScoutAttnBackend: SGLang's attention calls -> CoAttentionEngine calls.

Extend/prefill is delegated by composition to a stock backend, which writes the
prompt's K/V into SGLang's pool. A request's first decode copies its prompt K/V
from the pool into the engine (host store + digests); every decode step then
goes through the engine: the device part reads only the resident buffer,
sink, window and tail, the rest comes from the CPU worker. In this version the
SGLang pool still holds every token as well (the memory-saving pool is the
next step), and the CPU work is launched in the same layer (layer-ahead hooks
come next).
"""

from __future__ import annotations

import logging

import torch

from scout_sglang.core.engine import CoAttentionEngine
from scout_sglang.core.shape import ModelShape
from scout_sglang.core.stores import ceil_div
from scout_sglang.env import config_from_env

logger = logging.getLogger("scout_sglang.sglang_adapter")
_config_logged = False


def unsupported_reasons(model_runner) -> list[str]:
    """Everything about this server that the scout backend cannot run (empty: fine)."""
    reasons = []
    if getattr(model_runner, "use_mla_backend", False):
        reasons.append("MLA attention (DeepSeek-style models): use a stock backend such as flashinfer or triton")
    config = model_runner.model_config.hf_config
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        reasons.append("sliding-window attention: use a stock backend for this model")
    if getattr(model_runner.server_args, "speculative_algorithm", None):
        reasons.append("speculative decoding: run without --speculative-algorithm")
    if getattr(model_runner, "is_draft_worker", False):
        reasons.append("a draft model: use a stock backend for the draft")
    return reasons


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
        reasons = unsupported_reasons(model_runner)
        if reasons:
            raise RuntimeError("the scout attention backend cannot run this server:\n  - " + "\n  - ".join(reasons))
        self.config = config_from_env()
        global _config_logged
        if not _config_logged:
            logger.info("scout attention backend configuration:\n%s", self.config.describe())
            _config_logged = True
        self.inner = stock_backend(model_runner)
        self.device = model_runner.device
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        pool = self.token_to_kv_pool
        tp_size = getattr(model_runner, "tp_size", 1)
        self.shape = ModelShape(num_layers=model_runner.model_config.num_hidden_layers,
                                num_qo_heads=model_runner.model_config.num_attention_heads // tp_size,
                                num_kv_heads=pool.head_num, head_dim=pool.head_dim)
        max_requests = self.req_to_token_pool.size
        total_pages = ceil_div(model_runner.max_total_num_tokens, self.config.block_size) + max_requests
        self.engine = CoAttentionEngine(self.config, self.shape, device=self.device, dtype=pool.dtype,
                                        max_requests=max_requests, total_pages=total_pages, track_changes=False)
        self.last_telemetry = None

    # -- AttentionBackend interface -------------------------------------------
    def init_forward_metadata(self, forward_batch):
        self.inner.init_forward_metadata(forward_batch)

    def forward(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        if forward_batch.forward_mode.is_decode():
            return self.forward_decode(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache)
        return self.forward_extend(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kwargs)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        return self.inner.forward_extend(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kwargs)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        from sglang.srt.mem_cache.memory_pool import KVWriteLoc

        if save_kv_cache and k is not None:
            self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc(forward_batch.out_cache_loc, None), k, v)
        layer_id = layer.layer_id
        if layer_id == 0:
            self._begin_step(forward_batch, layer)
        batch_size = forward_batch.batch_size
        o = self.engine.attend(layer_id, q.reshape(batch_size, self.shape.num_qo_heads, self.shape.head_dim),
                               k.reshape(batch_size, self.shape.num_kv_heads, self.shape.head_dim),
                               v.reshape(batch_size, self.shape.num_kv_heads, self.shape.head_dim))
        if layer_id == self.shape.num_layers - 1:
            self.last_telemetry = self.engine.end_step()
        return o.reshape(batch_size, self.shape.num_qo_heads * self.shape.head_dim).to(q.dtype)

    def get_cuda_graph_seq_len_fill_value(self):
        return self.inner.get_cuda_graph_seq_len_fill_value()

    def support_triton(self):
        return False

    # -- requests -----------------------------------------------------------------
    def release(self, req_pool_idx: int) -> None:
        self.engine.release_request(req_pool_idx)

    def _begin_step(self, forward_batch, layer) -> None:
        if abs(layer.scaling - self.shape.softmax_scale) > 1e-6 * self.shape.softmax_scale:
            raise RuntimeError(f"the scout backend assumes the softmax scale head_dim**-0.5 "
                               f"({self.shape.softmax_scale}); this model uses {layer.scaling}")
        rids = forward_batch.req_pool_indices.tolist()
        seq_lens = forward_batch.seq_lens_cpu.tolist()
        for rid, seq_len in zip(rids, seq_lens):
            known = self.engine.requests.get(rid)
            if known is not None and known.num_tokens != seq_len - 1:
                logger.warning("request slot %d changed owner or was retracted (%d tokens known, %d in the batch): "
                               "rebuilding its state", rid, known.num_tokens, seq_len - 1)
                self.engine.release_request(rid)
                known = None
            if known is None:
                self._admit(rid, seq_len - 1)
        self.engine.begin_step(rids)

    def _admit(self, rid: int, num_tokens: int) -> None:
        """Copy a request's prompt (and earlier tokens) from SGLang's pool into the engine."""
        self.engine.add_request(rid)
        slots = self.req_to_token_pool.req_to_token[rid, :num_tokens].long()
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
