"""Units of the per-request failure path (sglang_adapter/request_failures.py): failures are kept by slot until
taken, the test fault drops a named request's engine state once and only after its first decode steps, the
scheduler-side abort marks exactly the failed requests, and a failure escaping a backend entry point is
logged as stopping the server. The whole path runs against the real server in
test_sglang_request_failures.py."""

import logging
from types import SimpleNamespace

import pytest
from support import requires_sglang

from scout_sglang.sglang_adapter.backend import stops_the_server
from scout_sglang.sglang_adapter.request_failures import RequestFailures, abort_failed_requests


class Engine:
    """The part of CoAttentionEngine the fault touches: its requests by slot."""

    def __init__(self, *states):
        self.requests = {state.rid: state for state in states}

    def release_request(self, slot):
        self.requests.pop(slot)


def test_failures_are_counted_by_stage_once_per_request_and_taken_once():
    failures = RequestFailures()
    failures.fail(3, "r-3", "decode", "slot 3 is inconsistent")
    failures.fail(5, None, "prefill", "slot 5 is inconsistent")
    failures.fail(5, None, "prefill", "slot 5 runs its in-flight chunk")  # given up already: not a second failure
    assert failures.take() == {3: "slot 3 is inconsistent", 5: "slot 5 is inconsistent"}
    assert failures.take() == {} and failures.counts == {"prefill": 1, "decode": 1}


def test_the_test_fault_drops_a_named_request_once_after_its_first_decode_steps():
    victim = SimpleNamespace(rid=1, num_tokens=40, steps=RequestFailures.INJECT_AT_STEP - 1)
    other = SimpleNamespace(rid=2, num_tokens=50, steps=9)
    engine = Engine(victim, other)
    failures = RequestFailures("victim")
    failures.inject(engine, [1, 2], ["victim-a", "other"])
    assert set(engine.requests) == {1, 2}  # too early: it has not decoded with the others yet
    victim.steps += 1
    failures.inject(engine, [1, 2], ["victim-a", "other"])
    assert set(engine.requests) == {2}
    engine.requests[1] = victim
    failures.inject(engine, [1, 2], ["victim-a", "other"])
    assert set(engine.requests) == {1, 2}  # once per request
    RequestFailures(None).inject(engine, [1, 2], ["victim-a", "other"])
    assert set(engine.requests) == {1, 2}


@requires_sglang
def test_the_scheduler_side_aborts_exactly_the_failed_unfinished_requests():
    def req(slot, finished=False):
        return SimpleNamespace(kv=SimpleNamespace(req_pool_idx=slot), finished=lambda: finished, to_finish=None,
                               discard_output_reason=None)

    reqs = [req(0), req(1), req(2, finished=True), req(3), req(4)]
    scheduler = SimpleNamespace(chunked_req=reqs[4], _pending_chunked_abort_req=None)
    abort_failed_requests(scheduler, reqs, {1: "slot 1 broke", 2: "slot 2 broke", 4: "slot 4 broke"})
    assert [r.to_finish is not None for r in reqs] == [False, True, False, False, False]
    reason = reqs[1].to_finish.to_json()
    assert reason["type"] == "abort" and reason["status_code"] == 500 and reason["message"] == "scout: slot 1 broke"
    # the request in the middle of a chunked prefill: no further chunk, aborted with the reason
    assert scheduler._pending_chunked_abort_req is reqs[4]
    assert reqs[4].discard_output_reason.to_json()["message"] == "scout: slot 4 broke"


def test_an_error_escaping_an_entry_point_says_what_failed_before_the_server_stops(caplog):
    class Backend:
        @stops_the_server("planning a forward")
        def plan(self):
            raise RuntimeError("the device is gone")

    with caplog.at_level(logging.CRITICAL, "scout_sglang"), pytest.raises(RuntimeError, match="the device is gone"):
        Backend().plan()
    assert ("the attention backend failed while planning a forward and cannot go on, so the server stops "
            "(RuntimeError: the device is gone)") in caplog.text
