"""Offline model of the engine's speed under draft policies, on any machine's cost curve.

    python -m benchmarks.cost_policy [--curve avx2-fp32 | --costs FILE.json] [--per-category 10]

Replays the recorded traces (the default model's greedy outputs, `python -m benchmarks traces`)
as `python -m benchmarks e2e` runs them: one `LookaheadCache` across the prompts, in the e2e's
sample and order. Each step of a fixed policy drafts its budget (wider after a step that
accepted 4+) and verifies the root alone when the draft's scores sum below its gate; the
cost-aware policy runs the engine's own choice (`lookahead.costs.choose_nodes` on a draft of
`AUTO_MAX_NODES`, node chances from an `AcceptanceCalibration` fed each step's outcome). HF
prompt lookup (10 tokens) runs beside. A step's time is the curve's forward time of its rows
at the request's context length (the host's time per step is left out), so the printed
speed-ups are a model of the forward time: they rank policies on the exact token streams of
a machine one does not have (the recorded curves below), and `python -m benchmarks e2e` measures
the machine one has.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import numpy as np
from lookahead import LookaheadCache
from lookahead.calibration import AcceptanceCalibration, learn
from lookahead.costs import CostModel
from lookahead.hf.recycling import RECYCLE_K, first_prompt_row
from lookahead.sizing import AUTO_MAX_NODES, DEEP_ACCEPT, choose_nodes

from benchmarks.peers import accepted_length
from benchmarks.peers.pld import PldDrafter
from benchmarks.traces import (
    CATEGORIES,
    DEFAULT_OUT,
    DEFAULT_QUESTIONS,
    read_traces,
    select_questions,
    topk_rows,
)

# Forward ms by rows of the default model at ~700 cached tokens, recorded on machines of
# this project: an AVX2-only CPU in fp32 (BENCHMARKS.md, demo section), a CPU with
# AVX512-BF16 in bf16 and fp32 (the cost-aware drafting issue), an H200 (flat to 32 rows).
RECORDED = {
    "avx2-fp32": {1: 131.0, 2: 229.0, 5: 245.0, 9: 246.0, 17: 280.0},
    "avx512bf16-bf16": {1: 41.7, 2: 42.5, 4: 44.2, 8: 48.4, 12: 54.6, 16: 59.6, 24: 66.7, 32: 75.5},
    "avx512bf16-fp32": {
        1: 64.0,
        2: 103.0,
        4: 95.4,
        8: 87.7,
        12: 94.1,
        16: 107.5,
        24: 126.7,
        32: 170.2,
    },
    "h200": {1: 1.0, 33: 1.0},
}
FIXED = [(8, 16, 0.85), (4, 8, 0.5), (8, 16, 0.3), (16, 16, 0.3), (16, 32, 0.5)]


def replay_ours(traces, curve_at, policy, recycle=False):
    """Per category: [emitted tokens, model seconds, steps] of `policy` over the traces:
    ("fixed", budget, max_budget, gate) or ("cost", widest). The cost-aware one learns as
    the engine does in greedy decoding: from every child of an accepted node, verified or
    not (`lookahead.calibration.outcomes`). `recycle`: the cache also gets the traces' top-k rows as the
    engine's `recycle="path"` hands them over (the prompt's last `RECYCLE_PROMPT_ROWS`, then
    each step's verified ones); the rejected nodes' rows, which `recycle=True` adds, are not
    in a recording."""
    cache = LookaheadCache(background_indexing=False, recycle_k=RECYCLE_K if recycle else 0)
    cal = AcceptanceCalibration()
    out = defaultdict(lambda: [0, 0.0, 0])
    for rid, req in enumerate(traces):
        prompt = np.asarray(req["prompt_ids"], dtype=np.int32)
        output = np.asarray(req["output_ids"], dtype=np.int32)
        cache.start_request(rid, prompt)
        rows = None
        if recycle:
            rows = topk_rows(req)
            end = prompt.shape[0] - 1
            first = first_prompt_row(end)
            cache.recycle(rid, prompt[first:end], rows[0][first:end], rows[1][first:end])
        _extend(cache, rid, rows, output[:1], prompt.shape[0] - 1)
        pos, last, t, steps = 1, 0, 0.0, 0
        while pos < output.shape[0]:
            ctx = prompt.shape[0] + pos
            room = output.shape[0] - pos - 1
            if policy[0] == "fixed":
                _, b, big, gate = policy
                d = cache.draft(rid, budget=big if last >= DEEP_ACCEPT else b)
                k = d.num_nodes - 1 if float(d.scores[1:].sum()) >= gate else 0
            else:
                d = cache.draft(rid, budget=policy[1])
                e = cal.expected(d.scores[1:], d.parents[1:], d.matched[1:])
                k = choose_nodes(e, curve_at(ctx)) if d.num_nodes > 1 else 0
            a, path = 0, [0]
            if k:
                toks = d.tokens[1 : k + 1].tolist()
                pars = (d.parents[1 : k + 1].astype(np.int64) - 1).tolist()
                a = accepted_length(toks, pars, output[pos : pos + min(k, room)])
                path += [i + 1 for i in _path(pars, toks, output[pos : pos + a])]
            t += _rows(curve_at(ctx), k + 1)
            if policy[0] == "cost" and d.num_nodes > 1:
                emitted = output[pos : pos + a + 1].tolist()
                drafted = (d.tokens, d.parents, d.scores, d.matched)
                last = learn(cal, drafted, k + 1, path, emitted, False)
            else:
                last = a
            _extend(cache, rid, rows, output[pos : pos + a + 1], prompt.shape[0] + pos - 1)
            pos += a + 1
            steps += 1
        cache.finish_request(rid)
        _tally(out, req, t, steps)
    return out


def _extend(cache, rid, rows, new, at) -> None:
    """`cache.extend(rid, new)`, with the rows of the verified tokens if `rows` (row `at`
    chose `new[0]`), as the engine hands them over."""
    if rows is None:
        cache.extend(rid, new)
    else:
        cache.extend(rid, new, rows[0][at : at + len(new)], rows[1][at : at + len(new)])


def _tally(out, req, seconds, steps) -> None:
    """Add one replayed request to its category: [emitted tokens, model seconds, steps]."""
    acc = out[req["category"]]
    acc[0] += len(req["output_ids"]) - 1
    acc[1] += seconds
    acc[2] += steps


def _rows(c, rows):
    """`c[rows]`, extrapolated linearly past the curve's widest row."""
    last = len(c) - 1
    return c[rows] if rows <= last else c[last] + (rows - last) * (c[last] - c[last - 1])


