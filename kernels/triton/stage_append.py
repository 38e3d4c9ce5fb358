"""The append stage of the decode step, one program per (request, KV head).

Writes the step's new token (K and V) into its page. When the token completes
the block (its offset is S - 1), the same program also writes the block's
digest (min and max of K per channel), with the estimate on its value summary
(triton/value_summary.py), and, for an offloaded layer, the whole
block into the host store (page-locked on CUDA, written through unified
addressing): masked stores, so the launch is the same in every step.

The completed block is read back from its page with the new token taken from
registers: the token's own store, by other threads of the program, is not
guaranteed visible yet.
"""

from __future__ import annotations

import triton
import triton.language as tl
from scout_sglang.kernels.triton.lists import as_mask
from scout_sglang.kernels.triton.sizes import p2
from scout_sglang.kernels.triton.value_summary import store_value_summary, value_summary_rows


@triton.jit
def _append_token_kernel(
    k_new_ptr, v_new_ptr, k_ptr, v_ptr, pages_ptr, offsets_ptr, digest_min_ptr, digest_max_ptr, digest_rows_ptr,
    value_summary_ptr, host_k_ptr, host_v_ptr, host_rows_ptr,
    stride_new_batch, stride_new_head, stride_vnew_batch, stride_vnew_head, stride_k_page, stride_k_head, stride_k_tok, stride_v_page, stride_v_head,
    stride_v_tok, stride_pages, stride_offsets, stride_dig_row, stride_dig_head, stride_dig_rows, stride_mean_row,
    stride_mean_head, stride_mean_part, stride_host_page, stride_host_head, stride_host_tok, stride_host_rows,
    BLOCK_SIZE: tl.constexpr, SIZE_P2: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_P2: tl.constexpr,
    DIGEST: tl.constexpr, VALUE_SUMMARY: tl.constexpr, HOST: tl.constexpr,
):  # fmt: skip
    # grid: (B, Hkv).
    batch = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    d = tl.arange(0, DIM_P2)
    in_dim = d < HEAD_DIM
    page = tl.load(pages_ptr + batch * stride_pages).to(tl.int64)
    offset = tl.load(offsets_ptr + batch * stride_offsets)
    k = tl.load(k_new_ptr + batch * stride_new_batch + head * stride_new_head + d, mask=in_dim)
    v = tl.load(v_new_ptr + batch * stride_vnew_batch + head * stride_vnew_head + d, mask=in_dim)
    k = k.to(k_ptr.dtype.element_ty)
    v = v.to(v_ptr.dtype.element_ty)
    k_page = k_ptr + page * stride_k_page + head * stride_k_head
    v_page = v_ptr + page * stride_v_page + head * stride_v_head
    tl.store(k_page + offset * stride_k_tok + d, k, mask=in_dim)
    tl.store(v_page + offset * stride_v_tok + d, v, mask=in_dim)
    if DIGEST or HOST:
        s = tl.arange(0, SIZE_P2)
        fills = as_mask(offset == BLOCK_SIZE - 1, s)[:, None]  # [S, 1]
        rows = (s < BLOCK_SIZE)[:, None] & in_dim[None, :]
        older = rows & (s != offset)[:, None] & fills
        new_row = (s == offset)[:, None]
        k_block = tl.load(k_page + s[:, None] * stride_k_tok + d[None, :], mask=older, other=0.0)
        k_block = tl.where(new_row, k[None, :], k_block)
        if DIGEST:
            row = tl.load(digest_rows_ptr + batch * stride_dig_rows).to(tl.int64)
            k_min = tl.min(tl.where(rows, k_block, float("inf")), axis=0)
            k_max = tl.max(tl.where(rows, k_block, float("-inf")), axis=0)
            digest = row * stride_dig_row + head * stride_dig_head + d
            tl.store(digest_min_ptr + digest, k_min.to(digest_min_ptr.dtype.element_ty), mask=in_dim & as_mask(offset == BLOCK_SIZE - 1, d))
            tl.store(digest_max_ptr + digest, k_max.to(digest_max_ptr.dtype.element_ty), mask=in_dim & as_mask(offset == BLOCK_SIZE - 1, d))
        if VALUE_SUMMARY or HOST:
            v_block = tl.load(v_page + s[:, None] * stride_v_tok + d[None, :], mask=older, other=0.0)
            v_block = tl.where(new_row, v[None, :], v_block)
        # The value summary's power iteration only where the token completes its block: a branch of the whole
        # program (one (request, KV head)), so the launch stays the same and the other programs skip the work.
        if VALUE_SUMMARY:
            if offset == BLOCK_SIZE - 1:  # the rows past the block size: masked out of every sum
                mean, slope, axis = value_summary_rows(k_block.to(tl.float32), v_block.to(tl.float32), rows, in_dim,
                                                       BLOCK_SIZE, HEAD_DIM)
                row = tl.load(digest_rows_ptr + batch * stride_dig_rows).to(tl.int64)
                store_value_summary(value_summary_ptr + row * stride_mean_row + head * stride_mean_head + d,
                                    stride_mean_part, mean, slope, axis, in_dim)
        if HOST:
            host = tl.load(host_rows_ptr + batch * stride_host_rows).to(tl.int64) * stride_host_page
            host += head * stride_host_head + s[:, None] * stride_host_tok + d[None, :]
            tl.store(host_k_ptr + host, k_block, mask=rows & fills)
            tl.store(host_v_ptr + host, v_block, mask=rows & fills)


def append_token_triton(k_new, v_new, k_store, v_store, pages, offsets, *, digest_min, digest_max, digest_rows,
                        value_summary, host_k, host_v, host_rows) -> None:
    """Launch the append stage; arguments as stage_append.append_token (validated there)."""
    batch_size, num_kv_heads, head_dim = k_new.shape
    if batch_size == 0:
        return
    digest, host = digest_min is not None, host_k is not None
    mean = digest and value_summary is not None  # the summary goes to the digests' row: never without them
    block_size = k_store.shape[2]
    unused = pages  # pointer arguments that a disabled branch never reads
    _append_token_kernel[(batch_size, num_kv_heads)](
        k_new, v_new, k_store, v_store, pages, offsets, digest_min if digest else unused,
        digest_max if digest else unused, digest_rows if digest else unused, value_summary if mean else unused,
        host_k if host else unused,
        host_v if host else unused, host_rows if host else unused,
        k_new.stride(0), k_new.stride(1), v_new.stride(0), v_new.stride(1), *k_store.stride()[:3], *v_store.stride()[:3], pages.stride(0),
        offsets.stride(0), *(digest_min.stride()[:2] if digest else (0, 0)), digest_rows.stride(0) if digest else 0,
        *(value_summary.stride()[:3] if mean else (0, 0, 0)), *(host_k.stride()[:3] if host else (0, 0, 0)),
        host_rows.stride(0) if host else 0,
        BLOCK_SIZE=block_size, SIZE_P2=p2(block_size), HEAD_DIM=head_dim,
        DIM_P2=p2(head_dim), DIGEST=digest, VALUE_SUMMARY=mean, HOST=host,
    )  # fmt: skip
