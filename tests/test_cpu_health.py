"""The circuit between the layers and the CPU worker (core/cpu_health.py): repeated failures in a window
switch decoding to device-only (logged, counted), a cool-down later a trial part decides whether the
worker is used again; and, with the fault injector ending the real worker's threads, an engine goes
device-only and back while its outputs stay those of a run without faults."""

import logging
import random
from collections import deque

import pytest
import torch
from support import TOLERANCE
from test_cpu_fallback import driver_and_reference, fallbacks, make_engine  # noqa: F401 - the fixture

from scout_sglang.core.cpu_health import CpuWorkerHealth
from scout_sglang.cpu_worker.faults import FaultPlan

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Clock:
    """Seconds set by the test, or advancing by `tick` at every reading."""

    def __init__(self, tick: float = 0.0):
        self.now, self.tick = 0.0, tick

    def __call__(self):
        self.now += self.tick
        return self.now


def test_repeated_failures_switch_to_device_only_and_a_good_trial_switches_back(caplog):
    caplog.set_level(logging.WARNING, "scout_sglang.core")
    clock = Clock()
    health = CpuWorkerHealth(window_s=10, failures=3, failed_share=0.5, cool_down_s=5, clock=clock)
    for failed in (True, False, True, False):
        health.record(failed, "error")
    assert health.use_worker() and not health.device_only  # 2 failures: not yet
    health.record(True, "deadline")
    assert health.device_only and not health.use_worker() and health.switches == 1
    assert "failed 3 of its last 5 parts within 10 s (last: deadline); decoding goes device-only" in caplog.text
    health.record(True, "error")  # a part still in flight when it switched: no trial, no longer cool-down
    clock.now += 4.9
    assert health.device_only and "still fails" not in caplog.text
    clock.now += 0.1
    assert health.use_worker()  # the trial
    health.record(True, "error")
    assert health.device_only and "still fails (error)" in caplog.text
    clock.now += 5
    assert health.use_worker()
    health.record(False)
    assert not health.device_only and health.use_worker() and health.switches == 1
    assert "healthy again: co-attention resumes" in caplog.text


def test_a_worker_that_mostly_works_or_failed_long_ago_stays_in_use():
    clock = Clock()
    health = CpuWorkerHealth(window_s=10, failures=3, failed_share=0.5, clock=clock)
    for i in range(40):  # one part in five fails: a quarter of the window
        health.record(i % 5 == 0, "error")
    assert not health.device_only
    for _ in range(2):
        health.record(True, "error")
    clock.now += 11  # those two left the window
    health.record(True, "error")
    health.record(False)
    assert not health.device_only and health.switches == 0


class NoWalk(deque):
    """A window that may be appended to and popped from either end, but not walked."""

    def __iter__(self):
        raise AssertionError("record() walked the whole window: its cost grows with the parts it holds")


def test_a_record_does_not_walk_the_window():
    """A busy GPU server hands the worker thousands of parts a second (layers x steps), all in the 10 s window:
    a record that sums the window would cost milliseconds of host time per decode step."""
    clock = Clock(tick=1e-3)
    health = CpuWorkerHealth(window_s=10, failures=3, failed_share=0.5, clock=clock)
    health._outcomes = NoWalk()
    for i in range(30_000):  # 30 s of parts: the window fills, then slides
        health.record(i % 7 == 0, "error")
    assert not health.device_only and len(health._outcomes) == 10_000


def test_the_switch_decisions_equal_a_recount_of_the_window():
    """The running count of failures gives every decision a full recount of the window gives."""
    rng = random.Random(0)
    clock = Clock()
    health = CpuWorkerHealth(window_s=1.0, failures=4, failed_share=0.5, cool_down_s=0.5, clock=clock)
    outcomes, open_until, switched = [], None, 0
    for _ in range(5_000):
        clock.now += rng.expovariate(20.0)
        failed = rng.random() < (0.7 if (clock.now // 3) % 2 else 0.1)  # failing spells, then good ones
        now = clock.now
        if open_until is not None and now < open_until:
            pass
        elif open_until is not None:
            open_until = now + 0.5 if failed else None
            outcomes = [] if not failed else outcomes
        else:
            outcomes = [(t, f) for t, f in outcomes + [(now, failed)] if t >= now - 1.0]
            count = sum(f for _, f in outcomes)
            if failed and count >= 4 and count >= 0.5 * len(outcomes):
                open_until, switched = now + 0.5, switched + 1
        health.record(failed, "error")
        assert health.device_only == (open_until is not None and now < open_until)
    assert health.switches == switched > 10


def test_an_engine_whose_worker_threads_end_goes_device_only_and_back_without_changing_its_outputs(
        driver_and_reference):  # noqa: F811
    driver, expected = driver_and_reference
    health = CpuWorkerHealth(window_s=1e6, failures=2, failed_share=0.5, cool_down_s=6, clock=Clock(tick=1))
    engine = make_engine(cpu_faults=FaultPlan(thread_exits=2), cpu_deadline_ms=20, cpu_health=health)
    outputs = driver.run(engine, close=False)
    torch.testing.assert_close(outputs, expected, **TOLERANCE[torch.float32])
    assert fallbacks(driver.telemetry, "deadline") >= 2  # the parts the ended threads held
    assert fallbacks(driver.telemetry, "device_only") > 0 and health.switches == 1
    state = engine.cpu_worker_state()
    assert state["replaced_threads"] >= 1 and not state["device_only"]  # the worker is back
    last = driver.telemetry[-1]
    assert last.totals().cpu_blocks > 0 and not last.cpu_fallbacks  # the last step used the worker
    engine.close()
