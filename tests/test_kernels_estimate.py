"""kernels.estimate: the estimate of the blocks a layer attends nowhere, merged with the parts it attends, on the
torch path and the Triton kernel, against the fp32 reference (reference.estimate_blocks) and its two identities:
with every block attended it adds nothing, and a block whose keys are all equal is estimated exactly."""

import pytest
import torch
from oracle.policy import attend_blocks
from support import TRITON_DEVICE, assert_close, requires_triton

from scout_sglang import kernels, reference
from scout_sglang.handoff_words import STATUS_DEADLINE, STATUS_OK
from scout_sglang.kernels.cpu_part import merge_cpu_part
from scout_sglang.kernels.estimate import CpuPartResult, UnattendedBlocks, merge_with_estimate
from scout_sglang.kernels.value_summary import value_summaries_torch
from scout_sglang.layout import PAD_BLOCK

IMPLS = ["torch", pytest.param("triton", marks=[requires_triton, pytest.mark.triton_interpret])]
BLOCK, HEADS, DIM, PAGES = 4, 2, 16, 40
NUM_FULL = [0, 1, 14, 23]  # a row with no full block, one with one; 23 blocks: two tiles of the kernel, one partial
SCALE = 0.3


def summaries(k_pages, v_pages):
    """The block summaries as the engine stores them: digests and value summaries of every page."""
    num_pages = k_pages.shape[0]
    dmin, dmax = (torch.zeros(num_pages, HEADS, DIM, dtype=k_pages.dtype) for _ in range(2))
    vmean = torch.zeros(num_pages, HEADS, 3, DIM, dtype=k_pages.dtype)
    rows = torch.arange(num_pages, dtype=torch.int32)
    kernels.digest_blocks(k_pages, rows, dmin, dmax, v_blocks=v_pages, value_summary=vmean)
    return dmin, dmax, vmean


def layer(group, *, dtype=torch.float32, resident=True, every_block=False, seed=0):
    """A layer's step: pages of K/V, a page table, selections best first (some counts short of K), resident rows.
    every_block: the selection and the resident rows hold every full block."""
    gen = torch.Generator().manual_seed(seed)
    k_pages, v_pages = (torch.randn(PAGES, HEADS, BLOCK, DIM, generator=gen).to(dtype) for _ in range(2))
    rows, width, num_resident = len(NUM_FULL), max(NUM_FULL) + 1, 3
    topk = width if every_block else 8
    table = torch.full((rows, width), PAD_BLOCK, dtype=torch.int32)
    selected = torch.full((rows, HEADS, topk), PAD_BLOCK, dtype=torch.int32)
    counts = torch.zeros(rows, HEADS, dtype=torch.int32)
    slots = torch.tensor([2, 0, 3, 1], dtype=torch.int32)  # rows and slots in another order
    resident_map = torch.full((5, HEADS, num_resident), PAD_BLOCK, dtype=torch.int32)
    for b, n in enumerate(NUM_FULL):
        table[b, :n] = torch.randperm(PAGES, generator=gen)[:n].to(torch.int32)
        for h in range(HEADS):
            order = torch.randperm(n, generator=gen).to(torch.int32)
            chosen = order[:n - 2] if every_block else order[:topk - h]  # head 1 selects one block fewer
            selected[b, h, :len(chosen)], counts[b, h] = chosen, len(chosen)
            rest = order[len(chosen):len(chosen) + num_resident]  # every_block: the last two are resident
            resident_map[int(slots[b]), h, :len(rest)] = rest
    dmin, dmax, vmean = summaries(k_pages, v_pages)
    blocks = UnattendedBlocks(dmin, dmax, vmean, table, torch.tensor(NUM_FULL, dtype=torch.int32), selected, counts,
                              resident_map if resident else None, slots if resident else None, block_size=BLOCK,
                              scale=SCALE)
    q = torch.randn(rows, HEADS * group, DIM, generator=gen).to(dtype)
    return q, blocks, (k_pages, v_pages)


