"""Output buffers the CPU part writes and the device side reads.

With CUDA present they are page-locked, so the merge on the device can copy
them asynchronously without a staging copy; on a CPU-only host they are plain.
"""

from __future__ import annotations

import torch

OUTPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def alloc_output_buffers(
    batch_size: int, num_qo_heads: int, head_dim: int, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocate `out_o` and `out_lse` for `CpuAttentionPool.submit`.

    Parameters
    ----------
    batch_size, num_qo_heads, head_dim : int
        B, Hq, D of the attention call.
    dtype : torch.dtype
        dtype of `out_o`: fp32, or the dtype of q.

    Returns
    -------
    out_o : [B, Hq, D] `dtype`, CPU, pinned when torch.cuda.is_available()
    out_lse : [B, Hq] fp32, CPU, pinned likewise (natural log once written)
    """
    for name, value in (("batch_size", batch_size), ("num_qo_heads", num_qo_heads), ("head_dim", head_dim)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    if dtype not in OUTPUT_DTYPES:
        raise TypeError(f"dtype must be one of {OUTPUT_DTYPES}, got {dtype}")
    pin = torch.cuda.is_available()
    out_o = torch.empty(batch_size, num_qo_heads, head_dim, dtype=dtype, pin_memory=pin)  # [B, Hq, D]
    out_lse = torch.empty(batch_size, num_qo_heads, dtype=torch.float32, pin_memory=pin)  # [B, Hq]
    return out_o, out_lse
