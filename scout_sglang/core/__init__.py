"""Framework-agnostic co-attention engine (block state, prediction, recall, modes).

Built on scout_sglang.kernels and scout_sglang.cpu_worker; never imports sglang.
"""
