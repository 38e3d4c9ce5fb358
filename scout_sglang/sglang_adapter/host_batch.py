"""A decode step's batch as the host knows it: planning reads no device value.

The backend plans each decode step from the batch's request slots and lengths. SGLang 0.5.23 keeps a host copy
of the lengths on every forward batch (`seq_lens_cpu`), but a host copy of the request slots
(`req_pool_indices_cpu`) only on prefill batches; a decode graph's replay view carries neither's original, only
the padded device buffers. Read from the device tensor, the slots cost a device read per step: on a GPU
the host then waits for the stream, that is for the previous step's whole forward, before it can plan. SGLang's
overlap scheduler, which plans and launches step N+1 while step N runs, stops overlapping.

Two AFTER hooks (plugin.py registers them) hand the backend the scheduler's own host copy instead:
  ForwardBatch.init_new       a decode batch gets the ScheduleBatch's `req_pool_indices_cpu` (which the
                              scheduler keeps through every filter and merge of its running batch)
  build_replay_fb_view        a replay view gets the batch's host slots and request ids (unpadded: the backend
                              reads the live rows only)
Both act only in a process that serves scout. `HostBatch` reads a field from its host copy, and counts every
read it had to make from the tensor instead (`device_reads`, on /server_info as `planning_device_reads`): on a
GPU each is a stream sync, and the serving tests assert none happens.
"""

from __future__ import annotations

INIT_TARGET = "sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new"
REPLAY_VIEW_TARGET = "sglang.srt.model_executor.runner.decode_cuda_graph_runner.build_replay_fb_view"


def _serves_scout() -> bool:
    from scout_sglang.sglang_adapter.plugin import LIVE_BACKENDS

    return len(LIVE_BACKENDS) > 0


def add_host_slots(result, *args, **kwargs):
    """AFTER hook on ForwardBatch.init_new(cls, batch, model_runner, ...): a decode batch without a host copy of its
    request slots gets the ScheduleBatch's, when it has one of the batch's size."""
    batch = args[1] if len(args) > 1 else kwargs.get("batch")
    if result is None or getattr(result, "req_pool_indices_cpu", None) is not None or not _serves_scout():
        return None
    mode = getattr(result, "forward_mode", None)
    host = getattr(batch, "req_pool_indices_cpu", None)
    if mode is None or not mode.is_decode() or host is None or len(host) != result.batch_size:
        return None
    result.req_pool_indices_cpu = host
    return None


def add_host_view_fields(result, *args, **kwargs):
    """AFTER hook on build_replay_fb_view(forward_batch=..., ...): the view gets the batch's host request slots and
    request ids (SGLang's view builds neither)."""
    forward_batch = kwargs.get("forward_batch", args[0] if args else None)
    if result is None or forward_batch is None or not _serves_scout():
        return None
    host = getattr(forward_batch, "req_pool_indices_cpu", None)
    if host is not None and getattr(result, "req_pool_indices_cpu", None) is None:
        result.req_pool_indices_cpu = host
    if getattr(result, "rids", None) is None:
        result.rids = getattr(forward_batch, "rids", None)
    return None


class HostBatch:
    """Reads a forward batch's per-request fields for planning from their host copies (`<name>_cpu`); a field
    without one is read from its tensor (a device read on a GPU) and counted in `device_reads`."""

    def __init__(self):
        self.device_reads = 0

    def ints(self, forward_batch, name: str, rows: int) -> list[int]:
        """The first `rows` values of the batch's field `name` as Python ints."""
        if rows <= 0:
            return []
        host = getattr(forward_batch, f"{name}_cpu", None)
        if host is None:
            self.device_reads += 1
            host = getattr(forward_batch, name)
        return host[:rows].tolist()
