"""The decode-step benchmark behind benchmarks/bench_decode_step.py, in parts:
common (shape, timer names), workload (synthetic K/V and queries, simulated
layer compute), cpu_watch (the CPU worker's busy time), runner (engines and
their timed steps), sweep (shapes, modes, ablation), hardware, report, plot.
"""
