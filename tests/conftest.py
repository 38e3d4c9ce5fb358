"""Test session set-up.

Triton kernels run natively when a GPU is present and under the Triton
interpreter otherwise. The interpreter is chosen when a kernel is decorated, so
it must be set before any kernel module is imported: here, at collection time.
The tolerance table and skip markers live in tests/support.py.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
