"""Each draft node's chance of acceptance, learnt online from the engine's own verify
results: path-score bands, one table per regime of the previous step, isotonic in the score,
starting from a prior that reads a path score as its chance (the cost-aware choice in
`lookahead.costs.choose_nodes` weighs rows against these chances)."""

from __future__ import annotations

import bisect

import numpy as np

# Path-score bands a node's chance of acceptance is learnt in: fine where scores crowd.
BAND_EDGES = np.array([0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95])
# The nodes of one draft succeed or fail together, and the last step says which kind of
# stretch the request is in: a request that just accepted 4+ tokens is copying, one that
# accepted none is not. So each of these regimes (last step's accepted length: 0, 1-3, 4+)
# has its own table. (In greedy decoding "accepted" is what the whole draft would have
# accepted, which the verify of its prefix tells: not drafting must not look like failing.)
REGIME_EDGES = (1, 4)
# The shipped prior: a node's path score is its chance of acceptance (on the default model,
# greedy, the scores' sums track the accepted lengths: 0.47 accepted at sums 0.3-0.6, 1.11
# at 0.85-1.2), read at each band's middle score, worth this many nodes per band until the
# engine's own outweigh it.
PRIOR_WEIGHT = 8.0
# Evidence fades by this factor per verify step (half-life ~350 steps), so a calibration
# follows the requests of the hour, not those of the morning.
DECAY = 0.998


class AcceptanceCalibration:
    """A node's chance of acceptance from its path score and the request's last accepted
    length, learnt from verify results: accepted over offered per score band and regime
    (`REGIME_EDGES`), with a prior of `p` = the band's middle score worth `PRIOR_WEIGHT`
    nodes, made non-decreasing in the score (pool-adjacent-violators)."""

    def __init__(self, prior_weight: float = PRIOR_WEIGHT, decay: float = DECAY):
        self.edges = BAND_EDGES
        upper = np.append(self.edges[1:], 1.0)
        self.prior = (self.edges + upper) / 2
        self.prior_weight = float(prior_weight)
        self.decay = float(decay)
        shape = (len(REGIME_EDGES) + 1, len(self.edges))
        self.offered = np.zeros(shape)
        self.accepted = np.zeros(shape)
        self._tables: dict = {}

    @staticmethod
    def regime(last_accepted: int) -> int:
        """The regime of a step after one that accepted `last_accepted` draft tokens."""
        return bisect.bisect_right(REGIME_EDGES, last_accepted)

    def bands(self, scores: np.ndarray) -> np.ndarray:
        """The band index of each score."""
        b = np.searchsorted(self.edges, np.asarray(scores, dtype=np.float64), "right") - 1
        # Only a score below the first edge (0) falls below band 0; searchsorted never goes
        # past the last band. (`clip` costs ~30 us a step here, this ~2.)
        return np.maximum(b, 0)

    def observe(self, scores: np.ndarray, accepted: np.ndarray, last_accepted: int = 0) -> None:
        """One verify step: the offered nodes' path scores, whether each was accepted, and
        the accepted length of the step before."""
        r = self.regime(last_accepted)
        self.offered *= self.decay
        self.accepted *= self.decay
        b = self.bands(scores)
        n = len(self.edges)
        self.offered[r] += np.bincount(b, minlength=n)
        self.accepted[r] += np.bincount(b, np.asarray(accepted, dtype=np.float64), minlength=n)
        self._tables.clear()

    def table(self, last_accepted: int = 0) -> np.ndarray:
        """Each band's chance of acceptance in a regime (non-decreasing in the band)."""
        r = self.regime(last_accepted)
        got = self._tables.get(r)
        if got is None:
            w = self.offered[r] + self.prior_weight
            v = (self.accepted[r] + self.prior_weight * self.prior) / w
            got = self._tables[r] = isotonic(v, w)
        return got

    def predict(self, scores: np.ndarray, last_accepted: int = 0) -> np.ndarray:
        """Chance of acceptance of nodes with these path scores."""
        return self.table(last_accepted)[self.bands(scores)]

    def expected(
        self, scores: np.ndarray, parents: np.ndarray, last_accepted: int = 0
    ) -> np.ndarray:
        """Expected accepted length of each prefix of a best-first draft (root excluded:
        node i's path score `scores[i]`, its parent `parents[i]`, 0 the root): `[k - 1]` for
        its first k nodes. Each node's chance is capped by what its parent has left once
        its earlier (better) siblings took theirs: one path is accepted, so siblings' chances
        add up to at most their parent's."""
        p = self.predict(scores, last_accepted).tolist()
        left = [1.0] + [0.0] * len(p)  # chance each node still has to hand to its children
        got = [0.0] * len(p)
        for i, (pi, par) in enumerate(zip(p, np.asarray(parents).tolist())):
            q = max(min(pi, left[par]), 0.0)
            left[par] -= q
            left[i + 1] = q
            got[i] = q
        return np.cumsum(got)


