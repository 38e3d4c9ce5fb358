"""Test-only faults injected into the CPU attention worker's own threads, and into one request's state.

The CPU part of co-attention must never cost a token or the server: a task
that raises or comes late is computed by the layer itself (core/cpu_handoff.py).
To test that against the real threads, a FaultPlan (from SCOUT_TEST_FAULTS, read
in scout_sglang/env.py, refused outside a test run) makes a worker raise or
sleep before a job's work (one layer's rung part: flag_worker.py draws in
Python, native/worker_pool.h draws the same plan in C++); or end its own thread
there, as an error escaping a worker's loop would (the next kick() replaces the
thread). A failure that concerns one request must cost only that request: the
plan's request_state names requests (by a part of their id) whose engine state
the SGLang backend drops during their decode (sglang_adapter/request_failures.py).
Off (None) by default; nothing here runs in production.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass

FAULT_KEYS = ("cpu_raise", "cpu_delay", "cpu_delay_ms", "cpu_drop", "cpu_thread_exits", "seed", "request_state")


INT_KEYS = ("cpu_thread_exits", "seed")


class InjectedFault(RuntimeError):
    """The exception a FaultPlan makes a worker raise."""


class InjectedThreadExit(BaseException):
    """Ends the worker thread that raises it: not an Exception, so no task's handler catches it."""


@dataclass(frozen=True)
class FaultPlan:
    """What to inject, per job a worker starts (one rung layer part).

    raise_probability : cpu_raise, chance that the job raises InjectedFault
    delay_probability : cpu_delay, chance that the job first sleeps delay_ms (default 1 when
        cpu_delay_ms is given: every job)
    delay_ms : cpu_delay_ms, the sleep
    drop_probability : cpu_drop, chance that a part's result is thrown away: the worker reports it done and OK
        with empty results (o = 0, lse = -inf), so the merge keeps the device part alone: what a test's negative
        control needs to show that the CPU part decides tokens
    thread_exits : cpu_thread_exits, how many jobs (the worker's first ones) end the thread that
        takes them, their work undone
    seed : the draws' seed (one generator per worker, shared by its threads)
    request_state : request_state, a part of request ids: each request whose id contains it loses its
        engine state once, in its decode (None: no request does)
    """

    raise_probability: float = 0.0
    delay_probability: float = 0.0
    delay_ms: float = 0.0
    drop_probability: float = 0.0
    thread_exits: int = 0
    seed: int = 0
    request_state: str | None = None

    def __post_init__(self):
        for name in ("raise_probability", "delay_probability", "drop_probability"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        if self.delay_ms < 0:
            raise ValueError(f"delay_ms must be >= 0, got {self.delay_ms}")
        if self.thread_exits < 0:
            raise ValueError(f"thread_exits must be >= 0, got {self.thread_exits}")

    @classmethod
    def parse(cls, text: str) -> FaultPlan:
        """'cpu_raise:0.1,cpu_delay_ms:200,cpu_delay:0.5,seed:1,request_state:victim' -> FaultPlan (unknown
        keys are errors)."""
        values = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, _, value = item.partition(":")
            if key not in FAULT_KEYS or not value:
                raise ValueError(f"fault {item!r} is not key:value with a key among {', '.join(FAULT_KEYS)}")
            values[key] = value if key == "request_state" else int(value) if key in INT_KEYS else float(value)
        delay_ms = values.get("cpu_delay_ms", 0.0)
        return cls(raise_probability=values.get("cpu_raise", 0.0),
                   delay_probability=values.get("cpu_delay", 1.0 if delay_ms else 0.0),
                   delay_ms=delay_ms, drop_probability=values.get("cpu_drop", 0.0),
                   thread_exits=values.get("cpu_thread_exits", 0), seed=values.get("seed", 0),
                   request_state=values.get("request_state"))

    @property
    def cpu_faults(self) -> bool:
        """Whether the CPU worker threads inject anything."""
        return bool(self.raise_probability or self.delay_probability or self.drop_probability or self.thread_exits)


class FaultInjector:
    """Draws a FaultPlan's faults; called by worker threads (thread-safe)."""

    def __init__(self, plan: FaultPlan):
        self.plan = plan
        self._random = random.Random(plan.seed)
        self._lock = threading.Lock()
        self._exits_left = plan.thread_exits

    def before_work(self, layer: int) -> None:
        """Maybe end the thread (the first thread_exits calls), maybe sleep, then maybe raise InjectedFault;
        draws in a fixed order per call."""
        with self._lock:
            if self._exits_left:
                self._exits_left -= 1
                raise InjectedThreadExit(f"injected CPU worker thread exit (layer {layer}; SCOUT_TEST_FAULTS)")
            delay = self._random.random() < self.plan.delay_probability
            fail = self._random.random() < self.plan.raise_probability
        if delay:
            time.sleep(self.plan.delay_ms / 1e3)
        if fail:
            raise InjectedFault(f"injected CPU attention fault (layer {layer}; SCOUT_TEST_FAULTS)")

    def drops(self) -> bool:
        """Whether a new part's result is thrown away (cpu_drop), drawn when the part is rung (before any of its
        work)."""
        if not self.plan.drop_probability:
            return False
        with self._lock:
            return self._random.random() < self.plan.drop_probability
