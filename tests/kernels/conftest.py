"""Kernel tests run Triton's CPU interpreter unless `LOOKAHEAD_KERNEL_DEVICE=cuda`, which
runs every Triton kernel compiled on the GPU (inputs built on the CPU are moved there and
results moved back; see `kernel_trees.on_device`). The interpreter flag must be set before
any kernel is compiled (the kernel modules import triton lazily, on the first launch)."""

import os

if os.environ.get("LOOKAHEAD_KERNEL_DEVICE", "cpu") == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"
