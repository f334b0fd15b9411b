"""Where our drafter falls short of the copy-oracle (research/README.md).

Replays the traces through our multi-branch drafter under the simulator's protocol and, at
each of our steps, compares our accepted tokens with the oracle's length at the same position
(capped at B and at the tokens left), split by two properties of the context:

- `k`: the longest suffix of the context (at most `max_depth - 1` tokens) that was seen
  before with a continuation, in any text seen so far (prompts and outputs);
- `fan-out`: how many distinct tokens followed that suffix.

The oracle may copy after any occurrence of any suffix, the last token alone included, so at
small `k` with a large fan-out it picks, in hindsight, one occurrence among many.

    python -m research.oracle_gap [TRACES] [BUDGET]
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from benchmarks.accept import accepted_length, oracle_tables
from benchmarks.harness import run_script
from benchmarks.peers.ours import LookaheadDrafter
from benchmarks.traces import read_traces

K_BINS = ((1, 1), (2, 2), (3, 5), (6, 10), (11, 11))
FAN_BINS = ((1, 1), (2, 3), (4, 10**9))


def _bin(bins, v):
    return next(i for i, (lo, hi) in enumerate(bins) if lo <= v <= hi)


def main(argv: list[str]) -> int:
    path = argv[0] if argv else "data/traces/specbench_smollm2.jsonl.gz"
    budget = int(argv[1]) if len(argv) > 1 else 16
    depth = 11  # the core's default max_depth (12) minus one: the longest matched suffix
    traces = read_traces(path)
    oracle = oracle_tables(traces, 32)
    drafter = LookaheadDrafter(multi_branch=True)
    follow: dict[tuple, set] = defaultdict(set)  # seen n-gram -> tokens seen after it

    def see(text, start):
        for j in range(max(start, 1), len(text)):
            for n in range(1, min(depth, j) + 1):
                follow[tuple(text[j - n : j])].add(text[j])

    # [category][axis][bin] -> [steps, ours, oracle]
    acc = defaultdict(lambda: defaultdict(lambda: [0, 0, 0]))
    for rid, (req, (orac, _)) in enumerate(zip(traces, oracle)):
        cat = req["category"]
        prompt = np.asarray(req["prompt_ids"], dtype=np.int32)
        output = np.asarray(req["output_ids"], dtype=np.int32)
        full = np.concatenate([prompt, output]).tolist()
        n_prompt = len(prompt)
        drafter.start_request(rid, prompt)
        see(full[:n_prompt], 0)
        drafter.extend(rid, prompt, output[:1])
        see(full[: n_prompt + 1], n_prompt)
        pos = 1
        while pos < len(output):
            ctx = full[: n_prompt + pos]
            tokens, parents = drafter.draft(rid, np.asarray(ctx), budget)
            cap = len(output) - pos - 1
            a = accepted_length(tokens, parents, output[pos : pos + min(budget, cap)])
            o = min(int(orac[pos]), budget, cap)
            k = next(
                (n for n in range(min(depth, len(ctx)), 0, -1) if tuple(ctx[-n:]) in follow), 0
            )
            fan = len(follow[tuple(ctx[-k:])]) if k else 0
            for axis, b in (
                ("k", _bin(K_BINS, k) if k else None),
                ("fan", _bin(FAN_BINS, fan) if k else None),
            ):
                for key in (cat, "overall"):
                    cell = acc[key][(axis, b)]
                    cell[0] += 1
                    cell[1] += a
                    cell[2] += o
            drafter.extend(rid, ctx, output[pos : pos + a + 1])
            see(full[: n_prompt + pos + a + 1], n_prompt + pos)
            pos += a + 1
        drafter.finish_request(rid)

    def label(axis, b):
        if b is None:
            return "no match"
        lo, hi = (K_BINS if axis == "k" else FAN_BINS)[b]
        name = "k" if axis == "k" else "fan-out"
        return (
            f"{name} {lo}" if lo == hi else f"{name} {lo}+" if hi > 10**6 else f"{name} {lo}-{hi}"
        )

    print(f"B = {budget}: tokens the oracle accepts at our steps and we do not (share of the gap)")
    for key, cells in acc.items():
        steps = sum(c[0] for (ax, _), c in cells.items() if ax == "k")
        ours = sum(c[1] for (ax, _), c in cells.items() if ax == "k")
        orac = sum(c[2] for (ax, _), c in cells.items() if ax == "k")
        gap = orac - ours
        print(f"{key}: {steps} steps, ours {ours}, oracle {orac}, gap {gap}")
        for axis in ("k", "fan"):
            parts = sorted(
                (b for ax, b in cells if ax == axis and cells[(ax, b)][0]),
                key=lambda b: -1 if b is None else b,
            )
            print(
                "   "
                + "  ".join(
                    f"{label(axis, b)}: {cells[(axis, b)][2] - cells[(axis, b)][1]}"
                    f" ({(cells[(axis, b)][2] - cells[(axis, b)][1]) / max(gap, 1):.0%})"
                    for b in parts
                )
            )
    return 0


if __name__ == "__main__":
    run_script(main, __doc__)
