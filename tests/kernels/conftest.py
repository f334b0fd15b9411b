"""Kernel tests run Triton's CPU interpreter; the flag must be set before any kernel is
compiled (the kernel modules import triton lazily, on the first launch)."""

import os

os.environ["TRITON_INTERPRET"] = "1"
