"""The resident-buffer stage (kernels.stage_recall): admission, first fill and both recalls, in the Triton kernel
and the torch path, against the policy written out in tests/oracle/policy.py, and the copies they make."""

import pytest
import torch
from oracle import policy
from support import TRITON_DEVICE, expected_warps, launched_warps, requires_triton

from scout_sglang.kernels.stage_recall import bring_in
from scout_sglang.kernels.step_counters import DROPPED, NUM_COUNTERS, RECALLED
from scout_sglang.layout import PAD_BLOCK

IMPLS = ["torch", pytest.param("triton", marks=[requires_triton, pytest.mark.triton_interpret])]
HEADS, BLOCK, DIM, RESIDENT, BLOCKS = 2, 4, 8, 3, 12


def case(seed, batch=4, topk=5, resident=RESIDENT, blocks=BLOCKS):
    gen = torch.Generator().manual_seed(seed)
    slots = torch.tensor([3, 0, 5, 1][:batch], dtype=torch.int32)
    rows = torch.randint(0, blocks, (6, HEADS, resident), generator=gen, dtype=torch.int32)
    for s in range(6):  # distinct blocks per row, some empty
        for h in range(HEADS):
            row = torch.randperm(blocks, generator=gen)[:resident].int()
            row[torch.rand(resident, generator=gen) < 0.35] = PAD_BLOCK
            rows[s, h] = row
    counts = torch.randint(0, topk + 1, (batch, HEADS), generator=gen, dtype=torch.int32)
    selected = torch.full((batch, HEADS, topk), PAD_BLOCK, dtype=torch.int32)
    for b in range(batch):
        for h in range(HEADS):
            selected[b, h, : counts[b, h]] = torch.randperm(blocks, generator=gen)[: counts[b, h]].int()
    forced = torch.full((batch, 3), PAD_BLOCK, dtype=torch.int32)
    forced[:, 0] = selected[:, 0, 0].clamp(min=0)  # one selected block is forced in each request
    scores = (torch.randn(batch, HEADS, blocks, generator=gen) * 2).round()  # ties among scores
    cpu_counts = torch.randint(0, 4, (batch, HEADS), generator=gen, dtype=torch.int32)
    cpu_blocks = torch.full((batch, HEADS, 3), PAD_BLOCK, dtype=torch.int32)
    for b in range(batch):
        for h in range(HEADS):
            cpu_blocks[b, h, : cpu_counts[b, h]] = torch.randperm(blocks, generator=gen)[: cpu_counts[b, h]].int()
    num_host = max(40, blocks + 28)
    host_k = torch.randn(num_host, HEADS, BLOCK, DIM, generator=gen)
    host_v = torch.randn(num_host, HEADS, BLOCK, DIM, generator=gen)
    host_table = torch.stack([torch.randperm(num_host - 1, generator=gen)[:blocks] for _ in range(batch)]).int()
    dev_k, dev_v = torch.zeros(1 + batch * (resident + 1), HEADS, BLOCK, DIM), torch.zeros(1 + batch * (resident + 1), HEADS, BLOCK, DIM)
    resident_pages = torch.arange(batch * resident, dtype=torch.int32).view(batch, resident)
    window_page = batch * resident + torch.arange(batch, dtype=torch.int32)  # one window page per request
    dev_k[window_page.long()] = torch.randn(batch, HEADS, BLOCK, DIM, generator=gen)
    dev_v[window_page.long()] = torch.randn(batch, HEADS, BLOCK, DIM, generator=gen)
    leaving = torch.tensor([7, PAD_BLOCK, 2, 11][:batch], dtype=torch.int32)
    ready = torch.zeros(6, HEADS, dtype=torch.int8)
    ready[0] = 1  # slot 0 was filled before
    return dict(slots=slots, resident=rows, selected=selected, counts=counts, forced=forced, scores=scores,
                cpu_blocks=cpu_blocks, cpu_counts=cpu_counts, host_k=host_k, host_v=host_v, host_table=host_table,
                dev_k=dev_k, dev_v=dev_v, resident_pages=resident_pages, window_page=window_page, leaving=leaving,
                ready=ready, num_full=torch.tensor([6, 6, 0, 9][:batch], dtype=torch.int32))


