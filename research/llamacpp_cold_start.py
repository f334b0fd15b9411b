"""A cold start of the llama.cpp engine, in the loop: lookahead over the engine's plain decoding
from an empty cost folder, with one of two variants of a policy.

`--compare start-up` (the default): its start-up curve measured as `measure_costs` does
("shipped": each width timed right after the forward of the width before it) or each width
timed right after an untimed one-row forward ("after one", as the loop runs a verify: after
a one-row step; llama.cpp reuses its compute graph only for a batch of the shape before it).
`--compare after-eight`: "shipped" or each width timed after 8 untimed one-row forwards
("after eight": as a verify runs after a stretch of root-only steps, the one-row forwards
settled, `research/llamacpp_after_wide.py`).

`--compare settle`: `lookahead.learned_costs.SETTLE` as shipped ("settle 1": the one-row
forward right after a draft's is its excess) or 8 ("settle 8": the 8 after it are, as long
as the quantized files' excess lasts, `research/llamacpp_after_wide.py`).

    python -m research.llamacpp_cold_start --quant q4_1 --rounds 3 [--compare settle]

Per round, each variant in turn (the order alternating): a new model with flash attention off
in a fresh `$LOOKAHEAD_COST_DIR`, its start-up curve, then 6 Spec-Bench prompts of each of
mt_bench, qa and math_reasoning (128 new tokens, greedy, 2 threads), lookahead and plain
decoding (`plain_generate`, a context of one sequence) taking turns per prompt. Prints each
run's start-up curve and decode tok/s, its steps by rows (how many, the drafted tokens they
accepted, their median forward over plain decoding's median one-row forward), and the median
over rounds of lookahead over plain.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from benchmarks.llamacpp import gguf_of
from benchmarks.traces import DEFAULT_QUESTIONS, select_questions

CATEGORIES = ("mt_bench", "qa", "math_reasoning")
# Start-up curves timed after so many untimed one-row forwards (the one-row forwards after a
# wide one settle only after 6-8 on the quantized files: `llamacpp_after_wide.py`).
AFTER = {"after one": 1, "after eight": 8}


def run(variant: str, quant: str, questions: list) -> dict:
    import lookahead.learned_costs as learned_costs
    import lookahead.llamacpp.costs as costs
    from lookahead.llamacpp import LlamaCppGenerator, LlamaCppModel
    from lookahead.llamacpp.generator import plain_generate

    shipped, settle = costs.measure_costs, learned_costs.SETTLE
    if variant in AFTER:
        costs.measure_costs = lambda model: shipped(model, before=AFTER[variant])
    if variant.startswith("settle "):
        learned_costs.SETTLE = int(variant.split()[1])
    try:
        with tempfile.TemporaryDirectory() as folder:
            os.environ["LOOKAHEAD_COST_DIR"] = folder
            path = gguf_of(quant)
            gen = LlamaCppGenerator(LlamaCppModel(path, 4096, 2, flash_attn="off"))
            plain = LlamaCppModel(path, 4096, 2, n_seq_max=1, flash_attn="off")
            curve = gen.sizer.cost_model.curve(128)
            ids = [gen.model.encode(q["turns"][0], chat=True) for q in questions]
            gen.generate(ids[0], 8)
            steps = _record_steps(gen)
            plain_rows = _record_forwards(plain)
            la = [0, 0.0]
            pl = [0, 0.0]
            for k, x in enumerate(ids):
                for who in ("la", "plain") if k % 2 == 0 else ("plain", "la"):
                    if who == "la":
                        res = gen.generate(x, 128)
                        la[0] += len(res.ids) - 1
                        la[1] += res.stats.total_s - res.stats.prefill_s
                    else:
                        t: dict = {}
                        out = plain_generate(plain, x, 128, times=t)
                        pl[0] += len(out) - 1
                        pl[1] += t["total_s"] - t["prefill_s"]
    finally:
        costs.measure_costs, learned_costs.SETTLE = shipped, settle
    row = statistics.median(plain_rows)
    by_rows: dict = {}
    for rows, accepted, seconds in steps:
        by_rows.setdefault(rows, []).append((accepted, seconds))
    return {
        "curve": {w: float(curve[w] / curve[1]) for w in (2, 3, 4, 8)},
        "one_row_ms": 1e3 * float(curve[1]),
        "lookahead": la[0] / la[1],
        "plain": pl[0] / pl[1],
        # rows: (steps, mean tokens accepted, median forward over plain's median one-row one)
        "steps": {
            r: (len(v), statistics.fmean(a for a, _ in v), statistics.median(s for _, s in v) / row)
            for r, v in sorted(by_rows.items())
        },
    }


def _record_steps(gen) -> list:
    """(rows, drafted tokens accepted, forward seconds) of each step `gen` takes from now."""
    steps: list = []
    observe = gen.sizer.observe

    def recorded(step):
        steps.append((step.rows, len(step.path) - 1, step.forward_s))
        return observe(step)

    gen.sizer.observe = recorded
    return steps


def _record_forwards(model) -> list:
    """The seconds of each `decode` of `model` from now (plain decoding: one row each)."""
    seconds: list = []
    decode = model.decode

    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return decode(*a, **k)
        finally:
            seconds.append(time.perf_counter() - t)

    model.decode = timed
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quant", default="q4_1")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--compare", choices=("start-up", "after-eight", "settle"), default="start-up")
    args = ap.parse_args()
    qs = select_questions(str(DEFAULT_QUESTIONS), 6, categories=CATEGORIES)
    if args.compare == "settle":
        variants = ["settle 1", "settle 8"]
    elif args.compare == "after-eight":
        variants = ["shipped", "after eight"]
    else:
        variants = ["shipped", "after one"]
    ratios: dict = {v: [] for v in variants}
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.quant}, {len(qs)} prompts"
    )
    for r in range(args.rounds):
        for v in variants if r % 2 == 0 else variants[::-1]:
            got = run(v, args.quant, qs)
            ratios[v].append(got["lookahead"] / got["plain"])
            c = " ".join(f"W={w} {x:.2f}x" for w, x in got["curve"].items())
            print(f"round {r} {v:<9} start-up [{got['one_row_ms']:.2f} ms] {c}  lookahead "
                  f"{got['lookahead']:.1f} tok/s, plain {got['plain']:.1f}: "
                  f"{ratios[v][-1]:.3f}", flush=True)  # fmt: skip
            print("    steps by rows (steps, tokens accepted, forward / plain's one row): " + "  ".join(
                f"{r}: {n} {a:.2f} {c:.2f}x" for r, (n, a, c) in got["steps"].items()))  # fmt: skip
    for v in variants:
        print(f"{v:<9} lookahead / plain: median {statistics.median(ratios[v]):.3f} "
              f"({', '.join(f'{x:.3f}' for x in ratios[v])})")  # fmt: skip


if __name__ == "__main__":
    main()
