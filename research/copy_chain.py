"""Would a copy of one occurrence (PLD-style) add to our tree? (research/README.md)

The copy-oracle copies after the one occurrence whose continuation turns out right. This
script asks how much of that a cheap pointer into the request's own text could give, on top
of our multi-branch draft at budget B:

- `bound`: in hindsight, each of our steps accepts the longer of our tree's and a chain's
  acceptance, the chain copying after the latest (or first) occurrence of the longest suffix
  (at most 11 tokens) of the request's context, or of all text seen so far (`latest_all`);
  `cursor`: after its first occurrence at or past an alignment cursor (where the text being
  emitted was last copied from: the occurrence of a 3+-token suffix nearest the previous
  cursor), as summaries and RAG answers follow their document in order; `any`: after the
  occurrence whose copy is longest (hindsight among the longest suffix's occurrences);
  `aligned` / `bag`: after the occurrence whose context before the matched suffix is most
  like the request's own (`most_similar`; session 10).
  Our steps, so positions, stay ours: an optimistic bound for adding that chain.
- `merge q`: a real drafter: our draft at B with its scores, plus the latest-occurrence chain
  scored `q**depth`; the best B nodes of the union are drafted (scores are monotone along
  every path, so the kept nodes form a tree). Replayed through the simulator. `merge q r`:
  the chain's first node scores the larger of `q` and our tree's score for it, each further
  node `r` times its parent. `adaptive prior`: the chain's first-node score and per-node
  factor learnt online from how far the chain was right at this request's earlier steps
  (known from the verified tokens), shrunk towards all requests' rates (session 9).

    python -m research.copy_chain [TRACES] [BUDGET] [--bound-only] [--width=16]
"""

from __future__ import annotations

import numpy as np
from lookahead import LookaheadCache

from benchmarks.accept import accepted_length, oracle_tables, run_drafter, summarize
from benchmarks.harness import run_script
from benchmarks.traces import read_traces

MAX_SUFFIX = 11


def occurrences(text: np.ndarray) -> tuple[np.ndarray, int]:
    """Indices right after each occurrence in `text[:-1]` of the longest suffix of `text` (at
    most `MAX_SUFFIX` tokens) that occurs there, in text order, and that suffix's length;
    empty if the last token never did."""
    n = len(text)
    ends = np.flatnonzero(text[:-1] == text[-1])
    k = 1
    while ends.size and k < MAX_SUFFIX:
        longer = ends[ends >= k]
        longer = longer[text[longer - k] == text[n - 1 - k]]
        if not longer.size:
            break
        ends, k = longer, k + 1
    return ends + 1, k


def copy_after(text: np.ndarray, latest: bool = True) -> int | None:
    """Index after the latest (or first) occurrence of the longest suffix (`occurrences`)."""
    ends, _ = occurrences(text)
    if not ends.size:
        return None
    return int(ends[-1] if latest else ends[0])


WIDTH = 16  # most_similar's window (--width=N)


def most_similar(text: np.ndarray, ends: np.ndarray, k: int, how: str) -> int:
    """Which of `ends` (`occurrences(text)`) has the context most like `text`'s own before
    the matched suffix: `aligned` counts equal tokens at equal distances over the `width`
    tokens before the suffix's first mismatch (a longer match with some tokens changed);
    `bag` counts the distinct tokens of `text`'s last `width` + suffix tokens also found in
    the same span before the occurrence. Ties go to the latest."""
    n, width = len(text), WIDTH
    best, best_score = len(ends) - 1, -1
    for i in range(len(ends) - 1, -1, -1):
        e = int(ends[i])
        if how == "aligned":
            lo = max(0, width - (e - k - 1))
            a = text[e - k - 1 - width + lo : e - k - 1]
            b = text[n - k - 1 - width + lo : n - k - 1] if n - k - 1 - width + lo >= 0 else []
            m = min(len(a), len(b))
            score = int(np.sum(a[len(a) - m :] == b[len(b) - m :])) if m else 0
        else:
            score = len(
                set(text[max(0, n - width - k) :].tolist())
                & set(text[max(0, e - width - k) : e].tolist())
            )
        if score > best_score:
            best, best_score = i, score
    return best


