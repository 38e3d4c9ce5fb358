"""The scout backend under SGLang's full decode CUDA graph (its default), driven on the CPU.

What SGLang's graph runner does, step by step (sglang 0.5.23, decode_cuda_graph_runner):
init_cuda_graph_state; capture at a batch size with a dummy batch
(init_forward_metadata_out_graph(in_capture=True), a warm-up that runs the
real bodies, then the capture of the forward); then every replay: the live
rows copied into the static buffers and the rest padded (request slot 0, the
fill length), init_forward_metadata_out_graph(replay view), and the graph
replayed. No Python runs at replay: the backend's layer call must be kernels
only, over static buffers. Here the engine runs its Triton path under Triton's
interpreter, a capture records the Triton launches of the attention call
(core/launch_program.Recorder) and a replay runs them, and nothing else, after
writing the live q/k/v into the captured buffers (what the model's captured
projections do).

Checked: a replay at the captured size and at a smaller, padded batch with
longer contexts gives the eager backend's outputs for the live rows, the padded
rows stay zero, no captured or engine buffer is reallocated between replays, and
the replayed steps' telemetry reaches the statistics without a read per step.
"""

from __future__ import annotations

import dataclasses
import unittest
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context  # noqa: E402
from sglang.test.kits.attention_unittest.attention_methods import dense_attention as kit  # noqa: E402

from scout_sglang.core.launch_program import Recorder  # noqa: E402
from sglang.srt.model_executor.runner_utils.capture_mode import _set_capture_attention_variant  # noqa: E402

from scout_sglang.sglang_adapter import graph_variants, host_batch, plugin  # noqa: E402
from sglang.srt.model_executor.runner.decode_cuda_graph_runner import build_replay_fb_view  # noqa: E402

CAPTURE_BS, PREFIX = 4, (30, 41, 23, 36)


@pytest.fixture(autouse=True)
def settings(monkeypatch):
    # A sparse budget over these short contexts: selection, resident buffer and CPU part all take part.
    for name, value in dict(SCOUT_KV_POOL="stock", SCOUT_BLOCK_SIZE="4", SCOUT_TOKEN_BUDGET="16", SCOUT_DENSE_LAYERS="",
                            SCOUT_SINK_BLOCKS="1", SCOUT_LOCAL_BLOCKS="1", SCOUT_RECALL_POLICY="interval",
                            SCOUT_RECALL_INTERVAL="1", SCOUT_CPU_GROUPS="1", SCOUT_KERNEL_IMPL="triton").items():
        monkeypatch.setenv(name, value)
    plugin.register()
    with torch.no_grad():
        yield


def build():
    case = kit.DenseAttentionCase(name="scout_graphs", backend="scout", forward_mode=ForwardMode.DECODE,
                                  num_heads=4, num_kv_heads=2, page_size=1, prefix_lens=PREFIX)
    fixture = kit.build_dense_attention_fixture(unittest.TestCase(), case, device="cpu", dtype=torch.bfloat16)
    assert type(fixture.backend).__name__ == "ScoutAttnBackend"
    return fixture


def step_batch(fixture, rows: int, step: int):
    """The fixture's decode batch for its first `rows` requests, `step` tokens later."""
    fb = fixture.forward_batch
    seq_lens = fb.seq_lens[:rows] + step
    batch = dataclasses.replace(
        fb, batch_size=rows, req_pool_indices=fb.req_pool_indices[:rows], seq_lens=seq_lens,
        seq_lens_cpu=seq_lens.cpu(), seq_lens_sum=int(seq_lens.sum()), positions=fb.positions[:rows] + step,
        out_cache_loc=fb.out_cache_loc[:rows], input_ids=fb.input_ids[:rows])  # the engine holds its own K/V
    # what the plugin's hook on ForwardBatch.init_new adds: the scheduler's host copy of the request slots
    host_batch.add_host_slots(batch, None, SimpleNamespace(req_pool_indices_cpu=batch.req_pool_indices.clone()))
    return batch


def attention(fixture, q, k, v, fb):
    """The model's attention call (RadixAttention -> backend.forward), as SGLang's model makes it."""
    with forward_context(ForwardContext(attn_backend=fixture.backend)):
        return fixture.actual_module.attn(q, k, v, fb)


