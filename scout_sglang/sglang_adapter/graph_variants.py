"""Two decode graphs per batch size under resident-first: the exact path's and the selecting path's.

SGLang's decode graph runner (0.5.23) captures attention variants per batch
size: each variant's graph is recorded with its label set (the runner's
get_capture_attention_variant), and before every replay the variant set's
`select(forward_batch)` picks one from host data, before the backend plans the
step (sglang/srt/layers/attention/graph_variants.py; DSA decodes dense and
sparse that way). Where a backend of this process serves resident-first, scout
installs ("exact", "sparse"): a step whose every request is exact and settled
replays the graph captured on the exact path (core/layer_stages.attend_exact:
admit, list, append, decode per offloaded layer; no prediction, selection, CPU
part or recall), any other step the selecting one. `select` asks the backend,
which asks the engine (exact_step_ready: host counts only, no device read); the
backend then plans the step for the graph picked. Each batch size is captured
twice (the capture takes twice as long); the graphs share SGLang's pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

EXACT, SPARSE = "exact", "sparse"
TARGET = "sglang.srt.model_executor.runner.decode_cuda_graph_runner.create_attention_graph_variants"


@dataclass(frozen=True)
class ScoutGraphVariants:
    """SGLang's AttentionGraphVariants protocol for one scout backend."""

    backend: object
    # The exact path first: the selecting path's capture peak (more buffers in use) subsumes its pool storage.
    capture_labels: ClassVar[tuple[str, ...]] = (EXACT, SPARSE)

    def select(self, forward_batch) -> str:
        return self.backend.graph_variant(forward_batch)


def install_variants(result, *args, **kwargs):
    """AFTER hook on the decode graph runner's create_attention_graph_variants(hf_config): scout's variants where
    exactly one backend of this process serves resident-first with the exact path and the model brings none of
    its own (None keeps SGLang's result)."""
    if result is not None:
        return None
    from scout_sglang.sglang_adapter.plugin import LIVE_BACKENDS

    backends = [b for b in list(LIVE_BACKENDS) if b.engine.pool is not None and b.engine.exact_path]
    return ScoutGraphVariants(backends[0]) if len(backends) == 1 else None
