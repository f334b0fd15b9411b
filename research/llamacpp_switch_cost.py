"""What does a draft cost the forward after it, and does weighing that make the engine faster?

    python -m research.llamacpp_switch_cost [--quant q4_1] [--flash-attn on] [--per-category 3]

llama.cpp reuses its last compute graph when a batch has the last one's shape (rows, outputs,
sequences); a forward of another shape builds and allocates a new graph first. Plain decoding
always reuses; a drafted step (W rows) is followed by a one-row forward that cannot, so part of
a draft's cost lands on the next forward, where the sizer's one-row median hid it.

1. Forwards (one context, the verified context in sequence 0 after 700 random tokens): a
   one-row forward after a one-row forward against one right after a 4-row forward, and a
   4-row forward after a one-row one against one after another 4-row one, interleaved, 80
   rounds, medians.
2. In the loop: lookahead weighing that excess (`LearnedCosts(switches=True)`, what the
   engine does since this script) against lookahead without it (the one-row median takes every
   one-row forward, no switch cost), and plain in-process decoding, per prompt in an order
   rotated from prompt to prompt, on Spec-Bench (greedy, 128 new tokens, chat template).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from research.llamacpp_sizer_check import rotated, run, setup


def forward_costs(m, context: int = 700, rounds: int = 80) -> dict:
    """Median ms of a one-row / 4-row forward after a forward of 1 or 4 rows in `m`."""
    rng = np.random.default_rng(0)
    m.reset()
    m.prefill(rng.integers(0, m.n_vocab, size=context).tolist(), [0])

    def forward(w: int) -> float:
        toks = rng.integers(0, 1000, size=w).tolist()
        t0 = time.perf_counter()
        m.decode(toks, range(context, context + w), [[0]] * w, [True] * w, copy=False)
        dt = time.perf_counter() - t0
        m.seq_rm(-1, context, -1)
        return dt

    got: dict = {k: [] for k in ("1 after 1", "1 after 4", "4 after 1", "4 after 4")}
    for _ in range(rounds):
        forward(1)
        got["1 after 1"].append(forward(1))
        forward(4)
        got["1 after 4"].append(forward(1))
        got["4 after 1"].append(forward(4))
        got["4 after 4"].append(forward(4))
    m.reset()
    return {k: 1e3 * statistics.median(v[5:]) for k, v in got.items()}


def main(argv=None) -> int:
    from lookahead.llamacpp import LlamaCppGenerator

    args, qs, m, pm, costs = setup("python -m research.llamacpp_switch_cost", argv)
    f = forward_costs(m)
    print(f"# {args.quant}, flash attention {args.flash_attn}: forward ms after 700 tokens, "
          + ", ".join(f"{k} {v:.2f}" for k, v in f.items())
          + f"; a draft adds {f['1 after 4'] - f['1 after 1']:+.2f} ms to the one-row forward "
          "after it", flush=True)  # fmt: skip
    gens = {k: LlamaCppGenerator(m, cost_model=costs) for k in ("switch", "no switch")}
    gens["no switch"].sizer.learned.switches = False
    ids = [m.encode(q["turns"][0], chat=True) for q in qs]
    for g in gens.values():
        g.generate(m.encode("Say hello.", chat=True), 8)
    methods = [*gens, "plain"]
    got: dict = {k: [] for k in methods}
    for i, (q, x) in enumerate(zip(qs, ids)):
        for k in rotated(methods, i):
            toks, secs, _, st = run(pm if k == "plain" else gens[k], x)
            got[k].append(((len(toks) - 1) / secs, len(toks) / (st.steps if st else len(toks))))
        print(q["category"], "  ".join(f"{k} {got[k][-1][0]:.1f}" for k in methods), flush=True)
    print(f"# {len(qs)} prompts; switch cost learnt: "
          f"{gens['switch'].sizer.learned.switch_frac:.3f} of a one-row forward")  # fmt: skip
    for k in methods:
        rs = got[k]
        vs = [r[0] / p[0] for r, p in zip(rs, got["plain"])]
        print(f"{k:10s} {statistics.fmean(r[0] for r in rs):7.1f} tok/s  "
              f"{statistics.median(vs):.3f}x median vs plain  "
              f"{statistics.fmean(r[1] for r in rs):.2f} tok/step")  # fmt: skip
    a, b = got["switch"], got["no switch"]
    print(f"switch / no switch, per prompt: median {statistics.median(x[0] / y[0] for x, y in zip(a, b)):.3f}, "
          f"mean tok/s ratio {statistics.fmean(x[0] for x in a) / statistics.fmean(y[0] for y in b):.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    from benchmarks.harness import run_script

    run_script(main, __doc__)
