"""Each draft node's chance of acceptance, learnt online from the engine's own verify
results: the chance that the target follows a node once it accepted the node's parent, by
the node's conditional score and by how long an n-gram it continues, isotonic in the score,
starting from a prior that reads the conditional score as that chance (the cost-aware choice
in `lookahead.sizing.choose_nodes` weighs rows against these chances)."""

from __future__ import annotations

import numpy as np

from lookahead._core import expected_lengths

# Bands of a node's conditional score (its path score over its parent's: the drafter's
# estimate that the target follows it where its parent was followed), fine where scores crowd.
BAND_EDGES = np.array([0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95])
# Groups of a node's `matched` (the length of the n-gram of context + path it continues,
# `Draft.matched`): 0 (a recycled prediction), 1, 2-3, 4-6, 7+. Witten-Bell scores a
# once-seen continuation 1/2 whether one token or eleven matched, and the target follows the
# long match far more often: replaying the default model's 120 Spec-Bench traces, a node
# scored 0.5-0.6 was followed 21 % of the time after no match of its own, 44 % after 1 token,
# 59 % after 2-3, 74 % after 4-6 and 83 % after 7+ (research/README.md, "Match length").
MATCH_EDGES = np.array([1, 2, 4, 7], dtype=np.int64)
# The shipped prior: a node's conditional score is its chance, read at each band's middle
# score, worth this many nodes per band and group until the engine's own outweigh it.
PRIOR_WEIGHT = 8.0
# Evidence fades by this factor per verify step (half-life ~350 steps), so a calibration
# follows the requests of the hour, not those of the morning.
DECAY = 0.998
# Verify steps are counted in, and the table the chances are read from rebuilt, every this
# many steps (and on first use): a step moves the counts by well under 1 %, and the engine
# pays for every microsecond between forwards (right after one, with the CPU's caches full
# of weights, the rebuild's ~15 numpy calls took ~110 us a step on llama.cpp's 135M model).
REFRESH_EVERY = 8


def conditional(scores: np.ndarray, parents: np.ndarray) -> np.ndarray:
    """Each node's conditional score, `scores[i] / score of parents[i]`, for the nodes of a
    draft without its root (`parents` index the whole tree: 0 is the root, scored 1)."""
    s = np.asarray(scores, dtype=np.float64)
    par = np.concatenate(([1.0], s))[np.asarray(parents, dtype=np.int64)]
    # The core floors its scores above 0; a draft built by hand may score a parent 0, and
    # then its children say nothing beyond it: conditional score 0.
    return np.divide(s, par, out=np.zeros_like(s), where=par > 0)


def _over(score: float, parent: float) -> float:
    """One node's conditional score, as `conditional` gives it (0 under a parent scored 0)."""
    return score / parent if parent > 0 else 0.0


class AcceptanceCalibration:
    """The chance that the target follows a draft node where it accepted the node's parent,
    from the node's conditional score (`conditional`) and the length of the n-gram it
    continues (`MATCH_EDGES`), learnt from verify results: followed over offered per score
    band and match group, with a prior of `p` = the band's middle score worth `PRIOR_WEIGHT`
    nodes, made non-decreasing in the score (pool-adjacent-violators) within each group."""

    def __init__(self, prior_weight: float = PRIOR_WEIGHT, decay: float = DECAY):
        self.edges = BAND_EDGES
        upper = np.append(self.edges[1:], 1.0)
        self.prior = (self.edges + upper) / 2
        self.prior_weight = float(prior_weight)
        self.decay = float(decay)
        shape = (len(MATCH_EDGES) + 1, len(self.edges))
        self._offered = np.zeros(shape)
        self._accepted = np.zeros(shape)
        self._table: np.ndarray | None = None
        self._pending: list = []  # steps observed since the counts were brought up to date

    def bands(self, cond: np.ndarray) -> np.ndarray:
        """The band index of each conditional score."""
        b = np.searchsorted(self.edges, np.asarray(cond, dtype=np.float64), "right") - 1
        # Only a score below the first edge (0) falls below band 0; searchsorted never goes
        # past the last band. (`clip` costs ~30 us a step here, this ~2.)
        return np.maximum(b, 0)

    @staticmethod
    def groups(matched: np.ndarray) -> np.ndarray:
        """The match group of each node's `matched`."""
        return np.searchsorted(MATCH_EDGES, np.asarray(matched, dtype=np.int64), "right")

    def observe(self, cond: np.ndarray, matched: np.ndarray, accepted: np.ndarray) -> None:
        """One verify step: the conditional scores and `matched` of nodes whose parent the
        target accepted, and whether it followed each (counted in every `REFRESH_EVERY`
        steps, as if one by one)."""
        self._pending.append((cond, matched, accepted))
        if len(self._pending) >= REFRESH_EVERY:
            self._count_in()
            self._table = None

    def _count_in(self) -> None:
        """Brings the counts up to date with the pending steps: each step fades what came
        before it by `decay`."""
        steps = self._pending
        if not steps:
            return
        self._pending = []
        k = len(steps)
        self._offered *= self.decay**k
        self._accepted *= self.decay**k
        fade = np.repeat(self.decay ** np.arange(k - 1, -1, -1.0), [len(c) for c, _, _ in steps])
        cond = np.concatenate([np.asarray(c, dtype=np.float64) for c, _, _ in steps])
        matched = np.concatenate([np.asarray(m, dtype=np.int64) for _, m, _ in steps])
        took = np.concatenate([np.asarray(a, dtype=np.float64) for _, _, a in steps])
        cell = self.groups(matched) * len(self.edges) + self.bands(cond)
        n, shape = self._offered.size, self._offered.shape
        self._offered += np.bincount(cell, fade, minlength=n).reshape(shape)
        self._accepted += np.bincount(cell, fade * took, minlength=n).reshape(shape)

    @property
    def offered(self) -> np.ndarray:
        """`[group, band]`: nodes offered, faded by age (pending steps counted in)."""
        self._count_in()
        return self._offered

    @property
    def accepted(self) -> np.ndarray:
        """`[group, band]`: of them followed, faded alike."""
        self._count_in()
        return self._accepted

    def table(self) -> np.ndarray:
        """`[group, band]`: the chance of being followed (non-decreasing in the band), as of
        the last rebuild (`REFRESH_EVERY`)."""
        if self._table is None:
            w = self.offered + self.prior_weight
            v = (self.accepted + self.prior_weight * self.prior) / w
            # Most groups are in order already; pooling runs on the others (a Python loop,
            # ~50 us a group, paid after every verify step).
            for g in np.flatnonzero((np.diff(v, axis=1) < 0).any(axis=1)).tolist():
                v[g] = isotonic(v[g], w[g])
            self._table = v
        return self._table

    def predict(self, cond: np.ndarray, matched: np.ndarray) -> np.ndarray:
        """Chance that the target follows nodes with these conditional scores and matches,
        where it accepted their parents."""
        return self.table()[self.groups(matched), self.bands(cond)]

    def expected(self, scores: np.ndarray, parents: np.ndarray, matched: np.ndarray) -> np.ndarray:
        """Expected accepted length of each prefix of a best-first draft (root excluded:
        node i's path score `scores[i]`, its parent `parents[i]`, 0 the root, its match
        `matched[i]`): `[k - 1]` for its first k nodes. A node is accepted with its parent's
        chance times its own (`predict`), capped by what its parent has left once its earlier
        (better) siblings took theirs: one path is accepted, so siblings' chances add up to at
        most their parent's. (The core's `expected_lengths`: a Python pass over ~32 nodes
        took 40-50 us a step.)"""
        return expected_lengths(self.native_args(scores, parents, matched))

    def native_args(self, scores, parents, matched) -> tuple:
        """(table, bands, groups, scores, parents, matched): the draft and the table as the
        core's `expected_lengths` and `choose_prefix` take them (arrays already of the right
        type pass through)."""
        return (
            self.table(),
            self.edges,
            MATCH_EDGES,
            np.ascontiguousarray(scores, dtype=np.float64),
            np.ascontiguousarray(parents, dtype=np.int32),
            np.ascontiguousarray(matched, dtype=np.uint8),
        )


