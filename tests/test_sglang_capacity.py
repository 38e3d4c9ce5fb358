"""The scout KV pool through the real SGLang server, with the shipped tiny
preset: a decode batch whose context is twice the device KV budget a stock
server would get, all outputs equal to the reference decoder, with every device
byte the engine allocates (the dense layer's full K/V included) counted against
that budget; a dense layer's full store shows up exactly in the reported device
bytes; a full host store makes requests wait, not fail; a request that can
never fit is refused with a clear error; the usage and the co-attention
statistics appear on the Prometheus endpoint."""

import concurrent.futures
import re
import urllib.error
import urllib.request

import pytest
from sparse_reference import random_prompts, reference_outputs
from support import requires_sglang

from scout_sglang.hf.tiny_models import save_tiny_model
from scout_sglang.server.client import generate, scout_stats
from scout_sglang.server.launch import launched_server

pytestmark = [requires_sglang, pytest.mark.slow]
SCOUT_ENV = {"SCOUT_CONFIG": "tiny", "SCOUT_CPU_GROUPS": "1"}
VOCAB = 263
DEVICE_BUDGET = 4096  # token slots a stock server's device pool would get
LAYERS = 4
LAYER_TOKEN_BYTES = 2 * 2 * 16 * 4  # (K, V) x KV heads x head dim x fp32: one token in one layer
TOKEN_BYTES = LAYERS * LAYER_TOKEN_BYTES
DEVICE_PARTS = ("digest_bytes_allocated", "window_and_resident_bytes_allocated", "dense_layer_bytes_allocated")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("llama"), "llama", num_layers=LAYERS, hidden=64, num_heads=4,
                           num_kv_heads=2, head_dim=16, max_positions=8192)


