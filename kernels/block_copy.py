"""Copies of (page, KV head) rows between paged stores: recall and window admission.

A store [P, Hkv, S, D] viewed as [P * Hkv, S, D] makes each (page, head) one row
of S * D contiguous values. A copy list is fixed-length with scratch entries
(rows nobody reads) where there is nothing to copy, so the launch does not
depend on how many blocks move. The source may be the host store: on CUDA it is
page-locked and read through unified addressing by the Triton kernel, so the
copy is one launch on the stream with no host involvement (SGLang's HiCache
reads host KV the same way with its kernel I/O backend).
"""

from __future__ import annotations


import torch

from scout_sglang.kernels.checks import check_tensor


def copy_block_rows(src: torch.Tensor, src_rows: torch.Tensor, dst: torch.Tensor, dst_rows: torch.Tensor, *,
                    skip_row: int | None = None) -> None:
    """dst[dst_rows[i]] = src[src_rows[i]] for every i whose dst row is not `skip_row`.

    Parameters
    ----------
    src : [N, S, D] rows, on the device of dst or (CUDA) page-locked host memory
    src_rows : [M] long, device of dst
    dst : [N', S, D] rows, dtype of src
    dst_rows : [M] long, device of dst; duplicates only at scratch rows
    skip_row : a scratch row of dst: entries aimed at it copy nothing (the torch path copies them anyway,
        harmlessly; the native CPU path and the CUDA kernel skip them, so a long list of few copies is cheap)
    """
    check_tensor("src", src, ndim=3)
    check_tensor("dst", dst, ndim=3, dtypes=(src.dtype,))
    check_tensor("src_rows", src_rows, ndim=1, dtypes=(torch.int64,), device=dst.device)
    check_tensor("dst_rows", dst_rows, ndim=1, dtypes=(torch.int64,), device=dst.device)
    if src.shape[1:] != dst.shape[1:]:
        raise ValueError(f"src rows {tuple(src.shape[1:])} and dst rows {tuple(dst.shape[1:])} differ")
    if src.device == dst.device:
        if (dst.device.type == "cpu" and skip_row is not None and src.is_contiguous() and dst.is_contiguous()
                and _native_copy() is not None):
            torch.ops.scout.copy_rows_cpu(src, src_rows, dst, dst_rows, skip_row)  # one dispatched op, as a launch
            return
        dst.index_copy_(0, dst_rows, src.index_select(0, src_rows))
        return
    if dst.device.type != "cuda" or src.device.type != "cpu" or not src.is_pinned():
        raise ValueError(f"a copy from {src.device} to {dst.device} needs a page-locked host source and a CUDA "
                         "destination")
    from scout_sglang.kernels.triton.block_copy import copy_rows_from_host_triton

    copy_rows_from_host_triton(src, src_rows, dst, dst_rows, -1 if skip_row is None else skip_row)


def _copy_rows_cpu(src: torch.Tensor, src_rows: torch.Tensor, dst: torch.Tensor, dst_rows: torch.Tensor,
                   skip_row: int) -> None:
    _native_copy()(src, src_rows, dst, dst_rows, skip_row)


# The native CPU row copy as one dispatched op: op counters count it and host clocks time it as the one kernel
# launch it is on CUDA. Registered as a plain CPU kernel of the dispatcher: a custom_op's wrappers cost ~20 us a
# call here (about 2 us this way), several times a layer.
_SCOUT_OPS = torch.library.Library("scout", "FRAGMENT")
_SCOUT_OPS.define("copy_rows_cpu(Tensor src, Tensor src_rows, Tensor(a!) dst, Tensor dst_rows, int skip_row) -> ()")
_SCOUT_OPS.impl("copy_rows_cpu", _copy_rows_cpu, "CPU")
# What torch.compile traces it with: it mutates dst and returns nothing.
_SCOUT_OPS.impl("copy_rows_cpu", lambda src, src_rows, dst, dst_rows, skip_row: None, "Meta")


_NATIVE_COPY: tuple | None = None  # (the native row copy or None), resolved once, on the first eager call


def _native_copy():
    """The native CPU row copy (built with the CPU attention kernel), or None where it is unavailable; looked up
    once per process (its build is too), not on every copy. A plain global, not functools.cache: torch.compile
    then reads it instead of tracing into the build's lock."""
    global _NATIVE_COPY
    if _NATIVE_COPY is None:
        from scout_sglang.cpu_worker.native_kernel import load_native

        module = load_native().module
        _NATIVE_COPY = (getattr(module, "copy_rows", None),)
    return _NATIVE_COPY[0]
