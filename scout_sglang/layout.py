"""The paged KV layout shared by the references, device ops and CPU worker.

Every op in digest -> select -> device part / CPU part -> merge reads KV
through one layout, so a block list produced by selection can be handed to any
of them unchanged.

    k_cache, v_cache : [num_pages, num_kv_heads, block_size, head_dim]   ("HND")

    page p ─┬─ head 0: token 0 .. S-1 rows of D   <- one contiguous S*D run
            ├─ head 1: ...
            └─ head Hkv-1

A block of one KV head is contiguous (S*D elements), so CPU threads stream it
and a per-head block list is just a list of page ids. Viewing the cache as
[num_pages * Hkv, 1, S, D] turns (page, head) into one page of a single-head
cache, which is how FlashInfer consumes per-head lists.

Block lists are fixed-capacity and padded, with counts (CUDA-graph friendly):

    block_table [B, Hkv, C] int32   page ids; entries >= counts are padding (-1)
    counts      [B, Hkv]    int32

Digests are stored per page: digest_min / digest_max [num_pages, Hkv, D] in the
cache dtype (the min/max of bf16 values is exact in bf16). With the estimate of
the unattended blocks on, each page also has a value summary, [num_pages, Hkv,
3, D] in the cache dtype: rows MEAN, SLOPE and AXIS (kernels/value_summary.py).
"""

PAD_BLOCK = -1  # value of unused entries in fixed-capacity block lists
MEAN, SLOPE, AXIS = 0, 1, 2  # the rows of a value summary: the mean value, its slope y = C x, the key axis x
VALUE_SUMMARY_ROWS = 3
SLOPE_ITERATIONS = 8  # power-iteration steps for each block's axis (the reference and every kernel run them all)
