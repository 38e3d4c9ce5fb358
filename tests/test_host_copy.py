"""host_copy.to_device: host values onto the device without the host waiting for the stream (planning runs while
the device still runs the step before)."""

import pytest
import torch
from support import requires_cuda

from scout_sglang.core.host_copy import to_device


def test_lists_and_host_tensors_arrive_with_their_values_and_dtype():
    assert to_device([3, 1, 2], "cpu", torch.long).tolist() == [3, 1, 2]
    assert to_device([True, False], "cpu", torch.bool).dtype == torch.bool
    host = torch.tensor([7, 8], dtype=torch.int32)
    moved = to_device(host, "cpu", torch.long)
    assert moved.dtype == torch.long and moved.tolist() == [7, 8]


@requires_cuda
def test_on_a_gpu_the_copy_neither_waits_for_the_stream_nor_sees_later_changes():
    """A kernel keeps the stream busy: the copy returns while it runs (the stream has not drained), and a change to
    the host values right after the call does not reach the device copy (a page-locked snapshot)."""
    host = torch.arange(1024, dtype=torch.int32)
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # a few hundred ms of one kernel
    moved = to_device(host, "cuda")
    busy = not torch.cuda.current_stream().query()
    host.fill_(-1)
    torch.cuda.synchronize()
    assert busy, "the copy waited for the stream"
    assert moved.cpu().tolist() == list(range(1024))
    with pytest.raises(TypeError):
        to_device(object(), "cuda")
