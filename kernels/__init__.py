"""Device ops of digest -> select -> device part / CPU part -> merge.

Each op is a host wrapper that validates its inputs and dispatches
(kernels.dispatch): Triton on CUDA, torch on the CPU, FlashInfer for the paged
decode and the merge when it is importable on CUDA. Importing this package
imports neither Triton nor FlashInfer and does not initialise CUDA.
Layout of every paged argument: scout_sglang.layout.
"""

from scout_sglang.kernels.block_copy import copy_block_rows
from scout_sglang.kernels.digest import build_digests, digest_blocks, update_digests
from scout_sglang.kernels.dispatch import select_impl
from scout_sglang.kernels.merge import merge_attention_states, merge_attention_states_
from scout_sglang.kernels.selection import score_blocks, select_topk
from scout_sglang.kernels.sparse_decode import sparse_decode

__all__ = [
    "build_digests",
    "copy_block_rows",
    "digest_blocks",
    "merge_attention_states",
    "merge_attention_states_",
    "score_blocks",
    "select_impl",
    "select_topk",
    "sparse_decode",
    "update_digests",
]