def eager_attention(fixture, fb, hidden):
    q, k, v = fixture.actual_module.project_qkv(hidden)
    fixture.backend.init_forward_metadata(fb)
    return attention(fixture, q, k, v, fb)


def prepare_replay(fixture, static_qkv, hidden, rows: int, step: int) -> None:
    """What precedes a replay's launches: the live rows' q/k/v into the captured buffers (what the captured
    projections write), and the plan of SGLang's replay view, the batch padded to the captured size."""
    for static, live in zip(static_qkv, fixture.actual_module.project_qkv(hidden[:rows])):
        static[:rows] = live
    live, padded = step_batch(fixture, rows, step), step_batch(fixture, CAPTURE_BS, step)
    fill = fixture.backend.get_cuda_graph_seq_len_fill_value()
    padded.req_pool_indices[rows:] = 0
    padded.seq_lens[rows:] = fill
    padded.seq_lens_cpu[rows:] = fill
    buffers = SimpleNamespace(input_ids=padded.input_ids, positions=padded.positions,
                              req_pool_indices=padded.req_pool_indices, seq_lens=padded.seq_lens,
                              seq_lens_cpu=padded.seq_lens_cpu, encoder_lens=None, mamba_track_indices=None)
    arguments = dict(forward_batch=live, buffers=buffers, bs=CAPTURE_BS, raw_bs=rows, num_tokens=CAPTURE_BS,
                     global_num_tokens_cpu=None, seq_len_fill_value=fill, capture_forward_mode=ForwardMode.DECODE,
                     is_encoder_decoder=False)
    view = build_replay_fb_view(**arguments)  # SGLang's view, with what the plugin's AFTER hook adds to it
    host_batch.add_host_view_fields(view, **arguments)
    fixture.backend.init_forward_metadata_out_graph(view)


def test_replays_give_the_eager_outputs_and_reuse_every_buffer():
    eager, graph = build(), build()
    backend, module = graph.backend, graph.actual_module
    hidden = [torch.randn(CAPTURE_BS, module.hidden_size, dtype=torch.bfloat16) for _ in range(2)]
    # Static buffers of the captured graph: the projections' outputs (and the attention output, made at capture).
    q, k, v = (t.clone() for t in module.project_qkv(hidden[0]))
    backend.init_cuda_graph_state(CAPTURE_BS, CAPTURE_BS)
    capture_fb = step_batch(graph, CAPTURE_BS, 0)
    backend.init_forward_metadata_out_graph(capture_fb, in_capture=True)
    warmup = attention(graph, q, k, v, capture_fb)  # a warm-up: the real body over a step of padding rows
    assert torch.count_nonzero(warmup) == 0
    with Recorder() as capture:
        out = attention(graph, q, k, v, capture_fb)
    engine_kernels = {getattr(kernel, "__name__", "") for kernel, *_ in capture.launches}
    assert {"_ring_kernel", "_wait_kernel", "_merge_cpu_part_kernel"} <= engine_kernels, engine_kernels
    engine = backend.engine
    buffers = lambda: [out.data_ptr(), q.data_ptr()] + [t.data_ptr() for t in (  # noqa: E731
        *engine.offloaded.dev_k.values(), *engine.offloaded.host_k.values(), *engine.handoff.q.values(),
        *engine.handoff.out_o.values(), engine.buffers.o, engine.buffers.counters)]
    before = buffers()
    for step, rows in enumerate((CAPTURE_BS, 2)):
        fb = step_batch(eager, rows, step)
        expected = eager_attention(eager, fb, hidden[step][:rows])
        prepare_replay(graph, (q, k, v), hidden[step], rows, step)
        for kernel, grid, args, kwargs in capture.launches:  # the replay: the recorded launches, nothing else
            kernel.run(*args, grid=grid, warmup=False, **kwargs)
        torch.testing.assert_close(out[:rows], expected, rtol=0, atol=0, msg=lambda m: f"step {step}: {m}")
        assert torch.count_nonzero(out[rows:]) == 0, "padded rows must stay zero"
        assert buffers() == before, f"step {step}: a buffer was reallocated"
    report = backend.report()  # between forwards: the replayed steps are committed and their counters read once
    assert report["decode_steps"] == 2 and backend.last_telemetry.totals().cpu_blocks > 0, "the CPU part never ran"
    assert all(engine.requests[slot].num_tokens == prefix + 2 for slot, prefix in zip(range(2), PREFIX))
    assert report["planning_device_reads"] == 0  # every replay planned from host copies (host_batch.py)
    engine.close()
    eager.backend.engine.close()


