"""CpuAttentionPool behaviour: concurrency, errors, shutdown, pinning, impl choice."""

import itertools
import logging
import os
import platform
import threading

import pytest
import torch
from support import assert_close
from test_cpu_worker_helpers import IMPLS, make_case, make_pool, outputs_for, run

from scout_sglang.cpu_worker import CpuAttentionError, CpuAttentionPool, alloc_output_buffers, dispatch, select_impl
from scout_sglang.cpu_worker.native_kernel import SOURCES, NativeBuild, build_native, headers_key
from scout_sglang.cpu_worker.partition import plan_work
from scout_sglang.reference import sparse_decode


def worker_names() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("scout-cpu-attn-")}


@pytest.mark.parametrize("impl", IMPLS)
def test_concurrent_submits_from_several_threads(impl):
    cases = [make_case([[3, 1, 0], [2, 6, 6]], group_size=4, head_dim=64, seed=s) for s in range(12)]
    results = [None] * len(cases)

    def submitter(first):
        # Several submits in flight per thread before the first wait.
        handles = []
        for i in range(first, len(cases), 3):
            out_o, out_lse = outputs_for(cases[i])
            c = cases[i]
            handle = pool.submit(
                c["q"], c["k_cache"], c["v_cache"], c["block_table"], c["counts"],
                scale=0.125, out_o=out_o, out_lse=out_lse, layer=i,
            )  # fmt: skip
            handles.append((i, handle, out_o, out_lse))
        for i, handle, out_o, out_lse in handles:
            pool.wait(handle)
            results[i] = (out_o, out_lse)

    with make_pool(impl, num_groups=2, threads_per_group=2) as pool:
        threads = [threading.Thread(target=submitter, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for case, (o, lse) in zip(cases, results):
        ref_o, ref_lse = sparse_decode(**case, scale=0.125)
        assert_close(o, ref_o, torch.bfloat16)
        assert_close(lse, ref_lse, torch.bfloat16, lse=True)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("threads_per_group", [1, 2])
def test_failed_task_names_sequence_and_layer_and_pool_keeps_serving(impl, threads_per_group, monkeypatch):
    case = make_case([[2, 2], [3, 1], [1, 1]], group_size=2, head_dim=64)
    with make_pool(impl, num_groups=2, threads_per_group=threads_per_group) as pool:
        kernel = pool._kernel
        real_decode = kernel.decode

        def flaky(*args, batch_index, head_begin, **kwargs):
            # A bad input discovered inside the task, on the last thread of the group.
            if batch_index == 1 and head_begin == threads_per_group - 1:
                raise IndexError("page 999 is not resident")
            return real_decode(*args, batch_index=batch_index, head_begin=head_begin, **kwargs)

        monkeypatch.setattr(kernel, "decode", flaky)
        with pytest.raises(CpuAttentionError, match=r"sequence 71 .*layer 5.*IndexError: page 999") as info:
            run(pool, case, scale=0.125, seq_ids=[70, 71, 72], layer=5)
        assert (info.value.seq_id, info.value.batch_index, info.value.layer) == (71, 1, 5)
        assert isinstance(info.value.__cause__, IndexError)
        monkeypatch.setattr(kernel, "decode", real_decode)
        o, lse = run(pool, case, scale=0.125)  # still serving
    ref_o, _ = sparse_decode(**case, scale=0.125)
    assert_close(o, ref_o, torch.bfloat16)


def test_shutdown_joins_every_thread():
    before = worker_names()
    pool = make_pool("torch", num_groups=3, threads_per_group=2)
    assert len(pool.threads) == 6 and all(t.is_alive() for t in pool.threads)
    assert len(worker_names() - before) == 6
    case = make_case([[1, 2]], group_size=2, head_dim=64)
    out_o, out_lse = outputs_for(case)
    handle = pool.submit(*case.values(), scale=0.125, out_o=out_o, out_lse=out_lse)
    pool.shutdown()  # finishes queued work first
    assert handle.done()
    assert not any(t.is_alive() for t in pool.threads)
    assert worker_names() == before
    pool.shutdown()  # idempotent
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(*case.values(), scale=0.125, out_o=out_o, out_lse=out_lse)


def test_context_manager_shuts_down():
    with make_pool("torch", num_groups=2) as pool:
        threads = pool.threads
    assert not any(t.is_alive() for t in threads)


def test_pinning_applies_to_worker_threads(monkeypatch):
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("needs os.sched_setaffinity")
    allowed = sorted(os.sched_getaffinity(0))
    seen = {}
    with make_pool("torch", num_groups=2, pin_cores="auto") as pool:
        real_decode = pool._kernel.decode

        def record(*args, batch_index, **kwargs):
            seen[batch_index] = os.sched_getaffinity(0)
            return real_decode(*args, batch_index=batch_index, **kwargs)

        monkeypatch.setattr(pool._kernel, "decode", record)
        run(pool, make_case([[1], [1], [1], [1]], group_size=1, head_dim=64), scale=0.125)
    assert all(len(cpus) == 1 and cpus <= set(allowed) for cpus in seen.values())
    assert os.sched_getaffinity(0) == set(allowed), "pinning must not leak into the caller"


def test_a_cpu_set_confines_unpinned_threads_and_is_read_back():
    """One rank's share of the host (cpu_sets.rank_share): every thread may run on it and nowhere else."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("needs os.sched_setaffinity")
    share = sorted(os.sched_getaffinity(0))[-1:]
    seen = {}
    with make_pool("torch", num_groups=2, cpu_set=share) as pool:
        real_decode = pool._kernel.decode

        def record(*args, batch_index, **kwargs):
            seen[batch_index] = os.sched_getaffinity(0)
            return real_decode(*args, batch_index=batch_index, **kwargs)

        pool._kernel.decode = record
        run(pool, make_case([[1], [1], [1], [1]], group_size=1, head_dim=64), scale=0.125)
        assert pool.thread_cpus() == share
    assert seen and all(cpus == set(share) for cpus in seen.values())
    with make_pool("torch", num_groups=1) as pool:
        assert pool.thread_cpus() == sorted(os.sched_getaffinity(0))  # no set: the process's CPUs
    with make_pool("torch", num_groups=3, pin_cores="auto", cpu_set=share) as pool:  # pinned within the share
        assert all(os.sched_getaffinity(t.native_id) == set(share) for t in pool.threads)


def test_empty_batch_is_done_at_once():
    with make_pool("torch", num_groups=1) as pool:
        case = make_case([[1, 1]], group_size=1, head_dim=64)
        empty = {k: v[:0] if k in ("q", "block_table", "counts") else v for k, v in case.items()}
        out_o, out_lse = outputs_for(empty)
        handle = pool.submit(*empty.values(), scale=0.125, out_o=out_o, out_lse=out_lse)
        assert handle.done()
        pool.wait(handle)


def test_alloc_output_buffers():
    out_o, out_lse = alloc_output_buffers(3, 8, 64, torch.bfloat16)
    assert out_o.shape == (3, 8, 64) and out_o.dtype == torch.bfloat16
    assert out_lse.shape == (3, 8) and out_lse.dtype == torch.float32
    assert out_o.is_pinned() == torch.cuda.is_available() == out_lse.is_pinned()
    with pytest.raises(TypeError, match="dtype must be one of"):
        alloc_output_buffers(3, 8, 64, torch.int32)


@pytest.mark.parametrize(
    "counts, threads, expected",
    [
        ([4, 4, 4, 4], 1, [(0, 4, 0, 1)]),
        ([4, 4, 4, 4], 2, [(0, 2, 0, 1), (2, 4, 0, 1)]),
        ([9, 1, 1, 1], 2, [(0, 1, 0, 1), (1, 4, 0, 1)]),
        ([0, 0, 0], 2, [(0, 1, 0, 1), (1, 3, 0, 1)]),
        ([3, 5], 3, [(0, 2, 0, 3), (0, 2, 1, 3), (0, 2, 2, 3)]),
    ],
)
def test_plan_work_covers_every_head(counts, threads, expected):
    assert [tuple(item) for item in plan_work(counts, threads)] == expected


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
        with pytest.raises(RuntimeError, match="unavailable"):
            CpuAttentionPool(1, impl="native")
    finally:
        select_impl.cache_clear()


def test_build_failure_is_returned_not_raised(tmp_path):
    broken = tmp_path / "broken.cpp"
    broken.write_text("this is not C++\n")
    build = build_native(name="scout_cpu_attention_broken_test", sources=(broken,))
    assert build.module is None and build.error


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