def reference_estimate(q, blocks):
    """Per row, reference.estimate_blocks over the blocks neither selected nor resident, from the stored summaries."""
    out_o, out_lse = [], []
    for b, n in enumerate(blocks.num_full.tolist()):
        per_head = []
        for h in range(HEADS):
            held = set(blocks.selected[b, h, :int(blocks.counts[b, h])].tolist())
            if blocks.resident is not None:
                held |= set(blocks.resident[int(blocks.slots[b]), h].tolist())
            per_head.append([j for j in range(n) if j not in held])
        pages = blocks.block_table[b, :n].long()
        midpoint = (blocks.digest_min[pages].float() + blocks.digest_max[pages].float()) / 2
        o, lse = reference.estimate_blocks(q[b], midpoint, blocks.value_summary[pages].float(), per_head,
                                           block_size=BLOCK, scale=SCALE)
        out_o.append(o)
        out_lse.append(lse)
    return torch.stack(out_o), torch.stack(out_lse)


def moved(blocks, device):
    fields = {name: getattr(blocks, name) for name in UnattendedBlocks.__dataclass_fields__}
    return UnattendedBlocks(**{name: value.to(device) if isinstance(value, torch.Tensor) else value
                               for name, value in fields.items()})


def run(impl, q, o, lse, blocks, cpu=None):
    """merge_with_estimate on the impl's device -> (out, out_lse) on the CPU."""
    device = TRITON_DEVICE if impl == "triton" else "cpu"
    out, out_lse = torch.empty_like(o).to(device), torch.empty_like(lse).to(device)
    if cpu is not None:
        cpu = CpuPartResult(*(t.to(device) if t is not None else None for t in (
            cpu.cpu_o, cpu.cpu_lse, cpu.fb_o, cpu.fb_lse, cpu.status, cpu.zc_o, cpu.zc_lse)))
    merge_with_estimate(q.to(device), o.to(device), lse.to(device), out, blocks=moved(blocks, device), cpu=cpu,
                        out_lse=out_lse, impl=impl)
    return out.cpu(), out_lse.cpu()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("resident", [False, True])
def test_alone_the_estimate_is_the_reference_estimate_of_the_blocks_attended_nowhere(impl, group, resident):
    q, blocks, _ = layer(group, resident=resident)
    empty = torch.full(q.shape[:2], float("-inf"))  # no device part: out is the estimate alone
    out, out_lse = run(impl, q, torch.zeros_like(q), empty, blocks)
    expected_o, expected_lse = reference_estimate(q, blocks)
    assert_close(out, expected_o, torch.float32)
    assert_close(out_lse, expected_lse, torch.float32, lse=True)
    assert torch.isinf(out_lse[0]).all() and torch.isfinite(out_lse[2:]).all()  # no full block: nothing estimated


@pytest.mark.parametrize("impl", IMPLS)
def test_in_bf16_from_the_same_rounded_summaries(impl):
    q, blocks, _ = layer(2, dtype=torch.bfloat16, seed=1)
    o, lse = torch.zeros_like(q), torch.full(q.shape[:2], float("-inf"))
    out, out_lse = run(impl, q, o, lse, blocks)
    expected_o, expected_lse = reference_estimate(q, blocks)
    assert_close(out, expected_o, torch.bfloat16)
    assert_close(out_lse, expected_lse, torch.bfloat16, lse=True)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("status", [STATUS_OK, STATUS_DEADLINE])
