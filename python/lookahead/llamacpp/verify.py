"""The verdict on one llama.cpp forward's rows: greedy, or exact speculative sampling.

Greedy walks the tree along the target's argmax (`lookahead.llamacpp.tree.greedy_path`).
Sampling is the HF engine's sampler on the same terms: each row's logits warped as HF
`generate` warps them (`lookahead.hf.sampling.warp`: temperature, top-k, top-p), then
`lookahead.kernels.verify_sampling` (one inverse-CDF draw per visited node, the first child
carrying the draw accepted), with uniform `i` of the seeded stream `hf.acceptance.Uniforms`
serving output token `i`;
so a seed gives the same output whatever the trees were, and plain sampled decoding is the
root-only case of the same code. Sampling therefore needs torch, which the `llamacpp` extra
does not install (a 2 GB CUDA build from PyPI); greedy decoding runs without it.
"""

from __future__ import annotations

import numpy as np

from lookahead.errors import InvalidInput
from lookahead.hf.sampling import SamplingConfig
from lookahead.llamacpp.tree import argmax_rows, greedy_path


def _check_torch_for_sampling() -> None:
    """InvalidInput naming what to install, unless torch can be imported."""
    try:
        import torch  # noqa: F401
    except ImportError as e:
        raise InvalidInput(
            "sampling on the llama.cpp engine needs torch (its exact tree sampler is "
            "lookahead.kernels'): pip install 'lookahead-spec[hf]', or decode greedily "
            f"({e})"
        ) from None


class Verifier:
    """Verifies each step's tree for one request under `cfg` (repetition penalty: not in
    this engine, refused by the generator); `seed` None draws a fresh one. Sampling needs
    torch: without it, InvalidInput here, before any forward."""

    def __init__(self, cfg: SamplingConfig, seed: int | None = None):
        self.cfg = cfg
        self.uniforms = None
        if cfg.do_sample:
            _check_torch_for_sampling()
            from lookahead.hf.acceptance import Uniforms

            self.uniforms = Uniforms(None if seed is None else int(seed))

    def __call__(self, logits: np.ndarray, tokens, parents, depth, done: int):
        """(path, bonus) for the tree (`tokens`, `parents`, each node's `depth`) from its
        forward's `logits` [n, V], with `done` tokens output before this step."""
        if not self.cfg.do_sample:
            return greedy_path(tokens, parents, argmax_rows(logits))
        import torch

        from lookahead import kernels
        from lookahead.hf.sampling import warp

        n = len(tokens)
        probs = warp(torch.from_numpy(logits).float(), self.cfg).softmax(dim=-1)
        at = done + torch.tensor(depth, dtype=torch.long)
        res = kernels.verify_sampling(
            torch.tensor([[int(x) for x in tokens]], dtype=torch.long),
            torch.tensor([[int(x) for x in parents]], dtype=torch.long),
            torch.tensor([n], dtype=torch.long),
            probs[None],
            self.uniforms.at(at)[None],
        )
        k = int(res.num_accepted[0])
        return res.accepted_nodes[0, : k + 1].tolist(), int(res.bonus[0])
