"""A block's value summary inside a Triton program (kernels/value_summary.py says what and why).

Written by the programs that see a whole block: the digest kernel (prefill, adoption,
arrival) and the append stage (a block that fills in a step); read by the estimate. Same steps as the
torch path, on the [S, D] tiles the program already holds, in fp32.
"""

from __future__ import annotations

import triton
import triton.language as tl

from scout_sglang.layout import AXIS, MEAN, SLOPE, SLOPE_ITERATIONS

_MEAN, _SLOPE, _AXIS = tl.constexpr(MEAN), tl.constexpr(SLOPE), tl.constexpr(AXIS)
_ITERATIONS = tl.constexpr(SLOPE_ITERATIONS)


@triton.jit
def value_summary_rows(k, v, rows, in_dim, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr):
    """k, v : [S_P2, D_P2] fp32 tiles of one block (rows / in_dim: the real entries) -> (mean, slope, axis),
    each [D_P2] fp32, zero past HEAD_DIM."""
    k = tl.where(rows, k, 0.0)
    v = tl.where(rows, v, 0.0)
    mean = tl.sum(v, axis=0) / BLOCK_SIZE
    kc = tl.where(rows, k - (tl.sum(k, axis=0) / BLOCK_SIZE)[None, :], 0.0)
    vc = tl.where(rows, v - mean[None, :], 0.0)
    axis = tl.where(in_dim, 1.0 / tl.sqrt(HEAD_DIM * 1.0), 0.0)
    for _ in tl.static_range(_ITERATIONS):
        slope = tl.sum(vc * tl.sum(kc * axis[None, :], axis=1)[:, None], axis=0) / BLOCK_SIZE  # C x
        axis = tl.sum(kc * tl.sum(vc * slope[None, :], axis=1)[:, None], axis=0) / BLOCK_SIZE  # C^T C x
        norm = tl.sqrt(tl.sum(axis * axis, axis=0))
        axis = axis / tl.where(norm > 0, norm, 1.0)
    slope = tl.sum(vc * tl.sum(kc * axis[None, :], axis=1)[:, None], axis=0) / BLOCK_SIZE
    return mean, slope, axis


@triton.jit
def store_value_summary(entry_ptr, stride_row, mean, slope, axis, mask):
    """The three rows of one (page, head) entry, starting at entry_ptr, in the store's dtype."""
    tl.store(entry_ptr + _MEAN * stride_row, mean.to(entry_ptr.dtype.element_ty), mask=mask)
    tl.store(entry_ptr + _SLOPE * stride_row, slope.to(entry_ptr.dtype.element_ty), mask=mask)
    tl.store(entry_ptr + _AXIS * stride_row, axis.to(entry_ptr.dtype.element_ty), mask=mask)


@triton.jit
def load_value_summary(entry_ptrs, stride_row, mask):
    """The three rows of the entries at entry_ptrs (any tile of pointers to row MEAN) -> (mean, slope, axis) fp32."""
    mean = tl.load(entry_ptrs + _MEAN * stride_row, mask=mask, other=0.0).to(tl.float32)
    slope = tl.load(entry_ptrs + _SLOPE * stride_row, mask=mask, other=0.0).to(tl.float32)
    axis = tl.load(entry_ptrs + _AXIS * stride_row, mask=mask, other=0.0).to(tl.float32)
    return mean, slope, axis
