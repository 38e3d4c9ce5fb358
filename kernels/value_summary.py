"""Each full block's value summary, the estimate's view of its values: the mean value, and its slope in the query.

digest (**with the value summary**) -> select -> device part / CPU part -> estimate + merge.
Per (block, KV head), fp32, then stored in the cache dtype as rows of one [3, D] entry
(reference.estimate says why the slope):

    MEAN   vbar = mean_i v_i
    AXIS   x, the leading right singular vector of C = (1/S) sum_i (v_i - vbar)(k_i - kmean)^T,
           by SLOPE_ITERATIONS steps x <- C^T C x / |C^T C x| from the all-ones direction
    SLOPE  y = C x

C is never formed: C x = (1/S) Vc^T (Kc x) and C^T y = (1/S) Kc^T (Vc y), with Kc, Vc the
block's centred [S, D] keys and values, so a step costs 4 S D multiply-adds, as in the Triton
kernels that fill blocks (triton/value_summary.py). The fp32 reference:
reference.value_summary_of_block.
"""

from __future__ import annotations

import torch

from scout_sglang.layout import AXIS, MEAN, SLOPE, SLOPE_ITERATIONS, VALUE_SUMMARY_ROWS


def value_summaries_torch(k_blocks: torch.Tensor, v_blocks: torch.Tensor) -> torch.Tensor:
    """[n, Hkv, S, D] keys and values of n blocks -> their value summaries [n, Hkv, 3, D] fp32."""
    k, v = k_blocks.float(), v_blocks.float()
    size = k.shape[2]
    mean = v.mean(dim=2)
    kc, vc = k - k.mean(dim=2, keepdim=True), v - mean.unsqueeze(2)

    def cross(axis):  # C x -> [n, Hkv, D]
        return torch.einsum("nhs,nhsd->nhd", torch.einsum("nhsd,nhd->nhs", kc, axis), vc) / size

    axis = torch.full_like(mean, k.shape[3] ** -0.5)
    for _ in range(SLOPE_ITERATIONS):
        slope = cross(axis)
        axis = torch.einsum("nhs,nhsd->nhd", torch.einsum("nhsd,nhd->nhs", vc, slope), kc) / size  # C^T C x
        norm = axis.norm(dim=-1, keepdim=True)
        axis = axis / torch.where(norm > 0, norm, 1.0)
    summary = torch.empty(*mean.shape[:2], VALUE_SUMMARY_ROWS, mean.shape[2], device=mean.device)
    summary[:, :, MEAN], summary[:, :, SLOPE], summary[:, :, AXIS] = mean, cross(axis), axis
    return summary