def common_prefix(a, b) -> int:
    m = 0
    while m < len(a) and m < len(b) and a[m] == b[m]:
        m += 1
    return m


def bound(traces, budget):
    """Per category: (steps, ours, ours-or-chain for each chain) summed tokens per step."""
    cache = LookaheadCache(background_indexing=False)
    names = ("latest", "first", "latest_all", "cursor", "any", "aligned", "bag")
    seen: list[np.ndarray] = []
    acc: dict[str, np.ndarray] = {}
    for rid, req in enumerate(traces):
        prompt = np.asarray(req["prompt_ids"], dtype=np.int64)
        output = np.asarray(req["output_ids"], dtype=np.int64)
        full = np.concatenate([prompt, output])
        # Documents joined by -1, so no match spans two of them.
        sep = np.array([-1])
        hist = np.concatenate([x for s in seen for x in (s, sep)] + [sep])
        cache.start_request(rid, prompt)
        cache.extend(rid, output[:1])
        row = acc.setdefault(req["category"], np.zeros(2 + len(names)))
        pos, cursor = 1, None
        while pos < len(output):
            ctx = full[: len(prompt) + pos]
            d = cache.draft(rid, budget, True)
            n = d.num_nodes
            truth = output[pos : pos + min(budget, len(output) - pos - 1)]
            a = accepted_length(d.tokens[1:n].tolist(), (d.parents[1:n] - 1).tolist(), truth)
            row[:2] += (1, a + 1)
            ends, k = occurrences(ctx)
            lens = [common_prefix(ctx[e : e + len(truth)], truth) for e in ends]
            for j, name in enumerate(names):
                if name == "latest_all":
                    text = np.concatenate([hist, ctx])
                    at = copy_after(text)
                    m = 0 if at is None else common_prefix(text[at : at + len(truth)], truth)
                elif not lens:
                    m = 0
                elif name == "any":
                    m = max(lens)
                elif name in ("aligned", "bag"):
                    m = lens[most_similar(ctx, ends, k, name)]
                elif name == "cursor" and cursor is not None and ends[-1] >= cursor:
                    m = lens[int(np.searchsorted(ends, cursor))]
                else:
                    m = lens[0] if name == "first" else lens[-1]
                row[2 + j] += max(a, m) + 1
            pos += a + 1
            # The alignment cursor: where the text now being emitted was copied from (the
            # occurrence of the new context's longest suffix nearest the old cursor), once
            # that suffix is 3+ tokens long.
            new, k = occurrences(full[: len(prompt) + pos])
            if new.size and k >= 3:
                cursor = int(new[-1] if cursor is None else new[np.abs(new - cursor).argmin()])
            cache.extend(rid, output[pos - a - 1 : pos])
        cache.finish_request(rid)
        seen.append(full)
    return names, acc


