"""Guards of a scout server's HTTP front: a cap on the sequences one request starts, a bounded drain.

A client asking for n = 1000 would hold every request slot and the host K/V of 1000 sequences by
itself, and SGLang 0.5.23 has no bound on n. A SIGTERM makes SGLang wait for every request with no
time limit (polling every 5 s), so an orchestrator's SIGKILL ends it mid-request. Hooks installed by
plugin.py, active only on a server whose decode backend is scout (the plugin is loaded by every
SGLang server of the environment):

  fan-out   /v1/chat/completions, /v1/completions and /generate refuse, with HTTP 400 before
            anything streams, a request whose n times its prompts exceeds SCOUT_MAX_N;
  drain     after SIGTERM, requests get SCOUT_DRAIN_S seconds to finish; the rest are aborted
            with HTTP 503 "server shutting down" (a streaming client gets that finish reason), then
            SGLang's own shutdown runs: schedulers exit (each backend's CPU worker threads joined,
            see plugin.py), their process tree is killed, the HTTP server stops.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from http import HTTPStatus

from scout_sglang.env import drain_seconds, max_n

logger = logging.getLogger("scout_sglang.sglang_adapter")
CHAT_VALIDATE_TARGET = "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._validate_request"
COMPLETION_VALIDATE_TARGET = ("sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion."
                              "_validate_request")
GENERATE_TARGET = "sglang.srt.entrypoints.http_server.serve_generate_request"
DRAIN_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager.sigterm_watchdog"
POLL_S = 0.1
ABORT_WAIT_S = 3.0  # for aborted requests to reach their clients before the shutdown goes on


def serves_scout(server_args) -> bool:
    """Whether this server decodes with the scout backend."""
    backend = getattr(server_args, "attention_backend", None)
    return (getattr(server_args, "decode_attention_backend", None) or backend) == "scout"


def batch_size(prompt) -> int:
    """Prompts in an OpenAI `prompt` or a /generate `text` / `input_ids`: a string or a list of token ids
    is one, a list of those is one each."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
        return len(prompt)
    return 1


def sampling_n(sampling_params) -> int:
    """n of /generate's sampling_params (a dict, or one dict per prompt)."""
    params = sampling_params if isinstance(sampling_params, list) else [sampling_params]
    return max((int((p or {}).get("n") or 1) for p in params if isinstance(p, dict) or p is None), default=1)


def fan_out_problem(n: int, prompts: int, limit: int) -> str | None:
    """The refusal of a request starting n x prompts sequences, or None within the limit."""
    if n * prompts <= limit:
        return None
    asked = f"n={n}" if prompts == 1 else f"n={n} for each of {prompts} prompts"
    return (f"{asked} asks for {n * prompts} sequences; this server starts at most {limit} per request "
            "(SCOUT_MAX_N): send fewer, or several requests")


def check_chat(result, serving, request):
    """AFTER hook of OpenAIServingChat._validate_request: its error message, or the fan-out's."""
    if result or not serves_scout(serving.tokenizer_manager.server_args):
        return None
    return fan_out_problem(request.n or 1, 1, max_n())


def check_completion(result, serving, request):
    """AFTER hook of OpenAIServingCompletion._validate_request."""
    if result or not serves_scout(serving.tokenizer_manager.server_args):
        return None
    return fan_out_problem(request.n or 1, batch_size(request.prompt), max_n())


def check_generate(original, obj, request, *args, **kwargs):
    """AROUND hook of http_server.serve_generate_request (the /generate route after its schema check)."""
    from sglang.srt.entrypoints.http_server import get_global_state

    state = get_global_state()
    if state is not None and serves_scout(state.tokenizer_manager.server_args):
        prompt = obj.text if obj.text is not None else obj.input_ids if obj.input_ids is not None else obj.input_embeds
        problem = fan_out_problem(sampling_n(obj.sampling_params), batch_size(prompt), max_n())
        if problem:
            return _refused(problem)
    return original(obj, request, *args, **kwargs)


async def _refused(message: str):
    from fastapi.responses import ORJSONResponse

    return ORJSONResponse(status_code=HTTPStatus.BAD_REQUEST,
                          content={"error": {"message": message, "type": "BadRequestError", "code": 400}})


async def bounded_drain(original, manager, *args, **kwargs):
    """AROUND hook of TokenizerManager.sigterm_watchdog: the drain bounded by SCOUT_DRAIN_S, then SGLang's
    shutdown (which finds no request left, or is told by SGL_FORCE_SHUTDOWN not to wait for stragglers)."""
    if not serves_scout(manager.server_args):
        return await original(manager, *args, **kwargs)
    limit = drain_seconds()
    while not manager.gracefully_exit:
        await asyncio.sleep(POLL_S)
    started = time.monotonic()
    logger.info("SIGTERM: %d requests unfinished; they may finish for %g s (SCOUT_DRAIN_S)",
                len(manager.rid_to_state), limit)
    while manager.rid_to_state and time.monotonic() - started < limit:
        await asyncio.sleep(POLL_S)
    if manager.rid_to_state:
        abort_all(manager, f"server shutting down: the request was unfinished after the {limit:g} s drain "
                           "(SCOUT_DRAIN_S)")
        aborted = time.monotonic()
        while manager.rid_to_state and time.monotonic() - aborted < ABORT_WAIT_S:
            await asyncio.sleep(POLL_S)
        if manager.rid_to_state:
            logger.warning("SIGTERM: %d aborted requests did not finish in %g s; shutting down without them",
                           len(manager.rid_to_state), ABORT_WAIT_S)
            os.environ["SGL_FORCE_SHUTDOWN"] = "1"  # SGLang's switch: its drain loop stops waiting
    logger.info("SIGTERM: drained in %.1f s; shutting down", time.monotonic() - started)
    return await original(manager, *args, **kwargs)


def abort_all(manager, message: str) -> None:
    """Abort every request of the scheduler with HTTP 503 and `message` as its finish reason."""
    from sglang.srt.managers.io_struct import AbortReq
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    logger.warning("SIGTERM: aborting %d unfinished requests: %s", len(manager.rid_to_state), message)
    reason = FINISH_ABORT(message, HTTPStatus.SERVICE_UNAVAILABLE, "ServiceUnavailable").to_json()
    manager._dispatch_to_scheduler(AbortReq(rid="", abort_all=True, abort_message=message, finished_reason=reason))
