"""A failure that concerns one request costs that request, never the server.

When the backend finds one request's state inconsistent while planning a step (the engine holds another
token count than SGLang's batch, or none at all: with the scout KV pool its K/V is nowhere else), raising
would end the scheduler and with it every request. Instead the backend frees the request's engine state,
puts an empty stand-in in its row so the step computes (that row's output is thrown away), and records
the failure here. After the forward, plugin.py's hook on the scheduler's run_batch aborts the request the
ways SGLang's scheduler does from inside a batch: a running request gets `to_finish = FINISH_ABORT(message,
500)` (as for a grammar failure or an abort request), a request in the middle of a chunked prefill becomes
the scheduler's pending chunked abort with that reason (as Scheduler.abort_request makes it, without the
rid-prefix match that could catch other requests), so no further chunk runs. Its client gets HTTP 500 with
the message (a streaming one gets that finish reason), SGLang releases it (the release hook frees the
stand-in), and the other requests of the batch go on. Under the radix cache the request is barred from the
tree (its last rows hold no K/V), so no later request can match them. Until then a given-up request may run once more
(an in-flight chunk, or a step scheduled before the abort landed): it gets a stand-in again, not a second
failure.

A failure that leaves the backend itself unusable still raises, and SGLang stops the server.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("scout_sglang.sglang_adapter")


class RequestFailures:
    """Requests the backend gave up on, by request slot, until the scheduler aborts them.

    pattern : tests only (SCOUT_TEST_FAULTS request_state): requests whose id contains it lose their engine
        state once: before their second prefill chunk (a chunked prefill), or else at their third decode step
        (so that they decode in a batch with others first)
    """

    INJECT_AT_STEP = 2  # decode steps done before the injected fault
    STAGES = ("prefill", "decode")  # where the inconsistency was found

    def __init__(self, pattern: str | None = None):
        self.pending: dict[int, str] = {}
        self.given_up: set[int] = set()  # slots failed and not yet released
        self.counts = dict.fromkeys(self.STAGES, 0)  # stage -> requests given up since start-up
        self._pattern = pattern
        self._injected: set[str] = set()

    def fail(self, slot: int, request_id: str | None, stage: str, message: str) -> None:
        """Record that the request in `slot` cannot go on, and why (once per request)."""
        if slot in self.given_up:
            return
        self.given_up.add(slot)
        logger.error("scout: request %s aborted in its %s, the other requests go on: %s",
                     request_id or f"in slot {slot}", stage, message)
        self.pending[slot] = message
        self.counts[stage] += 1

    def take(self) -> dict[int, str]:
        """The failures recorded since the last call (slot -> message)."""
        pending, self.pending = self.pending, {}
        return pending

    def inject(self, engine, slots: list[int], request_ids: list[str] | None, continued_chunks: bool = False) -> None:
        """Tests only: drop the engine state of the requests the fault plan names (each once), given the
        requests of a decode step, or (continued_chunks) those continuing a prefill."""
        if not self._pattern or not request_ids:
            return
        for slot, request_id in zip(slots, request_ids):
            state = engine.requests.get(slot)
            if (request_id and self._pattern in request_id and request_id not in self._injected and state is not None
                    and (continued_chunks or state.steps >= self.INJECT_AT_STEP)):
                self._injected.add(request_id)
                logger.warning("scout: SCOUT_TEST_FAULTS drops the engine state of request %s (slot %d, %d tokens)",
                               request_id, slot, state.num_tokens)
                engine.release_request(slot)


def abort_failed_requests(scheduler, reqs, failures: dict[int, str]) -> None:
    """Abort (HTTP 500) each request of a scheduled batch whose slot failed."""
    from http import HTTPStatus

    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    for req in reqs:
        message = failures.get(getattr(req.kv, "req_pool_idx", None))
        if message is None or req.finished():
            continue
        reason = FINISH_ABORT(f"scout: {message}", HTTPStatus.INTERNAL_SERVER_ERROR, "InternalServerError")
        req.skip_radix_cache_insert = True  # its last rows hold no K/V: the radix tree must not keep them
        if getattr(scheduler, "chunked_req", None) is req:
            req.discard_output_reason = reason
            scheduler._pending_chunked_abort_req = req
        else:
            req.to_finish = reason
