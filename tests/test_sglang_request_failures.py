"""A failure that concerns one request costs that request only, through the real SGLang server (CPU, fp32):
SCOUT_TEST_FAULTS=request_state:victim drops the engine state of the requests whose id contains "victim",
in a batch with others: in their decode (prompts prefilled in one piece), or between two chunks of their
prefill (prompts longer than the 256-token chunks). Those get a clear error (HTTP 500, or the finish reason
of a stream), their pages are freed, the other requests complete with the reference decoder's greedy
tokens, the failures are counted in /server_info and /metrics, and the server goes on serving. The server
runs where the CPU part decides tokens (CPU_DECIDES_ENV), so a victim that corrupted another request's CPU part
would show: with every CPU part dropped, the reference decoder's tokens differ on most of the other prompts (the
negative control, checked in each case on the engine alone; test_sglang_cpu_faults.py checks it on a server)."""

import concurrent.futures
import json
import re
import urllib.error
import urllib.request

import pytest
from sparse_reference import CPU_DECIDES_ENV, differing, random_prompts, reference_outputs
from support import requires_sglang

from scout_sglang.hf.tiny_models import save_tiny_model
from scout_sglang.server.client import generate, post, scout_stats
from scout_sglang.server.launch import launched_server

pytestmark = [requires_sglang, pytest.mark.slow]
SCOUT_ENV = CPU_DECIDES_ENV  # budget 128 tokens, blocks of 16, every selected block past sink and window on the CPU
FAULTS_ENV = {"SCOUT_TEST_FAULTS": "request_state:victim", "SCOUT_TEST_FAULTS_ALLOW": "1"}
ARGS = ("--attention-backend", "scout", "--dtype", "float32", "--max-total-tokens", "16384",
        "--max-running-requests", "16", "--enable-metrics")
# without the radix cache, or with it (pages of one block) and every prompt after a common 128-token start that
# the victims share with the others: a victim is given up as without it (its first chunk is in the tree, but the
# rows past it may never have been written), its stand-in writes nothing and its rows never reach the tree (the
# victim's prompt asked again must answer as the reference decoder)
CACHES = {"no-radix": ("--disable-radix-cache",), "radix": ("--page-size", "16")}
VOCAB = 263
NEW_TOKENS = 24
LENGTHS = [300, 90, 650, 40, 200, 510, 130, 33]
# stage -> (extra server arguments, {victim index: how it is asked}); a chunk budget is shared by the requests
# of a prefill batch, so only a prompt longer than a chunk surely has a second one
CASES = {"decode": ((), {2: "plain", 4: "stream"}),  # one piece: all 1953 prompt tokens fit a 4096-token chunk
         "prefill": (("--chunked-prefill-size", "256"), {2: "plain", 5: "stream"})}  # 650 and 510 tokens
MESSAGES = {"decode": r"decodes at token \d+, but the scout engine holds no tokens of it",
            "prefill": r"continues a prefill at token \d+, but the scout engine holds no tokens of it"}


def ask(base: str, prompt, rid: str, stream: bool) -> dict:
    """/generate with a request id: the output, the last event of a stream, or {'status', 'body'} of an error."""
    payload = {"input_ids": prompt, "rid": rid, "stream": stream,
               "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}}
    try:
        body = post(base + "/generate", payload, timeout=300)
    except urllib.error.HTTPError as error:
        return {"status": error.code, "body": error.read().decode()}
    if not stream:
        return json.loads(body)
    events = [line[len("data: "):] for line in body.splitlines() if line.startswith("data: ")]
    return json.loads([event for event in events if event != "[DONE]"][-1])


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("stage", CASES)
def test_a_request_whose_state_breaks_is_aborted_alone_and_the_batch_goes_on(tmp_path, stage, cache):
    extra_args, victims = CASES[stage]
    model_dir = save_tiny_model(tmp_path / "model", "llama", num_layers=4, hidden=64, num_heads=4, num_kv_heads=2,
                                head_dim=16)
    prompts = random_prompts(LENGTHS, vocab=VOCAB, seed=3)
    if cache == "radix":
        start = random_prompts([128], vocab=VOCAB, seed=4)[0]
        prompts = [start + prompt for prompt in prompts]
    log = tmp_path / "failures.log"
    with launched_server(model_dir, *ARGS, *CACHES[cache], *extra_args, env=SCOUT_ENV | FAULTS_ENV,
                         log_path=log) as base:
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            outcomes = list(pool.map(
                lambda i: ask(base, prompts[i], f"victim-{i}" if i in victims else f"request-{i}",
                              victims.get(i) == "stream"), range(len(prompts))))
        stats = scout_stats(base)
        with urllib.request.urlopen(base + "/metrics", timeout=30) as response:
            metrics = response.read().decode()
        again = generate(base, prompts[2], 4)  # a victim's prompt, under another id
        with urllib.request.urlopen(base + "/health", timeout=30) as response:
            health = response.status
    kept = [i for i in range(len(prompts)) if i not in victims]
    expected, _, _ = reference_outputs(model_dir, SCOUT_ENV, [prompts[i] for i in kept], NEW_TOKENS)
    assert [outcomes[i]["output_ids"] for i in kept] == expected
    dropped, _, _ = reference_outputs(model_dir, SCOUT_ENV, [prompts[i] for i in kept], NEW_TOKENS, drop_cpu_part=True)
    assert 4 * differing(dropped, expected) >= 3 * len(kept), differing(dropped, expected)  # the CPU part decides
    assert again["output_ids"] == reference_outputs(model_dir, SCOUT_ENV, [prompts[2]], 4)[0][0]
    for i, how in victims.items():
        if how == "plain":
            assert outcomes[i]["status"] == 500 and re.search(MESSAGES[stage], outcomes[i]["body"]), outcomes[i]
        else:
            reason = outcomes[i]["meta_info"]["finish_reason"]
            assert reason["type"] == "abort" and reason["status_code"] == 500, outcomes[i]
            assert re.search(MESSAGES[stage], reason["message"]), reason
    assert stats["request_failures"] == {"prefill": 0, "decode": 0} | {stage: 2}, stats["request_failures"]
    assert stats["usage"]["requests"] == 0 and stats["usage"]["host_pages"] == 0  # every page freed
    served = re.search(rf'^scout_request_failures_total\{{stage="{stage}",tp_rank="0"\}} (\S+)', metrics, re.M)
    assert served and float(served.group(1)) == 2
    assert again["meta_info"]["completion_tokens"] == 4 and health == 200
    text = log.read_text()
    assert text.count(f"aborted in its {stage}, the other requests go on") == 2
    assert "Traceback" not in text
