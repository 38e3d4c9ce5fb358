"""Resident-first serving (SCOUT_RESIDENT_FIRST=on) in the real SGLang server (CPU, fp32), under a load that ramps
1 -> 2 (concurrent, then in one batch) -> 16 -> 1 concurrent requests at a sparse budget: at low load every request is attended exactly (its
tokens are a stock torch_native server's and full attention's, no block on the CPU); at full load the requests
outgrow the pool, go sparse with their resident rows as the cache and all complete, each as the reference decoder
decodes it alone at the quotas the server gave it (/server_info's quota runs); then exact again. The engine tests
follow every quota and decision through the switch (test_resident_pool.py, test_engine_oracle.py)."""

import concurrent.futures
import time

import pytest
from sparse_reference import random_prompts, reference_outputs
from support import requires_sglang

from scout_sglang.hf.tiny_models import save_tiny_model
from scout_sglang.server.client import generate, scout_stats
from scout_sglang.server.launch import launched_server

pytestmark = [requires_sglang, pytest.mark.slow]
# budget 128 tokens in blocks of 16 (8 blocks); a pool of 16 x 8 pages, set (sized from the stock KV budget, it
# would hold every request here): two requests of ~60 blocks fit, 16 do not
SCOUT_ENV = {"SCOUT_CONFIG": "tiny", "SCOUT_CPU_GROUPS": "1", "SCOUT_RESIDENT_FIRST": "on",
             "SCOUT_RESIDENT_POOL_BLOCKS": "128"}
SERVER = ("--dtype", "float32", "--max-total-tokens", "24576", "--max-running-requests", "16",
          "--disable-radix-cache")
VOCAB = 263
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("model"), "llama", num_layers=4, hidden=64, num_heads=4,
                           num_kv_heads=2, head_dim=16)


def idle(base, timeout: float = 30) -> dict:
    """The server's scout statistics once the engine holds no request: a finished request's pages (and its pool
    share) are freed when SGLang frees its slot, which may come after its answer; a phase of n requests starts
    with none left from the last."""
    deadline = time.monotonic() + timeout
    while (stats := scout_stats(base))["usage"]["requests"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert stats["usage"]["requests"] == 0, stats["usage"]
    return stats


def concurrently(base, prompts):
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda prompt: generate(base, prompt, NEW_TOKENS)["output_ids"], prompts))


def test_a_load_ramp_is_exact_at_low_load_and_sparse_without_failure_at_full_load(model_dir, tmp_path):
    low = random_prompts((950, 700), vocab=VOCAB, seed=11)
    full = random_prompts([600 + 25 * i for i in range(16)], vocab=VOCAB, seed=12)
    with launched_server(model_dir, "--attention-backend", "scout", *SERVER, env=SCOUT_ENV,
                         log_path=tmp_path / "scout.log") as base:
        start = idle(base)
        alone = [generate(base, low[0], NEW_TOKENS)["output_ids"]]
        idle(base)
        pair = concurrently(base, low)
        idle(base)
        together = [answer["output_ids"] for answer in generate(base, low, NEW_TOKENS)]  # one prefill batch
        exact = idle(base)
        loaded = concurrently(base, full)
        crowded = idle(base)
        again = [generate(base, low[1], NEW_TOKENS)["output_ids"]]
        end = idle(base)
    with launched_server(model_dir, "--attention-backend", "torch_native", *SERVER, env={},
                         log_path=tmp_path / "stock.log") as base:
        stock = [generate(base, prompt, NEW_TOKENS)["output_ids"] for prompt in low]
    dense, _, _ = reference_outputs(model_dir, SCOUT_ENV | {"SCOUT_MODE": "full", "SCOUT_RESIDENT_FIRST": "off"}, low,
                                   NEW_TOKENS)
    assert stock == dense  # the stock server and full attention agree: the control
    assert alone == stock[:1] and pair == stock and again == stock[1:]  # exact at 1 and 2 requests
    assert together == stock  # prefilled together, layer by layer: neither is shrunk by the other's prefill
    assert exact["cpu_blocks"] == start["cpu_blocks"] == 0 and exact["resident_pool"]["recent_exact_share"] == 1.0
    assert exact["resident_pool"]["recent_exact_path_share"] > 0.5  # each request's steps after its first: no selection
    assert exact["resident_pool"]["pages"] == 128 and exact["resident_pool"]["sized_by"] == "SCOUT_RESIDENT_POOL_BLOCKS"
    # full load: sparse (a CPU part, quotas shrunk), every request complete, none failed
    assert all(len(tokens) == NEW_TOKENS for tokens in loaded)
    assert crowded["cpu_blocks"] > 0 and crowded["resident_pool"]["evicted_columns"] > 0
    assert crowded["resident_pool"]["recent_exact_share"] < 1.0
    assert sum(crowded["request_failures"].values()) == 0
    assert end["planning_device_reads"] == 0  # every step of the ramp planned from the scheduler's host copies
    assert end["cpu_blocks"] == crowded["cpu_blocks"]  # exact again once alone
    assert end["usage"]["resident_pool_pages"] == 0 and end["usage"]["requests"] == 0
    # full load, token for token: each request as the reference decoder decodes it alone at the server's quotas
    recent = end["resident_pool"]["recent_requests"]  # in the order they finished: ..., the 16, again
    assert sorted(r["prompt_tokens"] for r in recent[-17:-1]) == [len(prompt) for prompt in full]
    runs = {r["prompt_tokens"]: r["quota_runs"] for r in recent[-17:-1]}
    quotas = [runs[len(prompt)] for prompt in full]
    assert all(sum(run[1] for run in r) == NEW_TOKENS - 1 for r in quotas), quotas  # [quota, steps(, dip)]
    replayed, _, _ = reference_outputs(model_dir, SCOUT_ENV, full, NEW_TOKENS, quota_runs=quotas)
    assert loaded == replayed
