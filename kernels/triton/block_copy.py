"""Triton gather of rows from page-locked host memory into a device store (CUDA only).

The host tensor's address is valid on the device under unified virtual
addressing (memory from cudaHostAlloc, which torch's pin_memory uses), so the
kernel takes it as an integer and casts it to a pointer. One program per row
of the fixed-length list (scratch entries return at once); the launch grid
depends only on the list's length.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _copy_rows_kernel(src_address, src_rows, dst, dst_rows, skip_row, ROW: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    src_row = tl.load(src_rows + i)
    dst_row = tl.load(dst_rows + i)
    if dst_row == skip_row:  # a scratch entry of the fixed-length list: nothing to move
        return
    src = src_address.to(tl.pointer_type(dst.dtype.element_ty))
    for start in range(0, ROW, BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        mask = offsets < ROW
        values = tl.load(src + src_row * ROW + offsets, mask=mask)
        tl.store(dst + dst_row * ROW + offsets, values, mask=mask)


def copy_rows_from_host_triton(src, src_rows, dst, dst_rows, skip_row: int) -> None:
    row = src.shape[1] * src.shape[2]
    _copy_rows_kernel[(src_rows.shape[0],)](src.data_ptr(), src_rows, dst, dst_rows, skip_row, ROW=row,
                                            BLOCK=min(1024, triton.next_power_of_2(row)))