class Merged:
    """Our draft plus the latest-occurrence chain scored `q**depth` (or, with `r`, its first
    node as our tree scores it, at least `q`, then `r` per node); the best B nodes."""

    def __init__(self, q: float, r: float | None = None):
        self.c = LookaheadCache(background_indexing=False)
        self.q, self.r, self.name = q, r, f"merge q={q} r={r}"
        self.chain: list[int] = []  # the chain drafted at the last step

    def start_request(self, rid, prompt):
        self.c.start_request(rid, prompt)
        self.chain = []

    def chain_scores(self, tree_score: float) -> tuple[float, float]:
        """The chain's first node's score (given our tree's score for it, 0 if absent) and
        the factor per further node."""
        if self.r is None:
            return self.q, self.q
        return max(self.q, tree_score), self.r

    def draft(self, rid, ctx, budget):
        d = self.c.draft(rid, budget, True)
        n = d.num_nodes
        toks, pars, sc = d.tokens[:n].tolist(), d.parents[:n].tolist(), d.scores[:n].tolist()
        at = copy_after(np.asarray(ctx))
        chain = self.chain = [] if at is None else ctx[at : at + budget].tolist()
        kids = {(pars[i], toks[i]): i for i in range(1, n)}
        node, p = 0, 1.0
        for depth, t in enumerate(chain):
            nxt = kids.get((node, t))
            if depth == 0:
                p, per = self.chain_scores(0.0 if nxt is None else sc[nxt])
            else:
                p *= per
            if nxt is None:
                toks.append(t)
                pars.append(node)
                sc.append(p)
                nxt = kids[(node, t)] = len(toks) - 1
            else:
                sc[nxt] = max(sc[nxt], p)
            node = nxt
        for i in range(len(toks) - 1, 0, -1):  # children after parents: keep paths monotone
            if pars[i] > 0:
                sc[pars[i]] = max(sc[pars[i]], sc[i])
        keep = sorted(sorted(range(1, len(toks)), key=lambda i: (-sc[i], i))[:budget])
        index = {0: -1} | {i: j for j, i in enumerate(keep)}
        return [toks[i] for i in keep], [index[pars[i]] for i in keep]

    def extend(self, rid, ctx, new):
        self.c.extend(rid, new)

    def finish_request(self, rid):
        self.c.finish_request(rid)


class Adaptive(Merged):
    """`Merged` with the chain's scores learnt online: after each step, the verified tokens
    tell how far the drafted chain was right (whether or not its nodes were kept), which
    counts P(first copied token right) and P(next right | the ones before right), for this
    request, shrunk towards all requests' with `prior` pseudo-steps."""

    def __init__(self, prior: float = 4.0):
        super().__init__(0.5)
        self.prior, self.name = prior, f"adaptive prior={prior}"
        # (right, tried) for the first copied token and for later ones, over all requests.
        self.all = np.array([1.0, 2.0, 1.0, 2.0])

    def start_request(self, rid, prompt):
        super().start_request(rid, prompt)
        self.mine = np.zeros(4)

    def chain_scores(self, tree_score):
        g, m, k = self.all, self.mine, self.prior
        first = (m[0] + k * g[0] / g[1]) / (m[1] + k)
        later = (m[2] + k * g[2] / g[3]) / (m[3] + k)
        return first, later

    def extend(self, rid, ctx, new):
        for depth, (c, t) in enumerate(zip(self.chain, new)):
            j = 0 if depth == 0 else 2
            for stats in (self.mine, self.all):
                stats[j : j + 2] += (c == t, 1)
            if c != t:
                break
        self.chain = []
        super().extend(rid, ctx, new)


def main(argv: list[str]) -> int:
    global WIDTH
    args = [a for a in argv if not a.startswith("--")]
    WIDTH = next((int(a.split("=")[1]) for a in argv if a.startswith("--width=")), WIDTH)
    path = args[0] if args else "data/traces/specbench_smollm2.jsonl.gz"
    budget = int(args[1]) if len(args) > 1 else 16
    traces = read_traces(path)
    names, acc = bound(traces, budget)
    cats = list(acc)
    total = sum(acc.values())
    print(f"B = {budget}: tokens per step at our steps | " + " ".join(cats) + " | overall")
    for j, name in enumerate(("ours",) + tuple(f"bound {x}" for x in names)):
        vals = [acc[c][1 + j] / acc[c][0] for c in cats] + [total[1 + j] / total[0]]
        print(f"{name:18s} " + " ".join(f"{v:.3f}" for v in vals))
    oracle = oracle_tables(traces, 32)
    drafters = [Merged(q, r) for q, r in ((0.3, None), (0.5, None), (0.7, None), (0.1, 0.7))]
    if "--bound-only" in argv:
        drafters = []
    for d in drafters + [Adaptive(4.0), Adaptive(16.0)] * bool(drafters):
        s = summarize(run_drafter(d, traces, oracle, budget))
        label = d.name.replace(" r=None", "")
        print(f"{label:18s} " + " ".join(f"{s[c]['al']:.3f}" for c in cats + ["overall"]))
    return 0


if __name__ == "__main__":
    run_script(main, __doc__)