def greedy_outcomes(tokens, parents, verified: int, path, emitted) -> tuple:
    """What greedy verification of a draft's first `verified` nodes (root included) says of
    the nodes whose parent it verified, not only of those it verified: `(accepted, known)`
    over nodes 1.. (root excluded). `path` is the accepted nodes (root first), `emitted` the
    tokens that step emitted (`emitted[i]` is the target's argmax after `path[i]`). A child
    of a rejected node would have been rejected; a child of an accepted one would have been
    accepted iff it is the argmax there. So the calibration sees nodes it did not offer too,
    and learns what one more level of a wider draft is worth without paying for it. Nodes
    whose parent was not verified stay unknown whatever happened: which of them could be
    told would depend on the outcome (only rejections could), and counting those would bias
    deep nodes towards 0."""
    nxt = {int(node): int(tok) for node, tok in zip(path, emitted)}
    toks = np.asarray(tokens).tolist()
    pars = np.asarray(parents).tolist()
    took = np.zeros(len(toks) - 1)
    known = np.zeros(len(toks) - 1, dtype=bool)
    for j in range(1, len(toks)):
        par = pars[j]
        if par < verified:
            known[j - 1] = True
            took[j - 1] = float(par in nxt and toks[j] == nxt[par])
    return took, known


def learn(
    calibration: AcceptanceCalibration,
    drafted: tuple,
    n: int,
    path: list,
    emitted: list,
    sampled: bool,
    last: int,
) -> int:
    """Teach `calibration` what the drafted nodes' scores were worth: `drafted` = (tokens,
    parents, scores) before the cut, of which the first `n` (root included) were verified;
    `path` the accepted nodes (root first) and `emitted` the step's tokens. Returns the next
    step's regime value: in greedy decoding what the whole draft would have accepted (read
    one level past the verified nodes, so that not drafting does not look like failing),
    when sampling what it did accept."""
    if sampled:  # an accepted path says nothing of nodes not verified
        scores = drafted[2]
        took = np.zeros(n - 1)
        took[np.asarray(path[1:], dtype=np.int64) - 1] = 1.0
        calibration.observe(scores[1:n], took, last)
        return len(path) - 1
    all_tokens, all_parents, all_scores = drafted
    took, known = greedy_outcomes(all_tokens, all_parents, n, path, emitted)
    calibration.observe(all_scores[1:][known], took[known], last)
    return int(took.sum())


def isotonic(v: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The non-decreasing sequence nearest `v` in `w`-weighted squares (pool-adjacent-
    violators)."""
    vals, wts, sizes = [], [], []
    for x, y in zip(v.tolist(), w.tolist()):
        vals.append(x)
        wts.append(y)
        sizes.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            y2, y1 = wts.pop(), wts.pop()
            x2, x1 = vals.pop(), vals.pop()
            n = sizes.pop() + sizes.pop()
            vals.append((x1 * y1 + x2 * y2) / (y1 + y2))
            wts.append(y1 + y2)
            sizes.append(n)
    return np.repeat(vals, sizes)
