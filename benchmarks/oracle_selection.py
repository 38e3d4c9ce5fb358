"""Oracle selection, for the accuracy benchmark only: Quest's layers with each block scored by its true attention mass.

digest -> **select** -> device part -> merge. Quest keeps every layer's K/V on the device and selects with the
layer's real query, by an upper bound of q.k from the digests. The oracle selects the same number of blocks (the
window's forced, then the best) by what that bound stands for: the share of the layer's attention each full block
gets, summed over the query heads of its KV head (a KV head's selection serves its whole group, so that sum is
the mass the selection keeps). No scoring of digests can keep more at the same budget: the gap between Quest and
the oracle is what Quest's scoring loses, the gap between the oracle and full attention what the budget does.

It reads every key of the context (the torch path of the CPU device): a bound to measure, not a mode to serve.
"""

from __future__ import annotations

import torch

from scout_sglang.core.engine import CoAttentionEngine
from scout_sglang.core.layer_stages import LayerStages


class OracleStages(LayerStages):
    """LayerStages whose device-full (Quest) layers score blocks by their attention mass."""

    def score(self, layer: int, q: torch.Tensor, store, table: torch.Tensor, scores: torch.Tensor) -> None:
        if store is not self.full_store:
            raise ValueError("the oracle selection scores Quest's device-full layers only (mode quest)")
        scores.copy_(attention_mass(q, store.k[layer], table, self.engine.plan.num_full, scale=self.scale))


def attention_mass(q: torch.Tensor, k_cache: torch.Tensor, table: torch.Tensor, num_full: torch.Tensor, *,
                   scale: float) -> torch.Tensor:
    """Each full block's share of the attention over a row's full blocks, summed over each KV head's query heads.

    q : [B, Hq, D]; k_cache : [P, Hkv, S, D]; table : [B, NB] int32 pages; num_full : [B] int32
    -> [B, Hkv, NB] fp32, -inf past each row's full blocks
    """
    batch_size, num_qo_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    width = table.shape[1]
    keys = k_cache[table.clamp(min=0).long()].float()  # [B, NB, Hkv, S, D]
    qf = q.float().view(batch_size, num_kv_heads, num_qo_heads // num_kv_heads, head_dim)
    logits = torch.einsum("bhgd,bnhsd->bhgns", qf, keys) * scale
    block_lse = torch.logsumexp(logits, dim=-1)  # [B, Hkv, G, NB]
    full = torch.arange(width, device=q.device) < num_full.unsqueeze(1)  # [B, NB]
    block_lse = block_lse.masked_fill(~full[:, None, None, :], float("-inf"))
    total = torch.logsumexp(block_lse, dim=-1, keepdim=True)
    share = torch.where(torch.isfinite(total), torch.exp(block_lse - total), 0.0).sum(dim=2)  # [B, Hkv, NB]
    return share.masked_fill(~full.unsqueeze(1), float("-inf"))


def oracle_engine(max_requests: int, max_tokens_per_request: int, dtype=torch.float32):
    """A factory engine(config, shape) for the reference decoder: the engine with oracle-scored Quest layers."""

    def build(config, shape):
        if config.mode != "quest":
            raise ValueError(f"the oracle selection runs in mode quest, got {config.mode!r}")
        engine = CoAttentionEngine(config, shape, dtype=dtype, max_requests=max_requests,
                                   max_tokens_per_request=max_tokens_per_request, track_changes=False)
        engine.stages = OracleStages(engine)
        return engine

    return build