def run(impl, c, *, quota, **phases):
    device = TRITON_DEVICE if impl == "triton" else "cpu"
    d = {k: v.clone().to(device) for k, v in c.items()}
    counters = torch.zeros(NUM_COUNTERS, dtype=torch.int32, device=device)
    batch = c["selected"].shape[0]
    bring_in(d["resident"], d["slots"], resident_pages=d["resident_pages"], host_table=d["host_table"],
             host_k=d["host_k"], host_v=d["host_v"], dev_k=d["dev_k"], dev_v=d["dev_v"], selected=d["selected"],
             counts=d["counts"], num_full=d["num_full"], forced_blocks=d["forced"],
             quota=torch.full((batch, HEADS), quota, dtype=torch.int32, device=device),
             leaving_block=d["leaving"], leaving_page=d["window_page"], ready=d["ready"], scores=d["scores"],
             cpu_blocks=d["cpu_blocks"], cpu_counts=d["cpu_counts"], counters=counters, impl=impl, **phases)
    return {k: v.cpu() for k, v in d.items()}, counters.cpu()


def with_quota(row, candidates, selected, scores, quota):
    """policy.bring_in, moving at most `quota` candidates."""
    wanted = [j for j in candidates if j not in row][:quota]
    return policy.bring_in(row, wanted, selected, scores)


def expected_rows(c, *, quota, admit=False, fill=False, recall=None, due=None, unusable=()):
    """The rows the policy makes; slots in `unusable` ((batch row, slot) without a page) are left out of the row the
    policy sees, and stay empty."""
    rows, recalled, dropped = {}, 0, 0
    for b, slot in enumerate(c["slots"].tolist()):
        width = c["resident"].shape[2]
        keep = [r for r in range(width) if (b, r) not in unusable]
        for h in range(HEADS):
            row = [c["resident"][slot, h, r].item() for r in keep]
            selected = c["selected"][b, h, : c["counts"][b, h]].tolist()
            forced = set(c["forced"][b].tolist()) - {PAD_BLOCK}
            unforced = [j for j in selected if j not in forced]
            if admit and c["leaving"][b] != PAD_BLOCK:
                row = policy.admit_leaving(row, int(c["leaving"][b]))
            if fill and not c["ready"][slot, h] and c["num_full"][b] > 0:
                row = with_quota(row, unforced, set(selected), None, quota)
            if recall:
                row_due = due.get((b, h)) if isinstance(due, dict) else (due[b] if due is not None else None)
                candidates = unforced if recall == "selected" else (
                    c["cpu_blocks"][b, h, : c["cpu_counts"][b, h]].tolist() if row_due else [])
                after = with_quota(row, candidates, set(selected), c["scores"][b, h], quota)
                recalled += sum(x != y for x, y in zip(after, row))
                if recall == "selected":
                    dropped += len([j for j in candidates if j not in after])
                row = after
            rows[slot, h] = [PAD_BLOCK] * width
            for r, block in zip(keep, row):
                rows[slot, h][r] = block
    return rows, recalled, dropped


def check_copies(c, out, rows, *, admitted=False):
    """Every resident slot that holds a block holds its K and V (moved from its host page or window page)."""
    for b, slot in enumerate(c["slots"].tolist()):
        for h in range(HEADS):
            for r, block in enumerate(rows[slot, h]):
                if block == PAD_BLOCK or block == c["resident"][slot, h, r]:
                    continue  # empty, or held before the call (its page holds whatever the test put there)
                page = int(c["resident_pages"][b, r])
                if admitted and block == c["leaving"][b]:
                    source_k, source_v = c["dev_k"][c["window_page"][b], h], c["dev_v"][c["window_page"][b], h]
                else:
                    host = int(c["host_table"][b, block])
                    source_k, source_v = c["host_k"][host, h], c["host_v"][host, h]
                assert torch.equal(out["dev_k"][page, h], source_k) and torch.equal(out["dev_v"][page, h], source_v)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("quota", [RESIDENT, 1])
def test_admission_then_first_fill(impl, seed, quota):
    c = case(seed)
    out, _ = run(impl, c, quota=quota, admit=True, fill=True)
    rows, _, _ = expected_rows(c, quota=quota, admit=True, fill=True)
    for (slot, h), row in rows.items():
        assert out["resident"][slot, h].tolist() == row, (slot, h)
    filled = {(s, h) for (s, h) in rows if c["num_full"][c["slots"].tolist().index(s)] > 0}
    for slot, h in filled:
        assert out["ready"][slot, h] == 1
    check_copies(c, out, rows, admitted=True)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize("quota", [RESIDENT, 1])
def test_infinigen_recall_of_the_selection_by_score(impl, seed, quota):
    c = case(seed)
    out, counters = run(impl, c, quota=quota, recall="selected")
    rows, recalled, dropped = expected_rows(c, quota=quota, recall="selected")
    for (slot, h), row in rows.items():
        assert out["resident"][slot, h].tolist() == row, (slot, h)
    assert counters[RECALLED] == recalled and counters[DROPPED] == dropped
    check_copies(c, out, rows)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("due", ["interval", "adaptive"])
