"""`import lookahead.kernels` and the CPU path never import triton."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_cpu_path_does_not_import_triton():
    code = textwrap.dedent(
        """
        import sys
        import torch
        import lookahead.kernels as K
        p = torch.tensor([[-1, 0, 1]], dtype=torch.int32)
        n = torch.tensor([3], dtype=torch.int32)
        K.tree_metadata(p, n, torch.tensor([4]))
        K.build_full_mask(p, n, torch.tensor([4]))
        K.verify_greedy(p.clamp(min=0), p, n, torch.zeros(1, 3, dtype=torch.int64))
        K.verify_sampling(p.clamp(min=0), p, n, torch.full((1, 3, 2), 0.5), torch.rand(1, 3))
        print("triton" in sys.modules)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "False", out.stderr
