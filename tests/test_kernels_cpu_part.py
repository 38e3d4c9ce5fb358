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


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("status", [STATUS_OK, STATUS_DEADLINE])
@pytest.mark.parametrize("empty", ["none", "device", "cpu", "zero_copy", "all"])
def test_the_three_way_merge_of_the_cpu_split_keeps_the_empty_side_rules(impl, status, empty):
    """The device part, the CPU part (the worker's or the fallback's) and the split's zero-copy share, merged by LSE
    in one launch: the reference merge of the three; an empty side (lse = -inf) leaves the others unchanged,
    whichever it is; all empty give o = 0."""
    device = TRITON_DEVICE if impl == "triton" else "cpu"
    gen = torch.Generator().manual_seed(7 + status)
    o, cpu_o, fb_o, zc_o = (torch.randn(3, 4, 16, generator=gen) for _ in range(4))
    lse, cpu_lse, fb_lse, zc_lse = (3 * torch.randn(3, 4, generator=gen) for _ in range(4))
    sides = {"device": lse, "cpu": cpu_lse if status == STATUS_OK else fb_lse, "zero_copy": zc_lse}
    for name, side in sides.items():
        if empty in (name, "all"):
            side.fill_(float("-inf"))
    out = torch.full_like(o, 5.0).to(device)
    moved = [t.to(device) for t in (o, lse, cpu_o, cpu_lse, fb_o, fb_lse)]
    merge_cpu_part(*moved, torch.tensor([status], dtype=torch.int32, device=device), out,
                   zero_copy=(zc_o.to(device), zc_lse.to(device)), impl=impl)
    other_o, other_lse = (cpu_o, cpu_lse) if status == STATUS_OK else (fb_o, fb_lse)
    expected, _ = reference.merge_states(*reference.merge_states(o, lse, other_o, other_lse), zc_o, zc_lse)
    assert_close(out.cpu(), expected, torch.float32)
    if empty == "all":
        assert torch.equal(out.cpu(), torch.zeros_like(o))
    elif empty != "none":  # two sides left: their plain two-way merge
        left = [(x, l) for name, x, l in (("device", o, lse), ("cpu", other_o, other_lse), ("zero_copy", zc_o, zc_lse))
                if name != empty]
        assert_close(out.cpu(), reference.merge_states(*left[0], *left[1])[0], torch.float32)
