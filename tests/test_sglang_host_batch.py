"""Planning reads no device value (sglang_adapter/host_batch.py): the hooks that hand a decode batch and a decode
graph's replay view the scheduler's host copy of their request slots, and the reader that counts every field it
had to read from a tensor instead."""

import pkgutil
from types import SimpleNamespace

import pytest
import torch
from support import requires_sglang

from scout_sglang.sglang_adapter import host_batch, plugin

pytestmark = requires_sglang


@pytest.fixture
def serving(monkeypatch):
    monkeypatch.setattr(plugin, "LIVE_BACKENDS", [object()])  # a scout backend lives in this process


def decode_mode():
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return ForwardMode.DECODE


def test_the_hooks_target_sglangs_functions_and_are_registered():
    from sglang.srt.plugins.hook_registry import HookRegistry

    plugin.register()
    for target, hook in ((host_batch.INIT_TARGET, host_batch.add_host_slots),
                         (host_batch.REPLAY_VIEW_TARGET, host_batch.add_host_view_fields)):
        owner, name = target.rsplit(".", 1)
        assert callable(getattr(pkgutil.resolve_name(owner), name)), target
        assert any(registered is hook for _, registered, _ in HookRegistry._hooks[target]), target


def test_a_decode_batch_gets_the_schedulers_host_slots(serving):
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    host = torch.tensor([5, 1, 7])
    batch = SimpleNamespace(req_pool_indices_cpu=host)
    result = SimpleNamespace(forward_mode=ForwardMode.DECODE, batch_size=3, req_pool_indices_cpu=None)
    host_batch.add_host_slots(result, ForwardBatch, batch, None)  # the AFTER hook of a classmethod: (result, cls, ...)
    assert result.req_pool_indices_cpu is host
    for mode, size in ((ForwardMode.EXTEND, 3), (ForwardMode.DECODE, 2)):  # not a decode batch; another size
        other = SimpleNamespace(forward_mode=mode, batch_size=size, req_pool_indices_cpu=None)
        host_batch.add_host_slots(other, ForwardBatch, batch, None)
        assert other.req_pool_indices_cpu is None, (mode, size)


def test_without_a_scout_backend_the_batch_is_left_alone(monkeypatch):
    monkeypatch.setattr(plugin, "LIVE_BACKENDS", [])
    result = SimpleNamespace(forward_mode=decode_mode(), batch_size=1, req_pool_indices_cpu=None)
    host_batch.add_host_slots(result, None, SimpleNamespace(req_pool_indices_cpu=torch.tensor([0])), None)
    assert result.req_pool_indices_cpu is None


def test_sglangs_replay_view_gets_the_host_slots_and_request_ids(serving):
    """SGLang's own view builder (unhooked here) leaves both out; the hook adds the live rows' host copies."""
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import build_replay_fb_view

    bs, raw = 4, 2
    forward_batch = SimpleNamespace(
        forward_mode=decode_mode(), seq_lens_sum=40, seq_lens_cpu=torch.tensor([20, 20]), max_seq_len_host=None,
        out_cache_loc=torch.tensor([3, 9]), out_cache_loc_virtual=None, kv_loc_plan=None, kv_loc_cols=None,
        max_seq_len_override=None, spec_info=None, lora_ids=None, can_run_decode_cuda_graph=True,
        req_pool_indices_cpu=torch.tensor([6, 2]), rids=["a", "b"])
    buffers = SimpleNamespace(input_ids=torch.zeros(bs, dtype=torch.int64), positions=torch.zeros(bs),
                              req_pool_indices=torch.tensor([6, 2, 0, 0]), seq_lens=torch.full((bs,), 20),
                              seq_lens_cpu=torch.full((bs,), 20), encoder_lens=None, mamba_track_indices=None)
    kwargs = dict(forward_batch=forward_batch, buffers=buffers, bs=bs, raw_bs=raw, num_tokens=bs,
                  global_num_tokens_cpu=None, seq_len_fill_value=1, capture_forward_mode=decode_mode(),
                  is_encoder_decoder=False)
    view = build_replay_fb_view(**kwargs)
    assert getattr(view, "req_pool_indices_cpu", None) is None  # what the backend would read from the device
    host_batch.add_host_view_fields(view, **kwargs)
    reader = host_batch.HostBatch()
    rows = view.batch_size - view.num_padding
    assert reader.ints(view, "req_pool_indices", rows) == [6, 2] and view.rids == ["a", "b"]
    assert reader.ints(view, "seq_lens", rows) == [20, 20] and reader.device_reads == 0


def test_the_reader_counts_a_field_read_from_its_tensor():
    reader = host_batch.HostBatch()
    batch = SimpleNamespace(req_pool_indices=torch.tensor([3, 4, 5]), req_pool_indices_cpu=None,
                            seq_lens=torch.tensor([9, 9, 9]), seq_lens_cpu=torch.tensor([9, 9, 9]))
    assert reader.ints(batch, "seq_lens", 2) == [9, 9] and reader.device_reads == 0
    assert reader.ints(batch, "req_pool_indices", 2) == [3, 4] and reader.device_reads == 1
    assert reader.ints(batch, "req_pool_indices", 0) == [] and reader.device_reads == 1  # a capture's empty plan