def test_resident_first_captures_an_exact_graph_and_replays_it_when_every_request_is_exact(monkeypatch):
    """Resident-first with a pool that holds every block: SGLang's runner captures scout's two variants per batch
    size (graph_variants.py), and before each replay asks which one. The first step (its requests not admitted yet,
    their rows not filled) takes the selecting path's graph, the next ones the exact path's, which launches no
    hand-off, merge or prediction; every replay gives the eager backend's outputs, bit for bit."""
    monkeypatch.setenv("SCOUT_RESIDENT_FIRST", "on")
    monkeypatch.setenv("SCOUT_RESIDENT_POOL_BLOCKS", "64")
    eager, graph = build(), build()
    backend, module = graph.backend, graph.actual_module
    variants = graph_variants.ScoutGraphVariants(backend)
    hidden = [torch.randn(CAPTURE_BS, module.hidden_size, dtype=torch.bfloat16) for _ in range(3)]
    q, k, v = (t.clone() for t in module.project_qkv(hidden[0]))
    backend.init_cuda_graph_state(CAPTURE_BS, CAPTURE_BS)
    capture_fb = step_batch(graph, CAPTURE_BS, 0)
    captured, outs = {}, {}
    for label in variants.capture_labels:  # what the runner does per batch size
        _set_capture_attention_variant(label)
        try:
            backend.init_forward_metadata_out_graph(capture_fb, in_capture=True)
            attention(graph, q, k, v, capture_fb)  # the warm-up
            with Recorder() as capture:
                outs[label] = attention(graph, q, k, v, capture_fb)
        finally:
            _set_capture_attention_variant(None)
        captured[label] = capture.launches
    kernels = {label: [getattr(kernel, "__name__", "") for kernel, *_ in launches]
               for label, launches in captured.items()}
    assert {"_ring_kernel", "_wait_kernel", "_merge_cpu_part_kernel"} <= set(kernels["sparse"]), kernels
    assert not {"_ring_kernel", "_wait_kernel", "_merge_cpu_part_kernel", "_score_blocks_kernel"} & set(
        kernels["exact"]) and len(kernels["exact"]) <= 5, kernels
    picked = []
    for step, rows in enumerate((CAPTURE_BS, CAPTURE_BS, 3)):
        label = variants.select(step_batch(graph, rows, step))  # before the replay's planning, as the runner does
        picked.append(label)
        fb = step_batch(eager, rows, step)
        expected = eager_attention(eager, fb, hidden[step][:rows])
        prepare_replay(graph, (q, k, v), hidden[step], rows, step)
        assert backend.engine.plan.exact_step == (label == "exact")
        for kernel, grid, args, kwargs in captured[label]:
            kernel.run(*args, grid=grid, warmup=False, **kwargs)
        torch.testing.assert_close(outs[label][:rows], expected, rtol=0, atol=0, msg=lambda m: f"step {step}: {m}")
    assert picked == ["sparse", "exact", "exact"]
    report = backend.report()
    assert report["decode_steps"] == 3 and backend.last_telemetry.totals().cpu_blocks == 0
    assert not backend.last_telemetry.cpu_fallbacks, backend.last_telemetry.cpu_fallbacks
    assert report["planning_device_reads"] == 0  # the variant's choice and the plan read host copies only
    backend.engine.close()
    eager.backend.engine.close()


