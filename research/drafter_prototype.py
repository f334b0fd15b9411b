"""Try drafting rules in pure Python before building them in Rust (research/README.md).

A slow, brute-force drafter on top of `tests/reference_trie.py`'s counts, replayed through
the acceptance simulator (`benchmarks.accept.run_drafter`, same protocol and oracle
leak check as `python -m benchmarks accept`), multi-branch only. Each variant is a set of keyword
arguments:

- `mode`: "longest" (the longest match only: session 1's rules), "ppm" (backoff to shorter
  suffixes at every draft node), "ppm_root" (backoff at the root only: what the core does);
- `cut`: backoff continues while the escape mass left is >= cut (the core: 0.2);
- `lowcap`: at most this many candidates per backoff level (the core: 4, from each trie's
  8 best, which this prototype does not model);
- `g0`, `ge`: scale the Witten-Bell escape by `g0 / k**ge` for a match of k tokens;
- `gd`: scale it by `gd**d` for the children of a draft node at depth d (the root: 0), as
  a path accepted so far makes its copy likelier to go on;
- `gd1`: apply `gd` only to states with one continuation; `gm`: only while the request's
  last step accepted at least `gm` tokens;
- `rec`: break score ties by recency (latest occurrence first);
- `tau`: replace counts by counts decayed with time constant `tau` tokens (0: off);
- `own`: the request's trie also counts its own outputs (what the core does since 7aac88d;
  off: session 2's rules, where only the shared history saw them);
- `wp`, `wo`: `own_weight` (the request's trie) and `history_weight` (the core: 4 and 1);
- `lag`: each step's verified tokens are counted into the tries only after the next draft
  (a serving loop that inserts in the background while the model runs; the context itself
  is current);
- `hfin`: a request's outputs reach the shared history only when it finishes (its own trie
  still counts them every step): the history insert leaves the per-step path;
- `skip`: `(lo, hi)`: the history does not answer for contexts of lo..hi tokens (the core's
  `history_skip`, default (3, 6) since session 8; None here, so earlier rows reproduce).
- `cal`: calibrate each draft edge's score online (session 10): an edge scored v at depth d
  is ranked by (accepted + cal * v) / (tried + cal) over the earlier drafts' edges of its
  (depth, score decile), counted from every drafted node whose parent was accepted (0: off).

The core's current rules are `mode="ppm_root",cut=0.2,lowcap=4,own=True,wp=4,skip=(3,6)`.

    python -m research.drafter_prototype data/traces/specbench_smollm2.jsonl.gz 16 \
        'mode="longest"' 'mode="ppm",cut=0.2,tau=10000'

`--twice` before the traces replays them twice (see `main`).

Prints tokens per step per category. About 10 s per variant on the full traces.
"""

from __future__ import annotations

import heapq
import math
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from reference_trie import ReferenceCache, _windows_into  # noqa: E402

from benchmarks.accept import oracle_tables, run_drafter, summarize  # noqa: E402
from benchmarks.harness import parse_kwargs, run_script  # noqa: E402
from benchmarks.traces import read_traces  # noqa: E402


