"""The CPU part's hand-off on a CUDA stream: ring the doorbell, wait for the worker with a deadline, merge.

digest -> select -> split -> device part / CPU part -> **merge**. Protocol and
words: scout_sglang.handoff_words. Both the ring and the wait are one-program
kernels, so a captured CUDA graph replays them with the step (no host step):

    ring   after the split stage staged the part (an earlier kernel: its stores are out), ROWS, a system-scope
           fence, then DOORBELL = SEQ, and the ring time (%globaltimer) for the deadline; nothing when the
           plan says BYPASS (device-only)
    wait   spin on DONE (volatile, system scope) until it equals SEQ or the deadline passes: the layer's status
           is the worker's STATUS, DEADLINE, or DEVICE_ONLY (bypass)

A device stream wait can never time out on its own, so the spin reads the
GPU's global timer and gives up (TransformerEngine waits on a flag the same
way, then resets it; the sequence number makes a reset unnecessary here).

The merge takes the worker's result where the status is OK and the fallback's
otherwise (the part computed on the device from the same staging, a sparse
decode whose counts are zeroed where the status is OK).

Triton's interpreter runs the same kernels on the CPU device for the tests (a
whole step then is launches only): there is no GPU clock, so the deadline
counts spin iterations instead, and the wait time is not measured.
"""

from __future__ import annotations

import triton
import triton.language as tl
from scout_sglang.kernels.triton.merge import BLOCK_H, merge_tile
from scout_sglang.kernels.triton.sizes import cdiv, p2

from scout_sglang.handoff_words import (
    DONE,
    DOORBELL,
    HEADER_BYPASS,
    HEADER_ROWS,
    HEADER_SEQ,
    ROWS,
    STATUS,
    STATUS_DEADLINE,
    STATUS_DEVICE_ONLY,
)


