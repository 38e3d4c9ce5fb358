"""Implementation choice: automatic order, explicit override, clear refusals."""

import subprocess
import sys

import pytest

from scout_sglang.kernels.dispatch import select_impl


def test_cpu_ops_use_torch():
    for op in ("digests", "score_blocks", "select_topk", "sparse_decode", "merge"):
        assert select_impl(op, "cpu") == "torch"


def test_unknown_op_and_unknown_impl_are_refused():
    with pytest.raises(ValueError, match="unknown op"):
        select_impl("flash", "cpu")
    with pytest.raises(ValueError, match="impl must be one of"):
        select_impl("merge", "cpu", "cutlass")


def test_importing_the_package_loads_no_accelerator_module_and_no_cuda():
    code = (
        "import sys, scout_sglang, scout_sglang.kernels, scout_sglang.cpu_worker, scout_sglang.reference\n"
        "import torch\n"
        "assert 'triton' not in sys.modules, 'triton imported'\n"
        "assert 'flashinfer' not in sys.modules, 'flashinfer imported'\n"
        "assert not torch.cuda.is_initialized(), 'CUDA initialised'\n"
    )
    subprocess.run([sys.executable, "-P", "-c", code], check=True)
