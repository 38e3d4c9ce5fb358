"""The append stage (kernels.stage_append): the token lands in its page; a completed block gets the reference
digest (and, for the estimate, its value summary) and its host copy, the others change nothing else."""

import pytest
import torch
from support import TRITON_DEVICE, assert_close, requires_triton

from scout_sglang import reference
from scout_sglang.kernels.stage_append import append_token

IMPLS = ["torch", pytest.param("triton", marks=[requires_triton, pytest.mark.triton_interpret])]
BLOCK, HEADS, DIM = 4, 2, 8


def stores(dtype, block=BLOCK, seed=0):
    gen = torch.Generator().manual_seed(seed)
    k, v = (torch.randn(7, HEADS, block, DIM, generator=gen).to(dtype) for _ in range(2))
    host_k, host_v = torch.zeros(9, HEADS, block, DIM, dtype=dtype), torch.zeros(9, HEADS, block, DIM, dtype=dtype)
    digests = (*(torch.full((9, HEADS, DIM), 5.0, dtype=dtype) for _ in range(2)),  # min, max, value summary
               torch.full((9, HEADS, 3, DIM), 5.0, dtype=dtype))
    new = torch.randn(2, 4, HEADS, DIM, generator=gen).to(dtype)
    return k, v, host_k, host_v, digests, new


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_digests, with_means, with_host",
                         [(True, False, True), (True, True, True), (True, True, False), (False, False, False)])
@pytest.mark.parametrize("block", [BLOCK, 3])  # 3: the kernel's tile has a padding row, which no digest may see
def test_the_token_lands_and_a_completed_block_gets_its_digest_and_host_copy(impl, dtype, with_digests, with_means,
                                                                             with_host, block):
    device = TRITON_DEVICE if impl == "triton" else "cpu"
    k, v, host_k, host_v, (dmin, dmax, vmean), (k_new, v_new) = stores(dtype, block)
    pages = torch.tensor([2, 5, 0, 6], dtype=torch.int32)
    offsets = torch.tensor([block - 1, 1, 0, block - 1], dtype=torch.int32)  # rows 0 and 3 complete their block
    rows = torch.tensor([4, 8, 8, 1], dtype=torch.int32)  # 8: scratch, for the rows that complete nothing
    expected_k, expected_v = k.clone(), v.clone()
    for b in range(4):
        expected_k[pages[b], :, offsets[b]] = k_new[b]
        expected_v[pages[b], :, offsets[b]] = v_new[b]
    to = lambda t: t.to(device)  # noqa: E731
    outs = [to(t) for t in (k, v, host_k, host_v, dmin, dmax, vmean)]
    append_token(to(k_new), to(v_new), outs[0], outs[1], to(pages), to(offsets),
                 **(dict(digest_min=outs[4], digest_max=outs[5], digest_rows=to(rows)) if with_digests else {}),
                 **(dict(value_summary=outs[6]) if with_means else {}),
                 **(dict(host_k=outs[2], host_v=outs[3], host_rows=to(rows), host_scratch=8) if with_host else {}),
                 impl=impl)
    k_out, v_out, host_k_out, host_v_out, dmin_out, dmax_out, vmean_out = (t.cpu() for t in outs)
    assert torch.equal(k_out, expected_k) and torch.equal(v_out, expected_v)
    ref_min, ref_max = reference.block_digests(expected_k)
    for b, row in ((0, 4), (3, 1)):
        page = int(pages[b])
        if with_digests:
            assert torch.equal(dmin_out[row].float(), ref_min[page]) and torch.equal(dmax_out[row].float(), ref_max[page])
        if with_means:
            summary = torch.stack([reference.value_summary_of_block(expected_k[page, h], expected_v[page, h])
                                   for h in range(HEADS)])
            assert_close(vmean_out[row], summary, dtype)
        if with_host:
            assert torch.equal(host_k_out[row], expected_k[page]) and torch.equal(host_v_out[row], expected_v[page])
    untouched = [0, 2, 3, 5, 6, 7]  # (8 is the scratch row: the rows that complete nothing may write there)
    assert torch.all(dmin_out[untouched] == 5.0) and torch.all(dmax_out[untouched] == 5.0)
    assert torch.all(vmean_out[untouched] == 5.0) and (with_means or torch.all(vmean_out == 5.0))
    assert torch.all(host_k_out[untouched] == 0) and torch.all(host_v_out[untouched] == 0)
    if not with_digests:
        assert torch.all(dmin_out == 5.0)
    if not with_host:
        assert torch.all(host_k_out == 0)


def test_mismatched_parts_are_refused_by_name():
    k, v, host_k, host_v, (dmin, dmax, vmean), (k_new, v_new) = stores(torch.float32)
    pages = offsets = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(ValueError, match="digest_min, digest_max and digest_rows go together"):
        append_token(k_new, v_new, k, v, pages, offsets, digest_min=dmin)
    with pytest.raises(ValueError, match="value_summary is written with the digests"):
        append_token(k_new, v_new, k, v, pages, offsets, value_summary=vmean)
    with pytest.raises(ValueError, match="k_new must be"):
        append_token(k_new[:, :, :1], v_new, k, v, pages, offsets)