def post_error(base, payload) -> tuple[int, str]:
    import json

    request = urllib.request.Request(f"{base}/generate", data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_a_batch_with_twice_the_device_budget_in_context_decodes_together_and_exactly(llama_dir, tmp_path):
    # The tiny preset keeps layer 0 dense: one layer in four holds K/V of every logical token on the device, so a
    # logical token costs 256 + 3 x 16 (digests) of a stock token's 1024 device bytes, plus windows per slot.
    # 9216 logical tokens fit the 4 MiB budget (benchmarks/bench_capacity.py finds the largest by the same model).
    prompts = random_prompts([1010] * 8, vocab=VOCAB, seed=11)
    new_tokens = 16
    total_context = sum(map(len, prompts)) + new_tokens * len(prompts)
    assert total_context >= 2 * DEVICE_BUDGET
    args = ("--attention-backend", "scout", "--dtype", "float32", "--max-total-tokens", "9216",
            "--max-running-requests", "8", "--disable-radix-cache", "--context-length", "2048")
    log = tmp_path / "capacity.log"
    with launched_server(llama_dir, *args, env=SCOUT_ENV, log_path=log) as base:
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            served = list(pool.map(lambda prompt: generate(base, prompt, new_tokens)["output_ids"], prompts))
        stats = scout_stats(base)
    assert stats["max_batch_size"] == 8  # every request decoded in the same steps
    memory = stats["memory"]
    assert memory["layout"] == "logical" and memory["dense_layers"] == [0]
    # Everything the device holds for K/V (every part the engine allocates, and SGLang's placeholder pool),
    # allocated for all 8 slots and 9216 tokens, fits the stock budget; the dense layer holds every token slot.
    scratch_page = 16  # tokens of the one scratch page every engine store has (tiny preset: blocks of 16)
    assert memory["dense_layer_bytes_allocated"] == (memory["token_slots"] + scratch_page) * LAYER_TOKEN_BYTES
    assert memory["device_bytes_allocated"] == sum(memory[part] for part in DEVICE_PARTS) + memory["sglang_pool_device_bytes"]
    assert memory["device_bytes_allocated"] <= DEVICE_BUDGET * TOKEN_BYTES
    assert "scout memory (logical KV pool)" in log.read_text()
    expected, _, _ = reference_outputs(llama_dir, SCOUT_ENV, prompts, new_tokens)
    assert served == expected


def test_a_dense_layer_adds_its_full_store_to_the_reported_device_bytes(llama_dir, tmp_path):
    """Layer 0 offloaded, then dense: it trades its digests and windows for K and V of every token slot."""
    args = ("--attention-backend", "scout", "--dtype", "float32", "--max-total-tokens", "2048",
            "--max-running-requests", "8", "--disable-radix-cache")
    memory = {}
    for dense in ("", "0"):
        with launched_server(llama_dir, *args, env={**SCOUT_ENV, "SCOUT_DENSE_LAYERS": dense},
                             log_path=tmp_path / f"dense-{dense or 'none'}.log") as base:
            memory[dense] = scout_stats(base)["memory"]
    offloaded, dense = memory[""], memory["0"]
    assert offloaded["dense_layers"] == [] and dense["dense_layers"] == [0]
    assert offloaded["dense_layer_bytes_allocated"] == 0
    slots = dense["token_slots"]
    assert slots == 2048 + dense["request_slots"] * 16 and dense["request_slots"] >= 8  # blocks of 16 (tiny)
    full_store = (slots + 16) * LAYER_TOKEN_BYTES  # and the scratch page of 16 tokens
    assert dense["dense_layer_bytes_allocated"] == full_store
    one_offloaded_layer = (offloaded["digest_bytes_allocated"] + offloaded["window_and_resident_bytes_allocated"]) // LAYERS
    assert dense["device_bytes_allocated"] - offloaded["device_bytes_allocated"] == full_store - one_offloaded_layer
    assert "in each of 1 dense layers [0] (every token)" in (tmp_path / "dense-0.log").read_text()


def test_requests_wait_for_a_full_host_store_and_a_request_that_never_fits_is_refused(llama_dir, tmp_path):
    prompts = random_prompts([900, 950, 1000, 1050], vocab=VOCAB, seed=12)
    args = ("--attention-backend", "scout", "--dtype", "float32", "--max-total-tokens", "2048",
            "--max-running-requests", "8", "--disable-radix-cache", "--enable-metrics")
    log = tmp_path / "host-full.log"
    with launched_server(llama_dir, *args, env=SCOUT_ENV, log_path=log) as base:
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            outputs = list(pool.map(lambda prompt: generate(base, prompt, 40), prompts))
        status, body = post_error(base, {"input_ids": random_prompts([3000], vocab=VOCAB)[0],
                                         "sampling_params": {"max_new_tokens": 4}})
        stats = scout_stats(base)
        with urllib.request.urlopen(f"{base}/metrics", timeout=30) as response:
            metrics = response.read().decode()
    assert [o["meta_info"]["completion_tokens"] for o in outputs] == [40] * 4
    assert stats["max_batch_size"] <= 2  # the 2048-token host store holds two of them at a time
    queued = [int(n) for n in re.findall(r"#queue-req: (\d+)", log.read_text())]
    assert max(queued) >= 1  # the others waited in SGLang's queue
    assert status == 400 and "Input length (3000 tokens) exceeds the maximum allowed length" in body
    expected, _, _ = reference_outputs(llama_dir, SCOUT_ENV, prompts, 40)
    assert [o["output_ids"] for o in outputs] == expected
    for name in ("scout_device_kv_bytes", "scout_host_kv_bytes", "scout_tokens", "scout_cpu_ratio",
                 "scout_decode_steps", "scout_recent_cpu_ratio", "scout_recall_bytes_per_step",
                 "scout_recall_cap_bytes_per_step", "scout_recall_backed_off_fraction"):
        assert re.search(rf"^{name}(\{{.*\}})? ", metrics, re.M), name
    recall = stats["recall"]  # the recent steps' recall: its traffic within its cap
    assert recall["recent_steps"] > 0 and 0 <= recall["bytes_per_step"] <= recall["cap_bytes_per_step"]
    assert 0.0 <= recall["backed_off_fraction"] <= 1.0 and 0.0 <= recall["recent_cpu_ratio"] <= 1.0
    steps = float(re.search(r"^scout_decode_steps(?:\{.*\})? (\S+)", metrics, re.M).group(1))
    assert steps == stats["decode_steps"] > 0
