"""The scout backend in the other ways users deploy it, through the real SGLang
server on a Qwen3 model (q_norm on the predicted query): split prefill/decode
backends at a sparse budget (output equals the reference decoder), the decode
instance of a prefill/decode disaggregated deployment, and requests that SGLang
retracts and recomputes."""

import concurrent.futures
import re

import pytest
from sparse_reference import random_prompts, reference_outputs
from support import requires_sglang

from scout_sglang.hf.tiny_models import save_tiny_model
from scout_sglang.server.client import generate, scout_stats
from scout_sglang.server.launch import launched_server

pytestmark = [requires_sglang, pytest.mark.slow]
SCOUT_ENV = {"SCOUT_CONFIG": "tiny", "SCOUT_CPU_GROUPS": "1"}
COMMON = ("--dtype", "float32", "--max-total-tokens", "8192", "--max-running-requests", "8", "--disable-radix-cache")
VOCAB = 263


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("qwen3"), "qwen3", num_layers=4, hidden=64, num_heads=4,
                           num_kv_heads=2, head_dim=16)


@pytest.mark.parametrize("page_size", [16, 1])
def test_split_backends_decode_through_scout_and_match_the_reference_decoder(qwen3_dir, tmp_path, page_size):
    """Pages of one block (the tiny preset's 16 tokens): the host pool torch_native writes is the engine's store,
    one host copy of the K/V. Pages of one token: the engine copies the K/V into a store of its own."""
    prompts = random_prompts((260, 700), vocab=VOCAB, seed=4)
    args = ("--prefill-attention-backend", "torch_native", "--decode-attention-backend", "scout", *COMMON,
            "--page-size", str(page_size))
    log = tmp_path / "split.log"
    with launched_server(qwen3_dir, *args, env=SCOUT_ENV, log_path=log) as base:
        served = [generate(base, prompt, 20)["output_ids"] for prompt in prompts]
        stats = scout_stats(base)
    expected, cosine, _ = reference_outputs(qwen3_dir, SCOUT_ENV, prompts, 20)
    assert served == expected
    assert stats["cpu_blocks"] > 0 and stats["cpu_launched_ahead_fraction"] == 1.0
    assert stats["usage"]["requests"] == 0
    memory = stats["memory"]
    assert memory["layout"] == "arrival"  # torch_native prefill writes a host pool; decode keeps or copies it
    logical_kv = 8192 * memory["token_bytes"]  # every layer's K/V of the logical capacity, once
    if page_size == 16:
        assert logical_kv <= memory["host_bytes_allocated"] <= 1.05 * logical_kv
        assert "two copies" not in log.read_text()
    else:
        assert memory["host_bytes_allocated"] > 1.5 * logical_kv
        assert "the K/V is held twice in host memory" in log.read_text()


def test_a_pd_decode_instance_admits_transferred_requests_and_decodes(qwen3_dir, tmp_path):
    """The fake transfer backend carries no KV, so only the flow is checked, not the text."""
    args = ("--attention-backend", "scout", *COMMON, "--disaggregation-mode", "decode",
            "--disaggregation-transfer-backend", "fake", "--disaggregation-decode-retraction-backup", "none")
    prompts = random_prompts((40, 300, 700), vocab=VOCAB, seed=5)
    with launched_server(qwen3_dir, *args, env=SCOUT_ENV, log_path=tmp_path / "pd.log") as base:
        before = scout_stats(base)
        outputs = [generate(base, prompt, 12, bootstrap_host="2.2.2.2", bootstrap_room=1000 + i)
                   for i, prompt in enumerate(prompts)]
        after = scout_stats(base)
    assert [o["meta_info"]["completion_tokens"] for o in outputs] == [12, 12, 12]
    assert after["admitted_requests"] - before["admitted_requests"] == 3  # digests built when each arrived
    # Every token is a decode step here: the first one comes from a (fake) prefill instance, not a local prefill.
    assert after["decode_steps"] - before["decode_steps"] == 3 * 12
    assert after["selected_blocks"] > before["selected_blocks"]  # the digests were used to select blocks
    assert after["usage"] == {"requests": 0, "device_full_pages": 0, "host_pages": 0, "device_window_pages": 0}
    memory = after["memory"]
    assert memory["layout"] == "arrival" and memory["device_bytes_used"] == 0 and memory["tokens"] == 0
    # the transfer target is a host pool of the logical capacity: nothing of it on the device
    assert memory["host_bytes_allocated"] >= 8192 * memory["token_bytes"]


def test_retracted_requests_are_freed_rebuilt_and_still_decode_exactly(qwen3_dir, tmp_path):
    """SGLang retracts decoding requests (forced every few steps by its test switch, as a full
    pool would) and later recomputes them. The budget covers the context: after a retraction
    SGLang samples the next token from its re-prefill, so only a covering budget has one right
    answer to compare with."""
    env = {**SCOUT_ENV, "SCOUT_TOKEN_BUDGET": "2048", "SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": "25"}
    args = ("--attention-backend", "scout", "--dtype", "float32", "--max-total-tokens", "8192",
            "--max-running-requests", "8", "--disable-radix-cache")
    prompts = random_prompts((150, 200, 250, 180, 220, 160), vocab=VOCAB, seed=6)
    log = tmp_path / "retract.log"
    with launched_server(qwen3_dir, *args, env=env, log_path=log) as base:
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            outputs = list(pool.map(lambda prompt: generate(base, prompt, 300), prompts))
        stats = scout_stats(base)
    text = log.read_text()
    retractions = sum(int(n) for n in re.findall(r"Testing retraction\. #retracted_reqs: (\d+)", text))
    assert retractions >= 1
    assert "changed owner or was retracted" not in text  # the release hook freed them, not the fallback check
    assert stats["admitted_requests"] >= len(prompts) + 1 + retractions  # warm-up, then re-admitted after recompute
    assert stats["usage"]["requests"] == 0 and stats["usage"]["host_pages"] == 0
    expected, _, _ = reference_outputs(qwen3_dir, {k: v for k, v in env.items() if k.startswith("SCOUT_")}, prompts, 300)
    assert [o["output_ids"] for o in outputs] == expected