def _path(pars, toks, accepted):
    """The node indices (0-based, root excluded) of the chain of `accepted` tokens."""
    nodes, node = [], -1
    for tok in accepted.tolist():
        node = next(i for i in range(len(toks)) if pars[i] == node and toks[i] == tok)
        nodes.append(node)
    return nodes


def replay_pld(traces, curve_at, n=10):
    """Per category: [emitted tokens, model seconds, steps] of HF PLD with `n` tokens."""
    pld = PldDrafter(num_output_tokens=n)
    out = defaultdict(lambda: [0, 0.0, 0])
    for rid, req in enumerate(traces):
        prompt = np.asarray(req["prompt_ids"], dtype=np.int32)
        output = np.asarray(req["output_ids"], dtype=np.int32)
        full = np.concatenate([prompt, output])
        pld.start_request(rid, prompt)
        pos, t, steps = 1, 0.0, 0
        while pos < output.shape[0]:
            toks, pars = pld.draft(rid, full[: prompt.shape[0] + pos], n)
            cap = output.shape[0] - pos - 1
            a = accepted_length(toks, pars, output[pos : pos + min(len(toks), cap)])
            t += _rows(curve_at(prompt.shape[0] + pos), 1 + len(toks))
            pos += a + 1
            steps += 1
        pld.finish_request(rid)
        _tally(out, req, t, steps)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--curve", default="avx2-fp32", choices=sorted(RECORDED))
    ap.add_argument("--costs", default=None, help="a measured cost file (overrides --curve)")
    ap.add_argument("--traces", default=str(DEFAULT_OUT))
    ap.add_argument("--per-category", type=int, default=10)
    ap.add_argument("--questions", default=str(DEFAULT_QUESTIONS))
    args = ap.parse_args()
    if args.costs:
        with open(args.costs) as f:
            model = CostModel.from_json(json.load(f))
        name = args.costs
    else:
        model = CostModel.from_rows({r: ms / 1e3 for r, ms in RECORDED[args.curve].items()})
        name = args.curve
    want = [q["question_id"] for q in select_questions(args.questions, args.per_category)]
    by_id = {r["question_id"]: r for r in read_traces(args.traces)}
    traces = [by_id[i] for i in want if i in by_id]
    c700 = model.curve(700)
    print(f"curve {name}: " + " ".join(f"W={w} {c700[w] / c700[1]:.2f}x" for w in model.widths))
    runs = {"PLD 10": replay_pld(traces, model.curve)}
    runs["cost-aware"] = replay_ours(traces, model.curve, ("cost", AUTO_MAX_NODES))
    if all("topk_ids" in r for r in traces):
        runs["cost-aware +recycled"] = replay_ours(
            traces, model.curve, ("cost", AUTO_MAX_NODES), recycle=True
        )
    for b, m, g in FIXED:
        runs[f"fixed {b}/{m}/{g:g}"] = replay_ours(traces, model.curve, ("fixed", b, m, g))
    one_row = {}
    for c in CATEGORIES:
        n = sum(len(r["output_ids"]) - 1 for r in traces if r["category"] == c)
        t = sum(
            sum(model.curve(len(r["prompt_ids"]) + i)[1] for i in range(1, len(r["output_ids"])))
            for r in traces
            if r["category"] == c
        )
        one_row[c] = (n, t)

    def speed(res, cats):
        n = sum(res[c][0] for c in cats)
        t = sum(res[c][1] for c in cats)
        pn = sum(one_row[c][0] for c in cats)
        pt = sum(one_row[c][1] for c in cats)
        return (n / t) / (pn / pt)

    cols = [*CATEGORIES, "overall"]
    groups = {c: [c] for c in CATEGORIES} | {"overall": list(CATEGORIES)}
    print(f"{len(traces)} traces; modelled speed-up over plain decoding")
    print(f"{'policy':<22}" + "".join(f"{c[:12]:>13}" for c in cols) + f"{'tok/step':>10}")
    for nm, res in runs.items():
        steps = sum(v[2] for v in res.values())
        toks = sum(v[0] for v in res.values())
        print(
            f"{nm:<22}"
            + "".join(f"{speed(res, groups[c]):>13.3f}" for c in cols)
            + f"{toks / steps:>10.2f}"
        )
    pairs = [("cost-aware", "PLD 10"), ("cost-aware", "fixed 8/16/0.85")]
    if "cost-aware +recycled" in runs:
        pairs.append(("cost-aware +recycled", "cost-aware"))
    for num, ref in pairs:
        print(f"{num} / {ref}")
        print(
            f"{'':<22}"
            + "".join(
                f"{speed(runs[num], groups[c]) / speed(runs[ref], groups[c]):>13.3f}" for c in cols
            )
        )


if __name__ == "__main__":
    main()
