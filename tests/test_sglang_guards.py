"""The scout server's guards through the real SGLang server (CPU, fp32) and real HTTP: a request asking for
more sequences than SCOUT_MAX_N gets HTTP 400 on /v1/chat/completions, /v1/completions and /generate
(streaming or not) while one within it is served; a SIGTERM with 16 requests in flight lets the short ones
finish, aborts the rest with HTTP 503 "server shutting down" after SCOUT_DRAIN_S, and the server's whole
process tree is gone within the drain plus 5 s, its CPU worker threads joined."""

import concurrent.futures
import json
import os
import signal
import time
import urllib.error
from pathlib import Path

import pytest
from sparse_reference import random_prompts
from support import requires_sglang

from scout_sglang.hf.tiny_models import save_tiny_model
from scout_sglang.server.client import post, post_json, scout_stats
from scout_sglang.server.launch import launched_server, launched_server_process

pytestmark = [requires_sglang, pytest.mark.slow]
SCOUT_ENV = {"SCOUT_CONFIG": "tiny", "SCOUT_CPU_GROUPS": "1"}
ARGS = ("--attention-backend", "scout", "--dtype", "float32", "--max-total-tokens", "65536",
        "--max-running-requests", "16", "--disable-radix-cache")
VOCAB = 263
MAX_N = 4
DRAIN_S = 6.0
EXIT_MARGIN_S = 5.0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("model"), "llama", num_layers=4, hidden=64, num_heads=4,
                           num_kv_heads=2, head_dim=16)


def refusal(url: str, payload: dict) -> tuple[int, str]:
    """(HTTP status, body) of a request expected to be refused."""
    with pytest.raises(urllib.error.HTTPError) as error:
        post(url, payload, timeout=60)
    return error.value.code, error.value.read().decode()


def test_a_request_for_more_sequences_than_the_cap_gets_400_and_one_within_it_is_served(model_dir, tmp_path):
    chat = {"model": "m", "messages": [{"role": "user", "content": "hello world " * 10}], "max_tokens": 4}
    text = "the quick brown fox jumps over the lazy dog " * 4
    completion = {"model": "m", "prompt": text, "max_tokens": 4}
    # ignore_eos: the random model samples (n > 1), and a sample may end on <eos> before its 4 tokens
    generate = {"text": text, "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}
    with launched_server(model_dir, *ARGS, env=SCOUT_ENV | {"SCOUT_MAX_N": str(MAX_N)},
                         log_path=tmp_path / "cap.log") as base:
        refused = [
            refusal(base + "/v1/chat/completions", chat | {"n": MAX_N + 1}),
            refusal(base + "/v1/chat/completions", chat | {"n": MAX_N + 1, "stream": True}),
            refusal(base + "/v1/completions", completion | {"n": MAX_N + 1}),
            refusal(base + "/v1/completions", completion | {"prompt": [text, text], "n": MAX_N // 2 + 1}),
            refusal(base + "/generate", generate | {"sampling_params": {"max_new_tokens": 4, "n": MAX_N + 1}}),
            refusal(base + "/generate", generate | {"sampling_params": {"max_new_tokens": 4, "n": MAX_N + 1},
                                                    "stream": True}),
            refusal(base + "/generate", {"text": [text] * (MAX_N + 1), "sampling_params": {"max_new_tokens": 4}}),
        ]
        served_chat = post_json(base + "/v1/chat/completions", chat | {"n": MAX_N})
        served_completion = post_json(base + "/v1/completions", completion | {"prompt": [text, text], "n": 2})
        served_generate = post_json(base + "/generate", generate | {"sampling_params": {"max_new_tokens": 4,
                                                                                        "n": MAX_N,
                                                                                        "ignore_eos": True}})
        assert post_json(base + "/generate", generate)["meta_info"]["completion_tokens"] == 4  # still serving
    for status, body in refused:
        assert status == 400, body
        assert f"at most {MAX_N} per request (SCOUT_MAX_N)" in body, body
    assert len(served_chat["choices"]) == MAX_N
    assert len(served_completion["choices"]) == 4
    assert len(served_generate) == MAX_N and all(o["meta_info"]["completion_tokens"] == 4 for o in served_generate)


def session_processes(session: int) -> list[str]:
    """Live (non-zombie) processes of a session, as 'pid name'."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name, fields = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
        if int(fields[3]) == session and fields[0] != "Z":
            found.append(f"{stat.parent.name} {name}")
    return found


def stream_outcome(url: str, payload: dict) -> dict:
    """The last event of a streamed /generate, or {'status': code, 'body': text} when it is refused."""
    try:
        body = post(url, payload | {"stream": True}, timeout=120)
    except urllib.error.HTTPError as error:
        return {"status": error.code, "body": error.read().decode()}
    events = [line[len("data: "):] for line in body.splitlines() if line.startswith("data: ")]
    return json.loads([event for event in events if event != "[DONE]"][-1])


def plain_outcome(url: str, payload: dict) -> dict:
    try:
        return post_json(url, payload, timeout=120)
    except urllib.error.HTTPError as error:
        return {"status": error.code, "body": error.read().decode()}


def test_sigterm_with_sixteen_requests_in_flight_drains_aborts_and_exits_in_time(model_dir, tmp_path):
    prompts = random_prompts([40 + 7 * i for i in range(16)], vocab=VOCAB, seed=5)
    short, long = 8, 3000  # two requests finish inside the drain, fourteen cannot
    log = tmp_path / "drain.log"
    with launched_server_process(model_dir, *ARGS, env=SCOUT_ENV | {"SCOUT_DRAIN_S": str(DRAIN_S)},
                          log_path=log) as (base, process):
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            futures = []
            for i, prompt in enumerate(prompts):
                tokens = short if i < 2 else long
                payload = {"input_ids": prompt, "sampling_params": {"max_new_tokens": tokens, "temperature": 0,
                                                                    "ignore_eos": True}}
                outcome = stream_outcome if i % 2 else plain_outcome
                futures.append(pool.submit(outcome, base + "/generate", payload))
            deadline = time.monotonic() + 120
            while scout_stats(base)["usage"]["requests"] < 14:  # the long ones are all decoding
                assert time.monotonic() < deadline, "the requests never all ran"
                time.sleep(0.2)
            sent = time.monotonic()
            os.kill(process.pid, signal.SIGTERM)  # the main process only, as an orchestrator does
            process.wait(timeout=DRAIN_S + 60)
            exit_s = time.monotonic() - sent
            outcomes = [future.result(timeout=60) for future in futures]
        left = session_processes(process.pid)
    print(f"SIGTERM to exit: {exit_s:.1f} s (drain {DRAIN_S:g} s)")
    assert exit_s <= DRAIN_S + EXIT_MARGIN_S, exit_s
    assert not left, left
    for i, outcome in enumerate(outcomes):
        if i < 2:  # finished within the drain
            assert outcome["meta_info"]["completion_tokens"] == short, outcome
        elif i % 2:  # streamed: the last event carries the abort
            reason = outcome["meta_info"]["finish_reason"]
            assert reason["type"] == "abort" and reason["status_code"] == 503, outcome
            assert "server shutting down" in reason["message"], outcome
        else:
            assert outcome["status"] == 503 and "server shutting down" in outcome["body"], outcome
    text = log.read_text()
    assert "CPU worker threads joined" in text, text[-3000:]
