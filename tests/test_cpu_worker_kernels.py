"""The CPU part's kernels, native and torch path (cpu_worker/native_kernel.py, torch_kernel.py), called directly:
values against scout_sglang.reference.sparse_decode over odd sizes, head ranges and block splits merged by LSE
== whole, the choice between them (dispatch.select_impl), the block-list checks the Python worker runs before
them (checks.py), the fallback builds, and the standalone measurement's threads (plan.measure.KernelThreads).

Shapes are small; the native kernel takes its AMX, AVX512_BF16 and generic fp32 paths depending on dtype,
group size and block size, all covered here.
"""

import itertools
import logging
import platform
import threading

import pytest
import torch
from support import assert_close

from scout_sglang.cpu_worker import dispatch, select_impl
from scout_sglang.cpu_worker.checks import check_block_lists
from scout_sglang.cpu_worker.dispatch import make_kernel
from scout_sglang.cpu_worker.native_kernel import SOURCES, NativeBuild, build_native, headers_key, load_native
from scout_sglang.plan.measure import KernelThreads
from scout_sglang.reference import merge_states, sparse_decode
from scout_sglang.testing import random_block_lists, random_paged_kv

IMPLS = ("native", "torch")
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Per-head list lengths of a batch of mixed lengths: empty, one block, partial,
# full (capacity 8) and a sequence with every list empty.
MIXED = [[0, 3, 8, 1], [8, 8, 8, 8], [0, 0, 0, 0], [5, 2, 0, 7]]


@pytest.fixture(scope="module", params=IMPLS)
def kernel(request):
    """The kernel of one path; skips the native one where it cannot be built."""
    if request.param == "native" and load_native().module is None:
        pytest.skip(f"native CPU kernel unavailable: {load_native().error}")
    return make_kernel(request.param)


def make_case(counts: list[list[int]], *, group_size: int, head_dim: int, block_size: int = 16,
              dtype: torch.dtype = torch.bfloat16, num_pages: int = 48, capacity: int | None = None,
              seed: int = 0) -> dict:
    """Random q [B, Hq, D], paged K/V [P, Hkv, S, D] and block lists for counts [B][Hkv]."""
    batch_size, num_kv_heads = len(counts), len(counts[0])
    capacity = capacity or max(max(row) for row in counts) or 1
    k_cache, v_cache = random_paged_kv(num_pages, num_kv_heads, block_size, head_dim, dtype=dtype, seed=seed)
    block_table, count_tensor = random_block_lists(counts, num_pages=num_pages, capacity=capacity, seed=seed + 1)
    gen = torch.Generator().manual_seed(seed + 2)
    q = torch.randn(batch_size, num_kv_heads * group_size, head_dim, generator=gen).to(dtype)
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, counts=count_tensor)


def outputs_for(case: dict, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """out_o [B, Hq, D] / out_lse [B, Hq] filled with NaN, so unwritten rows show up."""
    batch_size, num_qo_heads, head_dim = case["q"].shape
    out_o = torch.full((batch_size, num_qo_heads, head_dim), float("nan"), dtype=dtype)
    out_lse = torch.full((batch_size, num_qo_heads), float("nan"))
    return out_o, out_lse


def attend(kernel, case: dict, *, scale: float, out_dtype: torch.dtype = torch.float32, heads=None,
           split: tuple[int, int] = (0, 1)) -> tuple[torch.Tensor, torch.Tensor]:
    """Every sequence of `case`, one kernel call each over KV heads `heads` (default: all), split `split` =
    (index, count) of each list; returns (o, lse) with the rows of other heads left NaN."""
    out_o, out_lse = outputs_for(case, out_dtype)
    head_begin, head_end = heads or (0, case["k_cache"].shape[1])
    scratch = kernel.new_scratch()
    for b in range(case["q"].shape[0]):
        kernel.decode(*case.values(), batch_index=b, out_o=out_o, out_lse=out_lse, out_index=b, scale=scale,
                      head_begin=head_begin, head_end=head_end, split_index=split[0], num_splits=split[1],
                      scratch=scratch)
    return out_o, out_lse


def check_against_reference(o, lse, case, *, scale, dtype):
    ref_o, ref_lse = sparse_decode(**case, scale=scale)
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse)), "empty lists must give lse = -inf, only they"
    assert_close(o, ref_o, dtype)
    assert_close(lse, ref_lse, dtype, lse=True)