class Prototype(ReferenceCache):
    """`ReferenceCache` counts with the drafting rules above."""

    def __init__(
        self,
        mode="ppm",
        cut=0.2,
        lowcap=10**9,
        g0=1.0,
        ge=0.0,
        rec=False,
        tau=0,
        depth=12,
        own=False,
        wp=1.0,
        wo=1.0,
        gd=1.0,
        gd1=False,
        gm=0,
        skip=None,
        lag=False,
        hfin=False,
        cal=0.0,
    ):
        super().__init__(max_depth=depth, own_weight=wp, history_weight=wo, history_skip=skip)
        self.own = own
        self.mode, self.cut, self.lowcap = mode, cut, lowcap
        self.g0, self.ge, self.rec, self.tau, self.gd = g0, ge, rec, tau, gd
        self.gd1, self.gm, self.lag, self.hfin = gd1, gm, lag, hfin
        self.clock = 0  # tokens seen so far (prompts at request start, then outputs)
        self.last: dict[tuple, int] = {}  # n-gram -> latest time seen (history)
        self.decayed: dict[tuple, tuple[float, int]] = {}  # n-gram -> (value, time)
        self.cal = cal
        self.tally = defaultdict(lambda: [0.0, 0.0])  # (depth, decile) -> [accepted, tried]
        self.drafted: dict = {}  # rid -> (tokens, parents, depths, raw edge scores)

    def _bucket(self, d, v):
        return (min(d, 4), min(int(v * 10), 9))

    def _calibrated(self, d, v):
        if not self.cal:
            return v
        acc, tried = self.tally[self._bucket(d, v)]
        return (acc + self.cal * v) / (tried + self.cal)

    def _learn(self, rid, tokens):
        """Counts, for every drafted node whose parent the verified `tokens` accepted (the
        root included), whether it was accepted too."""
        got = self.drafted.pop(rid, None)
        if got is None:
            return
        toks, pars, depths, raw = got
        on_path = {0}
        for i in range(1, len(toks)):  # parents come before children
            if pars[i] in on_path:
                d = depths[i]
                ok = d - 1 < len(tokens) and toks[i] == tokens[d - 1]
                cell = self.tally[self._bucket(d, raw[i])]
                cell[0] += ok
                cell[1] += 1
                if ok and d - 1 < len(tokens) - 1:
                    on_path.add(i)

    def _see(self, store_last, store_dec, text, start):
        for j in range(start, len(text)):
            t = self.clock + j - start
            for s in range(max(0, j - self.depth + 1), j + 1):
                key = tuple(text[s : j + 1])
                store_last[key] = t
                if self.tau:
                    v, t0 = store_dec.get(key, (0.0, t))
                    store_dec[key] = (v * math.exp(-(t - t0) / self.tau) + 1.0, t)

    def start_request(self, rid, prompt, namespace="default"):
        super().start_request(rid, prompt, namespace)
        r = self.requests[rid]
        r["last"], r["decayed"] = {}, {}
        self._see(r["last"], r["decayed"], r["prompt"], 0)
        self.clock += len(prompt)

    def finish_request(self, rid, keep_prompt=None):
        r = self.requests[rid]
        self._count_pending(r)
        if self.hfin:
            history, ctx = self.history[r["ns"]], r["ctx"]
            _windows_into(history, ctx, self.depth, range(len(r["prompt"]), len(ctx)))
        super().finish_request(rid, keep_prompt)

    def _output_tries(self, r):
        if self.hfin:
            return (r["trie"],)
        return super()._output_tries(r) if self.own else (self.history[r["ns"]],)

    def _count_pending(self, r):
        lo, hi = r.pop("pending", (0, 0))
        for trie in self._output_tries(r):
            _windows_into(trie, r["ctx"], self.depth, range(lo, hi))

    def extend(self, rid, tokens):
        if self.cal:
            self._learn(rid, [int(t) for t in tokens])
        r = self.requests[rid]
        start = len(r["ctx"])
        r["last_acc"] = len(tokens) - 1
        if self.lag:  # count the previous step's tokens now, this step's after the next draft
            self._count_pending(r)
            r["ctx"].extend(int(t) for t in tokens)
            r["pending"] = (start, len(r["ctx"]))
        else:
            super().extend(rid, tokens)
        self._see(self.last, self.decayed, r["ctx"], start)
        if self.own:  # the request's trie counts its outputs too: they decay there as well
            self._see(r["last"], r["decayed"], r["ctx"], start)
        self.clock += len(r["ctx"]) - start

    def _value(self, r, x, key, count):
        if not self.tau:
            return count
        v, t0 = (r["decayed"] if x == 0 else self.decayed)[key]
        return v * math.exp(-(self.clock - t0) / self.tau)

    def _level(self, r, p, d=0):
        """Scores of p's continuations (dict) or None if no trie continues p; `d`: the depth
        in the draft of the node they continue."""
        gamma = self.g0 / len(p) ** self.ge
        deep = self.gd**d if r.get("last_acc", 0) >= self.gm else 1.0
        out, wsum = defaultdict(float), 0.0
        parts = []
        for x, (trie, w) in enumerate(self._tries(r)):
            c = self._raw(trie, p) if w > 0 else {}
            if x == 1 and self.skip and self.skip[0] <= len(p) <= self.skip[1]:
                c = {}
            if c:
                vals = {t: self._value(r, x, p + (t,), n) for t, n in c.items()}
                parts.append((w, vals))
                wsum += w
        if not parts:
            return None
        for w, vals in parts:
            g = gamma * (deep if len(vals) == 1 or not self.gd1 else 1.0)
            den = sum(vals.values()) + g * len(vals)
            for t, v in vals.items():
                out[t] += w * v / den / wsum
        return out

    def _recency(self, r, key):
        return max(r["last"].get(key, -1), self.last.get(key, -1))

    def dist(self, r, seq, at_root, d=0):
        """Scored candidates after `seq` (`d` of its tokens drafted), best first."""
        scores, recent, left = {}, {}, 1.0
        for k in range(min(len(seq), self.depth - 1), 0, -1):
            p = tuple(seq[-k:])
            q = self._level(r, p, d)
            if q is None:
                continue
            first = not scores
            budget = 10**9 if first else self.lowcap
            for t, v in sorted(q.items(), key=lambda kv: (-kv[1], kv[0])):
                if t not in scores and budget > 0:
                    scores[t] = left * v
                    recent[t] = self._recency(r, p + (t,))
                    budget -= 0 if first else 1
            backoff = self.mode == "ppm" or (self.mode == "ppm_root" and at_root)
            left *= 1.0 - sum(q.values())
            if not backoff or left < self.cut:
                break
        if self.rec:
            key = lambda tv: (-tv[1], -recent[tv[0]], tv[0])  # noqa: E731
        else:
            key = lambda tv: (-tv[1], tv[0])  # noqa: E731
        return [(v, t) for t, v in sorted(scores.items(), key=key)]

    def draft(self, rid, budget=16, multi_branch=True):
        r = self.requests[rid]
        ctx = r["ctx"]
        tokens, parents, probs, paths = [ctx[-1]], [-1], [1.0], [[]]
        raw = [1.0]
        heap, seq = [], 0
        for v, t in self.dist(r, ctx, True):
            heapq.heappush(heap, (-self._calibrated(1, v), seq, 0, t, v))
            seq += 1
        while len(tokens) <= budget and heap:
            negp, _, parent, t, v = heapq.heappop(heap)
            i = len(tokens)
            tokens.append(t)
            parents.append(parent)
            probs.append(-negp)
            raw.append(v)
            paths.append(paths[parent] + [t])
            d = len(paths[i]) + 1
            for v2, t2 in self.dist(r, ctx + paths[i], False, len(paths[i]))[:budget]:
                heapq.heappush(heap, (negp * self._calibrated(d, v2), seq, i, t2, v2))
                seq += 1
        if self.cal:
            self.drafted[rid] = (tokens, parents, [len(x) for x in paths], raw)
        return tokens, parents, probs


