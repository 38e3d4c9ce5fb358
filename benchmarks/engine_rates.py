"""The engine's own rates on a CPU "device", as the step model takes them (used by validate_plan.py).

Two figures, each measured on this host on the model's shapes and the preset the
server runs:

* host time per dispatched op: the layer loop of decode steps as the server runs
  them (the preset's recall policy, layer-ahead prediction, its CPU part beside
  it), averaged over many steps at a short context, so that the K/V the ops read
  is small; divided by the ops of one step counted with a TorchDispatchMode.
* K/V bytes per second of the engine's device attention kernel (the kernel its
  dense layers and device part call, kernels.sparse_decode): the extra K/V of a
  long over a short context over the extra time, the median call of each, as the
  stock kernel's rate is measured (plan.measure.extra_kv_gbs).
"""

from __future__ import annotations

import time
from functools import partial

import torch

from scout_sglang.config import ScoutConfig
from scout_sglang.core.engine import CoAttentionEngine
from scout_sglang.core.op_counter import OpCounter
from scout_sglang.core.shape import ModelShape
from scout_sglang.core.step_plan import bucket
from scout_sglang.kernels.sparse_decode import sparse_decode
from scout_sglang.plan.measure import extra_kv_gbs

DTYPE = torch.float32  # the validated servers run float32


def _shape(spec) -> ModelShape:
    return ModelShape(num_layers=spec.num_layers, num_qo_heads=spec.num_qo_heads, num_kv_heads=spec.num_kv_heads,
                      head_dim=spec.head_dim)


def _decode_step(engine: CoAttentionEngine, shape: ModelShape, batch: int, gen: torch.Generator) -> float:
    """One decode step as the backend drives it; returns the host seconds of its layer loop."""
    q = torch.randn(shape.num_layers, batch, shape.num_qo_heads, shape.head_dim, generator=gen, dtype=DTYPE)
    kv = torch.randn(2, shape.num_layers, batch, shape.num_kv_heads, shape.head_dim, generator=gen, dtype=DTYPE)
    noise = 0.3 * torch.randn(shape.num_layers, batch, shape.num_qo_heads, shape.head_dim, generator=gen, dtype=DTYPE)
    engine.begin_step(list(range(batch)))
    start = time.perf_counter()
    for layer in range(shape.num_layers):
        if layer + 1 < shape.num_layers and engine.wants_prediction(layer + 1):
            engine.predict(layer + 1, q[layer + 1] + noise[layer + 1])  # the prediction is not the query
        engine.attend(layer, q[layer], kv[0, layer], kv[1, layer])
    looped = time.perf_counter() - start
    engine.end_step()
    return looped


def engine_dispatch_us(config: ScoutConfig, spec, *, batch: int = 1, warmup: int = 20, steps: int = 100) -> dict:
    """Host microseconds per op the engine dispatches in its decode layers, one request at a context of twice the
    token budget, `steps` decode steps after `warmup`. Returns value, ops and ms per step, and how."""
    shape = _shape(spec)
    context = 2 * config.token_budget + config.block_size
    engine = CoAttentionEngine(config, shape, dtype=DTYPE, max_requests=batch,
                               max_tokens_per_request=context + warmup + steps + 2, track_changes=False)
    gen = torch.Generator().manual_seed(0)
    try:
        for rid in range(batch):
            engine.add_request(rid)
            for layer in range(shape.num_layers):
                k, v = (torch.randn(context, shape.num_kv_heads, shape.head_dim, generator=gen, dtype=DTYPE)
                        for _ in range(2))
                engine.prefill(rid, layer, k, v)
        for _ in range(warmup):
            _decode_step(engine, shape, batch, gen)
        counter = OpCounter()
        with counter:
            _decode_step(engine, shape, batch, gen)
        ops = sum(counter.ops.values())
        seconds = sum(_decode_step(engine, shape, batch, gen) for _ in range(steps)) / steps
    finally:
        engine.close()
    value = 1e6 * seconds / ops
    how = (f"measured: the engine's decode layers ({config.mode}, recall {config.recall_policy}, batch {batch}, "
           f"{shape.num_kv_heads} KV heads, {context} tokens), mean of {steps} steps: {1e3 * seconds:.3f} ms / "
           f"{ops} ops")
    return {"value": round(value, 2), "ops_per_step": ops, "ms_per_step": round(1e3 * seconds, 3), "how": how}


def engine_attention_gbs(spec, *, block_size: int, batch: int = 4, short: int = 256, long: int = 2048,
                         rounds: int = 20) -> dict:
    """GB/s of K/V the engine's device attention kernel gets through: every block of each request's context
    listed, the table as wide as the engine makes it (the next power of two of the blocks)."""
    value = extra_kv_gbs(lambda context: partial(sparse_decode, **_sparse_inputs(spec, batch, context, block_size)),
                         short=short, long=long, rounds=rounds,
                         bytes_per_token=batch * spec.num_kv_heads * 2 * spec.head_dim * DTYPE.itemsize)  # K, V
    how = (f"measured: the engine's device attention kernel (kernels.sparse_decode, {sparse_kernel_impl()} path) "
           f"on this model's shapes, batch {batch}, blocks of {block_size}, K/V of {long} over {short} tokens a "
           f"request, median of {rounds}")
    return {"value": round(value, 2), "how": how}


def sparse_kernel_impl() -> str:
    from scout_sglang.kernels.dispatch import select_impl

    return select_impl("sparse_decode", "cpu")


def _sparse_inputs(spec, batch: int, context: int, block_size: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    blocks = -(-context // block_size)
    width = bucket(blocks, blocks + 1)
    pages = batch * blocks
    cache = [torch.randn(pages, spec.num_kv_heads, block_size, spec.head_dim, generator=gen, dtype=DTYPE)
             for _ in range(2)]
    table = torch.zeros(batch, spec.num_kv_heads, width, dtype=torch.int32)
    table[:, :, :blocks] = torch.arange(pages, dtype=torch.int32).view(batch, 1, blocks)
    tail = context - (blocks - 1) * block_size
    return dict(q=torch.randn(batch, spec.num_qo_heads, spec.head_dim, generator=gen, dtype=DTYPE),
                k_cache=cache[0], v_cache=cache[1], block_table=table,
                counts=torch.full((batch, spec.num_kv_heads), blocks, dtype=torch.int32),
                last_block_len=torch.full((batch, spec.num_kv_heads), tail, dtype=torch.int32),
                scale=spec.head_dim ** -0.5, validate=False)
