"""The GPU benchmark's model: a Qwen3 decoder stack around the engine's attention (qwen3.py), the attention
workload generated on the device (workload.py), and one measured configuration (run.py)."""
