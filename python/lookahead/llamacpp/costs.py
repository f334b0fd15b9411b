"""What a llama.cpp forward of W rows costs here: the start-up curve of the cost-aware sizer.

`measure_costs` times forwards of 1..32 new tokens after a context of `context` tokens, as a
verify forward runs them, and returns a `lookahead.costs.CostModel`; `CostAwareSizer`
corrects it by every forward the engine then runs (`lookahead.learned_costs`). The curve is
kept on disk under `cost_key` (`lookahead.costs.load_or_measure`), and what was learnt is
written back, so a later load of the same file on the same machine starts from it.
"""

from __future__ import annotations

import functools
import hashlib
import time
from pathlib import Path

import numpy as np

from lookahead.costs import CostModel, cpu_name

WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
# A GGUF file is known by its size and a digest of its first bytes (its header and
# metadata, and the first tensors): a cheap read at every load, unlike hashing 100 MB.
HEAD_BYTES = 1 << 20


@functools.lru_cache(maxsize=16)
def _file_id(path: str, size: int, mtime_ns: int) -> str:
    with open(path, "rb") as f:
        head = f.read(HEAD_BYTES)
    return f"{size}-{hashlib.sha256(head).hexdigest()[:16]}"


def engine_key(model, threads: int) -> dict:
    """What any timing of `model` (a `LlamaCppModel`) with `threads` threads depends on: the
    GGUF file (its name, size and first bytes), the CPU (name, vector features) and the
    llama.cpp build (llama-cpp-python's version and what libllama says of the CPU)."""
    import llama_cpp

    from lookahead.models import cpu_features

    st = Path(model.path).stat()
    return {
        "engine": "llama.cpp",
        "model": model.path.name,
        "file": _file_id(str(model.path), st.st_size, st.st_mtime_ns),
        "threads": int(threads),
        "cpu": cpu_name(),
        "cpu_features": cpu_features(),
        "llama_cpp": f"{llama_cpp.__version__}: "
        + model.ll.llama_print_system_info().decode(errors="replace").strip(),
    }


def cost_key(model) -> dict:
    """What the verify-cost curve of `model`'s context depends on: `engine_key`, its flash
    attention and graph size."""
    return {**engine_key(model, model.threads), "flash_attn": model.flash_attn,
            "n_ubatch": model.n_ubatch}  # fmt: skip


def measure_costs(
    model, widths=WIDTHS, context: int = 128, reps: int = 5, before: int = 0
) -> CostModel:
    """Median seconds of a forward of each width (a chain in sequence 0 after `context`
    tokens, logits for every row) in `model` (a `LlamaCppModel`), widths interleaved round by
    round, each timed forward after `before` untimed one-row ones (the engine: none;
    `research/llamacpp_cold_start.py` tries others); leaves the KV cache empty."""
    widths = tuple(w for w in widths if w <= model.n_batch and context + w < model.n_ctx)
    rng = np.random.default_rng(0)
    model.reset()
    model.prefill(rng.integers(0, model.n_vocab, size=context).tolist(), [0])
    times: dict[int, list] = {w: [] for w in widths}
    for r in range(reps + 1):  # round 0 warms up
        for w in widths if r % 2 else widths[::-1]:
            for _ in range(before):
                model.decode([int(rng.integers(0, model.n_vocab))], [context], [[0]], [True])
                model.seq_rm(-1, context, -1)
            toks = rng.integers(0, model.n_vocab, size=w).tolist()
            t0 = time.perf_counter()
            model.decode(toks, range(context, context + w), [[0]] * w, [True] * w)
            dt = time.perf_counter() - t0
            model.seq_rm(-1, context, -1)
            if r:
                times[w].append(dt)
    model.reset()
    medians = {w: float(np.median(times[w])) for w in widths}
    return CostModel.from_rows(medians, key=cost_key(model))
