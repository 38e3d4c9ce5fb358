"""Columns of the decode step's per-layer counters: one int32 row per layer, read once per step.

The fused stages (stage_select, stage_split, stage_recall) add their counts to
the row of the layer they run for (an atomic add per program on CUDA, a sum on
the CPU); the engine reads the whole [layers, NUM_COUNTERS] tensor once, in
end_step, and zeroes it.
"""

SELECTED, CPU, DROPPED, RECALLED, CHANGED, COMPARED, WITHHELD, BACKED_OFF, ZERO_COPY, BAD_PAGES = range(10)
NUM_COUNTERS = 10
COUNTER_NAMES = ("selected_blocks", "cpu_blocks", "dropped_blocks", "recalled_blocks", "changed_blocks",
                 "compared_blocks", "withheld_blocks", "backed_off_rows", "zero_copy_blocks",
                 "bad_pages")
