"""The ops SGLang's stock CPU attention dispatches per decode layer, counted on the real code.

A CPU server's stock baseline (`--attention-backend torch_native`) decodes
without CUDA graphs and loops over the requests of a batch in
`TorchNativeAttnBackend._run_sdpa_forward_decode`; its host cost per layer is a
fixed part plus a part per request. The planner's validation against the CPU
server prices that baseline with these counts (scout_sglang.plan.step_model's
`stock_launches_*`). The loop is called unbound (it reads nothing of its
backend object) on random tensors of the given shape and counted with the
engine's own op counter; the KV write and the reshapes around it in
`forward_decode` (a handful of ops a layer) are not counted. The same loop,
timed at two contexts, gives the rate at which it gets through K/V on this CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scout_sglang.core.op_counter import OpCounter


@dataclass(frozen=True)
class StockDecodeCounts:
    """Per decode layer of the stock CPU attention, each `fixed + per_request x B`: ops dispatched (views
    included: on a CPU each costs the host thread a dispatch), ops that would launch a kernel, and host reads."""

    ops_fixed: float
    ops_per_request: float
    launches_fixed: float
    launches_per_request: float
    scalar_reads_per_request: float


def _decode_inputs(batch: int, context: int, num_qo_heads: int, num_kv_heads: int, head_dim: int) -> tuple:
    """Random decode inputs of `_run_sdpa_forward_decode`, float32 (the CPU servers' dtype)."""
    tokens = batch * context
    query = torch.randn(batch, num_qo_heads, head_dim)  # [B, Hq, D]
    output = torch.empty_like(query)
    k_cache = torch.randn(tokens + 1, num_kv_heads, head_dim)  # [tokens, Hkv, D]
    v_cache = torch.randn(tokens + 1, num_kv_heads, head_dim)
    req_to_token = torch.arange(tokens, dtype=torch.int32).reshape(batch, context)  # [B, context]
    req_pool_indices = torch.arange(batch, dtype=torch.int64)
    seq_lens = torch.full((batch,), context, dtype=torch.int64)
    return query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens


def _decode(inputs: tuple, num_qo_heads: int, num_kv_heads: int, head_dim: int) -> None:
    _stock_backend()._run_sdpa_forward_decode(None, *inputs, scaling=head_dim**-0.5,
                                              enable_gqa=num_qo_heads != num_kv_heads)


def _stock_backend():
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    return TorchNativeAttnBackend


def _count(batch: int, context: int, num_qo_heads: int, num_kv_heads: int, head_dim: int) -> OpCounter:
    inputs = _decode_inputs(batch, context, num_qo_heads, num_kv_heads, head_dim)
    _stock_backend()  # imported before counting: a first import runs module-level ops
    counter = OpCounter()
    with counter:
        _decode(inputs, num_qo_heads, num_kv_heads, head_dim)
    return counter


def measure_stock_attention_gbs(*, num_qo_heads: int, num_kv_heads: int, head_dim: int, batch: int = 4,
                                short: int = 256, long: int = 2048, rounds: int = 20) -> float:
    """GB/s of K/V the stock CPU decode attention gets through per layer (measure.extra_kv_gbs: the extra K/V of
    `long` over `short` contexts over the extra time, so its per-request op costs cancel out)."""
    from scout_sglang.plan.measure import extra_kv_gbs

    def decode_at(context):
        inputs = _decode_inputs(batch, context, num_qo_heads, num_kv_heads, head_dim)
        return lambda: _decode(inputs, num_qo_heads, num_kv_heads, head_dim)

    return extra_kv_gbs(decode_at, short=short, long=long, rounds=rounds,
                        bytes_per_token=batch * num_kv_heads * 2 * head_dim * 4)  # K and V, float32


def stock_decode_counts(*, num_qo_heads: int, num_kv_heads: int, head_dim: int, context: int = 64) -> StockDecodeCounts:
    """Ops, launches and host reads per layer of SGLang's torch_native decode, split into fixed and per request
    by counting batches of 2 and 3 (the first request's slices can be no-ops, so batch 1 is not used)."""
    two = _count(2, context, num_qo_heads, num_kv_heads, head_dim)
    three = _count(3, context, num_qo_heads, num_kv_heads, head_dim)
    ops_two, ops_three = sum(two.ops.values()), sum(three.ops.values())
    ops, launches = ops_three - ops_two, three.launches() - two.launches()
    return StockDecodeCounts(ops_fixed=float(ops_two - 2 * ops), ops_per_request=float(ops),
                             launches_fixed=float(two.launches() - 2 * launches),
                             launches_per_request=float(launches),
                             scalar_reads_per_request=float(three.reads - two.reads))
