"""CpuAttentionPool values against scout_sglang.reference.sparse_decode, both paths.

Shapes are small; the native kernel takes its AMX, AVX512_BF16 and generic
fp32 paths depending on dtype, group size and block size, all covered here.
"""

import pytest
import torch
from support import assert_close
from test_cpu_worker_helpers import IMPLS, make_case, make_pool, run

from scout_sglang.reference import merge_states, sparse_decode

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Per-head list lengths of a batch of mixed lengths: empty, one block, partial,
# full (capacity 8) and a sequence with every list empty.
MIXED = [[0, 3, 8, 1], [8, 8, 8, 8], [0, 0, 0, 0], [5, 2, 0, 7]]


@pytest.fixture(scope="module", params=IMPLS)
def pool(request):
    with make_pool(request.param, num_groups=2, threads_per_group=1) as pool:
        yield pool


def check_against_reference(o, lse, case, *, scale, dtype):
    ref_o, ref_lse = sparse_decode(**case, scale=scale)
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse)), "empty lists must give lse = -inf, only they"
    assert_close(o, ref_o, dtype)
    assert_close(lse, ref_lse, dtype, lse=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("group_size", [1, 4, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_matches_reference(pool, dtype, group_size, head_dim):
    case = make_case(MIXED, group_size=group_size, head_dim=head_dim, dtype=dtype, capacity=8)
    o, lse = run(pool, case, scale=head_dim**-0.5)
    check_against_reference(o, lse, case, scale=head_dim**-0.5, dtype=dtype)


@pytest.mark.parametrize(
    "group_size, head_dim, block_size",
    [(3, 64, 16), (4, 128, 32), (2, 256, 16), (16, 64, 32), (4, 40, 7), (5, 96, 33), (4, 64, 6), (8, 320, 16)],
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_odd_shapes(pool, group_size, head_dim, block_size, dtype):
    """Group sizes that do not divide 16, odd blocks and head dims off the vector width."""
    case = make_case([[2, 0], [4, 1]], group_size=group_size, head_dim=head_dim, block_size=block_size, dtype=dtype)
    o, lse = run(pool, case, scale=0.1)
    check_against_reference(o, lse, case, scale=0.1, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_output_in_q_dtype(pool, dtype):
    case = make_case(MIXED, group_size=4, head_dim=64, dtype=dtype, capacity=8)
    o, lse = run(pool, case, scale=0.125, out_dtype=dtype)
    assert o.dtype == dtype
    check_against_reference(o, lse, case, scale=0.125, dtype=dtype)


def test_all_lists_empty_and_all_full(pool):
    empty = make_case([[0, 0], [0, 0]], group_size=4, head_dim=64, capacity=4)
    o, lse = run(pool, empty, scale=0.125)
    assert torch.all(o == 0) and torch.all(lse == float("-inf"))
    full = make_case([[48, 48]], group_size=4, head_dim=64, num_pages=48)  # every page of the cache
    o, lse = run(pool, full, scale=0.125)
    check_against_reference(o, lse, full, scale=0.125, dtype=torch.bfloat16)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("threads_per_group", [2, 3, 5])
def test_threads_per_group(impl, threads_per_group):
    """Split by KV head (T <= Hkv) or by block range merged by LSE (T > Hkv)."""
    case = make_case(MIXED, group_size=4, head_dim=64, capacity=8)
    with make_pool(impl, num_groups=2, threads_per_group=threads_per_group) as pool:
        o, lse = run(pool, case, scale=0.125)
    check_against_reference(o, lse, case, scale=0.125, dtype=torch.bfloat16)


def test_split_halves_merge_to_whole(pool):
    """Invariant: the two halves of every block list, merged by LSE, equal the whole."""
    case = make_case(MIXED, group_size=4, head_dim=64, dtype=torch.float32, capacity=8)
    counts, table = case["counts"], case["block_table"]
    first_half = counts // 2
    second_table = torch.full_like(table, -1)
    for b in range(table.shape[0]):
        for h in range(table.shape[1]):
            n, m = int(counts[b, h]), int(first_half[b, h])
            second_table[b, h, : n - m] = table[b, h, m:n]
    whole = run(pool, case, scale=0.125)
    first = run(pool, dict(case, counts=first_half), scale=0.125)
    second = run(pool, dict(case, block_table=second_table, counts=counts - first_half), scale=0.125)
    merged_o, merged_lse = merge_states(first[0], first[1], second[0], second[1])
    assert_close(merged_o, whole[0], torch.float32)
    assert_close(merged_lse, whole[1], torch.float32, lse=True)
