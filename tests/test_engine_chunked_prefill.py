"""A prompt stored in chunks (SGLang's chunked prefill with the scout KV pool)
is stored exactly as the same prompt in one piece, and gather() reads back the
tokens the next chunk attends to; the engine's memory accounting follows the pages."""

import pytest
import torch

from scout_sglang.config import ScoutConfig
from scout_sglang.core.engine import CoAttentionEngine
from scout_sglang.core.shape import ModelShape

SHAPE = ModelShape(num_layers=2, num_qo_heads=4, num_kv_heads=2, head_dim=16)
BLOCK = 8


def make_engine(mode):
    config = ScoutConfig(mode=mode, block_size=BLOCK, token_budget=32, sink_blocks=1, local_blocks=2, cpu_groups=1,
                         dense_layers=())
    return CoAttentionEngine(config, SHAPE, dtype=torch.float32, max_requests=2, max_tokens_per_request=256)


def prompt(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, 2, 16, generator=gen), torch.randn(n, 2, 16, generator=gen)) for _ in range(SHAPE.num_layers)]


def store_in_chunks(engine, rid, kv, cuts):
    engine.add_request(rid)
    bounds = [0, *cuts, kv[0][0].shape[0]]
    for start, end in zip(bounds, bounds[1:]):
        for layer, (k, v) in enumerate(kv):
            if start:  # what the chunk's attention reads before the chunk is stored
                k_prefix, v_prefix = engine.gather(rid, layer, start)
                assert torch.equal(k_prefix, k[:start]) and torch.equal(v_prefix, v[:start])
            engine.extend(rid, layer, start, k[start:end], v[start:end])


@pytest.mark.parametrize("mode", ["scout", "hgca", "full", "quest"])
@pytest.mark.parametrize("cuts", [(5,), (8, 16), (3, 11, 12, 37), (1, 2, 3, 60)])
def test_chunks_store_what_one_prefill_stores(mode, cuts):
    kv = prompt(61)
    whole, chunked = make_engine(mode), make_engine(mode)
    whole.add_request(0)
    for layer, (k, v) in enumerate(kv):
        whole.prefill(0, layer, k, v)
    store_in_chunks(chunked, 0, kv, cuts)
    assert chunked.requests[0].num_tokens == whole.requests[0].num_tokens == 61
    for layer, (k, v) in enumerate(kv):
        for engine in (whole, chunked):
            got_k, got_v = engine.gather(0, layer, 61)
            assert torch.equal(got_k, k) and torch.equal(got_v, v)
    for layer in whole.offloaded_layers:
        for name in ("digest_min", "digest_max", "host_k", "host_v"):
            a, b = getattr(whole.offloaded, name)[layer], getattr(chunked.offloaded, name)[layer]
            assert torch.equal(a, b), name
        for block in whole.offloaded.window_blocks(61):  # the valid tokens of each window page
            page, valid = whole.offloaded.window_page(0, block), min(BLOCK, 61 - block * BLOCK)
            for name in ("dev_k", "dev_v"):
                a, b = getattr(whole.offloaded, name)[layer], getattr(chunked.offloaded, name)[layer]
                assert torch.equal(a[page, :, :valid], b[page, :, :valid]), name


def test_a_chunk_must_continue_where_the_request_stops():
    engine = make_engine("scout")
    store_in_chunks(engine, 0, prompt(20), (10,))
    k, v = prompt(4, seed=1)[0]
    with pytest.raises(ValueError, match="extend at token 12, but 20 tokens are stored"):
        engine.extend(0, 0, 12, k, v)
    with pytest.raises(ValueError, match="21 tokens asked, 20 stored"):
        engine.gather(0, 0, 21)


def test_memory_follows_the_pages_of_the_requests():
    engine = make_engine("scout")
    empty = engine.memory()
    assert empty["tokens"] == 0 and empty["host_bytes_used"] == 0 and empty["device_bytes_used"] == 0
    store_in_chunks(engine, 0, prompt(64), ())
    held = engine.memory()
    token_layer = 2 * SHAPE.num_kv_heads * SHAPE.head_dim * 4
    assert held["tokens"] == 64
    # 8 full blocks on the host in each of the 2 offloaded layers
    assert held["host_bytes_used"] == 2 * 8 * BLOCK * token_layer
    # digests of those 8 blocks plus the request's window/resident pages, per layer
    pages = engine.offloaded.pages_per_request
    assert held["device_bytes_used"] == 2 * (8 * token_layer + pages * BLOCK * token_layer)
    assert held["device_bytes_allocated"] >= held["device_bytes_used"]
    engine.release_request(0)
    assert engine.memory()["host_bytes_used"] == 0 and engine.memory()["device_bytes_used"] == 0
