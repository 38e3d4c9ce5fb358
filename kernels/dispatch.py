"""Choice of implementation for each device op: FlashInfer, Triton or torch.

`select_impl` is cached and logs each choice once. An explicit `impl=` passed to
an op wins over the automatic order; asking for one that is not available is an
error, never a silent fallback. Optional accelerators are imported here, lazily.
"""

from __future__ import annotations

import functools
import importlib.util
import logging

import torch

logger = logging.getLogger("scout_sglang.kernels")

IMPLS = ("flashinfer", "triton", "torch")

# Automatic order per op on CUDA; on the CPU every op runs its torch path
# (Triton runs on the CPU only in its interpreter, ~1000x slower).
CUDA_ORDER = {
    "digests": ("triton", "torch"),
    "score_blocks": ("triton", "torch"),
    "select_topk": ("torch",),  # stable torch.sort: a tuned device kernel already
    "sparse_decode": ("flashinfer", "triton", "torch"),
    "merge": ("flashinfer", "triton", "torch"),
    # The fused stages of the decode step (stage_*.py): one Triton launch each for the whole batch.
    "select_blocks": ("triton", "torch"),
    "split_lists": ("triton", "torch"),
    "append_token": ("triton", "torch"),
    "bring_in": ("triton", "torch"),
    "cpu_part": ("triton", "torch"),
    "estimate": ("triton", "torch"),
}


@functools.cache
def is_available(impl: str, device_type: str) -> bool:
    """Whether `impl` can run on a device of `device_type` in this process."""
    if impl == "torch":
        return True
    if impl == "triton" and device_type == "cpu":
        # Triton's interpreter runs kernels on CPU tensors (~1000x slower than
        # torch): usable when asked for explicitly, never chosen automatically.
        from scout_sglang.env import triton_interpreter_enabled

        return triton_interpreter_enabled() and importlib.util.find_spec("triton") is not None
    if device_type != "cuda":
        return False
    if impl == "triton":
        return importlib.util.find_spec("triton") is not None
    if impl == "flashinfer":
        return importlib.util.find_spec("flashinfer") is not None
    return False


@functools.cache
def select_impl(op: str, device_type: str, requested: str | None = None) -> str:
    """The implementation `op` uses for tensors on `device_type`.

    `requested` (from an op's `impl=` argument or the configuration) wins when
    it is available and supported for the op; otherwise this raises.
    """
    if op not in CUDA_ORDER:
        raise ValueError(f"unknown op {op!r}; expected one of {sorted(CUDA_ORDER)}")
    order = CUDA_ORDER[op] if device_type == "cuda" else ("torch",)
    if requested is not None:
        if requested not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS} or None, got {requested!r}")
        supported = CUDA_ORDER[op] + ("torch",)
        if requested not in supported or not is_available(requested, device_type):
            raise ValueError(
                f"impl {requested!r} is not available for {op} on {device_type} "
                f"(available here: {[i for i in supported if is_available(i, device_type)]})"
            )
        choice = requested
    else:
        choice = next(i for i in order if is_available(i, device_type))
    if not torch.compiler.is_compiling():  # traced code (torch.compile) cannot log; the eager call did
        logger.info("%s on %s uses the %s implementation", op, device_type, choice)
    return choice
