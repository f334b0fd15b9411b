"""Does the length of a draft node's match tell its acceptance apart? (research/README.md)

Replays the recorded traces (the default model's greedy Spec-Bench outputs) through one
`LookaheadCache`, drafting 32 nodes at every step, and for every node whose parent the target
accepted (so whether the target follows the node is known) counts how often it does, by the
node's conditional score (its path score over its parent's) and by its `Draft.matched` (the
length of the n-gram it continues). Then models the engine's speed under llama.cpp's cost
curves (the learnt ones in BENCHMARKS.md section 7 as of 5d74331, 2026-12-04) with the shipped
calibration, once with `matched` and once with it zeroed (the same model without the match
length).

    python -m research.match_length [TRACES]
"""

from __future__ import annotations

import sys
from collections import defaultdict

import numpy as np
from lookahead import LookaheadCache
from lookahead.calibration import MATCH_EDGES, AcceptanceCalibration, conditional, learn
from lookahead.sizing import choose_nodes

from benchmarks.cost_policy import _path
from benchmarks.peers import accepted_length
from benchmarks.traces import DEFAULT_OUT, read_traces

BUDGET = 32
BANDS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.01)
GROUPS = ("0", "1", "2-3", "4-6", "7+")
# Forward ms by rows, llama.cpp on 2 threads of a 2 vCPU AMD EPYC (BENCHMARKS.md section 7 as
# of 5d74331: the engine's learnt curves); a step also pays the engine's ~0.45 ms of host time.
CURVES = {
    "Q4_1": {1: 10.0, 2: 21.7, 3: 26.2, 4: 34.3, 8: 52.4, 16: 94.6},
    "Q4_0": {1: 7.7, 2: 12.55, 3: 15.9, 4: 17.4, 8: 25.2, 16: 37.5},
    "F16": {1: 14.0, 2: 27.4, 3: 28.0, 4: 30.9, 8: 40.3, 16: 65.9},
}
HOST_MS = 0.45


def curve(points: dict, n: int = BUDGET + 2) -> np.ndarray:
    """Forward ms by rows (index 0 unused): linear between the points, then past the last."""
    w = sorted(points)
    c = np.interp(np.arange(n), w, [points[x] for x in w])
    slope = (points[w[-1]] - points[w[-2]]) / (w[-1] - w[-2])
    c[w[-1] :] = points[w[-1]] + slope * (np.arange(w[-1], n) - w[-1])
    return c


def followed_table(traces) -> dict:
    """(band, group) -> [nodes whose parent was accepted, of them followed]."""
    cache = LookaheadCache(background_indexing=False)
    stat: dict = defaultdict(lambda: [0, 0])
    for rid, req in enumerate(traces):
        out = np.asarray(req["output_ids"], dtype=np.int32)
        cache.start_request(rid, np.asarray(req["prompt_ids"], dtype=np.int32))
        cache.extend(rid, out[:1])
        pos = 1
        while pos < len(out) - 1:
            d = cache.draft(rid, BUDGET, True)
            toks, pars = d.tokens.tolist(), d.parents.tolist()
            cond = conditional(d.scores[1:], d.parents[1:])
            group = np.searchsorted(MATCH_EDGES, d.matched[1:].astype(np.int64), "right")
            truth = out[pos : len(out) - 1].tolist()  # the bonus token must exist
            depth, ok = [0] * len(toks), [True] + [False] * (len(toks) - 1)
            for i in range(1, len(toks)):
                p = pars[i]
                depth[i] = depth[p] + 1
                ok[i] = ok[p] and depth[i] <= len(truth) and truth[depth[i] - 1] == toks[i]
                if ok[p] and depth[i] <= len(truth):
                    b = int(np.searchsorted(BANDS, cond[i - 1], "right")) - 1
                    cell = stat[(b, int(group[i - 1]))]
                    cell[0] += 1
                    cell[1] += ok[i]
            acc = max(depth[i] for i in range(len(toks)) if ok[i])
            cache.extend(rid, out[pos : pos + acc + 1])
            pos += acc + 1
        cache.finish_request(rid)
    return stat


def modelled_speedup(traces, c: np.ndarray, use_matched: bool) -> tuple:
    """(plain time / lookahead time, tokens per step) of the cost-aware choice on curve `c`."""
    cache = LookaheadCache(background_indexing=False)
    cal = AcceptanceCalibration()
    host = HOST_MS
    spent = plain = 0.0
    tokens = steps = 0
    for rid, req in enumerate(traces):
        out = np.asarray(req["output_ids"], dtype=np.int32)
        cache.start_request(rid, np.asarray(req["prompt_ids"], dtype=np.int32))
        cache.extend(rid, out[:1])
        pos = 1
        while pos < len(out):
            room = len(out) - pos - 1
            d = cache.draft(rid, budget=BUDGET)
            matched = d.matched if use_matched else np.zeros_like(d.matched)
            k, a, path = 0, 0, [0]
            if d.num_nodes > 1 and room > 0:
                e = cal.expected(d.scores[1:], d.parents[1:], matched[1:])
                k = choose_nodes(e, c, host)
                if k:
                    toks = d.tokens[1 : k + 1].tolist()
                    pars = (d.parents[1 : k + 1].astype(np.int64) - 1).tolist()
                    a = accepted_length(toks, pars, out[pos : pos + min(k, room)])
                    path += [i + 1 for i in _path(pars, toks, out[pos : pos + a])]
                drafted = (d.tokens, d.parents, d.scores, matched)
                learn(cal, drafted, k + 1, path, out[pos : pos + a + 1].tolist(), False)
            spent += c[k + 1] + host
            cache.extend(rid, out[pos : pos + a + 1])
            pos += a + 1
            steps += 1
        cache.finish_request(rid)
        tokens += len(out) - 1
        plain += (len(out) - 1) * c[1]
    return plain / spent, tokens / steps


def main(argv: list[str]) -> int:
    traces = read_traces(argv[0] if argv else DEFAULT_OUT)
    stat = followed_table(traces)
    print("followed / offered, nodes whose parent was accepted (count); rows: conditional")
    print("score band; columns: matched tokens", GROUPS)
    for b in range(len(BANDS) - 1):
        line = f"{BANDS[b]:.1f}-{min(BANDS[b + 1], 1.0):.1f}"
        for g in range(len(GROUPS)):
            n, k = stat[(b, g)]
            line += f"  {k / n:5.2f} ({n:5d})" if n else " " * 15
        print(line)
    print("\nmodelled speed-up over plain decoding (tokens per step), shipped calibration:")
    for name, points in CURVES.items():
        c = curve(points)
        with_m = modelled_speedup(traces, c, True)
        without = modelled_speedup(traces, c, False)
        print(
            f"{name}: with matched {with_m[0]:.3f}x ({with_m[1]:.2f}), "
            f"matched zeroed {without[0]:.3f}x ({without[1]:.2f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
