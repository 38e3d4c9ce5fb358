"""Choice between the native kernel and the torch path for the CPU part.

`select_impl` is cached and logs each choice once. "auto" takes the native
kernel when it builds on this host, else the torch path; an explicit "native"
that cannot be had is an error, never a silent fallback.
"""

from __future__ import annotations

import functools
import logging

from scout_sglang.cpu_worker.native_kernel import NativeKernel, load_native
from scout_sglang.cpu_worker.torch_kernel import TorchKernel

logger = logging.getLogger("scout_sglang.cpu_worker")

IMPLS = ("auto", "native", "torch")


@functools.cache
def select_impl(requested: str = "auto") -> str:
    """Return "native" or "torch" for a requested impl ("auto", "native", "torch").

    Builds the native kernel on first use (may take a minute; cached on disk).
    Raises ValueError for an unknown name, RuntimeError when "native" is
    requested and cannot be built.
    """
    if requested not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {requested!r}")
    if requested == "torch":
        choice = "torch"
    else:
        build = load_native()
        if build.module is None:
            if requested == "native":
                raise RuntimeError(f"impl='native' was requested but the native CPU kernel is unavailable: {build.error}")
            choice = "torch"
        else:
            choice = "native"
    logger.info("CPU attention (impl=%r) uses the %s implementation", requested, choice)
    return choice


def make_kernel(impl: str) -> NativeKernel | TorchKernel:
    """The kernel object for a choice of select_impl()."""
    if impl == "native":
        return NativeKernel(load_native().module)
    if impl == "torch":
        return TorchKernel()
    raise ValueError(f"impl must be 'native' or 'torch', got {impl!r}")