def test_the_graph_variants_are_installed_for_one_resident_first_backend(monkeypatch):
    """The runner's create_attention_graph_variants gets scout's variants through the plugin's hook where one
    backend of the process serves resident-first with the exact path; a model's own variants, no such backend or
    two of them keep SGLang's answer."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    assert any(hook is graph_variants.install_variants for _, hook, _ in HookRegistry._hooks[graph_variants.TARGET])
    serving = SimpleNamespace(engine=SimpleNamespace(pool=object(), exact_path=True))
    other = SimpleNamespace(engine=SimpleNamespace(pool=None, exact_path=True))
    for live, installed in (([serving], True), ([other], False), ([serving, serving], False), ([], False)):
        monkeypatch.setattr(plugin, "LIVE_BACKENDS", live)
        variants = graph_variants.install_variants(None, None)
        assert (variants is not None and variants.backend is serving) == installed, live
    assert graph_variants.install_variants("dsa variants", None) is None  # the model's own: kept


def test_capture_batches_beyond_the_request_slots_are_refused():
    backend = build().backend
    with pytest.raises(RuntimeError, match="request slots"):
        backend.init_cuda_graph_state(backend.engine.max_requests + 1, 1)
    backend.engine.close()


def test_the_backend_is_registered_for_the_graph_runner():
    assert "scout" in ATTENTION_BACKENDS


def test_the_stock_layout_writes_the_decoded_token_to_sglangs_pool():
    """SCOUT_KV_POOL=stock keeps SGLang's pool whole (its radix cache may share a finished request's decoded
    tokens, and a rebuilt request is read back from it): each decode step writes its K/V rows there too."""
    fixture = build()
    pool, module = fixture.backend.token_to_kv_pool, fixture.actual_module
    layer_id = module.attn.layer_id
    fb = step_batch(fixture, CAPTURE_BS, 0)
    hidden = torch.randn(CAPTURE_BS, module.hidden_size, dtype=torch.bfloat16)
    _, k, v = module.project_qkv(hidden)
    eager_attention(fixture, fb, hidden)
    rows = fb.out_cache_loc.long()
    heads, dim = pool.get_key_buffer(layer_id).shape[1:]
    assert torch.equal(pool.get_key_buffer(layer_id)[rows], k.view(CAPTURE_BS, heads, dim).to(pool.dtype))
    assert torch.equal(pool.get_value_buffer(layer_id)[rows], v.view(CAPTURE_BS, heads, dim).to(pool.dtype))


@pytest.mark.parametrize("layout", ["stock", "arrival"])
def test_a_request_out_of_step_with_the_engine_is_rebuilt_only_from_a_pool_that_holds_its_decoded_tokens(layout):
    """A request whose engine state lags SGLang's (a missed release): the stock pool holds every token, so it is
    rebuilt from it; the arrival pool holds what arrived and no decoded token, so the request is given up."""
    fixture = build()
    backend, module = fixture.backend, fixture.actual_module
    backend.layout = layout
    hidden = torch.randn(CAPTURE_BS, module.hidden_size, dtype=torch.bfloat16)
    eager_attention(fixture, step_batch(fixture, CAPTURE_BS, 0), hidden)  # first decode: admitted from the pool
    slots = [int(slot) for slot in fixture.forward_batch.req_pool_indices]
    ahead = step_batch(fixture, CAPTURE_BS, 2)  # SGLang two tokens on, the engine one (every request)
    eager_attention(fixture, ahead, hidden)
    given_up = backend.failures.take()
    if layout == "stock":
        assert given_up == {} and backend.failures.counts["decode"] == 0
        for slot, prefix in zip(slots, PREFIX):  # rebuilt at SGLang's length, then decoded
            assert backend.engine.requests[slot].num_tokens == prefix + 3
    else:
        assert sorted(given_up) == sorted(slots)
        assert all("arrival pool holds no decoded token" in message for message in given_up.values())
        assert backend.failures.counts["decode"] == CAPTURE_BS


def test_on_a_gpu_eager_steps_leave_their_counters_on_the_device_until_a_collection():
    """Eager steps (a batch past the captured sizes, or graphs off) on a GPU end unread, as a replayed graph's do:
    a read at each step's end would make the host wait for the step, so SGLang's overlap scheduler could not plan
    the next one meanwhile. Their counters accumulate on the device and a report (or the interval's collection)
    reads them all at once. The CPU device reads every step."""
    fixture = build()
    backend = fixture.backend
    assert backend.read_each_step  # this device is the host's CPU
    backend.read_each_step = False  # what a CUDA device sets
    backend._collected = float("inf")  # no interval collection comes due in this test
    hidden = torch.randn(CAPTURE_BS, fixture.actual_module.hidden_size, dtype=torch.bfloat16)
    for step in range(2):
        eager_attention(fixture, step_batch(fixture, CAPTURE_BS, step), hidden)
    assert backend.stats.decode_steps == 0 and backend.engine.telemetry.steps == 2  # nothing read yet
    report = backend.report()
    assert report["decode_steps"] == 2 and report["planning_device_reads"] == 0
    assert all(backend.engine.requests[slot].num_tokens == prefix + 2 for slot, prefix in enumerate(PREFIX))
    backend.engine.close()
