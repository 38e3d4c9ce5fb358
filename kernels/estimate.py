"""The estimate of the blocks a layer does not attend, merged with the parts it does attend.

digest -> select -> split -> device part / CPU part -> **estimate + merge**.
Top-k attention renormalises over the blocks it keeps; where the attention
mass is spread over the whole context (aggregation), most of it is thrown
away. The estimate gives it back approximately. Per (request, KV head), every
full block that is neither selected nor attended besides the selection (scout's
resident buffer) counts as its `block_size` keys all equal to the midpoint of
its digest, and its attention-weighted value as the block's mean value moved to
first order in the query along the block's axis (kernels/value_summary.py
writes the three rows of its value summary at block fill; reference.estimate
says why):

    weight_b = block_size * exp(scale * q . (kmin_b + kmax_b) / 2)
    value_b  = MEAN_b + scale * (q . AXIS_b) * SLOPE_b
    estimate: lse = log(sum_b weight_b), o = sum_b weight_b * value_b / sum_b weight_b   (natural log)
    out = merge(device part, CPU part (the worker's, or the fallback's), estimate)

The selection holds the window's full blocks (sink, local: forced) and the CPU
list is part of it, so "not selected and not resident" leaves out every block
attended exactly. With nothing left over the estimate is empty (lse = -inf) and
changes nothing. It is computed with the layer's own query, in the launch that
merges: on CUDA one Triton kernel (triton/estimate.py) that takes the place of
the CPU part's merge (kernels/cpu_part.py) in the CPU modes, so those launch
nothing more, and that infinigen and quest launch once more (they merge nothing
otherwise). On the CPU a fixed sequence of torch ops. The fp32 reference:
scout_sglang.reference.estimate_blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from scout_sglang.kernels.checks import ATTENTION_DTYPES, check_shape, check_tensor
from scout_sglang.kernels.dispatch import select_impl
from scout_sglang.kernels.merge import merge_states_torch
from scout_sglang.layout import AXIS, MEAN, SLOPE, VALUE_SUMMARY_ROWS


@dataclass
class UnattendedBlocks:
    """What a layer's estimate reads besides its query: the block summaries, the step's table and what it attends.

    digest_min, digest_max : [P, Hkv, D], value_summary : [P, Hkv, 3, D] per page, in the store's dtype
    block_table : [B, NB] int32 page of each logical block of each row
    num_full : [B] int32 full blocks of each row (the estimate covers blocks [0, num_full) less the attended ones)
    selected, counts : [B, Hkv, K] int32 the selection (PAD past counts) and [B, Hkv] int32 its counts
    resident, slots : [slots, Hkv, R] int32 blocks attended besides the selection, by request slot (scout's
        resident buffer; PAD: empty), and [B] int32/int64 each row's slot; both None where the device attends
        only selected blocks
    block_size, scale : tokens per block, softmax scale
    workspace : flat fp32 buffer of the Triton path's split partials (triton/estimate.workspace_words: the engine
        sizes one static buffer), or None (allocated per call where the walk splits)
    """

    digest_min: torch.Tensor
    digest_max: torch.Tensor
    value_summary: torch.Tensor
    block_table: torch.Tensor
    num_full: torch.Tensor
    selected: torch.Tensor
    counts: torch.Tensor
    resident: torch.Tensor | None
    slots: torch.Tensor | None
    block_size: int
    scale: float
    workspace: torch.Tensor | None = None


@dataclass
class CpuPartResult:
    """A layer's CPU part as the merge finds it (core/cpu_handoff.py): the worker's result, the fallback's, and
    the status that picks one (0: the worker's).

    cpu_o, fb_o : [B, Hq, D] fp32; cpu_lse, fb_lse : [B, Hq] fp32 natural log; status : [1] int32
    zc_o, zc_lse : the CPU split's zero-copy share, attended by the device ([B, Hq, D], [B, Hq] fp32), or None
    """

    cpu_o: torch.Tensor
    cpu_lse: torch.Tensor
    fb_o: torch.Tensor
    fb_lse: torch.Tensor
    status: torch.Tensor
    zc_o: torch.Tensor | None = None
    zc_lse: torch.Tensor | None = None


def merge_with_estimate(q: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, out: torch.Tensor, *,
                        blocks: UnattendedBlocks, cpu: CpuPartResult | None = None,
                        out_lse: torch.Tensor | None = None, impl: str | None = None, validate: bool = True) -> None:
    """out <- merge((o, lse), the CPU part when given, the estimate of the unattended blocks with query q).

    Parameters
    ----------
    q : [B, Hq, D] the layer's query (any float dtype)
    o : [B, Hq, D] the device part (dtype of out), lse : [B, Hq] fp32 natural log
    out : [B, Hq, D]; may be o itself (each row is read before it is written)
    blocks : UnattendedBlocks of the layer
    cpu : the CPU part, merged before the estimate (None: the device part alone)
    out_lse : optional [B, Hq] fp32, the merged LSE (natural log)
    validate : check the arguments (the decode step checks its static buffers once and passes False)
    """
    if validate:
        _check(q, o, lse, out, blocks, cpu, out_lse)
    if select_impl("estimate", q.device.type, impl) == "triton":
        from scout_sglang.kernels.triton.estimate import merge_with_estimate_triton

        merge_with_estimate_triton(q, o, lse, out, out_lse, blocks=blocks, cpu=cpu)
        return
    merged_o, merged_lse = o, lse
    if cpu is not None:
        worker = cpu.status.to(o.device) == 0  # chosen on the device, as the kernel does: no host read
        other_o = torch.where(worker, cpu.cpu_o.to(o.device), cpu.fb_o)
        other_lse = torch.where(worker, cpu.cpu_lse.to(o.device), cpu.fb_lse)
        merged_o, merged_lse = merge_states_torch(o, lse, other_o, other_lse)
        if cpu.zc_o is not None:
            merged_o, merged_lse = merge_states_torch(merged_o, merged_lse, cpu.zc_o, cpu.zc_lse)
    est_o, est_lse = estimate_torch(q, blocks)
    merged_o, merged_lse = merge_states_torch(merged_o, merged_lse, est_o, est_lse)
    out.copy_(merged_o)
    if out_lse is not None:
        out_lse.copy_(merged_lse)


def estimate_torch(q: torch.Tensor, blocks: UnattendedBlocks) -> tuple[torch.Tensor, torch.Tensor]:
    """The estimate alone, batched torch ops -> (o [B, Hq, D] fp32, lse [B, Hq] fp32 natural log, -inf where no
    block is left over). O(B * Hkv * NB * D): the summaries of every block, as the scoring reads the digests."""
    batch_size, num_qo_heads, head_dim = q.shape
    num_kv_heads = blocks.digest_min.shape[1]
    width = blocks.block_table.shape[1]
    pages = blocks.block_table.clamp(min=0).long().flatten()  # padding reads page 0, masked below

    def per_block(summary, order):  # [P, Hkv, D] -> fp32 [B, NB, Hkv, D] permuted to `order`, contiguous
        rows = summary.index_select(0, pages).float().view(batch_size, width, num_kv_heads, head_dim)
        # An explicit copy: matmul would copy a strided operand by itself for some shapes only, and the op sequence
        # would then depend on the batch and head counts (as in selection.py).
        return rows.permute(order).clone(memory_format=torch.contiguous_format)

    key = (per_block(blocks.digest_min, (0, 2, 3, 1)) + per_block(blocks.digest_max, (0, 2, 3, 1))) * 0.5  # [B,Hkv,D,NB]
    summary = blocks.value_summary
    mean = per_block(summary[:, :, MEAN], (0, 2, 1, 3))  # [B, Hkv, NB, D]
    slope = per_block(summary[:, :, SLOPE], (0, 2, 1, 3))
    axis = per_block(summary[:, :, AXIS], (0, 2, 3, 1))  # [B, Hkv, D, NB]
    qf = q.float().view(batch_size, num_kv_heads, num_qo_heads // num_kv_heads, head_dim)
    logits = torch.matmul(qf, key) * blocks.scale  # [B, Hkv, G, NB]
    logits = logits.masked_fill(~unattended_mask(blocks).unsqueeze(2), float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)  # -inf where no block is left over
    finite = torch.isfinite(lse)
    probs = torch.where(finite.unsqueeze(-1), torch.exp(logits - torch.where(finite, lse, 0.0).unsqueeze(-1)), 0.0)
    o = torch.matmul(probs, mean) + torch.matmul(probs * torch.matmul(qf, axis) * blocks.scale, slope)
    lse = lse + math.log(blocks.block_size)  # each block weighs its block_size keys
    return o.view(batch_size, num_qo_heads, head_dim), lse.view(batch_size, num_qo_heads)


def unattended_mask(blocks: UnattendedBlocks) -> torch.Tensor:
    """[B, Hkv, NB] bool: the full blocks of each row and KV head that are neither selected nor resident."""
    batch_size, num_kv_heads, topk = blocks.selected.shape
    width = blocks.block_table.shape[1]
    device = blocks.selected.device
    # Every attended block marks its column; padding and uncounted entries land in one more column, dropped.
    marks = torch.zeros(batch_size, num_kv_heads, width + 1, dtype=torch.int32, device=device)
    counted = torch.arange(topk, device=device) < blocks.counts.unsqueeze(-1)
    attended = [torch.where(counted & (blocks.selected >= 0), blocks.selected, width)]
    if blocks.resident is not None:
        rows = blocks.resident[blocks.slots.long()]  # [B, Hkv, R]
        attended.append(torch.where(rows >= 0, rows, width))
    index = torch.cat(attended, dim=2).long()
    marks.scatter_(2, index, torch.ones_like(index, dtype=torch.int32))
    full = torch.arange(width, device=device) < blocks.num_full.unsqueeze(1)  # [B, NB]
    return full.unsqueeze(1) & (marks[..., :width] == 0)


def _check(q, o, lse, out, blocks, cpu, out_lse):
    rows = "rows"
    check_tensor("o", o, ndim=3, dtypes=ATTENTION_DTYPES, contiguous=rows)
    device = o.device
    batch_size, num_qo_heads, head_dim = o.shape
    check_tensor("q", q, ndim=3, dtypes=ATTENTION_DTYPES, device=device, contiguous=rows)
    check_shape("q", q, o.shape)
    check_tensor("out", out, dtypes=(o.dtype,), device=device, contiguous=rows)
    check_shape("out", out, o.shape)
    for name, t in (("lse", lse), ("out_lse", out_lse)):
        if t is not None:
            check_tensor(name, t, dtypes=(torch.float32,), device=device, contiguous=rows)
            check_shape(name, t, (batch_size, num_qo_heads))
    pages, heads, dim = blocks.digest_min.shape
    summaries = (("digest_min", blocks.digest_min, (pages, heads, dim)),
                 ("digest_max", blocks.digest_max, (pages, heads, dim)),
                 ("value_summary", blocks.value_summary, (pages, heads, VALUE_SUMMARY_ROWS, dim)))
    for name, t, shape in summaries:
        check_tensor(name, t, ndim=len(shape), dtypes=ATTENTION_DTYPES, device=device)
        check_shape(name, t, shape)
        if t.dtype != blocks.digest_min.dtype:
            raise TypeError(f"{name} must have the digests' dtype {blocks.digest_min.dtype}, got {t.dtype}")
    num_kv_heads = blocks.digest_min.shape[1]
    if blocks.digest_min.shape[2] != head_dim or num_qo_heads % num_kv_heads:
        raise ValueError(f"the summaries [P, Hkv, D] = {tuple(blocks.digest_min.shape)} do not fit the query "
                         f"[B, Hq, D] = {tuple(q.shape)}")
    index = (torch.int32,)
    check_tensor("block_table", blocks.block_table, ndim=2, dtypes=index, device=device, contiguous=rows)
    check_shape("num_full", blocks.num_full, (batch_size,))
    check_tensor("num_full", blocks.num_full, dtypes=index, device=device, contiguous=False)
    if blocks.block_table.shape[0] != batch_size:
        raise ValueError(f"block_table must have {batch_size} rows, got {blocks.block_table.shape[0]}")
    check_tensor("selected", blocks.selected, ndim=3, dtypes=index, device=device, contiguous=rows)
    if blocks.selected.shape[:2] != (batch_size, num_kv_heads):
        raise ValueError(f"selected must be [{batch_size}, {num_kv_heads}, K], got {tuple(blocks.selected.shape)}")
    check_tensor("counts", blocks.counts, dtypes=index, device=device, contiguous=rows)
    check_shape("counts", blocks.counts, (batch_size, num_kv_heads))
    if (blocks.resident is None) != (blocks.slots is None):
        raise ValueError("resident and slots go together: pass both or neither")
    if blocks.resident is not None:
        check_tensor("resident", blocks.resident, ndim=3, dtypes=index, device=device, contiguous=rows)
        if blocks.resident.shape[1] != num_kv_heads:
            raise ValueError(f"resident must be [slots, {num_kv_heads}, R], got {tuple(blocks.resident.shape)}")
        check_tensor("slots", blocks.slots, ndim=1, dtypes=(torch.int32, torch.int64), device=device,
                     contiguous=False)
        check_shape("slots", blocks.slots, (batch_size,))
    if blocks.block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {blocks.block_size}")
    if cpu is not None:
        for name, t, shape in (("cpu_o", cpu.cpu_o, o.shape), ("fb_o", cpu.fb_o, o.shape),
                               ("cpu_lse", cpu.cpu_lse, lse.shape), ("fb_lse", cpu.fb_lse, lse.shape)):
            check_tensor(name, t, dtypes=(torch.float32,), contiguous=rows)
            check_shape(name, t, shape)
        if (cpu.zc_o is None) != (cpu.zc_lse is None):
            raise ValueError("zc_o and zc_lse go together: pass both or neither")
        if cpu.zc_o is not None:
            for name, t, shape in (("zc_o", cpu.zc_o, o.shape), ("zc_lse", cpu.zc_lse, lse.shape)):
                check_tensor(name, t, dtypes=(torch.float32,), device=device, contiguous=rows)
                check_shape(name, t, shape)
        check_tensor("status", cpu.status, dtypes=(torch.int32,), device=device)
        check_shape("status", cpu.status, (1,))
