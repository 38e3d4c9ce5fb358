"""A real prefill/decode (PD) disaggregated deployment, as `python -m scout_sglang.server.pd` starts it: a stock
prefill server (torch_native), a scout decode server and SGLang's PD router, with K/V moved by the Mooncake
transfer engine over loopback TCP. On needle prompts of 256 to 2048 tokens: at a covering budget the tokens equal
a single scout server's; at a sparse budget (1/8 of the longest context) the answers equal the reference
decoder's and the tokens a single scout server's, the decode instance keeps its device K/V within the budget, and
a client that hangs up on the router mid-decode frees the request's pages on both instances. Negative control:
the decode instance with the `fake` transfer backend (no K/V moved) does not answer them all."""

import concurrent.futures
import http.client
import importlib
import importlib.util
import json
import time
import urllib.parse
import urllib.request

import pytest
from support import requires_sglang

from scout_sglang.env import config_from_env
from scout_sglang.retrieval import data
from scout_sglang.retrieval.evaluate import bundled_model_dir, held_out, load_model
from scout_sglang.server.client import generate, get_json, scout_stats
from scout_sglang.server.launch import launched_server
from scout_sglang.server.pd import DECODE_ARGS, launched_pd


def _mooncake_loads() -> bool:
    if importlib.util.find_spec("mooncake") is None:
        return False
    try:
        importlib.import_module("mooncake.engine")
    except (ImportError, OSError):  # libibverbs1 missing
        return False
    return True


pytestmark = [requires_sglang, pytest.mark.slow,
              pytest.mark.skipif(not _mooncake_loads(), reason="Mooncake transfer engine (and libibverbs1) missing")]
LENGTHS = (256, 512, 768, 1024, 1536, 2048)
BUDGET = max(LENGTHS) // 8
ENV = {"SCOUT_CONFIG": "tiny", "SCOUT_CPU_GROUPS": "1", "SCOUT_TOKEN_BUDGET": str(BUDGET)}
COMMON = ("--dtype", "float32", "--max-total-tokens", "8192", "--max-running-requests", "4")
NEW_TOKENS = 6  # `K V1 V2 . <eos>` and one more


@pytest.fixture(scope="module")
def samples():
    return [held_out(1, length, seed=700 + i)[0] for i, length in enumerate(LENGTHS)]


@pytest.fixture(scope="module")
def reference_answers(samples):
    from scout_sglang.hf.reference_decoder import ReferenceDecoder

    decoder = ReferenceDecoder(load_model(), config_from_env(ENV), max_requests=len(samples),
                               max_tokens_per_request=max(LENGTHS) + NEW_TOKENS, track_changes=False)
    try:
        return [answer(list(tokens)) for tokens in decoder.generate([s.prompt for s in samples], NEW_TOKENS).tokens]
    finally:
        decoder.close()


def answer(tokens) -> list[str]:
    """The words up to <eos> (the server is asked to go past it)."""
    said = data.words(list(tokens))
    return said[:said.index("<eos>")] if "<eos>" in said else said


def served_tokens(base: str, samples) -> list[list[int]]:
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda s: generate(base, list(s.prompt), NEW_TOKENS)["output_ids"], samples))