def test_the_device_part_the_cpu_part_and_the_estimate_merge_by_lse(impl, status):
    q, blocks, _ = layer(4, seed=2)
    gen = torch.Generator().manual_seed(status)
    o, cpu_o, fb_o = (torch.randn(q.shape, generator=gen) for _ in range(3))
    lse, cpu_lse, fb_lse = (3 * torch.randn(q.shape[:2], generator=gen) for _ in range(3))
    lse[1, :2] = float("-inf")  # an empty device part in one row's heads
    cpu = CpuPartResult(cpu_o, cpu_lse, fb_o, fb_lse, torch.tensor([status], dtype=torch.int32))
    out, out_lse = run(impl, q, o, lse, blocks, cpu)
    part_o, part_lse = (cpu_o, cpu_lse) if status == STATUS_OK else (fb_o, fb_lse)
    merged = reference.merge_states(*reference.merge_states(o, lse, part_o, part_lse), *reference_estimate(q, blocks))
    assert_close(out, merged[0], torch.float32)
    assert_close(out_lse, merged[1], torch.float32, lse=True)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("empty", ["none", "zero_copy", "cpu"])
def test_the_cpu_splits_zero_copy_share_merges_with_the_other_parts(impl, empty):
    """With the CPU split the merge takes a third attended part, the zero-copy share; an empty one (or an empty CPU
    share) leaves the rest as it was."""
    q, blocks, _ = layer(4, seed=3)
    gen = torch.Generator().manual_seed(11)
    o, cpu_o, fb_o, zc_o = (torch.randn(q.shape, generator=gen) for _ in range(4))
    lse, cpu_lse, fb_lse, zc_lse = (3 * torch.randn(q.shape[:2], generator=gen) for _ in range(4))
    if empty != "none":
        (zc_lse if empty == "zero_copy" else cpu_lse).fill_(float("-inf"))
    cpu = CpuPartResult(cpu_o, cpu_lse, fb_o, fb_lse, torch.tensor([STATUS_OK], dtype=torch.int32), zc_o, zc_lse)
    out, out_lse = run(impl, q, o, lse, blocks, cpu)
    merged = reference.merge_states(*reference.merge_states(*reference.merge_states(o, lse, cpu_o, cpu_lse), zc_o,
                                                            zc_lse), *reference_estimate(q, blocks))
    assert_close(out, merged[0], torch.float32)
    assert_close(out_lse, merged[1], torch.float32, lse=True)


@pytest.mark.parametrize("impl", IMPLS)
def test_with_every_block_attended_the_estimate_adds_nothing(impl):
    q, blocks, _ = layer(2, every_block=True, seed=3)
    gen = torch.Generator().manual_seed(3)
    o, cpu_o, fb_o = (torch.randn(q.shape, generator=gen) for _ in range(3))
    lse, cpu_lse, fb_lse = (torch.randn(q.shape[:2], generator=gen) for _ in range(3))
    status = torch.tensor([STATUS_OK], dtype=torch.int32)
    out, _ = run(impl, q, o, lse, blocks, CpuPartResult(cpu_o, cpu_lse, fb_o, fb_lse, status))
    device = TRITON_DEVICE if impl == "triton" else "cpu"
    without = torch.empty_like(o).to(device)
    merge_cpu_part(*(t.to(device) for t in (o, lse, cpu_o, cpu_lse, fb_o, fb_lse, status)), without, impl=impl)
    assert torch.equal(out, without.cpu())  # exactly: the estimate is empty (lse = -inf)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_block_whose_keys_are_all_equal_is_estimated_exactly(impl):
    """Keys constant within each block: the selection attended exactly plus the estimate of the rest is dense
    attention over every block."""
    q, blocks, (k_pages, v_pages) = layer(2, resident=False, seed=4)
    k_pages = k_pages[:, :, :1].expand_as(k_pages).contiguous()
    blocks.digest_min, blocks.digest_max, blocks.value_summary = summaries(k_pages, v_pages)
    dense_o, device_o, device_lse = torch.zeros_like(q), torch.zeros_like(q), torch.zeros(q.shape[:2])
    for b, n in enumerate(NUM_FULL):
        pages = blocks.block_table[b, :n].long()
        keys = k_pages[pages].permute(0, 2, 1, 3).reshape(-1, HEADS, DIM)  # [n * S, Hkv, D] in block order
        values = v_pages[pages].permute(0, 2, 1, 3).reshape(-1, HEADS, DIM)
        dense_o[b] = reference.dense_decode(q[b], keys, values, scale=SCALE)[0]
        selection = [blocks.selected[b, h, :int(blocks.counts[b, h])].tolist() for h in range(HEADS)]
        device_o[b], device_lse[b] = attend_blocks(q[b], keys, values, selection, block_size=BLOCK, scale=SCALE)
    out, _ = run(impl, q, device_o, device_lse, blocks)
    assert_close(out, dense_o, torch.float32)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block", [BLOCK, 3])  # 3: the kernel's tile has a padding row, which no sum may see
