"""Decode CUDA graphs with the scout backend: the engine runs between graph segments (sglang 0.5.23).

SGLang's breakable CUDA graph backend captures the model's decode forward as
segments and runs functions marked `@eager_on_graph` between them on replay,
with the tensors the capture saw (static buffers). The scout backend marks two
things so: the engine's per-layer call (`attend_between_segments`) and the
layer-ahead prediction (`predict_between_segments`). Everything else of the
model (projections, norms, MLPs) stays in the captured segments. The engine
code that runs in these breaks is the same that runs eagerly on the CPU: a
fixed sequence of ops per layer, no device value read back, so a replay's
breaks only enqueue work on the stream (the CPU hand-off waits for the CPU
workers, not for the GPU).

At capture the stubs do nothing; during SGLang's two warm-up runs (the real
bodies, with a dummy batch) the backend finds no planned step and writes
zeros. On replay the backend's `init_forward_metadata_out_graph` has planned
the step from the replay view (its real rows only) before the graph runs.
"""

from __future__ import annotations

import functools
import logging

logger = logging.getLogger("scout_sglang.sglang_adapter")


def _nothing_at_capture(*args, **kwargs):
    return None


def graph_break_active() -> bool:
    """True while SGLang captures, warms up or replays a breakable decode graph."""
    from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context import (
        is_in_breakable_cuda_graph,
    )

    return is_in_breakable_cuda_graph()


def _eager_on_graph(fn):
    from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph import (
        eager_on_graph,
    )

    return eager_on_graph(fn, capture_stub=_nothing_at_capture)


@functools.cache
def _attend_break():
    return _eager_on_graph(_attend)


@functools.cache
def _predict_break():
    return _eager_on_graph(_predict)


def attend_between_segments(backend, layer_id: int, q, k, v, out) -> None:
    """backend.decode_into(layer_id, q, k, v, out) between two captured segments."""
    _attend_break()(backend, layer_id, q, k, v, out)


def predict_between_segments(predictor, layer: int, x) -> None:
    """predictor.predict_and_deliver(layer, x) between two captured segments."""
    _predict_break()(predictor, layer, x)


def _attend(backend, layer_id, q, k, v, out):
    backend.decode_into(layer_id, q, k, v, out)


def _predict(predictor, layer, x):
    predictor.predict_and_deliver(layer, x)


def use_breakable_decode_graphs() -> None:
    """Make SGLang's decode graph runner capture breakable graphs (called from init_cuda_graph_state, which
    the runner calls before it picks its graph backend). A full graph cannot run the CPU hand-off."""
    from sglang.srt.model_executor.cuda_graph_config import Backend
    from sglang.srt.runtime_context import get_exec

    config = get_exec().graph.cuda_graph_config
    if config is None or config.decode.backend == Backend.BREAKABLE:
        return
    if config.decode.backend != Backend.FULL:
        return
    config.decode.backend = Backend.BREAKABLE
    logger.info("scout: decode CUDA graphs use SGLang's breakable graph backend (the engine's CPU hand-off runs "
                "between captured segments)")