def hang_up_mid_decode(base: str, prompt, chunks: int = 3) -> None:
    """Stream a long generation from `base`, read `chunks` tokens of it, and close the connection: how a client
    aborts through SGLang's router, which has no /abort_request of its own."""
    url = urllib.parse.urlparse(base)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    body = {"input_ids": list(prompt), "stream": True, "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
    connection.request("POST", "/generate", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200
    read = 0
    while read < chunks:
        read += response.fp.readline().startswith(b"data: {")
    connection.sock.close()
    connection.close()


def used_tokens(base: str) -> int:
    """Tokens SGLang's allocator holds on an instance (its /v1/loads)."""
    return sum(load["num_used_tokens"] for load in get_json(base + "/v1/loads")["loads"])


def pages_freed(urls, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        usage = scout_stats(urls.decode)["usage"]
        if usage["requests"] == 0 and used_tokens(urls.decode) == 0 and used_tokens(urls.prefill) == 0:
            return True
        time.sleep(0.5)
    return False


def test_a_mooncake_pd_pair_answers_like_the_reference_decoder_and_a_single_server(samples, reference_answers,
                                                                                    tmp_path):
    with launched_pd(bundled_model_dir(), common_args=COMMON, env=ENV, log_dir=tmp_path) as urls:
        hang_up_mid_decode(urls.router, samples[3].prompt)
        in_flight = scout_stats(urls.decode)
        freed = pages_freed(urls)
        before = scout_stats(urls.decode)
        through_pd = served_tokens(urls.router, samples)
        after = scout_stats(urls.decode)
    for url in (urls.router, urls.prefill, urls.decode):  # the launcher stopped all three
        with pytest.raises(OSError):
            urllib.request.urlopen(url + "/health", timeout=5)
    assert in_flight["usage"]["requests"] == 1 and in_flight["usage"]["host_pages"] > 0  # it was decoding here
    # while it decoded, the device held less of it than full attention would (its K/V is in host memory)
    assert 0 < in_flight["memory"]["device_bytes_used"] < in_flight["memory"]["full_attention_bytes"]
    assert freed, "the aborted request's pages were not freed on both instances"
    assert [answer(tokens) for tokens in through_pd] == reference_answers
    assert all(words[-1] == "." for words in reference_answers)  # the reference found each needle
    assert after["admitted_requests"] - before["admitted_requests"] == len(samples)
    assert after["decode_steps"] - before["decode_steps"] >= NEW_TOKENS  # batched steps; every token decoded here
    assert after["selected_blocks"] > before["selected_blocks"]  # the digests built on arrival chose blocks
    assert after["planning_device_reads"] == 0  # the decode instance planned every step from host copies
    assert after["usage"] == {"requests": 0, "device_full_pages": 0, "host_pages": 0, "device_window_pages": 0}
    memory = after["memory"]
    assert memory["layout"] == "arrival" and memory["sglang_pool_device_bytes"] == 0  # K/V arrived in host memory
    # the launcher's pages of one block: the arrival pool is the engine's host store, one copy of the K/V
    assert memory["host_bytes_allocated"] <= 1.05 * 8192 * memory["token_bytes"]
    layer_token_bytes = memory["token_bytes"] // 3  # the needle model has 3 layers, layer 0 dense (tiny preset)
    block = 16
    per_slot = BUDGET + 3 * block  # the budget, plus the sink, local and scratch blocks
    assert memory["window_and_resident_bytes_allocated"] <= 2 * (memory["request_slots"] * per_slot + block) * layer_token_bytes
    assert memory["device_bytes_allocated"] < memory["token_slots"] * memory["token_bytes"] / 2  # vs full attention

    with launched_server(bundled_model_dir(), "--attention-backend", "scout", "--disable-radix-cache", *COMMON,
                         env=ENV, log_path=tmp_path / "single.log") as base:
        single = served_tokens(base, samples)
    assert through_pd == single


def test_a_resident_first_pd_pair_decodes_exactly_like_a_single_server_at_a_covering_budget(samples, tmp_path):
    """Every token of every context attended: any K/V lost or misplaced on the way changes the tokens. The decode
    instance runs resident-first at the sparse budget, its pool sized from the stock KV budget (on this CPU box,
    capped by the logical capacity): every request fits and is attended exactly, over its transferred K/V, on the
    exact path (nothing selected)."""
    covering = {**ENV, "SCOUT_TOKEN_BUDGET": str(max(LENGTHS) + 32)}  # the prompt and the new tokens, in whole blocks
    with launched_pd(bundled_model_dir(), common_args=COMMON, env={**ENV, "SCOUT_RESIDENT_FIRST": "on"},
                     log_dir=tmp_path) as urls:
        before = scout_stats(urls.decode)
        through_pd = served_tokens(urls.router, samples)
        after = scout_stats(urls.decode)
    with launched_server(bundled_model_dir(), "--attention-backend", "scout", "--disable-radix-cache", *COMMON,
                         env=covering, log_path=tmp_path / "single.log") as base:
        single = served_tokens(base, samples)
    assert through_pd == single
    assert after["admitted_requests"] - before["admitted_requests"] == len(samples)
    assert after["cpu_blocks"] == 0
    pool = after["resident_pool"]
    assert pool["sized_by"] == "the logical capacity" and pool["stock_kv_bytes"] > 0
    assert pool["recent_exact_share"] == 1.0 and pool["used"] == 0
    # each request's transferred prompt written to its row as it was stored: every step on the exact path
    assert pool["recent_exact_path_share"] == 1.0 and after["selected_blocks"] == before["selected_blocks"]


def test_without_kv_transfer_the_answers_are_wrong(samples, reference_answers, tmp_path):
    """Negative control: the same decode instance with the `fake` transfer backend (SGLang accepts it on the
    decode side only), which moves no K/V, gets the same prompts as a router would send them."""
    args = (*DECODE_ARGS, "--disaggregation-transfer-backend", "fake", *COMMON)
    with launched_server(bundled_model_dir(), *args, env=ENV, log_path=tmp_path / "fake.log") as base:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            outputs = list(pool.map(lambda i: generate(base, list(samples[i].prompt), NEW_TOKENS,
                                                       bootstrap_host="2.2.2.2", bootstrap_room=2000 + i),
                                    range(len(samples))))
    assert [o["meta_info"]["completion_tokens"] for o in outputs] == [NEW_TOKENS] * len(samples)  # it did decode
    assert [answer(o["output_ids"]) for o in outputs] != reference_answers
