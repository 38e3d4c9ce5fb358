"""Triton device ops: digest -> score -> sparse decode -> merge.

Imported lazily by the host wrappers in scout_sglang.kernels (importing
scout_sglang.kernels itself never imports triton). Inputs are validated and
contiguous by those wrappers; the functions here launch kernels and write into
caller-provided outputs. Layout: scout_sglang.layout. LSE: natural log, fp32.
"""

from scout_sglang.kernels.triton.decode import default_num_splits, sparse_decode_triton
from scout_sglang.kernels.triton.digest import digests_triton
from scout_sglang.kernels.triton.merge import merge_states_triton
from scout_sglang.kernels.triton.selection import score_blocks_triton

__all__ = [
    "default_num_splits",
    "digests_triton",
    "merge_states_triton",
    "score_blocks_triton",
    "sparse_decode_triton",
]
