"""A failure that concerns one request costs that request, never the server.

When the backend finds one request's state inconsistent while planning a step (the engine holds another
token count than SGLang's batch, or none at all: with the scout KV pool its K/V is nowhere else), raising
would end the scheduler and with it every request. Instead the backend frees the request's engine state,
puts an empty stand-in in its row so the step computes (that row's output is thrown away), and records
the failure here. After the forward, plugin.py's hook on the scheduler's run_batch marks the request
`to_finish = FINISH_ABORT(message, 500)`, the way SGLang's scheduler aborts a request from inside a batch
(a grammar failure, an abort request): its client gets HTTP 500 with the message (a streaming one gets
that finish reason), SGLang releases it (the release hook frees the stand-in), and the other requests of
the batch go on.

A failure that leaves the backend itself unusable still raises, and SGLang stops the server.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("scout_sglang.sglang_adapter")


class RequestFailures:
    """Requests the backend gave up on, by request slot, until the scheduler aborts them.

    pattern : tests only (SCOUT_TEST_FAULTS request_state): requests whose id contains it lose their engine
        state once, at their third decode step (so that they decode in a batch with others first)
    """

    INJECT_AT_STEP = 2  # decode steps done before the injected fault
    STAGES = ("prefill", "decode")  # where the inconsistency was found

    def __init__(self, pattern: str | None = None):
        self.pending: dict[int, str] = {}
        self.counts = dict.fromkeys(self.STAGES, 0)  # stage -> requests given up since start-up
        self._pattern = pattern
        self._injected: set[str] = set()

    def fail(self, slot: int, request_id: str | None, stage: str, message: str) -> None:
        """Record that the request in `slot` cannot go on, and why."""
        logger.error("scout: request %s aborted in its %s, the other requests go on: %s",
                     request_id or f"in slot {slot}", stage, message)
        self.pending[slot] = message
        self.counts[stage] += 1

    def take(self) -> dict[int, str]:
        """The failures recorded since the last call (slot -> message)."""
        pending, self.pending = self.pending, {}
        return pending

    def inject(self, engine, slots: list[int], request_ids: list[str] | None) -> None:
        """Tests only: drop the engine state of the requests the fault plan names (each once)."""
        if not self._pattern or not request_ids:
            return
        for slot, request_id in zip(slots, request_ids):
            state = engine.requests.get(slot)
            if (self._pattern in request_id and request_id not in self._injected and state is not None
                    and state.steps >= self.INJECT_AT_STEP):
                self._injected.add(request_id)
                logger.warning("scout: SCOUT_TEST_FAULTS drops the engine state of request %s (slot %d, %d tokens)",
                               request_id, slot, state.num_tokens)
                engine.release_request(slot)


def abort_failed_requests(reqs, failures: dict[int, str]) -> None:
    """Mark each request of a scheduled batch whose slot failed to finish with an abort (HTTP 500)."""
    from http import HTTPStatus

    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    for req in reqs:
        message = failures.get(getattr(req.kv, "req_pool_idx", None))
        if message is not None and not req.finished():
            req.to_finish = FINISH_ABORT(f"scout: {message}", HTTPStatus.INTERNAL_SERVER_ERROR, "InternalServerError")
