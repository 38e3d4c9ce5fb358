"""kernels.merge_cpu_part: the device part merged with the worker's CPU part when the layer's status is OK, with
the fallback's otherwise; the Triton kernel against its torch path and both against the reference merge."""

import pytest
import torch
from support import TRITON_DEVICE, assert_close, requires_triton

from scout_sglang import reference
from scout_sglang.handoff_words import STATUS_DEADLINE, STATUS_ERROR, STATUS_OK
from scout_sglang.kernels.cpu_part import merge_cpu_part

IMPLS = ["torch", pytest.param("triton", marks=[requires_triton, pytest.mark.triton_interpret])]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("status", [STATUS_OK, STATUS_ERROR, STATUS_DEADLINE])
def test_the_status_picks_the_worker_or_the_fallback(impl, status):
    device = TRITON_DEVICE if impl == "triton" else "cpu"
    gen = torch.Generator().manual_seed(status)
    o, cpu_o, fb_o = (torch.randn(3, 4, 16, generator=gen) for _ in range(3))
    lse, cpu_lse, fb_lse = (3 * torch.randn(3, 4, generator=gen) for _ in range(3))
    if status == STATUS_OK:
        fb_o.fill_(float("nan"))  # never computed when the worker's part is good: must not leak in
        fb_lse.fill_(float("nan"))
    out = torch.empty_like(o)
    moved = [t.to(device) for t in (o, lse, cpu_o, cpu_lse, fb_o, fb_lse)]
    out = out.to(device)
    merge_cpu_part(*moved, torch.tensor([status], dtype=torch.int32, device=device), out, impl=impl)
    other_o, other_lse = (cpu_o, cpu_lse) if status == STATUS_OK else (fb_o, fb_lse)
    expected, _ = reference.merge_states(o, lse, other_o, other_lse)
    assert_close(out.cpu(), expected, torch.float32)