class Adapter:
    """The simulator's drafter interface over `Prototype`."""

    def __init__(self, cache, name):
        self.c, self.name = cache, name

    def start_request(self, rid, prompt):
        self.c.start_request(rid, prompt.tolist())

    def draft(self, rid, ctx, budget):
        t, p, _ = self.c.draft(rid, budget, True)
        return t[1:], [x - 1 for x in p[1:]]

    def extend(self, rid, ctx, new):
        self.c.extend(rid, [int(x) for x in new])

    def finish_request(self, rid):
        self.c.finish_request(rid)


def main(argv):
    """Usage: drafter_prototype.py [--twice] TRACES BUDGET VARIANT [VARIANT ...].

    `--twice`: the traces, then all of them again as category "again" (a workload of repeated
    requests: each second pass can copy its first pass's answer from the shared history)."""
    twice = argv[:1] == ["--twice"]
    argv = argv[1:] if twice else argv
    traces = read_traces(argv[0])
    if twice:
        traces = traces + [dict(t, category="again") for t in traces]
    budget = int(argv[1])
    oracle = oracle_tables(traces, 32)
    for spec in argv[2:]:
        kwargs = parse_kwargs(spec)
        t0 = time.time()
        rows = run_drafter(Adapter(Prototype(**kwargs), spec), traces, oracle, budget)
        summary = summarize(rows)
        cats = " ".join(f"{c}={v['al']:.3f}" for c, v in summary.items())
        print(f"{spec:40s} {cats}  ({time.time() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    run_script(main, __doc__)
