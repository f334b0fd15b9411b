"""What does a verify forward pay for every row's logits, on llama.cpp on this CPU?

    make llama-server      # llama-quantize, for the Q4_0 / F16 files
    python -m research.llamacpp_logits_rows [--quants q4_0,q4_1] [--rounds 16]

`llama-bench -p W -n 0` times a forward of W new rows that computes the last row's logits
only; a tree verify needs every row's. This times the engine's own forward
(`LlamaCppModel.decode`, 2 threads, a chain of W random tokens after 128 cached ones) both
ways, in shuffled order over `--rounds` rounds (the first dropped), and prints the medians
and what each row's logits add. The tied lm head (`token_embd`, 49152 x 576) is stored in
Q8_0 in every file here, about a fifth of the 135M model's weights, so its rows are a
visible share of a wide forward's cost.
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np

from benchmarks.harness import run_script

WIDTHS = (1, 2, 4, 8, 16)
CONTEXT = 128


def time_rows(m, rounds: int) -> dict:
    """{(W, every_row): [seconds]} of W-row forwards after CONTEXT tokens."""
    rng = np.random.default_rng(0)
    m.reset()
    m.prefill(rng.integers(0, m.n_vocab, size=CONTEXT).tolist(), [0])
    combos = [(w, a) for w in WIDTHS for a in (False, True)]
    times: dict = {c: [] for c in combos}
    for r in range(rounds):
        random.Random(r).shuffle(combos)
        for w, every in combos:
            toks = rng.integers(0, m.n_vocab, size=w).tolist()
            want = [True] * w if every else [False] * (w - 1) + [True]
            t0 = time.perf_counter()
            m.decode(toks, range(CONTEXT, CONTEXT + w), [[0]] * w, want, copy=False)
            dt = time.perf_counter() - t0
            m.seq_rm(-1, CONTEXT, -1)
            if r:  # the first round warms the buffers
                times[(w, every)].append(dt)
    return times


def main(argv: list[str]) -> int:
    from lookahead.llamacpp import LlamaCppModel

    from benchmarks.llamacpp import gguf_of

    ap = argparse.ArgumentParser(prog="python -m research.llamacpp_logits_rows")
    ap.add_argument("--quants", default="q4_0,q4_1")
    ap.add_argument("--rounds", type=int, default=16)
    args = ap.parse_args(argv)
    for quant in args.quants.split(","):
        # flash attention as llama.cpp's default gave it when this was measured (before 5bf55b5)
        m = LlamaCppModel(gguf_of(quant), n_threads=2, n_seq_max=16, flash_attn="auto")
        med = {k: 1e3 * float(np.median(v)) for k, v in time_rows(m, args.rounds).items()}
        one = med[(1, True)]
        print(f"{quant.upper()}: one row {one:.2f} ms")
        print("   W  last row only  every row   (x one row)   every row's logits add per row")
        for w in WIDTHS:
            last, every = med[(w, False)], med[(w, True)]
            extra = (every - last) / max(w - 1, 1) if w > 1 else 0.0
            print(f"  {w:2d}  {last:8.2f} ms  {every:8.2f} ms  ({last / one:.2f}x / {every / one:.2f}x)"
                  f"  {extra:.2f} ms")  # fmt: skip
        del m
    return 0


if __name__ == "__main__":
    run_script(main, __doc__)
