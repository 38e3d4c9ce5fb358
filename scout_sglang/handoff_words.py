"""The CPU part's hand-off protocol: control words in page-locked memory, shared by the device and the CPU worker.

digest -> select -> split -> device part / **CPU part** -> merge. One row of
WORDS_PER_LAYER int32 words per layer with a CPU part (one 64-byte line, so two
layers never share a cache line):

    word      written by        meaning
    ROWS      the device        batch rows of the part (before DOORBELL)
    DOORBELL  the device        the step's sequence number: the part's staging (query, host page lists,
                                counts) has landed; written with release order after ROWS
    STATUS    the worker        OK or ERROR for the part it finished (before DONE)
    ERROR_ROW the worker        the first batch row whose part failed (-1: none)
    DONE      the worker        the sequence number of the part it finished: always written, also on error,
                                so a waiting device never hangs on a worker that is alive

The device rings (ROWS, then DOORBELL) after the split stage staged the part,
and before it needs the result waits until DONE equals the step's sequence
number or the deadline passes; the layer's status (a device word, STATUS_*
below) then says whose result the merge takes: the worker's, or the fallback's
(the part computed by the device itself, exactly, from the same staging). A
late result lands in buffers the merge no longer reads, and its sequence
number is not the step's, so it is never taken for a later step's.

On a CUDA device the ring and the wait are kernels (kernels/triton/handoff.py);
on the CPU device the engine's thread plays the stream: it writes the words and
waits on DONE itself. Workers: cpu_worker/native/worker_pool.h (C++ threads, no
Python) and cpu_worker/flag_worker.py (the Python reference).
"""

ROWS, DOORBELL, STATUS, ERROR_ROW, DONE = range(5)
WORDS_PER_LAYER = 16

# Layer statuses: what the device merged (the first two are also the worker's STATUS word).
STATUS_OK, STATUS_ERROR, STATUS_DEADLINE, STATUS_DEVICE_ONLY = range(4)
CAUSE_OF_STATUS = {STATUS_ERROR: "error", STATUS_DEADLINE: "deadline", STATUS_DEVICE_ONLY: "device_only"}

# The step plan's header (core/step_plan.py), on the device: what the ring and the wait read in a captured step.
HEADER_SEQ, HEADER_ROWS, HEADER_BYPASS = range(3)  # BYPASS nonzero: device-only, nothing is rung
HEADER_WORDS = 4
