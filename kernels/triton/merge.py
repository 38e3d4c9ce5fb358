"""LSE merge of two partial attention results over disjoint key sets.

Last op of digest -> select -> device part / CPU part -> merge: combines the
device part (O_gpu, lse_gpu) with the CPU part (O_cpu, lse_cpu). Natural log.

    m = max(lse_a, lse_b);  w_x = exp(lse_x - m)
    o = (w_a o_a + w_b o_b) / (w_a + w_b);  lse = m + log(w_a + w_b)

Each program reads its rows completely before writing them, so the outputs may
alias o_a / lse_a (in-place merge).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Heads per program: one [BLOCK_H, D] tile of each side.
BLOCK_H = 8


@triton.jit
def merge_tile(o_a, lse_a, o_b, lse_b):
    """(o [BLOCK_H, D] fp32, lse [BLOCK_H]) of two sides' tiles (o fp32, lse natural log, -inf where empty)."""
    m = tl.maximum(lse_a, lse_b)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w_a = tl.exp(lse_a - m_safe)  # 0 for an empty side
    w_b = tl.exp(lse_b - m_safe)
    total = w_a + w_b
    # An empty side contributes exactly nothing, even if its o holds garbage.
    acc = tl.where((w_a > 0)[:, None], w_a[:, None] * o_a, 0.0)
    acc += tl.where((w_b > 0)[:, None], w_b[:, None] * o_b, 0.0)
    has = total > 0
    o = acc / tl.where(has, total, 1.0)[:, None]
    lse = tl.where(has, m_safe + tl.log(tl.where(has, total, 1.0)), float("-inf"))
    return o, lse


@triton.jit
def _merge_states_kernel(
    o_a_ptr,
    lse_a_ptr,
    o_b_ptr,
    lse_b_ptr,
    out_o_ptr,
    out_lse_ptr,
    stride_oa_row,
    stride_oa_head,
    stride_la_row,
    stride_ob_row,
    stride_ob_head,
    stride_lb_row,
    stride_out_o_row,
    stride_out_o_head,
    stride_out_lse_row,
    num_heads,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # grid: (N, cdiv(H, BLOCK_H)).
    row = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask_h = offs_h < num_heads
    mask = mask_h[:, None] & (offs_d[None, :] < HEAD_DIM)

    lse_a = tl.load(lse_a_ptr + row * stride_la_row + offs_h, mask=mask_h, other=float("-inf"))
    lse_b = tl.load(lse_b_ptr + row * stride_lb_row + offs_h, mask=mask_h, other=float("-inf"))
    o_a = tl.load(
        o_a_ptr + row * stride_oa_row + offs_h[:, None] * stride_oa_head + offs_d[None, :], mask=mask, other=0.0
    ).to(tl.float32)
    o_b = tl.load(
        o_b_ptr + row * stride_ob_row + offs_h[:, None] * stride_ob_head + offs_d[None, :], mask=mask, other=0.0
    ).to(tl.float32)

    o, lse = merge_tile(o_a, lse_a, o_b, lse_b)

    tl.store(
        out_o_ptr + row * stride_out_o_row + offs_h[:, None] * stride_out_o_head + offs_d[None, :],
        o.to(out_o_ptr.dtype.element_ty),
        mask=mask,
    )
    tl.store(out_lse_ptr + row * stride_out_lse_row + offs_h, lse, mask=mask_h)


def merge_states_triton(
    o_a: torch.Tensor,
    lse_a: torch.Tensor,
    o_b: torch.Tensor,
    lse_b: torch.Tensor,
    out_o: torch.Tensor,
    out_lse: torch.Tensor,
) -> None:
    """Merge two partial attention states; outputs may alias o_a / lse_a.

    Parameters
    ----------
    o_a, o_b : [N, H, D], innermost dim contiguous
    lse_a, lse_b : [N, H] fp32, natural log; -inf marks an empty side, which
        leaves the other side unchanged (both empty -> o = 0, lse = -inf)
    out_o : [N, H, D], any float dtype (cast on store)
    out_lse : [N, H] fp32, natural log
    """
    num_rows, num_heads, head_dim = o_a.shape
    if num_rows == 0 or num_heads == 0:
        return
    grid = (num_rows, triton.cdiv(num_heads, BLOCK_H))
    _merge_states_kernel[grid](
        o_a,
        lse_a,
        o_b,
        lse_b,
        out_o,
        out_lse,
        o_a.stride(0),
        o_a.stride(1),
        lse_a.stride(0),
        o_b.stride(0),
        o_b.stride(1),
        lse_b.stride(0),
        out_o.stride(0),
        out_o.stride(1),
        out_lse.stride(0),
        num_heads,
        HEAD_DIM=head_dim,
        BLOCK_H=BLOCK_H,
        BLOCK_D=triton.next_power_of_2(head_dim),
    )
