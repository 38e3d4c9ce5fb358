"""LSE merge of two partial attention results over disjoint key sets.

Last stage of digest -> select -> device part / CPU part -> merge. An empty side
(lse = -inf) leaves the other unchanged; both empty gives o = 0, lse = -inf.
LSE is natural log; FlashInfer's base-2 LSE is converted at its boundary.
"""

from __future__ import annotations

import torch

from scout_sglang.kernels.checks import ATTENTION_DTYPES, check_shape, check_tensor
from scout_sglang.kernels.dispatch import select_impl


def _check_states(o_a, lse_a, o_b, lse_b):
    check_tensor("o_a", o_a, ndim=3, dtypes=ATTENTION_DTYPES)
    device = o_a.device
    check_tensor("o_b", o_b, ndim=3, dtypes=ATTENTION_DTYPES, device=device)
    check_shape("o_b", o_b, o_a.shape)
    for name, lse in (("lse_a", lse_a), ("lse_b", lse_b)):
        check_tensor(name, lse, ndim=2, dtypes=(torch.float32,), device=device)
        check_shape(name, lse, o_a.shape[:2])


def merge_attention_states(
    o_a: torch.Tensor,
    lse_a: torch.Tensor,
    o_b: torch.Tensor,
    lse_b: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    out_lse: torch.Tensor | None = None,
    impl: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Out-of-place merge.

    Parameters
    ----------
    o_a, o_b : [N, H, D] (any attention dtype; they may differ)
    lse_a, lse_b : [N, H] fp32 natural log
    out : optional [N, H, D], dtype of o_a; out_lse : optional [N, H] fp32

    Returns
    -------
    o : [N, H, D] dtype of o_a, lse : [N, H] fp32 natural log
    """
    _check_states(o_a, lse_a, o_b, lse_b)
    if out is None:
        out = torch.empty_like(o_a)
    if out_lse is None:
        out_lse = torch.empty_like(lse_a)
    check_tensor("out", out, dtypes=(o_a.dtype,), device=o_a.device)
    check_shape("out", out, o_a.shape)
    check_tensor("out_lse", out_lse, dtypes=(torch.float32,), device=o_a.device)
    check_shape("out_lse", out_lse, lse_a.shape)
    _merge_into(o_a, lse_a, o_b, lse_b, out, out_lse, impl)
    return out, out_lse


def merge_attention_states_(
    o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor, *, impl: str | None = None
) -> None:
    """In-place merge: (o_a, lse_a) <- merge((o_a, lse_a), (o_b, lse_b))."""
    _check_states(o_a, lse_a, o_b, lse_b)
    _merge_into(o_a, lse_a, o_b, lse_b, o_a, lse_a, impl)


def _merge_into(o_a, lse_a, o_b, lse_b, out, out_lse, impl):
    choice = select_impl("merge", o_a.device.type, impl)
    if choice == "flashinfer":
        from scout_sglang.kernels.flashinfer_ops import merge_states_flashinfer

        merge_states_flashinfer(o_a, lse_a, o_b, lse_b, out, out_lse)
    elif choice == "triton":
        from scout_sglang.kernels.triton import merge_states_triton

        if o_b.dtype != o_a.dtype:
            o_b = o_b.to(o_a.dtype)
        merge_states_triton(o_a, lse_a, o_b, lse_b, out, out_lse)
    else:
        merged, merged_lse = merge_states_torch(o_a, lse_a, o_b, lse_b)
        out.copy_(merged)
        out_lse.copy_(merged_lse)


def merge_states_torch(o_a, lse_a, o_b, lse_b):
    """fp32 merge with torch ops; returns (o fp32, lse fp32)."""
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)  # both empty: keep exp finite
    w_a = torch.exp(lse_a - m)
    w_b = torch.exp(lse_b - m)
    total = w_a + w_b
    safe_total = torch.where(total > 0, total, torch.ones_like(total))
    o = (w_a.unsqueeze(-1) * o_a.float() + w_b.unsqueeze(-1) * o_b.float()) / safe_total.unsqueeze(-1)
    lse = torch.where(total > 0, m + torch.log(safe_total), torch.full_like(m, float("-inf")))
    return o, lse
