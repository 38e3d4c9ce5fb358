"""Parts of benchmarks/bench_cpu_attention.py: layouts (host store layouts read side by side)."""