def test_the_digests_write_the_value_summary_of_each_block(impl, dtype, block):
    device = TRITON_DEVICE if impl == "triton" else "cpu"
    gen = torch.Generator().manual_seed(5)
    k_pages, v_pages = (torch.randn(6, HEADS, block, DIM, generator=gen).to(dtype) for _ in range(2))
    dmin, dmax = (torch.full((8, HEADS, DIM), 7.0, dtype=dtype, device=device) for _ in range(2))
    summary = torch.full((8, HEADS, 3, DIM), 7.0, dtype=dtype, device=device)
    kernels.update_digests(k_pages.to(device), torch.tensor([4, 1], dtype=torch.int32, device=device), dmin, dmax,
                           rows=torch.tensor([6, 2], dtype=torch.int32, device=device), v_cache=v_pages.to(device),
                           value_summary=summary, impl=impl)
    _, expected = reference.block_summaries(k_pages[[4, 1]].transpose(1, 2).reshape(-1, HEADS, DIM),
                                            v_pages[[4, 1]].transpose(1, 2).reshape(-1, HEADS, DIM), block)
    summary = summary.cpu()
    assert_close(summary[[6, 2]], expected, dtype)
    assert torch.all(summary[[0, 1, 3, 4, 5, 7]] == 7.0)
    with pytest.raises(ValueError, match="value_summary go together"):
        kernels.update_digests(k_pages, torch.tensor([0], dtype=torch.int32), dmin.cpu(), dmax.cpu(),
                               value_summary=summary)


def test_the_axis_is_the_leading_singular_direction_and_the_slope_its_value():
    """A block whose value-key cross-covariance has one dominant direction: the summary's axis is the leading right
    singular vector of C (up to sign), its slope C x, and the estimate of the block alone follows the query's
    softmax-weighted value to first order (closer than the mean value alone)."""
    gen = torch.Generator().manual_seed(6)
    size, dim = 16, 8
    keys = torch.randn(size, dim, generator=gen)
    direction = torch.randn(dim, generator=gen)
    values = torch.randn(dim, generator=gen) + 2.0 * (keys @ direction)[:, None] * torch.randn(dim, generator=gen) \
        + 0.05 * torch.randn(size, dim, generator=gen)
    summary = reference.value_summary_of_block(keys, values)
    cross = (values - values.mean(0)).T @ (keys - keys.mean(0)) / size
    _, sigma, right = torch.linalg.svd(cross)
    assert sigma[1] < 0.2 * sigma[0]  # the case: one dominant direction
    assert abs(float(summary[2] @ right[0])) > 0.999
    assert_close(summary[1], cross @ summary[2], torch.float32)
    torch_summary = value_summaries_torch(keys[None, None], values[None, None])[0, 0]
    assert_close(torch_summary, summary, torch.float32)
    q = 0.3 * torch.randn(1, dim, generator=gen)
    scale = 0.5
    exact = torch.softmax(scale * keys @ q[0], dim=0) @ values
    key_summary = ((keys.amin(0) + keys.amax(0)) / 2).view(1, 1, dim)
    estimate, _ = reference.estimate_blocks(q, key_summary, summary.view(1, 1, 3, dim), [[0]], block_size=size,
                                            scale=scale)
    assert (estimate[0] - exact).norm() < 0.5 * (values.mean(0) - exact).norm()


