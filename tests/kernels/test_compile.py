"""Every Triton kernel compiles with Triton's real NVIDIA backend, for Hopper (sm_90) and
Ampere (sm_80), down to a cubin. No GPU is needed: this catches what the CPU interpreter
accepts but the compiler rejects (e.g. control flow, loop-carried types). It runs in a
subprocess without TRITON_INTERPRET, whose patches of triton.language would leak into the
compiler in this process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton")

I32, I64 = "i32", "i64"
KERNELS = [
    (
        "tree_mask",
        "_tree_metadata_kernel",
        {
            "parents_ptr": "*i32", "num_nodes_ptr": "*i32", "seq_lens_ptr": "*i64",
            "mask_ptr": "*i8", "positions_ptr": "*i64", "depth_ptr": "*i32",
            "ret_index_ptr": "*i32", "ret_next_token_ptr": "*i32",
            "ret_next_sibling_ptr": "*i32", "W": I32, "BLOCK_W": "constexpr",
        },
        {"BLOCK_W": 32},
    ),
    (
        "full_mask",
        "_full_mask_kernel",
        {
            "parents_ptr": "*i64", "num_nodes_ptr": "*i32", "seq_lens_ptr": "*i64",
            "out_ptr": "*i8", "total": I64, "W": I32, "BLOCK_W": "constexpr",
            "BLOCK_B": "constexpr", "BLOCK_S": "constexpr",
        },
        {"BLOCK_W": 16, "BLOCK_B": 64, "BLOCK_S": 1024},
    ),
    (
        "verify_greedy",
        "_tree_walk_kernel",
        {
            "tokens_ptr": "*i32", "parents_ptr": "*i32", "num_nodes_ptr": "*i32",
            "choice_ptr": "*i64", "accepted_ptr": "*i32", "num_accepted_ptr": "*i32",
            "bonus_ptr": "*i64", "W": I32, "BLOCK_W": "constexpr",
        },
        {"BLOCK_W": 64},
    ),
    (
        "verify_sampling",
        "_draw_kernel",
        {
            "probs_ptr": "*bf16", "uniforms_ptr": "*fp32", "num_nodes_ptr": "*i32",
            "draws_ptr": "*i64", "W": I32, "V": I32, "BLOCK_V": "constexpr",
            "NUM_BLOCKS": "constexpr",
        },
        {"BLOCK_V": 4096, "NUM_BLOCKS": 64},
    ),
]  # fmt: skip


ARCHS = [90, 80]
_SCRIPT = """
import importlib, json, sys, traceback
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction
results = {}
for module, kernel, signature, constexprs in json.loads(sys.argv[1]):
    mod = importlib.import_module("lookahead.kernels." + module)
    mod.tl = tl  # what lazy_jit does on the first launch
    for arch in json.loads(sys.argv[2]):
        try:
            src = ASTSource(JITFunction(getattr(mod, kernel).fn), signature, constexprs)
            compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32))
            results[f"{kernel}:{arch}"] = len(compiled.asm["cubin"])
        except Exception:
            results[f"{kernel}:{arch}"] = traceback.format_exc()[-3000:]
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def compiled():
    """Compile everything in one subprocess (one torch import)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps(KERNELS), json.dumps(ARCHS)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kernel", [k[1] for k in KERNELS])
def test_kernel_compiles_for_nvidia(compiled, kernel, arch):
    result = compiled[f"{kernel}:{arch}"]
    assert isinstance(result, int) and result > 0, f"{kernel} on sm_{arch}:\n{result}"