@triton.jit
def _global_ns():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _fence_system():
    # Orders this thread's earlier stores before its later ones for every observer, the host's CPUs included.
    return tl.inline_asm_elementwise("fence.sc.sys; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _clock(iteration, CLOCK: tl.constexpr):
    # The GPU's global timer in ns; without it (Triton's interpreter has none) the spin's iteration count.
    if CLOCK:
        return _global_ns()
    else:
        return iteration.to(tl.int64)


@triton.jit
def _ring_kernel(header_ptr, words_ptr, ring_ns_ptr, SEQ: tl.constexpr, ROWS_H: tl.constexpr,
                 BYPASS: tl.constexpr, ROWS_W: tl.constexpr, DOORBELL_W: tl.constexpr, CLOCK: tl.constexpr):
    if tl.load(header_ptr + BYPASS) == 0:
        # Plain stores to page-locked memory (atomics there need PCIe atomics), ROWS ordered before DOORBELL.
        tl.store(words_ptr + ROWS_W, tl.load(header_ptr + ROWS_H))
        if CLOCK:
            _fence_system()
        tl.store(words_ptr + DOORBELL_W, tl.load(header_ptr + SEQ))
    tl.store(ring_ns_ptr, _clock(tl.zeros((), tl.int64), CLOCK))


@triton.jit
def _wait_kernel(header_ptr, words_ptr, ring_ns_ptr, status_ptr, wait_ns_ptr, window_ns_ptr, outcomes_ptr, deadline,
                 SEQ: tl.constexpr, BYPASS: tl.constexpr, DONE_W: tl.constexpr, STATUS_W: tl.constexpr,
                 LATE: tl.constexpr, DEVICE_ONLY: tl.constexpr, CLOCK: tl.constexpr):
    seq = tl.load(header_ptr + SEQ)
    iteration = tl.zeros((), tl.int64)
    start = _clock(iteration, CLOCK)
    status = tl.full((), DEVICE_ONLY, tl.int32)
    if tl.load(header_ptr + BYPASS) == 0:
        give_up = tl.load(ring_ns_ptr) + deadline
        done = tl.load(words_ptr + DONE_W, volatile=True)
        now = start
        while (done != seq) & (now < give_up):
            done = tl.load(words_ptr + DONE_W, volatile=True)
            iteration += 1
            now = _clock(iteration, CLOCK)
        worker = tl.load(words_ptr + STATUS_W, volatile=True)
        status = tl.where(done == seq, worker, LATE).to(tl.int32)
    tl.store(status_ptr, status)
    tl.store(outcomes_ptr + status, tl.load(outcomes_ptr + status) + 1)
    if CLOCK:
        tl.store(wait_ns_ptr, tl.load(wait_ns_ptr) + (_global_ns() - start))
        # the part's window: the device's work between the ring and this wait (what the CPU split sizes it to)
        tl.store(window_ns_ptr, tl.load(window_ns_ptr) + (start - tl.load(ring_ns_ptr)))


@triton.jit
def _merge_cpu_part_kernel(o_ptr, lse_ptr, cpu_o_ptr, cpu_lse_ptr, fb_o_ptr, fb_lse_ptr, status_ptr, zc_o_ptr,
                           zc_lse_ptr, out_ptr, stride_o_row, stride_o_head, stride_lse_row, stride_cpu_o_row,
                           stride_cpu_o_head, stride_cpu_lse_row, stride_fb_o_row, stride_fb_o_head, stride_fb_lse_row,
                           stride_zc_o_row, stride_zc_o_head, stride_zc_lse_row, stride_out_row, stride_out_head,
                           num_heads, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
                           ZERO_COPY: tl.constexpr):
    # grid: (rows, cdiv(H, BLOCK_H)); natural-log LSE merge of the device part with the CPU part or its fallback.
    row = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    in_h = h < num_heads
    tile = in_h[:, None] & (d < HEAD_DIM)[None, :]
    worker = (h * 0 + tl.load(status_ptr)) == 0  # the worker's result is good
    fallback = ~worker
    lse_a = tl.load(lse_ptr + row * stride_lse_row + h, mask=in_h, other=float("-inf"))
    o_a = tl.load(o_ptr + row * stride_o_row + h[:, None] * stride_o_head + d[None, :], mask=tile, other=0.0)
    lse_b = tl.where(worker, tl.load(cpu_lse_ptr + row * stride_cpu_lse_row + h, mask=in_h & worker, other=0.0),
                     tl.load(fb_lse_ptr + row * stride_fb_lse_row + h, mask=in_h & fallback, other=0.0))
    o_b = tl.where(worker[:, None],
                   tl.load(cpu_o_ptr + row * stride_cpu_o_row + h[:, None] * stride_cpu_o_head + d[None, :],
                           mask=tile & worker[:, None], other=0.0),
                   tl.load(fb_o_ptr + row * stride_fb_o_row + h[:, None] * stride_fb_o_head + d[None, :],
                           mask=tile & fallback[:, None], other=0.0).to(tl.float32))
    lse_b = tl.where(in_h, lse_b, float("-inf"))
    out, lse = merge_tile(o_a.to(tl.float32), lse_a, o_b, lse_b)
    if ZERO_COPY:  # the CPU split's other share, attended by the device from the host store
        zc_lse = tl.load(zc_lse_ptr + row * stride_zc_lse_row + h, mask=in_h, other=float("-inf"))
        zc_o = tl.load(zc_o_ptr + row * stride_zc_o_row + h[:, None] * stride_zc_o_head + d[None, :], mask=tile,
                       other=0.0)
        out, lse = merge_tile(out, lse, zc_o.to(tl.float32), zc_lse)
    tl.store(out_ptr + row * stride_out_row + h[:, None] * stride_out_head + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=tile)


# Without the GPU's clock (the interpreter), a deadline counts spin iterations, this many ns each (a guess that
# errs long: an interpreted iteration takes longer).
_NS_PER_ITERATION = 10_000


def ring_triton(header, words, ring_ns) -> None:
    _ring_kernel[(1,)](header, words, ring_ns, SEQ=HEADER_SEQ, ROWS_H=HEADER_ROWS, BYPASS=HEADER_BYPASS,
                       ROWS_W=ROWS, DOORBELL_W=DOORBELL, CLOCK=header.is_cuda)


def wait_triton(header, words, ring_ns, status, wait_ns, window_ns, outcomes, *, deadline_ns: int) -> None:
    clock = header.is_cuda
    deadline = deadline_ns if clock else max(1, deadline_ns // _NS_PER_ITERATION)
    _wait_kernel[(1,)](header, words, ring_ns, status, wait_ns, window_ns, outcomes, deadline, SEQ=HEADER_SEQ, BYPASS=HEADER_BYPASS,
                       DONE_W=DONE, STATUS_W=STATUS, LATE=STATUS_DEADLINE, DEVICE_ONLY=STATUS_DEVICE_ONLY, CLOCK=clock)


def merge_cpu_part_triton(o, lse, cpu_o, cpu_lse, fb_o, fb_lse, status, out, *, zero_copy=None) -> None:
    rows, num_heads, head_dim = o.shape
    if rows == 0:
        return
    block_h = BLOCK_H
    zc_o, zc_lse = zero_copy if zero_copy is not None else (fb_o, fb_lse)  # never read without ZERO_COPY
    _merge_cpu_part_kernel[(rows, cdiv(num_heads, block_h))](
        o, lse, cpu_o, cpu_lse, fb_o, fb_lse, status, zc_o, zc_lse, out, o.stride(0), o.stride(1), lse.stride(0),
        cpu_o.stride(0), cpu_o.stride(1), cpu_lse.stride(0), fb_o.stride(0), fb_o.stride(1), fb_lse.stride(0),
        zc_o.stride(0), zc_o.stride(1), zc_lse.stride(0), out.stride(0), out.stride(1), num_heads, HEAD_DIM=head_dim,
        BLOCK_H=block_h, BLOCK_D=p2(head_dim), ZERO_COPY=zero_copy is not None,
    )  # fmt: skip
