"""Each draft node's chance of acceptance, learnt online from the engine's own verify
results: the chance that the target follows a node once it accepted the node's parent, by
the node's conditional score and by how long an n-gram it continues, isotonic in the score,
starting from a prior that reads the conditional score as that chance (the cost-aware choice
in `lookahead.sizing.choose_nodes` weighs rows against these chances).

The policy is here (the bands, the groups, the prior, the fading); the counting, the table and
the cut read off it run in the Rust core (`lookahead._core.Calibration`, which
`AcceptanceCalibration` extends): one call per verify step to learn (`learn`) and one to cut
(`CostAwareSizer.cut`). The same work in Python (a dozen numpy calls and a loop over the tree,
right after a forward with the CPU's caches full of weights) had the llama.cpp engine's drafter
spend 170 us a step on the 135M model, 114 us after the move (research/README.md,
`llamacpp_host_ab`).
"""

from __future__ import annotations

import numpy as np

from lookahead._core import Calibration
from lookahead._core import outcomes as _outcomes

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


def conditional(scores: np.ndarray, parents: np.ndarray) -> np.ndarray:
    """Each node's conditional score, `scores[i] / score of parents[i]`, for the nodes of a
    draft without its root (`parents` index the whole tree: 0 is the root, scored 1)."""
    s = np.asarray(scores, dtype=np.float64)
    par = np.concatenate(([1.0], s))[np.asarray(parents, dtype=np.int64)]
    # The core floors its scores above 0; a draft built by hand may score a parent 0, and
    # then its children say nothing beyond it: conditional score 0.
    return np.divide(s, par, out=np.zeros_like(s), where=par > 0)


class AcceptanceCalibration(Calibration):
    """The chance that the target follows a draft node where it accepted the node's parent,
    from the node's conditional score (`conditional`) and the length of the n-gram it
    continues (`MATCH_EDGES`), learnt from verify results: followed over offered per score
    band and match group, with a prior of `p` = the band's middle score worth `PRIOR_WEIGHT`
    nodes (`prior_weight`, settable), made non-decreasing in the score (pool-adjacent-
    violators) within each group; every step fades the counts before it by `decay`.

    From the core (`lookahead._core.Calibration`, which reads lists and numpy arrays alike):
    - `learn(tokens, parents, scores, matched, path, emitted, verified=None)`: one verify
      step of a whole draft (`learn` below says what it learns and returns);
    - `observe(cond, matched, followed)`: one verify step given as the conditional scores and
      `matched` of the nodes whose parent the target accepted, and whether it followed each;
    - `expected(scores, parents, matched)`: the expected accepted length of each prefix of a
      best-first draft without its root (node i's path score `scores[i]`, its parent
      `parents[i]`, 0 the root, its match `matched[i]`), `[k - 1]` for its first k nodes.
      A node is accepted with its parent's chance times its own (`predict`), capped by what
      its parent has left once its earlier (better) siblings took theirs: one path is
      accepted, so siblings' chances add up to at most their parent's;
    - `choose(scores, parents, matched, costs, host_s, switch_s)`: the cost-aware cut
      (`lookahead.sizing.choose_nodes` over `expected`);
    - `cells(cond, matched)`: `(groups, bands)`, each node's cell of the table (its band
      the last whose lower edge is at most its conditional score, its group the number of
      `MATCH_EDGES` at most its `matched`), and `predict(cond, matched)`: its chance there;
    - `table()`, `offered`, `accepted` (`[group, band]`), `prior` (`[band]`),
      `prior_weight`, `decay`."""

    def __new__(cls, prior_weight: float = PRIOR_WEIGHT, decay: float = DECAY):
        return super().__new__(cls, BAND_EDGES, MATCH_EDGES, float(prior_weight), float(decay))


def outcomes(tokens, parents, path, emitted, verified=None) -> tuple[list, list]:
    """What a verify step says of a draft's nodes whose parent it accepted: `(nodes,
    followed)`, their indices (root excluded, in order) and whether the target followed each
    (1.0 or 0.0). `path` is the accepted nodes (root first), `emitted` the tokens the step
    emitted (`emitted[i]` followed `path[i]`). Greedy (`verified` None): every child of an
    accepted node, verified or not: it would have been accepted iff it is the target's argmax
    there, `emitted[i]`; so the calibration learns what one more level of a wider draft is
    worth without paying for it. Sampled: the children among the first `verified` nodes (root
    included), followed iff on the path. (The core's, as `learn` counts them.)"""
    return _outcomes(tokens, parents, path, emitted, verified)


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
    `path` the accepted nodes (root first) and `emitted` the step's tokens (`outcomes`; a
    node's conditional score is its path score over its parent's, the root's being 1).
    Returns what the draft accepted, and in greedy decoding one more where a child of the
    last accepted node that was cut would have been accepted too (not drafting must not look
    like failing to a policy that widens after long accepts)."""
    return calibration.learn(*drafted, path, emitted, n if sampled else None)
