"""Whether the layers hand their CPU part to the CPU worker, from how it has been doing.

A CPU part that fails or misses its deadline is computed by the layer itself (cpu_handoff.py), exactly;
a late one costs the whole deadline first. When most parts fail, the worker is broken (its threads are
stuck or keep dying), and waiting for it costs every layer its deadline. So after FAILURES parts failed
within WINDOW_S seconds, at least FAILED_SHARE of those handed to it, the layers stop handing it work:
they compute their CPU part themselves from the host store at once (device-only decoding: the listed host
blocks are copied in the way recall copies them, and attended on the device), exact as before, for
COOL_DOWN_S seconds. Then the next part goes to the worker again as a trial: done in time, the worker is
healthy and co-attention resumes; failed, device-only goes on for another cool-down. Each switch is
logged; `device_only` says which way it is (the server serves it as the gauge scout_cpu_device_only).
"""

from __future__ import annotations

import logging
import time
from collections import deque

logger = logging.getLogger("scout_sglang.core")
WINDOW_S = 10.0
FAILURES = 8
FAILED_SHARE = 0.5
COOL_DOWN_S = 5.0


class CpuWorkerHealth:
    """The circuit between the layers and the CPU worker: closed (co-attention), open (device-only for a
    cool-down), then one trial part.

    clock : seconds, monotonic (tests pass their own)
    """

    def __init__(self, *, window_s: float = WINDOW_S, failures: int = FAILURES, failed_share: float = FAILED_SHARE,
                 cool_down_s: float = COOL_DOWN_S, clock=time.monotonic):
        self.window_s, self.failures, self.failed_share, self.cool_down_s = window_s, failures, failed_share, cool_down_s
        self._clock = clock
        self._outcomes: deque[tuple[float, bool]] = deque()  # (time, failed) of the parts handed to the worker
        self._failed_in_window = 0  # failed outcomes in _outcomes, kept as they come and go: a record costs
        # the same however many parts the window holds (thousands a second on a busy server)
        self._open_until: float | None = None  # device-only until then; None: the worker is used
        self.switches = 0  # times decoding went device-only

    @property
    def device_only(self) -> bool:
        """Whether the layers compute their CPU part themselves (the worker is given no work)."""
        return self._open_until is not None and self._clock() < self._open_until

    def use_worker(self) -> bool:
        """Whether the next CPU part goes to the worker (in device-only mode: only as the trial after the
        cool-down)."""
        return not self.device_only

    def record(self, failed: bool, cause: str | None = None) -> None:
        """The outcome of a part handed to the worker."""
        now = self._clock()
        if self._open_until is not None and now < self._open_until:
            return  # handed over before decoding went device-only (layer-ahead keeps parts in flight): no trial
        if self._open_until is not None:  # the trial after a cool-down
            if failed:
                self._open_until = now + self.cool_down_s
                logger.warning("scout: the CPU attention worker still fails (%s); decoding stays device-only for "
                               "%g s more", cause, self.cool_down_s)
            else:
                self._open_until = None
                self._outcomes.clear()
                self._failed_in_window = 0
                logger.warning("scout: the CPU attention worker is healthy again: co-attention resumes")
            return
        self._outcomes.append((now, failed))
        self._failed_in_window += failed
        while self._outcomes and self._outcomes[0][0] < now - self.window_s:
            self._failed_in_window -= self._outcomes.popleft()[1]
        failed_count = self._failed_in_window
        if failed and failed_count >= self.failures and failed_count >= self.failed_share * len(self._outcomes):
            self._open_until = now + self.cool_down_s
            self.switches += 1
            logger.warning("scout: the CPU attention worker failed %d of its last %d parts within %g s (last: %s); "
                           "decoding goes device-only (each layer computes its CPU part itself, exactly) and "
                           "tries the worker again in %g s", failed_count, len(self._outcomes), self.window_s, cause,
                           self.cool_down_s)
