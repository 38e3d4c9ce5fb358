"""The Triton kernels that hold the estimate's value summary, the CPU split's and resident-first's compile for a
Hopper GPU (sm_90) with the real
backend, here without a GPU: the interpreter runs the kernels as Python (numpy on tiles), not through the
compiler's typing, layouts and code generation, so a kernel the compiler refuses would otherwise first fail on a
GPU. Compile only, in a child process without TRITON_INTERPRET (under it @triton.jit builds no compiler
input); nothing is launched. Shapes as Qwen3-8B's (D 128, blocks of 16, 4 query heads per KV head)."""

import json
import os
import subprocess
import sys

import pytest
from support import requires_triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "benchmarks"))
from hopper_compile import compile_for_hopper  # noqa: E402

pytestmark = [requires_triton, pytest.mark.slow]

def compile_all() -> dict:
    """Each kernel and configuration -> its PTX (run in the child)."""
    from scout_sglang.kernels.triton.digest import _block_digest_kernel
    from scout_sglang.kernels.triton.estimate import _config, _estimate_merge_kernel, _estimate_partials_kernel
    from scout_sglang.kernels.triton.stage_append import _append_token_kernel

    ptx = {}
    for summary in (False, True):
        ptx[f"digest/{summary}"] = compile_for_hopper(
            _block_digest_kernel, dict(BLOCK_SIZE=16, HEAD_DIM=128, BLOCK_S=16, BLOCK_D=128, VALUE_SUMMARY=summary))
        ptx[f"append/{summary}"] = compile_for_hopper(
            _append_token_kernel, dict(BLOCK_SIZE=16, SIZE_P2=16, HEAD_DIM=128, DIM_P2=128, DIGEST=True,
                                       VALUE_SUMMARY=summary, HOST=True))
    config = _config(4, 128, 32, 4)
    for splits in (1, 16):  # the walk in the merge's program; the merge of 16 slices' partials
        ptx[f"estimate/{splits}"] = compile_for_hopper(_estimate_merge_kernel, dict(
            config, NUM_QO_HEADS=32, SPLITS=splits, CPU_PART=True, WRITE_LSE=True, ZERO_COPY=False))
    ptx["estimate/partials"] = compile_for_hopper(_estimate_partials_kernel, dict(
        config, NUM_QO_HEADS=32, SPLITS=16, SLICE=128))
    ptx |= compile_cpu_split()
    ptx |= compile_resident_first()
    return ptx


def compile_resident_first() -> dict:
    """Resident-first's kernels: the select stage with each row's own k (and without, as before), the resident
    rows' stage whose columns may have no page (PAD or the scratch page), in its fill and recall phases, and the
    exact path's admission and split at the widest row."""
    from scout_sglang.kernels.triton.stage_recall import _config as recall_config, _resident_row_kernel
    from scout_sglang.kernels.triton.stage_select import _config as select_config, _select_topk_kernel
    from scout_sglang.kernels.triton.stage_split import _config as split_config, _split_lists_kernel

    ptx = {}
    for row_topk in (False, True):  # a 64k row at blocks of 16, selecting 64 (an exact row: all its resident ones)
        ptx[f"select/{row_topk}"] = compile_for_hopper(
            _select_topk_kernel, select_config(64, 4096, 1, 2, 16, True, True, False, row_topk))
    for phase, recall in (("fill", None), ("recall", "cpu")):  # rows of 61 blocks (compile time grows as R squared)
        config = recall_config(61, 64, 3, 64, 8, 16, 128, False, phase == "fill", recall, False, True, 2, True, 4,
                               4096)
        ptx[f"resident/{phase}"] = compile_for_hopper(_resident_row_kernel, config)
    # The exact path's stages at the widest row (a 64k request, all resident): admission alone, and the split's
    # device list with an empty selection and no CPU list.
    ptx["resident/admit"] = compile_for_hopper(_resident_row_kernel, recall_config(
        4093, 1, 3, 64, 8, 16, 128, True, False, None, False, False, 1, False, 0, 4096))
    ptx["split/exact"] = compile_for_hopper(_split_lists_kernel, split_config(
        1, 4, 4093, 0, False, False, False, False, 1, 1, False, 0))
    return ptx