def test_scout_recall_of_the_cpu_list_when_due(impl, due):
    c = case(4)
    batch = c["selected"].shape[0]
    if due == "interval":
        flags = torch.tensor([1, 0, 1, 1], dtype=torch.int32)
        out, counters = run(impl, c, quota=RESIDENT, recall="cpu", recall_due=flags.to(TRITON_DEVICE if impl == "triton" else "cpu"))
        is_due = flags.tolist()
    else:
        rows = [(b, h) for b in range(batch) for h in range(HEADS)]
        shares = sorted({float(c["cpu_counts"][b, h] / max(1, c["counts"][b, h])) for b, h in rows})
        beta = (shares[len(shares) // 2 - 1] + shares[len(shares) // 2]) / 2  # between two shares the rows have
        out, counters = run(impl, c, quota=RESIDENT, recall="cpu", recall_beta=beta)
        is_due = {(b, h): bool(c["counts"][b, h] > 0 and c["cpu_counts"][b, h] / c["counts"][b, h] > beta)
                  for b, h in rows}  # each (request, KV head) row on its own
        assert 0 < sum(is_due.values()) < len(rows)  # the case has rows on both sides of beta
    rows, recalled, _ = expected_rows(c, quota=RESIDENT, recall="cpu", due=is_due)
    for (slot, h), row in rows.items():
        assert out["resident"][slot, h].tolist() == row, (slot, h)
    assert counters[RECALLED] == recalled > 0
    check_copies(c, out, rows)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("phases", [dict(admit=True, fill=True), dict(recall="selected")], ids=["fill", "recall"])
@pytest.mark.parametrize("quota", [48, 20])
def test_rows_as_wide_as_a_resident_first_request(impl, lookup, phases, quota):
    """A row and a selection of most of a request's blocks (linear lookups and a sorted victim order in Triton),
    the table's last block id both in rows and selected."""
    c = case(6, topk=60, resident=48, blocks=64)
    last = 63
    for b, slot in enumerate(c["slots"].tolist()):
        for h in range(HEADS):
            chosen = c["selected"][b, h]
            chosen[chosen == last] = PAD_BLOCK
            count = int(c["counts"][b, h])
            if b % 2:  # resident: the row holds the last block
                row = c["resident"][slot, h]
                row[row == last] = PAD_BLOCK
                row[0] = last
            elif count:  # selected: the last block is a candidate
                chosen[count - 1] = last
            chosen[:count] = torch.where(chosen[:count] == PAD_BLOCK, last, chosen[:count])
    with launched_warps() as warps:
        out, counters = run(impl, c, quota=quota, **phases)
    if impl == "triton":  # a wide row's program spreads over more warps (sizes.warps_for)
        assert warps == {"_resident_row_kernel": expected_warps(lookup)}
    rows, recalled, _ = expected_rows(c, quota=quota, **phases)
    for (slot, h), row in rows.items():
        assert out["resident"][slot, h].tolist() == row, (slot, h)
    if "recall" in phases:
        assert counters[RECALLED] == recalled > 0
    check_copies(c, out, rows, admitted="admit" in phases)


def without_pages(c, unusable):
    """The case with the slots `unusable` [(batch row, slot)] given no page (PAD, or the device store's scratch page,
    its last): a request's quota of a shared pool; such a slot holds nothing."""
    c = {k: v.clone() for k, v in c.items()}
    scratch = c["dev_k"].shape[0] - 1
    for i, (b, r) in enumerate(sorted(unusable)):
        c["resident_pages"][b, r] = scratch if i % 2 else PAD_BLOCK
        c["resident"][c["slots"][b], :, r] = PAD_BLOCK
    return c


# Request 0 keeps slot 0 only, request 1 none, request 2 all, request 3 loses its first slot.
UNUSABLE = {(0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (3, 0)}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("phases", [dict(admit=True, fill=True), dict(recall="selected")], ids=["fill", "recall"])
def test_slots_without_a_page_take_nothing(impl, phases):
    """A row's slots without a page (its quota of the pool) are neither filled nor victims: the rules act as on the
    shorter row of the slots that have one, and nothing is copied to the scratch page's slots."""
    c = without_pages(case(5), UNUSABLE)
    out, counters = run(impl, c, quota=RESIDENT, **phases)
    rows, recalled, _ = expected_rows(c, quota=RESIDENT, unusable=UNUSABLE, **phases)
    for (slot, h), row in rows.items():
        assert out["resident"][slot, h].tolist() == row, (slot, h)
    if "recall" in phases:
        assert counters[RECALLED] == recalled > 0
    assert sum(block != PAD_BLOCK for row in rows.values() for block in row) > 0
    check_copies(c, out, rows, admitted=True)
