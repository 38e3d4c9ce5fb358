"""Argument validation of CpuAttentionPool: each message states expected versus actual."""

import pytest
import torch
from test_cpu_worker_helpers import make_case, make_pool, outputs_for

from scout_sglang.cpu_worker import CpuAttentionPool


@pytest.fixture(scope="module")
def pool():
    with make_pool("torch", num_groups=1) as pool:
        yield pool


def base_args():
    case = make_case([[2, 1], [0, 3]], group_size=2, head_dim=64, capacity=4, num_pages=16)
    out_o, out_lse = outputs_for(case)
    return dict(case, scale=0.125, out_o=out_o, out_lse=out_lse)


def with_table_entry(args, value):
    table = args["block_table"].clone()
    table[1, 1, 2] = value  # inside counts[1, 1] = 3
    return dict(block_table=table)


def with_count(args, value):
    counts = args["counts"].clone()
    counts[0, 1] = value
    return dict(counts=counts)


BAD = {
    "q not a tensor": (lambda a: dict(q=a["q"].tolist()), TypeError, "q must be a torch.Tensor, got list"),
    "q int dtype": (lambda a: dict(q=a["q"].int()), TypeError, r"q must have dtype in .*got torch.int32"),
    "cache dtype differs from q": (
        lambda a: dict(k_cache=a["k_cache"].half()),
        TypeError,
        r"k_cache must have dtype in \(torch.bfloat16\), got torch.float16",
    ),
    "v shape": (lambda a: dict(v_cache=a["v_cache"][:8]), ValueError, r"v_cache must have shape \(16, 2, 16, 64\)"),
    "head_dim mismatch": (lambda a: dict(q=a["q"][..., :32].contiguous()), ValueError, "head_dim .* got 64"),
    "Hq % Hkv": (
        lambda a: dict(q=a["q"][:, :3].contiguous()),
        ValueError,
        r"num_qo_heads \(3\) must be a multiple of num_kv_heads \(2\)",
    ),
    "int64 table": (
        lambda a: dict(block_table=a["block_table"].long()),
        TypeError,
        r"block_table must have dtype in \(torch.int32\), got torch.int64",
    ),
    "int64 counts": (lambda a: dict(counts=a["counts"].long()), TypeError, "counts must have dtype .*int64"),
    "table shape": (
        lambda a: dict(block_table=a["block_table"][:, :1].contiguous()),
        ValueError,
        r"block_table must have shape \(2, 2, 4\), got \(2, 1, 4\)",
    ),
    "non-contiguous q": (
        lambda a: dict(q=a["q"].transpose(0, 1).contiguous().transpose(0, 1)),
        ValueError,
        "q must be contiguous",
    ),
    "page id past the cache": (
        lambda a: with_table_entry(a, 16),
        ValueError,
        r"page ids within counts must be in \[0, 16\).*got 16 at \(1, 1, 2\)",
    ),
    "negative page id": (lambda a: with_table_entry(a, -1), ValueError, r"must be in \[0, 16\).*got -1"),
    "count over capacity": (
        lambda a: with_count(a, 5),
        ValueError,
        r"counts must be in \[0, 4\] .*got 5 at \(0, 1\)",
    ),
    "negative count": (lambda a: with_count(a, -1), ValueError, r"counts must be in \[0, 4\].*got -1"),
    "out_o dtype": (
        lambda a: dict(out_o=a["out_o"].half()),
        TypeError,
        r"out_o must have dtype in \(torch.float32, torch.bfloat16\), got torch.float16",
    ),
    "out_lse shape": (
        lambda a: dict(out_lse=a["out_lse"][:1].contiguous()),
        ValueError,
        r"out_lse must have shape \(2, 4\), got \(1, 4\)",
    ),
    "scale zero": (lambda a: dict(scale=0.0), ValueError, "scale must be a finite number > 0, got 0.0"),
    "scale nan": (lambda a: dict(scale=float("nan")), ValueError, "scale must be a finite number > 0, got nan"),
    "seq_ids length": (lambda a: dict(seq_ids=[1]), ValueError, "seq_ids must have 2 entries .*got 1"),
    "layer negative": (lambda a: dict(layer=-1), ValueError, "layer must be >= 0, got -1"),
    "layer float": (lambda a: dict(layer=1.0), TypeError, "layer must be an int, got float"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_submit_rejects(pool, name):
    change, error, message = BAD[name]
    args = base_args()
    args.update(change(args))
    positional = [args.pop(k) for k in ("q", "k_cache", "v_cache", "block_table", "counts")]
    with pytest.raises(error, match=message):
        pool.submit(*positional, **args)


def test_valid_arguments_pass(pool):
    args = base_args()
    positional = [args.pop(k) for k in ("q", "k_cache", "v_cache", "block_table", "counts")]
    pool.wait(pool.submit(*positional, **args))


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(num_groups=0), ValueError, "num_groups must be >= 1, got 0"),
        (dict(threads_per_group=1.5), TypeError, "threads_per_group must be an int, got float"),
        (dict(impl="ipex"), ValueError, r"impl must be one of \('auto', 'native', 'torch'\), got 'ipex'"),
        (dict(pin_cores=[0]), ValueError, r"one CPU per worker thread \(2\), got 1"),
        (dict(pin_cores=[0, 4096]), ValueError, r"pin_cores\[1\] = 4096 is not in the pool's CPU set"),
        (dict(pin_cores="all"), ValueError, "pin_cores must be None, 'auto' or a sequence of ints"),
        (dict(cpu_set=[4096]), ValueError, r"cpu_set \[4096\] is not a non-empty subset of this process's CPU set"),
        (dict(cpu_set=[]), ValueError, r"cpu_set \[\] is not a non-empty subset"),
    ],
)
def test_pool_rejects(kwargs, error, message):
    args = dict(num_groups=2, threads_per_group=1, impl="torch")
    args.update(kwargs)
    with pytest.raises(error, match=message):
        CpuAttentionPool(args.pop("num_groups"), args.pop("threads_per_group"), **args)


def test_wait_rejects_other_objects(pool):
    with pytest.raises(TypeError, match="handle must be a CpuAttentionHandle"):
        pool.wait(object())


def test_cpu_tensors_only(pool):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device to build a non-CPU tensor")
    args = base_args()
    args["q"] = args["q"].cuda()
    positional = [args.pop(k) for k in ("q", "k_cache", "v_cache", "block_table", "counts")]
    with pytest.raises(ValueError, match="q must be on the CPU"):
        pool.submit(*positional, **args)
