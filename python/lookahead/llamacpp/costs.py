"""What a llama.cpp forward of W rows costs here: the start-up curve of the cost-aware sizer.

`measure_costs` times forwards of 1..32 new tokens after a context of `context` tokens, as a
verify forward runs them, and returns a `lookahead.costs.CostModel`; `CostAwareSizer`
corrects it by every forward the engine then runs (`lookahead.learned_costs`).
"""

from __future__ import annotations

import time

import numpy as np

from lookahead.costs import CostModel
from lookahead.llamacpp.model import LlamaCppModel

WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


def measure_costs(
    model: LlamaCppModel, widths=WIDTHS, context: int = 128, reps: int = 5
) -> CostModel:
    """Median seconds of a forward of each width (a chain in sequence 0 after `context`
    tokens, logits for every row), widths interleaved round by round; leaves the KV cache
    empty."""
    widths = tuple(w for w in widths if w <= model.n_batch and context + w < model.n_ctx)
    rng = np.random.default_rng(0)
    model.reset()
    model.prefill(rng.integers(0, model.n_vocab, size=context).tolist(), [0])
    times: dict[int, list] = {w: [] for w in widths}
    for r in range(reps + 1):  # round 0 warms up
        for w in widths if r % 2 else widths[::-1]:
            toks = rng.integers(0, model.n_vocab, size=w).tolist()
            t0 = time.perf_counter()
            model.decode(toks, range(context, context + w), [[0]] * w, [True] * w)
            dt = time.perf_counter() - t0
            model.seq_rm(-1, context, -1)
            if r:
                times[w].append(dt)
    model.reset()
    key = {"engine": "llama.cpp", "model": model.path.name, "threads": model.threads}
    return CostModel.from_rows({w: float(np.median(times[w])) for w in widths}, key=key)
