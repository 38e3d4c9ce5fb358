"""Scout under SGLang's radix cache, through the real server (CPU, fp32, a sparse budget): requests that share
a 2k-token system prompt reuse its K/V (SGLang's cached_tokens covers it), answer exactly as a scout server
without the radix cache and as the reference decoder, and hold the shared prefix once in host memory. A host
store smaller than the working set evicts cached prefixes under pressure without failing or changing an
answer, and nothing stays in use when the server is idle."""

import concurrent.futures
import threading
import time

import pytest
from sparse_reference import random_prompts, reference_outputs
from support import requires_sglang

from scout_sglang.cpu_worker.cpu_sets import process_cpus
from scout_sglang.hf.tiny_models import save_tiny_model
from scout_sglang.server.client import generate, get_json, post, scout_stats
from scout_sglang.server.launch import launched_server

pytestmark = [requires_sglang, pytest.mark.slow]
SCOUT_ENV = {"SCOUT_CONFIG": "tiny", "SCOUT_CPU_GROUPS": "1"}  # budget 128 tokens, blocks of 16
BLOCK = 16
COMMON = ("--attention-backend", "scout", "--dtype", "float32", "--max-running-requests", "8",
          "--page-size", str(BLOCK))
VOCAB = 263
PREFIX = 2048
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("model"), "llama", num_layers=4, hidden=64, num_heads=4,
                           num_kv_heads=2, head_dim=16)


def shared_prompts(prefix: list[int], suffixes, seed: int) -> list[list[int]]:
    """Prompts that all start with `prefix`, then a random suffix of each given length."""
    return [prefix + tail for tail in random_prompts(suffixes, vocab=VOCAB, seed=seed, first_id=1)]


def ask_together(base: str, prompts, new_tokens: int = NEW_TOKENS) -> list[dict]:
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda prompt: generate(base, prompt, new_tokens), prompts))


def watch_memory(base: str, stop: threading.Event, samples: list) -> None:
    while not stop.is_set():
        samples.append(scout_stats(base)["memory"])
        time.sleep(0.02)


