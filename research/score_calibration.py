"""Are our draft scores calibrated? (research/README.md)

Replays the traces through our multi-branch drafter at B = 16 (the simulator's steps) and,
for every drafted node whose parent was accepted, compares its conditional score (its score
over its parent's: the drafter's estimate that it is accepted given its parent was) with how
often it was, binned by that score and by the node's depth in the draft.

    python -m research.score_calibration [TRACES]
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from lookahead import LookaheadCache

from benchmarks.harness import run_script
from benchmarks.traces import DEFAULT_OUT, read_traces

BUDGET = 16


def main(argv: list[str]) -> int:
    traces = read_traces(argv[0] if argv else DEFAULT_OUT)
    cache = LookaheadCache(background_indexing=False)
    # (score tenth, depth up to 4) -> [nodes, accepted, summed conditional score]
    stat: dict[tuple[int, int], list[float]] = defaultdict(lambda: [0, 0, 0.0])
    for rid, req in enumerate(traces):
        output = np.asarray(req["output_ids"])
        cache.start_request(rid, np.asarray(req["prompt_ids"]))
        cache.extend(rid, output[:1])
        pos = 1
        while pos < len(output):
            d = cache.draft(rid, BUDGET, True)
            n = d.num_nodes
            toks, pars, sc = d.tokens[:n].tolist(), d.parents[:n].tolist(), d.scores[:n].tolist()
            truth = output[pos : len(output) - 1].tolist()  # the bonus token must exist
            depth, ok = [0] * n, [True] + [False] * (n - 1)
            for i in range(1, n):
                p = pars[i]
                depth[i] = depth[p] + 1
                ok[i] = ok[p] and depth[i] <= len(truth) and truth[depth[i] - 1] == toks[i]
                if ok[p] and depth[i] <= len(truth):
                    cond = sc[i] / (sc[p] if p else 1.0)
                    s = stat[(min(int(cond * 10), 9), min(depth[i], 4))]
                    s[0] += 1
                    s[1] += ok[i]
                    s[2] += cond
            a = max(depth[i] for i in range(n) if ok[i])
            cache.extend(rid, output[pos : pos + a + 1])
            pos += a + 1
        cache.finish_request(rid)
    print(f"B = {BUDGET}: nodes whose parent was accepted, by conditional score and depth")
    print("depth  score      nodes  predicted  accepted")
    for dep in range(1, 5):
        for b in range(10):
            nodes, acc, total = stat.get((b, dep), (0, 0, 0.0))
            if nodes >= 30:
                label = f"{dep}" if dep < 4 else "4+"
                print(
                    f"{label:5s}  {b / 10:.1f}-{(b + 1) / 10:.1f}  {nodes:7d}  "
                    f"{total / nodes:9.3f}  {acc / nodes:8.3f}"
                )
    return 0


if __name__ == "__main__":
    run_script(main, __doc__)