def outcomes(tokens, parents, path, emitted, verified=None) -> tuple[list, list]:
    """What a verify step says of a draft's nodes whose parent it accepted: `(nodes,
    followed)`, their indices (root excluded, in order) and whether the target followed each
    (1.0 or 0.0). `path` is the accepted nodes (root first), `emitted` the tokens the step
    emitted (`emitted[i]` followed `path[i]`). Greedy (`verified` None): every child of an
    accepted node, verified or not: it would have been accepted iff it is the target's argmax
    there, `emitted[i]`; so the calibration learns what one more level of a wider draft is
    worth without paying for it. Sampled: the children among the first `verified` nodes (root
    included), followed iff on the path. (Plain Python: this runs after every forward, when
    the CPU's caches hold the model's weights and each numpy call costs several us.)"""
    toks = tokens.tolist() if isinstance(tokens, np.ndarray) else list(tokens)
    pars = parents.tolist() if isinstance(parents, np.ndarray) else list(parents)
    nxt = {int(node): int(tok) for node, tok in zip(path, emitted)}
    on_path = set(int(x) for x in path)
    n = len(toks) if verified is None else min(verified, len(toks))
    nodes, followed = [], []
    for j in range(1, n):
        par = pars[j]
        if par in nxt:
            nodes.append(j)
            hit = toks[j] == nxt[par] if verified is None else j in on_path
            followed.append(1.0 if hit else 0.0)
    return nodes, followed


def learn(
    calibration: AcceptanceCalibration,
    drafted: tuple,
    n: int,
    path: list,
    emitted: list,
    sampled: bool,
) -> int:
    """Teach `calibration` what the drafted nodes were worth: `drafted` = (tokens, parents,
    scores, matched) before the cut, of which the first `n` (root included) were verified;
    `path` the accepted nodes (root first) and `emitted` the step's tokens (`outcomes`).
    Returns what the draft accepted, and in greedy decoding one more where a child of the
    last accepted node that was cut would have been accepted too (not drafting must not look
    like failing to a policy that widens after long accepts)."""
    tokens, parents, scores, matched = drafted
    nodes, followed = outcomes(tokens, parents, path, emitted, n if sampled else None)
    sc = scores.tolist() if isinstance(scores, np.ndarray) else list(scores)
    mt = matched.tolist() if isinstance(matched, np.ndarray) else list(matched)
    pars = parents.tolist() if isinstance(parents, np.ndarray) else list(parents)
    # The root's reported score is 1, so a node's conditional score is its over its parent's.
    cond = [_over(sc[j], sc[pars[j]]) for j in nodes]
    calibration.observe(cond, [mt[j] for j in nodes], followed)
    # Greedy: the followed children of accepted nodes are the path and, past it, the cut
    # child that would have been accepted (a tree has one child per token).
    return len(path) - 1 if sampled else int(sum(followed))


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
