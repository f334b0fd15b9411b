"""Offline model of the CPU engine's speed under draft policies (budget, gate), next to PLD.

    python benchmarks/cpu_policy.py [--per-category 10] [--categories translation,...]

Replays the recorded traces (the default model's greedy outputs, `lookahead bench traces`)
as `lookahead bench e2e` runs them: one `LookaheadCache` across the prompts (requests in
trace order), HF PLD (`prompt_lookup_num_tokens=10`, the request's own context) beside it.
Each step of ours drafts at the policy's budget; the engine's gate verifies the root alone
when the draft's node scores sum below `min_draft_score`. A step's time is the fp32 forward
cost of its rows from BENCHMARKS.md §1 (this CPU, 700-token context: 1 row 131 ms, 2 rows
229, 5 rows 245, 9 rows 246, 17 rows 280; linear between), so the printed speed-ups are a
model: they rank policies on the exact token streams without running the model, and
`lookahead bench e2e` checks the chosen one.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np
from lookahead import LookaheadCache
from lookahead.bench.peers import accepted_length
from lookahead.bench.peers.pld import PldDrafter
from lookahead.bench.traces import (
    CATEGORIES,
    DEFAULT_OUT,
    DEFAULT_QUESTIONS,
    read_traces,
    select_questions,
)

ROWS_MS = [(1, 131.0), (2, 229.0), (5, 245.0), (9, 246.0), (17, 280.0)]


def cost(rows: int) -> float:
    """Forward time of `rows` rows, in one-row forwards (linear between measured points)."""
    xs, ys = zip(*ROWS_MS)
    return float(np.interp(rows, xs, ys)) / ROWS_MS[0][1]


class Policy:
    """Budget per step (fixed, or larger after a deep acceptance) and the score gate."""

    def __init__(self, name, budget, gate, big=None, after=None, calibrate=None):
        self.name, self.budget, self.gate, self.big, self.after = name, budget, gate, big, after
        # `calibrate` = prior p: the gate reads the draft's score sum times (accepted + p) /
        # (predicted + p) over the request's verified steps so far (None: the score as is).
        self.calibrate = calibrate

    def pick(self, last_accepted: int) -> int:
        if self.big is not None and last_accepted >= self.after:
            return self.big
        return self.budget


def run_ours(traces, policy):
    """Per category: (emitted tokens, model time) of `policy` over the traces."""
    cache = LookaheadCache(background_indexing=False)
    out = defaultdict(lambda: [0, 0.0])
    for rid, req in enumerate(traces):
        prompt = np.asarray(req["prompt_ids"], dtype=np.int32)
        output = np.asarray(req["output_ids"], dtype=np.int32)
        cache.start_request(rid, prompt)
        cache.extend(rid, output[:1])
        pos, last, t = 1, 0, 0.0
        predicted, got = 0.0, 0
        while pos < output.shape[0]:
            d = cache.draft(rid, budget=policy.pick(last), multi_branch=True)
            rows, a = 1, 0
            score = float(d.scores[1:].sum())
            p = policy.calibrate
            seen = 1.0 if p is None else (got + p) / (predicted + p)
            if d.num_nodes > 1 and score * seen >= policy.gate:
                rows = d.num_nodes
                toks = d.tokens[1:].tolist()
                pars = (d.parents[1:].astype(np.int64) - 1).tolist()
                cap = output.shape[0] - pos - 1
                a = accepted_length(toks, pars, output[pos : pos + min(len(toks), cap)])
                predicted, got = predicted + score, got + a
            t += cost(rows)
            cache.extend(rid, output[pos : pos + a + 1])
            pos += a + 1
            last = a
        cache.finish_request(rid)
        acc = out[req["category"]]
        acc[0] += output.shape[0] - 1
        acc[1] += t
    return out


def run_pld(traces, n=10):
    """Per category: (emitted tokens, model time) of HF PLD with `n` tokens."""
    pld = PldDrafter(num_output_tokens=n)
    out = defaultdict(lambda: [0, 0.0])
    for rid, req in enumerate(traces):
        prompt = np.asarray(req["prompt_ids"], dtype=np.int32)
        output = np.asarray(req["output_ids"], dtype=np.int32)
        full = np.concatenate([prompt, output])
        pld.start_request(rid, prompt)
        pos, t = 1, 0.0
        while pos < output.shape[0]:
            toks, pars = pld.draft(rid, full[: prompt.shape[0] + pos], n)
            cap = output.shape[0] - pos - 1
            a = accepted_length(toks, pars, output[pos : pos + min(len(toks), cap)])
            t += cost(1 + len(toks))
            pos += a + 1
        pld.finish_request(rid)
        acc = out[req["category"]]
        acc[0] += output.shape[0] - 1
        acc[1] += t
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", default=str(DEFAULT_OUT))
    ap.add_argument("--per-category", type=int, default=10)
    ap.add_argument("--questions", default=str(DEFAULT_QUESTIONS))
    ap.add_argument("--categories", default=",".join(CATEGORIES))
    args = ap.parse_args()
    cats = args.categories.split(",")
    # The e2e's sample and order: evenly spaced questions, category after category.
    want = [q["question_id"] for q in select_questions(args.questions, args.per_category)]
    by_id = {r["question_id"]: r for r in read_traces(args.traces)}
    missing = [i for i in want if i not in by_id]
    if missing:
        raise SystemExit(f"{len(missing)} sampled questions have no trace, e.g. {missing[:3]}")
    traces = [by_id[i] for i in want if by_id[i]["category"] in cats]
    policies = [Policy("B8 gate .85 (fixed 8)", 8, 0.85), Policy("B16 gate .85", 16, 0.85)]
    for big in (12, 16):
        for after in (2, 3, 4, 5, 6, 8):
            name = f"B8, {big} after >={after} acc" + (
                " (default)" if (big, after) == (16, 4) else ""
            )
            policies.append(Policy(name, 8, 0.85, big=big, after=after))
    # The gate around the default (B8, 16 after >= 4), and gated on calibrated scores.
    for gate in (0.7, 1.0):
        policies.append(Policy(f"B8/16, gate {gate}", 8, gate, big=16, after=4))
    for prior in (2.0, 5.0):
        policies.append(
            Policy(f"B8/16, calibrated, p={prior:g}", 8, 0.85, big=16, after=4, calibrate=prior)
        )
    plain = {c: (n, float(n)) for c, (n, _) in run_pld(traces).items()}
    pld = run_pld(traces)
    print(f"model speed-up over plain (per category), {len(traces)} traces")
    print(f"{'policy':<32}" + "".join(f"{c[:11]:>12}" for c in cats) + f"{'overall':>12}")

    def line(name, res, ref=None):
        cells, tot = [], [0, 0.0]
        for c in cats:
            n, t = res[c]
            tot[0] += n
            tot[1] += t
            s = (n / t) / (plain[c][0] / plain[c][1])
            cells.append(s / ((ref[c][0] / ref[c][1]) / (plain[c][0] / plain[c][1])) if ref else s)
        allp = sum(v[0] for v in plain.values()) / sum(v[1] for v in plain.values())
        o = (tot[0] / tot[1]) / allp
        if ref:
            o /= (sum(v[0] for v in ref.values()) / sum(v[1] for v in ref.values())) / allp
        print(f"{name:<32}" + "".join(f"{x:>12.3f}" for x in cells) + f"{o:>12.3f}")

    line("PLD 10", pld)
    results = [(p.name, run_ours(traces, p)) for p in policies]
    for name, res in results:
        line(name, res)
    print("ours / PLD")
    for name, res in results:
        line(name, res, ref=pld)


if __name__ == "__main__":
    main()
