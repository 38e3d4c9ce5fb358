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
