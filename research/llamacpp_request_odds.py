"""Would a per-request correction of the acceptance chances make the llama.cpp engine faster?

    python -m research.llamacpp_request_odds [--quant q4_0] [--flash-attn on] [--per-category 3]

The sizer reads each node's chance from one table (`lookahead.calibration`) that every request
teaches, and on Spec-Bench its expected accepted lengths were off by 0.85-1.18x per category
(`llamacpp_sizer_check.py`). The correction tried here: each request fits a factor on the
table's odds to its own outcomes (a logistic regression with the table's log-odds as offset,
one Newton step per verify step, from a prior of 1 worth `PRIOR` of Fisher information, held
within exp(+-`MAX_LOG_ODDS`), reset between requests), and the sizer cuts by the corrected
chances. Three generators on one model, run back to back per prompt in a rotated order: `odds`
(trees, corrected), `table` (trees, the table alone: today's engine), plain in-process
decoding. Then, for `odds`, every node outcome the sizer learnt from (children of accepted
nodes, greedy), scored by the table's chance and by the corrected one: log loss, and expected
against followed, per category. Greedy, 128 new tokens.
"""

from __future__ import annotations

import collections
import math
import statistics

import numpy as np

PRIOR = 4.0
MAX_LOG_ODDS = 2.0


def scaled(c: float, f: float) -> float:
    """Chance `c` with its odds times `f`."""
    return c * f / (1.0 - c + c * f)


class RequestOdds:
    """One request's factor on the table's odds, fit online (see the module's docstring)."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.log_odds, self.odds, self.info = 0.0, 1.0, PRIOR

    def observe(self, chances, followed) -> None:
        grad = info = 0.0
        for c, y in zip(chances, followed):
            q = scaled(c, self.odds)
            grad += y - q
            info += q * (1.0 - q)
        self.info += info
        self.log_odds = min(max(self.log_odds + grad / self.info, -MAX_LOG_ODDS), MAX_LOG_ODDS)
        self.odds = math.exp(self.log_odds)


def expected_under(table, cal, scores, parents, matched) -> list:
    """`AcceptanceCalibration.expected` (the core's rule) read off `table` instead of the
    calibration's own: a node's chance times its parent's, capped by what its parent has left
    once its earlier siblings took theirs; `[k - 1]` for the first k nodes."""
    sc, par = [float(x) for x in scores], [int(p) for p in parents]
    cond = [s / (sc[p - 1] if p else 1.0) if (sc[p - 1] if p else 1.0) > 0 else 0.0
            for s, p in zip(sc, par)]  # fmt: skip
    chances = table[cal.cells(cond, matched)].tolist()
    left, chance, out, total = [1.0] * (len(sc) + 1), [1.0] * (len(sc) + 1), [], 0.0
    for i, p in enumerate(par):
        c = max(min(chances[i] * chance[p], left[p]), 0.0)
        left[p] -= c
        chance[i + 1] = left[i + 1] = c
        total += c
        out.append(total)
    return out


def correct(gen, log: list, where: dict) -> None:
    """Makes `gen`'s greedy sizer cut by the request's corrected chances (the cut's rule in
    Python over the corrected table: the core's cut reads its own), and logs (category, table
    chance, corrected chance, followed) for every node outcome it learns."""
    from lookahead.calibration import outcomes
    from lookahead.sizing import choose_nodes, passes_min_score

    sizer, odds = gen.sizer, RequestOdds()
    cal = sizer.calibration[False]

    def cut(scores, parents, matched, context_len, last, sampled):
        if sampled or odds.odds == 1.0:
            return sizer_cut(scores, parents, matched, context_len, last, sampled)
        curve = sizer.learned.curve(context_len)
        e = expected_under(scaled(cal.table(), odds.odds), cal, scores, parents, matched)
        k = choose_nodes(
            np.array(e), curve, sizer.host_s[False], sizer.learned.switch_frac * curve[1]
        )
        return passes_min_score(scores, k, sizer.min_score)

    def observe(step):
        if step.drafted is not None and not step.sampled:
            tokens, parents, scores, matched = step.drafted
            nodes, followed = outcomes(tokens, parents, step.path, step.emitted)
            sc, par = scores.tolist(), parents.tolist()
            cond = [sc[j] / sc[par[j]] if sc[par[j]] > 0 else 0.0 for j in nodes]
            chances = cal.predict(cond, [int(matched[j]) for j in nodes]).tolist()
            for c, y in zip(chances, followed):
                log.append((where["category"], c, scaled(c, odds.odds), y))
            odds.observe(chances, followed)
        return sizer_observe(step)

    def finish():
        odds.reset()
        sizer_finish()

    sizer_cut, sizer_observe, sizer_finish = sizer.cut, sizer.observe, sizer.finish
    sizer.cut, sizer.observe, sizer.finish = cut, observe, finish


def main(argv=None) -> int:
    from lookahead.llamacpp import LlamaCppGenerator

    from research.llamacpp_sizer_check import rotated, run, setup

    args, qs, m, pm, costs = setup("python -m research.llamacpp_request_odds", argv)
    gens = {k: LlamaCppGenerator(m, cost_model=costs) for k in ("odds", "table")}
    log: list = []
    where = {"category": "(warm-up)"}
    correct(gens["odds"], log, where)
    ids = [m.encode(q["turns"][0], chat=True) for q in qs]
    for g in gens.values():
        g.generate(m.encode("Say hello.", chat=True), 8)
    methods = [*gens, "plain"]
    tps = {k: [] for k in methods}
    for i, (q, x) in enumerate(zip(qs, ids)):
        where["category"] = q["category"]
        for k in rotated(methods, i):
            toks, secs, _, _ = run(pm if k == "plain" else gens[k], x)
            tps[k].append((len(toks) - 1) / secs)
        print(q["category"], "  ".join(f"{k} {tps[k][-1]:.1f}" for k in methods), flush=True)
    print(f"# {args.quant}, flash attention {args.flash_attn}, {len(qs)} prompts")
    for k in methods:
        ratio = statistics.median(a / b for a, b in zip(tps[k], tps["plain"]))
        print(f"{k:6s} {statistics.fmean(tps[k]):7.1f} tok/s  {ratio:.3f}x median vs plain")
    ratios = [a / b for a, b in zip(tps["odds"], tps["table"])]
    print(f"odds / table: median per-prompt ratio {statistics.median(ratios):.3f}, "
          f"{sum(r > 1 for r in ratios)}/{len(ratios)} prompts faster")  # fmt: skip
    print(
        "node outcomes the odds sizer learnt from: log loss and expected / followed, table | odds"
    )
    by = collections.defaultdict(list)
    for row in log:
        if row[0] != "(warm-up)":
            by[row[0]].append(row)
            by["(all)"].append(row)
    for c, rs in sorted(by.items()):
        n, y = len(rs), sum(r[3] for r in rs)
        cols = [f"{_loss(rs, i):.4f}  {sum(r[i] for r in rs):7.1f} / {y:.0f}" for i in (1, 2)]
        print(f"  {c:15s} {n:5d} nodes  {cols[0]}  |  {cols[1]}")
    return 0


def _loss(rows, i: int) -> float:
    """Mean log loss of chance column `i` against the outcomes."""
    eps = 1e-6
    return -statistics.fmean(
        math.log(min(max(r[i], eps), 1 - eps))
        if r[3]
        else math.log(1 - min(max(r[i], eps), 1 - eps))
        for r in rows
    )


if __name__ == "__main__":
    raise SystemExit(main())
