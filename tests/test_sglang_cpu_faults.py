"""A real SGLang server (CPU, fp32) whose CPU attention worker fails on purpose: 10% of its tasks raise and
10% sleep 300 ms past a 100 ms deadline (SCOUT_TEST_FAULTS). Every layer concerned computes its CPU part
itself: 16 concurrent requests complete with the reference decoder's greedy tokens, /server_info and
/metrics count the fallbacks by cause, and the server stays healthy."""

import concurrent.futures
import re
import urllib.request

import pytest
from sparse_reference import random_prompts, reference_outputs
from support import requires_sglang

from scout_sglang.hf.tiny_models import save_tiny_model
from scout_sglang.server.client import generate, scout_stats
from scout_sglang.server.launch import launched_server

pytestmark = [requires_sglang, pytest.mark.slow]
SCOUT_ENV = {"SCOUT_CONFIG": "tiny", "SCOUT_CPU_GROUPS": "1"}  # budget 128 tokens, blocks of 16
FAULTS_ENV = {"SCOUT_TEST_FAULTS": "cpu_raise:0.1,cpu_delay:0.1,cpu_delay_ms:300,seed:1",
              "SCOUT_TEST_FAULTS_ALLOW": "1", "SCOUT_CPU_DEADLINE_MS": "100"}
ARGS = ("--attention-backend", "scout", "--dtype", "float32", "--max-total-tokens", "16384",
        "--max-running-requests", "16", "--disable-radix-cache", "--enable-metrics")
VOCAB = 263
NEW_TOKENS = 24


def read_url(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.status, response.read().decode()


def test_cpu_tasks_that_raise_or_come_late_cost_no_token_and_are_counted(tmp_path):
    model_dir = save_tiny_model(tmp_path / "model", "llama", num_layers=4, hidden=64, num_heads=4, num_kv_heads=2,
                                head_dim=16)
    lengths = [20, 90, 150, 900, 40, 700, 260, 130, 510, 60, 380, 800, 33, 610, 200, 450]
    prompts = random_prompts(lengths, vocab=VOCAB, seed=2)
    log = tmp_path / "faults.log"
    with launched_server(model_dir, *ARGS, env=SCOUT_ENV | FAULTS_ENV, log_path=log) as base:
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            outputs = list(pool.map(lambda prompt: generate(base, prompt, NEW_TOKENS), prompts))
        stats = scout_stats(base)
        _, metrics = read_url(base + "/metrics")
        assert generate(base, prompts[0], 4)["meta_info"]["completion_tokens"] == 4  # still serving
        health, _ = read_url(base + "/health")
    expected, _, _ = reference_outputs(model_dir, SCOUT_ENV, prompts, NEW_TOKENS)
    assert [o["output_ids"] for o in outputs] == expected
    assert stats["cpu_blocks"] > 0 and stats["usage"]["requests"] == 0
    fallbacks = stats["cpu_fallbacks"]
    assert fallbacks["error"] > 0 and fallbacks["deadline"] > 0, fallbacks
    for cause, count in fallbacks.items():
        served = re.search(rf'^scout_cpu_fallbacks_total\{{cause="{cause}",tp_rank="0"\}} (\S+)', metrics, re.M)
        assert served and float(served.group(1)) == count, (cause, count)
    assert health == 200
    text = log.read_text()
    assert "SCOUT_TEST_FAULTS injects faults" in text
    assert "was computed by the layer itself (" in text and "Traceback" not in text
