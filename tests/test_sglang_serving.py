"""The scout backend serving through the real SGLang server (CPU, fp32) at a
sparse budget: output equals the engine's reference decoder, the OpenAI API
answers, 16 concurrent mixed-length requests complete, and an abort mid-decode
frees the request's state while the server keeps serving."""

import concurrent.futures
import threading
import time

import pytest
from sparse_reference import random_prompts, reference_outputs
from support import requires_sglang

from scout_sglang.hf.tiny_models import save_tiny_model
from scout_sglang.server.client import generate, post, post_json, post_stream, scout_stats
from scout_sglang.server.launch import launched_server

pytestmark = [requires_sglang, pytest.mark.slow]
SCOUT_ENV = {"SCOUT_CONFIG": "tiny", "SCOUT_CPU_GROUPS": "1"}  # budget 128 tokens, blocks of 16
BUDGET = 128
ARGS = ("--attention-backend", "scout", "--dtype", "float32", "--max-total-tokens", "16384",
        "--max-running-requests", "16", "--disable-radix-cache")
VOCAB = 263


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("model"), "llama", num_layers=4, hidden=64, num_heads=4,
                           num_kv_heads=2, head_dim=16)


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("logs") / "scout.log"
    with launched_server(model_dir, *ARGS, env=SCOUT_ENV, log_path=log) as base:
        yield base


def stats_delta(before, after, key):
    return after[key] - before[key]


def test_sparse_budget_output_equals_the_reference_decoder(server, model_dir):
    prompts = random_prompts((300, 650, 1000), vocab=VOCAB, seed=1)
    before = scout_stats(server)
    served = [generate(server, prompt, 24)["output_ids"] for prompt in prompts]  # one at a time, like the reference
    after = scout_stats(server)
    expected, cosine, count = reference_outputs(model_dir, SCOUT_ENV, prompts, 24)
    assert min(map(len, prompts)) > 2 * BUDGET
    assert served == expected
    assert stats_delta(before, after, "cpu_blocks") > 0  # the CPU really attended part of the selection
    assert after["cpu_launched_ahead_fraction"] == 1.0  # always from the layer-ahead prediction
    # The server's predictor (fused qkv_proj rows + SGLang RoPE) predicts what transformers' q_proj does.
    served_count = stats_delta(before, after, "predicted_queries")
    served_sum = (after["predicted_query_cosine"] * after["predicted_queries"]
                  - (before["predicted_query_cosine"] or 0.0) * before["predicted_queries"])
    assert served_count == count
    assert served_sum / served_count == pytest.approx(cosine, abs=1e-3)


def test_openai_chat_streaming_completions_and_generate_answer(server):
    chat = post_json(server + "/v1/chat/completions", {
        "model": "m", "messages": [{"role": "user", "content": "find the value of the key " * 20}],
        "max_tokens": 8, "temperature": 0})
    assert chat["usage"]["completion_tokens"] == 8 and chat["choices"][0]["finish_reason"] == "length"
    events = post_stream(server + "/v1/chat/completions", {
        "model": "m", "messages": [{"role": "user", "content": "hello world " * 30}], "max_tokens": 8,
        "temperature": 0})
    assert len(events) >= 2 and events[-1]["choices"][0]["finish_reason"] == "length"
    text = "the quick brown fox jumps over the lazy dog " * 12
    completion = post_json(server + "/v1/completions", {"model": "m", "prompt": text, "max_tokens": 8,
                                                        "temperature": 0})
    generated = post_json(server + "/generate", {"text": text, "sampling_params": {"max_new_tokens": 8,
                                                                                   "temperature": 0}})
    assert completion["choices"][0]["text"] == generated["text"]


def test_sixteen_concurrent_requests_of_mixed_lengths_all_complete(server, model_dir):
    lengths = [20, 90, 150, 900, 40, 700, 260, 130, 510, 60, 380, 800, 33, 610, 200, 450]
    prompts = random_prompts(lengths, vocab=VOCAB, seed=2)
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        outputs = list(pool.map(lambda prompt: generate(server, prompt, 16), prompts))
    assert [o["meta_info"]["completion_tokens"] for o in outputs] == [16] * 16
    assert sum(n > BUDGET for n in lengths) >= 8
    expected, _, _ = reference_outputs(model_dir, SCOUT_ENV, prompts, 16)
    assert [o["output_ids"] for o in outputs] == expected
    stats = scout_stats(server)
    assert stats["usage"]["requests"] == 0
    # Every step was planned from the scheduler's host copies of the batch (host_batch.py), through the batches'
    # merges and filters as requests came and went: on a GPU a read from the device would wait for the last step.
    assert stats["decode_steps"] > 0 and stats["planning_device_reads"] == 0


