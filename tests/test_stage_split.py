"""The split stage (kernels.stage_split): the Triton kernel and the torch path against lists built row by row
with the reference split."""

import pytest
import torch
from support import TRITON_DEVICE, expected_warps, launched_warps, requires_triton

from scout_sglang import reference
from scout_sglang.kernels.stage_split import split_lists
from scout_sglang.kernels.step_counters import BAD_PAGES, CPU, DROPPED, NUM_COUNTERS, ZERO_COPY
from scout_sglang.layout import PAD_BLOCK

IMPLS = ["torch", pytest.param("triton", marks=[requires_triton, pytest.mark.triton_interpret])]


def case(*, batch=4, heads=2, topk=6, width=4, resident=3, seed=0, num_blocks=20):
    """Random selections of distinct blocks, windows, resident rows (with empty slots) and page tables."""
    gen = torch.Generator().manual_seed(seed)
    selected = torch.full((batch, heads, topk), PAD_BLOCK, dtype=torch.int32)
    counts = torch.randint(0, topk + 1, (batch, heads), generator=gen, dtype=torch.int32)
    counts[0, 0] = topk  # a full selection
    for b in range(batch):
        for h in range(heads):
            selected[b, h, : counts[b, h]] = torch.randperm(num_blocks, generator=gen)[: counts[b, h]].int()
    forced = torch.full((batch, width), PAD_BLOCK, dtype=torch.int32)
    window_pages = torch.full((batch, width), PAD_BLOCK, dtype=torch.int32)
    for b in range(batch):
        n = int(torch.randint(0, width + 1, (1,), generator=gen))
        forced[b, : max(n - 1, 0)] = selected[b, 0, : max(n - 1, 0)].clamp(min=0)  # some selected blocks are forced
        window_pages[b, :n] = torch.arange(100 + 10 * b, 100 + 10 * b + n, dtype=torch.int32)
    slots = torch.tensor([5, 1, 3, 0][:batch])
    rows = torch.randint(0, num_blocks, (6, heads, resident), generator=gen, dtype=torch.int32)
    rows[torch.rand(rows.shape, generator=gen) < 0.3] = PAD_BLOCK
    resident_pages = torch.arange(batch * resident, dtype=torch.int32).view(batch, resident) + 500
    host_table = torch.randperm(batch * num_blocks, generator=gen).int().view(batch, num_blocks) + 1000
    q = torch.randn(batch, heads * 2, 8, generator=gen).to(torch.bfloat16)  # staged in its own dtype
    return dict(selected=selected, counts=counts, forced=forced, window_pages=window_pages, slots=slots,
                resident=rows, resident_pages=resident_pages, host_table=host_table, q=q)


def run(impl, c, *, capacity, with_resident=True, only_selected=False, cpu=True, caps=None, num_host_pages=None,
        counted=True):
    device = TRITON_DEVICE if impl == "triton" else "cpu"
    d = {k: v.to(device) for k, v in c.items()}
    batch, heads, _ = c["selected"].shape
    width = c["forced"].shape[1]
    num_resident = c["resident"].shape[2] if with_resident else 0
    out = dict(device_pages=torch.full((batch, heads, num_resident + width), 77, dtype=torch.int32, device=device),
               device_counts=torch.zeros(batch, heads, dtype=torch.int32, device=device),
               cpu_blocks=torch.full((batch, heads, capacity), 77, dtype=torch.int32, device=device),
               cpu_pages=torch.full((batch, heads, capacity), 77, dtype=torch.int32, device=device),
               cpu_counts=torch.zeros(batch, heads, dtype=torch.int32, device=device),
               q=torch.zeros(c["q"].shape, dtype=torch.bfloat16, device=device),
               counters=torch.zeros(NUM_COUNTERS, dtype=torch.int32, device=device))
    resident = dict(resident=d["resident"], slots=d["slots"], resident_pages=d["resident_pages"]) if with_resident else {}
    cpu_part = dict(host_table=d["host_table"], capacity=capacity, out_cpu_blocks=out["cpu_blocks"],
                    out_cpu_pages=out["cpu_pages"], out_cpu_counts=out["cpu_counts"], q=d["q"], out_q=out["q"],
                    num_host_pages=num_host_pages, counters=out["counters"] if counted else None) if cpu else {}
    if caps is not None:  # the CPU split: the workers' share per row, the rest to the zero-copy list
        out |= dict(zero_copy_pages=torch.full((batch, heads, capacity), 77, dtype=torch.int32, device=device),
                    zero_copy_counts=torch.full((batch, heads), 77, dtype=torch.int32, device=device),
                    listed_counts=torch.full((batch, heads), 77, dtype=torch.int32, device=device))
        plan = torch.zeros(batch, 3, dtype=torch.int32, device=device)
        plan[:, 1] = torch.tensor(caps, dtype=torch.int32)
        cpu_part |= dict(cpu_cap=plan[:, 1], out_zero_copy_pages=out["zero_copy_pages"],
                         out_zero_copy_counts=out["zero_copy_counts"], out_listed_counts=out["listed_counts"])
    split_lists(d["selected"], d["counts"], forced_blocks=d["forced"], window_pages=d["window_pages"],
                out_device_pages=out["device_pages"], out_device_counts=out["device_counts"],
                only_selected_resident=only_selected, impl=impl, **resident, **cpu_part)
    out["counts_after"] = d["counts"]
    return {k: v.cpu() for k, v in out.items()}


