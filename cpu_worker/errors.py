"""The error a failed CPU attention task surfaces through `CpuAttentionPool.wait`.

Tasks run on worker threads; an exception raised there is kept with the task
and re-raised in the thread that waits, naming the sequence and the layer so a
failure in the CPU part of co-attention can be traced to its request.
"""

from __future__ import annotations


class CpuAttentionError(RuntimeError):
    """A task of one submit failed.

    Attributes
    ----------
    seq_id : int
        Sequence id of the first failed task (from `submit(seq_ids=...)`, else
        its batch index).
    batch_index : int
        Row of that task in the submitted batch.
    layer : int
        Layer given to `submit`.
    num_failed : int
        Tasks of the submit that failed (the first is chained as __cause__).
    """

    def __init__(self, *, seq_id: int, batch_index: int, layer: int, cause: BaseException, num_failed: int = 1):
        self.seq_id = seq_id
        self.batch_index = batch_index
        self.layer = layer
        self.num_failed = num_failed
        more = f"; {num_failed - 1} more task(s) of this submit failed" if num_failed > 1 else ""
        super().__init__(
            f"CPU attention failed for sequence {seq_id} (batch index {batch_index}) at layer {layer}: "
            f"{type(cause).__name__}: {cause}{more}"
        )
