"""Small HTTP client for a running SGLang server: JSON posts, server-sent event
streams, /generate, and the scout backend's statistics from /server_info."""

from __future__ import annotations

import json
import urllib.request

TIMEOUT_S = 300


def post(url: str, payload: dict, *, timeout: float = TIMEOUT_S) -> str:
    """POST a JSON payload; returns the response body as text."""
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read().decode()


def post_json(url: str, payload: dict, *, timeout: float = TIMEOUT_S) -> dict:
    return json.loads(post(url, payload, timeout=timeout))


def post_stream(url: str, payload: dict, *, timeout: float = TIMEOUT_S) -> list[dict]:
    """POST with "stream": true; returns the decoded `data:` events (without [DONE])."""
    request = urllib.request.Request(url, data=json.dumps({**payload, "stream": True}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = response.read().decode()
    events = [line[len("data: "):] for line in body.splitlines() if line.startswith("data: ")]
    return [json.loads(event) for event in events if event != "[DONE]"]


def get_json(url: str, *, timeout: float = TIMEOUT_S) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def generate(base: str, prompt, new_tokens: int, **extra) -> dict:
    """Greedy /generate of `new_tokens` tokens; `prompt` is text or a list of token ids."""
    key = "text" if isinstance(prompt, str) else "input_ids"
    sampling = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
    return post_json(base + "/generate", {key: prompt, "sampling_params": sampling, **extra})


def scout_stats(base: str) -> dict | None:
    """The scout backend's co-attention statistics (None when the server runs another backend)."""
    states = get_json(base + "/server_info").get("internal_states") or [{}]
    return states[0].get("scout")