def expected(c, *, capacity, with_resident=True, only_selected=False):
    batch, heads, _ = c["selected"].shape
    device, cpu, dropped = [], [], 0
    for b in range(batch):
        window = [p for p in c["window_pages"][b].tolist() if p != PAD_BLOCK]
        forced = [j for j in c["forced"][b].tolist() if j != PAD_BLOCK]
        device_rows, cpu_rows = [], []
        for h in range(heads):
            selected = c["selected"][b, h, : c["counts"][b, h]].tolist()
            row = c["resident"][c["slots"][b], h].tolist() if with_resident else []
            held_slots = [r for r, j in enumerate(row) if j != PAD_BLOCK and (not only_selected or j in selected)]
            device_rows.append([int(c["resident_pages"][b, r]) for r in held_slots] + window)
            blocks, past = reference.split_selection(selected, forced + [j for j in row if j != PAD_BLOCK],
                                                     capacity=capacity)
            cpu_rows.append(blocks)
            dropped += past
        device.append(device_rows)
        cpu.append(cpu_rows)
    return device, cpu, dropped


def listed(rows, counts, b, h):
    return rows[b, h, : counts[b, h]].tolist()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("capacity", [0, 2, 6])
@pytest.mark.parametrize("seed", [0, 1])
def test_device_and_cpu_lists_equal_the_reference_split(impl, capacity, seed):
    check_against_reference(impl, case(seed=seed), capacity)


@pytest.mark.parametrize("impl", IMPLS)
def test_rows_as_wide_as_a_resident_first_request_split_like_the_reference(impl, lookup):
    """Resident-first: a selection and a resident row of most of a request's blocks (linear lookups in Triton),
    the table's last block id both selected and resident."""
    c = case(batch=2, topk=100, resident=90, num_blocks=128, seed=4)
    last = 127
    for b in range(2):
        for h in range(2):
            row = c["selected"][b, h]
            row[row == last] = row[0].item()
            row[0] = last
            c["counts"][b, h] = max(int(c["counts"][b, h]), 1)
            c["resident"][c["slots"][b], h, 0] = last
    with launched_warps() as warps:
        check_against_reference(impl, c, 40)
    if impl == "triton":  # a wide row's program spreads over more warps (sizes.warps_for)
        assert warps == {"_split_lists_kernel": expected_warps(lookup)}


@pytest.mark.parametrize("impl", IMPLS)
def test_exact_resident_first_rows_list_every_held_page_and_nothing_for_the_cpu(impl, lookup):
    """Exact rows (every block outside the window resident, in the row's first columns) and their near misses, whose
    wide split takes shortcuts (no compaction of a row held from its first column, no lookup when the row and the
    window hold every block up to the largest selected one): each lists what the reference does. Block 0 (a sink)
    held by a row in place of another block must not count twice."""
    gen = torch.Generator().manual_seed(9)
    num_full, topk, columns = 40, 40, 45
    selected = torch.full((2, 2, topk), PAD_BLOCK, dtype=torch.int32)
    for b in range(2):
        for h in range(2):
            selected[b, h] = torch.randperm(num_full, generator=gen).int()
    counts = torch.full((2, 2), num_full, dtype=torch.int32)
    counts[0, 1] = 10  # a selection of some of the blocks, all held
    resident = torch.full((2, 2, columns), PAD_BLOCK, dtype=torch.int32)
    for b in range(2):
        for h in range(2):
            resident[b, h, : num_full - 3] = (torch.randperm(num_full - 3, generator=gen) + 1).int()  # blocks 1..37
    missing = int(resident[1, 0, 7])
    resident[1, 0, 7] = 0  # block 0 is a forced (sink) block: its column counts for nothing, `missing` is off-device
    resident[1, 1, 40] = resident[1, 1, 3]  # every block held, with a hole at column 3
    resident[1, 1, 3] = PAD_BLOCK
    c = dict(selected=selected, counts=counts, slots=torch.tensor([0, 1]), resident=resident,
             forced=torch.tensor([[0, 38, 39, PAD_BLOCK]] * 2, dtype=torch.int32),
             window_pages=torch.tensor([[100, 101, 102, 103], [200, 201, 202, 203]], dtype=torch.int32),
             resident_pages=torch.arange(2 * columns, dtype=torch.int32).view(2, columns) + 500,
             host_table=torch.arange(2 * 64, dtype=torch.int32).view(2, 64) + 1000,
             q=torch.randn(2, 4, 8, generator=gen).to(torch.bfloat16))
    check_against_reference(impl, c, 8)
    out = run(impl, c, capacity=8)
    assert out["cpu_counts"].tolist() == [[0, 0], [1, 0]] and out["cpu_blocks"][1, 0, 0] == missing
    assert out["device_counts"].tolist() == [[37 + 4, 37 + 4], [37 + 4, 37 + 4]]


