"""scout-sglang: GPU-CPU co-attention decoding for SGLang.

Most of each request's KV cache lives in host DRAM; the device keeps per-block
digests and the important blocks; attention over the selected off-device blocks
runs on CPU threads one layer ahead and is merged by LSE. Importing this package
initialises nothing (no CUDA, no threads, no compilation).
"""

__version__ = "0.1.0"