def test_two_rounds_sharing_a_system_prompt_reuse_it_store_it_once_and_answer_exactly(model_dir, tmp_path):
    system = random_prompts([PREFIX], vocab=VOCAB, seed=11)[0]
    first = shared_prompts(system, (40, 90, 150, 230), seed=12)
    second = shared_prompts(system, (60, 120, 180, 260), seed=13)
    args = (*COMMON, "--max-total-tokens", "16384")
    with launched_server(model_dir, *args, env=SCOUT_ENV, log_path=tmp_path / "radix.log") as base:
        round_one = ask_together(base, first)
        samples, stop = [], threading.Event()
        watcher = threading.Thread(target=watch_memory, args=(base, stop, samples))
        watcher.start()
        try:
            round_two = ask_together(base, second, new_tokens=64)
        finally:
            stop.set()
            watcher.join()
        stats = scout_stats(base)
        assert stats["usage"]["requests"] == 0 and stats["usage"]["host_pages"] == 0
    for answer in round_two:  # SGLang matched the whole system prompt (whole pages of the block size)
        assert answer["meta_info"]["cached_tokens"] >= PREFIX
    assert stats["prefix"]["hits"] >= len(second)
    assert stats["prefix"]["prefill_tokens_saved"] >= len(second) * PREFIX

    # The shared prefix is held once: at every moment of round two, the host bytes in use are at most the prefix
    # once plus every request's own tokens (each partial block a whole page), plus 5%.
    page = stats["memory"]["host_page_bytes"]
    own_pages = sum(-(-(len(p) - PREFIX + 64) // BLOCK) for p in second)
    assert max(s["host_bytes_shared"] for s in samples) >= PREFIX // BLOCK * page  # seen held by several at once
    assert max(s["host_bytes_used"] for s in samples) <= 1.05 * (PREFIX // BLOCK + own_pages) * page

    args = (*COMMON, "--max-total-tokens", "16384", "--disable-radix-cache")
    with launched_server(model_dir, *args, env=SCOUT_ENV, log_path=tmp_path / "no-radix.log") as base:
        without = ask_together(base, first) + ask_together(base, second, new_tokens=64)
    served = [a["output_ids"] for a in round_one + round_two]
    assert served == [a["output_ids"] for a in without]
    expected = reference_outputs(model_dir, SCOUT_ENV, first, NEW_TOKENS)[0] + \
        reference_outputs(model_dir, SCOUT_ENV, second, 64)[0]
    assert served == expected


def test_a_host_store_smaller_than_the_working_set_evicts_cached_prefixes_and_every_answer_stays_exact(model_dir,
                                                                                                     tmp_path):
    """3072 tokens of host store; three waves, each a shared prefix of 1536 tokens asked three times plus one
    unshared prompt: the second wave can only be admitted by evicting the first's cached prefix, the third asks
    the first prefix again."""
    first, second = (random_prompts([1536], vocab=VOCAB, seed=seed)[0] for seed in (21, 22))
    waves = [shared_prompts(first, (20, 45, 70), seed=23) + random_prompts([700], vocab=VOCAB, seed=24),
             shared_prompts(second, (30, 55, 80), seed=25) + random_prompts([760], vocab=VOCAB, seed=26),
             shared_prompts(first, (35, 50, 65), seed=27) + random_prompts([640], vocab=VOCAB, seed=28)]
    args = (*COMMON, "--max-total-tokens", "3072")
    with launched_server(model_dir, *args, env=SCOUT_ENV, log_path=tmp_path / "pressure.log") as base:
        answers = [ask_together(base, wave, new_tokens=8) for wave in waves]
        idle = scout_stats(base)
        post(base + "/flush_cache", {})
        flushed = scout_stats(base)
    assert idle["usage"]["requests"] == 0 and idle["usage"]["host_pages"] == 0 and idle["usage"]["device_window_pages"] == 0
    assert 0 < idle["memory"]["host_bytes_cached"] <= 3072 // BLOCK * idle["memory"]["host_page_bytes"]
    assert flushed["memory"]["host_bytes_cached"] == 0  # the tree let go of every page
    assert min(a["meta_info"]["cached_tokens"] for a in answers[2][:3]) < 1536  # the first prefix was evicted
    assert idle["request_failures"] == {"prefill": 0, "decode": 0}
    served = [a["output_ids"] for wave in answers for a in wave]
    assert served == reference_outputs(model_dir, SCOUT_ENV, [p for wave in waves for p in wave], 8)[0]


def test_resident_first_holds_an_adopted_prefix_once_and_answers_as_full_attention(model_dir, tmp_path):
    """Resident-first (a pool that holds every request) under the radix cache. Round two's requests adopt the
    system prompt round one left in the tree: the first copies its blocks from the host store into its resident
    row, in block order, and the others point at that row's pages (the prefix resident once). Every request is
    exact, with no CPU part, and its tokens are full attention's."""
    system = random_prompts([PREFIX], vocab=VOCAB, seed=31)[0]
    first = shared_prompts(system, (40, 90), seed=32)
    second = shared_prompts(system, (60, 120, 180, 260), seed=33)
    env = SCOUT_ENV | {"SCOUT_RESIDENT_FIRST": "on"}
    with launched_server(model_dir, *COMMON, "--max-total-tokens", "16384", env=env,
                         log_path=tmp_path / "resident.log") as base:
        served = [a["output_ids"] for a in ask_together(base, first) + ask_together(base, second)]
        stats = scout_stats(base)
    pool = stats["resident_pool"]
    outside = PREFIX // BLOCK - 2  # the prefix's blocks outside the window (tiny: sink 1, local 1)
    assert pool["prefix_blocks_copied"] >= outside and pool["prefix_blocks_shared"] >= outside, pool
    assert stats["cpu_blocks"] == 0 and pool["recent_exact_share"] == 1.0
    assert served == reference_outputs(model_dir, env | {"SCOUT_MODE": "full", "SCOUT_RESIDENT_FIRST": "off"},
                                       first + second, NEW_TOKENS)[0]


@pytest.mark.skipif(len(process_cpus()) < 2, reason="two ranks need two CPUs")
def test_two_tensor_parallel_ranks_share_a_cached_prefix_each_for_its_heads(tmp_path):
    """--tp-size 2 under the radix cache: both ranks' schedulers match the same prefix and each rank's engine
    adopts the same pages for its own heads; answers equal the reference decoder's at the sparse budget."""
    from test_sglang_tensor_parallel import tp_env

    model_dir = save_tiny_model(tmp_path / "qwen3", "qwen3", num_layers=4, hidden=64, num_heads=4, num_kv_heads=2,
                                head_dim=16)
    system = random_prompts([1024], vocab=VOCAB, seed=31)[0]
    rounds = [shared_prompts(system, (50, 130), seed=32), shared_prompts(system, (70, 90), seed=33)]
    args = (*COMMON, "--max-total-tokens", "8192", "--tp-size", "2")
    with launched_server(model_dir, *args, env=tp_env({}), log_path=tmp_path / "tp.log") as base:
        answers = [ask_together(base, prompts) for prompts in rounds]
        ranks = get_json(base + "/server_info")["internal_states"][0]["scout_ranks"]
    assert all(a["meta_info"]["cached_tokens"] >= 1024 for a in answers[1])
    assert [rank["prefix"]["hits"] for rank in ranks] == [ranks[0]["prefix"]["hits"]] * 2
    assert ranks[0]["prefix"]["hits"] >= 2
    assert all(rank["usage"]["host_pages"] == 0 for rank in ranks)
    prompts = rounds[0] + rounds[1]
    assert [a["output_ids"] for a in answers[0] + answers[1]] == reference_outputs(
        model_dir, {"SCOUT_CONFIG": "tiny"}, prompts, NEW_TOKENS)[0]
