"""Sparse decode attention over per-KV-head block lists (the device part).

Third op of digest -> select -> device part / CPU part -> merge: one query
token per request attends to the pages listed for each KV head; the result
(o, lse natural log) is merged with the CPU part later.

Split-KV (flash-decoding), so a few long lists still fill the GPU:

    block_table[b, h, :]  | split 0 | split 1 | ... | split n-1 |   (C entries)
                               |         |               |
    stage 1, grid (B, Hkv, n): online softmax over its slice -> (o_s, lse_s)
    stage 2, grid (B, Hq):     LSE merge of the n partials    -> (o, lse)

With one split, stage 1 writes the outputs directly and stage 2 is skipped.
The grid depends only on (B, Hkv, C), never on counts, so the launch is CUDA-
graph friendly; splits that start past a list's count write an empty partial.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from scout_sglang.kernels.triton.handoff import _global_ns
from scout_sglang.kernels.triton.sizes import cdiv, p2

# tl.dot needs every dimension >= 16: the G query heads of a KV head are padded
# to at least 16 rows (decode is bandwidth-bound, the idle MMA rows are free).
_MIN_DOT_DIM = 16
# K/V tile of one loop iteration: BLOCK_T tokens x D. The tile walks the list's
# tokens regardless of page boundaries (several small pages, or part of a big
# one, per iteration). 4096 elements per tile kept ptxas from spilling for
# G <= 8, D in {64, 128, 256} when compiled for sm_80/sm_90 (not yet timed).
_TILE_ELEMENTS = 4096
_MAX_BLOCK_T = 64
# Split heuristic (not yet tuned on a GPU): enough programs to fill the device,
# never a split shorter than _MIN_BLOCKS_PER_SPLIT pages (the merge is not free).
_TARGET_PROGRAMS = 1024
_MIN_BLOCKS_PER_SPLIT = 8
_MAX_SPLITS = 32

_LOG2E = 1.4426950408889634


@triton.jit
def _dot(a, b, DOT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr):
    # fp32-accumulated a @ b; see _interpreter_needs_fp32_dot for DOT_IN_FP32.
    if DOT_IN_FP32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=DOT_PRECISION)


@triton.jit
def _attend_slice(
    batch,
    kv_head,
    split,
    q_ptr,
    k_ptr,
    v_ptr,
    block_table_ptr,
    counts_ptr,
    last_block_len_ptr,
    gate_ptr,
    part_o_ptr,
    part_lse_ptr,
    stride_q_batch,
    stride_q_head,
    stride_k_page,
    stride_k_head,
    stride_k_tok,
    stride_v_page,
    stride_v_head,
    stride_v_tok,
    stride_bt_batch,
    stride_bt_head,
    stride_counts_batch,
    stride_counts_head,
    stride_last_batch,
    stride_last_head,
    stride_po_batch,
    stride_po_head,
    stride_po_split,
    stride_pl_batch,
    stride_pl_head,
    stride_pl_split,
    scale_log2,
    blocks_per_split,
    GROUP_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HAS_LAST_BLOCK_LEN: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    SPLIT_P: tl.constexpr,
    GATED: tl.constexpr,
):
    # The G query heads of one KV head over one slice of that head's block list.
    count = tl.load(counts_ptr + batch * stride_counts_batch + kv_head * stride_counts_head)
    if GATED:  # attend only when the gate word is nonzero; else every list counts as empty
        count = tl.where(tl.load(gate_ptr) != 0, count, 0)
    start = split * blocks_per_split
    end = tl.minimum(start + blocks_per_split, count)
    if HAS_LAST_BLOCK_LEN:
        last_len = tl.load(last_block_len_ptr + batch * stride_last_batch + kv_head * stride_last_head)
    else:
        last_len = BLOCK_SIZE

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    mask_g = offs_g < GROUP_SIZE
    mask_d = offs_d < HEAD_DIM
    q_heads = kv_head * GROUP_SIZE + offs_g
    q = tl.load(
        q_ptr + batch * stride_q_batch + q_heads[:, None] * stride_q_head + offs_d[None, :],
        mask=mask_g[:, None] & mask_d[None, :],
        other=0.0,
    )

    # The slice's tokens as one stream: token j lies in list entry j // S, at
    # row j % S of that page (S is constexpr, so no real division).
    tok_end = end * BLOCK_SIZE
    offs_t = tl.arange(0, BLOCK_T)
    bt_row = block_table_ptr + batch * stride_bt_batch + kv_head * stride_bt_head

    m_i = tl.full((BLOCK_G,), float("-inf"), tl.float32)  # running max, log2 units
    l_i = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), tl.float32)
    for tok_start in range(start * BLOCK_SIZE, tok_end, BLOCK_T):
        tok = tok_start + offs_t
        entry = tok // BLOCK_SIZE
        offs_s = tok % BLOCK_SIZE
        entry_ok = tok < tok_end
        # Padding entries (-1) lie past `end` and are never dereferenced.
        page = tl.load(bt_row + entry, mask=entry_ok, other=0).to(tl.int64)
        valid_len = tl.where(entry == count - 1, last_len, BLOCK_SIZE)
        tok_ok = entry_ok & (offs_s < valid_len)
        kv_mask = tok_ok[:, None] & mask_d[None, :]

        k = tl.load(
            k_ptr + page[:, None] * stride_k_page + kv_head * stride_k_head
            + offs_s[:, None] * stride_k_tok + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        qk = _dot(q, tl.trans(k.to(q.dtype)), DOT_PRECISION, DOT_IN_FP32)  # [BLOCK_G, T] fp32
        qk = tl.where(tok_ok[None, :], qk * scale_log2, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        # A fully masked tile keeps m = -inf; shift by 0 then so no inf - inf.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(qk - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)

        v = tl.load(
            v_ptr + page[:, None] * stride_v_page + kv_head * stride_v_head
            + offs_s[:, None] * stride_v_tok + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        # P goes to the tensor cores in V's dtype. Rounding P alone (as
        # FlashAttention does) costs 2^-9 (bf16) / 2^-12 (fp16) relative per
        # weight; P = hi + lo as two 16-bit operands keeps ~2^-17 for a second
        # MMA, cheap here (decode is bandwidth-bound). Against the fp32
        # reference rounded to fp16 this cut the max error ~4x in our tests.
        p_hi = p.to(v.dtype)
        pv = _dot(p_hi, v, DOT_PRECISION, DOT_IN_FP32)
        if SPLIT_P:
            p_lo = (p - p_hi.to(tl.float32)).to(v.dtype)
            pv += _dot(p_lo, v, DOT_PRECISION, DOT_IN_FP32)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    has = l_i > 0
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, (m_i + tl.log2(tl.where(has, l_i, 1.0))) * 0.6931471805599453, float("-inf"))

    out_mask = mask_g[:, None] & mask_d[None, :]
    tl.store(
        part_o_ptr + batch * stride_po_batch + q_heads[:, None] * stride_po_head
        + split * stride_po_split + offs_d[None, :],
        o.to(part_o_ptr.dtype.element_ty),
        mask=out_mask,
    )
    tl.store(
        part_lse_ptr + batch * stride_pl_batch + q_heads * stride_pl_head + split * stride_pl_split,
        lse,
        mask=mask_g,
    )




@triton.jit
def _sparse_decode_split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    block_table_ptr,
    counts_ptr,
    last_block_len_ptr,
    gate_ptr,
    part_o_ptr,
    part_lse_ptr,
    stride_q_batch,
    stride_q_head,
    stride_k_page,
    stride_k_head,
    stride_k_tok,
    stride_v_page,
    stride_v_head,
    stride_v_tok,
    stride_bt_batch,
    stride_bt_head,
    stride_counts_batch,
    stride_counts_head,
    stride_last_batch,
    stride_last_head,
    stride_po_batch,
    stride_po_head,
    stride_po_split,
    stride_pl_batch,
    stride_pl_head,
    stride_pl_split,
    scale_log2,
    blocks_per_split,
    GROUP_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HAS_LAST_BLOCK_LEN: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    SPLIT_P: tl.constexpr,
    GATED: tl.constexpr,
    num_kv_heads,
    num_items,
    clock_ns_ptr,
    PROGRAMS: tl.constexpr,
    TIMED: tl.constexpr,
):
    # grid: (B, Hkv, num_splits), one program per slice; or, with PROGRAMS (one split), PROGRAMS programs
    # that walk the B x Hkv lists in turn: a bounded share of the SMs (the zero-copy share, whose reads
    # wait on PCIe, beside the layer's own work on the other stream).
    if PROGRAMS == 0:
        _attend_slice(tl.program_id(0), tl.program_id(1), tl.program_id(2), q_ptr, k_ptr, v_ptr, block_table_ptr, counts_ptr, last_block_len_ptr, gate_ptr, part_o_ptr, part_lse_ptr, stride_q_batch, stride_q_head, stride_k_page, stride_k_head, stride_k_tok, stride_v_page, stride_v_head, stride_v_tok, stride_bt_batch, stride_bt_head, stride_counts_batch, stride_counts_head, stride_last_batch, stride_last_head, stride_po_batch, stride_po_head, stride_po_split, stride_pl_batch, stride_pl_head, stride_pl_split, scale_log2, blocks_per_split, GROUP_SIZE, HEAD_DIM, BLOCK_SIZE, HAS_LAST_BLOCK_LEN, BLOCK_G, BLOCK_T, BLOCK_D, DOT_PRECISION, DOT_IN_FP32, SPLIT_P, GATED)
    else:
        if TIMED:
            start = _global_ns()
        for item in range(tl.program_id(0), num_items, PROGRAMS):
            _attend_slice(item // num_kv_heads, item % num_kv_heads, 0, q_ptr, k_ptr, v_ptr, block_table_ptr, counts_ptr, last_block_len_ptr, gate_ptr, part_o_ptr, part_lse_ptr, stride_q_batch, stride_q_head, stride_k_page, stride_k_head, stride_k_tok, stride_v_page, stride_v_head, stride_v_tok, stride_bt_batch, stride_bt_head, stride_counts_batch, stride_counts_head, stride_last_batch, stride_last_head, stride_po_batch, stride_po_head, stride_po_split, stride_pl_batch, stride_pl_head, stride_pl_split, scale_log2, blocks_per_split, GROUP_SIZE, HEAD_DIM, BLOCK_SIZE, HAS_LAST_BLOCK_LEN, BLOCK_G, BLOCK_T, BLOCK_D, DOT_PRECISION, DOT_IN_FP32, SPLIT_P, GATED)
        if TIMED:  # the programs run side by side: their mean time is the launch's, added to the layer's sum
            tl.atomic_add(clock_ns_ptr, (_global_ns() - start) // tl.num_programs(0))


@triton.jit
def _merge_splits_kernel(
    part_o_ptr,
    part_lse_ptr,
    out_o_ptr,
    out_lse_ptr,
    stride_po_batch,
    stride_po_head,
    stride_po_split,
    stride_pl_batch,
    stride_pl_head,
    stride_out_o_batch,
    stride_out_o_head,
    stride_out_lse_batch,
    NUM_SPLITS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SPLITS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # grid: (B, Hq); LSE merge (natural log) of the partials of one query head.
    batch = tl.program_id(0)
    head = tl.program_id(1)
    offs_n = tl.arange(0, BLOCK_SPLITS)
    offs_d = tl.arange(0, BLOCK_D)
    mask_n = offs_n < NUM_SPLITS
    mask_d = offs_d < HEAD_DIM

    lse = tl.load(
        part_lse_ptr + batch * stride_pl_batch + head * stride_pl_head + offs_n, mask=mask_n, other=float("-inf")
    )
    o = tl.load(
        part_o_ptr + batch * stride_po_batch + head * stride_po_head
        + offs_n[:, None] * stride_po_split + offs_d[None, :],
        mask=mask_n[:, None] & mask_d[None, :],
        other=0.0,
    )
    m = tl.max(lse, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp(lse - m_safe)  # 0 for empty splits
    total = tl.sum(w, axis=0)
    has = total > 0
    out = tl.sum(w[:, None] * o, axis=0) / tl.where(has, total, 1.0)
    out_lse = tl.where(has, m_safe + tl.log(tl.where(has, total, 1.0)), float("-inf"))

    tl.store(
        out_o_ptr + batch * stride_out_o_batch + head * stride_out_o_head + offs_d,
        out.to(out_o_ptr.dtype.element_ty),
        mask=mask_d,
    )
    tl.store(out_lse_ptr + batch * stride_out_lse_batch + head, out_lse)


def _interpreter_needs_fp32_dot(q: torch.Tensor) -> bool:
    # Triton runs on CPU tensors only in its interpreter, whose tl.dot (triton
    # 3.9, interpreter.create_dot) multiplies bf16 operands as their raw uint16
    # storage. There the operands, already rounded to bf16, are widened to fp32
    # first: the products are exact either way, so the numerics match the GPU.
    return q.device.type == "cpu" and q.dtype == torch.bfloat16


def _block_t(head_dim: int) -> int:
    return max(_MIN_DOT_DIM, min(_MAX_BLOCK_T, _TILE_ELEMENTS // p2(head_dim)))


def default_num_splits(capacity: int, *, batch_size: int, num_kv_heads: int) -> int:
    """Number of KV splits for lists of `capacity` pages (static for a given shape).

    Splits only when the (B, Hkv) programs alone would leave the GPU idle, and
    never into slices shorter than _MIN_BLOCKS_PER_SPLIT pages.
    """
    by_length = max(1, cdiv(capacity, _MIN_BLOCKS_PER_SPLIT))
    by_occupancy = max(1, cdiv(_TARGET_PROGRAMS, max(1, batch_size * num_kv_heads)))
    return max(1, min(by_length, by_occupancy, _MAX_SPLITS))


@functools.cache
def split_plan(capacity: int, batch_size: int, num_kv_heads: int, head_dim: int, block_size: int,
               num_splits: int | None = None) -> tuple[int, int]:
    """(splits, pages per split) of a launch: whole K/V tiles per split where pages divide a tile, recounted so
    that no split is empty by construction (the splits used may be fewer than asked, never more)."""
    if num_splits is None:
        num_splits = default_num_splits(capacity, batch_size=batch_size, num_kv_heads=num_kv_heads)
    assert num_splits >= 1, num_splits
    pages_per_tile = max(1, _block_t(head_dim) // block_size)
    blocks_per_split = cdiv(max(capacity, 1), num_splits)
    blocks_per_split = cdiv(blocks_per_split, pages_per_tile) * pages_per_tile
    return cdiv(max(capacity, 1), blocks_per_split), blocks_per_split


def workspace_size(max_batch: int, num_qo_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
                   capacities) -> int:
    """fp32 words of a flat workspace that holds the split partials of any launch of up to max_batch rows over
    lists of the given capacities (0 when none splits)."""
    words = 0
    for capacity in capacities:
        for batch_size in range(1, max_batch + 1):
            splits, _ = split_plan(capacity, batch_size, num_kv_heads, head_dim, block_size)
            if splits > 1:
                words = max(words, batch_size * num_qo_heads * splits * (head_dim + 1))
    return words


def sparse_decode_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    counts: torch.Tensor,
    last_block_len: torch.Tensor | None,
    out_o: torch.Tensor,
    out_lse: torch.Tensor,
    *,
    scale: float,
    num_splits: int | None = None,
    workspace: tuple[torch.Tensor, torch.Tensor] | None = None,
    gate: torch.Tensor | None = None,
    programs: int | None = None,
    clock_ns: torch.Tensor | None = None,
) -> None:
    """Decode attention of one query token per request over per-head page lists.

    Parameters
    ----------
    q : [B, Hq, D] fp32/fp16/bf16, contiguous
    k_cache, v_cache : [P, Hkv, S, D], contiguous (q's dtype expected)
    block_table : [B, Hkv, C] int32 page ids; entries at or past `counts` are
        padding (-1) and never read
    counts : [B, Hkv] int32, pages per list (<= C)
    last_block_len : [B, Hkv] int32 or None; tokens valid (1..S) in the last
        counted page of each list; None means every page is full
    out_o : [B, Hq, D], written in its own dtype (0 for empty lists)
    out_lse : [B, Hq] fp32, natural log of sum(exp(scale * q.k)); -inf for
        empty lists
    scale : softmax scale
    num_splits : KV splits per list; None picks default_num_splits(C, ...).
        Slices are rounded to whole K/V tiles where pages divide a tile, so
        the splits used may be fewer (never more).
    workspace : (part_o [B, Hq, >= num_splits, D] fp32, part_lse [B, Hq,
        >= num_splits] fp32), or one flat fp32 tensor of at least
        workspace_size(...) words (a static buffer: nothing is allocated), or
        None; holds the per-split partials when more than one split is used.
        None allocates them per call.
    gate : optional one-element int32 tensor: attend only when it is nonzero,
        else write the results of empty lists (the CPU part's fallback, gated by
        the layer's hand-off status without a host read)
    programs : with one split, at most this many programs, each walking (row, KV head) lists in turn (a bounded
        number of SMs); None: one program per list and split
    clock_ns : with programs, on CUDA: a one-element int64 tensor the launch adds its time to, in ns (the GPU's
        global timer; the programs' mean, as they run side by side)
    """
    batch_size, num_qo_heads, head_dim = q.shape
    _, num_kv_heads, block_size, _ = k_cache.shape
    capacity = block_table.shape[2]
    group_size = num_qo_heads // num_kv_heads
    if batch_size == 0:
        return
    num_splits, blocks_per_split = split_plan(capacity, batch_size, num_kv_heads, head_dim, block_size, num_splits)
    block_t = _block_t(head_dim)

    if num_splits == 1:  # straight into the outputs: the tensors themselves (split stride 0), not views of them
        part_o, part_lse = out_o, out_lse
        po_strides, pl_strides = (out_o.stride(0), out_o.stride(1), 0), (out_lse.stride(0), out_lse.stride(1), 0)
    elif isinstance(workspace, torch.Tensor):  # flat: partial O, then partial LSE
        size = batch_size * num_qo_heads * num_splits * head_dim
        part_o = workspace[:size].view(batch_size, num_qo_heads, num_splits, head_dim)
        part_lse = workspace[size: size + batch_size * num_qo_heads * num_splits].view(
            batch_size, num_qo_heads, num_splits)
    elif workspace is not None:
        part_o, part_lse = workspace[0][:, :, :num_splits], workspace[1][:, :, :num_splits]
    else:
        part_o = torch.empty(batch_size, num_qo_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(batch_size, num_qo_heads, num_splits, dtype=torch.float32, device=q.device)
    if num_splits > 1:
        po_strides, pl_strides = part_o.stride()[:3], part_lse.stride()[:3]

    bounded = programs is not None and num_splits == 1
    grid = (min(programs, batch_size * num_kv_heads), 1, 1) if bounded else (batch_size, num_kv_heads, num_splits)
    if clock_ns is not None and not (bounded and q.is_cuda):
        raise ValueError("clock_ns needs one split, a bounded number of programs and a CUDA device (its clock)")
    _sparse_decode_split_kernel[grid](
        q,
        k_cache,
        v_cache,
        block_table,
        counts,
        counts if last_block_len is None else last_block_len,  # unread when None
        counts if gate is None else gate,  # unread when None
        part_o,
        part_lse,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_table.stride(0),
        block_table.stride(1),
        counts.stride(0),
        counts.stride(1),
        counts.stride(0) if last_block_len is None else last_block_len.stride(0),
        counts.stride(1) if last_block_len is None else last_block_len.stride(1),
        *po_strides,
        *pl_strides,
        scale * _LOG2E,
        blocks_per_split,
        GROUP_SIZE=group_size,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        HAS_LAST_BLOCK_LEN=last_block_len is not None,
        BLOCK_G=max(_MIN_DOT_DIM, p2(group_size)),
        BLOCK_T=block_t,
        BLOCK_D=max(_MIN_DOT_DIM, p2(head_dim)),
        # fp32 must not fall back to TF32 (10-bit mantissa); others use the default.
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else None,
        DOT_IN_FP32=_interpreter_needs_fp32_dot(q),
        SPLIT_P=v_cache.dtype != torch.float32,
        GATED=gate is not None,
        num_kv_heads=num_kv_heads,
        num_items=batch_size * num_kv_heads,
        clock_ns_ptr=counts if clock_ns is None else clock_ns,  # unread without TIMED
        PROGRAMS=programs if bounded else 0,
        TIMED=clock_ns is not None,
        # fp32 tiles (no tensor cores) spilled registers with 4 warps.
        num_warps=8 if q.dtype == torch.float32 else 4,
    )
    if num_splits == 1:
        return
    _merge_splits_kernel[(batch_size, num_qo_heads)](
        part_o,
        part_lse,
        out_o,
        out_lse,
        part_o.stride(0),
        part_o.stride(1),
        part_o.stride(2),
        part_lse.stride(0),
        part_lse.stride(1),
        out_o.stride(0),
        out_o.stride(1),
        out_lse.stride(0),
        NUM_SPLITS=num_splits,
        HEAD_DIM=head_dim,
        BLOCK_SPLITS=p2(num_splits),
        BLOCK_D=p2(head_dim),
    )
