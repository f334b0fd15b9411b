"""Where are the sizer's chances off, among the nodes it verifies?

    python -m research.llamacpp_verified_calibration [--quant q4_0] [--per-category 3]

The calibration table (`lookahead.calibration`) learns from every child of an accepted node,
verified or cut, and over those it is right per category within a few percent
(`llamacpp_request_odds.py`); yet the expected accepted length of the prefixes the sizer
verifies was off by 0.81-1.18x per category (`llamacpp_sizer_check.py`). This runs the engine
(cost-aware trees, flash attention on, greedy, 128 new tokens) on Spec-Bench and, for the
verified nodes whose parent the target accepted, adds up the table's chance and whether the
target followed, by category and by the node's depth in the tree (1: a child of the root, the
step's bonus token) and match group (`MATCH_EDGES`: g1 = 1 token, g2 = 2-3, g3 = 4-6, g4 =
7+).
"""

from __future__ import annotations

import argparse
import collections

from benchmarks.llamacpp import gguf_of
from benchmarks.traces import DEFAULT_QUESTIONS, select_questions


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m research.llamacpp_verified_calibration")
    p.add_argument("--quant", default="q4_0")
    p.add_argument("--per-category", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    from lookahead.calibration import conditional, outcomes
    from lookahead.llamacpp import LlamaCppGenerator, LlamaCppModel

    qs = select_questions(str(DEFAULT_QUESTIONS), args.per_category)
    m = LlamaCppModel(gguf_of(args.quant), 4096, args.threads, flash_attn="on")
    gen = LlamaCppGenerator(m)
    cal = gen.sizer.calibration[False]
    where = {"category": "(warm-up)"}
    sums: dict = collections.defaultdict(lambda: [0, 0.0, 0.0])
    observe = gen.sizer.observe

    def watched(step):
        if step.drafted is not None and step.rows > 1 and not step.sampled:
            tokens, parents, scores, matched = step.drafted
            nodes, followed = outcomes(tokens, parents, step.path, step.emitted, step.rows)
            par = parents.tolist()
            cond = conditional(scores[1:], parents[1:])  # the root's score is 1
            got = cal.predict(cond[[j - 1 for j in nodes]], matched[nodes])
            for j, c, y in zip(nodes, got.tolist(), followed):
                depth, k = 0, j
                while k:
                    k, depth = par[k], depth + 1
                group = int(cal.cells([0.0], [int(matched[j])])[0][0])  # its match group
                for cat in (where["category"], "(all)"):
                    for key in ("all", f"depth {min(depth, 4)}", f"g{group}"):
                        s = sums[cat, key]
                        s[0], s[1], s[2] = s[0] + 1, s[1] + c, s[2] + y
        return observe(step)

    gen.sizer.observe = watched
    gen.generate(m.encode("Say hello.", chat=True), 8)
    for q in qs:
        where["category"] = q["category"]
        gen.generate(m.encode(q["turns"][0], chat=True), 128)
    print(f"# {args.quant}, flash attention on, {len(qs)} prompts: verified nodes whose "
          "parent was accepted: nodes, the table's chances summed, followed, followed / "
          "chances")  # fmt: skip
    for (cat, key), (n, c, y) in sorted(sums.items()):
        if cat != "(warm-up)" and n >= 15:
            print(f"{cat:15s} {key:8s} {n:5d} {c:7.1f} {y:5.0f}  {y / max(c, 1e-9):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
