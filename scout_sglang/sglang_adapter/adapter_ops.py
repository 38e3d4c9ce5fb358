"""The ops the plugin dispatches per decode layer around the engine, counted on the real code.

The engine's own ops are counted by benchmarks/bench_host_overhead.py; what the
plugin adds a layer is priced apart by the planner (scout_sglang.plan.step_model's
`adapter_launches_per_layer`):

* the backend's decode wrapper (`forward_decode` -> `decode_into`): the output
  buffer (the engine writes into it), the reshapes of q, k and v, and in an
  eager step the predicted-query cosine kept for the statistics;
* the layer-ahead query prediction (`QueryPredictor.predict`), on the layers that
  take one (the offloaded layers after the first): the Q rows of the next layer's
  projection, its q_norm where the model has one, and SGLang's own RoPE.

Both run unbound, on stand-ins of exactly what they read (the wrapper's engine
call returns at once, so its ops are not in the count), and are counted with the
engine's op counter and line counter on random tensors of the model's shapes.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from types import MethodType, SimpleNamespace

import torch

from scout_sglang.core.host_work import PythonLineCounter
from scout_sglang.core.op_counter import OpCounter
from scout_sglang.core.shape import ModelShape


@dataclass(frozen=True)
class AdapterCounts:
    """Per decode layer: ops dispatched (views included), ops that would launch a kernel and Python lines
    executed (None where they could not be counted), for the decode wrapper (every engine layer) and for the
    layer-ahead prediction (each layer that takes one)."""

    wrapper_ops: int
    wrapper_launches: int
    wrapper_lines: int | None
    prediction_ops: int
    prediction_launches: int
    prediction_lines: int | None


def _count(fn, prepare=lambda: None) -> tuple[int, int, int | None]:
    """Ops, launches and Python lines of `fn()`, each counted on its own call (`prepare()` before each); no line
    count (None) under a debugger or coverage tool, which holds the one trace function."""
    prepare()
    with torch.no_grad(), OpCounter() as counter:
        fn()
    if sys.gettrace() is not None:
        return sum(counter.ops.values()), counter.launches(), None
    prepare()
    with torch.no_grad(), PythonLineCounter() as lines:
        fn()
    return sum(counter.ops.values()), counter.launches(), lines.lines


def _wrapper_counts(shape: ModelShape, batch: int) -> tuple[int, int, int]:
    from scout_sglang.sglang_adapter.backend import ScoutAttnBackend
    from scout_sglang.sglang_adapter.serving_stats import ServingStats

    heads, kv_heads, dim = shape.num_qo_heads, shape.num_kv_heads, shape.head_dim
    backend = SimpleNamespace(
        layout="logical", shape=shape, stats=ServingStats(), _graph_step=False,
        _predicted={1: torch.randn(batch, heads, dim)},
        engine=SimpleNamespace(plan=object(), attend=lambda layer, q, k, v, out: out))
    backend._check_scale = MethodType(ScoutAttnBackend._check_scale, backend)
    backend.decode_into = MethodType(ScoutAttnBackend.decode_into, backend)
    layer = SimpleNamespace(layer_id=1, scaling=shape.softmax_scale)
    q = torch.randn(batch, heads * dim)
    k, v = (torch.randn(batch, kv_heads * dim) for _ in range(2))
    forward_batch = SimpleNamespace(out_cache_loc=None)
    decode = lambda: ScoutAttnBackend.forward_decode(backend, q, k, v, layer, forward_batch)  # noqa: E731
    decode()  # the statistics' first cosine starts their running sum: counted is a later step, as most are
    return _count(decode, prepare=lambda: backend._predicted.__setitem__(1, torch.randn(batch, heads, dim)))


def _prediction_counts(shape: ModelShape, hidden: int, batch: int, *, q_norm: bool, rope_theta: float,
                       max_position: int) -> tuple[int, int, int]:
    from sglang.srt.layers.rotary_embedding import base, get_rope

    if not (base._is_cpu or torch.cuda.is_available()):
        raise RuntimeError("SGLang builds its CPU rotary embedding only in a process started with "
                           "SGLANG_USE_CPU_ENGINE=1 (as a CPU server is): set it before sglang is imported")

    from scout_sglang.sglang_adapter.layer_ahead import QueryPredictor

    q_size, kv_size = shape.num_qo_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    layers = []
    for _ in range(2):
        attn = SimpleNamespace(qkv_proj=torch.nn.Linear(hidden, q_size + 2 * kv_size, bias=False),
                               q_size=q_size, kv_size=kv_size,
                               rotary_emb=get_rope(shape.head_dim, shape.head_dim, max_position, rope_theta))
        if q_norm:
            from sglang.srt.layers.layernorm import RMSNorm

            attn.q_norm = RMSNorm(shape.head_dim)
        layers.append(SimpleNamespace(self_attn=attn))
    predictor = QueryPredictor(SimpleNamespace(model=SimpleNamespace(layers=layers)), shape.head_dim,
                               wants=lambda layer: True, on_prediction=lambda layer, q: None)
    predictor.positions = torch.full((batch,), max_position // 2, dtype=torch.int64)
    x = torch.randn(batch, hidden)
    try:
        predictor.predict(1, x)  # first calls take paths of their own (lazy set-up), as in a server's first step
        return _count(lambda: predictor.predict(1, x))
    finally:
        predictor.remove()


def adapter_decode_counts(shape: ModelShape, hidden: int, *, batch: int = 1, q_norm: bool = False,
                          rope_theta: float = 10000.0, max_position: int = 4096) -> AdapterCounts:
    """The plugin's ops per decode layer around the engine for a model of `shape` and `hidden` size (q_norm:
    the model normalizes each query head, as Qwen3 does)."""
    wrapper = _wrapper_counts(shape, batch)
    prediction = _prediction_counts(shape, hidden, batch, q_norm=q_norm, rope_theta=rope_theta,
                                    max_position=max_position)
    return AdapterCounts(*wrapper, *prediction)
