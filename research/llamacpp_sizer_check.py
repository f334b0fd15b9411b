"""Is the llama.cpp engine's cost-aware sizing right on Spec-Bench, and do trees beat chains?

    python -m research.llamacpp_sizer_check [--quant q4_0] [--flash-attn on] [--per-category 3]

Three generators on one model, run back to back per prompt in an order rotated from prompt to
prompt (the VM's drift hits all alike): lookahead drafting trees (the default), lookahead
drafting one chain (`multi_branch=False`), both with the same start-up cost curve and each
with a cache of its own, and plain in-process decoding. Per method: mean decode tok/s, median
ratio to plain, tokens per step, outputs equal to plain's. Then, for the tree generator, what
its sizer expected its verified drafts to accept (the calibrated `expected` of the prefix it
chose) against what they accepted, per Spec-Bench category: a sizer that expects more than it
gets drafts rows that do not pay. Greedy, 128 new tokens, the default model's GGUF files
(`benchmarks.llamacpp.gguf_of`).
"""

from __future__ import annotations

import argparse
import collections
import statistics

from benchmarks.llamacpp import gguf_of
from benchmarks.traces import DEFAULT_QUESTIONS, select_questions


def setup(prog: str, argv=None) -> tuple:
    """(args, Spec-Bench questions, the engine's model, a one-sequence model for plain
    decoding, their start-up cost curve) from this script's arguments: the A/B scripts'
    common start."""
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--quant", default="q4_0")
    p.add_argument("--flash-attn", default="on", choices=("off", "on", "auto"))
    p.add_argument("--per-category", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    from lookahead.llamacpp import LlamaCppGenerator, LlamaCppModel

    qs = select_questions(str(DEFAULT_QUESTIONS), args.per_category)
    path = gguf_of(args.quant)
    m = LlamaCppModel(path, 4096, args.threads, flash_attn=args.flash_attn)
    pm = LlamaCppModel(path, 4096, args.threads, n_seq_max=1, flash_attn=args.flash_attn)
    return args, qs, m, pm, LlamaCppGenerator(m).cost_model


def rotated(methods: list, i: int) -> list:
    """`methods` in the order prompt `i` runs them: turned by one per prompt, so that the
    VM's drift hits all alike."""
    return methods[i % len(methods) :] + methods[: i % len(methods)]


def run(runner, ids: list, n: int = 128) -> tuple:
    """(tokens, decode seconds, whole seconds, stats) of one greedy request for `n` new tokens
    on `runner`: a `LlamaCppGenerator` (stats: its `GenerationStats`) or a one-sequence
    `LlamaCppModel`, decoding plainly (stats: None)."""
    from lookahead.llamacpp import LlamaCppModel, plain_generate

    if isinstance(runner, LlamaCppModel):
        t: dict = {}
        toks = plain_generate(runner, ids, n, times=t)
        return toks, t["total_s"] - t["prefill_s"], t["total_s"], None
    r = runner.generate(ids, n)
    return r.ids, r.stats.total_s - r.stats.prefill_s, r.stats.total_s, r.stats


def main(argv=None) -> int:
    from lookahead.llamacpp import LlamaCppGenerator

    args, qs, m, pm, costs = setup("python -m research.llamacpp_sizer_check", argv)
    gens = {
        "tree": LlamaCppGenerator(m, cost_model=costs),
        "chain": LlamaCppGenerator(m, cost_model=costs, multi_branch=False),
    }
    expected = _watch(gens["tree"].sizer)
    ids = [m.encode(q["turns"][0], chat=True) for q in qs]
    for g in gens.values():
        g.generate(m.encode("Say hello.", chat=True), 8)
    methods = [*gens, "plain"]
    got = {k: [] for k in methods}
    for i, (q, x) in enumerate(zip(qs, ids)):
        row = {}
        expected["category"] = q["category"]
        for k in rotated(methods, i):
            toks, secs, _, st = run(pm if k == "plain" else gens[k], x)
            row[k] = (toks, secs, len(toks) if st is None else st.steps)
        for k, (toks, secs, steps) in row.items():
            got[k].append(((len(toks) - 1) / secs, len(toks) / steps, toks == row["plain"][0]))
        print(q["category"], "  ".join(f"{k} {got[k][-1][0]:.1f}" for k in methods), flush=True)
    print(f"# {args.quant}, flash attention {args.flash_attn}, {len(qs)} prompts")
    for k in methods:
        rs = got[k]
        ratio = statistics.median(r[0] / p[0] for r, p in zip(rs, got["plain"]))
        print(f"{k:6s} {statistics.fmean(r[0] for r in rs):7.1f} tok/s  {ratio:.3f}x median vs "
              f"plain  {sum(r[1] for r in rs) / len(rs):.2f} tok/step  identical "
              f"{sum(r[2] for r in rs)}/{len(rs)}")  # fmt: skip
    print("tree sizer, drafting steps: expected accepted / accepted, by category")
    for c, (steps, exp, acc) in sorted(expected["by"].items()):
        print(f"  {c:15s} {steps:4d} steps  {exp:7.1f} / {acc:5.0f}  ({acc / max(exp, 1e-9):.2f})")
    return 0


def _watch(sizer) -> dict:
    """Wraps `sizer`'s cut and observe to add up, per category, the expected accepted length
    of each verified draft (as the sizer chose it) and what it accepted."""
    state = {
        "category": "(warm-up)",
        "exp": 0.0,
        "by": collections.defaultdict(lambda: [0, 0.0, 0]),
    }
    cut, observe = sizer.cut, sizer.observe

    def watched_cut(scores, parents, matched, context_len, last, sampled):
        k = cut(scores, parents, matched, context_len, last, sampled)
        e = sizer.calibration[sampled].expected(scores, parents, matched)
        state["exp"] = float(e[k - 1]) if k > 0 else 0.0
        return k

    def watched_observe(step):
        if step.rows > 1:
            b = state["by"][state["category"]]
            b[0] += 1
            b[1] += state["exp"]
            b[2] += len(step.path) - 1
        state["exp"] = 0.0
        return observe(step)

    sizer.cut, sizer.observe = watched_cut, watched_observe
    return state


if __name__ == "__main__":
    raise SystemExit(main())
