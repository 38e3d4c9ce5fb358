"""Input validation shared by the host wrappers of the device ops.

Wrappers validate, kernels never do. Every message states expected versus
actual so a caller can fix the call without reading the kernel.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

ATTENTION_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_tensor(
    name: str,
    tensor: object,
    *,
    ndim: int | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
    device: torch.device | None = None,
    contiguous: bool | str = True,
) -> torch.Tensor:
    """Raise TypeError/ValueError unless `tensor` matches; return it.

    contiguous: True (the whole tensor), "rows" (the last dimension only: check_rows) or False."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if ndim is not None and tensor.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(tensor.shape)}")
    if dtypes is not None and tensor.dtype not in dtypes:
        names = ", ".join(str(d) for d in dtypes)
        raise TypeError(f"{name} must have dtype in ({names}), got {tensor.dtype}")
    if device is not None and tensor.device != device:
        raise ValueError(f"{name} must be on {device}, got {tensor.device}")
    if contiguous == "rows":
        check_rows(name, tensor)
    elif contiguous and not tensor.is_contiguous():
        raise ValueError(f"{name} must be contiguous (got strides {tensor.stride()})")
    return tensor


def check_rows(name: str, tensor: torch.Tensor) -> None:
    """Raise ValueError unless the last dimension is contiguous (stride 1): the fused stages index rows of
    strided views (a step plan's columns, a buffer's first rows) with unit steps."""
    if tensor.dim() and tensor.shape[-1] > 1 and tensor.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension (got strides {tensor.stride()})")


def check_shape(name: str, tensor: torch.Tensor, expected: Sequence[int]) -> None:
    """Raise ValueError unless tensor.shape == expected."""
    if tuple(tensor.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {tuple(expected)}, got {tuple(tensor.shape)}")


def check_paged_cache(k_cache: object, v_cache: object | None = None) -> torch.Tensor:
    """Validate a paged KV cache [P, Hkv, S, D] (and its V twin); return k_cache."""
    check_tensor("k_cache", k_cache, ndim=4, dtypes=ATTENTION_DTYPES)
    if v_cache is not None:
        check_tensor("v_cache", v_cache, ndim=4, dtypes=(k_cache.dtype,), device=k_cache.device)
        check_shape("v_cache", v_cache, k_cache.shape)
    return k_cache


def check_group_size(num_qo_heads: int, num_kv_heads: int) -> int:
    """Return Hq // Hkv, or raise if Hq is not a multiple of Hkv."""
    if num_qo_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_qo_heads ({num_qo_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
        )
    return num_qo_heads // num_kv_heads


def check_values_in_range(name: str, tensor: torch.Tensor, low: int, high: int) -> None:
    """Raise ValueError unless low <= tensor <= high, for CPU tensors only.

    On a GPU reading values back would be a host sync (and break CUDA graphs),
    so there the ranges are the caller's contract, stated in each docstring.
    """
    if tensor.device.type != "cpu" or tensor.numel() == 0:
        return
    smallest, largest = int(tensor.min()), int(tensor.max())
    if smallest < low or largest > high:
        raise ValueError(f"{name} values must lie in [{low}, {high}], got [{smallest}, {largest}]")