def check_against_reference(impl, c, capacity):
    out = run(impl, c, capacity=capacity)
    device, cpu, dropped = expected(c, capacity=capacity)
    for b in range(c["selected"].shape[0]):
        for h in range(2):
            assert listed(out["device_pages"], out["device_counts"], b, h) == device[b][h], (b, h)
            assert listed(out["cpu_blocks"], out["cpu_counts"], b, h) == cpu[b][h], (b, h)
            pages = listed(out["cpu_pages"], out["cpu_counts"], b, h)
            assert pages == [int(c["host_table"][b, j]) for j in cpu[b][h]]
            assert set(out["device_pages"][b, h, out["device_counts"][b, h]:].tolist()) <= {PAD_BLOCK}
            assert set(out["cpu_pages"][b, h, out["cpu_counts"][b, h]:].tolist()) <= {PAD_BLOCK}
    assert out["counters"][CPU] == out["cpu_counts"].sum() and out["counters"][DROPPED] == dropped
    assert torch.equal(out["q"], c["q"])


@pytest.mark.parametrize("impl", IMPLS)
def test_infinigen_lists_only_selected_resident_blocks_and_hgca_only_the_window(impl):
    c = case(seed=3)
    infinigen = run(impl, c, capacity=0, only_selected=True, cpu=False)
    device, _, _ = expected(c, capacity=0, only_selected=True)
    hgca = run(impl, c, capacity=4, with_resident=False)
    window_only, cpu, _ = expected(c, capacity=4, with_resident=False)
    for b in range(4):
        for h in range(2):
            assert listed(infinigen["device_pages"], infinigen["device_counts"], b, h) == device[b][h]
            assert listed(hgca["device_pages"], hgca["device_counts"], b, h) == window_only[b][h]
            assert listed(hgca["cpu_blocks"], hgca["cpu_counts"], b, h) == cpu[b][h]


def test_a_partial_cpu_part_is_refused_by_name():
    c = case()
    with pytest.raises(ValueError, match="the CPU part needs"):
        split_lists(c["selected"], c["counts"], forced_blocks=c["forced"], window_pages=c["window_pages"],
                    out_device_pages=torch.zeros(4, 2, 4, dtype=torch.int32),
                    out_device_counts=torch.zeros(4, 2, dtype=torch.int32), host_table=c["host_table"])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("caps", [[0, 0, 0, 0], [9, 9, 9, 9], [-1, 1, 2, 5]], ids=["none", "all", "mixed"])
def test_the_cpu_split_gives_every_listed_block_to_exactly_one_share(impl, caps):
    """Whatever the cap: the workers' share is the reference list's first `cap` entries, the zero-copy list the
    rest in order (as host pages), their union the whole list with no block twice; the counters add up."""
    c = case(seed=2)
    out = run(impl, c, capacity=6, caps=caps)
    _, cpu, dropped = expected(c, capacity=6)
    for b in range(4):
        for h in range(2):
            workers, zero_copy = reference.split_shares(cpu[b][h], caps[b])
            assert listed(out["cpu_pages"], out["cpu_counts"], b, h) == [int(c["host_table"][b, j]) for j in workers]
            assert listed(out["zero_copy_pages"], out["zero_copy_counts"], b, h) == [
                int(c["host_table"][b, j]) for j in zero_copy], (b, h)
            assert listed(out["cpu_blocks"], out["listed_counts"], b, h) == cpu[b][h]
            assert set(out["cpu_pages"][b, h, out["cpu_counts"][b, h]:].tolist()) <= {PAD_BLOCK}
            assert set(out["zero_copy_pages"][b, h, out["zero_copy_counts"][b, h]:].tolist()) <= {PAD_BLOCK}
    assert out["counters"][CPU] == out["cpu_counts"].sum() and out["counters"][DROPPED] == dropped
    assert out["counters"][ZERO_COPY] == out["zero_copy_counts"].sum()
    assert out["counters"][CPU] + out["counters"][ZERO_COPY] == out["listed_counts"].sum() > 0