def wait_for(condition, timeout_s: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_an_abort_mid_decode_frees_the_request_and_the_server_keeps_serving(server):
    prompt = random_prompts((500,), vocab=VOCAB, seed=3)[0]
    result = {}
    worker = threading.Thread(target=lambda: result.update(generate(server, prompt, 3000, rid="abort-me")))
    start = scout_stats(server)["decode_steps"]
    worker.start()
    wait_for(lambda: (s := scout_stats(server))["usage"]["requests"] == 1 and s["decode_steps"] > start + 20,
             what="the long request to be decoding")
    post(server + "/abort_request", {"rid": "abort-me"})
    worker.join(timeout=60)
    assert not worker.is_alive()
    assert result["meta_info"]["finish_reason"]["type"] == "abort"
    assert result["meta_info"]["completion_tokens"] < 3000
    usage = wait_for(lambda: (u := scout_stats(server)["usage"])["requests"] == 0 and u, what="state to be freed")
    assert usage == {"requests": 0, "device_full_pages": 0, "host_pages": 0, "device_window_pages": 0}
    assert generate(server, prompt[:200], 8)["meta_info"]["completion_tokens"] == 8


def test_with_the_estimate_on_concurrent_outputs_equal_the_reference_decoder(server, model_dir, tmp_path):
    """SCOUT_ESTIMATE=on in the server: 8 concurrent requests decode the reference decoder's tokens with the
    estimate on, which are not those with it off for some of them (the estimate decides tokens here: 3 of the 8
    differ; the 60- and 150-token prompts fit the budget, where it adds nothing), and the device keeps three more
    vectors per block and KV head (the value summary): the digests grow 2.5 times."""
    env = SCOUT_ENV | {"SCOUT_ESTIMATE": "on"}
    prompts = random_prompts((300, 650, 1000, 150, 820, 420, 60, 560), vocab=VOCAB, seed=4)
    with launched_server(model_dir, *ARGS, env=env, log_path=tmp_path / "scout-estimate.log") as base:
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            served = list(pool.map(lambda prompt: generate(base, prompt, 16)["output_ids"], prompts))
        memory = scout_stats(base)["memory"]
    expected, _, _ = reference_outputs(model_dir, env, prompts, 16)
    assert served == expected
    without, _, _ = reference_outputs(model_dir, SCOUT_ENV, prompts, 16)
    assert sum(a != b for a, b in zip(expected, without)) >= 2  # a negative control with power, not one fluke
    assert 2 * memory["digest_bytes_allocated"] == 5 * scout_stats(server)["memory"]["digest_bytes_allocated"]


def test_with_the_cpu_split_on_concurrent_outputs_equal_the_reference_decoder(model_dir, tmp_path):
    """SCOUT_CPU_SPLIT at a fixed share in the server: the workers take 3 of each CPU list's 8 entries and the
    device reads the rest from the host store itself. 8 concurrent requests decode the reference decoder's tokens
    with the same split, and the server's statistics show both shares at work. Tolerance: the two shares are
    computed by different kernels (the native worker's, torch's), so a layer's output may differ from the one
    without the split in the last bits (the engine tests hold it to 2e-5); here, at fp32 on this model, no token
    changes against the server without the split either."""
    env = SCOUT_ENV | {"SCOUT_CPU_SPLIT": "0.34"}
    prompts = random_prompts((300, 650, 1000, 820, 420, 560, 900, 700), vocab=VOCAB, seed=6)
    with launched_server(model_dir, *ARGS, env=env, log_path=tmp_path / "scout-split.log") as base:
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            served = list(pool.map(lambda prompt: generate(base, prompt, 16)["output_ids"], prompts))
        stats = scout_stats(base)
    expected, _, _ = reference_outputs(model_dir, env, prompts, 16)
    assert served == expected
    assert served == reference_outputs(model_dir, SCOUT_ENV, prompts, 16)[0]
    assert stats["cpu_blocks"] > 0 and stats["cpu_worker"]["split"]["caps"]
    assert set(stats["cpu_worker"]["split"]["caps"].values()) == {3}
    assert stats["cpu_split"]["zero_copy_bytes_per_step"] > 0 and stats["cpu_split"]["cpu_bytes_per_step"] > 0