def compile_cpu_split() -> dict:
    """The CPU split's kernels: the split stage with its cap, the zero-copy decode on a bounded number of programs
    (and the one-program-per-list decode beside it), and both merges with the zero-copy share as a third side."""
    from scout_sglang.kernels.triton.decode import _sparse_decode_split_kernel
    from scout_sglang.kernels.triton.estimate import _config, _estimate_merge_kernel
    from scout_sglang.kernels.triton.handoff import _merge_cpu_part_kernel
    from scout_sglang.kernels.triton.stage_split import _config as split_config, _split_lists_kernel

    checked_split = split_config(64, 3, 64, 64, False, True, True, True, 4, 128, True, 4096)  # the cap, the page check
    ptx = {"split/cap": compile_for_hopper(_split_lists_kernel, checked_split)}
    decode = dict(GROUP_SIZE=4, HEAD_DIM=128, BLOCK_SIZE=16, HAS_LAST_BLOCK_LEN=False, BLOCK_G=16, BLOCK_T=32,
                  BLOCK_D=128, DOT_PRECISION=None, DOT_IN_FP32=False, SPLIT_P=True, GATED=False)
    for programs, timed in ((0, False), (32, False), (32, True)):
        ptx[f"decode/{programs}/{timed}"] = compile_for_hopper(_sparse_decode_split_kernel,
                                                              dict(decode, PROGRAMS=programs, TIMED=timed))
    ptx["merge/zero_copy"] = compile_for_hopper(_merge_cpu_part_kernel, dict(HEAD_DIM=128, BLOCK_H=8, BLOCK_D=128,
                                                                             ZERO_COPY=True))
    ptx["estimate/zero_copy"] = compile_for_hopper(_estimate_merge_kernel, dict(
        _config(4, 128, 32, 4), NUM_QO_HEADS=32, SPLITS=1, CPU_PART=True, WRITE_LSE=True, ZERO_COPY=True))
    return ptx


@pytest.fixture(scope="module")
def ptx():
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    child = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    if child.returncode and "ptxas" in child.stderr.lower():  # the backend's own tools missing: nothing compiles
        pytest.skip(f"no CUDA compiler tools: {child.stderr[-300:]}")
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout.splitlines()[-1])


def test_the_digest_and_append_kernels_compile_with_and_without_the_value_summary(ptx):
    for name in ("digest/False", "digest/True", "append/False", "append/True"):
        assert ".target sm_90" in ptx[name] and "st.global" in ptx[name], name
        # The summary normalises its axis (a square root): in the code only where the summary is on.
        assert ("sqrt" in ptx[name]) == name.endswith("True"), name


def test_the_estimate_kernels_compile_walked_whole_and_in_slices(ptx):
    for name in ("estimate/1", "estimate/16", "estimate/partials"):
        assert ".target sm_90" in ptx[name] and "st.global" in ptx[name], name
    # Only a program that walks blocks reads value summaries (the line table names the helper's file): the merge
    # of slices reads partials alone.
    walks = {name: "value_summary.py" in ptx[name] for name in ("estimate/1", "estimate/16", "estimate/partials")}
    assert walks == {"estimate/1": True, "estimate/16": False, "estimate/partials": True}


def test_resident_firsts_kernels_compile(ptx):
    for name in ("select/False", "select/True", "resident/fill", "resident/recall", "resident/admit", "split/exact"):
        assert ".target sm_90" in ptx[name] and "st.global" in ptx[name], name
    # Each row's own k is one more load: only where ROW_TOPK is on.
    assert ptx["select/True"].count("ld.global") > ptx["select/False"].count("ld.global")


def test_the_cpu_splits_kernels_compile(ptx):
    names = ("split/cap", "decode/0/False", "decode/32/False", "decode/32/True", "merge/zero_copy",
             "estimate/zero_copy")
    for name in names:
        assert ".target sm_90" in ptx[name] and "st.global" in ptx[name], name
    # The bounded decode loops over lists: a branch back that the one-program-per-list decode does not need more
    # of (its only loops walk the list's tokens).
    assert ptx["decode/32/False"].count("bra") > ptx["decode/0/False"].count("bra")
    # Timed, it reads the GPU's global timer and adds its time with one atomic; untimed, neither.
    assert "%globaltimer" in ptx["decode/32/True"] and "atom.global" in ptx["decode/32/True"]
    assert "%globaltimer" not in ptx["decode/32/False"]


if __name__ == "__main__":
    print(json.dumps(compile_all()))


@pytest.fixture(scope="module")
def widest_rows():
    """Resident-first's stages compiled at the widest row the engine gives them (WIDEST_ROW), two at a time, each
    in its own process with a cold cache (benchmarks/kernel_widths.py)."""
    import concurrent.futures

    import kernel_widths
    from scout_sglang.kernels.triton.stage_recall import WIDEST_ROW

    stages = ("fill", "recall", "select", "split")  # the longest compiles first
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        rows = list(pool.map(lambda stage: kernel_widths.measured(stage, WIDEST_ROW, timeout=600), stages))
    if any("ptxas" in row.get("reason", "").lower() for row in rows):
        pytest.skip(f"no CUDA compiler tools: {rows}")
    return rows


def test_resident_firsts_stages_compile_at_the_widest_row_within_a_programs_shared_memory(widest_rows):
    """A row of WIDEST_ROW columns: an all-pairs comparison of the row would be refused (16M elements), so this
    fails if one comes back; the histograms and sorts fit the shared memory an sm_90 program may use."""
    from kernel_widths import SHARED_LIMIT_KIB

    for row in widest_rows:
        assert row["status"] == "compiled", row
        assert row["shared_kib"] <= SHARED_LIMIT_KIB, row
