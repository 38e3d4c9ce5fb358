"""Pure-torch fp32 references of every op, shared by tests and benchmarks.

They start from the same rounded low-precision inputs as the kernels and are
written for clarity, not speed. Layout: scout_sglang.layout. LSE: natural log.
"""

from scout_sglang.reference.attention import dense_decode, gather_head_tokens, merge_states, sparse_decode
from scout_sglang.reference.estimate import block_summaries, estimate_blocks, value_summary_of_block
from scout_sglang.reference.selection import block_digests, quest_scores, select_topk, split_selection, split_shares

__all__ = [
    "block_digests",
    "block_summaries",
    "dense_decode",
    "estimate_blocks",
    "gather_head_tokens",
    "merge_states",
    "quest_scores",
    "select_topk",
    "sparse_decode",
    "split_selection",
    "split_shares",
    "value_summary_of_block",
]