def test_mismatched_arguments_are_refused_by_name():
    q, blocks, _ = layer(1)
    o, lse = torch.zeros_like(q), torch.zeros(q.shape[:2])
    blocks.slots = None
    with pytest.raises(ValueError, match="resident and slots go together"):
        merge_with_estimate(q, o, lse, torch.empty_like(o), blocks=blocks)
    _, blocks, _ = layer(1)
    blocks.value_summary = blocks.value_summary[..., :8].contiguous()
    with pytest.raises(ValueError, match="value_summary must have shape"):
        merge_with_estimate(q, o, lse, torch.empty_like(o), blocks=blocks)


@requires_triton
@pytest.mark.triton_interpret
@pytest.mark.parametrize("slice_blocks, given", [(8, True), (5, False)])
@pytest.mark.parametrize("resident", [False, True])
def test_a_long_table_is_walked_in_slices_whose_partials_merge_to_the_reference(monkeypatch, slice_blocks, given,
                                                                                resident):
    """A table of more than SPLIT_BLOCKS blocks: one program per (row, KV head, slice) writes its partials to the
    workspace (given, or allocated), the merge combines them; slices past a row's full blocks, a row with none
    and a slice boundary inside a tile all give the reference's estimate, merged with the device and CPU parts."""
    from scout_sglang.kernels.triton import estimate as triton_estimate

    monkeypatch.setattr(triton_estimate, "SPLIT_BLOCKS", slice_blocks)
    q, blocks, _ = layer(4, resident=resident, seed=3)
    width = blocks.block_table.shape[1]
    assert triton_estimate.estimate_splits(width) > 2
    gen = torch.Generator().manual_seed(5)
    o, cpu_o, fb_o = (torch.randn(q.shape, generator=gen) for _ in range(3))
    lse, cpu_lse, fb_lse = (3 * torch.randn(q.shape[:2], generator=gen) for _ in range(3))
    cpu = CpuPartResult(cpu_o, cpu_lse, fb_o, fb_lse, torch.tensor([STATUS_OK], dtype=torch.int32))
    if given:
        words = triton_estimate.workspace_words(q.shape[0], q.shape[1], DIM, width)
        blocks.workspace = torch.full((words,), float("nan"))  # every word read is written first
    out, out_lse = run("triton", q, o, lse, blocks, cpu)
    merged = reference.merge_states(*reference.merge_states(o, lse, cpu_o, cpu_lse), *reference_estimate(q, blocks))
    assert_close(out, merged[0], torch.float32)
    assert_close(out_lse, merged[1], torch.float32, lse=True)


@requires_triton
@pytest.mark.triton_interpret
def test_a_workspace_too_small_for_the_slices_is_refused(monkeypatch):
    from scout_sglang.kernels.triton import estimate as triton_estimate

    monkeypatch.setattr(triton_estimate, "SPLIT_BLOCKS", 8)
    q, blocks, _ = layer(4, seed=3)
    blocks.workspace = torch.zeros(10)
    with pytest.raises(ValueError, match="workspace holds 10"):
        run("triton", q, torch.zeros_like(q), torch.full(q.shape[:2], float("-inf")), blocks)


def test_the_slices_cover_a_table_once_in_whole_tiles():
    """slice_plan: the slices cover every block of the table, none is empty, at most MAX_SPLITS, and a slice longer
    than a tile is whole tiles (the engine's tables are max_blocks wide, e.g. 2049 blocks at 64k)."""
    from scout_sglang.kernels.triton.estimate import _BLOCK_N, MAX_SPLITS, SPLIT_BLOCKS, slice_plan

    assert slice_plan(SPLIT_BLOCKS) == (1, SPLIT_BLOCKS)
    for width in (SPLIT_BLOCKS + 1, 1025, 2049, 4097, 10**5):
        splits, size = slice_plan(width)
        assert 1 < splits <= MAX_SPLITS and (splits - 1) * size < width <= splits * size, width
        assert size % _BLOCK_N == 0, width