# -- values ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("group_size", [1, 4, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_matches_reference(kernel, dtype, group_size, head_dim):
    case = make_case(MIXED, group_size=group_size, head_dim=head_dim, dtype=dtype, capacity=8)
    o, lse = attend(kernel, case, scale=head_dim**-0.5)
    check_against_reference(o, lse, case, scale=head_dim**-0.5, dtype=dtype)


@pytest.mark.parametrize(
    "group_size, head_dim, block_size",
    [(3, 64, 16), (4, 128, 32), (2, 256, 16), (16, 64, 32), (4, 40, 7), (5, 96, 33), (4, 64, 6), (8, 320, 16)],
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_odd_shapes(kernel, group_size, head_dim, block_size, dtype):
    """Group sizes that do not divide 16, odd blocks and head dims off the vector width."""
    case = make_case([[2, 0], [4, 1]], group_size=group_size, head_dim=head_dim, block_size=block_size, dtype=dtype)
    o, lse = attend(kernel, case, scale=0.1)
    check_against_reference(o, lse, case, scale=0.1, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_long_and_odd_list_lengths(kernel, dtype):
    """Lists of 1, 15, 16, 17 and 97 blocks (S - 1, S, S + 1 of 16 and a long odd one), past any unrolled or
    prefetched run of the kernel, in one batch of mixed lengths."""
    case = make_case([[97, 1], [15, 16], [17, 0]], group_size=4, head_dim=64, dtype=dtype, num_pages=128)
    o, lse = attend(kernel, case, scale=0.125)
    check_against_reference(o, lse, case, scale=0.125, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_output_in_q_dtype(kernel, dtype):
    case = make_case(MIXED, group_size=4, head_dim=64, dtype=dtype, capacity=8)
    o, lse = attend(kernel, case, scale=0.125, out_dtype=dtype)
    assert o.dtype == dtype
    check_against_reference(o, lse, case, scale=0.125, dtype=dtype)


def test_all_lists_empty_and_all_full(kernel):
    empty = make_case([[0, 0], [0, 0]], group_size=4, head_dim=64, capacity=4)
    o, lse = attend(kernel, empty, scale=0.125)
    assert torch.all(o == 0) and torch.all(lse == float("-inf"))
    full = make_case([[48, 48]], group_size=4, head_dim=64, num_pages=48)  # every page of the cache
    o, lse = attend(kernel, full, scale=0.125)
    check_against_reference(o, lse, full, scale=0.125, dtype=torch.bfloat16)


# -- invariants: head ranges and block splits ----------------------------------------------------------------------


def test_head_ranges_write_only_their_rows_and_together_equal_the_whole(kernel):
    """A call over KV heads [h0, h1) writes the rows of those heads' query groups and no other."""
    case = make_case(MIXED, group_size=4, head_dim=64, capacity=8)
    whole = attend(kernel, case, scale=0.125)
    o, lse = outputs_for(case)
    for heads in ((0, 1), (1, 3), (3, 4)):
        part_o, part_lse = attend(kernel, case, scale=0.125, heads=heads)
        rows = slice(heads[0] * 4, heads[1] * 4)
        assert not part_lse[:, rows].isnan().any() and part_lse[:, : rows.start].isnan().all()
        assert part_lse[:, rows.stop :].isnan().all()
        o[:, rows], lse[:, rows] = part_o[:, rows], part_lse[:, rows]
    assert torch.equal(o, whole[0]) and torch.equal(lse, whole[1])


@pytest.mark.parametrize("num_splits", [2, 3, 5])
def test_splits_of_every_list_merge_to_the_whole(kernel, num_splits):
    """Split t of T takes blocks [n t / T, n (t + 1) / T) of each list (some empty when T > n); the splits
    merged by LSE equal the whole list (an empty split, lse = -inf, changes nothing)."""
    case = make_case(MIXED, group_size=4, head_dim=64, dtype=torch.float32, capacity=8)
    whole_o, whole_lse = attend(kernel, case, scale=0.125)
    merged_o, merged_lse = attend(kernel, case, scale=0.125, split=(0, num_splits))
    for t in range(1, num_splits):
        o, lse = attend(kernel, case, scale=0.125, split=(t, num_splits))
        merged_o, merged_lse = merge_states(merged_o, merged_lse, o, lse)
    assert_close(merged_o, whole_o, torch.float32)
    assert_close(merged_lse, whole_lse, torch.float32, lse=True)


def test_split_halves_merge_to_whole(kernel):
    """Invariant: the two halves of every block list, given as two separate lists and merged by LSE, equal the
    whole."""
    case = make_case(MIXED, group_size=4, head_dim=64, dtype=torch.float32, capacity=8)
    counts, table = case["counts"], case["block_table"]
    first_half = counts // 2
    second_table = torch.full_like(table, -1)
    for b in range(table.shape[0]):
        for h in range(table.shape[1]):
            n, m = int(counts[b, h]), int(first_half[b, h])
            second_table[b, h, : n - m] = table[b, h, m:n]
    whole = attend(kernel, case, scale=0.125)
    first = attend(kernel, dict(case, counts=first_half), scale=0.125)
    second = attend(kernel, dict(case, block_table=second_table, counts=counts - first_half), scale=0.125)
    merged_o, merged_lse = merge_states(first[0], first[1], second[0], second[1])
    assert_close(merged_o, whole[0], torch.float32)
    assert_close(merged_lse, whole[1], torch.float32, lse=True)


# -- the standalone measurement's threads ------------------------------------------------------------------------


def test_kernel_threads_attend_batches_in_flight_like_the_reference(kernel):
    """plan.measure.KernelThreads (what bench_cpu_attention and the planner's --measure time): several threads
    calling the kernel at once, two batches in flight, each equal to the reference."""
    cases = [make_case([[3, 1, 0], [2, 6, 6], [1, 1, 1]], group_size=4, head_dim=64, seed=s) for s in range(4)]
    outputs = [outputs_for(case) for case in cases]
    runner = KernelThreads(kernel, 3)
    try:
        tasks = [runner.submit(*case.values(), scale=0.125, out_o=o, out_lse=lse)
                 for case, (o, lse) in zip(cases, outputs)]
        for batch in tasks:
            runner.wait(batch)
    finally:
        runner.shutdown()
    runner.shutdown()  # idempotent
    for case, (o, lse) in zip(cases, outputs):
        check_against_reference(o, lse, case, scale=0.125, dtype=torch.bfloat16)


# -- the block-list checks (FlagWorker's, before the kernel) -----------------------------------------------------


def lists_with(table_entry=None, count=None):
    """Block lists [2, 2, 4] over 16 pages, with one entry inside counts[1, 1] = 3 or one count changed."""
    case = make_case([[2, 1], [0, 3]], group_size=2, head_dim=64, capacity=4, num_pages=16)
    table, counts = case["block_table"].clone(), case["counts"].clone()
    if table_entry is not None:
        table[1, 1, 2] = table_entry
    if count is not None:
        counts[0, 1] = count
    return table, counts


@pytest.mark.parametrize("change, message", [
    (dict(table_entry=16), r"page ids within counts must be in \[0, 16\).*got 16 at \(1, 1, 2\)"),
    (dict(table_entry=-1), r"page ids within counts must be in \[0, 16\).*got -1 at \(1, 1, 2\)"),
    (dict(count=5), r"counts must be in \[0, 4\] \(block_table capacity\), got 5 at \(0, 1\)"),
    (dict(count=-1), r"counts must be in \[0, 4\].*got -1 at \(0, 1\)"),
], ids=["page past the cache", "negative page", "count over capacity", "negative count"])
def test_block_list_checks_name_the_bad_entry(change, message):
    table, counts = lists_with(**change)
    with pytest.raises(ValueError, match=message):
        check_block_lists(table, counts, num_pages=16)


def test_block_list_checks_pass_valid_lists_and_ignore_padding():
    table, counts = lists_with()
    table[0, 1, 1:] = 9999  # past counts[0, 1] = 1: padding, never read
    check_block_lists(table, counts, num_pages=16)
    check_block_lists(table, torch.zeros_like(counts), num_pages=16)  # nothing listed


# -- choice of path and builds -------------------------------------------------------------------------------------


def test_auto_falls_back_to_torch_when_native_cannot_build(monkeypatch, caplog):
    monkeypatch.setattr(dispatch, "load_native", lambda: NativeBuild(module=None, name="x", error="no compiler"))
    select_impl.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger="scout_sglang.cpu_worker"):
            assert select_impl("auto") == "torch"
            assert select_impl("auto") == "torch"
        assert sum("uses the torch implementation" in r.message for r in caplog.records) == 1, "logged once"
        with pytest.raises(RuntimeError, match="impl='native'.*unavailable: no compiler"):
            select_impl("native")
    finally:
        select_impl.cache_clear()


def test_unknown_impls_are_refused():
    with pytest.raises(ValueError, match=r"impl must be one of \('auto', 'native', 'torch'\), got 'ipex'"):
        select_impl("ipex")
    with pytest.raises(ValueError, match="impl must be 'native' or 'torch', got 'auto'"):
        make_kernel("auto")


def test_build_failure_is_returned_not_raised(tmp_path):
    broken = tmp_path / "broken.cpp"
    broken.write_text("this is not C++\n")
    build = build_native(name="scout_cpu_attention_broken_test", sources=(broken,))
    assert build.module is None and build.error


def test_a_killed_builds_lock_does_not_hang_the_next_build(tmp_path):
    """torch waits for as long as a `lock` file exists in the build folder; one left by a killed build hung a
    whole CI run. The next builder holds the flock, so it knows the lock is dead and clears it."""
    broken = tmp_path / "broken.cpp"
    broken.write_text("this is not C++\n")
    name = "scout_stale_lock_test"
    (tmp_path / "builds" / name).mkdir(parents=True)
    (tmp_path / "builds" / name / "lock").touch()
    outcome = []
    builder = threading.Thread(target=lambda: outcome.append(
        build_native(name=name, sources=(broken,), build_dir=tmp_path / "builds")), daemon=True)
    builder.start()
    builder.join(timeout=60)
    assert outcome, "the build waited on the lock of a build that no longer runs"
    assert outcome[0].module is None and "Error" in outcome[0].error


@pytest.mark.slow
@pytest.mark.parametrize(
    "variant, flags", [("avx2", ("-O3", "-march=native", "-mno-avx512f")), ("scalar", ("-O3", "-march=x86-64"))]
)
def test_avx2_and_scalar_builds_match_reference(variant, flags):
    """The #elif AVX2 and scalar fallbacks, compiled on this host by disabling ISA levels."""
    if platform.machine() != "x86_64":
        pytest.skip("the ISA flags of this test are x86-64 flags")
    # The headers' hash in the name: torch's cache keys by the .cpp only, and would serve a stale build.
    build = build_native(name=f"scout_cpu_attention_{variant}_test_{headers_key(SOURCES)}", extra_cflags=flags)
    assert build.module is not None, f"the {variant} fallback did not build: {build.error}"
    assert build.module.isa() == variant
    # bf16 with D % 16 == 0 takes the widened-in-register path on AVX2, the fp32 path on scalar.
    assert build.module.bf16_path(4, 12, 64) == ("bf16split" if variant == "avx2" else "fp32")
    shapes = [(4, 72, 7), (4, 64, 12), (6, 96, 8), (1, 128, 16)]  # (G, D, S): odd D, S % 8 tails, G % 4 tails
    for dtype, (group_size, head_dim, block_size) in itertools.product(
        (torch.bfloat16, torch.float16, torch.float32), shapes
    ):
        case = make_case([[3, 0], [8, 2]], group_size=group_size, head_dim=head_dim, block_size=block_size,
                         dtype=dtype, capacity=8)
        out_o, out_lse = outputs_for(case)
        for b in range(2):
            build.module.decode(*case.values(), b, out_o, out_lse, b, 0.1, 0, 2, 0, 1)
        ref_o, ref_lse = sparse_decode(**case, scale=0.1)
        assert_close(out_o, ref_o, dtype)
        assert_close(out_lse, ref_lse, dtype, lse=True)


def test_kernel_threads_run_on_the_cpus_they_are_given():
    """The standalone measurement compared with the engine's workers runs on the workers' cores: its threads are
    pinned one per given CPU, not left on the caller's (a GPU host's engine thread sits on its host core alone)."""
    import os

    class AffinityKernel:  # records where each call ran
        def __init__(self):
            self.seen = set()

        def new_scratch(self):
            return None

        def decode(self, *args, **kwargs):
            self.seen.add(tuple(sorted(os.sched_getaffinity(0))))

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: a pinned thread and an unpinned one run on the same CPUs")
    cpu = sorted(os.sched_getaffinity(0))[-1]
    kernel = AffinityKernel()
    runner = KernelThreads(kernel, 2, cpus=[cpu])
    try:
        runner.wait(runner.submit(torch.zeros(4, 2, 8), torch.zeros(1, 1, 1, 8), None, None, None, scale=1.0,
                                  out_o=None, out_lse=None))
    finally:
        runner.shutdown()
    assert kernel.seen == {(cpu,)}
