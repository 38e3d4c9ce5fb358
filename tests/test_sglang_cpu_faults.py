"""A real SGLang server (CPU, fp32) whose CPU attention worker fails on purpose: 10% of its tasks raise and
10% sleep 300 ms past a 100 ms deadline (SCOUT_TEST_FAULTS). Every layer concerned computes its CPU part
itself: 16 concurrent requests complete with the reference decoder's greedy tokens, /server_info and
/metrics count the fallbacks by cause, and the server stays healthy.

Both servers run where the CPU part decides tokens (CPU_DECIDES_ENV: no resident buffer, no recall). The
negative control is a server at that setting whose worker throws every CPU part away (cpu_drop:1, reported done
and OK, so nothing falls back): most of its answers differ from the reference decoder's. Without that, answers
identical under faults could mean only that the CPU part never mattered."""

import concurrent.futures
import re
import urllib.request

import pytest
from sparse_reference import CPU_DECIDES_ENV, differing, random_prompts, reference_outputs
from support import requires_sglang

from scout_sglang.hf.tiny_models import save_tiny_model
from scout_sglang.server.client import generate, scout_stats
from scout_sglang.server.launch import launched_server

pytestmark = [requires_sglang, pytest.mark.slow]
SCOUT_ENV = CPU_DECIDES_ENV  # budget 128 tokens, blocks of 16, every selected block past sink and window on the CPU
FAULTS_ENV = {"SCOUT_TEST_FAULTS": "cpu_raise:0.1,cpu_delay:0.1,cpu_delay_ms:300,seed:1",
              "SCOUT_TEST_FAULTS_ALLOW": "1", "SCOUT_CPU_DEADLINE_MS": "100"}
DROP_ENV = {"SCOUT_TEST_FAULTS": "cpu_drop:1", "SCOUT_TEST_FAULTS_ALLOW": "1"}
ARGS = ("--attention-backend", "scout", "--dtype", "float32", "--max-total-tokens", "16384",
        "--max-running-requests", "16", "--disable-radix-cache", "--enable-metrics")
VOCAB = 263
NEW_TOKENS = 24
LENGTHS = [20, 90, 150, 900, 40, 700, 260, 130, 510, 60, 380, 800, 33, 610, 200, 450]
# the control must differ on at least this many of the 16 (the 20-token prompt has no CPU part at all; the
# engine alone, with every CPU part dropped, differs on 15)
MOST = 12


def read_url(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.status, response.read().decode()


@pytest.fixture(scope="module")
def model_and_reference(tmp_path_factory):
    """The model, the prompts and the reference decoder's tokens, shared by the faulty server and its control."""
    model_dir = save_tiny_model(tmp_path_factory.mktemp("faults") / "model", "llama", num_layers=4, hidden=64,
                                num_heads=4, num_kv_heads=2, head_dim=16)
    prompts = random_prompts(LENGTHS, vocab=VOCAB, seed=2)
    expected, _, _ = reference_outputs(model_dir, SCOUT_ENV, prompts, NEW_TOKENS)
    return model_dir, prompts, expected


def ask_all(base: str, prompts) -> list[list[int]]:
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        return [o["output_ids"] for o in pool.map(lambda prompt: generate(base, prompt, NEW_TOKENS), prompts)]


def test_a_server_whose_cpu_part_is_dropped_answers_otherwise(model_and_reference, tmp_path):
    """The negative control: at this setting the CPU part decides most answers, so the test below has power."""
    model_dir, prompts, expected = model_and_reference
    with launched_server(model_dir, *ARGS, env=SCOUT_ENV | DROP_ENV, log_path=tmp_path / "drop.log") as base:
        outputs = ask_all(base, prompts)
        stats = scout_stats(base)
    assert differing(outputs, expected) >= MOST, (differing(outputs, expected), len(prompts))
    assert stats["cpu_blocks"] > 0 and not any(stats["cpu_fallbacks"].values()), stats["cpu_fallbacks"]


def test_cpu_tasks_that_raise_or_come_late_cost_no_token_and_are_counted(model_and_reference, tmp_path):
    model_dir, prompts, expected = model_and_reference
    log = tmp_path / "faults.log"
    with launched_server(model_dir, *ARGS, env=SCOUT_ENV | FAULTS_ENV, log_path=log) as base:
        outputs = ask_all(base, prompts)
        stats = scout_stats(base)
        _, metrics = read_url(base + "/metrics")
        assert generate(base, prompts[0], 4)["meta_info"]["completion_tokens"] == 4  # still serving
        health, _ = read_url(base + "/health")
    assert outputs == expected, f"{differing(outputs, expected)} of {len(prompts)} answers differ from the reference"
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
