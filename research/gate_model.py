"""Model the engine's CPU cost gate (`min_draft_score`) on the recorded traces.

Replays the traces through `LookaheadCache` as the engine uses it (one cache across
requests, tree drafts of `budget` nodes) and prices each step: a plain one-row step costs 1,
a step that verifies a draft costs COST (on this CPU a 2-17-row fp32 forward costs ~1.85x a
one-row one, BENCHMARKS.md, "End to end: the demo"). Every draft's accepted length is known from the trace, so
each gate rule is scored without running the model: modelled speed-up = tokens / cost.

    python -m research.gate_model data/traces/specbench_smollm2.jsonl.gz 8 1.85

Rules: `never` (plain decoding), `always`, `sum>=X` (the engine's rule: draft when the sum
of the draft's path scores reaches X) and `cal>=X` (the same sum times this request's
observed accepted / predicted ratio so far, with a prior of 2 tokens each).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from lookahead import LookaheadCache

from benchmarks.harness import run_script
from benchmarks.peers import accepted_length
from benchmarks.traces import read_traces


def rules() -> dict:
    """Gate rules: (draft scores, [accepted, predicted] so far in this request) -> verify?"""
    out = {"never": lambda s, seen: False, "always": lambda s, seen: True}
    for th in (0.3, 0.5, 0.7, 0.85, 1.0, 1.3):
        out[f"sum>={th}"] = lambda s, seen, th=th: s[1:].sum() >= th
    for th in (0.5, 0.85, 1.2):
        out[f"cal>={th}"] = lambda s, seen, th=th: (
            s[1:].sum() * (seen[0] + 2.0) / (seen[1] + 2.0) >= th
        )
    return out


def model(traces, budget: int, cost: float, rule) -> dict:
    """Per category: [tokens, cost] of replaying `traces` under `rule`."""
    cache = LookaheadCache(background_indexing=False)
    totals = defaultdict(lambda: [0.0, 0.0])
    for rid, r in enumerate(traces):
        out = r["output_ids"]
        cache.start_request(rid, r["prompt_ids"])
        cache.extend(rid, out[:1])
        pos, seen = 1, [0.0, 0.0]
        tokens = spent = 0.0
        while pos < len(out):
            d = cache.draft(rid, budget, True)
            drafted = len(d.tokens) > 1
            cap = len(out) - pos - 1
            a = accepted_length(
                d.tokens[1:].tolist(),
                (d.parents[1:] - 1).tolist(),
                np.asarray(out[pos : pos + min(budget, cap)]),
            )
            use = drafted and rule(d.scores, seen)
            if drafted:
                seen[0] += a
                seen[1] += float(d.scores[1:].sum())
            step = min(a + 1 if use else 1, len(out) - pos)
            spent += cost if use else 1.0
            cache.extend(rid, out[pos : pos + step])
            pos += step
            tokens += step
        cache.finish_request(rid)
        for cat in (r["category"], "overall"):
            totals[cat][0] += tokens
            totals[cat][1] += spent
    return totals


def main(argv) -> None:
    """Usage: gate_model.py TRACES BUDGET COST."""
    traces = read_traces(argv[0])
    budget, cost = int(argv[1]), float(argv[2])
    results = {name: model(traces, budget, cost, rule) for name, rule in rules().items()}
    cats = list(results["never"])
    print(f"B = {budget}, draft step cost {cost}: modelled speed-up over plain (tokens / cost)")
    print(f"{'rule':12s}" + "".join(f"{c[:11]:>12s}" for c in cats))
    for name, res in results.items():
        print(f"{name:12s}" + "".join(f"{res[c][0] / res[c][1]:12.3f}" for c in cats))


if __name__ == "__main__":
    run_script(main, __doc__)
