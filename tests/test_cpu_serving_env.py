"""The reproducible CPU serving environment: a stock SGLang server (torch_native
attention) serves a locally built model through the OpenAI API and /generate."""

import importlib.util
import os
import subprocess
import sys

import pytest
import torch
from support import requires_sglang

from scout_sglang.hf.tiny_models import save_tiny_model
from scout_sglang.server.client import post_json, post_stream
from scout_sglang.server.launch import launched_server

pytestmark = [requires_sglang, pytest.mark.slow]


@pytest.fixture(scope="module")
def stock_server(tmp_path_factory):
    model = save_tiny_model(tmp_path_factory.mktemp("model"), "llama", num_layers=2, hidden=64, num_heads=4,
                            num_kv_heads=2, head_dim=16)
    log = tmp_path_factory.mktemp("logs") / "server.log"
    with launched_server(model, "--attention-backend", "torch_native", "--max-total-tokens", "2048",
                         "--disable-radix-cache", log_path=log) as base:
        yield base


def test_chat_completion_answers(stock_server):
    reply = post_json(stock_server + "/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "hello world"}], "max_tokens": 6, "temperature": 0})
    assert reply["usage"]["completion_tokens"] == 6 and reply["choices"][0]["finish_reason"] == "length"


def test_streaming_chat_completion_answers(stock_server):
    events = post_stream(stock_server + "/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5, "temperature": 0})
    assert len(events) >= 2 and events[-1]["choices"][0]["finish_reason"] == "length"


def test_completion_and_generate_agree_greedily(stock_server):
    text = "the quick brown fox"
    completion = post_json(stock_server + "/v1/completions", {"model": "tiny", "prompt": text, "max_tokens": 6, "temperature": 0})
    generated = post_json(stock_server + "/generate", {"text": text, "sampling_params": {"max_new_tokens": 6, "temperature": 0}})
    assert completion["choices"][0]["text"] == generated["text"]


@pytest.mark.skipif(importlib.util.find_spec("mooncake") is None, reason="Mooncake transfer engine not installed")
@pytest.mark.skipif(torch.cuda.is_available(), reason="the stand-in is installed on CPU-only machines only")
def test_the_mooncake_sender_takes_its_plain_path_on_a_cpu_only_machine():
    """The stand-in of cpu_serving/scout_cpu_serving_pd.py: without it a CPU-only prefill server fails at its
    first K/V send (it would pin host memory, which needs an accelerator)."""
    code = ("from sglang.srt.disaggregation.mooncake.conn import MooncakeKVSender; "
            "print(MooncakeKVSender.supports_host_tensor_indices)")
    result = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, SGLANG_USE_CPU_ENGINE="1"))
    assert result.stdout.strip().splitlines()[-1] == "False", result.stderr[-2000:]
