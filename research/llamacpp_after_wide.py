"""What one wider forward adds to the one-row forwards after it, on the llama.cpp engine's
own model (flash attention off, 2 threads, a unified KV cache of 33 sequences):

    python -m research.llamacpp_after_wide --quants q4_1,q4_0,f16 --rounds 60

Over 300 cached random tokens, each round runs one forward of W rows (W = 2, then 4, by
turns) and then 12 one-row forwards, each at the same position (its row dropped after it).
Prints, per quant and W, the wide forward over a settled one-row forward (the median of the
7th to 12th after a wide one), each k-th one-row forward after it over the settled one, and
their summed excess over the first 8: what `lookahead.learned_costs`' `switch_frac` learns in
the loop (its `SETTLE`).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from benchmarks.llamacpp import gguf_of

CONTEXT = 300
AFTER = 12
SETTLED = slice(6, 12)


def measure(quant: str, rounds: int) -> dict:
    from lookahead.llamacpp import LlamaCppModel

    m = LlamaCppModel(gguf_of(quant), 4096, 2, flash_attn="off")
    rng = np.random.default_rng(0)
    m.reset()
    m.prefill(rng.integers(0, m.n_vocab, size=CONTEXT).tolist(), [0])

    def forward(w: int) -> float:
        toks = rng.integers(0, m.n_vocab, size=w).tolist()
        t0 = time.perf_counter()
        m.decode(toks, range(CONTEXT, CONTEXT + w), [[0]] * w, [True] * w, copy=False)
        dt = time.perf_counter() - t0
        m.seq_rm(-1, CONTEXT, -1)
        return dt

    got: dict = {w: ([], [[] for _ in range(AFTER)]) for w in (2, 4)}
    for r in range(rounds + 2):  # the first two rounds warm up
        w = (2, 4)[r % 2]
        wide = forward(w)
        after = [forward(1) for _ in range(AFTER)]
        if r >= 2:
            got[w][0].append(wide)
            for k, x in enumerate(after):
                got[w][1][k].append(x)
    out = {}
    for w, (wide, after) in got.items():
        settled = statistics.median(x for v in after[SETTLED] for x in v)
        ratios = [statistics.median(v) / settled for v in after]
        out[w] = (
            statistics.median(wide) / settled,
            settled,
            ratios,
            sum(r - 1 for r in ratios[:8]),
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quants", default="q4_1,q4_0,f16")
    ap.add_argument("--rounds", type=int, default=60)
    args = ap.parse_args()
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {CONTEXT} cached tokens")
    for q in args.quants.split(","):
        for w, (wide, one, ratios, excess) in measure(q, args.rounds).items():
            print(f"{q} W={w}: {wide:.2f}x a settled one-row forward ({1e3 * one:.2f} ms); "
                  f"the one-row forwards after it: {' '.join(f'{x:.2f}' for x in ratios)}; "
                  f"excess over the first 8: {excess:+.2f} of a row")  # fmt: skip


if __name__ == "__main__":
    main()
