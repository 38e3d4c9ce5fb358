"""The scout backend inside the real SGLang server (CPU), launched as users
launch it: with a budget that covers every context, greedy output equals the
stock torch_native backend's; bad settings stop the server with a clear message."""

import concurrent.futures

import pytest
from support import requires_sglang

from scout_sglang.hf.tiny_models import save_tiny_model
from scout_sglang.server.client import generate
from scout_sglang.server.launch import launched_server

pytestmark = [requires_sglang, pytest.mark.slow]
COMMON = ("--max-total-tokens", "4096", "--max-running-requests", "16", "--disable-radix-cache")
WORDS = "the quick brown fox jumps over the lazy dog find the value of the key".split()
PROMPTS = [" ".join(WORDS[i % len(WORDS)] for i in range(n)) for n in (3, 20, 70, 150, 7, 45, 220, 260)]


def generate_concurrently(base):
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(lambda text: generate(base, text, 24), PROMPTS))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("model"), "llama", num_layers=3, hidden=64, num_heads=4,
                           num_kv_heads=2, head_dim=16)


@pytest.fixture(scope="module")
def stock_outputs(model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("logs") / "stock.log"
    with launched_server(model_dir, "--attention-backend", "torch_native", *COMMON, log_path=log) as base:
        return generate_concurrently(base)


def test_covering_budget_decodes_exactly_like_torch_native(model_dir, stock_outputs, tmp_path):
    env = {"SCOUT_CONFIG": "tiny", "SCOUT_TOKEN_BUDGET": "2048", "SCOUT_CPU_GROUPS": "1"}
    with launched_server(model_dir, "--attention-backend", "scout", *COMMON, env=env, log_path=tmp_path / "scout.log") as base:
        scout = generate_concurrently(base)
    assert max(o["meta_info"]["prompt_tokens"] for o in stock_outputs) + 24 <= 2048  # the budget really covers
    for ours, theirs in zip(scout, stock_outputs):
        assert ours["output_ids"] == theirs["output_ids"]
    log = (tmp_path / "scout.log").read_text()
    assert "scout attention backend configuration" in log and "token_budget = 2048" in log


def test_a_bad_setting_stops_the_server_naming_it_and_the_accepted_values(model_dir, tmp_path):
    log = tmp_path / "bad.log"
    with pytest.raises(RuntimeError, match="during start-up"):
        with launched_server(model_dir, "--attention-backend", "scout", *COMMON, env={"SCOUT_MODE": "fast"}, log_path=log):
            pass
    assert "SCOUT_MODE='fast' is not accepted; accepted values: full, quest, infinigen, hgca, scout" in log.read_text()


def test_an_unsupported_setting_stops_the_server_saying_what_to_do(model_dir, tmp_path):
    log = tmp_path / "mixed.log"
    with pytest.raises(RuntimeError, match="during start-up"):
        with launched_server(model_dir, "--attention-backend", "scout", "--enable-mixed-chunk", *COMMON, log_path=log):
            pass
    assert ("the scout attention backend cannot run this server:\n  - --enable-mixed-chunk (decode tokens inside "
            "prefill batches): run without it") in log.read_text()
