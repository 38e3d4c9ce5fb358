"""A corrupt host page table: the engine never reads outside the host store, counts the bad entries, names the
request, layer, block and page, and the other requests' outputs do not change."""

import torch

from scout_sglang.config import ScoutConfig
from scout_sglang.core.engine import CoAttentionEngine
from scout_sglang.core.shape import ModelShape
from scout_sglang.layout import PAD_BLOCK

SHAPE = ModelShape(num_layers=3, num_qo_heads=4, num_kv_heads=2, head_dim=16)


def run(corrupt: bool, cpu_split: str):
    """Two requests, three steps; before the last, (corrupt) request 1's device host table points past the store."""
    config = ScoutConfig(mode="scout", block_size=8, token_budget=48, sink_blocks=1, local_blocks=1, cpu_groups=1,
                         resident_blocks=1, recall_policy="off", cpu_split=cpu_split)
    engine = CoAttentionEngine(config, SHAPE, dtype=torch.float32, max_requests=2, max_tokens_per_request=256)
    gen = torch.Generator().manual_seed(0)
    try:
        for rid in range(2):
            engine.add_request(rid)
            for layer in range(3):
                engine.prefill(rid, layer, *(torch.randn(200, 2, 16, generator=gen) for _ in range(2)))
        outputs, telemetry = [], None
        for step in range(3):
            if corrupt and step == 2:
                table = engine.device_tables["host"].table
                table[1][table[1] != PAD_BLOCK] = engine.offloaded.host_k[1].shape[0] + 7
            engine.begin_step([0, 1])
            for layer in range(3):
                q, k, v = torch.randn(2, 4, 16, generator=gen), *(torch.randn(2, 2, 16, generator=gen) for _ in range(2))
                outputs.append(engine.attend(layer, q, k, v).clone())
            telemetry = engine.end_step()
        listed = {layer: int((engine.buffers.of(layer).cpu_blocks[1] != PAD_BLOCK).sum()) for layer in (1, 2)}
        return outputs, telemetry, listed, engine.offloaded.host_k[1].shape[0]
    finally:
        engine.close()


def test_a_page_past_the_host_store_is_read_as_page_0_counted_and_named_and_only_its_request_changes():
    for cpu_split in ("off", "0.5"):
        clean, clean_telemetry, _, _ = run(False, cpu_split)
        outputs, telemetry, listed, num_pages = run(True, cpu_split)
        assert clean_telemetry.totals().bad_pages == 0 and not clean_telemetry.bad_page_requests
        assert telemetry.totals().bad_pages == sum(listed.values()) > 0, cpu_split
        message = telemetry.bad_page_requests[1]
        assert f"host page {num_pages + 7} of block" in message and f"[0, {num_pages})" in message
        assert "layer 1" in message and list(telemetry.bad_page_requests) == [1]
        assert not telemetry.cpu_fallbacks  # the workers never saw the bad page: no part failed
        for layer, (before, after) in enumerate(zip(clean, outputs)):
            assert torch.equal(before[0], after[0]), layer  # request 0 is untouched
        assert not torch.equal(clean[-1][1], outputs[-1][1])  # request 1's last step read wrong pages
