"""Launch sizes of the fused stages, cached: a decode step launches with the same shapes every layer, and
triton's own helpers cost dozens of Python lines a call (they are constexpr functions); and the arguments of a
disabled branch. Host code only."""

from __future__ import annotations

import functools

import triton


@functools.cache
def p2(n: int) -> int:
    """The next power of two >= n (at least 1)."""
    return triton.next_power_of_2(max(int(n), 1))


@functools.cache
def cdiv(a: int, b: int) -> int:
    return triton.cdiv(a, b)


def or_unused(tensor, unused, n: int) -> tuple:
    """(tensor, its first n strides), or a pointer a disabled branch never reads and zero strides."""
    return (unused, (0,) * n) if tensor is None else (tensor, tensor.stride()[:n])


# The widest lists the fused stages compare all pairs (lists.contains, lists.place): [256, 256] matrices, what a
# sparse row and the first resident-first rows took; wider lists sort instead (lists.member, lists.compact).
ALL_PAIRS_LIMIT = 1 << 16


def wide_lists(*lengths: int) -> bool:
    """Whether lists of these lengths are too wide to compare all pairs."""
    return p2(max(lengths)) ** 2 > ALL_PAIRS_LIMIT


# The block-id histogram of the wide lists' lookups (lists.member_of): int32 counts in shared memory, 64 KiB at
# most.
MAX_BINS = 1 << 14


def bins_for(num_blocks: int) -> int:
    """The histogram's bins for block ids below `num_blocks` (one spare), or 0 where that passes MAX_BINS (a table
    of more than 16383 blocks): wide lists then cannot be looked up, and the engine keeps rows to 256 columns."""
    bins = p2(num_blocks + 1)
    return bins if bins <= MAX_BINS else 0


# Warps of a program that holds a wide row (its config's WIDE: lists past the all-pairs width). Such a program
# sorts and counts up to 4096 entries in one row; Triton unrolls each thread's share of them, so at its default of
# 4 warps a thread runs 32 entries' worth of code, at 16 warps 8: about a third of the code and of the compile time
# (benchmarks/results/kernel_widths.md), and a row spread over 4x the threads of its SM, where a batch of a few
# requests has a program per request and KV head to run. Narrow rows keep the default.
DEFAULT_WARPS = 4
WIDE_ROW_WARPS = 16


def warps_for(config: dict) -> int:
    """The warps a fused stage launches with at its configuration (`num_warps`)."""
    return WIDE_ROW_WARPS if config.get("WIDE") else DEFAULT_WARPS