@pytest.mark.parametrize("impl", IMPLS)
def test_a_host_page_outside_the_store_is_counted_and_listed_as_page_0_in_either_share(impl):
    """A corrupt page table (a page past the store, a PAD entry of a block past the allocation) never reaches a
    reader: the entry stays in its share, as page 0, and BAD_PAGES counts it; every other entry is unchanged."""
    c = case(seed=2)
    num_host_pages = int(c["host_table"].max()) + 1
    clean = run(impl, c, capacity=6, caps=[1, 1, 1, 1], num_host_pages=num_host_pages)
    workers_block, zero_copy_block = int(clean["cpu_blocks"][0, 0, 0]), int(clean["cpu_blocks"][0, 0, 1])
    c["host_table"][0, workers_block] = num_host_pages  # one past the store, in the workers' share
    c["host_table"][0, zero_copy_block] = PAD_BLOCK  # negative, in the zero-copy share
    out = run(impl, c, capacity=6, caps=[1, 1, 1, 1], num_host_pages=num_host_pages)
    assert clean["counters"][BAD_PAGES] == 0
    bad = sum(int(b) in (workers_block, zero_copy_block)
              for b in out["cpu_blocks"][0][out["cpu_blocks"][0] != PAD_BLOCK])  # either block may be in both heads
    assert out["counters"][BAD_PAGES] == bad >= 2
    assert out["cpu_pages"][0, 0, 0] == 0 and out["zero_copy_pages"][0, 0, 0] == 0
    for name in ("cpu_pages", "zero_copy_pages"):
        changed = out[name] != clean[name]
        assert (out[name][changed] == 0).all() and changed[1:].sum() == 0, name
    assert torch.equal(out["cpu_counts"], clean["cpu_counts"]) and torch.equal(out["listed_counts"], clean["listed_counts"])
    assert out["counters"][CPU] == clean["counters"][CPU] and out["counters"][ZERO_COPY] == clean["counters"][ZERO_COPY]


def test_a_partial_split_is_refused_by_name():
    c = case()
    with pytest.raises(ValueError, match="the CPU split needs"):
        split_lists(c["selected"], c["counts"], forced_blocks=c["forced"], window_pages=c["window_pages"],
                    out_device_pages=torch.zeros(4, 2, 7, dtype=torch.int32),
                    out_device_counts=torch.zeros(4, 2, dtype=torch.int32), resident=c["resident"], slots=c["slots"],
                    resident_pages=c["resident_pages"], host_table=c["host_table"], capacity=4,
                    out_cpu_blocks=torch.zeros(4, 2, 4, dtype=torch.int32),
                    out_cpu_pages=torch.zeros(4, 2, 4, dtype=torch.int32),
                    out_cpu_counts=torch.zeros(4, 2, dtype=torch.int32), q=c["q"], out_q=torch.zeros_like(c["q"]),
                    cpu_cap=torch.zeros(4, dtype=torch.int32))


@pytest.mark.parametrize("impl", IMPLS)
def test_without_a_counters_row_the_split_writes_the_same_lists_and_nothing_else(impl):
    """counters=None: the lists equal a counted call's, and no count lands in another tensor (the Triton kernel's
    unused pointer stands for the selection's counts)."""
    c = case(seed=3)
    counts = c["counts"].clone()  # run() may hand the case's own tensors to the kernel
    counted = run(impl, c, capacity=6, caps=[0, 1, 2, 6], num_host_pages=5000)
    uncounted = run(impl, c, capacity=6, caps=[0, 1, 2, 6], num_host_pages=5000, counted=False)
    assert counted["counters"].sum() > 0 and uncounted["counters"].sum() == 0
    for name in counted:
        if name != "counters":
            assert torch.equal(counted[name], uncounted[name]), name
    assert torch.equal(uncounted["counts_after"], counts)
