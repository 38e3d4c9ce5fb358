"""Tolerance table, skip markers and comparison helper shared by the tests.

Import as `from support import ...` (tests/ is on pytest's pythonpath).
"""

import contextlib
import importlib.util

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
HAS_TRITON = importlib.util.find_spec("triton") is not None
HAS_SGLANG = importlib.util.find_spec("sglang") is not None

# One tolerance per dtype, for outputs compared against the fp32 references
# started from the same rounded inputs (one table, here).
TOLERANCE = {
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2),
}
# LSE is always fp32 but inherits the rounding of the logits it was built from.
LSE_TOLERANCE = {
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=1e-2, rtol=1e-2),
}

# Logits after a whole (small) model: the per-op error accumulates over layers.
LOGITS_TOLERANCE = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.bfloat16: dict(atol=1e-1, rtol=5e-2),
}

requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
requires_triton = pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
requires_sglang = pytest.mark.skipif(not HAS_SGLANG, reason="needs sglang installed")

# Device on which Triton kernels are exercised: the GPU when present, else the
# CPU under TRITON_INTERPRET=1 (keep those sizes small: ~1000x slower).
TRITON_DEVICE = "cuda" if HAS_CUDA else "cpu"


def assert_close(actual, expected, dtype, *, lse=False):
    """Compare against a reference with the table's tolerance for `dtype`."""
    tol = (LSE_TOLERANCE if lse else TOLERANCE)[dtype]
    torch.testing.assert_close(actual.float().cpu(), expected.float().cpu(), **tol)


@contextlib.contextmanager
def launched_warps():
    """Within the block, the `num_warps` of each Triton launch (4: Triton's default where none is given) by kernel
    name; the launches run."""
    from scout_sglang.core.op_counter import unwrap_triton_launches, wrap_triton_launches

    class Owner:
        _inside = 0

    warps: dict[str, set] = {}

    def seen(kernel, args, kwargs):
        name = getattr(kernel, "__name__", None) or kernel.fn.__name__
        warps.setdefault(name, set()).add(kwargs.get("num_warps", 4))

    patched = wrap_triton_launches(Owner, run=True, on_launch=seen)
    try:
        yield warps
    finally:
        unwrap_triton_launches(patched)


def expected_warps(lookup: str) -> set:
    """The warps a fused stage launches with at the `lookup` fixture's lists: a wide row's, or the default."""
    from scout_sglang.kernels.triton.sizes import DEFAULT_WARPS, WIDE_ROW_WARPS

    return {WIDE_ROW_WARPS if lookup == "counted" else DEFAULT_WARPS}
